"""Availability models: which clients can be reached in a round (docs/fault-models.md).

A model is one class: its parameters (``Config``, a pydantic model whose ``model`` field is
its name) and ``unavailable(round, client)``, the probability that the client cannot be
reached in that round (0 or 1 for a model that decides a state). The fault plan draws a
coin at that probability from its dropout stream, so every model's decisions depend on
the seed, the round and the client only, on Ray and in-process alike.

Built-in models are registered here (:data:`REGISTRY`, a name per class); a scenario may
also name a model of its own by import path, ``model: my_module:MyModel`` (a module
beside the scenario file is found as a method of one's own is). Adding a built-in model
is a class in this file (and its row in docs/fault-models.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from . import streams
from .streams import stream

MAX_ROUNDS_SPAN = 1e9  # a stretch or a day, in rounds


class ModelConfig(BaseModel):
    """Base of a model's parameters (and of every section of a scenario): unknown keys and
    non-finite numbers are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Rate = Field(default=0.0, ge=0.0, le=1.0)


@dataclass
class Context:
    """What a model may read: the seed, the clients and what they hold."""

    seed: int
    client_ids: list[int]
    client_sizes: dict[int, int] | None = None  # samples each client holds
    client_dims: dict[int, int] | None = None  # the dimension of its view (vertical splits)
    trace: dict[int, np.ndarray] | None = None  # a trace's intervals, (k, 2) per client
    extra: dict[str, Any] = field(default_factory=dict)


class AvailabilityModel:
    """A model of who can be reached: ``Config`` declares its parameters."""

    name: ClassVar[str]
    Config: ClassVar[type[ModelConfig]]

    def __init__(self, cfg: ModelConfig, ctx: Context):
        self.cfg, self.ctx = cfg, ctx

    def unavailable(self, round: int, client: int) -> float:  # pragma: no cover - interface
        raise NotImplementedError


class AvailabilityError(ValueError):
    """An availability model answered something that is not a probability."""


def checked(model: AvailabilityModel, round: int, client: int) -> float:
    """``model.unavailable(round, client)``, refused unless it is a real number in [0, 1]:
    NaN, a negative number, infinity, None or a string would otherwise mean "always there"
    or "always away" without a word."""
    try:
        p = model.unavailable(round, client)
    except SystemExit as e:  # sys.exit in a model's code is its error, not the end of the process
        name = getattr(model, "name", type(model).__name__)
        raise AvailabilityError(f"availability model {name!r}: unavailable(round={round}, client={client}) called "
                                f"sys.exit({e.code!r})") from None
    ok = isinstance(p, (int, float, np.integer, np.floating)) and not isinstance(p, bool) and 0.0 <= float(p) <= 1.0
    if not ok:
        name = getattr(model, "name", type(model).__name__)
        raise AvailabilityError(f"availability model {name!r}: unavailable(round={round}, client={client}) returned "
                                f"{short_repr(p)}; it must return a probability in [0, 1]")
    return float(p)


def short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


REGISTRY: dict[str, type[AvailabilityModel]] = {}


def register(cls: type[AvailabilityModel]) -> type[AvailabilityModel]:
    REGISTRY[cls.name] = cls
    return cls


@register
class Iid(AvailabilityModel):
    """Each client is unavailable in each round with probability ``rate``: ``faults.dropout.rate``."""

    name = "iid"

    class Config(ModelConfig):
        model: Literal["iid"]
        rate: float = Rate

    def unavailable(self, round: int, client: int) -> float:
        return self.cfg.rate


class _PerClientTable(AvailabilityModel):
    """A probability per client, fixed for the run (``p_client``)."""

    p_client: dict[int, float]

    def unavailable(self, round: int, client: int) -> float:
        return self.p_client[client]


