"""Typed records that cross the actor boundary: one round, and the end of a run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..channel import Ledger


@dataclass
class RoundRecord:
    """One line of ``rounds.jsonl``: who replied, who did not and why, bytes, times."""

    round: int
    replied: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    crashed: list[int] = field(default_factory=list)
    client_errors: list[int] = field(default_factory=list)
    partial_work: list[int] = field(default_factory=list)  # did only part of their local work (not a fault)
    not_sampled: list[int] = field(default_factory=list)  # left out by client sampling: no message (not a fault)
    messages: int = 0
    wire_bytes: int = 0
    payload_bytes: int = 0
    virtual_start_s: float = 0.0
    virtual_end_s: float = 0.0
    client_s: dict[int, float] | None = None  # with device profiles: each reply's virtual seconds in the round
    # with secure aggregation: per declared sum, its kind, contributors, why it failed and
    # whose sum a failed aggregation may still have disclosed to the server
    secure_sums: list[dict[str, Any]] | None = None
    stale: dict[int, int] | None = None  # faults.stale_replies: whose last reply stood in, and its age
    # faults.asynchronous: the step's buffer is ``replied`` (ages in ``stale``); who was sent the
    # round's message, whose update is still on its way, and whose came too old and was dropped
    buffered: dict[str, list[int]] | None = None
    kinds: dict[str, dict[str, Any]] | None = None  # faults.kinds: what each kind adds to the round, by kind
    wall_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    error: str | None = None
    # runtime.score_every: each client's labels with the model as it stands (not written as
    # they are), and what the driver makes of them: the run's metrics for those labels
    probe: dict[int, np.ndarray | None] | None = None
    scores: dict[str, float | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self if self.probe is None else replace(self, probe=None))
        del d["probe"]
        if d["error"] is None:
            del d["error"]
        for key in ("client_s", "secure_sums", "buffered", "kinds", "scores"):  # not in use: the line is as it always was
            if d[key] is None:
                del d[key]
        return d


@dataclass
class FaultCounts:
    dropped_replies: int = 0
    late_replies: int = 0
    rejected_messages: int = 0
    client_errors: int = 0

    def any(self) -> bool:
        return any(asdict(self).values())


@dataclass
class Participation:
    """How one client took part: rounds it was addressed in, answered, missed."""

    addressed: int = 0
    replied: int = 0
    missed: int = 0
    last_replied: int | None = None
    last_s: float | None = None  # virtual seconds its last answer took (client selection reads it)


@dataclass
class ServerState:
    """What the server keeps of a run from round to round, and exactly what its checkpoint
    holds of it (the ledger travels apart, as columns). The exchange and the round workflow
    share one instance; nothing else of theirs needs saving."""

    offline: set[int]  # never connected: disconnected, or unreachable at set-up
    participation: dict[int, Participation]
    round: int = 0
    clock: float = 0.0  # virtual seconds
    outgoing: dict[int, Any] = field(default_factory=dict)  # the protocol's messages for the next round
    done: Any = None  # the protocol's Done, once it ended the run
    status: str = "running"
    error: str | None = None
    crashed: set[int] = field(default_factory=set)
    counts: FaultCounts = field(default_factory=FaultCounts)
    client_errors: list[dict[str, Any]] = field(default_factory=list)  # every failure, in order
    errors: list[dict[str, Any]] = field(default_factory=list)  # the server's own code raised
    compute_s: float = 0.0
    timeouts: dict[int, int] = field(default_factory=dict)  # consecutive wall-clock timeouts per client
    evicted: list[int] = field(default_factory=list)
    last_replies: dict[int, tuple[int, Any]] = field(default_factory=dict)  # client -> (round, its last reply)
    # faults.asynchronous: client -> (virtual arrival, the round it was sent in, its update)
    in_flight: dict[int, tuple[float, int, Any]] = field(default_factory=dict)

    def ended(self) -> bool:
        return self.status in ("finished", "failed", "error")


SERVER_STATE = tuple(ServerState.__dataclass_fields__)


@dataclass
class RunEnd:
    """What the server node hands back when a run ends, however it ends."""

    status: str  # finished | failed | interrupted | running (stopped early)
    labels: np.ndarray | None = None
    predictions: dict[int, np.ndarray] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    rounds: int = 0
    virtual_s: float = 0.0
    compute_s: float = 0.0
    counts: FaultCounts = field(default_factory=FaultCounts)
    crashed: list[int] = field(default_factory=list)
    disconnected: list[int] = field(default_factory=list)
    client_errors: list[dict[str, Any]] = field(default_factory=list)
    # code that raised outside the clients' rounds: {party, phase, round, error (one line), traceback}
    errors: list[dict[str, Any]] = field(default_factory=list)
    participation: dict[int, Participation] = field(default_factory=dict)
    evicted: list[int] = field(default_factory=list)
    ledger: Ledger | None = None
    shared_bodies: int = 0  # broadcast bodies put in Ray's object store once for several actors
    unreported: list[dict[str, Any]] = field(default_factory=list)  # the latest batch of round records
