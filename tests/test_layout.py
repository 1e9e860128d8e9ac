"""The package's shape: no import circle, no argparse under the API, the version in one place."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import raymvc

PKG = Path(raymvc.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports anywhere (module level or in a function)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from .x import y` where y is a module imports y
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return comps


def test_no_import_circle():
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_api_builds_no_command_line():
    text = (PKG / "api.py").read_text()
    assert "argparse" not in text and "Namespace" not in text


def test_the_version_is_the_installed_one():
    from importlib.metadata import version

    assert raymvc.__version__ == version("raymvc")
    assert "0.1.0" not in (PKG / "__init__.py").read_text()


def test_a_run_returns_a_typed_summary(tmp_path):
    from raymvc.results.status import Status
    from raymvc.results.summary import RunSummary

    res = raymvc.run({"name": "tiny", "method": "kfed", "params": {"kmeans_init": 1},
                      "data": {"dataset": "synthetic", "partition": "horizontal", "n_clients": 3,
                               "synthetic": {"n_samples": 90, "n_views": 1, "dims": 3, "n_clusters": 3}},
                      "faults": {"dropout": {"rate": 0.5}}, "runtime": {"backend": "local"}, "seed": 1},
                     out=tmp_path / "run")
    s = res.summary
    assert isinstance(s, RunSummary) and res.status is s.status and isinstance(s.status, Status)
    assert s.status == "degraded" and s.finished and s.final  # a str enum reads like the file's text
    assert s.mb == s["communication"]["mb_total"] > 0 and s.metrics == s["metrics"]
    assert s.faults["dropped_replies"] >= 1 and s.out_dir == str(tmp_path / "run")
    assert RunSummary.from_dict({"status": "no such status"}).status is Status.FAILED


def test_one_status_vocabulary():
    """No module spells the finished statuses or the list of all as its own tuple: they come
    from raymvc.results.status."""
    import re

    pattern = re.compile(r"\"completed\",\s*\"degraded\"")
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p.name != "status.py"
                 and pattern.search(p.read_text())]
    assert offenders == []


def test_the_repositorys_reports_stay_out_of_the_package():
    """The study pages' generator, its policy and prose live in raymvc_reports (a checkout's
    folder, not installed); the package never imports it."""
    assert not (PKG / "pages.py").exists()
    assert [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if "raymvc_reports" in p.read_text()] == []
    assert (PKG.parent / "raymvc_reports" / "pages.py").is_file() or not (PKG.parent / "tools").is_dir()


def test_every_subpackage_is_installed_by_a_plain_install():
    """pyproject's package list names every folder of the package (an editable install finds
    a forgotten one anyway; ``pip install .`` would leave it out)."""
    import tomllib

    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(("raymvc", *p.parent.relative_to(PKG).parts)) for p in PKG.rglob("__init__.py")}
    assert folders - listed == set()


# modules still over the size a reader takes in at once; the list only shrinks
STILL_LONG: set[str] = set()


def test_no_module_is_longer_than_600_lines_but_the_few_listed():
    long = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if len(p.read_text().splitlines()) > 600}
    assert long <= STILL_LONG, f"over 600 lines: {sorted(long - STILL_LONG)}"
    assert long == STILL_LONG, f"now short enough, take them off STILL_LONG: {sorted(STILL_LONG - long)}"


def test_method_docstrings_carry_no_scores():
    """Numbers live in generated pages: a method's text says what it does and where its
    measurements are, never an ACC or NMI of its own."""
    import re

    import raymvc.protocols as protocols

    folder = Path(protocols.__file__).resolve().parent
    score = re.compile(r"\b(ACC|NMI|ARI)\b[^.\n]{0,12}\b0\.\d{2,}")
    assert [p.name for p in folder.glob("*.py") if score.search(p.read_text())] == []


def _defs(paths, kinds):
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kinds):
                yield path, node, node.end_lineno - node.lineno + 1


def test_classes_and_engine_functions_stay_readable():
    """No class over 250 lines in the package or the methods, no function over 60 lines in
    the engine (``raymvc/runtime`` and ``raymvc/driver``): the server is its shell, exchange
    and round workflow."""
    files = [*(p for p in PKG.rglob("*.py") if "protocols" not in p.relative_to(PKG).parts),
             *(PKG.parent / "protocols").glob("*.py")]
    assert any(p.name == "efimvc.py" for p in files)  # the methods are read too
    big = [f"{p.name}:{n.name} ({size} lines)" for p, n, size in _defs(files, ast.ClassDef) if size > 250]
    assert not big
    long = [f"{p.name}:{n.name} ({size} lines)" for p, n, size in
            _defs([*PKG.joinpath("runtime").glob("*.py"), *PKG.joinpath("driver").glob("*.py")],
                  (ast.FunctionDef, ast.AsyncFunctionDef)) if size > 60]
    assert not long


def test_no_private_name_crosses_a_module():
    """``from m import _x`` of a module's private name (shared private modules such as
    ``protocols/_torch.py`` are imported whole or by their public names)."""
    files = [*PKG.rglob("*.py"), *(PKG.parent / "protocols").glob("*.py")]
    crossing = [f"{p.name}: {node.module}.{a.name}" for p in files for node in ast.walk(ast.parse(p.read_text()))
                if isinstance(node, ast.ImportFrom) and node.module
                for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not crossing


def test_every_run_stream_has_its_own_tag_in_one_table():
    """Two consumers never share a random stream: every tag of ``raymvc.streams`` differs, and
    no module of the package seeds a generator from the run's seed outside that table."""
    import re

    from raymvc import streams

    assert len(set(streams.TAGS.values())) == len(streams.TAGS) >= 15
    seeded = re.compile(r"default_rng\(\s*\[")  # default_rng([seed, tag, ...]): a stream of its own
    outside = [p.name for p in PKG.rglob("*.py") if p.name != "streams.py" and seeded.search(p.read_text())]
    assert not outside
    # a stream is the same generator whatever else was drawn, and keys tell streams apart
    a, b = streams.stream(7, streams.DROPOUT, 3, 1), streams.stream(7, streams.DROPOUT, 3, 1)
    assert a.random() == b.random() != streams.stream(7, streams.DELAY, 3, 1).random()


