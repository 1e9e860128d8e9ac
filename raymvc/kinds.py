"""Fault kinds: device behaviours a scenario switches on by name, as an open set
(docs/fault-models.md#fault-kinds-of-ones-own).

A kind is one class: its parameters (``Config``, a pydantic model with a description per
field) and any of six hooks, each a function of the seed, the round and the client alone
(draw from :meth:`FaultKind.rng`, a stream keyed by the seed, the kind's name, the round
and the client), so that a run on Ray and one in process see the same:

* ``away(round, client) -> bool`` -- the client misses the round, as a dropout: the
  server's message is sent and metered, no reply comes (``dropped`` in ``rounds.jsonl``);
* ``delay_s(round, client) -> float`` -- virtual seconds its reply to the round's first
  exchange leaves later (past ``faults.deadline_s`` it is late); a kind that delays every
  exchange of a round (three under secure aggregation), as ``stragglers`` does, overrides
  ``exchange_delay_s(round, client, sub)`` instead;
* ``work(round, client) -> float`` -- the share of its local work it does, as under
  ``faults.partial_work`` (methods with ``partial_work`` in ``Protocol.supports`` honour
  it, closed-form methods ignore it);
* ``record(round, clients) -> dict`` -- what the kind adds to the round's record
  (``kinds`` in ``rounds.jsonl``: plain numbers, strings or lists of them);
* ``offline(client) -> bool`` -- the client never connects: no message of the run is
  addressed to it (``disconnected_clients`` in the summary), as under ``faults.disconnect``;
* ``crashes(round, client) -> bool`` -- the client's actor is killed at the start of the
  round and never answers again (``crashed_clients``), as under ``faults.crash``.

A kind whose parameters name clients says, in ``fits(cfg, n_clients)``, which one does not
exist (a one-line reason, or ``None``): the run is refused before it starts.

``requires`` names what a method must declare in ``Protocol.supports`` for the kind to
mean anything; a scenario that pairs the kind with a method lacking it is refused.

A scenario lists its kinds under ``faults.kinds``: ``[{kind: churn, rate: 0.05}]`` for a
built-in one, ``[{kind: battery:Battery, ...}]`` for a class of one's own (its module
beside the scenario file is found as a method of one's own is, on Ray too). Adding a
built-in kind is a class in this file (and its row in docs/fault-models.md). A built-in
kind may also name a ``shorthand``, a key of ``faults`` that switches it on with its
parameters alone (``faults.partial_work: {fraction: F, work: W}`` is the kind
``partial_work``); the scenario's schema takes that key's type from the kind's ``Config``,
and the kind's ``switched_on(cfg)`` says whether those parameters do anything. A key that
holds a list (``faults.drop: [{client: C, at_round: R}]``) is the one parameter the kind's
``shorthand_field`` names (the kind ``drop`` with ``at: [...]``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from . import streams
from .availability import Context, ModelConfig
from .streams import stream

__all__ = ["REGISTRY", "ClientRound", "Context", "DelayCfg", "FaultKind", "KindError", "ModelConfig", "build",
           "draw_delay", "entries", "get_kind", "shorthand_config"]

MAX_SIGMA = 10.0  # a lognormal's sigma: e^(10 x 3) already spans 13 orders of magnitude
MAX_SECONDS = 1e9  # a delay's mean (about 30 years)


class FaultKind:
    """A device behaviour: ``Config`` declares its parameters; override the hooks it uses."""

    name: ClassVar[str]
    Config: ClassVar[type[ModelConfig]]
    requires: ClassVar[frozenset[str]] = frozenset()
    shorthand: ClassVar[str | None] = None  # a built-in kind's own key of ``faults``, if it has one
    shorthand_field: ClassVar[str | None] = None  # that key holds this one parameter (a list), not the mapping

    def __init__(self, cfg: ModelConfig, ctx: Context):
        self.cfg, self.ctx = cfg, ctx

    def rng(self, round: int, client: int, *more: int) -> np.random.Generator:
        """The kind's own stream for ``(round, client, *more)``: the same draws whatever else
        was drawn, and other draws than any other kind's."""
        return stream(self.ctx.seed, streams.KIND, self.name, round, client, *more)

    def away(self, round: int, client: int) -> bool:
        return False

    def delay_s(self, round: int, client: int) -> float:
        return 0.0

    def exchange_delay_s(self, round: int, client: int, sub: int) -> float:
        """Virtual seconds the reply to exchange ``sub`` of ``round`` leaves later: by default
        :meth:`delay_s` in the first exchange and nothing in the others."""
        return self.delay_s(round, client) if sub == 0 else 0.0

    @classmethod
    def switched_on(cls, cfg: ModelConfig) -> bool:
        """Whether a shorthand key's parameters do anything (a kind whose key has a default
        that does nothing, as ``stragglers: {fraction: 0}``, is then not built at all)."""
        return True

    @classmethod
    def fits(cls, cfg: ModelConfig, n_clients: int) -> str | None:
        """Why these parameters do not fit a run of ``n_clients`` clients (``None``: they do)."""
        return None

    def work(self, round: int, client: int) -> float:
        return 1.0

    def record(self, round: int, clients: list[int]) -> dict[str, Any]:
        return {}

    def offline(self, client: int) -> bool:
        return False

    def crashes(self, round: int, client: int) -> bool:
        return False


