"""The two kinds of party: :class:`ClientNode` and :class:`ServerNode`.

Both are plain classes. The Ray backend turns them into actors (``ray.remote``); the
in-process backend uses them as they are. Either way the same code seals, opens,
meters and fault-injects every message, which is why both backends give identical
results for one seed.

A message's path: the protocol's ``Server.step`` returns ``{client: Message}`` -> the
round workflow (:mod:`raymvc.runtime.rounds`) hands them to the exchange
(:mod:`raymvc.runtime.exchange`), which seals each one for its link (codec -> compression
-> encryption), writes a ledger row and asks the fault plan whether the client drops out
-> the transport delivers the frames (all at once on Ray) -> ``ClientNode.deliver`` opens
and checks each one, calls the protocol's ``Client.handle`` and seals the reply -> back in
the exchange the reply is opened, timed on the virtual clock, metered, and handed to the
next ``Server.step`` as a reply or as missing. :class:`ServerNode` is the shell around
the two: set-up, checkpoints, placement, the end of the run.
"""

from __future__ import annotations

import copy
import queue
import struct
import threading
import time

import numpy as np

from .. import arithmetic
from ..availability import Context
from ..channel import Endpoint, Ledger, RejectedMessage, codec
from ..messages import Message, labels_array
from ..protocol import ClientContext, ServerContext
from .exchange import SERVER, Exchange, broadcast_key, client_party
from .failures import cut_line, one_line, party_error, traceback_text
from .faults import DeviceProfiles, FaultPlan, Network, build_kinds, work_share
from .records import SERVER_STATE, Participation, RoundRecord, RunEnd, ServerState
from .rounds import EVAL_LABELS, EVAL_PREDICT, RoundWorkflow
from .spec import RunSpec
from .state import StateError, dump_state, load_state
from .threads import pin_threads
from .transport import Interruption, LocalTransport, make_transport

__all__ = ["SERVER", "SERVER_STATE", "ClientNode", "ClientPool", "ServerNode", "broadcast_key", "client_party",
           "decode_ledger", "encode_ledger"]

PROTOCOL_INPUTS = ("config", "shard", "ctx")  # rebuilt from the scenario, never checkpointed
_ROUND = struct.Struct("<q")


def encode_ledger(ledger: Ledger) -> bytes:
    """A checkpoint's ledger: its rows as columns in one codec frame (a few vectorised
    arrays, not one object per row: the ledger grows with every round)."""
    return codec.encode(Message("ledger", ledger.to_columns()))


def decode_ledger(data: bytes) -> Ledger:
    """The ledger :func:`encode_ledger` wrote; a ``StateError`` (one line) for anything else."""
    try:
        msg = codec.decode(data)
        if msg.kind != "ledger":
            raise ValueError("not a ledger")
        return Ledger.from_columns(msg.fields)
    except ValueError as e:  # CodecError is a ValueError
        raise StateError(f"ledger.bin: {e}") from None


def _reply_name(reply: object) -> str:
    """What a reply is, without its ``repr`` (client code, which may raise or be huge)."""
    name = type(reply).__name__
    try:
        kind = reply.kind if isinstance(reply, Message) else None
        return f"{name} {kind[:60]!r}" if type(kind) is str else name
    except BaseException:
        return name


