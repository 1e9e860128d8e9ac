"""A sweep's cells: every (scenario, grid point, seed) planned and validated before
anything runs, each with its run folder and the fingerprint that decides its reuse.
Scope: planning only; :mod:`.execute` runs the cells."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..driver.cluster import AUTO_CAP, actors_needed
from ..driver.warm import crew_key
from ..results.folder import short_value
from ..results.provenance import fingerprint
from ..scenario import ScenarioError, load_scenario, merge_overrides
from .grid import MAX_SEEDS, check_size, parse_grid, parse_seeds, short_key, slug  # noqa: F401 (re-exported)


@dataclass
class Cell:
    scenario: str  # the YAML file
    name: str  # the scenario's name
    method: str
    point: dict  # grid key -> value
    seed: int
    overrides: dict[str, Any]  # key -> value, applied to the scenario file in order
    run_dir: Path
    max_rounds: int | None = None
    extra: dict = field(default_factory=dict)
    fingerprint: str = ""  # everything that determines the result (raymvc.results.provenance.fingerprint)
    study: dict | None = None  # a study's cell: its file and commits (raymvc.study.declared), kept in summary.json

    @property
    def label(self) -> str:
        pts = " ".join(f"{short_key(k)}={short_value(v)}" for k, v in self.point.items())
        return f"{self.name}{' ' + pts if pts else ''} seed {self.seed}"


def _run_dir_name(name: str, point: dict, seed: int) -> str:
    def part(k, v) -> str:
        text = slug(short_value(v)) if slug(short_value(v)) != "x" else "none"
        return f"{short_key(k)}{'-' if text[:1].isalpha() else ''}{text}"

    parts = [name] + [part(k, v) for k, v in point.items()] + [f"seed{seed}"]
    folder = slug("_".join(parts))
    if len(folder) > 100 or any(slug(short_value(v)) != short_value(v) for v in point.values()):
        # values that lose characters in a folder name get a short digest, so two never collide
        digest = hashlib.sha1(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()[:6]
        folder = f"{folder[:90]}-{digest}"
    return folder


def plan(scenarios: list[str | tuple], grid: Mapping[str, list] | list[tuple[str, list]], seeds: list[int] | None,
         base: Mapping[str, Any], out: Path) -> list[Cell]:
    """Every (scenario, grid point, seed), validated before anything runs. A scenario is a
    file, or ``(file, overrides)`` -- a study's run, with its own ``set`` values and name --
    or ``(file, overrides, seeds)``, a run with its own subset of the seeds (None: all).
    ``grid``: key -> values (a product; the first key varies slowest); ``base``: overrides of
    every cell (key -> value); a grid point's values apply after them."""
    from ..data.prepare import prepare

    grid = list(grid.items()) if isinstance(grid, Mapping) else list(grid)
    cells: list[Cell] = []
    keys = [k for k, _ in grid]
    check_size(len(scenarios), [len(vals) for _, vals in grid], len(seeds) if seeds is not None else 1)
    for entry in scenarios:
        path, own, own_seeds = (entry, {}, None) if isinstance(entry, str) else (*entry, None)[:3]
        at_first = {k: vals[0] for k, vals in grid}  # a key only the grid gives may be required
        first = _load(path, merge_overrides(own, base, at_first), keys)
        run_seeds = own_seeds if own_seeds is not None else seeds if seeds is not None else [first.seed]
        for combo in itertools.product(*[vals for _, vals in grid]):
            point = dict(zip(keys, combo))
            over = merge_overrides(own, base, point)
            for j, seed in enumerate(run_seeds):
                sc = _load(path, merge_overrides(over, {"seed": seed}), keys)
                if j == 0:  # the data and the split for this point load (errors before any run)
                    try:
                        n_clients = prepare(sc)[1].n_clients
                    except ScenarioError as e:
                        raise _grid_blame(sc.blame(e), keys) from None
                cfg = sc.protocol_config()
                cells.append(Cell(scenario=path, name=sc.name, method=sc.method, point=point, seed=seed,
                                  overrides=merge_overrides(over, {"seed": seed}),
                                  run_dir=out / _run_dir_name(sc.name, point, seed),
                                  max_rounds=getattr(cfg, "max_rounds", None),
                                  extra={"backend": sc.runtime.backend, "n_clients": n_clients,
                                         "cpus": footprint(sc, n_clients), "address": sc.runtime.address,
                                         "crew": (crew_key(sc), actors_needed(sc, n_clients))},
                                  fingerprint=fingerprint(sc)))
    dirs = [c.run_dir for c in cells]
    if len(set(dirs)) != len(dirs):
        dup = next(d for d in dirs if dirs.count(d) > 1)
        raise ScenarioError(f"two runs would share the folder {dup.name}; give the scenarios different names")
    return cells


def _grid_blame(err: ScenarioError, keys: list[str]) -> ScenarioError:
    text = str(err)
    for k in keys:
        if text.startswith(f"--set {k}="):
            return ScenarioError("--grid " + text[len("--set "):])
    return err


def _load(path: str, overrides: dict[str, Any], grid_keys: list[str]):
    try:
        return load_scenario(path, overrides)
    except ScenarioError as e:
        raise _grid_blame(e, grid_keys) from None


def footprint(sc, n_clients: int) -> float:
    """CPUs one run of ``sc`` keeps busy on Ray: how many runs side by side a cluster holds.
    ``client_cpus: auto`` counts a whole CPU per actor, and with ``runtime.threads: T`` above
    1 every actor counts at least T (its threads run at once, whatever it reserved)."""
    rt = sc.runtime
    per = AUTO_CAP if rt.client_cpus == "auto" else float(rt.client_cpus)
    server = rt.server_cpus
    if rt.threads > 1:
        per, server = max(per, rt.threads), max(server, rt.threads)
    return actors_needed(sc, n_clients) * per + server
