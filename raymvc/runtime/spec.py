"""One run's parties, as the engine hands them over: :class:`RunSpec`.

The engine builds a :class:`RunSpec` once from the validated scenario and the prepared split
(:meth:`RunSpec.build`) and gives the same object to the server and to every client (in
process, or pickled to the Ray actors). The actors read it as it is: its configs are the
scenario's validated pydantic objects, never dumped to dicts and checked again. The method's
``Config`` is validated once, in the driver, and travels as its validated field values
(:class:`MethodConfig`), so that the spec unpickles in an actor that cannot import a
method of one's own yet; each party rebuilds its own copy after adding the search paths,
without validating it again (:meth:`RunSpec.method_config`). ``params`` (the mapping)
stays for what is shown and recorded.

The spec is read-only all the way down: its scenario sections are frozen pydantic models
(every section of a scenario is), and its mappings are :class:`FrozenMap` (lists inside
them become tuples), so that a party cannot change what another party, in the same
process, reads.

A model of one's own named in ``faults.availability`` travels as the scenario's
:class:`~raymvc.scenario.OwnAvailability` (its name and parameters): the model's module is
imported where it acts, after the party has added the scenario's search paths, so the spec
unpickles in an actor that cannot import that module yet.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..scenario.schema import ChannelCfg, DeviceClass, DevicesCfg, FaultsCfg, NetworkCfg, PartialWorkCfg, Scenario

__all__ = ["FrozenMap", "MethodConfig", "RunSpec", "deep_freeze"]


class FrozenMap(Mapping):
    """A read-only mapping that pickles (``types.MappingProxyType`` does not)."""

    __slots__ = ("_d",)

    def __init__(self, items: Mapping | Any = ()):
        object.__setattr__(self, "_d", dict(items))

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self) -> Iterator:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def __reduce__(self):
        return FrozenMap, (self._d,)

    __hash__ = None  # a mapping's equality, not its identity


def deep_freeze(x: Any) -> Any:
    """``x`` with every mapping a :class:`FrozenMap` and every list a tuple, all the way down
    (a scenario section, a frozen pydantic model, gets the same done to its fields in place:
    pydantic freezes a model's fields, not the lists they hold)."""
    from pydantic import BaseModel

    if isinstance(x, BaseModel):
        for name in type(x).model_fields:
            x.__dict__[name] = deep_freeze(x.__dict__[name])
        extra = x.__pydantic_extra__
        if extra:
            for name in list(extra):
                extra[name] = deep_freeze(extra[name])
        return x
    if isinstance(x, Mapping):
        return FrozenMap({k: deep_freeze(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return tuple(deep_freeze(v) for v in x)
    return x


def thawed(x: Any) -> Any:
    """A :func:`deep_freeze` undone: plain dicts and lists (for code that wants them)."""
    if isinstance(x, Mapping):
        return {k: thawed(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return [thawed(v) for v in x]
    return x


@dataclass(frozen=True)
class MethodConfig:
    """A method's ``Config`` as the driver validated it: its field values (the validated
    objects themselves, not a dump) and which of them were given. It crosses to an actor
    without the Config's class (nothing of the method's module is needed to receive it);
    :meth:`RunSpec.method_config` rebuilds the Config there with ``model_construct``, which
    validates nothing. A field value whose own class lives in a method's module of one's
    own would still need that module to unpickle: keep such values to plain types."""

    values: Mapping[str, Any]
    given: frozenset[str]

    @classmethod
    def seal(cls, cfg) -> MethodConfig:
        # the values keep their types (a list field stays a list in each party's copy)
        return cls(values=FrozenMap({name: copy.deepcopy(getattr(cfg, name)) for name in type(cfg).model_fields}),
                   given=frozenset(cfg.model_fields_set))

    def open(self, config_cls):
        """A fresh Config of ``config_cls`` (the method's), each party its own copy."""
        return config_cls.model_construct(_fields_set=set(self.given), **copy.deepcopy(dict(self.values)))


@dataclass(frozen=True)
class RunSpec:
    """Everything a party is built from (besides a client's shard and the transport)."""

    method: str
    params: Mapping[str, Any]  # the method's parameters; its Config checks them
    n_clients: int
    n_clusters: int
    seed: int
    channel: ChannelCfg
    faults: FaultsCfg
    network: NetworkCfg
    threads: int = 1
    search: tuple[str, ...] = ()  # where the driver found the method's (or a model's) module
    n_samples: int | None = None  # vertical splits: the rows every client indexes
    reply_timeout_s: float = 600.0
    evict_after: int = 3
    score_every: int = 0  # runtime.score_every: probe the model as it stands after every N-th round
    client_sizes: Mapping[int, int] = field(default_factory=dict)  # rows each client holds
    client_dims: Mapping[int, int] = field(default_factory=dict)  # the width of each client's first view
    trace: Mapping[int, list[tuple[float, float]]] | None = None  # an availability trace's intervals
    devices: DevicesCfg | None = None
    device_classes: Mapping[str, DeviceClass] | None = None
    config: MethodConfig | None = None  # the method's Config, validated in the driver

    def __post_init__(self) -> None:
        for name in ("params", "client_sizes", "client_dims", "trace", "device_classes"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, deep_freeze(value))

    @property
    def client_ids(self) -> list[int]:
        return list(range(self.n_clients))

    @property
    def partial_work(self) -> PartialWorkCfg | None:
        return self.faults.partial_work

    def method_config(self, proto):
        """This party's own copy of the method's Config: opened from the one the driver
        validated (a spec built by hand without one validates ``params`` here)."""
        return self.config.open(proto.config) if self.config is not None else proto.config(**thawed(self.params))

    @classmethod
    def build(cls, sc: Scenario, part, ds, search: tuple[str, ...] = ()) -> RunSpec:
        """The spec of a run of ``sc`` on the split ``part`` of ``ds`` (in the driver: the side
        files are read here, and the parties get what they hold)."""
        from ..scenario.sidefiles import availability_trace, device_classes

        def own(cfg):  # a copy of the section, read-only all the way down
            return None if cfg is None else deep_freeze(cfg.model_copy(deep=True))

        rt = sc.runtime
        ids = range(part.n_clients)
        return cls(method=sc.method, params=dict(sc.params), n_clients=part.n_clients, n_clusters=ds.n_clusters,
                   seed=sc.seed, channel=own(sc.channel), faults=own(sc.faults), network=own(sc.network),
                   threads=rt.threads,
                   search=tuple(search), n_samples=part.n_samples if part.kind == "vertical" else None,
                   reply_timeout_s=rt.reply_timeout_s, evict_after=rt.evict_after, score_every=rt.score_every,
                   client_sizes={c: part.shards[c].rows_held for c in ids},
                   client_dims={c: int(part.shards[c].views[0].shape[1]) for c in ids},
                   trace=availability_trace(sc), devices=own(sc.devices),
                   device_classes={k: own(v) for k, v in (device_classes(sc) or {}).items()} or None,
                   config=MethodConfig.seal(sc.protocol_config()))
