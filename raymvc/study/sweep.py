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

import contextlib
import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..results.folder import OutputFolder, ResultsError, default_out_dir, jsonable, read_file, short_value, write_file
from ..results.provenance import fingerprint
from ..results.runfolder import RunFolder
from ..results.status import ALL, FINISHED, Status
from ..results.summary import RunSummary
from ..runtime.cluster import AUTO_CAP, actors_needed
from ..runtime.warm import crew_key
from ..safeio import SafeReadError, confined, csv_rows, json_loads, within
from ..scenario import ScenarioError, as_overrides, load_scenario, merge_overrides
from ..text import one_line
from .grid import MAX_SEEDS, check_size, parse_grid, parse_seeds, short_key, slug  # noqa: F401 (re-exported)

METRICS = ("acc", "nmi", "ari")
SIZE_FIELDS = ("client_rows_min", "client_rows_max")  # the fewest and most rows a client held (data_info)
METRIC_PREFIX = "metric."  # sweep.csv's column of every other score a run's summary reports (metric.purity, ...)
INFO_PREFIX = "info."  # sweep.csv's column of each number a method reports in protocol_info (info.objective, ...)
MAX_SWEEP_JSON = 64 << 20  # bytes of sweep.json read back
MAX_SWEEP_CSV = 512 << 20  # bytes of sweep.csv read back
RUN_FIELDS = ("seed", "status", "acc", "nmi", "ari", "mb", "rounds", "wall", "dropped_replies", "late_replies",
              "crashed_clients", "errors", "fingerprint", "run_dir")


# --------------------------------------------------------------------------- cells
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


# --------------------------------------------------------------------------- running
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


def _run_cell(scenario: str, overrides: dict[str, Any], run_dir: str, progress=None, **kw) -> dict:
    """Run one cell (in this process, on a thread of it or in a worker process); returns its
    summary. ``kw`` goes to :func:`raymvc.runtime.run_scenario` (``warm``, ``stop_requested``,
    ``study``)."""
    from ..runtime import run_scenario

    sc = load_scenario(scenario, overrides)
    if progress is not None:
        kw.update(progress=progress.text, on_round=progress.round)
    else:
        kw.update(progress=lambda line: None)
    # only unfinished cells get here: start them afresh (the earlier attempt's files are removed)
    return run_scenario(sc, Path(run_dir), overwrite=True, **kw)


def _failed_summary(cell: Cell, err: BaseException, status: Status = Status.FAILED) -> dict:
    summary = RunSummary.failed(cell.name, cell.method, cell.seed, one_line(f"{type(err).__name__}: {err}"),
                                cell.run_dir, cell.fingerprint, status).to_dict()
    return _with_study(cell, summary)


def _cause(err: BaseException) -> BaseException:
    """The exception a Ray task raised, without Ray's wrapper (whose text is the remote
    traceback, in colour); any other exception as it is."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and type(err).__module__.startswith("ray."):
        return cause
    return err


def _with_study(cell: Cell, summary: dict) -> dict:
    """A study's cell names its study file and the commits it ran at (:mod:`raymvc.study.declared`)."""
    return {**summary, "study": dict(cell.study)} if cell.study else summary


def cell_state(cell: Cell) -> str:
    """``reusable`` (finished by the same code with the same settings), ``stale`` (finished,
    but something that determines its result changed since) or ``todo``. A cell folder that
    is a link (or lies behind one) holds no result of this sweep: ``todo``."""
    if not within(Path(cell.run_dir).parent, Path(cell.run_dir)):
        return "todo"
    try:
        s = RunFolder(cell.run_dir).summary()
    except (OSError, ValueError):
        return "todo"
    if not s.final:
        return "todo"
    return "reusable" if s.fingerprint == cell.fingerprint and cell.fingerprint else "stale"


