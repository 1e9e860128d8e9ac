"""The two kinds of party: :class:`ClientNode` and :class:`ServerNode`.

Both are plain classes. The Ray backend turns them into actors (``ray.remote``); the
in-process backend uses them as they are. Either way the same code seals, opens,
meters and fault-injects every message, which is why both backends give identical
results for one seed.

A message's path: the protocol's ``Server.step`` returns ``{client: Message}`` ->
``ServerNode._send`` seals each one for its link (codec -> compression -> encryption),
writes a ledger row and asks the fault injector whether the client drops out -> the
transport delivers the frames (all at once on Ray) -> ``ClientNode.deliver`` opens and
checks each one, calls the protocol's ``Client.handle`` and seals the reply -> back in
``ServerNode._receive`` the reply is opened, timed on the virtual clock, metered, and
handed to the next ``Server.step`` as a reply or as missing.
"""

from __future__ import annotations

import queue
import re
import struct
import threading
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from ..channel import Encoded, Endpoint, Ledger, LedgerRow, RejectedMessage, codec, handshake_bytes
from ..fixedpoint import check_input
from ..messages import Done, Message, labels_array
from ..protocol import ClientContext, NoInput, Replies, ServerContext, summed_fields
from ..scenario import ChannelCfg, DeviceClass, DevicesCfg, FaultsCfg, NetworkCfg, PartialWorkCfg
from .faults import DeviceProfiles, FaultPlan, Injector, Network, work_share
from .records import FaultCounts, Participation, RoundRecord, RunEnd
from .secure import ClientLayer, ServerLayer
from .state import StateError, dump_state, load_state
from .threads import pin_threads
from .transport import Interruption, LocalTransport, Outcome, make_transport, party_lost

SERVER = "server"
PROTOCOL_INPUTS = ("config", "shard", "ctx")  # rebuilt from the scenario, never checkpointed
_ROUND = struct.Struct("<q")
# what a server checkpoint holds besides the protocol's server object
# (the ledger travels apart, as columns: see :meth:`ServerNode.checkpoint`)
SERVER_STATE = _SERVER_STATE = ("round", "clock", "outgoing", "done", "status", "error", "crashed", "offline", "counts",
                 "client_errors", "errors", "participation", "compute_s", "timeouts", "evicted", "last_replies")
EVAL_PREDICT = "eval.predict"  # engine-reserved kinds: the evaluation path
EVAL_LABELS = "eval.labels"


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


def client_party(cid: int) -> str:
    return f"client:{cid}"


def broadcast_key(msg: Message) -> tuple:
    """Messages with equal keys encode to the same bytes: same kind, same field names, the
    very same array objects (by identity, so no array is hashed or compared) and scalars of
    the same type and ``repr`` (so ``0.0`` and ``-0.0`` differ). A protocol that sends one
    array to every client, e.g. ``{c: Message("model", w=self.w) for c in ids}``, is
    encoded once. Valid while the messages are alive and unchanged, i.e. within one
    ``_send``."""
    return (msg.kind, *((name, ("a", id(v)) if isinstance(v, np.ndarray) else ("s", type(v).__name__, repr(v)))
                        for name, v in msg.fields.items()))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE_LIMIT = 300  # characters of a client error in summary.json
TRACEBACK_LIMIT = 64_000  # characters of its traceback (errors.log)


def _cut(line: str, limit: int = LINE_LIMIT) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _str(e: BaseException) -> str:
    """``str(e)``, which is client code for a client's exception: it may raise, or be huge."""
    try:
        return str(e)[:100_000]
    except BaseException:
        return "(its message could not be printed)"


def party_error(party: str, phase: str, r: int, e: BaseException) -> dict:
    """One error of a party's code: a bounded line for the summary, the full traceback for ``errors.log``."""
    return {"party": party, "phase": phase, "round": r, "error": one_line(e), "traceback": traceback_text(e)}


def one_line(e: BaseException, limit: int = LINE_LIMIT) -> str:
    """An exception as one plain line: type, first line of the message, no colour codes."""
    text = _ANSI.sub("", _str(e)).strip().splitlines()
    first = text[0] if text else ""
    line = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return _cut(line, limit)


