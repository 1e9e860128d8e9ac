"""A fault kind outside the package: a battery that empties as the device works and
recharges while it rests.

A scenario names it as ``faults.kinds: [{kind: battery:Battery, drain: 0.3, ...}]``;
raymvc finds this module beside the scenario file (as it finds a method of one's own), on
Ray too. Every decision is a function of the seed, the round and the client alone: a
client's charge in round r is replayed from round 0 with draws of the kind's own stream
(:meth:`raymvc.kinds.FaultKind.rng`), so Ray and in-process runs agree.
"""

from __future__ import annotations

from pydantic import Field

from raymvc.kinds import FaultKind, ModelConfig


class Battery(FaultKind):
    """Each device starts between ``start_low`` and full. A round in which its charge is at
    least ``empty`` it works, and the work costs ``drain`` times a draw in [0.5, 1.5]; below
    ``empty`` it is away and recharges by ``charge``. Under ``saver`` it works in
    power-saving mode: its reply leaves ``saver_delay_s`` virtual seconds later."""

    name = "battery"

    class Config(ModelConfig):
        drain: float = Field(default=0.3, gt=0.0, le=1.0, description="charge a round of work costs (mean)")
        charge: float = Field(default=0.25, gt=0.0, le=1.0, description="charge a round of rest brings back")
        empty: float = Field(default=0.2, ge=0.0, lt=1.0, description="below this charge the device rests")
        start_low: float = Field(default=0.4, ge=0.0, le=1.0, description="the lowest charge a device starts with")
        saver: float = Field(default=0.5, ge=0.0, le=1.0, description="below this charge it works slowly")
        saver_delay_s: float = Field(default=2.0, ge=0.0, description="virtual seconds a slow reply leaves later")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self._levels: dict[int, list[float]] = {}

    def level(self, round: int, client: int) -> float:
        """The device's charge at the start of ``round``, replayed from round 0 (kept)."""
        levels = self._levels.setdefault(client, [])
        if not levels:
            start = self.rng(0, client, 1).uniform(self.cfg.start_low, 1.0)
            levels.append(float(start))
        while len(levels) <= round:
            r, now = len(levels) - 1, levels[-1]
            if now >= self.cfg.empty:
                now -= self.cfg.drain * self.rng(r, client).uniform(0.5, 1.5)
            else:
                now += self.cfg.charge
            levels.append(min(1.0, max(0.0, now)))
        return levels[round]

    def away(self, round: int, client: int) -> bool:
        return self.level(round, client) < self.cfg.empty

    def delay_s(self, round: int, client: int) -> float:
        return self.cfg.saver_delay_s if self.level(round, client) < self.cfg.saver else 0.0

    def record(self, round: int, clients: list[int]) -> dict:
        return {"resting": [c for c in clients if self.away(round, c)],
                "mean_charge": round_to(sum(self.level(round, c) for c in clients) / max(1, len(clients)))}


def round_to(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}f}")
