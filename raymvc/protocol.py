"""The protocol interface every federated clustering method implements.

A method is a module in ``protocols/`` (installed as ``raymvc.protocols``) that
defines three things and registers them as ``PROTOCOL``:

* ``Config`` -- a :class:`ProtocolConfig` (pydantic model, unknown keys rejected)
  holding the method's hyperparameters; the scenario's ``params`` fill it.
* ``Client(config, shard, ctx)`` -- holds one client's private :class:`~raymvc.data.Shard`
  and answers messages: ``handle(msg) -> Message | None``. ``None`` means "no reply".
  Optionally ``predict() -> labels`` for methods whose clients label their own samples
  (used only on the evaluation path).
* ``Server(config, ctx)`` -- ``start() -> {client_id: Message}`` and
  ``step(round, replies, missing) -> {client_id: Message} | Done``.

``replies`` maps client id -> the reply that arrived in time; ``missing`` is the set of
addressed clients whose reply did not (dropped, crashed, late, rejected). Each protocol
documents what it does with missing replies. The server may put numbers for the round
log (objective values, stale clients...) into ``self.info``; the engine writes them to
``rounds.jsonl`` after every step and clears the dict.

The engine (``raymvc.runtime``) moves every message through the channel, so protocols
never see bytes, actors, keys or clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict

from .messages import Done, Message


class ProtocolConfig(BaseModel):
    """Base for method hyperparameters: unknown keys and wrong types are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


@dataclass
class ClientContext:
    """What a client may know besides its shard."""

    client_id: int
    n_clients: int
    n_clusters: int
    rng: np.random.Generator
    float_dtype: str = "float64"


@dataclass
class ServerContext:
    """What the server may know: public facts about the federation, never data."""

    client_ids: list[int]
    n_clusters: int
    rng: np.random.Generator
    n_samples: int | None = None  # set for vertical splits (samples shared by all)
    client_sizes: dict[int, int] = field(default_factory=dict)
    float_dtype: str = "float64"


class Client:
    """Base class for a protocol's client side."""

    def __init__(self, config: ProtocolConfig, shard: Any, ctx: ClientContext):
        self.config = config
        self.shard = shard
        self.ctx = ctx

    def handle(self, msg: Message) -> Message | None:  # pragma: no cover - interface
        raise NotImplementedError

    def predict(self) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} does not label its own samples")


class Server:
    """Base class for a protocol's server side."""

    def __init__(self, config: ProtocolConfig, ctx: ServerContext):
        self.config = config
        self.ctx = ctx
        self.info: dict[str, Any] = {}

    def start(self) -> dict[int, Message]:  # pragma: no cover - interface
        raise NotImplementedError

    def step(
        self, round: int, replies: Mapping[int, Message], missing: set[int]
    ) -> dict[int, Message] | Done:  # pragma: no cover - interface
        raise NotImplementedError

    def result(self) -> Done:
        """Best labels so far; called when a run must stop early (too few clients)."""
        raise NotImplementedError(f"{type(self).__name__} cannot report early results")


@dataclass(frozen=True)
class Protocol:
    """Registration record of one method."""

    name: str
    config: type[ProtocolConfig]
    client: type[Client]
    server: type[Server]
    partition: str  # "vertical" or "horizontal": the split the method expects
    summary: str = ""
    paper: str = ""
    requires_torch: bool = False
