"""Client selection: which clients the server asks in a round (docs/fault-models.md#client-selection).

``faults.sampling: {fraction: F, rule: NAME, ...}`` asks at most round(F x clients) of
them (at least one) each round; the others get no message and are ``not_sampled`` in the
round's record. A rule is one class: its parameters (``Config``, a pydantic model) and
``select(view)``, which returns the clients to ask from what the server knows when it
asks (:class:`View`): the round, the clients it could ask, how many at most, each
client's participation so far (asked, answered, missed, the virtual seconds of its last
answer), the rows each holds and the speed each device reported, and the round's
deadline. Never the labels, nor anything a real server could not see. Every random
choice comes from the stream (seed, SELECTION, round), so a rule decides the same on Ray
and in process.

Built-in rules are registered here (:data:`REGISTRY`); a scenario may name a rule of its
own by import path, ``rule: my_module:MyRule`` (a module beside the scenario file is found
as a method of one's own is). Adding a built-in rule is a class in this file (and its row
in docs/fault-models.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from . import streams
from .availability import ModelConfig
from .streams import stream


@dataclass(frozen=True)
class Seen:
    """What the server saw of one client so far."""

    asked: int = 0  # rounds it was sent a message in
    answered: int = 0
    missed: int = 0
    last_answered: int | None = None  # the last round it answered
    last_s: float | None = None  # virtual seconds its last answer took (device profiles or a network model)


@dataclass(frozen=True)
class View:
    """What a rule may read when the server selects the clients of ``round``."""

    seed: int
    round: int
    candidates: tuple[int, ...]  # the clients the server could ask (connected, the protocol addressed them)
    k: int  # at most this many
    clients: tuple[int, ...]  # every client of the run
    seen: dict[int, Seen] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)  # rows each client reported holding
    speed_s: dict[int, float] = field(default_factory=dict)  # each device's reported compute seconds (device profiles)
    deadline_s: float | None = None

    def rng(self) -> np.random.Generator:
        """The round's own stream for a rule's random choices."""
        return stream(self.seed, streams.SAMPLING, self.round)


class SelectionRule:
    """A rule of who is asked: ``Config`` declares its parameters; ``select`` decides."""

    name: ClassVar[str]
    Config: ClassVar[type[ModelConfig]]

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def select(self, view: View) -> list[int]:  # pragma: no cover - interface
        raise NotImplementedError


class SelectionError(ValueError):
    """A rule chose something that is not a set of the round's candidates."""


def checked(rule: SelectionRule, view: View) -> list[int]:
    """``rule.select(view)``, refused unless it is a non-empty list of distinct clients of the
    run (at most ``view.k``): anything else would ask clients that do not exist, or none,
    without a word. A chosen client that is no candidate (the protocol sent it nothing, or
    the server cannot reach it) is not asked or counts as missing, as without a rule."""
    name = getattr(rule, "name", type(rule).__name__)
    try:
        got = rule.select(view)
    except SystemExit as e:
        raise SelectionError(f"selection rule {name!r}: select(round={view.round}) called sys.exit({e.code!r})") from None
    ok = isinstance(got, (list, tuple, set, frozenset, np.ndarray))
    chosen = [int(c) for c in got] if ok and all(isinstance(c, (int, np.integer)) and not isinstance(c, bool)
                                                 for c in got) else None
    every = set(view.clients)
    if chosen is None or not chosen or len(set(chosen)) != len(chosen) or not set(chosen) <= every or len(chosen) > view.k:
        text = repr(got)
        raise SelectionError(f"selection rule {name!r}: select(round={view.round}) returned "
                             f"{text if len(text) <= 60 else text[:57] + '...'}; it must return 1 to {view.k} "
                             "distinct clients of the run")
    return sorted(chosen)


REGISTRY: dict[str, type[SelectionRule]] = {}


def register(cls: type[SelectionRule]) -> type[SelectionRule]:
    REGISTRY[cls.name] = cls
    return cls