def traceback_text(e: BaseException, limit: int = TRACEBACK_LIMIT) -> str:
    """The exception's traceback, at most ``limit`` characters (its start and its end)."""
    try:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    except BaseException:
        text = one_line(e)
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]}\n... ({len(text) - 2 * half} characters cut) ...\n{text[-half:]}"


def _reply_name(reply: object) -> str:
    """What a reply is, without its ``repr`` (client code, which may raise or be huge)."""
    name = type(reply).__name__
    try:
        kind = reply.kind if isinstance(reply, Message) else None
        return f"{name} {kind[:60]!r}" if type(kind) is str else name
    except BaseException:
        return name


def _unreachable(e: BaseException) -> bool:
    """A party that did not answer in time or is gone (rather than one whose code raised)."""
    return party_lost(e)


# ---------------------------------------------------------------------------
class ClientNode:
    """One client: its private shard, the protocol's client object, its endpoint."""

    def __init__(self, cid: int, method: str, params: dict, shard, *, n_clients: int, n_clusters: int,
                 channel: dict, seed: int, threads: int = 1, search: tuple[str, ...] = (),
                 partial_work: dict | None = None):
        from ..protocols import add_search_path, get

        for folder in search:  # where the driver found the method's module
            add_search_path(folder)

        self.cid = cid
        self.seed = seed
        self.partial_work = PartialWorkCfg(**partial_work) if partial_work else None  # faults.partial_work
        self.threads = threads
        pin_threads(threads)
        ch = ChannelCfg(**channel)
        proto = get(method)
        ctx = ClientContext(client_id=cid, n_clients=n_clients, n_clusters=n_clusters, seed=seed,
                            float_dtype=ch.float_dtype)
        self.client = proto.client(proto.config(**params), shard, ctx)
        self.secure = None  # the secure-aggregation layer, when on and the method declares a sum
        if ch.secure_aggregation and proto.secure_sums:
            self.secure = ClientLayer(cid, proto.secure_sums, n_clients, ch.secagg_neighbours)
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
            self.client.ctx.work = work_share(self.partial_work, self.seed, opened.round, self.cid)
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
            return "error", None, _cut(f"unencodable reply ({_reply_name(reply)}): {one_line(e)}"), compute, \
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

    def __init__(self, shards: dict[int, object], method: str, params: dict, **common):
        self.nodes = {cid: ClientNode(cid, method, params, shard, **common) for cid, shard in shards.items()}
        self.dead: set[int] = set()
        self.busy: dict[int, _Job] = {}  # clients whose call overran its deadline and still runs
        self.worker: _Worker | None = None

    def reset(self, shards: dict[int, object], method: str, params: dict, **common) -> None:
        """Host a new run's clients (warm actors, :mod:`raymvc.runtime.warm`): built exactly as
        a fresh pool's, the earlier run's clients dropped."""
        if self.worker is not None:
            self.worker.jobs.put(None)  # its thread ends
        self.__dict__.clear()  # not even an attribute set after construction survives
        self.__init__(shards, method, params, **common)

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

    def where(self) -> tuple[str, list]:
        """``(Ray node id, GPU ids Ray gave this actor)``."""
        import ray

        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]


# ---------------------------------------------------------------------------
@dataclass
class RoundState:
    replies: dict[int, Message] = field(default_factory=dict)
    missing: set[int] = field(default_factory=set)
    dropped: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    crashed: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)  # handled the message, sent no reply
    times: dict[int, float] = field(default_factory=dict)  # with devices: each reply's virtual seconds


