"""The two kinds of party: :class:`ClientNode` and :class:`ServerNode`.

Both are plain classes. The Ray backend turns them into actors (``ray.remote``); the
in-process backend uses them as they are. Either way the same code seals, opens,
meters and fault-injects every message, which is why both backends give identical
results for one seed.

A message's path: the protocol's ``Server.step`` returns ``{client: Message}`` ->
``ServerNode`` seals each one for its link (codec -> compression -> encryption), writes a
ledger row and asks the transport to deliver the frame -> ``ClientNode.deliver`` opens
and checks it, calls the protocol's ``Client.handle`` and seals the reply -> back in
``ServerNode`` the reply is opened, timed on the virtual clock, metered, and handed to
the next ``Server.step`` as a reply or as missing.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..channel import Endpoint, Ledger, RejectedMessage, handshake_bytes
from ..messages import Done, Message, labels_array
from ..protocol import ClientContext, ServerContext
from ..scenario import ChannelCfg, FaultsCfg, NetworkCfg
from .faults import FaultPlan, Network

SERVER = "server"
EVAL_PREDICT = "eval.predict"  # engine-reserved kinds: the evaluation path
EVAL_LABELS = "eval.labels"


def client_party(cid: int) -> str:
    return f"client:{cid}"


def _limit_threads(n: int):
    """Same BLAS/OpenMP thread count in every backend -> identical floating point."""
    torch = sys.modules.get("torch")  # only if a protocol imported it
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return threadpool_limits(limits=n)


# ---------------------------------------------------------------------------
class ClientNode:
    """One client: its private shard, the protocol's client object, its endpoint."""

    def __init__(self, cid: int, method: str, params: dict, shard, *, n_clients: int, n_clusters: int,
                 channel: dict, seed: int, threads: int = 1):
        from ..protocols import get

        self.cid = cid
        self.threads = threads
        ch = ChannelCfg(**channel)
        proto = get(method)
        ctx = ClientContext(client_id=cid, n_clients=n_clients, n_clusters=n_clusters, seed=seed,
                            float_dtype=ch.float_dtype)
        with _limit_threads(threads):
            self.client = proto.client(proto.config(**params), shard, ctx)
        self.endpoint = Endpoint(client_party(cid), encryption=ch.encryption,
                                 compression=ch.compression, float_dtype=ch.float_dtype)

    def hello(self, server_key: bytes | None) -> bytes | None:
        """Key agreement: learn the server's public key, return ours."""
        self.endpoint.add_peer(SERVER, server_key)
        return self.endpoint.public_key()

    def deliver(self, frame: bytes) -> tuple[str, bytes | None, str | None, float]:
        """Open a frame, run the protocol, seal the reply.

        Returns ``(status, reply_frame, detail, compute_s)`` with status ``"ok"``,
        ``"rejected"`` (detail = reason) or ``"error"`` (detail = the exception).
        """
        try:
            opened = self.endpoint.open(frame)
        except RejectedMessage as e:
            return "rejected", None, e.reason, 0.0
        t = time.perf_counter()
        try:
            with _limit_threads(self.threads):
                self.client.ctx.round = opened.round
                if opened.msg.kind == EVAL_PREDICT:
                    reply = Message(EVAL_LABELS, y=labels_array(self.client.predict()))
                else:
                    reply = self.client.handle(opened.msg)
        except Exception as e:  # the client fails, the run goes on without it
            detail = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
            return "error", None, detail, time.perf_counter() - t
        compute = time.perf_counter() - t
        if reply is None:
            return "ok", None, None, compute
        sealed = self.endpoint.seal(SERVER, opened.round, reply)
        return "ok", sealed.frame, None, compute

    def rejected(self) -> dict:
        return dict(self.endpoint.rejected)


# ---------------------------------------------------------------------------
@dataclass
class Outcome:
    status: str  # ok | rejected | error | crashed | timeout
    frame: bytes | None = None
    detail: str | None = None
    compute_s: float = 0.0


