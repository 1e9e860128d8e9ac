"""A run's ``summary.json`` as a typed record.

:class:`RunSummary` names the fields every reader needs (status, scores, traffic, faults,
provenance) and keeps the whole file behind them: it is also a read-only mapping, so
``summary["protocol_info"]`` reads any key the engine wrote. Sweeps, plots, pages and
:class:`raymvc.RunResult` read runs through it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .status import FINAL, FINISHED, Status, status_of


@dataclass(frozen=True)
class RunSummary(Mapping):
    """One run's summary. ``status`` is a :class:`~raymvc.status.Status`; ``metrics`` the
    scores (``None`` without labels); ``mb`` the protocol's traffic in MB; ``wall_s`` the
    run's wall time; ``faults`` the fault counts; ``errors`` one line per time some party's
    code raised."""

    name: str
    method: str
    seed: int | None
    status: Status
    rounds: int | None
    metrics: dict[str, float] | None
    mb: float | None
    wall_s: float | None
    faults: dict[str, Any]
    errors: list[str]
    error: str | None
    fingerprint: str
    code_version: str
    out_dir: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        """The typed record of a ``summary.json`` mapping; ``ValueError`` naming the key whose
        value has the wrong type (a hand-edited or foreign file)."""
        d = dict(d)
        _check_shape(d)
        comm = d.get("communication") or {}
        timing = d.get("timing") or {}
        return cls(name=str(d.get("name") or ""), method=str(d.get("method") or ""), seed=d.get("seed"),
                   status=status_of(d.get("status")), rounds=d.get("rounds"), metrics=d.get("metrics"),
                   mb=comm.get("mb_total"), wall_s=timing.get("wall_s"), faults=dict(d.get("faults") or {}),
                   errors=list(d.get("errors") or []), error=d.get("error"),
                   fingerprint=str(d.get("fingerprint") or ""), code_version=str(d.get("code_version") or ""),
                   out_dir=str(d.get("out_dir") or ""), raw=d)

    @classmethod
    def load(cls, run_dir: str | Path) -> RunSummary:
        """The summary of a run folder; :class:`~raymvc.results.ResultsError` if it is missing or corrupt."""
        from .results import SUMMARY_FILE, ResultsError, read_summary

        d = read_summary(run_dir)
        try:
            return cls.from_dict(d)
        except (AttributeError, TypeError, ValueError) as e:  # a summary.json of the wrong shape
            raise ResultsError(f"{Path(run_dir) / SUMMARY_FILE}: not a run summary ({e})") from None

    @classmethod
    def failed(cls, name: str, method: str, seed: int, error: str, out_dir: str | Path, fingerprint: str,
               status: Status = Status.FAILED) -> RunSummary:
        """The summary of a run that could not start or whose worker died: no labels, no traffic."""
        return cls.from_dict({"name": name, "method": method, "seed": seed, "status": Status(status).value,
                              "error": error, "rounds": 0, "metrics": None, "communication": {"mb_total": 0.0},
                              "faults": {}, "timing": {}, "out_dir": str(out_dir), "fingerprint": fingerprint})

    @property
    def finished(self) -> bool:
        """Labels came back (``completed`` or ``degraded``): the run enters means."""
        return self.status.value in FINISHED

    @property
    def final(self) -> bool:
        """Running it again with the same settings would end the same way (not ``interrupted``)."""
        return self.status.value in FINAL

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)

    # read-only mapping over the whole summary.json
    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _check_shape(d: dict) -> None:
    """The keys a reader of a summary relies on have the types the engine writes."""
    def bad(key: str, want: str) -> ValueError:
        return ValueError(f"{key}: expected {want}, got {type(_get(d, key)).__name__}")

    for key in ("seed", "rounds"):
        v = d.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise bad(key, "an integer")
    for key in ("metrics", "communication", "timing", "faults", "platform", "cell"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise bad(key, "a mapping")
    if not all(isinstance(k, str) and _number(v) for k, v in (d.get("metrics") or {}).items()):
        raise bad("metrics", "scores by name")
    for key in ("communication.mb_total", "timing.wall_s", "faults.dropped_replies", "faults.late_replies"):
        if not _number(_get(d, key)):
            raise bad(key, "a number")
    for key in ("errors", "faults.crashed_clients"):
        if _get(d, key) is not None and not isinstance(_get(d, key), list):
            raise bad(key, "a list")
    for key in ("name", "method", "error", "fingerprint", "code_version", "out_dir"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise bad(key, "text")


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


__all__ = ["RunSummary"]
