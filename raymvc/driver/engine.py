"""The driver: scenario -> data -> parties -> rounds -> results on disk.

``run_scenario`` loads and splits the data, starts the server and one client per
shard (Ray actors, or plain objects with ``runtime.backend: local``), lets the server
node drive the rounds, writes ``rounds.jsonl`` as they end, scores the labels and
writes ``summary.json`` and ``messages.csv``. Whatever fails after the run directory
exists -- a crashed client, a protocol error, too few replies -- the files are still
written, with ``status`` saying what happened.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .. import arithmetic
from ..data.prepare import central, prepare  # noqa: F401 (prepare: the engine's entry point as before)
from ..protocols import get, search_paths
from ..results.folder import OutputFolder, ResultsError, RunWriter, default_out_dir, format_summary
from ..results.outcome import assemble_labels, code_errors, errors_log, probe_scores, summarise
from ..results.provenance import code_version, fingerprint
from ..results.runfolder import RunFolder
from ..results.status import FINISHED, Status
from ..results.summary import RunSummary
from ..runtime.failures import one_line, party_error
from ..runtime.nodes import ClientNode, ClientPool, ServerNode
from ..runtime.records import RoundRecord, RunEnd
from ..runtime.secagg import KINDS as SECAGG_KINDS
from ..runtime.spec import RunSpec
from ..runtime.threads import release_threads
from ..runtime.transport import Interruption, RayPools, party_lost
from ..scenario import Scenario, ScenarioError
from . import checkpoint
from .cluster import ClusterError, actors_needed, current_node, init_ray
from .placement import Seats, could_hold, reserve
from .signals import on_stop_signals
from .warm import Crew, WarmActors, crew_key


def _progress_default(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _spawn(sc: Scenario, part, ds, seats=None, crew: Crew | None = None) -> tuple[object, list]:
    """Create the parties (on Ray in the CPUs ``seats`` reserved, else reserved here); returns
    (server node or actor, what to stop at the end: actor handles, then the reservation).
    With a warm ``crew`` (:mod:`raymvc.driver.warm`) its actors are reset to this run
    instead (what to stop is then the crew); a crew whose actors are gone is ended and
    fresh actors start in a new reservation."""
    rt = sc.runtime
    ids = list(range(part.n_clients))
    spec = RunSpec.build(sc, part, ds, search=tuple(search_paths()))  # where the driver looks for modules
    if rt.backend == "local":
        clients = {c: ClientNode(c, spec, part.shards[c]) for c in ids}
        return ServerNode(spec, clients), []
    import ray

    spec = ray.put(spec)  # pickled once; every actor gets the same object (Ray resolves the reference)
    per = rt.clients_per_actor
    groups = [ids[i:i + per] for i in range(0, len(ids), per)]
    owner = {c: p for p, g in enumerate(groups) for c in g}
    sizes = {p: len(g) for p, g in enumerate(groups)}
    if crew is not None and crew.server is not None:
        try:
            kept = [p for p in range(len(groups)) if p in crew.pools]
            idle = [p for p in crew.pools if p >= len(groups)]  # emptied: no earlier run's clients stay
            new = _start_pools(sc, part, groups, crew.seats, spec, [p for p in range(len(groups)) if p not in crew.pools])
            crew.pools.update(new)
            crew.started_now = len(new)
            ray.get([crew.pools[p].reset.remote({c: part.shards[c] for c in groups[p]} if p < len(groups) else {},
                                                spec) for p in kept + idle],
                    timeout=rt.reply_timeout_s)
            pools = RayPools(handles={p: crew.pools[p] for p in range(len(groups))}, owner=owner, sizes=sizes)
            ray.get(crew.server.reset.remote(spec, pools), timeout=rt.reply_timeout_s)
            return crew.server, [crew]
        except Exception:  # an actor died between runs (a lost node), or does not answer: start afresh
            crew.stop()
            crew.seats = seats = reserve(sc, part.n_clients, crew.room)
            crew.node = current_node()
    seats = seats or reserve(sc, part.n_clients)  # the server first, beside the driver if it has room
    ServerActor = ray.remote(num_cpus=rt.server_cpus, num_gpus=rt.server_gpus, max_restarts=0)(ServerNode)
    pools = RayPools(handles=_start_pools(sc, part, groups, seats, spec, range(len(groups))), owner=owner,
                     sizes=sizes)
    server = ServerActor.options(scheduling_strategy=seats.server()).remote(spec, pools)
    if crew is not None:
        crew.server, crew.pools, crew.started_now = server, dict(pools.handles), len(groups) + 1
        return server, [crew]
    return server, [server, *pools.handles.values(), seats]


def _start_pools(sc: Scenario, part, groups: list[list[int]], seats, spec, which) -> dict:
    """Client actors (pools) ``which`` of ``groups``, each in its reserved seat; ``spec``: the
    run's :class:`RunSpec` in Ray's object store."""
    import ray

    PoolActor = ray.remote(num_cpus=seats.client_cpus, num_gpus=sc.runtime.client_gpus, max_restarts=0)(ClientPool)
    return {p: PoolActor.options(scheduling_strategy=seats.pool(p)).remote(
        {c: part.shards[c] for c in groups[p]}, spec) for p in which}


# the driver asks the server for rounds until this much wall time has passed (at least one
# round): fast rounds cost one driver round trip per batch, a stop request or progress line
# waits at most this long
ROUNDS_CALL_S = 0.25
MAX_ROUNDS_PER_CALL = 10_000


WAIT_SLICE_S = 0.25  # the driver's longest wait inside Ray before a signal can act
FORCED_WAIT_S = 2.0  # after a second signal: how long the server may take to hand over the run so far


class _Call:
    """Call a node method the same way on both backends."""

    def __init__(self, node, backend: str, stop=None):
        self.node, self.remote = node, backend == "ray"
        self.stop = stop  # the run's _StopRequest: a second signal ends a wait

    def __call__(self, name: str, *args, timeout: float | None = None):
        if self.remote:
            import ray

            ref = getattr(self.node, name).remote(*args)
            end = None if timeout is None else time.monotonic() + timeout
            while True:  # short waits: a second signal is acted on between them, never inside Ray
                if self.stop is not None and self.stop.forced and not self.stop.finishing:
                    raise forced_stop(self.stop.forced)
                left = None if end is None else end - time.monotonic()
                ready, _ = ray.wait([ref], timeout=WAIT_SLICE_S if left is None else max(0.0, min(WAIT_SLICE_S, left)))
                if ready or (left is not None and left <= WAIT_SLICE_S):
                    return ray.get(ref, timeout=0 if not ready else None)
        return getattr(self.node, name)(*args)


class RunInterrupted(Interruption):
    """SIGTERM (or SIGINT) reached the driver: stop, and keep what the run has so far (raised
    inside a client's code on the in-process backend, it passes through as the driver's)."""


def forced_stop(why: str) -> RunInterrupted:
    e = RunInterrupted(why)
    e.forced = True  # stop now: the server is given only FORCED_WAIT_S to hand over the run so far
    return e


class _StopRequest:
    """SIGINT/SIGTERM while a run is on: the first asks to stop after the current call for
    rounds (one round, or fast rounds filling ``ROUNDS_CALL_S``; the driver is often inside
    Ray, where raising from a signal handler is not safe); a second one stops at once."""

    def __init__(self, progress: Callable[[str], None], external: Callable[[], str | None] | None = None):
        self.signal: str | None = None
        self.saving = False
        self.progress = progress
        self.external = external  # a stop asked for elsewhere (a sweep running this run on a thread)
        self.forced: str | None = None  # a second signal: stop now
        self.finishing = False  # the run so far is being collected: no wait is cut short any more
        self.inside_ray = False  # the driver waits on Ray actors (set by the run)

    def __call__(self, signum, frame):
        name = signal.Signals(signum).name
        if self.saving:
            return  # the results are being written: nothing stops that
        if self.signal is not None:
            self.saving = True
            self.forced = f"{self.signal}, then {name}"
            if not self.inside_ray:  # plain Python below: raising here is safe
                raise forced_stop(self.forced)
            return  # inside Ray's wait a raise is not safe: _Call raises within a quarter second
        self.signal = name
        self.progress(f"{name}: stopping after the rounds under way (send it again to stop now)")

    def check(self) -> None:
        if self.signal is None and self.external is not None:
            self.signal = self.external()
        if self.signal is not None:
            self.saving = True
            raise RunInterrupted(self.signal)


@contextlib.contextmanager
def _stop_on_signals(progress: Callable[[str], None], external: Callable[[], str | None] | None = None):
    request = _StopRequest(progress, external)
    with on_stop_signals(request):
        yield request


def _round_line(name: str, rec: RoundRecord, scores: dict | None = None) -> str:
    extra = "".join(f" {k}={v:.6g}" for k, v in rec.info.items() if isinstance(v, float))
    miss = f" missing={rec.missing}" if rec.missing else ""
    scored = "".join(f" {k}={scores[k]:.4f}" for k in ("acc", "silhouette") if isinstance((scores or {}).get(k), float))
    return (f"[{name}] round {rec.round}: {len(rec.replied)} replies, {rec.wire_bytes / 1e6:.3f} MB{miss}{extra}"
            f"{scored}")


class _Run:
    """The parties of one run and what is known about it, kept so that a run stopped
    half-way can still hand over its ledger and rounds."""

    def __init__(self, sc: Scenario, part, ds, warm: WarmActors | None = None):
        self.sc, self.part, self.ds = sc, part, ds
        self.warm = warm if sc is not None and sc.runtime.backend == "ray" else None
        self.crew: Crew | None = None
        self.timing: dict = {"startup_s": 0.0, "protocol_s": 0.0}
        self.t_rounds: float | None = None  # when the rounds began
        self.handles: list = []
        self.seats = None
        self.call: _Call | None = None
        self.last_round = -1  # the last round written to rounds.jsonl

    def reserve(self) -> None:
        """On Ray: wait until the cluster has room for the parties (else ClusterError)."""
        if self.sc.runtime.backend != "ray":
            return
        if self.warm is None:
            self.seats = reserve(self.sc, self.part.n_clients)
            self.handles = [self.seats]
            return
        crew = self.warm.acquire(crew_key(self.sc), actors_needed(self.sc, self.part.n_clients),
                                 lambda room: reserve(self.sc, self.part.n_clients, room),
                                 fits=lambda room: could_hold(self.sc, room))
        self.crew, self.seats, self.handles = crew, crew.seats, [crew]

    def release(self, reusable: bool) -> None:
        """End the parties (on Ray: kill the actors, free their CPUs), or with warm actors hand
        them back for the next run when the run ended cleanly."""
        if self.crew is not None and self.warm is not None:
            self.warm.give(self.crew, reusable)
        else:
            _stop(self.handles)

    def drive(self, writer: RunWriter, progress: Callable[[str], None],
              on_round: Callable[[dict], None] | None, stop: _StopRequest, resume: tuple | None = None) -> RunEnd:
        sc, part = self.sc, self.part
        t_start = time.perf_counter()
        warm_server = self.crew.server if self.crew is not None else None
        server, self.handles = _spawn(sc, part, self.ds, self.seats, self.crew)
        if self.crew is not None:
            self.seats = self.crew.seats
        self.timing["reused_actors"] = warm_server is not None and server is warm_server  # not if they were gone
        self.timing["actors_started"] = (self.crew.started_now if self.crew is not None
                                         else 0 if sc.runtime.backend == "local"
                                         else actors_needed(sc, part.n_clients) + 1)
        call = self.call = _Call(server, sc.runtime.backend, stop)
        stop.inside_ray = sc.runtime.backend == "ray"
        connected = call("connect")  # waits for every actor to be up, then agrees keys
        self.timing["startup_s"] = time.perf_counter() - t_start
        self.timing["placement"] = call("placement")
        if self.seats is not None:
            self.timing["placement"]["client_cpus"] = self.seats.client_cpus
        progress(f"[{sc.name}] {sc.method}: {len(connected)}/{part.n_clients} clients connected "
                 f"({sc.runtime.backend} backend)")
        logged, so_far = 0, 0  # rounds on disk, their wire bytes (the progress line's MB goes on from them)
        if resume is not None:
            ck, logged = resume
            call("restore", ck)
            so_far = sum(r.wire_bytes for r in RunFolder(writer.dir).rounds()[:logged])
            progress(f"[{sc.name}] resumed after round {logged} ({so_far / 1e6:.3f} MB so far)")  # counted from 1
        else:
            call("begin")
        t0 = self.t_rounds = time.perf_counter()
        per_call = 1 if sc.runtime.checkpoint else MAX_ROUNDS_PER_CALL  # a checkpoint follows every round
        done = False
        proto = get(sc.method)
        while not done:
            stop.check()
            batch, lines = call("run_rounds", ROUNDS_CALL_S, per_call), []
            for rec in batch:  # on disk first, whatever the callbacks below do
                if rec.probe is not None:  # runtime.score_every
                    rec.scores = probe_scores(sc, self.ds, part, proto, rec.probe)
                line = rec.to_dict()
                writer.round(line)
                self.last_round = rec.round
                lines.append(line)
            for rec, line in zip(batch, lines):
                logged, so_far = logged + 1, so_far + int(line.get("wire_bytes") or 0)
                if sc.runtime.checkpoint and not rec.done:
                    t = time.perf_counter()
                    ck = call("checkpoint")
                    if ck is not None:  # None: a client is still busy with a call that timed out
                        checkpoint.save(writer.dir, ck, logged, self.identity(), writer.rounds_sha256())
                    self.timing["checkpoint_s"] = self.timing.get("checkpoint_s", 0.0) + time.perf_counter() - t
                if on_round is not None:
                    on_round({**line, "wire_bytes_total": so_far})
                else:
                    progress(_round_line(sc.name, rec, line.get("scores")))
                done = rec.done
        end = call("finish")
        self.timing["protocol_s"] = time.perf_counter() - t0 - self.timing.get("checkpoint_s", 0.0)
        return end

    def identity(self) -> dict:
        """What a checkpoint of this run records, and a resume must find unchanged."""
        return run_identity(self.sc, self.ds)

    def salvage(self, status: str, error: str, writer: RunWriter, errors: list[dict] = (),
                wait_s: float = 30.0) -> RunEnd:
        """The run so far from the server (ledger, rounds, counts), or an empty record; round
        records the server finished but the driver never received (it stopped waiting
        mid-batch) are written to rounds.jsonl. ``errors``: what raised in the driver's call."""
        if self.t_rounds is not None and not self.timing["protocol_s"]:
            self.timing["protocol_s"] = time.perf_counter() - self.t_rounds - self.timing.get("checkpoint_s", 0.0)
        end = None
        if self.call is not None:
            try:
                end = self.call("finish", status, timeout=wait_s)
            except BaseException:  # the server is gone or stuck: nothing more to save
                end = None
        end = end or RunEnd(status=status)
        for rec in end.unreported:
            if rec["round"] > self.last_round:
                writer.round(rec)
                self.last_round = rec["round"]
        end.status, end.error = status, end.error or error
        end.errors = [*end.errors, *errors]
        return end


