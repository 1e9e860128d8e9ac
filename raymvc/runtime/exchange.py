"""The server's side of the wire: one exchange is send -> deliver -> receive.

:class:`Exchange` seals and meters every message (codec -> compression -> encryption, one
ledger row each way), asks the fault plan which clients drop out, crash or straggle, times
each reply on the virtual clock (the network, or per-client device profiles) and opens it.
What comes back is a :class:`RoundState`: the replies that count and, for every client
that did not answer, why. It knows nothing of rounds, methods or secure aggregation; the
round workflow (:mod:`raymvc.runtime.rounds`) decides what to send and what to make of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..channel import Encoded, Endpoint, Ledger, LedgerRow, RejectedMessage, handshake_bytes
from ..messages import Message
from ..scenario import ChannelCfg
from .failures import TRACEBACK_LIMIT, cut_line, one_line
from .faults import DeviceProfiles, FaultPlan, Injector, Network
from .records import ServerState
from .transport import Outcome, party_lost

SERVER = "server"


def client_party(cid: int) -> str:
    return f"client:{cid}"


def broadcast_key(msg: Message) -> tuple:
    """Messages with equal keys encode to the same bytes: same kind, same field names, the
    very same array objects (by identity, so no array is hashed or compared) and scalars of
    the same type and ``repr`` (so ``0.0`` and ``-0.0`` differ). A protocol that sends one
    array to every client, e.g. ``{c: Message("model", w=self.w) for c in ids}``, is
    encoded once. Valid while the messages are alive and unchanged, i.e. within one
    :meth:`Exchange.send`."""
    return (msg.kind, *((name, ("a", id(v)) if isinstance(v, np.ndarray) else ("s", type(v).__name__, repr(v)))
                        for name, v in msg.fields.items()))


@dataclass
class RoundState:
    """What one exchange (or a round's exchanges together) brought back."""

    replies: dict[int, Message] = field(default_factory=dict)
    missing: set[int] = field(default_factory=set)
    dropped: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    crashed: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)  # handled the message, sent no reply
    timed_out: list[int] = field(default_factory=list)  # no answer within runtime.reply_timeout_s (wall time)
    times: dict[int, float] = field(default_factory=dict)  # each reply's virtual seconds, late ones too
    arrivals: dict[int, float] = field(default_factory=dict)  # each counted reply's virtual arrival time

    def absorb(self, other: RoundState) -> None:
        """Count another exchange of the same round here (its faults and its clients' time)."""
        for name in ("dropped", "late", "rejected", "crashed", "timed_out"):
            getattr(self, name).extend(getattr(other, name))
        self.errors.update(other.errors)
        for cid, t in other.times.items():
            self.times[cid] = self.times.get(cid, 0.0) + t


