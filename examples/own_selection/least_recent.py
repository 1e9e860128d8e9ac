"""A client-selection rule outside the package: ask the clients asked least recently.

A scenario names it as ``faults.sampling: {fraction: F, rule: least_recent:LeastRecent}``;
raymvc finds this module beside the scenario file (as it finds a method of one's own), on
Ray too. The rule reads only what the server saw (:class:`raymvc.selection.View`).
"""

from __future__ import annotations

from pydantic import Field

from raymvc.selection import ModelConfig, SelectionRule, View


class LeastRecent(SelectionRule):
    """Round robin with a memory: the k candidates whose last answer is oldest (never
    answered first); with ``skip_missed``, a client that missed more rounds than it answered
    waits one round in every two."""

    name = "least_recent:LeastRecent"

    class Config(ModelConfig):
        skip_missed: bool = Field(default=False, description="rest clients that miss more often than they answer")

    def select(self, view: View) -> list[int]:
        def last(c: int) -> int:
            seen = view.seen.get(c)
            return -1 if seen is None or seen.last_answered is None else seen.last_answered

        pool = list(view.candidates)
        if self.cfg.skip_missed and view.round % 2:
            rested = [c for c in pool if (s := view.seen.get(c)) is not None and s.missed > s.answered]
            pool = [c for c in pool if c not in rested] or pool
        return sorted(pool, key=lambda c: (last(c), c))[: view.k]