def _out_dir(sc: Scenario, out_dir, overwrite: bool, resume: bool = False) -> OutputFolder:
    """The run folder, held for the run (see :class:`~raymvc.results.folder.OutputFolder`); one-line errors."""
    out = Path(out_dir) if out_dir else default_out_dir(sc.name)
    try:
        return OutputFolder(out, "run", overwrite=overwrite, resume=resume)
    except ResultsError as e:
        raise ScenarioError(f"{'--resume' if resume else '--out'} {e}") from None


def run_identity(sc: Scenario, ds) -> dict:
    """:func:`raymvc.driver.checkpoint.identity` of a run of ``sc`` on ``ds``."""
    return checkpoint.identity(fingerprint(sc, ds.source), code_version(sc.method))


def _load_checkpoint(sc: Scenario, out: Path, ds) -> tuple[dict, int]:
    if not checkpoint.exists(out):
        try:
            ended = RunFolder(out).summary()
        except (OSError, ValueError):
            ended = None
        status = getattr(ended.status, "value", ended.status) if ended is not None else None
        if status is not None and status != Status.INTERRUPTED.value:
            raise ScenarioError(f"--resume {out}: the run there ended ({status}); nothing to resume "
                                "(a run that ends keeps no checkpoint)")
        raise ScenarioError(f"--resume {out}: no checkpoint there (runs save them with runtime.checkpoint: true)")
    from ..channel.codec import CodecError
    from ..runtime.nodes import PROTOCOL_INPUTS, SERVER_STATE, decode_ledger
    from ..runtime.state import StateError, state_names

    try:
        ck = checkpoint.load(out, run_identity(sc, ds))
        # only declared state: checked here, before anything in the folder changes
        odd = [n for n in state_names(ck[0]["node"]) if n not in SERVER_STATE]
        for data in (ck[0]["server"], *(d[:-8] for d in ck[0]["clients"].values())):
            odd += [n for n in state_names(data) if n in PROTOCOL_INPUTS]
        if odd:
            raise checkpoint.CheckpointError(f"it sets {odd[0][:40]!r}, which a checkpoint never holds")
        decode_ledger(ck[0]["ledger"])  # a malformed ledger: refused here too
        return ck
    except (checkpoint.CheckpointError, StateError, CodecError) as e:
        raise ScenarioError(f"--resume {out}: {e}") from None