@dataclass
class Outcome:
    """What :func:`execute` did: runs executed, reused, re-run because they were stale, and
    whether a signal stopped the sweep (then the cells not started are left for later);
    ``errors``: the runs that ended ``error`` (the sweep then exits 1)."""

    executed: int = 0
    errors: list[str] = field(default_factory=list)  # "cell: error" of each run that ended ``error``
    reused: int = 0
    stale: int = 0
    interrupted: bool = False


def execute(cells: list[Cell], jobs: int | None = 1, quiet: bool = False, live: bool | None = None,
            warm: bool = True, tasks_address: str | None = None, as_tasks: bool = False) -> Outcome:
    """Run every cell that has no reusable result. Ctrl-C/SIGTERM: the runs under way stop
    (as ``interrupted``), nothing more starts, and the outcome says so.

    ``jobs``: runs at once (``None``: one with the local backend, as many as the cluster
    holds on Ray). Local runs side by side go to worker processes. Ray runs side by side
    go to threads of this process, each reserving its actors' CPUs whole before it starts
    them; with ``warm`` (on Ray) actors are kept from one run to the next of the same kind
    (:mod:`raymvc.runtime.warm`). A Ray run that failed, or had a party on a node the
    cluster lost while it ran, is run again (at most :data:`RAY_RETRIES` times).

    ``as_tasks``: every cell (planned on the in-process backend) runs as one Ray task on
    the cluster at ``tasks_address`` (or an embedded Ray), at most ``jobs`` at once
    (default: as many as the cluster's CPUs hold); see :mod:`raymvc.runtime.cell_tasks`.
    """
    from ..progress import SweepProgress

    states = {id(c): cell_state(c) for c in cells}
    todo = [c for c in cells if states[id(c)] != "reusable"]
    res = Outcome(reused=len(cells) - len(todo), stale=sum(states[id(c)] == "stale" for c in cells))
    prog = SweepProgress(len(cells), skipped=res.reused, live=live, quiet=quiet)
    if (res.reused or res.stale) and not quiet:
        prog.line.log(f"[sweep] reusing {res.reused} of {len(cells)} finished runs; running {len(todo)}"
                      + (f" ({res.stale} finished before with other settings or code, run again)" if res.stale else ""))
    on_ray = bool(todo) and all(c.extra.get("backend") == "ray" for c in todo) and not as_tasks
    parallel = (jobs or 1) > 1 and len(todo) > 1 and all(c.extra.get("backend") == "local" for c in todo) \
        and not as_tasks
    if (jobs or 1) > 1 and not parallel and not on_ray and not as_tasks and todo and not quiet:
        prog.line.log("[sweep] --jobs: the runs mix the local and Ray backends; they go one after another")
    try:
        with _stop_on_signals() as stop, _warm_actors(on_ray and warm, todo) as actors:
            if as_tasks and todo:
                _execute_tasks(todo, jobs, tasks_address, prog, stop, res, quiet)
            elif parallel:
                _execute_parallel(todo, jobs, prog, stop, res)
            elif on_ray:
                _execute_ray(todo, jobs, prog, stop, res, actors, quiet)
            else:
                _execute_here(todo, prog, stop, res)
            res.interrupted = bool(stop.signal)
    finally:
        prog.close()
    return res


def _execute_here(todo: list[Cell], prog, stop, res: Outcome, run=None) -> None:
    """One run after another in this process, each with its live progress."""
    for cell in todo:
        if stop.signal:
            break
        rp = prog.run(cell.label, cell.max_rounds)
        if run is not None:
            summary = run(cell, rp)
        else:
            try:
                summary = _run_cell(cell.scenario, cell.overrides, str(cell.run_dir), progress=rp, study=cell.study)
            except Exception as e:  # the cell could not start (its data, its module): an error
                summary = _failed_summary(cell, e, Status.ERROR)
                _write_failed(cell, summary)
        _record(cell, summary, prog, stop, res)