# ---------------------------------------------------------------------------
class ClientNode:
    """One client: its private shard, the protocol's client object, its endpoint."""

    def __init__(self, cid: int, spec: RunSpec, shard):
        from ..protocols import add_search_path, get

        for folder in spec.search:  # where the driver found the method's module
            add_search_path(folder)

        self.cid = cid
        # the fault kinds (faults.partial_work among them): each client decides its work share
        # with them as the server's plan does
        self.kinds = build_kinds(spec.faults, Context(spec.seed, spec.client_ids, dict(spec.client_sizes),
                                                      dict(spec.client_dims), spec.trace))
        self.threads = spec.threads
        pin_threads(spec.threads)
        ch = spec.channel
        proto = get(spec.method)
        ctx = ClientContext(client_id=cid, n_clients=spec.n_clients, n_clusters=spec.n_clusters, seed=spec.seed,
                            float_dtype=ch.float_dtype)
        self.client = proto.client(spec.method_config(proto), shard, ctx)
        self.secure = None  # the secure-aggregation layer, when on and the method declares a sum
        if ch.secure_aggregation and proto.secure_sums:
            from .secure import ClientLayer  # loaded (with cryptography) only when the layer is on

            self.secure = ClientLayer(cid, proto.secure_sums, spec.n_clients, ch.secagg_neighbours)
        self.endpoint = Endpoint(client_party(cid), encryption=ch.encryption,
                                 compression=ch.compression, float_dtype=ch.float_dtype,
                                 max_message_bytes=ch.max_message_bytes())

    def hello(self, server_key: bytes | None) -> bytes | None:
        """Key agreement: learn the server's public key, return ours."""
        self.endpoint.add_peer(SERVER, server_key)
        return self.endpoint.public_key()

    def state(self) -> bytes:
        """The protocol client's state (checkpoint); the shard, config and keys are rebuilt, not saved."""
        return dump_state(self.client, skip=PROTOCOL_INPUTS) + _ROUND.pack(self.client.ctx.round)

    def restore(self, data: bytes) -> None:
        load_state(self.client, data[:-_ROUND.size], skip=PROTOCOL_INPUTS)
        (self.client.ctx.round,) = _ROUND.unpack(data[-_ROUND.size:])

    def probe(self, model: bytes) -> tuple[str, np.ndarray | str | None, str | None]:
        """``runtime.score_every``: the labels this client would give its rows after receiving
        ``model`` (an encoded ``Server.current_model()``), worked out on a deep copy of the
        protocol client, its context and its shard included (a method may write into either
        while it handles the model), so the client itself is never touched, whatever happens;
        only its config, which validation froze, is shared. Returns ``("ok", labels or
        None, None)`` or ``("error", the exception in one line, its traceback)``."""
        pin_threads(self.threads)
        c = self.client
        try:
            twin = copy.deepcopy(c, memo={id(c.config): c.config})
            twin.handle(codec.decode(model))
            y = twin.predict()
            return "ok", None if y is None else labels_array(y), None
        except Interruption:
            raise
        except BaseException as e:
            return "error", one_line(e), traceback_text(e)

    def deliver(self, frame: bytes | tuple[bytes, bytes]) -> tuple[str, bytes | None, str | None, float, str | None]:
        """Open a frame (bytes or ``(header, body)``), run the protocol, seal the reply.

        Returns ``(status, reply_frame, detail, compute_s, traceback)`` with status
        ``"ok"``, ``"rejected"`` (detail = reason) or ``"error"`` (detail = the exception
        in one line, traceback = its traceback). Whatever the client's code raises --
        ``SystemExit`` and ``KeyboardInterrupt`` included -- is that client's error; only
        an :class:`~raymvc.runtime.transport.Interruption` from outside passes through.
        """
        try:
            opened = self.endpoint.open(frame)
        except RejectedMessage as e:
            return "rejected", None, e.reason, 0.0, None
        pin_threads(self.threads)
        t = time.perf_counter()
        try:
            self.client.ctx.round = opened.round
            # the plan's decision (FaultPlan.work), drawn here from the same stream
            self.client.ctx.work = work_share(self.kinds, opened.round, self.cid)
            if opened.msg.kind == EVAL_PREDICT:
                y = self.client.predict()  # None: nothing to label its rows with
                reply = Message(EVAL_LABELS) if y is None else Message(EVAL_LABELS, y=labels_array(y))
            elif self.secure is not None and self.secure.owns(opened.msg):
                reply = self.secure.handle(opened.msg, opened.round)
            else:
                reply = self.client.handle(opened.msg)
                if self.secure is not None and reply is not None:
                    reply = self.secure.strip(reply, opened.round)
        except Interruption:
            raise
        except BaseException as e:  # the client fails, the run goes on without it
            return "error", None, one_line(e), time.perf_counter() - t, traceback_text(e)
        compute = time.perf_counter() - t
        if reply is None:
            return "ok", None, None, compute, None
        try:
            sealed = self.endpoint.seal(SERVER, opened.round, reply)
        except Interruption:
            raise
        except BaseException as e:  # e.g. a string that is not valid UTF-8: the client's fault, not the run's
            return "error", None, cut_line(f"unencodable reply ({_reply_name(reply)}): {one_line(e)}"), compute, \
                traceback_text(e)
        return "ok", sealed.frame, None, compute, None


class _Job:
    """One client call, run on a worker thread; ``done`` is set when it has returned."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args
        self.result: tuple | None = None
        self.done = threading.Event()

    def __call__(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as e:  # ClientNode.deliver keeps client code's exceptions; this is the rest
            self.result = ("error", None, one_line(e), 0.0, traceback_text(e))
        finally:
            self.done.set()


class _Worker:
    """A daemon thread running jobs one after another, until it is given ``None``."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="raymvc-clients", daemon=True).start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()


