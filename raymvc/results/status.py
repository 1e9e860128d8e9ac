"""How a run ended: one vocabulary for the engine, sweeps, plots, pages and the API.

* ``completed`` -- every party did its work and every label came back;
* ``degraded`` -- finished with labels, but an injected fault cost messages or clients;
* ``failed`` -- the run could not finish (no labels, the federation fell apart);
* ``error`` -- some party's code raised (a bug, not a simulated fault);
* ``interrupted`` -- stopped by a signal; the same command carries on.

``Status`` is a ``str`` enum: a status read back from ``summary.json`` or ``sweep.csv``
compares equal to its member.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    COMPLETED = "completed"
    DEGRADED = "degraded"
    FAILED = "failed"
    ERROR = "error"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value


ALL = tuple(s.value for s in Status)  # sweep tables count runs in this order
FINISHED = frozenset({Status.COMPLETED.value, Status.DEGRADED.value})  # labels to score: enters means
FINAL = FINISHED | {Status.ERROR.value, Status.FAILED.value}  # running it again would end the same way
NOT_FINISHED = frozenset(ALL) - FINISHED  # counted at its grid point, never averaged


def status_of(text) -> Status:
    """A status as read from a file; anything unknown (or missing) is ``failed``."""
    try:
        return Status(str(text))
    except ValueError:
        return Status.FAILED


__all__ = ["Status", "ALL", "FINISHED", "FINAL", "NOT_FINISHED", "status_of"]