@register
class Uniform(SelectionRule):
    """k clients drawn uniformly from all of the run's clients each round (one the protocol
    sent nothing is not asked; one the server cannot reach is missing): the default."""

    name = "uniform"

    class Config(ModelConfig):
        pass

    def select(self, view: View) -> list[int]:
        return [int(c) for c in view.rng().choice(sorted(view.clients), view.k, replace=False)]


def _order(view: View, key: dict[int, float], ascending: bool = True) -> list[int]:
    """The candidates sorted by ``key``, ties in a random order of the round's stream."""
    tie = view.rng().permutation(len(view.candidates))
    rank = {c: int(t) for c, t in zip(view.candidates, tie)}
    sign = 1.0 if ascending else -1.0
    return sorted(view.candidates, key=lambda c: (sign * key[c], rank[c]))


@register
class Deadline(SelectionRule):
    """After FedCS (Nishio and Yonetani, 2019): the server estimates each client's time for
    the round -- the virtual seconds its last answer took, else its device's reported
    compute seconds, else 0 (not yet seen: tried) -- and asks the k quickest whose estimate
    fits the deadline (``faults.deadline_s``; all of them without one), at least the
    quickest one. FedCS maximises the clients that fit; here k bounds them, as the fraction
    does for every rule."""

    name = "deadline"

    class Config(ModelConfig):
        margin: float = Field(default=1.0, gt=0.0, le=100.0,
                              description="a client fits when its estimate x margin is within the deadline")

    def select(self, view: View) -> list[int]:
        est = {c: _estimate(view, c) for c in view.candidates}
        order = _order(view, est)
        fits = [c for c in order if view.deadline_s is None or est[c] * self.cfg.margin <= view.deadline_s]
        return fits[: view.k] if fits else order[:1]


def _estimate(view: View, c: int) -> float:
    seen = view.seen.get(c)
    if seen is not None and seen.last_s is not None:
        return seen.last_s
    return view.speed_s.get(c, 0.0)


@register
class PowerOfChoice(SelectionRule):
    """After power-of-choice (Cho, Wang and Joshi, 2020): d = ceil(choices x k) candidates
    drawn uniformly, of which the k with the highest utility are asked. The paper's utility
    is a client's current local loss, which no message of the engine carries; here it is
    what the server sees: the rows a client holds (``by: rows``) or the share of the rounds
    it was asked in that it answered (``by: reliability``; 1 before it was asked)."""

    name = "power_of_choice"

    class Config(ModelConfig):
        choices: float = Field(default=2.0, ge=1.0, le=1000.0, description="candidates drawn per client asked")
        by: Literal["rows", "reliability"] = "rows"

    def select(self, view: View) -> list[int]:
        rng = view.rng()
        d = min(len(view.candidates), max(view.k, math.ceil(self.cfg.choices * view.k)))
        drawn = [int(c) for c in rng.choice(sorted(view.candidates), d, replace=False)]
        if self.cfg.by == "rows":
            util = {c: float(view.rows.get(c, 0)) for c in drawn}
        else:
            util = {c: (s.answered / s.asked if (s := view.seen.get(c)) is not None and s.asked else 1.0)
                    for c in drawn}
        return sorted(drawn, key=lambda c: -util[c])[: view.k]  # a stable sort: ties in the draw's order


# --------------------------------------------------------------------------- rules of one's own
def is_import_path(name: str) -> bool:
    return ":" in name and name not in REGISTRY


def get_rule(name: str) -> type[SelectionRule]:
    """The rule class for ``name``: a built-in name or ``module.path:ClassName``. Unknown: KeyError."""
    if name in REGISTRY:
        return REGISTRY[name]
    if not is_import_path(name):
        raise KeyError(f"unknown selection rule {name!r}; built in: {', '.join(REGISTRY)}, "
                       "or module.path:ClassName of your own")
    from .protocols import own_class

    return own_class(name, SelectionRule, "selection rule")


def build(rule: str, params: dict) -> SelectionRule:
    """The rule ``rule`` names, with its parameters (checked by its ``Config``)."""
    cls = get_rule(rule)
    return cls(cls.Config(**params))