def run_scenario(sc: Scenario, out_dir: str | Path | None = None, *, progress: Callable[[str], None] | None = None,
                 prepared=None, on_round: Callable[[dict], None] | None = None, overwrite: bool = False,
                 resume: bool = False, warm: WarmActors | None = None,
                 stop_requested: Callable[[], str | None] | None = None, study: dict | None = None) -> RunSummary:
    """Run one scenario end to end and return its :class:`~raymvc.results.summary.RunSummary` (a
    read-only mapping over ``summary.json``, which is also written to disk).

    ``on_round(record)``, if given, receives every round's record instead of the
    round's progress line (the command line draws its own progress from it), with
    ``wire_bytes_total``: the run's protocol wire bytes up to that round, rounds before a
    resume included. The
    folder is held (locked) from before Ray starts until its files are written; a
    second run into it is refused, and so is a non-empty folder unless raymvc made it
    and ``overwrite`` is given (then raymvc's own files in it are removed first).
    Whatever stops the run -- a failure, SIGINT or SIGTERM -- ``summary.json``,
    ``messages.csv`` and ``labels.csv`` are written with what the run has so far
    (``status`` ``failed`` or ``interrupted``). With ``resume``, ``out_dir`` is a run
    folder whose run stopped with ``runtime.checkpoint`` on: the run carries on from its
    last checkpoint and ends as the uninterrupted run would have. ``warm`` (a sweep's
    :class:`~raymvc.driver.warm.WarmActors`): on Ray, reuse actors an earlier run of the
    same shape left, and leave this run's for the next. ``stop_requested()``, asked before
    every call for rounds, returns the name of a stop request made elsewhere (or None): a
    run on a thread other than the main one gets no signal of its own. ``study`` (a study
    sweep's cell): its study file and the commits it runs at (:mod:`raymvc.study.declared`),
    written into ``summary.json`` under ``study``.
    """
    progress = progress or _progress_default
    wall0 = time.perf_counter()
    if arithmetic.check():
        raise ScenarioError(arithmetic.check())
    ds, part = prepared or prepare(sc)
    if resume and not out_dir:
        raise ScenarioError("--resume: give the run folder")
    with _out_dir(sc, out_dir, overwrite, resume) as out:  # held before Ray starts, until the files are written
        ck = _load_checkpoint(sc, out, ds) if resume else None
        return _run_in(sc, out, ck, ds, part, wall0, progress, on_round, warm, stop_requested, study)


