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
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import arithmetic
from ..channel import Ledger
from ..data.prepare import central, prepare  # noqa: F401 (prepare: the engine's entry point as before)
from ..metrics import clustering_scores, label_free_scores, preload
from ..protocols import get, search_paths
from ..results.folder import OutputFolder, ResultsError, RunWriter, default_out_dir, format_summary
from ..results.provenance import code_version, fingerprint, platform_info
from ..results.runfolder import RunFolder
from ..results.status import FINISHED, Status
from ..results.summary import RunSummary
from ..scenario import Scenario, ScenarioError
from ..scenario import one_line as one_line_text
from . import checkpoint
from .cluster import ClusterError, actors_needed, current_node, init_ray
from .failures import one_line, party_error
from .nodes import ClientNode, ClientPool, ServerNode
from .placement import Seats, could_hold, reserve
from .records import RoundRecord, RunEnd
from .secagg import KINDS as SECAGG_KINDS
from .signals import on_stop_signals
from .spec import RunSpec
from .threads import release_threads
from .transport import Interruption, RayPools, party_lost
from .warm import Crew, WarmActors, crew_key


def _progress_default(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _spawn(sc: Scenario, part, ds, seats=None, crew: Crew | None = None) -> tuple[object, list]:
    """Create the parties (on Ray in the CPUs ``seats`` reserved, else reserved here); returns
    (server node or actor, what to stop at the end: actor handles, then the reservation).
    With a warm ``crew`` (:mod:`raymvc.runtime.warm`) its actors are reset to this run
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
    """:func:`raymvc.runtime.checkpoint.identity` of a run of ``sc`` on ``ds``."""
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
    from .nodes import PROTOCOL_INPUTS, SERVER_STATE, decode_ledger
    from .state import StateError, state_names

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
    :class:`~raymvc.runtime.warm.WarmActors`): on Ray, reuse actors an earlier run of the
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
    if sc.runtime.backend == "ray":
        preload()  # the driver mostly waits while Ray and the actors start
    ray_init_s = init_ray(sc, part.n_clients) if sc.runtime.backend == "ray" else 0.0
    run = _Run(sc, part, ds, warm)
    run.reserve()  # a cluster that cannot place the parties: a ClusterError before anything is written
    try:
        writer = RunFolder(out).writer(keep_rounds=ck[1] if ck else None)
        writer.scenario(sc.to_yaml())
    except BaseException:
        run.release(reusable=False)
        raise
    from .state import StateError

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
    labels = _assemble_labels(part, end)
    writer.labels(labels, part.n_samples)
    writer.errors(errors_log(end))
    if end.ledger is not None:
        writer.messages(end.ledger)
    summary = _summarise(sc, ds, part, get(sc.method), end, labels, ray_init_s, timing["protocol_s"],
                         time.perf_counter() - wall0, out)
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
    from .state import StateError

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


def _labels_problem(y, n: int, unlabelled: bool = False) -> str | None:
    """Why ``y`` cannot be ``n`` cluster labels (None if it can). With ``unlabelled`` (a
    server's ``Done``) -1 marks a sample the server has no label for (no client holding it
    answered); any other negative value is a problem."""
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        return f"{y.size if y.ndim != 1 else len(y)} labels (shape {y.shape}) for {n} samples"
    if y.dtype.kind not in "iu":
        return f"labels of type {y.dtype}, not integers"
    if n and y.min() < (-1 if unlabelled else 0):
        return f"negative label {y.min()}"
    return None


def _assemble_labels(part, end: RunEnd) -> np.ndarray | None:
    """The final labels, checked: a server's ``Done`` labels of the wrong length or kind are
    the server's error (no labels), a client's wrong predictions that client's error (its
    rows stay -1)."""
    if end.labels is not None:
        problem = _labels_problem(end.labels, part.n_samples, unlabelled=True)
        if problem is None:
            return np.asarray(end.labels).astype(np.int64)
        end.errors.append({"party": "server", "phase": "eval", "round": end.rounds,
                           "error": f"Done(labels=...): {problem}", "traceback": ""})
        return None
    if not end.predictions:
        return None
    return _place(part, end.predictions, lambda c, problem: end.client_errors.append(
        {"round": end.rounds, "client": c, "path": "eval", "error": f"predict(): {problem}"}))


def _place(part, preds: dict[int, np.ndarray | None], bad: Callable[[int, str], None] | None = None) -> np.ndarray:
    """Every client's labels at its rows, -1 where none: a client with no labels, or with
    labels that cannot be its rows' (``bad`` is told why), leaves its rows at -1."""
    y = np.full(part.n_samples, -1, dtype=np.int64)
    for c, p in sorted(preds.items()):
        if p is None:
            continue
        problem = _labels_problem(p, len(part.rows[c]))
        if problem is None:
            y[part.rows[c]] = np.asarray(p, dtype=np.int64)
        elif bad is not None:
            bad(c, problem)
    return y


def code_errors(end: RunEnd) -> int:
    """How many times some party's code raised (server, driver, clients in any phase)."""
    return len(end.errors) + sum(not e.get("unreachable") for e in end.client_errors)


def _final_status(end: RunEnd, labels: np.ndarray | None) -> str:
    """``interrupted`` (stopped by a signal), ``error`` (some party's code raised, in any
    phase), ``failed`` (the run could not finish), ``degraded`` (injected faults only) or
    ``completed``."""
    if end.status == Status.INTERRUPTED:
        return Status.INTERRUPTED.value
    if end.status == Status.ERROR or code_errors(end):
        return Status.ERROR.value
    if end.status == Status.FAILED or labels is None:
        return Status.FAILED.value
    troubled = end.crashed or end.disconnected or end.counts.any()
    return (Status.DEGRADED if troubled else Status.COMPLETED).value