@register
class PerClient(_PerClientTable):
    """Each client's unavailability probability is drawn once from Beta(alpha, beta), alpha =
    mean x concentration, beta = (1 - mean) x concentration; then each round is a coin."""

    name = "per_client"

    class Config(ModelConfig):
        model: Literal["per_client"]
        mean: float = Field(gt=0.0, lt=1.0, description="mean unavailability probability over clients")
        concentration: float = Field(default=10.0, gt=0.0, description="alpha + beta: higher, clients more alike")

    def __init__(self, cfg, ctx: Context):
        super().__init__(cfg, ctx)
        ab = (cfg.mean * cfg.concentration, (1.0 - cfg.mean) * cfg.concentration)
        self.p_client = {c: float(stream(ctx.seed, streams.PER_CLIENT, c).beta(*ab)) for c in ctx.client_ids}


@register
class Markov(AvailabilityModel):
    """An on/off chain per client: on for mean_on rounds, off for mean_off rounds on average
    (geometric: p(on -> off) = 1 / mean_on, p(off -> on) = 1 / mean_off); round 0 from the
    stationary distribution. A client's state in round r comes from its first state and r
    transitions, each drawn from a stream keyed by (seed, tag, client, round)."""

    name = "markov"

    class Config(ModelConfig):
        model: Literal["markov"]
        mean_on: float = Field(ge=1.0, le=MAX_ROUNDS_SPAN, description="mean length of an available stretch, in rounds")
        mean_off: float = Field(ge=1.0, le=MAX_ROUNDS_SPAN,
                                description="mean length of an unavailable stretch, in rounds")

    def __init__(self, cfg, ctx: Context):
        super().__init__(cfg, ctx)
        self.chain: dict[int, list[bool]] = {}  # each client's states (on) so far, from round 0

    def unavailable(self, round: int, client: int) -> float:
        return 0.0 if self._on(round, client) else 1.0

    def _on(self, round: int, client: int) -> bool:
        a = self.cfg
        states = self.chain.setdefault(client, [])
        while len(states) <= round:
            u = stream(self.ctx.seed, streams.MARKOV, client, len(states)).random()
            if not states:  # the stationary distribution
                states.append(bool(u < 1.0 / (1.0 + a.mean_off / a.mean_on)))  # mean_on / (on + off), no overflow
            elif states[-1]:
                states.append(bool(u >= 1.0 / a.mean_on))
            else:
                states.append(bool(u < 1.0 / a.mean_off))
        return states[round]


@register
class Diurnal(AvailabilityModel):
    """Availability p(t) = base + amplitude x sin(2 pi (t / period + phase)), clipped to [0, 1],
    t the round index; each round is a coin at p(t)."""

    name = "diurnal"

    class Config(ModelConfig):
        model: Literal["diurnal"]
        period: float = Field(ge=1e-3, le=MAX_ROUNDS_SPAN, description="length of a day, in rounds")
        base: float = Field(default=0.5, ge=0.0, le=1.0, description="mean availability over the day")
        amplitude: float = Field(default=0.5, ge=0.0, le=1.0)
        phase: float | None = Field(default=None, ge=0.0, lt=1.0,
                                    description="share of a day every client is shifted by; null: each client "
                                                "draws its own, uniform in [0, 1)")

    def __init__(self, cfg, ctx: Context):
        super().__init__(cfg, ctx)
        self.phase = {c: float(stream(ctx.seed, streams.PHASE, c).random()) if cfg.phase is None
                      else cfg.phase for c in ctx.client_ids}  # each client's shift, in days

    def unavailable(self, round: int, client: int) -> float:
        a = self.cfg
        day = math.fmod(round / a.period + self.phase[client], 1.0)  # in [0, 1): sin never sees a huge angle
        on = a.base + a.amplitude * math.sin(2.0 * math.pi * day)
        return 1.0 - min(1.0, max(0.0, on))


def _size_rate(rate: float, mean: float, size: float, strength: float) -> float:
    """``min(1, rate x (mean / size) ** strength)``, computed in logs (no overflow); size 0: 1."""
    if rate <= 0:
        return 0.0
    if size <= 0:
        return 1.0
    log_p = math.log(rate) + strength * (math.log(mean) - math.log(size))
    return 1.0 if log_p >= 0.0 else math.exp(log_p)