def test_the_top_level_is_grouped_into_rooms():
    """The study layer and what a run leaves each live in a package of their own; the top
    level keeps the few modules every room shares."""
    top = sorted(p.stem for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 15, top
    rooms = {"study": {"files", "sweep", "cells", "execute", "rows", "grid", "plot"},
             "results": {"folder", "runfolder", "summary", "status", "provenance"}}
    for room, members in rooms.items():
        assert {p.stem for p in (PKG / room).glob("*.py")} >= members
        assert not set(top) & members  # no module left behind under its old name


DRIVER_SIDE = ("raymvc.scenario.load", "raymvc.scenario.yamlio", "raymvc.scenario.sidefiles", "raymvc.driver",
               "raymvc.study", "raymvc.results", "raymvc.api", "raymvc.cli", "raymvc.data")


def test_runtime_holds_the_parties_side_and_driver_the_drivers():
    """``raymvc/runtime`` is what an actor hosts and ``raymvc/driver`` what drives it: no module
    of the parties' side imports the driver's (the package's lazy entry points aside), and the
    driver's modules (the engine, the Ray instance, placement, warm actors, checkpoints, stop
    signals, cells as tasks) live under ``raymvc/driver`` only."""
    wrong = []
    for p in PKG.joinpath("runtime").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and p.name != "__init__.py":
                target = node.module if node.level == 0 else "." * node.level + node.module
                if target.startswith(("..driver", "raymvc.driver")):
                    wrong.append(f"{p.name}: {target}")
    assert not wrong
    driver = {"engine", "cluster", "placement", "warm", "signals", "checkpoint", "cell_tasks"}
    assert {p.stem for p in PKG.joinpath("driver").glob("*.py")} >= driver
    assert not driver & {p.stem for p in PKG.joinpath("runtime").glob("*.py")}


def _party_modules() -> list[str]:
    """The package's modules a fresh process holds once it has imported what an actor is
    made of (the server and client nodes, their transport, a method's protocol)."""
    import importlib
    import sys

    for name in ("raymvc.runtime.nodes", "raymvc.runtime.transport", "raymvc.scenario.schema"):
        importlib.import_module(name)
    return sorted(m for m in sys.modules if m.startswith("raymvc"))


def test_the_schema_imports_without_the_reader_and_side_files():
    code = ("import sys, raymvc.scenario.schema as s; s.Scenario; "
            "print(sorted(m for m in sys.modules if m.startswith('raymvc.scenario')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["raymvc.scenario", "raymvc.scenario.errors", "raymvc.scenario.schema"]


def test_an_actor_process_imports_no_driver_side_module(ray_session):
    """In a Ray worker of its own (a runtime_env no other test uses starts a fresh one), the
    modules the parties are made of pull in nothing of the driver: no YAML reader, no
    engine, no study, results, data or command line."""
    from ray import cloudpickle

    ray = ray_session
    here = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(here)  # the test module is not importable in the worker
    try:
        probe = ray.remote(num_cpus=0, runtime_env={"env_vars": {"RAYMVC_LAYOUT_PROBE": "1"}})(_party_modules)
        mods = ray.get(probe.remote(), timeout=120)
    finally:
        cloudpickle.unregister_pickle_by_value(here)
    assert "raymvc.runtime.nodes" in mods
    assert not [m for m in mods if m.startswith(DRIVER_SIDE)], mods
