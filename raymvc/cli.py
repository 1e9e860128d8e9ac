"""Command line: ``raymvc run | validate | list | params | sweep | plot | report``.

Bad input -- a scenario problem, a bad ``--set`` or ``--grid`` -- exits with code 2
and one line ``error: WHERE: key.path: message``, where WHERE is the file or the
``--set`` that caused it; it is found before Ray starts. Output meant for pipes goes to
stdout (``--json``, tables); progress goes to stderr. A run folder (``--out``) that
cannot be created or written is the same kind of one-line error, as is a missing or
corrupt ``summary.json`` given to ``report``; data that loads but looks unintended
(labels of one class) prints one ``warning:`` line and goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

from .results.folder import run_dir_for
from .results.report import report_command
from .scenario import ScenarioError, ScenarioWarning, load_scenario, merge_overrides, one_line, parse_sets

EXIT_USAGE = 2


def _fail(msg: str) -> int:
    print(f"error: {one_line(msg)}", file=sys.stderr)
    return EXIT_USAGE


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Our own data warnings as one ``warning:`` line; anything else as Python prints it."""
    from .data.datasets import DataWarning

    if issubclass(category, (DataWarning, ScenarioWarning)):
        print(f"warning: {one_line(str(message))}", file=file or sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def _sets(args) -> dict:
    """The ``--set`` flags as overrides (key -> value), parsed once per command."""
    if getattr(args, "overrides", None) is None:
        args.overrides = parse_sets(getattr(args, "set", None) or [])
    return args.overrides


def _load(args) -> object:
    flags = {"runtime.address": getattr(args, "address", None), "runtime.backend": getattr(args, "backend", None),
             "seed": getattr(args, "seed", None)}
    return load_scenario(args.scenario, merge_overrides(_sets(args), {k: v for k, v in flags.items()
                                                                      if v is not None and v != ""}))


def _load_and_prepare(args):
    """(scenario, prepared data) or a ScenarioError naming the file or the --set."""
    from .data.prepare import prepare

    sc = _load(args)
    try:
        return sc, prepare(sc)  # data problems surface here, before Ray starts
    except ScenarioError as e:
        raise sc.blame(e) from None


def cmd_run(args) -> int:
    from .driver import run_scenario
    from .driver.engine import ClusterError
    from .progress import RunProgress
    from .results.folder import format_summary
    from .results.runfolder import RunFolder

    resume = getattr(args, "resume", None)
    if resume:
        if args.scenario or args.set or args.out or args.seed is not None:
            return _fail(f"--resume {resume}: the run's own scenario.yaml is used; "
                         "give no scenario, --set, --seed or --out")
        args.scenario, args.out = str(Path(resume) / RunFolder.SCENARIO), resume
        if Path(args.scenario).is_symlink():
            return _fail(f"--resume {resume}: scenario.yaml is a symbolic link; raymvc never follows a link in its folders")
        if not Path(args.scenario).is_file():
            return _fail(f"--resume {resume}: not a run folder (no scenario.yaml)")
    elif not args.scenario:
        return _fail("run: give a scenario YAML file (or --resume DIR)")
    if getattr(args, "checkpoint", False):
        args.set = [*(args.set or []), "runtime.checkpoint=true"]
    try:
        sc, prepared = _load_and_prepare(args)
    except ScenarioError as e:
        return _fail(str(e))
    kw: dict = {"progress": lambda line: None}
    rp = None
    if not args.quiet:
        rp = RunProgress(sc.name, getattr(sc.protocol_config(), "max_rounds", None))
        kw = {"progress": rp.text, "on_round": rp.round}
        what = "starting Ray, " if sc.runtime.backend == "ray" else ""
        rp.text(f"[{sc.name}] {what}{prepared[1].n_clients} clients, {sc.method} on {prepared[0].name} ...")
    from .results.folder import ResultsError, check_out_dir

    try:
        out = args.out or run_dir_for(sc.name, merge_overrides(_sets(args), {"seed": args.seed} if args.seed else {}))
        made = not Path(out).exists()
        check_out_dir(out)
    except ResultsError as e:
        if rp is not None:
            rp.close()
        return _fail((f"--resume {e}" if resume else f"--out {e}") if args.out else str(e))
    result = sys.stdout
    sys.stdout = sys.stderr  # stdout carries the summary alone: Ray's and the methods' own prints go to stderr
    if args.json:
        from .driver import cluster

        cluster.LOG_TO_DRIVER["on"] = False  # nor may Ray print workers' lines there later, at shutdown
    try:
        summary = run_scenario(sc, out, prepared=prepared, overwrite=args.overwrite, resume=bool(resume), **kw)
    except ClusterError as e:
        _drop_if_empty(out, made)
        return _fail(f"{args.scenario}: {e}")
    except (ScenarioError, ResultsError) as e:  # ResultsError: a result file could not be written
        _drop_if_empty(out, made)
        return _fail(str(e))
    finally:
        sys.stdout = result
        if rp is not None:
            rp.close()
    print(json.dumps(summary.to_dict(), indent=2) if args.json else format_summary(summary), flush=True)
    return {"failed": 1, "error": 1, "interrupted": 130}.get(summary["status"], 0)


def _drop_if_empty(out, made: bool) -> None:
    """A folder this command made for a run that never started (a refused scenario, a
    cluster it could not join) goes again, so no empty folder is left for `report`."""
    if made:
        with contextlib.suppress(OSError):
            Path(out).rmdir()  # only if empty


def cmd_validate(args) -> int:
    """Each file in turn (a scenario or a study file); exit 2 at the first that fails."""
    for path in args.scenario:
        rc = _validate_one(argparse.Namespace(**{**vars(args), "scenario": path}))
        if rc:
            return rc
    return 0


def _validate_one(args) -> int:
    from .study.files import is_study_file, load_study

    if is_study_file(args.scenario):
        try:
            study = load_study(args.scenario)
            n = study.check()
            study.check_data()  # every run's data can be obtained, as `raymvc validate SCENARIO` checks
        except ScenarioError as e:
            return _fail(str(e))
        fewer = [r.id for _, _, r in study.entries() if r.seeds is not None]
        print(f"{args.scenario}: ok -- a study of {study.spec.paper} ({study.spec.title}): {n} cells "
              f"({len(study.entries())} runs x {len(study.points())} grid points x {len(study.seeds())} seeds"
              + (f"; fewer seeds for {', '.join(fewer)}" if fewer else "") + ")")
        return 0
    try:
        sc, (ds, part) = _load_and_prepare(args)
    except ScenarioError as e:
        return _fail(str(e))
    from .results.folder import sizes_text

    rows = sizes_text(part.info.get("client_sizes"))
    print(f"{args.scenario}: ok -- {sc.method} on {ds.name} ({ds.n_samples} samples, {ds.n_views} views, "
          f"{ds.n_clusters} clusters), {part.kind} split over {part.n_clients} clients" + (f"; {rows}" if rows else ""))
    return 0


def cmd_data(args) -> int:
    from .data.fetch import REMOTES, FetchError, cache_dir, cached_path, fetch

    if args.data_cmd == "list":
        print(f"cache: {cache_dir()}  (RAYMVC_DATA sets it; RAYMVC_DATA_MIRROR names a mirror)")
        for name, r in REMOTES.items():
            state = "cached" if cached_path(name).is_file() else "not cached"
            print(f"  {name:<20} {r.description} [{state}]")
            print(f"  {'':<20} source: {r.source}; licence: {r.licence}")
        return 0
    try:
        path = fetch(args.name, source=args.source)
    except FetchError as e:
        return _fail(str(e))
    print(path)
    return 0


def cmd_list(args) -> int:
    from .data import list_builtin
    from .protocols import available, get

    print("methods:  (raymvc params METHOD: each parameter's type, default, range, source and meaning)")
    for name in available():
        try:
            p = get(name)
            print(f"  {name:<10} {p.partition:<10} {p.summary}")
            params = ", ".join(f"{r['name']}={r['default']}" for r in param_rows(p.config))
            print(f"  {'':<10} {'':<10} params: {params or '(none)'}")
            if p.paper:
                print(f"  {'':<10} {'':<10} paper: {p.paper}")
        except Exception as e:  # e.g. torch missing for a deep method
            print(f"  {name:<10} (unavailable: {e})")
    print("  (or an import path of a module that defines PROTOCOL, e.g. method: mylab.mymethod)")
    print("datasets:")
    for name, text in list_builtin().items():
        print(f"  {name:<16} {text}")
    from .data.fetch import REMOTES

    for name, r in REMOTES.items():
        if name.startswith("proteinfold-per") and name != "proteinfold-per0.5":
            continue
        print(f"  {name:<16} {r.description} (fetched on first use: raymvc data list)")
    print("  proteinfold-per0.1 ... per0.9: the same proteins with 10-90 % incomplete samples")
    from .data.datasets import DERIVED

    for name, (base, text) in DERIVED.items():
        print(f"  {name:<16} {text} (built from {base}, fetched on first use)")
    print("  (or data.path: a .npz/.mat file, a .csv/.tsv table, a list or folder of tables)")
    from .availability import REGISTRY
    from .kinds import REGISTRY as KINDS
    from .scenario import FaultsCfg
    from .selection import REGISTRY as RULES

    print("faults (docs/fault-models.md):")
    for name, f in FaultsCfg.model_fields.items():  # every key the schema holds, as it describes itself
        print(f"  {name:<16} {f.description or ''}")
    for title, table, skip in (("availability models (faults.availability.model)", REGISTRY, "model"),
                               ("selection rules (faults.sampling.rule)", RULES, ""),
                               ("fault kinds (faults.kinds, or module:Class of your own)", KINDS, "")):
        print(f"{title}:")
        for name, cls in table.items():
            keys = ", ".join(k for k in cls.Config.model_fields if k != skip) or "no parameters"
            doc = " ".join((cls.__doc__ or "").replace("``", "").replace(":func:", "").split()).split(". ")[0]
            print(f"  {name:<16} {doc.rstrip('.')} ({keys})")
    return 0


def _type_name(annotation) -> str:
    import typing

    if isinstance(annotation, type):
        return annotation.__name__
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    return str(annotation).replace("typing.", "").replace("NoneType", "None")


def _range(field) -> str:
    lo = hi = ""
    for c in field.metadata:
        for attr, side in (("ge", "lo"), ("gt", "lo"), ("le", "hi"), ("lt", "hi")):
            v = getattr(c, attr, None)
            if v is None:
                continue
            if side == "lo":
                lo = f"{'[' if attr == 'ge' else '('}{v}"
            else:
                hi = f"{v}{']' if attr == 'le' else ')'}"
    if not lo and not hi:
        return ""
    return f"{lo or '(-inf'}, {hi or 'inf)'}"


def param_rows(config) -> list[dict]:
    """One dict per parameter of a method's pydantic Config: name, type, default, range,
    source (where the default comes from: "paper: Sec. 4.3", "not stated; ours: ...",
    "departure; ...", "project option"; "" if the method does not say), source_kind
    (the first word of that, or "") and description."""
    from pydantic_core import PydanticUndefined

    from .protocol import param_source, source_text

    rows = []
    for name, f in config.model_fields.items():
        default = "(required)" if f.default is PydanticUndefined else repr(f.default).replace("None", "null")
        mark = param_source(f)
        rows.append({"name": f.alias or name, "type": _type_name(f.annotation), "default": default,
                     "range": _range(f), "source": source_text(f),
                     "source_kind": mark.get("kind", "") if isinstance(mark, dict) else "",
                     "description": f.description or ""})
    return rows


SOURCE_WIDTH = 44  # the source column wraps at this width; the description stays on a row's first line


def cmd_params(args) -> int:
    from .protocols import get

    try:
        proto = get(args.method)
    except KeyError as e:
        return _fail(f"method: {str(e).strip(chr(39) + chr(34))}")
    rows = param_rows(proto.config)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.method}: {proto.summary} ({proto.partition} split)")
    print("partial work (faults.partial_work): " + (
        "honoured, its clients cut their local epochs/steps to the share of work they get" if
        "partial_work" in proto.supports else "ignored, its clients always do all their local work (closed-form steps)"))
    print("stale replies (faults.stale_replies): " + (
        "used, a missing client's last reply stands in with its age" if "stale_replies" in proto.supports else
        "not used, a missing client's reply is missing (the setting is refused)"))
    print("asynchronous rounds (faults.asynchronous): " + (
        f"buffered steps on {', '.join(proto.async_kinds)} messages, each update with its staleness"
        if proto.async_kinds else "no, its steps take whole rounds (the setting is refused)"))
    if not rows:
        print("  (no parameters)")
        return 0
    import textwrap

    head = {"name": "param", "type": "type", "default": "default", "range": "range", "source": "source",
            "description": "description"}
    cols = ("name", "type", "default", "range")
    w = {k: max(len(head[k]), *(len(r[k]) for r in rows)) for k in cols}
    for r in [head, *rows]:
        source = textwrap.wrap(r["source"] or "(not marked)", SOURCE_WIDTH) if r is not head else ["source"]
        print("  " + "  ".join(r[k].ljust(w[k]) for k in cols) + "  " + source[0].ljust(SOURCE_WIDTH) + "  "
              + r["description"])
        for more in source[1:]:
            print("  " + " " * (sum(w.values()) + 2 * len(cols)) + more)
    print(f"set them in the scenario's params: {{...}} or with --set params.{rows[0]['name']}=...")
    return 0


