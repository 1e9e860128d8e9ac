"""Seeded fault plan, the one place faults are injected, and the virtual network model.

Every random fault decision comes from the scenario seed through its own stream
(``stream(seed, tag, round, client)``, :mod:`raymvc.streams`), so whether client 3 drops out of round
7 does not depend on how many other draws happened before: runs are reproducible and
the Ray and in-process backends see the same faults.

What a fault means (the same on both backends):

* **dropout** (``faults.dropout.rate``, an availability model, or scheduled by
  ``faults.drop``, the fault kind ``drop``, as any kind's ``away`` hook): the server's
  message for the round is sent -- its bytes count, its ledger row says ``dropped`` --
  but the client goes offline before acting on it: it does
  not process the message and sends no reply. Its state stays as it was; it is back the
  next round unless it drops again. Counted in ``dropped_replies``.
* **straggler**: the reply arrives ``delay`` virtual seconds later; past
  ``faults.deadline_s`` it is ``late`` and treated as missing (``late_replies``).
* **crash** (the fault kind ``crash``, or any kind's ``crashes`` hook): at the start of the
  round the client's actor is killed (``ray.kill``); it never answers again
  (``crashed_clients``).
* **disconnect** (the fault kind ``disconnect``, or any kind's ``offline`` hook): the client
  never connects; it is addressed by no message.
* **not sampled** (``faults.sampling``, horizontal methods): each round the server asks
  only a seeded share of the clients (:meth:`FaultPlan.sampled`); the others get no
  message that round and the server's step sees them as missing. Not a fault: counted in
  no fault total, listed as ``not_sampled`` in ``rounds.jsonl``.
* **partial work** (``faults.partial_work``, the fault kind ``partial_work`` of
  :mod:`raymvc.kinds`, as any kind's ``work`` hook): the client acts on the message and
  replies, but after only the share ``work`` of its local work (``ClientContext.work``);
  methods with local epochs or steps honour it, closed-form ones ignore it. Decided by
  :func:`work_share`, which the client's node calls for itself (the draw depends on the
  seed, client and round only, so it is the plan's on either backend); the server's plan
  records it (``partial_work`` in ``rounds.jsonl``). Not a missing reply.

Availability (``faults.availability``, docs/fault-models.md) gives each client and round
a probability of being unavailable (:meth:`FaultPlan.unavailable`); an unavailable client
is a dropout. ``iid`` is ``dropout.rate``; ``per_client`` and ``data`` fix a probability
per client, ``diurnal`` one per client and round; the Bernoulli draw of every model is
the dropout stream's. ``markov`` and ``trace`` decide a state per round (probability 0
or 1): a Markov client's state in round r comes from its first state and r transitions,
each drawn from a stream keyed by (seed, tag, client, round), so it depends on no other
client and on nothing but the round asked.

Device profiles (``devices``, :class:`DeviceProfiles`) give each client its own speed,
links and latency: a reply then leaves after the client's downlink, its nominal compute
time and any straggler delay, and travels its own uplink; the deadline acts on that total.
Without them every link is :class:`Network` and compute takes no virtual time.

A round may hold more than one exchange (secure aggregation adds two: masked input
and unmasking). Exchange ``sub`` > 0 of a round draws delays from streams of their own
(``[seed, tag, round, client, sub]``). A dropout rate ``p`` is the chance a client misses a
round, whatever the round holds: one draw at ``p`` decides whether it goes, and under
secure aggregation a second draw of the same stream decides in which of the three
exchanges, with the chances three draws of ``1 - (1 - p)^(1/3)`` in a row would give
(:meth:`FaultPlan.leaves_at`). A 10-client run at ``p = 0.2`` keeps about 8 clients to the
end of a round (the layer's default threshold needs 6), where ``p`` per exchange would
keep about 5; a round with no secure sum (one exchange) loses a client with ``p`` too. A
scheduled drop and a crash take effect in the round's first exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import availability, kinds, selection, streams
from ..kinds import draw_delay
from ..scenario import DEVICE_QUANTITIES, DeviceClass, DevicesCfg, FaultsCfg, NetworkCfg
from ..streams import stream


def work_share(fault_kinds, round: int, client: int) -> float:
    """The share of its local work ``client`` does in ``round``: the least any of
    ``fault_kinds`` (:mod:`raymvc.kinds`, ``partial_work`` among them) allows, 1 without."""
    share = 1.0
    for k in fault_kinds:
        share = min(share, kinds.work(k, round, client))
    return share


def build_kinds(cfg: FaultsCfg, ctx: availability.Context) -> list:
    """The fault kinds ``faults`` switches on (its built-in kinds' own keys, then
    ``faults.kinds``), built once per party (each decides alone)."""
    return [kinds.build(name, params, ctx) for name, params in kinds.entries(cfg)]


@dataclass
class FaultPlan:
    """Which clients fail how, decided once from the seed."""

    cfg: FaultsCfg
    client_ids: list[int]
    seed: int
    client_sizes: dict[int, int] | None = None  # samples each client holds (availability model data)
    client_dims: dict[int, int] | None = None  # its view's dimension (data, by: dimension)
    trace: dict[int, np.ndarray] | None = None  # availability intervals (model trace): (k, 2) per client
    exchanges: int = 1  # exchanges in a round (3 with secure aggregation): the round's dropout is split over them

    def __post_init__(self) -> None:
        n = len(self.client_ids)
        frac = self.cfg.sampling.fraction if self.cfg.sampling is not None else 1.0
        self.n_sampled = max(1, int(round(frac * n))) if n else 0  # clients asked per round (sampling)
        self._rule = None  # faults.sampling's rule, built on first use
        ctx = availability.Context(self.seed, list(self.client_ids), self.client_sizes, self.client_dims, self.trace)
        a = self.cfg.availability
        self.availability = None if a is None else availability.build(a, ctx)
        self.kinds = build_kinds(self.cfg, ctx)  # faults.kinds and the kinds' own keys
        # never connected (faults.disconnect, or a kind's offline hook): decided once
        self.disconnected: set[int] = {c for c in self.client_ids if any(kinds.offline(k, c) for k in self.kinds)}

    @property
    def p_client(self) -> dict[int, float]:
        """Each client's fixed unavailability (models per_client and data; empty otherwise)."""
        return dict(getattr(self.availability, "p_client", {}))

    def unavailable(self, round: int, client: int) -> float:
        """The probability that ``client`` is unavailable in ``round``: the availability
        model's (0 or 1 for markov and trace), else ``faults.dropout.rate``."""
        if self.availability is None:
            return self.cfg.dropout.rate
        return availability.checked(self.availability, round, client)

    def dropped(self, round: int, client: int, sub: int = 0, exchanges: int | None = None) -> bool:
        """Whether ``client`` misses exchange ``sub`` of ``round``; ``exchanges``: how many the
        round may have (default: the plan's, 3 under secure aggregation; 1 for a round known to
        carry no secure sum, such as the inference round)."""
        leaves = self.leaves_at(round, client, self.exchanges if exchanges is None else exchanges)
        return leaves == sub

    def leaves_at(self, round: int, client: int, exchanges: int | None = None) -> int | None:
        """The exchange of ``round`` in which ``client`` goes away (None: it stays the round).

        Whether it goes is one draw at the round's whole rate ``p``, whatever the round holds;
        with ``exchanges`` > 1 a second draw of the same stream picks the exchange, with the
        chances of ``exchanges`` draws of ``1 - (1 - p)^(1/exchanges)`` one after the other.
        A client that would leave in a later exchange of a round that turns out to have none
        (no secure sum) loses its reply of the first (:meth:`RoundWorkflow <raymvc.runtime.
        rounds.RoundWorkflow>` drops it), so every round loses a client with chance ``p``."""
        if any(kinds.away(k, round, client) for k in self.kinds):  # a fault kind keeps it away: the whole round
            return 0
        p = self.unavailable(round, client)
        if p <= 0:
            return None
        rng = stream(self.seed, streams.DROPOUT, round, client)
        if not rng.random() < p:
            return None
        n = self.exchanges if exchanges is None else exchanges
        if n <= 1 or p >= 1:
            return 0
        q = 1.0 - (1.0 - p) ** (1.0 / n)
        w = np.array([(1.0 - q) ** k * q for k in range(n)])
        return int(np.searchsorted(np.cumsum(w / w.sum()), rng.random(), side="right").clip(0, n - 1))

    def delay(self, round: int, client: int, sub: int = 0) -> float:
        """The virtual seconds the fault kinds (``stragglers`` among them) add to ``client``'s
        reply in exchange ``sub`` of ``round``."""
        return sum(kinds.exchange_delay_s(k, round, client, sub) for k in self.kinds) if self.kinds else 0.0

    def sampled(self, round: int, candidates=None, seen: dict | None = None,
                speed_s: dict[int, float] | None = None) -> set[int] | None:
        """The clients asked in ``round`` under ``faults.sampling`` (``None``: all of them):
        at most round(fraction x clients), at least one, as its rule chooses among
        ``candidates`` (default: every client) from what the server saw (``seen``: client ->
        :class:`raymvc.selection.Seen`; ``speed_s``: the devices' reported compute seconds)."""
        s = self.cfg.sampling
        if s is None or not self.client_ids or (s.fraction >= 1.0 and s.rule == "uniform"):
            return None
        if self._rule is None:
            self._rule = selection.build(s.rule, s.params())
        cands = tuple(sorted(self.client_ids if candidates is None else candidates))
        if not cands:
            return set()
        view = selection.View(seed=self.seed, round=round, candidates=cands, k=self.n_sampled,
                              clients=tuple(sorted(self.client_ids)), seen=dict(seen or {}),
                              rows=dict(self.client_sizes or {}), speed_s=dict(speed_s or {}),
                              deadline_s=self.cfg.deadline_s)
        return set(selection.checked(self._rule, view))

    def work(self, round: int, client: int) -> float:
        """The share of its local work ``client`` does in ``round`` (:func:`work_share`)."""
        return work_share(self.kinds, round, client)

    def kind_records(self, round: int) -> dict[str, dict] | None:
        """What each fault kind adds to the round's record, by kind (None where none adds anything)."""
        ids = sorted(self.client_ids)
        out = {k.name: rec for k in self.kinds if (rec := kinds.record(k, round, ids))}
        return out or None

    def crashes_now(self, round: int) -> list[int]:
        """The clients whose actors are killed at the start of ``round`` (``faults.crash``, or
        a kind's crashes hook)."""
        return sorted(c for c in self.client_ids if any(kinds.crashes(k, round, c) for k in self.kinds))