class LocalTransport:
    """Calls client nodes directly, in this process."""

    def __init__(self, clients: dict[int, ClientNode]):
        self.clients = clients
        self.dead: set[int] = set()

    def call(self, cid: int, method: str, *args):
        if cid in self.dead:
            raise ConnectionError(f"client {cid} is dead")
        return getattr(self.clients[cid], method)(*args)

    def exchange(self, frames: dict[int, bytes]) -> dict[int, Outcome]:
        out = {}
        for cid, frame in frames.items():
            if cid in self.dead:
                out[cid] = Outcome("crashed", detail="actor is dead")
                continue
            status, reply, detail, compute = self.clients[cid].deliver(frame)
            out[cid] = Outcome(status, reply, detail, compute)
        return out

    def kill(self, cid: int) -> None:
        self.dead.add(cid)


class RayTransport:
    """Sends frames to client actors and waits for replies with a wall-clock limit."""

    def __init__(self, handles: dict, timeout_s: float):
        import ray

        self.ray = ray
        self.handles = handles
        self.timeout_s = timeout_s

    def call(self, cid: int, method: str, *args):
        return self.ray.get(getattr(self.handles[cid], method).remote(*args), timeout=self.timeout_s)

    def exchange(self, frames: dict[int, bytes]) -> dict[int, Outcome]:
        ray = self.ray
        refs = {cid: self.handles[cid].deliver.remote(frame) for cid, frame in frames.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.timeout_s)
        ready = set(ready)
        out = {}
        for cid, ref in refs.items():
            if ref not in ready:
                ray.cancel(ref, force=False)
                out[cid] = Outcome("timeout", detail=f"no reply within {self.timeout_s} s wall time")
                continue
            try:
                status, reply, detail, compute = ray.get(ref)
                out[cid] = Outcome(status, reply, detail, compute)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
                out[cid] = Outcome("crashed", detail=type(e).__name__)
        return out

    def kill(self, cid: int) -> None:
        self.ray.kill(self.handles[cid], no_restart=True)


def make_transport(clients: dict, timeout_s: float):
    if clients and all(isinstance(c, ClientNode) for c in clients.values()):
        return LocalTransport(clients)
    return RayTransport(clients, timeout_s)


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