def _run_in(sc: Scenario, out: Path, ck, ds, part, wall0: float, progress, on_round, warm=None,
            stop_requested=None, study=None) -> dict:
    ray_init_s = init_ray(sc, part.n_clients) if sc.runtime.backend == "ray" else 0.0
    run = _Run(sc, part, ds, warm)
    run.reserve()  # a cluster that cannot place the parties: a ClusterError before anything is written
    try:
        writer = RunFolder(out).writer(keep_rounds=ck[1] if ck else None)
        writer.scenario(sc.to_yaml())
    except BaseException:
        run.release(reusable=False)
        raise
    from ..runtime.state import StateError

    interrupted = reusable = False
    refused = None
    with _stop_on_signals(progress, stop_requested) as stop:
        try:
            end = run.drive(writer, progress, on_round, stop, resume=ck)
            reusable = end.status == "finished" and not code_errors(end)
        except StateError as e:
            if ck is None:
                raise
            refused = e  # a refused resume writes no summary over the interrupted run's
        except (KeyboardInterrupt, RunInterrupted) as e:
            stop.saving = stop.finishing = True
            interrupted = True
            wait_s = FORCED_WAIT_S if getattr(e, "forced", False) else 30.0
            end = run.salvage("interrupted", str(e) or "SIGINT", writer, wait_s=wait_s)
        except (Exception, SystemExit) as e:  # keep whatever we have (sys.exit in party code included)
            stop.saving = stop.finishing = True
            if _is_failure(e):  # a party gone or out of reach: the run could not finish
                end = run.salvage("failed", one_line(e), writer)
            else:  # code raised (the protocol's, in setup or a round, or the engine's)
                end = run.salvage("error", one_line(e), writer, [party_error("driver", "run", run.last_round + 1, e)])
        finally:
            run.release(reusable)
            if sc.runtime.backend == "local":
                release_threads()  # the driver gets its own thread limits back
        if refused is not None:
            writer.close()
            raise ScenarioError(f"--resume {out}: {one_line(refused)}")
        summary = _write_results(sc, ds, part, end, run.timing, ray_init_s, wall0, out, writer, study)
        if summary["status"] in FINISHED:
            checkpoint.clear(out)
    if interrupted:
        progress(f"[{sc.name}] interrupted: partial results in {out}")
    return RunSummary.from_dict(summary)


