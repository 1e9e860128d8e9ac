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

from .folder import SUMMARY_FILE, ResultsError, read_summary
from .status import FINAL, FINISHED, Status, status_of


@dataclass(frozen=True)
class RunSummary(Mapping):
    """One run's summary. ``status`` is a :class:`~raymvc.results.status.Status`; ``metrics`` the
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
        """The summary of a run folder; :class:`~raymvc.results.folder.ResultsError` if it is missing or corrupt."""
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


def _integer(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


# what the readers of a summary rely on: (keys, what each must be, its test); a nested key
# is named by its dotted path, as :func:`~raymvc.results.folder.flatten` writes it
_SHAPE = (
    (("seed", "rounds"), "an integer", _integer),
    (("metrics", "communication", "timing", "faults", "platform", "cell"), "a mapping",
     lambda v: v is None or isinstance(v, dict)),
    (("communication.mb_total", "timing.wall_s", "faults.dropped_replies", "faults.late_replies"), "a number",
     _number),
    (("errors", "faults.crashed_clients"), "a list", lambda v: v is None or isinstance(v, list)),
    (("name", "method", "error", "fingerprint", "code_version", "out_dir"), "text",
     lambda v: v is None or isinstance(v, str)),
)


def _at(d: dict, dotted: str) -> Any:
    """The value at a dotted path of nested mappings (None where a step is missing)."""
    v: Any = d
    for part in dotted.split("."):
        if not isinstance(v, dict):
            return None
        v = v.get(part)
    return v


def _check_shape(d: dict) -> None:
    """``ValueError`` naming the first key whose value is not of the type the engine writes."""
    for keys, want, ok in _SHAPE:
        for key in keys:
            v = _at(d, key)
            if not ok(v):
                raise ValueError(f"{key}: expected {want}, got {type(v).__name__}")
    if not all(isinstance(k, str) and _number(v) for k, v in (d.get("metrics") or {}).items()):
        raise ValueError("metrics: expected scores by name")


__all__ = ["RunSummary"]