class KindError(ValueError):
    """A fault kind's hook answered something it may not (one line, naming the kind and call)."""


def _call(kind: FaultKind, hook: str, *args):
    try:
        return getattr(kind, hook)(*args)
    except SystemExit as e:  # sys.exit in a kind's code is its error, not the end of the process
        raise KindError(f"fault kind {kind.name!r}: {hook}{args} called sys.exit({e.code!r})") from None


def _yes_no(kind: FaultKind, hook: str, *args) -> bool:
    v = _call(kind, hook, *args)
    if not isinstance(v, (bool, np.bool_)):
        raise KindError(f"fault kind {kind.name!r}: {hook}({', '.join(map(str, args))}) returned {v!r}, "
                        "not True or False")
    return bool(v)


def away(kind: FaultKind, round: int, client: int) -> bool:
    return _yes_no(kind, "away", round, client)


def offline(kind: FaultKind, client: int) -> bool:
    return _yes_no(kind, "offline", client)


def crashes(kind: FaultKind, round: int, client: int) -> bool:
    return _yes_no(kind, "crashes", round, client)


def exchange_delay_s(kind: FaultKind, round: int, client: int, sub: int) -> float:
    """The kind's delay of ``client``'s reply in exchange ``sub`` of ``round`` (its own
    ``delay_s`` in the first exchange, unless it overrides ``exchange_delay_s``), checked."""
    v = _call(kind, "exchange_delay_s", round, client, sub)
    if not (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            and math.isfinite(float(v)) and float(v) >= 0.0):
        raise KindError(f"fault kind {kind.name!r}: delay of round {round}, client {client}, exchange {sub}: "
                        f"{v!r}, not seconds >= 0")
    return float(v)


def work(kind: FaultKind, round: int, client: int) -> float:
    v = _call(kind, "work", round, client)
    if not (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and 0.0 < float(v) <= 1.0):
        raise KindError(f"fault kind {kind.name!r}: work({round}, {client}) returned {v!r}, not a share in (0, 1]")
    return float(v)


def record(kind: FaultKind, round: int, clients: list[int]) -> dict[str, Any]:
    v = _call(kind, "record", round, list(clients))
    ok = isinstance(v, dict) and all(isinstance(k, str) and _plain(x) for k, x in v.items())
    if not ok:
        raise KindError(f"fault kind {kind.name!r}: record({round}, ...) returned {str(v)[:80]!r}, not a mapping of "
                        "names to numbers, strings or lists of them")
    return v


def _plain(x) -> bool:
    if isinstance(x, (list, tuple)):
        return all(_plain(y) for y in x)
    if isinstance(x, float):
        return math.isfinite(x)
    return isinstance(x, (int, str, bool)) or x is None


# --------------------------------------------------------------------------- built-in kinds
class Churn(FaultKind):
    """Clients that leave for good: each round from ``from_round`` on, a client still there
    leaves with chance ``rate`` and misses every later round (a crash drawn, not scheduled;
    its actor stays up, it just never answers)."""

    name = "churn"

    class Config(ModelConfig):
        rate: float = Field(ge=0.0, le=1.0, description="chance per round that a client still there leaves for good")
        from_round: int = Field(default=1, ge=0, description="the first round in which a client may leave")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self._leaves: dict[int, float] = {}

    def leaves_at(self, client: int) -> float:
        """The round ``client`` leaves in (inf: never): a geometric draw of its own stream."""
        if client not in self._leaves:
            p = self.cfg.rate
            if p <= 0:
                at = math.inf
            elif p >= 1:
                at = float(self.cfg.from_round)
            else:
                at = float(self.cfg.from_round + self.rng(0, client).geometric(p) - 1)
            self._leaves[client] = at
        return self._leaves[client]

    def away(self, round: int, client: int) -> bool:
        return round >= self.leaves_at(client)

    def record(self, round: int, clients: list[int]) -> dict[str, Any]:
        return {"gone": sorted(c for c in clients if round >= self.leaves_at(c))}