class ServerNode:
    """The server party: runs the protocol's server and drives every round."""

    def __init__(self, method: str, params: dict, clients: dict, *, client_ids: list[int], n_clusters: int,
                 n_samples: int | None, channel: dict, faults: dict, network: dict, seed: int,
                 reply_timeout_s: float = 600.0, threads: int = 1, client_sizes: dict[int, int] | None = None,
                 evict_after: int = 3, search: tuple[str, ...] = (), client_dims: dict[int, int] | None = None,
                 trace: dict[int, list[tuple[float, float]]] | None = None, devices: dict | None = None,
                 device_classes: dict[str, dict] | None = None):
        from ..protocols import add_search_path, get

        for folder in search:
            add_search_path(folder)

        self.threads = threads
        pin_threads(threads)
        proto = get(method)
        ch = ChannelCfg(**channel)
        self.channel = ch
        self.plan = FaultPlan(FaultsCfg(**faults), list(client_ids), seed, client_sizes=client_sizes,
                              client_dims=client_dims, trace=trace,
                              exchanges=3 if ch.secure_aggregation and proto.secure_sums else 1)
        self.faults = Injector(self.plan)
        stale = self.plan.cfg.stale_replies
        self.stale_max = stale.max_age if stale is not None and proto.uses_stale_replies else 0
        self.last_replies: dict[int, tuple[int, Message]] = {}  # client -> (round, its last protocol reply)
        self.net = Network(NetworkCfg(**network))
        self.devices = None  # per-client links and compute (scenario devices); None: the network for all
        if devices is not None:
            classes = {k: DeviceClass(**v) for k, v in device_classes.items()} if device_classes else None
            self.devices = DeviceProfiles(DevicesCfg(**devices), list(client_ids), seed, self.net.cfg,
                                          classes=classes, client_sizes=client_sizes)
        self.min_clients = self.plan.cfg.min_clients
        self.transport = make_transport(clients, reply_timeout_s)
        self.client_ids = list(client_ids)
        ctx = ServerContext(client_ids=list(client_ids), n_clusters=n_clusters, seed=seed, n_samples=n_samples,
                            client_sizes=dict(client_sizes or {}), float_dtype=ch.float_dtype)
        self.server = proto.server(proto.config(**params), ctx)
        self.secure = None  # the secure-aggregation layer (see raymvc.runtime.secure)
        if ch.secure_aggregation and proto.secure_sums:
            self.secure = ServerLayer(proto.secure_sums, client_ids, seed, ch.secagg_neighbours,
                                      ch.secagg_threshold)
        # without it, the declared sums' inputs pass the same overflow rule (see _check_sums)
        self.plain_sums = {s.kind: s for s in proto.secure_sums or ()} if self.secure is None else {}
        self.sub = 0  # exchanges of the current round so far, after the first
        self.endpoint = Endpoint(SERVER, encryption=ch.encryption, compression=ch.compression,
                                 float_dtype=ch.float_dtype, max_message_bytes=ch.max_message_bytes())
        self.ledger = Ledger()
        self.clock = 0.0
        self.round = 0
        self.outgoing: dict[int, Message] = {}
        self.done: Done | None = None
        self.status = "running"
        self.error: str | None = None
        self.crashed: set[int] = set()
        self.offline: set[int] = set(self.plan.disconnected)  # never connected: disconnected or unreachable
        self.evict_after = evict_after
        self.timeouts: dict[int, int] = {}  # consecutive wall-clock timeouts per client
        self.evicted: list[int] = []
        self.connected: list[int] = []
        self.counts = FaultCounts()
        self.client_errors: list[dict] = []  # every failure, in order: {round, client, path, error}
        self.errors: list[dict] = []  # the server's own code raised: see party_error
        self.participation = {c: Participation() for c in self.client_ids}
        self.compute_s = 0.0
        self.unreported: list[RoundRecord] = []  # the rounds of the latest run_rounds call
        self.deferred: Exception | None = None  # raised by the next run_rounds call

    def reset(self, method: str, params: dict, clients: dict, **kw) -> None:
        """Serve a new run (warm actors, :mod:`raymvc.runtime.warm`): built exactly as a fresh
        server, nothing of the earlier run kept."""
        self.__dict__.clear()
        self.__init__(method, params, clients, **kw)

    def reusable(self) -> bool:
        return True

    # -- setup -------------------------------------------------------------
    def connect(self) -> list[int]:
        """Key agreement with every client that is online; meter it as setup traffic.

        A client that cannot be reached (its actor failed to start, or did not answer
        within ``runtime.reply_timeout_s``) is recorded in ``client_errors`` and stays
        offline for the run, like a disconnected one.
        """
        key = self.endpoint.public_key()
        nbytes = handshake_bytes(self.channel.encryption)
        answers = self.transport.hello_all([c for c in self.client_ids if c not in self.offline], key)
        for cid in self.client_ids:
            if cid in self.offline:
                continue
            peer = client_party(cid)
            ckey = answers[cid]
            if isinstance(ckey, BaseException):
                self.offline.add(cid)
                entry = {"round": -1, "client": cid, "path": "setup", "error": f"could not connect: {one_line(ckey)}"}
                if _unreachable(ckey):  # no answer in time: a failure to reach it, not its code raising
                    entry["unreachable"] = True
                self.client_errors.append(entry)
                continue
            for src, dst in ((SERVER, peer), (peer, SERVER)):
                self.ledger.record(round=-1, src=src, dst=dst, kind="handshake", path="setup", payload_bytes=0,
                                   wire_bytes=nbytes, send_t=0.0, arrive_t=0.0, status="delivered")
            self.endpoint.add_peer(peer, ckey)
            self.connected.append(cid)
        return self.connected

    # -- checkpoints ---------------------------------------------------------
    def checkpoint(self) -> dict[str, object] | None:
        """Everything needed to carry on after the last finished round, as codec frames.

        ``None`` (no checkpoint this round) while a client's call is still hanging: its
        actor would answer the state request only after the hung call ends.
        """
        if any(self.timeouts.get(c) for c in self.connected if c not in self.crashed):
            return None
        clients = {}
        for cid in self.connected:
            if cid not in self.crashed:
                clients[cid] = self.transport.call(cid, "state")
        return {"node": dump_state(self, only=_SERVER_STATE), "ledger": encode_ledger(self.ledger),
                "server": dump_state(self.server, skip=PROTOCOL_INPUTS), "clients": clients}

    def restore(self, ck: dict[str, object]) -> None:
        """Carry on from :meth:`checkpoint` (after :meth:`connect` agreed fresh keys)."""
        load_state(self, ck["node"], only=_SERVER_STATE)
        alive = {c for c in self.client_ids if c not in self.crashed and c not in self.offline}
        odd = sorted(alive ^ set(ck["clients"]))
        if odd:  # every client alive when it was written has a state in it, and no other does
            why = "no state in the checkpoint" if odd[0] in alive else "not a live client of the run"
            raise StateError(f"client {odd[0]}: {why}")
        self.ledger = decode_ledger(ck["ledger"])
        self.offline |= set(self.client_ids) - set(self.connected)  # unreachable now: offline now
        load_state(self.server, ck["server"], skip=PROTOCOL_INPUTS)
        for cid in sorted(self.crashed):
            if cid in self.connected:
                self.transport.kill(cid)  # still crashed after the resume
        for cid, data in ck["clients"].items():
            if cid in self.connected and cid not in self.crashed:
                self.transport.call(cid, "restore", data)

    def placement(self) -> dict[str, object]:
        """Where the server and each client run (Ray node ids, or ``local``) and, on Ray,
        the GPU ids Ray gave the server's and each client's actor."""
        server, gpus = "local", None
        if not isinstance(self.transport, LocalTransport):
            import ray

            server = ray.get_runtime_context().get_node_id()
            gpus = {"server": [str(g) for g in ray.get_gpu_ids()], "clients": {}}
        clients = self.transport.placement()
        if gpus is not None:
            gpus["clients"] = getattr(self.transport, "gpu_ids", {})
        return {"server": server, "clients": clients, "gpu_ids": gpus}

    def begin(self) -> None:
        pin_threads(self.threads)
        if self.secure is not None:  # key set-up, like the handshake free of injected faults
            st = RoundState()
            self.secure.setup(lambda out: self._extra_exchange(self.round, out, Injector(None), st))
            self._blame_senders(self.round, st)
            self.counts.client_errors += len(st.errors)
            self.counts.rejected_messages += len(st.rejected)
        self.outgoing = self.server.start()

    def _extra_exchange(self, r: int, outgoing: dict[int, Message], faults: Injector,
                        into: RoundState | None) -> RoundState:
        """An exchange besides the round's first (secure aggregation's); its faults count in ``into``."""
        st, self.clock = self._exchange(r, outgoing, "protocol", faults)
        if into is not None:
            for name in ("dropped", "late", "rejected", "crashed"):
                getattr(into, name).extend(getattr(st, name))
            into.errors.update(st.errors)
            for cid, t in st.times.items():
                into.times[cid] = into.times.get(cid, 0.0) + t
        return st

    # -- one exchange: send, deliver, receive --------------------------------
    def _send(self, r: int, outgoing: dict[int, Message], path: str, faults: Injector,
              st: RoundState, t0: float) -> tuple[dict[int, bytes], dict[int, LedgerRow]]:
        """Seal and meter every outgoing message; decide dropouts. Returns the frames to deliver
        as ``(header, body)`` pairs; messages with the same content are encoded once (see
        :func:`broadcast_key`), and without encryption their frames share one body object."""
        frames, rows = {}, {}
        encoded: dict[tuple, Encoded] = {}
        for cid, msg in outgoing.items():
            if cid in self.offline:
                st.missing.add(cid)
                continue
            key = broadcast_key(msg)
            if key not in encoded:
                encoded[key] = self.endpoint.encode(msg)
            sealed = self.endpoint.seal(client_party(cid), r, msg, encoded=encoded[key])
            row = self.ledger.record(round=r, src=SERVER, dst=client_party(cid), kind=msg.kind, path=path,
                                     payload_bytes=sealed.payload_bytes, wire_bytes=sealed.wire_bytes,
                                     data_bytes=sealed.data_bytes, send_t=t0,
                                     arrive_t=t0 + self._down_s(cid, sealed.wire_bytes), status="delivered")
            if cid not in self.crashed and faults.dropped(r, cid):
                row.status = "dropped"  # sent and paid for; the client goes offline before acting on it
                st.dropped.append(cid)
                st.missing.add(cid)
                continue
            frames[cid], rows[cid] = sealed.parts, row
        return frames, rows

    def _down_s(self, cid: int, nbytes: int) -> float:
        return self.devices.down_s(cid, nbytes) if self.devices is not None else self.net.transfer_s(nbytes)

    def _up_s(self, cid: int, nbytes: int) -> float:
        return self.devices.up_s(cid, nbytes) if self.devices is not None else self.net.transfer_s(nbytes)

    def _blame_senders(self, r: int, st: RoundState) -> None:
        """Malformed secure-aggregation messages: each is its sender's error (never the
        driver's or an honest peer's); the aggregation went on without them."""
        for cid, why in sorted(self.secure.blame().items()):
            st.errors[cid] = _cut(why)
            self.client_errors.append({"round": r, "client": cid, "path": "secagg", "error": st.errors[cid]})

    def _stand_in(self, r: int, st: RoundState) -> dict[int, int]:
        """``faults.stale_replies``: keep this round's replies as each client's last, and hand
        ``step`` the last reply of every client that did not answer (missing, not asked, or
        crashed) while it is at most ``stale_max`` rounds old; ``replies.ages`` says how old."""
        for cid, msg in st.replies.items():
            self.last_replies[cid] = (r, msg)
        ages = dict.fromkeys(st.replies, 0)
        stood_in = {}
        for cid, (when, msg) in sorted(self.last_replies.items()):
            if cid not in st.replies and 0 < r - when <= self.stale_max:
                stood_in[cid] = msg
                ages[cid] = r - when
        st.replies = Replies({**st.replies, **stood_in}, ages=ages)
        return {c: ages[c] for c in stood_in}

    def _check_sums(self, r: int, st: RoundState) -> None:
        """Without secure aggregation, the one overflow rule of declared sums
        (:func:`raymvc.fixedpoint.encode_input` over all the run's clients, as a masking client
        applies it): a reply whose input the ring cannot hold is its sender's error and is left
        out of the round, as secure aggregation leaves it out of the sum; the round goes on."""
        n = len(self.client_ids)
        for cid in sorted(st.replies):
            spec = self.plain_sums.get(st.replies[cid].kind)
            if spec is None:
                continue
            try:
                _names, x, w = summed_fields(st.replies[cid], spec)
                check_input(x, w, n)
            except ValueError as e:
                del st.replies[cid]
                st.missing.add(cid)
                st.errors[cid] = _cut(f"sum {spec.kind!r}: {one_line(e)}")
                self.client_errors.append({"round": r, "client": cid, "path": "sum", "error": st.errors[cid]})

    def _failed_delivery(self, r: int, cid: int, out: Outcome, row: LedgerRow, path: str, st: RoundState) -> None:
        """Record a frame the client did not answer: its actor died or hung, it rejected the frame, or it raised."""
        st.missing.add(cid)
        if out.status == "timeout":  # no reply within runtime.reply_timeout_s of wall time: late
            row.status, row.arrive_t = "late", None
            st.late.append(cid)
            self.timeouts[cid] = self.timeouts.get(cid, 0) + 1
            if self.timeouts[cid] >= self.evict_after and cid not in self.crashed:
                self.transport.kill(cid)  # hung for too long: evicted, treated as crashed from now on
                self.evicted.append(cid)
                self.crashed.add(cid)
                st.crashed.append(cid)
        elif out.status == "crashed":
            row.status, row.arrive_t = "lost", None
            if cid not in self.crashed:
                self.crashed.add(cid)
                st.crashed.append(cid)
        elif out.status == "rejected":
            row.status, row.kind = "rejected", f"rejected:{out.detail}"
            st.rejected.append(cid)
        else:
            st.errors[cid] = _cut((out.detail or "error").split("\n", 1)[0])
            record = {"round": r, "client": cid, "path": path, "error": st.errors[cid]}
            if out.traceback:
                record["traceback"] = out.traceback[:TRACEBACK_LIMIT]  # for errors.log, not summary.json
            self.client_errors.append(record)

    def _receive(self, r: int, cid: int, out: Outcome, row: LedgerRow, path: str, faults: Injector,
                 st: RoundState, t0: float, compute: bool = False) -> float | None:
        """Open, time and meter one client's reply. Returns its virtual arrival time if it counts.
        With device profiles the reply leaves after the client's nominal compute time (in a
        round's first exchange, ``compute``) and its straggler delay, and travels its uplink."""
        if out.status != "ok":
            self._failed_delivery(r, cid, out, row, path, st)
            return None
        self.compute_s += out.compute_s
        self.timeouts.pop(cid, None)
        if out.frame is None:
            st.acked.add(cid)  # answered, with nothing to say
            return None
        wire = len(out.frame) if isinstance(out.frame, (bytes, bytearray)) else 0  # anything else is rejected
        if self.devices is None:
            send_t = row.arrive_t + faults.delay(r, cid)
        else:
            work = self.devices.compute_s(cid, self.plan.work(r, cid)) if compute else 0.0
            send_t = row.arrive_t + work + faults.delay(r, cid)
        arrive = send_t + self._up_s(cid, wire)
        if self.devices is not None:
            st.times[cid] = arrive - t0
        try:
            opened = self.endpoint.open(out.frame, expect_src=client_party(cid), expect_round=r, pair_ok=False)
            status, kind = "delivered", opened.msg.kind
            payload, data = opened.payload_bytes, opened.data_bytes
        except RejectedMessage as e:
            opened, status, payload, data, kind = None, "rejected", 0, 0, f"rejected:{e.reason}"
        if opened is not None and faults.late(arrive, t0):
            status = "late"
        self.ledger.record(round=r, src=client_party(cid), dst=SERVER, kind=kind, path=path, payload_bytes=payload,
                           wire_bytes=wire, data_bytes=data, send_t=send_t, arrive_t=arrive, status=status)
        if status == "delivered":
            st.replies[cid] = opened.msg
            return arrive
        st.missing.add(cid)
        (st.late if status == "late" else st.rejected).append(cid)
        return None

    def _exchange(self, r: int, outgoing: dict[int, Message], path: str, faults: Injector,
                  compute: bool = False) -> tuple[RoundState, float]:
        st = RoundState()
        t0 = self.clock
        for cid in faults.crashes(r):
            if cid not in self.crashed and cid not in self.offline:
                self.transport.kill(cid)  # a real crash: the actor process is gone
                self.crashed.add(cid)
                st.crashed.append(cid)
        frames, rows = self._send(r, outgoing, path, faults, st, t0)
        outcomes = self.transport.exchange(frames)
        ends = [t0]
        for cid, out in outcomes.items():
            arrive = self._receive(r, cid, out, rows[cid], path, faults, st, t0, compute)
            if arrive is not None:
                ends.append(arrive)
        return st, faults.round_end(max(ends), t0, bool(st.missing))

    # -- one round ---------------------------------------------------------
    def _tally(self, r: int, addressed: dict[int, Message], st: RoundState) -> None:
        self.counts.dropped_replies += len(st.dropped)
        self.counts.late_replies += len(st.late)
        self.counts.rejected_messages += len(st.rejected)
        self.counts.client_errors += len(st.errors)
        for cid in addressed:
            p = self.participation[cid]
            p.addressed += 1
            if cid in st.replies or cid in st.acked:
                p.replied += 1
                p.last_replied = r
            else:
                p.missed += 1

    def _step(self, r: int, st: RoundState, addressed: int, answered: int,
              not_sampled: tuple[int, ...] | list[int] = ()) -> None:
        if addressed and answered < min(self.min_clients, addressed):
            self.status = "failed"
            self.error = (f"round {r}: {answered} of {addressed} clients replied, "
                          f"fewer than faults.min_clients = {self.min_clients}")
            return
        pin_threads(self.threads)
        try:
            result = self.server.step(r, st.replies, set(st.missing) | set(not_sampled))
        except NoInput as e:  # the injected faults left the method nothing to work with: a failure
            self.status, self.error = "failed", f"round {r}: {one_line(e)}"
            return
        except Exception as e:
            self.status = "error"
            self.errors.append(party_error(SERVER, "step", r, e))
            self.error = f"server step {r} raised {one_line(e)}"
            return
        if isinstance(result, Done):
            self.done = result
            self.status = "finished"
        else:
            self.outgoing = result
            self.round += 1

    def _sample(self, r: int, outgoing: dict[int, Message]) -> tuple[dict[int, Message], list[int]]:
        """The messages sent in round ``r`` under ``faults.sampling``, and the clients left out."""
        chosen = self.plan.sampled(r)
        if chosen is None:
            return outgoing, []
        return {c: m for c, m in outgoing.items() if c in chosen}, sorted(c for c in outgoing if c not in chosen)

    def _partial(self, r: int, addressed: dict[int, Message], st: RoundState) -> list[int]:
        """The clients that acted on the round's message with only part of their local work."""
        acted = set(addressed) - set(st.dropped) - set(st.crashed) - self.crashed - set(self.offline)
        return sorted(c for c in acted if self.plan.work(r, c) < 1.0)

    def run_round(self) -> RoundRecord:
        """Exchange the pending messages, let the protocol step, report the round."""
        r = self.round
        wall = time.perf_counter()
        t0 = self.clock
        ledger_mark = len(self.ledger.rows)
        addressed, not_sampled = self._sample(r, self.outgoing)
        st, self.clock = self._exchange(r, addressed, "protocol", self.faults, compute=True)
        answered = len(st.replies) + len(st.acked)  # to the round's request, whatever secure aggregation adds
        sums = None
        if self.secure is not None:
            self.sub = 0

            def extra(out: dict[int, Message]) -> RoundState:
                self.sub += 1
                return self._extra_exchange(r, out, self.faults.at(self.sub), st)

            self.secure.aggregate(st, extra)
            self._blame_senders(r, st)
            sums = [{"kind": s.kind, "contributors": list(s.contributors), "failed": s.failed,
                     "disclosed": list(s.disclosed)} for s in getattr(st.replies, "sums", {}).values()]
        elif self.plain_sums:
            self._check_sums(r, st)
        self._tally(r, addressed, st)
        replied = sorted(st.replies)  # this round's answers (old replies that stand in are not among them)
        stale = self._stand_in(r, st) if self.stale_max else None
        self._step(r, st, len(addressed), answered, not_sampled)
        rows = self.ledger.rows[ledger_mark:]
        record = RoundRecord(
            round=r, replied=replied, missing=sorted(st.missing), dropped=st.dropped, late=st.late,
            rejected=st.rejected, crashed=st.crashed, client_errors=sorted(st.errors), messages=len(rows),
            wire_bytes=sum(x.wire_bytes for x in rows), payload_bytes=sum(x.payload_bytes for x in rows),
            partial_work=self._partial(r, addressed, st), not_sampled=not_sampled, stale=stale,
            virtual_start_s=t0, virtual_end_s=self.clock,
            client_s=dict(sorted(st.times.items())) if self.devices is not None else None, secure_sums=sums,
            wall_s=time.perf_counter() - wall,
            info=dict(self.server.info), done=self.status in ("finished", "failed", "error"), error=self.error)
        self.server.info = {}
        return record

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
                rec = self.run_round()
            except Exception as e:
                if not self.unreported:
                    raise
                self.deferred = e
                return list(self.unreported)
            self.unreported.append(rec)
            if rec.done or len(self.unreported) >= max_rounds or time.perf_counter() - t + rec.wall_s >= budget_s:
                return list(self.unreported)

    # -- the end -----------------------------------------------------------
    def _inference_round(self, r: int, final: Message) -> dict:
        """``faults.inference_round``: the server's final model to every client available in
        round ``r`` (the one after the last), metered with the protocol's traffic and subject
        to the scenario's faults; replies are not read. Returns what the summary says of it."""
        out = {c: final for c in self.connected if c not in self.crashed}  # encoded once (same content)
        st, self.clock = self._exchange(r, out, "protocol", self.faults)
        self.crashed.update(st.crashed)
        self._tally(r, out, st)
        return {"round": r, "addressed": len(out), "reached": len(set(st.replies) | st.acked),
                "missing": sorted(st.missing), "crashed": sorted(st.crashed)}

    def _collect_predictions(self) -> dict[int, np.ndarray]:
        """The evaluation path: ask every live client for its own labels (metered apart, no faults)."""
        alive = [c for c in self.connected if c not in self.crashed]
        st, _ = self._exchange(self.round, {c: Message(EVAL_PREDICT) for c in alive}, "eval", Injector(None))
        self.crashed.update(st.crashed)
        return {c: np.asarray(m["y"]) for c, m in st.replies.items() if "y" in m.fields}

    def finish(self, stopped: str | None = None) -> RunEnd:
        """Final labels (server-side, or collected from clients on the evaluation path).

        ``stopped`` (``"interrupted"`` or ``"failed"``) ends a run the driver had to stop:
        the record says so, the protocol's best labels so far are kept where its server
        has them, and no client is asked for anything more.
        """
        if self.deferred is not None:  # a round failed and the driver stopped before hearing of it
            self.status, self.error = "failed", self.error or f"round {self.round} failed: {one_line(self.deferred)}"
            self.deferred = None
        status = stopped or self.status
        end = RunEnd(status=status, error=self.error, virtual_s=self.clock, counts=self.counts,
                     disconnected=sorted(self.offline), participation=self.participation, ledger=self.ledger,
                     evicted=list(self.evicted),
                     rounds=self.round + (1 if self.status in ("finished", "failed", "error") else 0))
        done = self.done
        if done is None and self.status != "error":
            pin_threads(self.threads)
            try:
                done = self.server.result()
            except NotImplementedError:  # the method keeps no early result: not a fault of its code
                done = None
            except Exception as e:
                self.errors.append(party_error(SERVER, "result", self.round, e))
        if done is not None:
            end.info.update(done.info)
            if done.labels is not None:
                end.labels = np.asarray(done.labels)
            elif stopped is None and self.status in ("finished", "failed"):
                if self.plan.cfg.inference_round and done.final is not None:
                    end.info["inference_round"] = self._inference_round(end.rounds, done.final)
                    end.virtual_s, end.rounds = self.clock, end.rounds + 1
                end.predictions = self._collect_predictions()
        # after the evaluation path, whose failures are client errors like any other
        end.client_errors, end.errors = list(self.client_errors), list(self.errors)
        end.compute_s = self.compute_s
        end.crashed = sorted(self.crashed)
        end.shared_bodies = getattr(self.transport, "shared_puts", 0)
        if stopped is not None:  # the driver may not have received the latest batch
            end.unreported = [rec.to_dict() for rec in self.unreported]
        return end