class ClientPool:
    """Several logical clients in one process (one Ray actor with ``runtime.clients_per_actor``).

    Each logical client is a full :class:`ClientNode` with its own protocol state, keys,
    fault stream and ledger rows; a crash fault kills one logical client, not its
    neighbours. Frames for the pool's clients arrive in one call; the clients run one
    after another on a worker thread, each within its own deadline. A client that
    overruns it is answered ``timeout`` alone: its call is left running on that thread
    (abandoned), a fresh thread serves the others, and its later frames are ``timeout``
    at once until the abandoned call returns.
    """

    def __init__(self, shards: dict[int, object], spec: RunSpec):
        self.nodes = {cid: ClientNode(cid, spec, shard) for cid, shard in shards.items()}
        self.dead: set[int] = set()
        self.busy: dict[int, _Job] = {}  # clients whose call overran its deadline and still runs
        self.worker: _Worker | None = None

    def reset(self, shards: dict[int, object], spec: RunSpec) -> None:
        """Host a new run's clients (warm actors, :mod:`raymvc.driver.warm`): built exactly as
        a fresh pool's, the earlier run's clients dropped."""
        if self.worker is not None:
            self.worker.jobs.put(None)  # its thread ends
        self.__dict__.clear()  # not even an attribute set after construction survives
        self.__init__(shards, spec)

    def reusable(self) -> bool:
        """Whether a new run may reset this pool: no call of this run still running."""
        return not any(not job.done.is_set() for job in self.busy.values())

    def hello_all(self, server_key: bytes | None) -> dict[int, bytes | None]:
        return {cid: node.hello(server_key) for cid, node in self.nodes.items()}

    def deliver(self, frames: dict[int, tuple], deadline_s: float | None = None, *shared: bytes) -> dict[int, tuple]:
        """Deliver ``{client: (header, body)}``, each client's call limited to ``deadline_s`` of
        wall time (``None``: no limit); a body given as an int is ``shared[i]``, a broadcast body
        the transport put in Ray's object store once (Ray passes it here as bytes)."""
        out = {}
        for cid, (header, body) in frames.items():
            if cid in self.dead:
                out[cid] = ("crashed", None, "logical client killed", 0.0, None)
            elif cid in self.busy and not self.busy[cid].done.is_set():
                out[cid] = ("timeout", None, "still busy with a call that overran its deadline", 0.0, None)
            else:
                self.busy.pop(cid, None)
                out[cid] = self._run(cid, (header, shared[body] if isinstance(body, int) else body), deadline_s)
        return out

    def _run(self, cid: int, frame: tuple, deadline_s: float | None) -> tuple:
        if self.worker is None:
            self.worker = _Worker()
        job = _Job(self.nodes[cid].deliver, frame)
        self.worker.jobs.put(job)
        if job.done.wait(deadline_s):
            return job.result
        self.busy[cid] = job  # abandoned: its thread ends once the call returns
        self.worker.jobs.put(None)
        self.worker = None
        return ("timeout", None, f"no reply within {deadline_s} s wall time", 0.0, None)

    def kill(self, cid: int) -> None:
        self.dead.add(cid)

    def state(self, cid: int) -> bytes:
        return self.nodes[cid].state()

    def restore(self, cid: int, data: bytes) -> None:
        self.nodes[cid].restore(data)

    def probe(self, cids: list[int], model: bytes) -> dict[int, tuple]:
        """:meth:`ClientNode.probe` for each of ``cids`` this pool hosts that is neither dead
        nor still busy with a call that overran its deadline (one after another, like its
        frames)."""
        return {cid: self.nodes[cid].probe(model) for cid in cids
                if cid not in self.dead and (cid not in self.busy or self.busy[cid].done.is_set())}

    def where(self) -> tuple[str, list, dict]:
        """``(Ray node id, GPU ids Ray gave this actor, its arithmetic)`` (:mod:`raymvc.arithmetic`)."""
        import ray

        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()], arithmetic.describe()