class PartialWork(FaultKind):
    """Clients that do only part of their local work: in each round each client, with chance
    ``fraction``, does only the share ``work`` of it (a coin of its own per client and round).
    Methods with ``partial_work`` in ``Protocol.supports`` scale their local epochs by it;
    closed-form methods ignore it. Not a missing reply: the round's record lists the client
    under ``partial_work``."""

    name = "partial_work"
    shorthand = "partial_work"

    class Config(ModelConfig):
        fraction: float = Field(default=0.0, ge=0.0, le=1.0,
                                description="chance per client and round that it does only part of its work")
        work: float = Field(default=1.0, gt=0.0, le=1.0, description="the share of its local work it then does")

    def work(self, round: int, client: int) -> float:
        if self.cfg.fraction <= 0 or self.cfg.work >= 1:
            return 1.0
        # the stream keyed (client, round) as it always was, so runs keep their labels
        u = stream(self.ctx.seed, streams.PARTIAL, client, round).random()
        return float(self.cfg.work) if u < self.cfg.fraction else 1.0


class DelayCfg(ModelConfig):
    """A delay in virtual seconds: its distribution, its mean and (lognormal) the sigma of
    the underlying normal."""

    dist: Literal["lognormal", "exponential", "constant", "uniform"] = Field(
        default="lognormal", description="lognormal, exponential, constant, or uniform in [0, 2 x mean]")
    mean: float = Field(default=2.0, ge=0.0, le=MAX_SECONDS, description="mean delay, virtual seconds")
    sigma: float = Field(default=0.5, ge=0.0, le=MAX_SIGMA, description="lognormal: the underlying normal's sigma")


def draw_delay(cfg, rng: np.random.Generator) -> float:
    """One draw of a delay (:class:`DelayCfg`, or a device quantity of the same shape) from ``rng``."""
    if cfg.dist == "constant" or cfg.mean == 0:
        return float(cfg.mean)
    if cfg.dist == "exponential":
        return float(rng.exponential(cfg.mean))
    if cfg.dist == "uniform":
        return float(rng.uniform(0.0, 2.0 * cfg.mean))
    # lognormal parametrised by its mean and the sigma of the underlying normal
    mu = math.log(cfg.mean) - cfg.sigma**2 / 2.0
    return float(rng.lognormal(mu, cfg.sigma))


class Stragglers(FaultKind):
    """Slow devices: a share ``fraction`` of the clients, drawn once from the seed, replies
    late in every exchange of every round, by a delay drawn per client, round and exchange
    (past ``faults.deadline_s`` the reply is late). Not a missing reply by itself: the round's
    record lists a client under ``late`` only when its reply missed the deadline."""

    name = "stragglers"
    shorthand = "stragglers"

    class Config(ModelConfig):
        fraction: float = Field(default=0.0, ge=0.0, le=1.0, description="share of the clients that are slow")
        delay_s: DelayCfg = Field(default=DelayCfg(), description="the delay each of their replies gets")

    @classmethod
    def switched_on(cls, cfg) -> bool:
        return cfg.fraction > 0

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        ids = np.array(ctx.client_ids)
        n_slow = int(round(cfg.fraction * len(ids)))
        # the streams as they always were, so runs keep their labels
        rng = stream(ctx.seed, streams.STRAGGLERS)
        self.slow: frozenset[int] = frozenset(int(c) for c in rng.choice(ids, n_slow, replace=False)) if n_slow \
            else frozenset()

    def exchange_delay_s(self, round: int, client: int, sub: int) -> float:
        if client not in self.slow:
            return 0.0
        return draw_delay(self.cfg.delay_s, stream(self.ctx.seed, streams.DELAY, round, client,
                                                          *((sub,) if sub else ())))  # none for the first exchange


