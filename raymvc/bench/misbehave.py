"""The FedAvg echo with one client that misbehaves on purpose: isolation checks on Ray.

``method: raymvc.bench.misbehave`` with ``params: {client: C, round: R, act: ...}`` runs
:mod:`raymvc.bench.fedavg_echo`, except that client ``C``, handling the message of round
``R``, does ``act``:

* ``raise`` -- raises ``RuntimeError`` (its error; the run goes on without it);
* ``exit`` -- raises ``SystemExit`` as ``sys.exit`` does;
* ``hang`` -- blocks for ``hang_s`` seconds (past ``runtime.reply_timeout_s``);
* ``weight`` -- reports ``weight`` as its number of rows (a weight its rows do not back).

Nothing else differs, so the other clients' replies, and the isolation of a pooled
client's neighbours (``runtime.clients_per_actor``), can be checked on real actors,
where a test cannot patch a method.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from raymvc.messages import Message
from raymvc.protocol import Protocol

from . import fedavg_echo


class Config(fedavg_echo.Config):
    client: int = Field(default=0, ge=0, description="the client that misbehaves")
    round: int = Field(default=1, ge=0, description="the round in which it does")
    act: Literal["raise", "exit", "hang", "weight"] = Field(default="raise", description="what it does")
    hang_s: float = Field(default=600.0, gt=0, description="how long 'hang' blocks")
    weight: float = Field(default=1e9, description="the row count 'weight' reports")


class MisbehavingClient(fedavg_echo.EchoClient):
    def handle(self, msg: Message) -> Message | None:
        c = self.config
        if self.ctx.client_id == c.client and self.ctx.round == c.round:
            if c.act == "raise":
                raise RuntimeError(f"client {c.client} misbehaves in round {c.round}")
            if c.act == "exit":
                raise SystemExit(3)
            if c.act == "weight":
                reply = super().handle(msg)
                return Message(reply.kind, {**reply.fields, "n": c.weight})
            time.sleep(c.hang_s)
        return super().handle(msg)


PROTOCOL = Protocol(
    name="misbehave",
    config=Config,
    client=MisbehavingClient,
    server=fedavg_echo.EchoServer,
    partition="horizontal",
    summary="engine check: the FedAvg echo with one client that raises, exits, hangs or lies about its rows on purpose",
    secure_sums=fedavg_echo.PROTOCOL.secure_sums,
)