def sweep_request(args):
    """``raymvc sweep``'s flags as a :class:`raymvc.study.sweep.SweepRequest` (the strings of
    ``--grid`` and ``--seeds`` parsed here, once)."""
    from .study.files import is_study_file
    from .study.sweep import SweepRequest, parse_grid, parse_seeds

    if args.seeds is not None and args.seed is not None:
        raise ScenarioError("--seeds and --seed: give one of them")
    study = next((p for p in args.scenario if is_study_file(p)), None)
    if study and (args.seed is not None or args.repeats > 1):
        raise ScenarioError(f"{study}: the seeds come from the study file (--seeds S picks some of them, --grid "
                            "'KEY=[V]' some of its grid values)")
    if args.seeds is not None:
        seeds = parse_seeds(args.seeds)
    elif args.seed is not None or args.repeats > 1:
        s0 = args.seed if args.seed is not None else load_scenario(args.scenario[0], _sets(args)).seed
        seeds = [s0 + i for i in range(args.repeats)]
    else:
        seeds = None  # each scenario's own seed
    return SweepRequest.build(args.scenario, grid=dict(parse_grid(args.grid or [])), seeds=seeds,
                              overrides=_sets(args), out=args.out, jobs=args.jobs, backend=args.backend,
                              address=args.address, cells=args.cells, fresh_actors=args.fresh_actors,
                              only=tuple(args.only or ()), quiet=args.quiet,
                              allow_uncommitted=args.allow_uncommitted)