class ServerNode:
    """The server party: runs the protocol's server and drives every round."""

    def __init__(self, method: str, params: dict, clients: dict, *, client_ids: list[int], n_clusters: int,
                 n_samples: int | None, channel: dict, faults: dict, network: dict, seed: int,
                 reply_timeout_s: float = 600.0, threads: int = 1, client_sizes: dict[int, int] | None = None):
        from ..protocols import get

        proto = get(method)
        ch = ChannelCfg(**channel)
        self.channel = ch
        self.threads = threads
        self.plan = FaultPlan(FaultsCfg(**faults), list(client_ids), seed)
        self.net = Network(NetworkCfg(**network))
        self.deadline = self.plan.cfg.deadline_s
        self.min_clients = self.plan.cfg.min_clients
        self.transport = make_transport(clients, reply_timeout_s)
        self.client_ids = list(client_ids)
        ctx = ServerContext(client_ids=list(client_ids), n_clusters=n_clusters, seed=seed, n_samples=n_samples,
                            client_sizes=dict(client_sizes or {}), float_dtype=ch.float_dtype)
        with _limit_threads(threads):
            self.server = proto.server(proto.config(**params), ctx)
        self.endpoint = Endpoint(SERVER, encryption=ch.encryption, compression=ch.compression,
                                 float_dtype=ch.float_dtype)
        self.ledger = Ledger()
        self.clock = 0.0
        self.round = 0
        self.outgoing: dict[int, Message] = {}
        self.done: Done | None = None
        self.status = "running"
        self.error: str | None = None
        self.crashed: set[int] = set()
        self.connected: list[int] = []
        self.counts = {"dropped_replies": 0, "late_replies": 0, "rejected_messages": 0, "client_errors": 0}
        self.client_errors: list[dict] = []  # every failure, in order: {round, client, error}
        self.compute_s = 0.0

    # -- setup -------------------------------------------------------------
    def connect(self) -> list[int]:
        """Key agreement with every client that is online; meter it as setup traffic."""
        key = self.endpoint.public_key()
        nbytes = handshake_bytes(self.channel.encryption)
        for cid in self.client_ids:
            if cid in self.plan.disconnected:
                continue
            peer = client_party(cid)
            self.ledger.record(round=-1, src=SERVER, dst=peer, kind="handshake", path="setup",
                               payload_bytes=0, wire_bytes=nbytes, send_t=0.0, arrive_t=0.0, status="delivered")
            ckey = self.transport.call(cid, "hello", key)
            self.endpoint.add_peer(peer, ckey)
            self.ledger.record(round=-1, src=peer, dst=SERVER, kind="handshake", path="setup",
                               payload_bytes=0, wire_bytes=nbytes, send_t=0.0, arrive_t=0.0, status="delivered")
            self.connected.append(cid)
        return self.connected

    def begin(self) -> None:
        with _limit_threads(self.threads):
            self.outgoing = self.server.start()

    # -- one round ---------------------------------------------------------
    def _exchange(self, r: int, outgoing: dict[int, Message], path: str, faults: bool) -> tuple[RoundState, float]:
        st = RoundState()
        t0 = self.clock
        if faults:
            for cid in self.plan.crashes_now(r):
                if cid not in self.crashed and cid not in self.plan.disconnected:
                    self.transport.kill(cid)  # a real crash: the actor process is gone
        frames, rows, sent_at = {}, {}, {}
        for cid, msg in outgoing.items():
            if cid in self.plan.disconnected:
                st.missing.add(cid)
                continue
            sealed = self.endpoint.seal(client_party(cid), r, msg)
            arrive = t0 + self.net.transfer_s(sealed.wire_bytes)
            row = self.ledger.record(round=r, src=SERVER, dst=client_party(cid), kind=msg.kind, path=path,
                                     payload_bytes=sealed.payload_bytes, wire_bytes=sealed.wire_bytes,
                                     data_bytes=sealed.data_bytes, send_t=t0, arrive_t=arrive,
                                     status="delivered")
            if faults and self.plan.dropped(r, cid) and cid not in self.crashed:
                row.status, row.arrive_t = "dropped", None
                st.dropped.append(cid)
                st.missing.add(cid)
                continue
            frames[cid], rows[cid], sent_at[cid] = sealed.frame, row, arrive
        outcomes = self.transport.exchange(frames)
        ends = [t0]
        for cid, out in outcomes.items():
            row = rows[cid]
            if out.status in ("crashed", "timeout"):
                row.status, row.arrive_t = "lost", None
                st.missing.add(cid)
                if out.status == "crashed" and cid not in self.crashed:
                    self.crashed.add(cid)
                    st.crashed.append(cid)
                elif out.status == "timeout":
                    st.late.append(cid)
                continue
            if out.status == "rejected":
                row.status = "rejected"
                st.rejected.append(cid)
                st.missing.add(cid)
                continue
            if out.status == "error":
                st.errors[cid] = out.detail or "error"
                self.client_errors.append({"round": r, "client": cid, "path": path, "error": st.errors[cid]})
                st.missing.add(cid)
                continue
            self.compute_s += out.compute_s
            if out.frame is None:
                st.acked.add(cid)  # answered, with nothing to say
                continue
            send_t = sent_at[cid] + (self.plan.delay(r, cid) if faults else 0.0)
            arrive = send_t + self.net.transfer_s(len(out.frame))
            try:
                opened = self.endpoint.open(out.frame)
                status, kind = "delivered", opened.msg.kind
                payload, data = opened.payload_bytes, opened.data_bytes
            except RejectedMessage as e:
                opened, status, payload, data, kind = None, "rejected", 0, 0, f"rejected:{e.reason}"
            late = faults and self.deadline is not None and arrive > t0 + self.deadline
            if opened is not None and late:
                status = "late"
            self.ledger.record(round=r, src=client_party(cid), dst=SERVER, kind=kind, path=path,
                               payload_bytes=payload, wire_bytes=len(out.frame), data_bytes=data, send_t=send_t,
                               arrive_t=arrive, status=status)
            if status == "delivered":
                st.replies[cid] = opened.msg
                ends.append(arrive)
            else:
                st.missing.add(cid)
                (st.late if status == "late" else st.rejected).append(cid)
        end = max(ends)
        if faults and self.deadline is not None and st.missing:
            end = max(end, t0 + self.deadline)  # the server waited until the deadline
        return st, end

    def run_round(self) -> dict:
        """Exchange the pending messages, let the protocol step, report the round."""
        r = self.round
        wall = time.perf_counter()
        t0 = self.clock
        ledger_mark = len(self.ledger.rows)
        st, end = self._exchange(r, self.outgoing, "protocol", faults=True)
        self.clock = end
        self.counts["dropped_replies"] += len(st.dropped)
        self.counts["late_replies"] += len(st.late)
        self.counts["rejected_messages"] += len(st.rejected)
        self.counts["client_errors"] += len(st.errors)
        addressed = len(self.outgoing)
        record: dict[str, Any] = {"round": r}
        answered = len(st.replies) + len(st.acked)
        if addressed and answered < min(self.min_clients, addressed):
            self.status = "failed"
            self.error = (f"round {r}: {answered} of {addressed} clients replied, "
                          f"fewer than faults.min_clients = {self.min_clients}")
        else:
            try:
                with _limit_threads(self.threads):
                    result = self.server.step(r, st.replies, set(st.missing))
            except Exception as e:
                self.status = "failed"
                self.error = f"server step {r} failed: {type(e).__name__}: {e}"
                result = None
            if isinstance(result, Done):
                self.done = result
                self.status = "finished"
            elif result is not None:
                self.outgoing = result
                self.round += 1
        rows = self.ledger.rows[ledger_mark:]
        record.update({
            "replied": sorted(st.replies),
            "missing": sorted(st.missing),
            "dropped": st.dropped,
            "late": st.late,
            "rejected": st.rejected,
            "crashed": st.crashed,
            "client_errors": sorted(st.errors),
            "messages": len(rows),
            "wire_bytes": sum(x.wire_bytes for x in rows),
            "payload_bytes": sum(x.payload_bytes for x in rows),
            "virtual_start_s": t0,
            "virtual_end_s": end,
            "wall_s": time.perf_counter() - wall,
            "info": dict(self.server.info),
            "done": self.status in ("finished", "failed"),
        })
        if self.error:
            record["error"] = self.error
        self.server.info = {}
        return record

    # -- the end -----------------------------------------------------------
    def finish(self) -> dict:
        """Final labels (server-side, or collected from clients on the evaluation path)."""
        labels, predictions, info = None, {}, {}
        done = self.done
        if done is None:
            try:
                with _limit_threads(self.threads):
                    done = self.server.result()
            except Exception as e:
                info["result_error"] = f"{type(e).__name__}: {e}"
        if done is not None:
            info.update(done.info)
            if done.labels is not None:
                labels = np.asarray(done.labels)
            else:
                alive = [c for c in self.connected if c not in self.crashed]
                st, _ = self._exchange(self.round, {c: Message(EVAL_PREDICT) for c in alive}, "eval", faults=False)
                predictions = {c: np.asarray(m["y"]) for c, m in st.replies.items()}
                for c in st.crashed:
                    self.crashed.add(c)
        return {
            "labels": labels,
            "predictions": predictions,
            "info": info,
            "status": self.status,
            "error": self.error,
            "rounds": self.round + (1 if self.status in ("finished", "failed") else 0),
            "virtual_s": self.clock,
            "compute_s": self.compute_s,
            "counts": dict(self.counts),
            "crashed": sorted(self.crashed),
            "disconnected": sorted(self.plan.disconnected),
            "client_errors": list(self.client_errors),
            "ledger": self.ledger,
        }