class Exchange:
    """Moves messages between the server and its clients, and keeps the run's ledger."""

    def __init__(self, transport, channel: ChannelCfg, plan: FaultPlan, net: Network,
                 devices: DeviceProfiles | None, state: ServerState, evict_after: int):
        self.transport, self.channel, self.plan, self.net, self.devices = transport, channel, plan, net, devices
        self.state = state
        self.evict_after = evict_after
        self.endpoint = Endpoint(SERVER, encryption=channel.encryption, compression=channel.compression,
                                 float_dtype=channel.float_dtype, max_message_bytes=channel.max_message_bytes())
        self.ledger = Ledger()
        self.connected: list[int] = []

    def connect(self, client_ids: list[int]) -> list[int]:
        """Key agreement with every client that is online, metered as set-up traffic.

        A client that cannot be reached (its actor failed to start, or did not answer
        within ``runtime.reply_timeout_s``) is recorded in ``client_errors`` and stays
        offline for the run, like a disconnected one.
        """
        st = self.state
        key = self.endpoint.public_key()
        nbytes = handshake_bytes(self.channel.encryption)
        answers = self.transport.hello_all([c for c in client_ids if c not in st.offline], key)
        for cid in client_ids:
            if cid in st.offline:
                continue
            peer, ckey = client_party(cid), answers[cid]
            if isinstance(ckey, BaseException):
                st.offline.add(cid)
                entry = {"round": -1, "client": cid, "path": "setup", "error": f"could not connect: {one_line(ckey)}"}
                if party_lost(ckey):  # no answer in time: a failure to reach it, not its code raising
                    entry["unreachable"] = True
                st.client_errors.append(entry)
                continue
            for src, dst in ((SERVER, peer), (peer, SERVER)):
                self.ledger.record(round=-1, src=src, dst=dst, kind="handshake", path="setup", payload_bytes=0,
                                   wire_bytes=nbytes, send_t=0.0, arrive_t=0.0, status="delivered")
            self.endpoint.add_peer(peer, ckey)
            self.connected.append(cid)
        return self.connected

    def live(self) -> list[int]:
        """The connected clients that have not crashed."""
        return [c for c in self.connected if c not in self.state.crashed]

    def run(self, r: int, outgoing: dict[int, Message], path: str, faults: Injector,
            compute: bool = False) -> tuple[RoundState, float]:
        """One exchange from the virtual time ``state.clock``: the round's crashes, then
        send, deliver and receive. Returns what came back and the virtual time it ended
        (the caller decides whether the clock moves: the evaluation path does not)."""
        st = RoundState()
        t0 = self.state.clock
        for cid in faults.crashes(r):
            if cid not in self.state.crashed and cid not in self.state.offline:
                self.transport.kill(cid)  # a real crash: the actor process is gone
                self.state.crashed.add(cid)
                st.crashed.append(cid)
        frames, rows = self.send(r, outgoing, path, faults, st, t0)
        outcomes = self.transport.exchange(frames)
        ends = [t0]
        for cid, out in outcomes.items():
            arrive = self.receive(r, cid, out, rows[cid], path, faults, st, t0, compute)
            if arrive is not None:
                ends.append(arrive)
        return st, faults.round_end(max(ends), t0, bool(st.missing))

    def send(self, r: int, outgoing: dict[int, Message], path: str, faults: Injector,
             st: RoundState, t0: float) -> tuple[dict[int, tuple], dict[int, LedgerRow]]:
        """Seal and meter every outgoing message; decide dropouts. Returns the frames to deliver
        as ``(header, body)`` pairs; messages with the same content are encoded once (see
        :func:`broadcast_key`), and without encryption their frames share one body object."""
        frames, rows = {}, {}
        encoded: dict[tuple, Encoded] = {}
        for cid, msg in outgoing.items():
            if cid in self.state.offline:
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
            if cid not in self.state.crashed and faults.dropped(r, cid):
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

    def receive(self, r: int, cid: int, out: Outcome, row: LedgerRow, path: str, faults: Injector,
                st: RoundState, t0: float, compute: bool = False) -> float | None:
        """Open, time and meter one client's reply. Returns its virtual arrival time if it counts.
        With device profiles the reply leaves after the client's nominal compute time (in a
        round's first exchange, ``compute``) and its straggler delay, and travels its uplink."""
        if out.status != "ok":
            self._failed(r, cid, out, row, path, st)
            return None
        self.state.compute_s += out.compute_s
        self.state.timeouts.pop(cid, None)
        if out.frame is None:
            st.acked.add(cid)  # answered, with nothing to say
            return None
        wire = len(out.frame) if isinstance(out.frame, (bytes, bytearray)) else 0  # anything else is rejected
        work = self.devices.compute_s(cid, self.plan.work(r, cid)) if compute and self.devices is not None else 0.0
        send_t = row.arrive_t + work + faults.delay(r, cid)
        arrive = send_t + self._up_s(cid, wire)
        st.times[cid] = arrive - t0  # the round record shows them with device profiles; selection reads them
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
            st.arrivals[cid] = arrive
            return arrive
        st.missing.add(cid)
        (st.late if status == "late" else st.rejected).append(cid)
        return None

    def _failed(self, r: int, cid: int, out: Outcome, row: LedgerRow, path: str, st: RoundState) -> None:
        """Record a frame the client did not answer: its actor died or hung, it rejected the frame, or it raised."""
        state = self.state
        st.missing.add(cid)
        if out.status == "timeout":  # no reply within runtime.reply_timeout_s of wall time: late
            row.status, row.arrive_t = "late", None
            st.late.append(cid)
            st.timed_out.append(cid)
            state.timeouts[cid] = state.timeouts.get(cid, 0) + 1
            if state.timeouts[cid] >= self.evict_after and cid not in state.crashed:
                self.transport.kill(cid)  # hung for too long: evicted, treated as crashed from now on
                state.evicted.append(cid)
                state.crashed.add(cid)
                st.crashed.append(cid)
        elif out.status == "crashed":
            row.status, row.arrive_t = "lost", None
            if cid not in state.crashed:
                state.crashed.add(cid)
                st.crashed.append(cid)
        elif out.status == "rejected":
            row.status, row.kind = "rejected", f"rejected:{out.detail}"
            st.rejected.append(cid)
        else:
            st.errors[cid] = cut_line((out.detail or "error").split("\n", 1)[0])
            record = {"round": r, "client": cid, "path": path, "error": st.errors[cid]}
            if out.traceback:
                record["traceback"] = out.traceback[:TRACEBACK_LIMIT]  # for errors.log, not summary.json
            state.client_errors.append(record)
