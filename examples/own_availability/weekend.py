"""An availability model outside the package: some clients are away at the weekend.

A scenario names it as ``faults.availability: {model: weekend:Weekend, ...}``; raymvc finds
this module beside the scenario file (as it finds a method of one's own), on Ray too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raymvc.availability import AvailabilityModel, ModelConfig


class Weekend(AvailabilityModel):
    """Rounds are days of a week: on days ``5`` and ``6`` (of 0-6) the clients of the
    ``away`` share (the first ones by id) are unavailable; every other round all are there."""

    name = "weekend:Weekend"

    class Config(ModelConfig):
        model: Literal["weekend:Weekend"]
        away: float = Field(default=0.5, ge=0.0, le=1.0, description="share of clients away at the weekend")
        days: list[int] = Field(default=[5, 6], description="the weekend's days of the week (0-6)")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        ids = sorted(ctx.client_ids)
        self.away = set(ids[: round(cfg.away * len(ids))])

    def unavailable(self, round: int, client: int) -> float:
        return 1.0 if round % 7 in self.cfg.days and client in self.away else 0.0