class Injector:
    """Every fault decision of a round, asked for in one place by the server node.

    ``Injector(None)`` injects nothing (the evaluation path).
    """

    def __init__(self, plan: FaultPlan | None, sub: int = 0, exchanges: int | None = None):
        self.plan = plan
        self.sub = sub
        self.exchanges = exchanges  # None: the plan's count
        self.deadline = plan.cfg.deadline_s if plan is not None else None

    def single(self) -> Injector:
        """The decisions of a round of one exchange (no secure sum follows): its dropout is
        the round's whole rate, not a share of it."""
        other = Injector(self.plan, self.sub, exchanges=1)
        other.deadline = self.deadline
        return other

    def at(self, sub: int) -> Injector:
        """The decisions of the round's exchange number ``sub`` (0: the first)."""
        return Injector(self.plan, sub)

    def without_deadline(self) -> Injector:
        """The same decisions with no deadline (a buffered step waits for its buffer instead)."""
        other = Injector(self.plan, self.sub)
        other.deadline = None
        return other

    def crashes(self, round: int) -> list[int]:
        return self.plan.crashes_now(round) if self.plan is not None and self.sub == 0 else []

    def dropped(self, round: int, client: int) -> bool:
        if self.plan is None:
            return False
        if self.exchanges is None:  # the plan's count (the usual case)
            return self.plan.dropped(round, client, self.sub)
        return self.plan.dropped(round, client, self.sub, exchanges=self.exchanges)

    def delay(self, round: int, client: int) -> float:
        return self.plan.delay(round, client, self.sub) if self.plan is not None else 0.0

    def late(self, arrive: float, t0: float) -> bool:
        return self.deadline is not None and arrive > t0 + self.deadline

    def round_end(self, end: float, t0: float, anyone_missing: bool) -> float:
        """The server waits until the deadline when a reply is missing."""
        if self.deadline is not None and anyone_missing:
            return max(end, t0 + self.deadline)
        return end