def errors_log(end: RunEnd) -> str:
    """``errors.log``: every error of every party in full, in the order they happened."""
    parts = []
    for e in end.errors:
        head = f"== {e['party']}, {e['phase']}, round {e['round']}: {e['error']}"
        parts.append(head + ("\n" + e["traceback"].rstrip() if e.get("traceback") else ""))
    for e in end.client_errors:
        head = f"== client {e['client']}, {e['path']}, round {e['round']}: {_first_line(e['error'] or '', 10**4)}"
        body = e.get("traceback") or (e["error"] if "\n" in (e["error"] or "") else "")
        parts.append(head + ("\n" + body.rstrip() if body else ""))
    return "\n\n".join(parts) + "\n" if parts else ""


def _error_lines(end: RunEnd) -> list[str]:
    """One bounded line per error, for ``summary.json``."""
    lines = [f"{e['party']} {e['phase']} round {e['round']}: {e['error']}" for e in end.errors]
    lines += [f"client {e['client']} {e['path']} round {e['round']}: {_first_line(e['error'] or '')}"
              for e in end.client_errors if not e.get("unreachable")]
    return [_first_line(x) for x in lines]


def _first_line(text: str, limit: int = 300) -> str:
    lines = str(text).strip().splitlines()
    return one_line_text(lines[0] if lines else "", limit)


def _participation(end: RunEnd) -> dict[int, dict]:
    """Each client's rounds addressed, answered, missed and its last answered round (what the
    server keeps for client selection besides, ``last_s``, stays out of the summary)."""
    return {c: {k: v for k, v in asdict(p).items() if k != "last_s"} for c, p in sorted(end.participation.items())}


def _secagg_totals(ledger: Ledger) -> dict:
    """Totals of the secure-aggregation layer's own messages, part of ``communication``."""
    sub = Ledger()
    sub.extend(r for r in ledger.rows if r.kind in SECAGG_KINDS)
    return sub.totals("protocol")


def final_scores(sc, ds, proto, labels) -> tuple[dict | None, dict | None]:
    """The scores of ``labels`` over all rows, and over the labelled ones where some are not."""
    metrics = metrics_labelled = None
    kappa = proto.partition == "horizontal"
    if labels is not None and not ds.has_labels:  # unlabelled data: label-free scores only
        metrics = label_free_scores(ds, labels, seed=sc.seed)
    elif labels is not None:
        metrics = clustering_scores(ds.labels, labels, kappa=kappa)
        has = labels >= 0
        if 0 < has.sum() < len(labels):  # some clients could not label: score the rest apart
            metrics_labelled = clustering_scores(ds.labels[has], labels[has], kappa=kappa)
    return metrics, metrics_labelled


def probe_scores(sc, ds, part, proto, probe: dict[int, np.ndarray | None]) -> dict:
    """``runtime.score_every``: a round's probe labels scored as a run's final labels are
    (over all rows, -1 where a client had no label), with the labelled share."""
    y = _place(part, probe)  # wrong labels were that client's error in the round already
    metrics, _ = final_scores(sc, ds, proto, y)
    return {**metrics, "labelled": float(np.mean(y >= 0)) if len(y) else 0.0}


def _summarise(sc, ds, part, proto, end: RunEnd, labels, ray_init_s, protocol_s, wall_s, out) -> dict:
    metrics, metrics_labelled = final_scores(sc, ds, proto, labels)
    ledger = end.ledger if end.ledger is not None else Ledger()
    return {
        "name": sc.name,
        "method": sc.method,
        "dataset": ds.name,
        "partition": part.kind,
        "n_samples": part.n_samples,
        "n_clients": part.n_clients,
        "n_clusters": ds.n_clusters,
        "seed": sc.seed,
        "backend": sc.runtime.backend,
        "status": _final_status(end, labels),
        "error": end.error or (_error_lines(end)[0] if code_errors(end) else None),
        "errors": _error_lines(end),
        "fingerprint": fingerprint(sc, ds.source),
        "code_version": code_version(sc.method),
        "platform": platform_info(),
        "rounds": end.rounds,
        "metrics": metrics,
        "unlabelled_samples": int(np.sum(labels < 0)) if labels is not None else part.n_samples,
        "metrics_labelled": metrics_labelled,
        "communication": ledger.totals("protocol"),
        "communication_eval": ledger.totals("eval"),
        "communication_setup": ledger.totals("setup"),
        "communication_secagg": _secagg_totals(ledger),
        "per_client_bytes": ledger.per_client("protocol"),
        "participation": _participation(end),
        "faults": {
            "dropped_replies": end.counts.dropped_replies,
            "late_replies": end.counts.late_replies,
            "crashed_clients": list(end.crashed),
            "rejected_messages": end.counts.rejected_messages,
            "disconnected_clients": list(end.disconnected),
            "evicted_clients": list(end.evicted),
            "client_errors": [{k: v for k, v in e.items() if k != "traceback"} for e in end.client_errors],
        },
        "timing": {
            "wall_s": wall_s,
            "ray_init_s": ray_init_s,
            "protocol_s": protocol_s,
            "virtual_s": end.virtual_s,
            "client_compute_s": end.compute_s,
        },
        "protocol_info": end.info,
        "data_info": part.info,
        "out_dir": str(out),
        **({"central": True} if central(sc, proto) else {}),  # the centralised reference: pooled, no faults
    }


__all__ = ["run_scenario", "prepare", "init_ray", "ClusterError", "format_summary"]
