"""Running a sweep's cells: in this process, in worker processes, on Ray actors kept from one
run to the next, or as Ray tasks; reuse of finished cells; signals that stop a sweep
between runs. Scope: execution only; :mod:`.cells` plans, :mod:`.rows` tabulates."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..results.folder import OutputFolder, jsonable, write_file
from ..results.runfolder import RunFolder
from ..results.status import Status
from ..results.summary import RunSummary
from ..safeio import within
from ..scenario import load_scenario
from ..text import one_line
from .cells import Cell
from .grid import MAX_SEEDS, check_size, parse_grid, parse_seeds, short_key, slug  # noqa: F401 (re-exported)


def _run_cell(scenario: str, overrides: dict[str, Any], run_dir: str, progress=None, **kw) -> dict:
    """Run one cell (in this process, on a thread of it or in a worker process); returns its
    summary. ``kw`` goes to :func:`raymvc.driver.run_scenario` (``warm``, ``stop_requested``,
    ``study``)."""
    from ..driver import run_scenario

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
    (:mod:`raymvc.driver.warm`). A Ray run that failed, or had a party on a node the
    cluster lost while it ran, is run again (at most :data:`RAY_RETRIES` times).

    ``as_tasks``: every cell (planned on the in-process backend) runs as one Ray task on
    the cluster at ``tasks_address`` (or an embedded Ray), at most ``jobs`` at once
    (default: as many as the cluster's CPUs hold); see :mod:`raymvc.driver.cell_tasks`.
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
    from ..driver.warm import WarmActors

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
    injected = _injected_crashes(cell, summary, crashed)
    injected |= set((summary.get("faults") or {}).get("evicted_clients") or [])  # hung, then evicted: the run's own
    return bool(crashed - injected)


def _injected_crashes(cell: Cell, summary: dict, crashed: set[int]) -> set[int]:
    """The clients the scenario's fault kinds crash on purpose (``faults.crash``, a listed
    ``crash`` kind, or a kind of one's own whose ``crashes`` hook says so) in the run's rounds."""
    from .. import kinds
    from ..availability import Context

    sc = load_scenario(cell.scenario, cell.overrides)
    sizes = (summary.get("data_info") or {}).get("client_sizes") or []
    ids = list(range(max(len(sizes), max(crashed) + 1)))
    try:
        built = [kinds.build(name, params, Context(sc.seed, ids, dict(enumerate(sizes)) or None))
                 for name, params in kinds.entries(sc.faults)]
        rounds = int(summary.get("rounds") or 0) + 1
        return {c for c in ids for r in range(rounds + 1) if any(kinds.crashes(k, r, c) for k in built)}
    except Exception:  # a kind that cannot be rebuilt here (its module gone): the scheduled crashes alone
        return {c.client for c in sc.faults.crash}


def ray_slots(todo: list[Cell], jobs: int | None) -> int:
    """Start (or join) Ray for the largest run; how many runs side by side it holds (at most ``jobs``)."""
    import ray

    from ..driver.cluster import init_ray

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
    from ..driver.signals import on_stop_signals

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
    """Each cell as one Ray task (:mod:`raymvc.driver.cell_tasks`); its files come back
    to the driver, which writes them into the cell's folder."""
    import ray

    from .. import protocols
    from ..driver import cell_tasks
    from ..driver.cluster import init_ray

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


def current(cell: Cell) -> bool:
    """Whether the cell's folder holds a result of its current settings and code (of any status)."""
    try:
        return (bool(cell.fingerprint) and within(Path(cell.run_dir).parent, Path(cell.run_dir))
                and RunFolder(cell.run_dir).summary().fingerprint == cell.fingerprint)
    except (OSError, ValueError):
        return False