def _record(cell: Cell, summary: dict, prog, stop, res: Outcome) -> None:
    res.executed += 1
    if summary.get("status") == Status.ERROR.value:
        res.errors.append(f"{cell.label}: {summary.get('error') or 'error'}")
    prog.finished(cell.label, summary)
    if summary.get("status") == "interrupted":
        stop.signal = stop.signal or "SIGINT"  # the run stopped on a signal: so does the sweep


@contextlib.contextmanager
def _warm_actors(on: bool, todo: list[Cell]):
    if not on:
        yield None
        return
    from ..runtime.warm import WarmActors

    actors = WarmActors()
    actors.plan(c.extra["crew"] for c in todo if "crew" in c.extra)
    try:
        yield actors
    finally:
        actors.close()


RAY_RETRIES = 2  # a Ray run hit by a lost node is run again, at most this often


def _alive_nodes() -> set[str]:
    import ray

    try:
        return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    except Exception:
        return set()


def _run_on_ray(cell: Cell, actors, stop, progress=None, log=None) -> dict:
    """One cell on Ray; run again when a node it ran on was lost while it ran."""
    for attempt in range(1 + RAY_RETRIES):
        before = _alive_nodes()
        try:
            summary = _run_cell(cell.scenario, cell.overrides, str(cell.run_dir), progress=progress, warm=actors,
                                stop_requested=lambda: stop.signal, study=cell.study)
        except Exception as e:
            summary = _failed_summary(cell, e)
            _write_failed(cell, summary)
        lost = before - _alive_nodes()
        if not _hit_by(summary, lost, cell) or stop.signal or attempt == RAY_RETRIES:
            return summary
        note = f"[sweep] {cell.label}: a node it ran on left the cluster; running it again"
        if log is not None:
            log(note)
        elif progress is not None:
            progress.text(note)
    return summary


def _hit_by(summary: dict, lost: set[str], cell: Cell) -> bool:
    """Whether the cluster, not the cell's faults, spoiled the run: it failed or lost clients
    while a node it ran on left the cluster, or clients crashed that no crash fault names
    (their actors died: Ray may not have declared their node dead yet)."""
    if summary.get("status") not in ("failed", "degraded"):
        return False
    where = summary.get("placement") or {}
    nodes = {where.get("server_node"), *(where.get("client_node") or {}).values()}
    if nodes & lost:
        return True
    crashed = set((summary.get("faults") or {}).get("crashed_clients") or [])
    if summary.get("status") == "failed":  # a party lost (by name, where Ray has not yet declared its node dead)
        from ..runtime.transport import LOST_NAMES

        error = str(summary.get("error") or "")
        if lost or any(name in error for name in LOST_NAMES):
            return True
    if not crashed:
        return False
    injected = {c.client for c in load_scenario(cell.scenario, cell.overrides).faults.crash}
    injected |= set((summary.get("faults") or {}).get("evicted_clients") or [])  # hung, then evicted: the run's own
    return bool(crashed - injected)


