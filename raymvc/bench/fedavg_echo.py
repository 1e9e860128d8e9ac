"""A trivial FedAvg whose clients echo the model: it measures the engine, not a method.

Use it as ``method: raymvc.bench.fedavg_echo`` on a horizontal split. Every round the
server sends a float64 vector of ``floats`` entries to every client, each client sends
it back unchanged with its row count ``n``, and the server averages the replies weighted
by ``n``; after ``rounds`` rounds it stops. Clients label all their rows 0. The traffic
is ``2 x floats x 8 + 8`` data bytes per client and round.

Missing replies: the average is taken over the replies that arrived; a round with
none keeps the vector.

The reply's ``w`` is declared a weighted sum (weight ``n``, the client's row count): with
``channel.secure_aggregation: true`` the engine masks it and the server gets only
``Σ n_i w_i`` and ``Σ n_i`` over the clients whose masked echo arrived; the code is the
same either way. A round whose aggregation fails (too few survivors) keeps the vector,
like a round without replies.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from pydantic import Field

from raymvc.messages import Done, Message
from raymvc.protocol import Client, Protocol, ProtocolConfig, RunFacts, SecureSum, Server, weighted_sum

ECHO = SecureSum("update", ("w",), weight="n", weight_is_rows=True)


class Config(ProtocolConfig):
    rounds: int = Field(default=100, ge=1, description="rounds of send, echo and average")
    floats: int = Field(default=2048, ge=1, description="length of the float64 vector (2048 = 16 KB)")


class EchoClient(Client):
    def handle(self, msg: Message) -> Message | None:
        return Message("update", w=np.asarray(msg["w"]), n=int(self.shard.n_local))

    def predict(self) -> np.ndarray:
        return np.zeros(self.shard.n_local, dtype=np.int64)


class EchoServer(Server):
    def __init__(self, config: Config, ctx):
        super().__init__(config, ctx)
        self.w = ctx.rng_for("init", 0).standard_normal(config.floats)

    def _send(self) -> dict[int, Message]:
        return {c: Message("model", w=self.w) for c in self.ctx.client_ids}

    def start(self) -> dict[int, Message]:
        return self._send()

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        s = weighted_sum(replies, ECHO)
        mean = s.mean()
        if mean is not None:
            self.w = mean["w"]
        self.info = {"aggregated": s.contributors, "weight": s.weight}
        if s.failed is not None:
            self.info["aggregation_failed"] = s.failed
        if round + 1 >= self.config.rounds:
            return Done(labels=None)
        return self._send()

    def result(self) -> Done:
        return Done(labels=None)


def analytic_bytes(config: Config, facts: RunFacts) -> int:
    return len(facts.client_ids) * facts.rounds * (2 * config.floats * facts.float_bytes + 8)  # + n


PROTOCOL = Protocol(
    name="fedavg-echo",
    config=Config,
    client=EchoClient,
    server=EchoServer,
    partition="horizontal",
    summary="engine benchmark: a vector down, the same vector up, FedAvg",
    analytic_bytes=analytic_bytes,
    secure_sums=(ECHO,),
    supports=frozenset({"stale_replies"}),  # a missing client's last vector is averaged in (faults.stale_replies)
    async_kinds=("model",),  # faults.asynchronous: the buffered echoes are averaged alike, old or new
)
