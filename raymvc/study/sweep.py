"""``raymvc sweep``: scenarios x a grid of overrides x seeds, resumable, with an aggregate.

A dropout-robustness study of three methods side by side::

    raymvc sweep scenarios/hw-cefmc.yaml scenarios/digits-kfed.yaml \\
        --grid 'faults.dropout.rate=[0, 0.1, 0.3, 0.5]' --seeds 0,1,2 --backend local --jobs 2 --out runs/drop

Each ``--grid`` value list is read as one YAML list, so any value works
(``--grid 'faults.crash=[[], [{client: 2, at_round: 2}]]'``); several ``--grid`` flags
make a product. Every cell (scenario, grid point, seed) gets its own run folder, named
after them, under the sweep folder. A cell is identified by everything that determines
its result (:func:`raymvc.results.provenance.fingerprint`: the resolved scenario after every
``--set`` and grid value, the seed, a user data file's content and the code version). A
cell whose folder holds a finished run with the same fingerprint is reused; one whose
settings or code changed since is run again, so an old result is never reported for a
new setting. Ctrl-C or SIGTERM stops the runs under way after their round, starts nothing
more, and still writes the tables of what finished; the same command carries on.

Written beside the run folders:

* ``sweep.json`` -- what was swept (scenarios, grid keys and values, seeds);
* ``sweep.csv`` -- one row per run: scenario, method, grid values, seed, status, acc,
  nmi, ari, mb, rounds, wall, faults, errors (how many times some party's code raised),
  fingerprint, run folder;
* ``aggregate.csv`` -- one row per scenario and grid point: mean and std over the seeds
  of ACC/NMI/ARI/MB and the count of runs by status. Only ``completed`` and ``degraded``
  runs enter a mean; ``failed``, ``error`` and ``interrupted`` runs are counted instead.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..results.folder import OutputFolder, default_out_dir, read_file, short_value, write_file
from ..results.runfolder import RunFolder
from ..safeio import confined, csv_rows
from ..scenario import ScenarioError, as_overrides, load_scenario, merge_overrides
from ..text import one_line
from .cells import Cell, footprint, plan  # noqa: F401 (plan, footprint: re-exported)
from .execute import Outcome, cell_state, current, execute, ray_slots  # noqa: F401 (re-exported)
from .grid import MAX_SEEDS, check_size, parse_grid, parse_seeds, short_key, slug  # noqa: F401 (re-exported)
from .rows import (  # noqa: F401 (re-exported: the names a sweep folder's readers use)
    INFO_PREFIX,
    MAX_SWEEP_CSV,
    MAX_SWEEP_JSON,
    METRIC_PREFIX,
    METRICS,
    RUN_FIELDS,
    SIZE_FIELDS,
    aggregate,
    aggregate_fields,
    collect,
    column_of,
    extra_metrics,
    format_aggregate,
    info_numbers,
    mean_std,
    metric_names,
    num,
    read_sweep,
    summary_row,
    sweep_fields,
    write_csv,
)


@dataclass(frozen=True)
class SweepRequest:
    """One sweep, as ``raymvc sweep`` and :func:`raymvc.sweep` both ask for it.

    ``scenarios``: scenario files, or one study file (which brings its runs, grid and
    seeds); ``grid``: key -> values (a product); ``seeds``: every grid point's seeds
    (None: each scenario's own); ``overrides``: ``(key, value)`` settings of every cell, in order;
    ``cells``: on Ray, ``actors`` (per-client actors) or ``tasks`` (each cell one Ray task
    simulating in-process); ``only``: a study's runs to sweep (ids); ``allow_uncommitted``:
    run a study file that no commit holds unchanged (:mod:`raymvc.study.declared`; its cells
    record ``uncommitted``)."""

    scenarios: tuple[str, ...]
    grid: tuple[tuple[str, tuple], ...] = ()
    seeds: tuple[int, ...] | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    out: str | None = None
    jobs: int | None = None
    backend: str | None = None
    address: str | None = None
    cells: str = "actors"
    fresh_actors: bool = False
    only: tuple[str, ...] = ()
    quiet: bool = False
    allow_uncommitted: bool = False

    @classmethod
    def build(cls, scenarios, grid=None, seeds=None, overrides=None, **kw) -> SweepRequest:
        """From plain values: ``grid`` a mapping of key -> list, ``seeds`` any iterable of
        ints, ``overrides`` a mapping of key -> value."""
        paths = (str(scenarios),) if isinstance(scenarios, (str, Path)) else tuple(str(p) for p in scenarios)
        g = tuple((str(k), _grid_values(str(k), v)) for k, v in (dict(grid or {})).items())
        sd = None if seeds is None else tuple(int(x) for x in seeds)
        if sd is not None and len(sd) > MAX_SEEDS:
            raise ScenarioError(f"seeds: more than {MAX_SEEDS} seeds")
        return cls(scenarios=paths, grid=g, seeds=sd, overrides=tuple(as_overrides(overrides).items()), **kw)


def _from_study(req: SweepRequest):
    """A study file given to a sweep: its runs, grid and seeds stand for the request's.
    Returns (study or None, the entries to plan, the request as the study completes it,
    the study's runs left out, the commits its cells run at or None)."""
    from .declared import check_committed
    from .files import is_study_file, load_study

    studies = [p for p in req.scenarios if is_study_file(p)]
    only = [i.strip() for item in req.only for i in item.split(",") if i.strip()]
    if not studies:
        if only:
            raise ScenarioError("--only: picks runs of a study file; give one (studies/X.yaml)")
        if req.allow_uncommitted:
            raise ScenarioError("--allow-uncommitted: waives a study file's commit check; give one (studies/X.yaml)")
        return None, list(req.scenarios), req, set(), None
    if len(req.scenarios) > 1:
        raise ScenarioError(f"{studies[0]}: a study file is swept alone (it names its own scenarios)")
    study = load_study(studies[0])
    study.check_default()  # a tuning study never runs under a default its page would misname
    # seeds before runs: the study file and its scenarios as a commit holds them, before anything runs
    declared = check_committed(studies[0], [path for path, _, _ in study.entries()], req.allow_uncommitted)
    grid, seeds = _narrowed(studies[0], study, dict(req.grid), req.seeds)
    req = dataclasses.replace(req, grid=grid, seeds=seeds, out=req.out or str(study.default_out()))
    entries = study.entries()
    ids = [r.id for _, _, r in entries]
    unknown = [i for i in only if i not in ids]
    if unknown:
        raise ScenarioError(f"{studies[0]}: --only {unknown[0]}: no such run (runs: {', '.join(ids)})")
    if only:
        entries = [e for e in entries if e[2].id in only]
    cuda = [r.id for _, _, r in entries if r.id in study.spread_ids() and r.set.get("params.device") == "cuda"]
    why = ""
    if cuda and not _has_cuda():
        entries = [e for e in entries if e[2].id not in cuda]
        why = f"skipped {', '.join(cuda)} (a spread on CUDA; torch sees no CUDA device here)"
        print(f"sweep: {why}", file=sys.stderr)  # even with --quiet: a skipped run is never silent
    if not entries:
        raise ScenarioError(f"{studies[0]}: nothing to run here (runs picked: {', '.join(only or ids)}"
                            f"{'; ' + why if why else ''})")
    return study, [(path, over, _run_seeds(study, r, seeds)) for path, over, r in entries], req, set(ids), declared


def _run_seeds(study, run, seeds: tuple[int, ...]) -> list[int] | None:
    """A study run's seeds in this sweep: its own subset, narrowed like the study's."""
    if run.seeds is None:
        return None
    return [s for s in study.run_seeds(run) if s in seeds]


def _narrowed(path, study, grid: dict, seeds) -> tuple[tuple, tuple[int, ...]]:
    """The study's grid and seeds, narrowed by ``--grid`` and ``--seeds`` to some of its own
    declared values (so one cell can be run again); a value it does not declare is refused."""
    declared = {k: list(v) for k, v in study.spec.grid.items()}
    for key, values in grid.items():
        if key not in declared:
            raise ScenarioError(f"{path}: --grid {key}: not a key of the study's grid "
                                f"({', '.join(declared) or 'it has none'}); a study runs only the cells it declares")
        known = {short_value(v): v for v in declared[key]}
        bad = [v for v in values if short_value(v) not in known]
        if bad:
            raise ScenarioError(f"{path}: --grid {key}={short_value(bad[0])}: not among the study's declared values "
                                f"({', '.join(known)})")
        declared[key] = [known[short_value(v)] for v in values]
    own = list(study.seeds())
    if seeds is not None:
        bad = [x for x in seeds if x not in own]
        if bad:
            raise ScenarioError(f"{path}: --seeds {bad[0]}: not among the study's declared seeds ({study.spec.seeds})")
        own = [x for x in own if x in set(seeds)]
    return tuple((k, tuple(v)) for k, v in declared.items()), tuple(own)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run_sweep(req: SweepRequest) -> tuple[int, Path]:
    """Plan and execute ``req``; writes ``sweep.json``, ``sweep.csv`` and ``aggregate.csv``
    into the sweep folder, prints the aggregate on stdout. Returns (exit code: 0; 1 when a
    run ended ``error``, a party that raised or a cell that could not start; 130 when a
    signal stopped it; the sweep folder)."""
    study, scenarios, req, kept, declared = _from_study(req)
    grid = [(k, list(v)) for k, v in req.grid]
    keys = [k for k, _ in grid]
    base = dict(req.overrides)
    as_tasks = req.cells == "tasks"
    if req.cells not in ("actors", "tasks"):
        raise ScenarioError(f"--cells {req.cells}: one of actors, tasks")
    if as_tasks:  # the cells are in-process runs, the same as --backend local; Ray runs them as tasks
        if req.backend == "local":
            raise ScenarioError("--cells tasks: runs every cell as a Ray task (the cluster's backend is Ray); "
                                "drop --backend local")
        base = merge_overrides(base, {"runtime.backend": "local"})
    else:
        flags = {"runtime.address": req.address, "runtime.backend": req.backend}
        base = merge_overrides(base, {k: v for k, v in flags.items() if v})
    if req.jobs is not None and req.jobs < 1:
        raise ScenarioError(f"--jobs {req.jobs}: must be >= 1")
    seeds = list(req.seeds) if req.seeds is not None else None
    if req.out:
        out = Path(req.out)
    else:
        names = [load_scenario(p, base).name for p in req.scenarios]
        out = default_out_dir("sweep-" + "-".join(dict.fromkeys(names))[:60])
    cells = plan(scenarios, grid, seeds, base, out)
    for c in cells:
        c.study = declared.record() if declared is not None else None
    with OutputFolder(out, "sweep"):  # one sweep at a time, never into a run folder
        meta = {"scenarios": list(req.scenarios), "grid_keys": keys, "grid": {k: v for k, v in grid},
                "seeds": seeds, "overrides": base, "runs": len(cells)}
        if study is not None:
            meta["study"] = {"file": str(study.path), "name": study.name, "paper": study.spec.paper,
                             **{k: v for k, v in declared.record().items() if k != "file"},
                             "runs": {i: {"label": r.label, "variant": r.variant, "set": r.set}
                                      for i, r in study.labels().items()}}
        write_file(out / "sweep.json", json.dumps(meta, indent=2, default=str) + "\n")
        res = execute(cells, jobs=req.jobs, quiet=req.quiet, warm=not req.fresh_actors,
                      as_tasks=as_tasks, tasks_address=req.address)
        # what finished, whether or not a signal stopped the sweep; cells never started are left out
        started = [c for c in cells if current(c)]
        rows = _kept_rows(out, kept, cells, keys) + collect(started, out)
        write_csv(out / "sweep.csv", rows, sweep_fields(keys, rows))
        agg = aggregate(rows, keys)
        write_csv(out / "aggregate.csv", agg, aggregate_fields(keys, rows))
    print(format_aggregate(agg, keys))
    if not req.quiet:
        stale = f" ({res.stale} of them finished before with other settings or code)" if res.stale else ""
        print(f"sweep: {res.executed} runs executed{stale}, {res.reused} reused; results in {out} "
              f"(sweep.csv, aggregate.csv; plot with: raymvc plot {out})", file=sys.stderr)
        if res.interrupted:
            print(f"sweep: stopped by a signal; {len(cells) - len(started)} runs not started "
                  "(the same command carries on)", file=sys.stderr)
    if res.errors:  # quiet or not: a party that raised, or a cell that could not start, is no result
        print(f"sweep: {len(res.errors)} of {res.executed} runs ended in error; the first: {one_line(res.errors[0], 300)}",
              file=sys.stderr)
    if res.interrupted:
        return 130, out
    return (1 if res.errors else 0), out


def _kept_rows(out: Path, runs: set[str], cells: list[Cell], keys: list[str]) -> list[dict]:
    """The rows an earlier sweep of a study's folder wrote for cells of its ``runs`` this one leaves out
    (``--only``, ``--seeds``, ``--grid``, a skipped CUDA spread): a partial sweep never drops
    them. Each is read again from its run folder (inside ``out``, no link on the way, the
    row's fingerprint): a row whose folder is gone or holds another run is dropped, and no
    value of the old table is carried over unread."""
    if not runs or not (out / "sweep.csv").is_file():
        return []
    planned = {(c.name, str(c.seed), tuple(short_value(c.point.get(k)) for k in keys)) for c in cells}
    try:
        old = csv_rows(read_file(out / "sweep.csv", limit=MAX_SWEEP_CSV), what=str(out / "sweep.csv"),
                       required=("scenario", "method", "seed", "fingerprint", "run_dir"))
    except (OSError, ValueError) as e:
        print(f"sweep: the earlier {out / 'sweep.csv'} is not read ({str(e)[:200]}); its other runs' rows are "
              "not kept", file=sys.stderr)
        return []
    kept, dropped = [], 0
    fixed = {"scenario", "method", *RUN_FIELDS, *SIZE_FIELDS}
    for r in old:
        if r["scenario"] not in runs or (r["scenario"], str(r["seed"]), tuple(r.get(k, "") for k in keys)) in planned:
            continue  # not the study's, or swept again now
        folder = confined(out, r["run_dir"])
        try:
            s = RunFolder(folder).summary() if folder is not None else None
        except (OSError, ValueError):
            s = None
        if s is None or not s.fingerprint or s.fingerprint != r["fingerprint"]:
            dropped += 1
            continue
        point = {k: v for k, v in r.items() if k not in fixed and not k.startswith((METRIC_PREFIX, INFO_PREFIX))}
        kept.append({**summary_row(r["scenario"], s.method or r["method"], {}, r["seed"], s, folder, out), **point})
    if dropped:
        print(f"sweep: {dropped} earlier rows of other runs left out of sweep.csv (their run folders are gone, "
              "linked or hold other runs)", file=sys.stderr)
    return kept


def _grid_values(key: str, values) -> tuple:
    """A grid key's values as the Python API takes them: a list (or tuple, range) of values,
    or one string read as ``--grid key=TEXT`` reads it (``"0,0.3"`` is ``[0, 0.3]``); any
    other value (a lone number, a mapping, a set) is a one-line error."""
    if isinstance(values, str):
        return tuple(parse_grid([f"{key}={values}"])[0][1])
    if isinstance(values, (list, tuple, range)) and len(values):
        return tuple(values)
    raise ScenarioError(f"grid {key}: expected a non-empty list of values, e.g. {{{key!r}: [0, 0.1]}}, "
                        f"got {short_value(values)}")
