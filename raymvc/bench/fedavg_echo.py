"""A trivial FedAvg whose clients echo the model: it measures the engine, not a method.

Use it as ``method: raymvc.bench.fedavg_echo`` on a horizontal split. Every round the
server sends a float64 vector of ``floats`` entries to every client, each client sends
it back unchanged, and the server averages the replies weighted by the clients' row
counts (``ServerContext.client_sizes``); after ``rounds`` rounds it stops. Clients label
all their rows 0. The traffic is ``2 x floats x 8`` data bytes per client and round.

Missing replies: the average is taken over the replies that arrived; a round with
none keeps the vector.

With ``channel.secure_aggregation: true`` the clients send their row-weighted vectors
masked (``raymvc.protocols._secagg``): two setup rounds (key advertisement, share
keys) come first, and each of the ``rounds`` averages takes two engine rounds, the
masked echo and the unmasking; the server sees only ``Σ n_i w_i`` and ``Σ n_i`` over the
clients whose masked echo arrived. An aggregation with fewer than ``t`` of them fails
and keeps the vector, like a round without replies.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from pydantic import Field

from raymvc.messages import Done, Message
from raymvc.protocol import Client, Protocol, ProtocolConfig, RunFacts, Server
from raymvc.protocols._secagg import SecAggClient, SecAggServer


class Config(ProtocolConfig):
    rounds: int = Field(default=100, ge=1, description="rounds of send, echo and average")
    floats: int = Field(default=2048, ge=1, description="length of the float64 vector (2048 = 16 KB)")


class EchoClient(Client):
    def __init__(self, config: Config, shard, ctx):
        super().__init__(config, shard, ctx)
        self.secagg = SecAggClient(ctx.client_id) if ctx.secure_aggregation else None

    def handle(self, msg: Message) -> Message | None:
        if self.secagg is not None:
            if self.secagg.owns(msg):
                return self.secagg.handle(msg)
            return self.secagg.masked(msg, np.asarray(msg["w"]), weight=float(self.shard.n_local))
        return Message("update", w=np.asarray(msg["w"]))

    def predict(self) -> np.ndarray:
        return np.zeros(self.shard.n_local, dtype=np.int64)


class EchoServer(Server):
    def __init__(self, config: Config, ctx):
        super().__init__(config, ctx)
        self.w = ctx.rng_for("init", 0).standard_normal(config.floats)
        self.secagg = SecAggServer(ctx.client_ids) if ctx.secure_aggregation else None
        self.averaged = 0  # aggregations ended (with secure aggregation)

    def _send(self) -> dict[int, Message]:
        if self.secagg is not None:
            return self.secagg.input_requests("model", {"w": self.w}, self.ctx.client_ids)
        return {c: Message("model", w=self.w) for c in self.ctx.client_ids}

    def start(self) -> dict[int, Message]:
        return self.secagg.start() if self.secagg is not None else self._send()

    def _secure_step(self, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        out = self.secagg.step(replies, missing)
        if out.send is not None:
            return out.send
        if out.ended:
            self.averaged += 1
            self.info = {"aggregated": out.contributors, "dropped": out.dropped, "weight": out.weight,
                         "secagg_failed": out.failed}
            if out.total is not None and out.weight:
                self.w = out.total / out.weight
        if self.averaged >= self.config.rounds:
            return Done(labels=None)
        return self._send()

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        if self.secagg is not None:
            return self._secure_step(replies, missing)
        if replies:
            sizes = {c: float(self.ctx.client_sizes.get(c, 1)) for c in replies}
            total = sum(sizes.values())
            self.w = sum(sizes[c] / total * np.asarray(m["w"]) for c, m in replies.items())
        if round + 1 >= self.config.rounds:
            return Done(labels=None)
        return self._send()

    def result(self) -> Done:
        return Done(labels=None)


def analytic_bytes(config: Config, facts: RunFacts) -> int:
    return len(facts.client_ids) * facts.rounds * 2 * config.floats * facts.float_bytes


PROTOCOL = Protocol(
    name="fedavg-echo",
    config=Config,
    client=EchoClient,
    server=EchoServer,
    partition="horizontal",
    summary="engine benchmark: a vector down, the same vector up, FedAvg",
    analytic_bytes=analytic_bytes,
    secure_aggregation=True,
)