@register
class Data(_PerClientTable):
    """Unavailability tied to what a client holds: p_c = rate x (mean size / size_c) ** strength,
    clipped to [0, 1]; size is the client's number of samples or its view's dimension."""

    name = "data"

    class Config(ModelConfig):
        model: Literal["data"]
        by: Literal["samples", "dimension"] = "samples"
        rate: float = Rate
        strength: float = Field(default=1.0, ge=0.0, le=100.0, description="0: every client at rate")

    def __init__(self, cfg, ctx: Context):
        super().__init__(cfg, ctx)
        held = ctx.client_sizes if cfg.by == "samples" else ctx.client_dims
        if not held or any(c not in held for c in ctx.client_ids):
            raise ValueError(f"availability model data by {cfg.by} needs every client's "
                             f"{'size' if cfg.by == 'samples' else 'dimension'}")
        mean = float(np.mean([held[c] for c in ctx.client_ids]))
        self.p_client = {c: _size_rate(cfg.rate, mean, held[c], cfg.strength) for c in ctx.client_ids}


def _merged(intervals) -> tuple[np.ndarray, np.ndarray]:
    """Half-open intervals ``[start, end)`` sorted and merged where they overlap or touch:
    (starts, ends), both increasing, so one binary search finds the interval of a time."""
    if not len(intervals):
        return np.zeros(0), np.zeros(0)
    a = np.asarray(intervals, dtype=np.float64).reshape(-1, 2)
    a = a[np.argsort(a[:, 0], kind="stable")]
    reach = np.maximum.accumulate(a[:, 1])
    new = np.ones(len(a), dtype=bool)
    new[1:] = a[1:, 0] > reach[:-1]  # a gap before it: a new merged interval starts here
    groups = np.cumsum(new) - 1
    ends = np.zeros(int(groups[-1]) + 1)
    np.maximum.at(ends, groups, a[:, 1])
    return a[new, 0], ends


@register
class Trace(AvailabilityModel):
    """Availability read from a CSV of ``client,start_s,end_s`` intervals (see
    :func:`raymvc.scenario.read_trace`): round r takes place at r x round_s seconds."""

    name = "trace"

    class Config(ModelConfig):
        model: Literal["trace"]
        path: str = Field(description="the CSV, relative to the scenario file")
        round_s: float = Field(default=1.0, gt=0.0, description="round r takes place at r x round_s seconds")

    def __init__(self, cfg, ctx: Context):
        super().__init__(cfg, ctx)
        self._spans: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # each client's merged intervals

    def unavailable(self, round: int, client: int) -> float:
        return 0.0 if self._on(client, round * self.cfg.round_s) else 1.0

    def _on(self, client: int, t: float) -> bool:
        """Whether ``t`` lies in one of ``client``'s intervals: a binary search in its merged,
        sorted intervals (built once per client)."""
        spans = self._spans.get(client)
        if spans is None:
            spans = self._spans[client] = _merged((self.ctx.trace or {}).get(client, ()))
        starts, ends = spans
        i = int(np.searchsorted(starts, t, side="right")) - 1
        return i >= 0 and t < ends[i]


# --------------------------------------------------------------------------- models of one's own
def is_import_path(name: str) -> bool:
    """``module:Class`` names a model outside this registry."""
    return ":" in name and name not in REGISTRY


def get_model(name: str) -> type[AvailabilityModel]:
    """The model class for ``name``: a built-in name or ``module.path:ClassName`` (found as a
    method of one's own is: importable, or beside a scenario file). Unknown: KeyError."""
    if name in REGISTRY:
        return REGISTRY[name]
    if not is_import_path(name):
        raise KeyError(f"unknown availability model {name!r}; built in: {', '.join(REGISTRY)}, "
                       "or module.path:ClassName of your own")
    from .protocols import own_class

    return own_class(name, AvailabilityModel, "availability model")


def build(cfg: BaseModel, ctx: Context) -> AvailabilityModel:
    """The model a scenario's ``faults.availability`` names, with its parameters."""
    cls = get_model(cfg.model)
    params = cfg if isinstance(cfg, cls.Config) else cls.Config(**cfg.model_dump())
    return cls(params, ctx)