def cmd_sweep(args) -> int:
    from .driver.engine import ClusterError
    from .results.folder import ResultsError, check_out_dir
    from .study.sweep import run_sweep

    try:
        if args.out:
            check_out_dir(args.out, create=False)
        return run_sweep(sweep_request(args))[0]
    except ResultsError as e:
        return _fail(f"--out {e}")
    except (ScenarioError, ClusterError) as e:  # a cluster that cannot be joined: one line, as for a run
        return _fail(str(e))


def cmd_verify(args) -> int:
    from .results.folder import ResultsError
    from .study.records import verify_studies

    d = Path(args.studies)
    if not d.is_dir():
        return _fail(f"{d}: not a folder of study files")
    try:
        return verify_studies(d, only=args.only or None)
    except (ScenarioError, ResultsError) as e:
        return _fail(str(e))


def cmd_plot(args) -> int:
    from .results.folder import ResultsError
    from .results.plot import plot_run
    from .results.runfolder import RunFolder
    from .study.plot import plot_sweep

    d = Path(args.sweep_dir)
    metrics = [m for arg in args.metric for m in arg.split(",") if m] or None
    try:
        if (d / "sweep.csv").is_file():
            paths = plot_sweep(d, metrics=metrics)
        elif (d / RunFolder.ROUNDS).is_file():
            paths = plot_run(d, metrics=metrics)
        else:
            return _fail(f"{d}: no sweep.csv or {RunFolder.ROUNDS} here (give a folder written by raymvc sweep or "
                         "raymvc run)")
    except (ValueError, ResultsError) as e:
        return _fail(str(e))
    for p in paths:
        print(p)
    return 0


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("raymvc")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raymvc", description="Federated multi-view clustering simulator on Ray.")
    p.add_argument("--version", action="version", version=f"raymvc {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    def scenario_args(q, many=False, optional=False):
        if many:
            q.add_argument("scenario", nargs="+", help="scenario YAML files")
        elif optional:
            q.add_argument("scenario", nargs="?", help="scenario YAML file (not with --resume)")
        else:
            q.add_argument("scenario", help="scenario YAML file")
        q.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a scenario key (value parsed as YAML); repeatable")
        q.add_argument("--backend", choices=["ray", "local"], help="same as --set runtime.backend=...")
        q.add_argument("--seed", type=int, help="same as --set seed=...")

    r = sub.add_parser("run", help="run a scenario and write its results")
    scenario_args(r, optional=True)
    r.add_argument("--out", help="run directory (default: runs/<name>-<time>)")
    r.add_argument("--checkpoint", action="store_true",
                   help="save every party's state after each round (same as --set runtime.checkpoint=true)")
    r.add_argument("--resume", metavar="DIR", help="carry on a stopped run from its last checkpoint")
    r.add_argument("--address", help="join this Ray cluster (same as --set runtime.address=...)")
    r.add_argument("--json", action="store_true", help="print summary.json to stdout")
    r.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    r.add_argument("--overwrite", action="store_true", help="empty a non-empty --out folder first")
    r.set_defaults(fn=cmd_run)

    v = sub.add_parser("validate", help="check scenarios or study files (and load their data) without running them")
    scenario_args(v, many=True)
    v.set_defaults(fn=cmd_validate)

    ls = sub.add_parser("list", help="list methods (with their parameters), datasets and fault kinds")
    ls.set_defaults(fn=cmd_list)

    da = sub.add_parser("data", help="data sets fetched on first use: list them, or fetch one ahead of a run")
    dsub = da.add_subparsers(dest="data_cmd", required=True)
    dsub.add_parser("list", help="every fetchable data set: description, source, licence, cached or not")
    df = dsub.add_parser("fetch", help="fetch a data set into the cache ($RAYMVC_DATA or the user cache folder)")
    df.add_argument("name")
    df.add_argument("--from", dest="source", metavar="PATH", help="a file or folder you already have (checked)")
    da.set_defaults(fn=cmd_data)

    pa = sub.add_parser("params", help="a method's parameters: type, default, range, where the default comes from, description")
    pa.add_argument("method", help="method name or import path")
    pa.add_argument("--json", action="store_true")
    pa.set_defaults(fn=cmd_params)

    _add_sweep_and_plot(sub, scenario_args)

    rp = sub.add_parser("report", help="show a run, compare runs, or show a sweep's aggregate")
    rp.add_argument("runs", nargs="+", help="run folders and/or sweep folders")
    rp.add_argument("--json", action="store_true", help="the same as --format json")
    rp.add_argument("--format", choices=("text", "json", "markdown", "latex"), default="text",
                    help="markdown or latex: tables to paste (mean ± std, the best of each score column in bold)")
    rp.set_defaults(fn=report_command)
    return p


def _add_sweep_and_plot(sub, scenario_args) -> None:
    """The ``sweep`` and ``plot`` commands of :func:`build_parser`."""
    sw = sub.add_parser("sweep", help="run scenarios over a grid of overrides and seeds; aggregate")
    scenario_args(sw, many=True)
    sw.add_argument("--grid", action="append", metavar="KEY=[V1, V2, ...]",
                    help="a key and a YAML list of values to try; repeat for a product grid")
    sw.add_argument("--seeds", metavar="0,1,2", help="seeds for every grid point (0,1,2 or 0-4)")
    sw.add_argument("--repeats", type=int, default=1, help="seeds per grid point (seed, seed+1, ...) if no --seeds")
    sw.add_argument("--jobs", type=_jobs, default=None, metavar="N|auto",
                    help="runs at once: local backend, worker processes (default 1); Ray, runs side by side "
                         "as the cluster's CPUs hold them (default auto)")
    sw.add_argument("--fresh-actors", action="store_true",
                    help="on Ray, start new actors for every run instead of reusing the last run's")
    sw.add_argument("--cells", choices=["actors", "tasks"], default="actors",
                    help="on Ray: actors = every run starts per-client actors (node loss, real stragglers); "
                         "tasks = every run is one Ray task simulating in-process, spread over the cluster "
                         "(same results as --backend local)")
    sw.add_argument("--out", help="sweep directory (default: runs/sweep-<names>-<time>); rerun to resume")
    sw.add_argument("--only", action="append", metavar="RUN[,RUN]",
                    help="a study file: sweep only these of its runs (ids, spread runs included); repeatable")
    sw.add_argument("--allow-uncommitted", action="store_true",
                    help="a study file: run it although no git commit holds it (and its scenarios) unchanged; "
                         "its records then say 'uncommitted' (seeds come before runs: docs/studies.md)")
    sw.add_argument("--address", help="join this Ray cluster")
    sw.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sw.set_defaults(fn=cmd_sweep)

    ve = sub.add_parser("verify", help="recompute every study record's numbers from its stored labels; list the "
                                       "rows no mean may use (exit 1 if a row's numbers differ)")
    ve.add_argument("studies", nargs="?", default="studies", help="folder of study files (default: studies)")
    ve.add_argument("--only", action="append", default=[], metavar="STUDY", help="one study (repeatable)")
    ve.set_defaults(fn=cmd_verify)

    pl = sub.add_parser("plot", help="plot a sweep (metrics and MB against the swept key) or a run (scores, MB and "
                                     "who took part, round by round): PNG + SVG in the folder")
    pl.add_argument("sweep_dir", metavar="DIR", help="a folder written by raymvc sweep or by raymvc run")
    pl.add_argument("--metric", action="append", default=[], metavar="NAME",
                    help="a score to draw (acc, nmi, ari, mb, or any score of the runs: purity, fscore, kappa, "
                         "silhouette, calinski_harabasz); repeatable; default: ACC, NMI, ARI, MB and the "
                         "label-free scores the sweep has")
    pl.set_defaults(fn=cmd_plot)


def _jobs(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of runs or auto, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (or auto), got {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    from . import arithmetic

    if arithmetic.check():  # RAYMVC_ARITHMETIC holds no known mode
        return _fail(arithmetic.check())
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly; point stdout at /dev/null so
        # the interpreter's final flush does not complain either
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0


def entry() -> None:
    """The ``raymvc`` command: :func:`main`, then a quick exit.

    Everything an ordinary exit does before tearing the interpreter down still happens:
    the interpreter's own thread shutdown (non-daemon threads, executors' exit hooks),
    exit handlers (the embedded Ray instance stops) and the flush of the standard
    streams; a failed flush other than a closed pipe is an error (exit code 120, as
    Python's own). What is skipped is the teardown of every loaded module, 0.2-0.5 s
    with Ray, scikit-learn or torch loaded, after the results are already on disk.
    """
    rc = main()
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what interpreter exit calls first
    if shutdown is not None:
        shutdown()
    else:  # pragma: no cover - other Python implementations
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            pass
        except (OSError, ValueError) as e:
            if stream is sys.stdout:
                try:
                    print(f"error: could not write the output: {e}", file=sys.stderr, flush=True)
                except (OSError, ValueError):
                    pass
                rc = rc or 120
    os._exit(rc)


if __name__ == "__main__":  # pragma: no cover
    entry()