def _write_results(sc, ds, part, end: RunEnd, timing: dict, ray_init_s: float, wall0: float, out: Path,
                   writer: RunWriter, study: dict | None = None) -> dict:
    try:  # a file that cannot be written (a full disk) is a ResultsError; the files before it stay
        return _write_files(sc, ds, part, end, timing, ray_init_s, wall0, out, writer, study)
    finally:
        writer.close()


def _write_files(sc, ds, part, end: RunEnd, timing: dict, ray_init_s: float, wall0: float, out: Path,
                 writer: RunWriter, study: dict | None = None) -> dict:
    labels = assemble_labels(part, end)
    writer.labels(labels, part.n_samples)
    writer.errors(errors_log(end))
    if end.ledger is not None:
        writer.messages(end.ledger)
    proto = get(sc.method)
    summary = summarise(sc, ds, part, proto, end, labels, ray_init_s, timing["protocol_s"],
                        time.perf_counter() - wall0, out, central=central(sc, proto), secagg_kinds=SECAGG_KINDS)
    summary["timing"]["startup_s"] = timing["startup_s"]
    summary["timing"]["checkpoint_s"] = timing.get("checkpoint_s", 0.0)
    where = timing.get("placement") or {}
    clients = where.get("clients") or {}
    summary["placement"] = {"clients_per_actor": sc.runtime.clients_per_actor, "strategy": sc.runtime.placement,
                            "client_cpus": where.get("client_cpus"),
                            "nodes": sorted(set(clients.values())), "server_node": where.get("server"),
                            "client_node": clients, "shared_bodies": end.shared_bodies,
                            "reused_actors": bool(timing.get("reused_actors")),
                            "actors_started": int(timing.get("actors_started") or 0),
                            "gpu_ids": where.get("gpu_ids")}
    expected = 2 + actors_needed(sc, part.n_clients) if sc.runtime.backend == "ray" else 1  # driver, server, pools
    summary["arithmetic"] = arithmetic.combine({"driver": arithmetic.describe(), **(where.get("arithmetic") or {})},
                                               expected=expected)
    if study:
        summary["study"] = dict(study)
    writer.summary(summary)
    return summary


def _is_failure(e: BaseException) -> bool:
    """Whether an exception that reached the driver means a party was lost or out of reach
    (the run could not finish), rather than code that raised."""
    from ..runtime.state import StateError

    if isinstance(e, (ClusterError, StateError)):  # StateError: a checkpoint refused on resume
        return True
    return party_lost(e)


def _stop(handles: list) -> None:
    if not handles:
        return
    import ray

    for h in handles:  # the actors, then their reserved CPUs
        try:
            h.release() if isinstance(h, Seats) else ray.kill(h, no_restart=True)
        except Exception:
            pass


__all__ = ["run_scenario", "prepare", "init_ray", "ClusterError", "format_summary"]