def ray_slots(todo: list[Cell], jobs: int | None) -> int:
    """Start (or join) Ray for the largest run; how many runs side by side it holds (at most ``jobs``)."""
    import ray

    from ..runtime.cluster import init_ray

    big = max(todo, key=lambda c: c.extra.get("cpus", 0.0))
    init_ray(load_scenario(big.scenario, big.overrides), big.extra.get("n_clients", 1))
    if jobs == 1 or len(todo) == 1 or len({c.extra.get("address") for c in todo}) > 1:
        return 1  # runs naming different clusters (or none) would restart Ray under each other
    fits = int((ray.cluster_resources().get("CPU", 0.0) + 1e-9) // max(big.extra.get("cpus", 1.0), 1e-9))
    return max(1, min(fits, len(todo), jobs or len(todo)))


def _execute_ray(todo: list[Cell], jobs: int | None, prog, stop, res: Outcome, actors, quiet: bool) -> None:
    """Runs on Ray: one after another, or side by side on threads of this process."""
    from concurrent.futures import ThreadPoolExecutor

    slots = ray_slots(todo, jobs)
    if slots == 1:
        log = None if quiet else prog.line.log
        _execute_here(todo, prog, stop, res, run=lambda cell, rp: _run_on_ray(cell, actors, stop, rp, log))
        return
    if not quiet:
        prog.line.log(f"[sweep] {slots} runs at a time on Ray")
    with ThreadPoolExecutor(max_workers=slots, thread_name_prefix="raymvc-run") as pool:
        _drain(todo, slots, lambda c: pool.submit(_run_on_ray, c, actors, stop, None, None if quiet else prog.line.log),
               prog, stop, res)


def _drain(todo: list[Cell], slots: int, submit, prog, stop, res: Outcome, on_stop=None, result=None,
           on_force=None) -> None:
    """The queue loop every side-by-side executor shares: at most ``slots`` cells under
    way, ``submit(cell)`` starts one and returns a ``concurrent.futures.Future`` of its
    summary; nothing starts after a signal (``on_stop()`` is called once then). A second
    signal stops the cells under way at once: ``on_force(futures)`` (kill their workers),
    each is recorded as ``interrupted`` and the loop returns without waiting for them. A
    future that raises is recorded as a failed run; ``result(cell, future)`` may turn a
    future's value into the summary."""
    from concurrent.futures import FIRST_COMPLETED, wait

    queue, running = list(todo), {}
    stopped = False
    while queue or running:
        while queue and len(running) < slots and not stop.signal:
            c = queue.pop(0)
            running[submit(c)] = c
        if stop.signal and not stopped:
            stopped = True
            if on_stop is not None:
                on_stop(list(running))
        if not running:
            break
        if stop.force and on_force is not None:  # (runs on threads stop on their own, after their call)
            on_force(list(running))
            for fut, cell in list(running.items()):
                fut.cancel()
                summary = _failed_summary(cell, RuntimeError(f"stopped by a second signal ({stop.force})"),
                                          Status.INTERRUPTED)
                with contextlib.suppress(OSError, ValueError):  # its worker may still hold the folder
                    _write_failed(cell, summary)
                _record(cell, summary, prog, stop, res)
            running.clear()
            break
        done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
        for fut in done:
            cell = running.pop(fut)
            try:
                summary = fut.result() if result is None else result(cell, fut)
            except Exception as e:  # a worker that died, a task that could not finish, a cell that could
                summary = _failed_summary(cell, _cause(e), Status.ERROR)  # not start: an error; go on
                _write_failed(cell, summary)
            _record(cell, summary, prog, stop, res)


class _SweepStop:
    signal: str | None = None  # the first stop signal: nothing new starts
    force: str | None = None  # a second one: the runs under way are stopped at once


@contextlib.contextmanager
def _stop_on_signals():
    """While the sweep runs, SIGINT/SIGTERM only set a flag (a run under way installs its own
    handler and stops after its current round): no new run starts after the signal."""
    from ..runtime.signals import on_stop_signals

    stop = _SweepStop()

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if stop.signal is None:
            stop.signal = name
        else:
            stop.force = name

    handler.raymvc_outer = True  # a run under way in this thread passes its signals on to it

    with on_stop_signals(handler):
        yield stop


def _ignore_sigint() -> None:
    """Workers ignore SIGINT between runs (each run handles it while it is on)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _execute_parallel(todo: list[Cell], jobs: int, prog, stop: _SweepStop, res: Outcome) -> None:
    """At most ``jobs`` runs in worker processes; a new one starts only when one ends, and
    none after a signal (which is passed on to the runs under way)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_ignore_sigint)

    def forward(running) -> None:  # runs under way stop after their round
        for proc in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGINT)

    def kill(running) -> None:  # a second signal: the workers go, whatever they were doing
        for proc in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(OSError):
                proc.kill()

    try:
        _drain(todo, jobs, lambda c: pool.submit(_run_cell, c.scenario, c.overrides, str(c.run_dir), study=c.study),
               prog, stop, res, on_stop=forward, on_force=kill)
    finally:
        pool.shutdown(wait=not stop.force, cancel_futures=True)