class Disconnect(FaultKind):
    """Clients that never connect: a share ``rate`` of them, drawn once from the seed, is
    addressed by no message of the run (``disconnected_clients`` in the summary)."""

    name = "disconnect"
    shorthand = "disconnect"

    class Config(ModelConfig):
        rate: float = Field(default=0.0, ge=0.0, le=1.0, description="share of the clients offline for the whole run")

    @classmethod
    def switched_on(cls, cfg) -> bool:
        return cfg.rate > 0

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        ids = np.array(ctx.client_ids)
        n_off = int(round(cfg.rate * len(ids)))
        rng = stream(ctx.seed, streams.DISCONNECT)  # the stream as it always was, so runs keep their labels
        self.off = frozenset(int(c) for c in rng.choice(ids, n_off, replace=False)) if n_off else frozenset()

    def offline(self, client: int) -> bool:
        return client in self.off


class ClientRound(ModelConfig):
    """One client in one round."""

    client: int = Field(ge=0, description="the client")
    at_round: int = Field(ge=0, description="the round")


class _Scheduled(FaultKind):
    """A kind switched on by a list of (client, round), its parameter ``at``."""

    shorthand_field = "at"

    @classmethod
    def switched_on(cls, cfg) -> bool:
        return bool(cfg.at)

    @classmethod
    def fits(cls, cfg, n_clients: int) -> str | None:
        for c in cfg.at:
            if c.client >= n_clients:
                return f"client {c.client} does not exist (clients are 0..{n_clients - 1})"
        return None


class Drop(_Scheduled):
    """Scheduled dropouts: each listed client misses the listed round, as a dropout (the
    server's message is sent and metered, no reply comes)."""

    name = "drop"
    shorthand = "drop"

    class Config(ModelConfig):
        at: list[ClientRound] = Field(default=[], description="[{client: C, at_round: R}]: the client misses round R")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.at = frozenset((d.at_round, d.client) for d in cfg.at)

    def away(self, round: int, client: int) -> bool:
        return (round, client) in self.at


class Crash(_Scheduled):
    """Scheduled crashes: each listed client's actor is killed at the start of the listed
    round (the earliest, where a client is listed twice) and never answers again."""

    name = "crash"
    shorthand = "crash"

    class Config(ModelConfig):
        at: list[ClientRound] = Field(default=[], description="[{client: C, at_round: R}]: the client's actor is "
                                                              "killed at round R")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.at: dict[int, int] = {}
        for c in cfg.at:
            self.at[c.client] = min(c.at_round, self.at.get(c.client, c.at_round))

    def crashes(self, round: int, client: int) -> bool:
        return self.at.get(client) == round


REGISTRY: dict[str, type[FaultKind]] = {cls.name: cls for cls in (Churn, PartialWork, Stragglers, Disconnect, Drop,
                                                                    Crash)}


def get_kind(name: str) -> type[FaultKind]:
    """The kind class for ``name``: a built-in name or ``module.path:ClassName`` (found as a
    method of one's own is: importable, or beside a scenario file). Unknown: KeyError."""
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" not in name:
        raise KeyError(f"unknown fault kind {name!r}; built in: {', '.join(REGISTRY)}, or module.path:ClassName "
                       "of your own")
    from .protocols import own_class

    return own_class(name, FaultKind, "fault kind")


def shorthand_config(cls: type[FaultKind], faults) -> ModelConfig | None:
    """The parameters a built-in kind's own key of ``faults`` gives it (``None``: the key is
    not there or not set)."""
    value = getattr(faults, cls.shorthand, None) if cls.shorthand else None
    if value is None:
        return None
    return cls.Config(**{cls.shorthand_field: list(value)}) if cls.shorthand_field else value


def entries(faults) -> list[tuple[str, dict[str, Any]]]:
    """The kinds a scenario's ``faults`` switches on, as ``(kind, parameters)``: those of the
    built-in kinds' shorthand keys that are set (registry order), then ``faults.kinds`` in
    its order."""
    out = [(cls.name, cfg.model_dump()) for cls in REGISTRY.values()
           if (cfg := shorthand_config(cls, faults)) is not None and cls.switched_on(cfg)]
    return out + [(e.kind, e.params()) for e in faults.kinds]


def build(name: str, params: dict[str, Any], ctx: Context) -> FaultKind:
    """The kind ``name`` (built in, or ``module.path:ClassName``) with its ``params``
    (one entry of :func:`entries`)."""
    cls = get_kind(name)
    kind = cls(cls.Config(**params), ctx)
    if not isinstance(getattr(cls, "name", None), str):
        kind.name = name  # a class of one's own need not name itself
    return kind