# ---------------------------------------------------------------------------
class ServerNode:
    """The server party, a thin shell: it builds the exchange (the wire) and the round
    workflow (the rounds) around one :class:`~raymvc.runtime.records.ServerState`, and
    does what an actor does between them: connect, checkpoint and restore, say where it
    runs, hand rounds to the driver in batches, and end the run."""

    def __init__(self, spec: RunSpec, clients: dict):
        from ..protocols import add_search_path, get

        for folder in spec.search:
            add_search_path(folder)
        self.threads = spec.threads
        pin_threads(spec.threads)
        proto = get(spec.method)
        ch = spec.channel
        secure = ch.secure_aggregation and bool(proto.secure_sums)
        ids = spec.client_ids
        self.plan = FaultPlan(spec.faults, ids, spec.seed, client_sizes=dict(spec.client_sizes),
                              client_dims=dict(spec.client_dims), trace=spec.trace, exchanges=3 if secure else 1)
        net = Network(spec.network)
        profiles = None  # per-client links and compute (scenario devices); None: the network for all
        if spec.devices is not None:
            profiles = DeviceProfiles(spec.devices, ids, spec.seed, net.cfg, classes=spec.device_classes,
                                      client_sizes=dict(spec.client_sizes))
        self.client_ids = ids
        self.state = ServerState(offline=set(self.plan.disconnected),
                                 participation={c: Participation() for c in self.client_ids})
        self.transport = make_transport(clients, spec.reply_timeout_s)
        self.exchange = Exchange(self.transport, ch, self.plan, net, profiles, self.state, spec.evict_after)
        ctx = ServerContext(client_ids=list(ids), n_clusters=spec.n_clusters, seed=spec.seed,
                            n_samples=spec.n_samples, client_sizes=dict(spec.client_sizes),
                            float_dtype=ch.float_dtype, max_staleness=None if spec.faults.asynchronous is None
                            else spec.faults.asynchronous.max_staleness)
        self.server = proto.server(spec.method_config(proto), ctx)
        stale = self.plan.cfg.stale_replies
        if secure:
            from .secure import ServerLayer  # loaded (with cryptography) only when the layer is on
        self.rounds = RoundWorkflow(
            self.server, self.exchange, client_ids=self.client_ids, threads=spec.threads,
            secure=ServerLayer(proto.secure_sums, ids, spec.seed, ch.secagg_neighbours, ch.secagg_threshold,
                               client_sizes=dict(spec.client_sizes))
            if secure else None, secure_sums=proto.secure_sums,
            stale_max=stale.max_age if stale is not None and "stale_replies" in proto.supports else 0,
            buffered=self.plan.cfg.asynchronous, async_kinds=proto.async_kinds, score_every=spec.score_every)
        self.unreported: list[RoundRecord] = []  # the rounds of the latest run_rounds call
        self.deferred: Exception | None = None  # raised by the next run_rounds call

    def reset(self, spec: RunSpec, clients: dict) -> None:
        """Serve a new run (warm actors, :mod:`raymvc.driver.warm`): built exactly as a fresh
        server, nothing of the earlier run kept."""
        self.__dict__.clear()
        self.__init__(spec, clients)

    def reusable(self) -> bool:
        return True

    def connect(self) -> list[int]:
        """Key agreement with every online client (:meth:`Exchange.connect`)."""
        return self.exchange.connect(self.client_ids)

    # -- checkpoints ---------------------------------------------------------
    def checkpoint(self) -> dict[str, object] | None:
        """Everything needed to carry on after the last finished round, as codec frames.

        ``None`` (no checkpoint this round) while a client's call is still hanging: its
        actor would answer the state request only after the hung call ends.
        """
        live = self.exchange.live()
        if any(self.state.timeouts.get(c) for c in live):
            return None
        return {"node": dump_state(self.state, only=SERVER_STATE), "ledger": encode_ledger(self.exchange.ledger),
                "server": dump_state(self.server, skip=PROTOCOL_INPUTS),
                "clients": {cid: self.transport.call(cid, "state") for cid in live}}

    def restore(self, ck: dict[str, object]) -> None:
        """Carry on from :meth:`checkpoint` (after :meth:`connect` agreed fresh keys)."""
        state, connected = self.state, self.exchange.connected
        load_state(state, ck["node"], only=SERVER_STATE)
        alive = {c for c in self.client_ids if c not in state.crashed and c not in state.offline}
        odd = sorted(alive ^ set(ck["clients"]))
        if odd:  # every client alive when it was written has a state in it, and no other does
            why = "no state in the checkpoint" if odd[0] in alive else "not a live client of the run"
            raise StateError(f"client {odd[0]}: {why}")
        self.exchange.ledger = decode_ledger(ck["ledger"])
        state.offline |= set(self.client_ids) - set(connected)  # unreachable now: offline now
        load_state(self.server, ck["server"], skip=PROTOCOL_INPUTS)
        for cid in sorted(state.crashed):
            if cid in connected:
                self.transport.kill(cid)  # still crashed after the resume
        for cid, data in ck["clients"].items():
            if cid in connected and cid not in state.crashed:
                self.transport.call(cid, "restore", data)

    def placement(self) -> dict[str, object]:
        """Where the server and each client run (Ray node ids, or ``local``) and, on Ray,
        the GPU ids Ray gave the server's and each client's actor."""
        server, gpus, arith = "local", None, {}
        if not isinstance(self.transport, LocalTransport):
            import ray

            server = ray.get_runtime_context().get_node_id()
            gpus = {"server": [str(g) for g in ray.get_gpu_ids()], "clients": {}}
        clients = self.transport.placement()
        if gpus is not None:
            gpus["clients"] = getattr(self.transport, "gpu_ids", {})
            arith = {"server": arithmetic.describe(), **getattr(self.transport, "arithmetic", {})}
        return {"server": server, "clients": clients, "gpu_ids": gpus, "arithmetic": arith}

    # -- rounds --------------------------------------------------------------
    def begin(self) -> None:
        self.rounds.begin()

    def run_round(self) -> RoundRecord:
        return self.rounds.run_round()

    def run_rounds(self, budget_s: float, max_rounds: int) -> list[RoundRecord]:
        """Rounds back to back: one call from the driver for many fast rounds, which on Ray
        saves the driver's round trip per round.

        Stops after a round that ends the run, after ``max_rounds``, or before a round that
        would likely end past ``budget_s`` of wall time (judged by the last round's
        length); always runs at least one. A round that raises after others ran in this
        call is raised by the next call, so the driver records the finished ones first;
        the records also stay in ``unreported`` (and in :meth:`finish`'s ``RunEnd``) for a
        driver that stopped waiting.
        """
        if self.deferred is not None:
            error, self.deferred = self.deferred, None
            raise error
        self.unreported = []
        t = time.perf_counter()
        while True:
            try:
                rec = self.rounds.run_round()
            except (Exception, SystemExit) as e:
                if not self.unreported:
                    raise
                self.deferred = e
                return list(self.unreported)
            self.unreported.append(rec)
            if rec.done or len(self.unreported) >= max_rounds or time.perf_counter() - t + rec.wall_s >= budget_s:
                return list(self.unreported)

    # -- the end -----------------------------------------------------------
    def finish(self, stopped: str | None = None) -> RunEnd:
        """Final labels (server-side, or collected from clients on the evaluation path).

        ``stopped`` (``"interrupted"`` or ``"failed"``) ends a run the driver had to stop:
        the record says so, the protocol's best labels so far are kept where its server
        has them, and no client is asked for anything more.
        """
        state = self.state
        if self.deferred is not None:  # a round failed and the driver stopped before hearing of it
            state.status = "failed"
            state.error = state.error or f"round {state.round} failed: {one_line(self.deferred)}"
            self.deferred = None
        end = RunEnd(status=stopped or state.status, error=state.error, virtual_s=state.clock, counts=state.counts,
                     disconnected=sorted(state.offline), participation=state.participation,
                     ledger=self.exchange.ledger, evicted=list(state.evicted),
                     rounds=state.round + (1 if state.ended() else 0))
        done = self._result()
        if done is not None:
            end.info.update(done.info)
            if done.labels is not None:
                end.labels = np.asarray(done.labels)
            elif stopped is None and state.status in ("finished", "failed"):
                if self.plan.cfg.inference_round and done.final is not None:
                    end.info["inference_round"] = self.rounds.inference_round(end.rounds, done.final)
                    end.virtual_s, end.rounds = state.clock, end.rounds + 1
                end.predictions = self.rounds.collect_predictions()
        # after the evaluation path, whose failures are client errors like any other
        end.client_errors, end.errors = list(state.client_errors), list(state.errors)
        end.compute_s = state.compute_s
        end.crashed = sorted(state.crashed)
        end.shared_bodies = getattr(self.transport, "shared_puts", 0)
        if stopped is not None:  # the driver may not have received the latest batch
            end.unreported = [rec.to_dict() for rec in self.unreported]
        return end

    def _result(self):
        """The protocol's ``Done``: the one it ended with, or its best so far (``None`` when it
        keeps none, or when its server raised)."""
        if self.state.done is not None or self.state.status == "error":
            return self.state.done
        pin_threads(self.threads)
        try:
            return self.server.result()
        except NotImplementedError:  # the method keeps no early result: not a fault of its code
            return None
        except (Exception, SystemExit) as e:
            self.state.errors.append(party_error(SERVER, "result", self.state.round, e))
            return None