@dataclass
class Network:
    """Transfer time of a message: latency + bytes / bandwidth (virtual seconds)."""

    cfg: NetworkCfg

    def transfer_s(self, nbytes: int) -> float:
        t = self.cfg.latency_ms / 1000.0
        if self.cfg.bandwidth_mbps:
            t += nbytes * 8.0 / (self.cfg.bandwidth_mbps * 1e6)
        return t


@dataclass
class Device:
    """One client's device: compute speed, links (Mbit/s; None: no bytes term) and latency (ms)."""

    speed: float = 1.0
    up_mbps: float | None = None
    down_mbps: float | None = None
    latency_ms: float = 0.0
    cls: str | None = None  # its class in a profile file


def _link_s(nbytes: int, mbps: float | None, latency_ms: float) -> float:
    t = latency_ms / 1000.0
    if mbps:
        t += nbytes * 8.0 / (mbps * 1e6)
    return t


@dataclass
class DeviceProfiles:
    """Every client's :class:`Device`, decided once from the seed (``devices`` in a scenario).

    A client's time in a round's first exchange is downlink + compute + uplink::

        down_s    = latency + bytes_down / down bandwidth
        compute_s = base_compute_s x (samples_c / mean samples, with by_samples) x work / speed
        up_s      = latency + bytes_up / up bandwidth

    with the bytes the engine metered for that client's messages and ``work`` the share of
    its local work (:meth:`FaultPlan.work`, 1 without partial work). No wall-clock time
    enters. A quantity given as a distribution is drawn once per client from the stream
    ``(seed, tag, client, quantity)``; classes are dealt as round(share x clients), largest
    remainders first, over a permutation of the clients from ``(seed, tag)``.
    """

    cfg: DevicesCfg
    client_ids: list[int]
    seed: int
    network: NetworkCfg
    classes: dict[str, DeviceClass] | None = None
    client_sizes: dict[int, int] | None = None

    def __post_init__(self) -> None:
        ids = sorted(self.client_ids)
        if self.classes:
            self.devices = self._deal(ids)
        else:
            default = {"speed": 1.0, "up_mbps": self.network.bandwidth_mbps,
                       "down_mbps": self.network.bandwidth_mbps, "latency_ms": self.network.latency_ms}
            self.devices = {}
            for c in ids:
                values = {}
                for q, name in enumerate(DEVICE_QUANTITIES):
                    v = getattr(self.cfg, name)
                    if v is None:
                        v = default[name]
                    elif not isinstance(v, (int, float)):  # a DeviceDraw
                        v = draw_delay(v, stream(self.seed, streams.DEVICE, c, q))
                        if name != "latency_ms":  # a uniform draw of exactly 0 would stop the clock
                            v = max(v, 1e-9)
                    values[name] = None if v is None else float(v)
                self.devices[c] = Device(**values)
        sizes = self.client_sizes or {}
        mean = float(np.mean([sizes.get(c, 0) for c in ids])) if ids else 0.0
        self.scale = {c: (sizes.get(c, 0) / mean if self.cfg.by_samples and mean > 0 else 1.0) for c in ids}

    def _deal(self, ids: list[int]) -> dict[int, Device]:
        n = len(ids)
        shares = list(self.cfg.classes.items())
        counts = [math.floor(share * n) for _, share in shares]
        by_remainder = sorted(range(len(shares)), key=lambda i: -(shares[i][1] * n - counts[i]))
        for i in by_remainder[: n - sum(counts)]:
            counts[i] += 1
        order = [int(c) for c in stream(self.seed, streams.DEVICE_CLASS).permutation(ids)]
        out, at = {}, 0
        for (name, _), k in zip(shares, counts):
            d = self.classes[name]
            for c in order[at:at + k]:
                out[c] = Device(d.speed, d.up_mbps, d.down_mbps, d.latency_ms, cls=name)
            at += k
        return out

    def down_s(self, client: int, nbytes: int) -> float:
        d = self.devices[client]
        return _link_s(nbytes, d.down_mbps, d.latency_ms)

    def up_s(self, client: int, nbytes: int) -> float:
        d = self.devices[client]
        return _link_s(nbytes, d.up_mbps, d.latency_ms)

    def compute_s(self, client: int, work: float = 1.0) -> float:
        return self.cfg.base_compute_s * self.scale[client] * work / self.devices[client].speed