def _execute_tasks(todo: list[Cell], jobs: int | None, address: str | None, prog, stop, res: Outcome,
                   quiet: bool) -> None:
    """Each cell as one Ray task (:mod:`raymvc.runtime.cell_tasks`); its files come back
    to the driver, which writes them into the cell's folder."""
    import ray

    from .. import protocols
    from ..runtime import cell_tasks
    from ..runtime.cluster import init_ray

    scenarios = {id(c): load_scenario(c.scenario, c.overrides) for c in todo}
    first = scenarios[id(todo[0])]
    init_ray(first.model_copy(update={"runtime": first.runtime.model_copy(update={"address": address})}), 1)
    per = max(cell_tasks.task_resources(sc)["num_cpus"] for sc in scenarios.values())
    fits = max(1, int((ray.cluster_resources().get("CPU", 0.0) + 1e-9) // per))
    slots = max(1, min(len(todo), jobs or fits))
    if not quiet:
        prog.line.log(f"[sweep] cells as Ray tasks: {slots} at a time")
    search = protocols.search_paths()
    refs: dict = {}

    def submit(cell: Cell):
        ref = cell_tasks.submit(scenarios[id(cell)], cell.run_dir.name, search)
        fut = ref.future()
        refs[fut] = ref
        return fut

    def result(cell: Cell, fut) -> dict:
        refs.pop(fut, None)
        try:
            summary, files, node = fut.result()
        except ray.exceptions.TaskCancelledError:  # stopped by the sweep's signal: left for the next sweep
            return _failed_summary(cell, RuntimeError("stopped by a signal"), Status.INTERRUPTED)
        summary = _with_study(cell, {**summary, "out_dir": str(cell.run_dir),
                                     "cell": {"executor": "ray-task", "node": node}})
        files[RunFolder.SUMMARY] = (json.dumps(jsonable(summary), indent=2) + "\n").encode()
        with OutputFolder(cell.run_dir, "run", overwrite=True):
            for rel, data in files.items():
                target = cell.run_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                write_file(target, data)
        return summary

    _drain(todo, slots, submit, prog, stop, res, result=result,
           on_stop=lambda running: cell_tasks.cancel([refs[f] for f in running if f in refs]),
           on_force=lambda running: cell_tasks.cancel([refs[f] for f in running if f in refs], force=True))


def _write_failed(cell: Cell, summary: dict) -> None:
    with OutputFolder(cell.run_dir, "run", overwrite=True):
        RunFolder(cell.run_dir).write_summary(summary)


# --------------------------------------------------------------------------- tables
def collect(cells: list[Cell], out: Path) -> list[dict]:
    """One row per cell from its summary.json (cells without one count as failed)."""
    rows = []
    for c in cells:
        try:
            s = RunFolder(c.run_dir).summary()
        except (OSError, ValueError):
            s = RunSummary.from_dict({"status": Status.FAILED.value})
        rows.append(summary_row(c.name, s.method or c.method, c.point, c.seed, s, c.run_dir, out))
    return rows


def summary_row(name: str, method: str, point: dict, seed: int, s: RunSummary, run_dir: Path, out: Path) -> dict:
    """A run's row of ``sweep.csv``."""
    m = s.metrics or {}
    f = s.faults
    try:
        rel = str(Path(run_dir).relative_to(out))
    except ValueError:
        rel = str(run_dir)
    row = {"scenario": name, "method": method}
    row.update({k: short_value(v) for k, v in point.items()})
    row.update(seed=seed, status=s.status.value, acc=m.get("acc"), nmi=m.get("nmi"), ari=m.get("ari"), mb=s.mb,
               rounds=s.rounds, wall=s.wall_s, dropped_replies=f.get("dropped_replies"),
               late_replies=f.get("late_replies"), crashed_clients=len(f.get("crashed_clients") or []),
               errors=len(s.errors), fingerprint=s.fingerprint or None, run_dir=rel)
    row.update({METRIC_PREFIX + k: v for k, v in m.items() if k not in METRICS})  # whatever else the run scored
    row.update(info_numbers(s.raw.get("protocol_info")))
    sizes = (s.raw.get("data_info") or {}).get("client_sizes")
    if isinstance(sizes, list) and sizes and all(isinstance(x, int) for x in sizes):
        row.update(client_rows_min=min(sizes), client_rows_max=max(sizes))  # the split's extremes
    return row


def info_numbers(info) -> dict[str, float | int]:
    """``info.<key>`` for each number (not a flag, not a list) of a run's ``protocol_info``;
    keys that are not plain names are left out (they would make odd column names)."""
    if not isinstance(info, dict):
        return {}
    return {INFO_PREFIX + k: v for k, v in info.items()
            if isinstance(k, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", k)
            and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def column_of(metric: str) -> str:
    """sweep.csv's column of a score as a study file or ``--metric`` names it: a column of
    every row (``acc``, ``mb``, ``rounds``, a record's ``virtual_s``) and ``info.<key>`` as
    they are, any other score (``kappa``, ``purity``, ...) under ``metric.``."""
    if metric in (*RUN_FIELDS, "virtual_s") or metric.startswith((INFO_PREFIX, METRIC_PREFIX)):
        return metric
    return METRIC_PREFIX + metric


def extra_metrics(rows: list[dict]) -> list[str]:
    """The ``metric.*`` and ``info.*`` columns the rows carry (every score beyond ACC, NMI
    and ARI, and the numbers methods report), sorted: scores first."""
    return sorted({k for r in rows for k in r if k.startswith((METRIC_PREFIX, INFO_PREFIX))},
                  key=lambda k: (k.startswith(INFO_PREFIX), k))


def sweep_fields(keys: list[str], rows: list[dict]) -> list[str]:
    """sweep.csv's columns: the fixed ones, then every other score some run reported."""
    sizes = [k for k in SIZE_FIELDS if any(k in r for r in rows)]
    return ["scenario", "method", *keys, *RUN_FIELDS, *sizes, *extra_metrics(rows)]


def metric_names(rows: list[dict]) -> list[str]:
    """Every score a mean is taken of: ACC, NMI, ARI, the ``metric.*`` columns, MB."""
    return [*METRICS, *extra_metrics(rows), "mb"]


def num(v) -> float | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


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


def aggregate(rows: list[dict], keys: list[str]) -> list[dict]:
    """Mean and std (over seeds, sample std) per scenario and grid point, of the runs that
    ended ``completed`` or ``degraded``; runs that ended ``error`` (some party's code
    raised), ``interrupted`` or ``failed`` (missing included) are counted, never averaged.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["method"], *[str(r[k]) for k in keys]), []).append(r)
    out = []
    for gkey, rs in groups.items():
        ok = [r for r in rs if r["status"] in FINISHED]
        agg = {"scenario": gkey[0], "method": gkey[1]}
        agg.update(zip(keys, gkey[2:]))
        agg.update(runs=len(rs), completed=sum(r["status"] == "completed" for r in rs),
                   degraded=sum(r["status"] == "degraded" for r in rs), error=sum(r["status"] == "error" for r in rs),
                   interrupted=sum(r["status"] == "interrupted" for r in rs))
        agg["failed"] = agg["runs"] - agg["completed"] - agg["degraded"] - agg["error"] - agg["interrupted"]
        for m in metric_names(rs):
            mean, std = mean_std([x for r in ok if (x := num(r.get(m))) is not None])
            agg[f"{m}_mean"], agg[f"{m}_std"] = mean, std
        out.append(agg)
    return out


def write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    """Written whole to a temporary name and renamed (a link there is replaced, never followed)."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    write_file(path, buf.getvalue())


def aggregate_fields(keys: list[str], rows: list[dict] = ()) -> list[str]:
    """aggregate.csv's columns (``rows``: sweep.csv's, for the scores beyond ACC/NMI/ARI)."""
    return ["scenario", "method", *keys, "runs", *ALL] + \
        [f"{m}_{s}" for m in metric_names(list(rows)) for s in ("mean", "std")]


def format_aggregate(agg: list[dict], keys: list[str]) -> str:
    """The aggregate as a text table (mean ± std; n = runs that entered the mean)."""
    def pm(r, m, digits):
        mean, std = num(r.get(f"{m}_mean")), num(r.get(f"{m}_std"))
        if mean is None:
            return "n/a"
        return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"

    def counts(r) -> str:
        extra = "".join(f" {n} {k}" for k in ("error", "interrupted") if (n := int(r.get(k) or 0)))
        return f"{r['completed']}/{r['degraded']}/{r['failed']}{extra}"

    labelled = any(num(r.get("acc_mean")) is not None for r in agg) or \
        not any(num(r.get(f"{METRIC_PREFIX}silhouette_mean")) is not None for r in agg)
    scores = [("ACC", "acc", 4), ("NMI", "nmi", 4), ("ARI", "ari", 4)] if labelled else \
        [("SIL", f"{METRIC_PREFIX}silhouette", 4), ("CH", f"{METRIC_PREFIX}calinski_harabasz", 1)]
    head = ["scenario", "method", *[short_key(k) for k in keys], "done/deg/fail", *(h for h, _, _ in scores), "MB"]
    body = [[str(r["scenario"]), str(r["method"]), *[str(r[k]) for k in keys], counts(r),
             *(pm(r, m, d) for _, m, d in scores), pm(r, "mb", 3)] for r in agg]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    if any(int(r["failed"]) + int(r.get("error") or 0) + int(r.get("interrupted") or 0) for r in agg):
        lines.append("(runs that failed, raised an error or were interrupted are left out of every mean)")
    return "\n".join(lines)


def read_sweep(sweep_dir: str | Path) -> tuple[dict, list[dict], list[dict]]:
    """(meta, rows of sweep.csv, aggregate) of a sweep folder; the aggregate is recomputed from sweep.csv."""
    d = Path(sweep_dir)
    try:
        meta = json_loads(read_file(d / "sweep.json", limit=MAX_SWEEP_JSON), what=str(d / "sweep.json"))
    except (OSError, ValueError):  # missing, a link, too big, too deep, not JSON
        meta = {}
    if not isinstance(meta, dict):  # not what a sweep writes: read the folder from sweep.csv alone
        meta = {}
    try:
        rows = csv_rows(read_file(d / "sweep.csv", limit=MAX_SWEEP_CSV), what=str(d / "sweep.csv"),
                        required=("scenario", "seed", "status"))
    except SafeReadError as e:
        raise ResultsError(str(e)) from None
    try:
        keys = meta.get("grid_keys")
        if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
            fixed = set(RUN_FIELDS) | set(SIZE_FIELDS) | {"scenario", "method", "mb_total"}
            keys = [k for k in (rows[0].keys() if rows else [])
                    if k not in fixed and not k.startswith((METRIC_PREFIX, INFO_PREFIX))]
            meta["grid_keys"] = keys
        return meta, rows, aggregate(rows, keys)
    except (csv.Error, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        detail = f"no column {e}" if isinstance(e, KeyError) else str(e)
        raise ResultsError(f"{d / 'sweep.csv'}: corrupt ({detail[:200]})") from None


# --------------------------------------------------------------------------- command
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
        started = [c for c in cells if _current(c)]
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


def _current(cell: Cell) -> bool:
    """Whether the cell's folder holds a result of its current settings and code (of any status)."""
    try:
        return (bool(cell.fingerprint) and within(Path(cell.run_dir).parent, Path(cell.run_dir))
                and RunFolder(cell.run_dir).summary().fingerprint == cell.fingerprint)
    except (OSError, ValueError):
        return False
