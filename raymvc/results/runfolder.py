"""A run's folder: the names of its files, and the one place that writes and reads them.

``raymvc run`` (through :func:`raymvc.driver.run_scenario`) writes a folder with
:meth:`RunFolder.writer`; the API's :class:`raymvc.RunResult`, sweeps, the conformance
checks and the study pages read it back through the same object, so a file's name and
format live here and in :mod:`raymvc.results.folder` alone.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.records import RoundRecord
from .folder import (
    ERRORS_FILE,
    LABELS_FILE,
    MESSAGES_FILE,
    ROUNDS_FILE,
    SCENARIO_FILE,
    SUMMARY_FILE,
    ResultsError,
    RunWriter,
    csv_value,
    jsonable,
    read_file,
    read_scenario,
    write_file,
)
from .summary import RunSummary


class RunFolder:
    """One run's folder (``DIR``). Writing: :meth:`writer` (the engine) and
    :meth:`write_summary` (a sweep's cell that never started). Reading: :meth:`summary`,
    :meth:`labels`, :meth:`rounds`, :meth:`ledger`, :meth:`scenario`; a missing optional
    file reads as empty, a missing or corrupt ``summary.json`` is a
    :class:`~raymvc.results.folder.ResultsError`. Links are never followed."""

    SUMMARY, ROUNDS, MESSAGES = SUMMARY_FILE, ROUNDS_FILE, MESSAGES_FILE
    SCENARIO, LABELS, ERRORS = SCENARIO_FILE, LABELS_FILE, ERRORS_FILE

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # -- writing --------------------------------------------------------------
    def writer(self, keep_rounds: int | None = None) -> RunWriter:
        """The writer a run fills as it goes (``keep_rounds``: resuming, keep that many rounds)."""
        return RunWriter(self.path, keep_rounds=keep_rounds)

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """``summary.json`` alone: the record of a run that could not start or whose worker died."""
        self.path.mkdir(parents=True, exist_ok=True)
        return write_file(self.path / self.SUMMARY, json.dumps(jsonable(dict(summary)), indent=2) + "\n")

    # -- reading --------------------------------------------------------------
    def has_summary(self) -> bool:
        """Whether a run ended here (a ``summary.json`` is there; :meth:`summary` refuses a link)."""
        p = self.path / self.SUMMARY
        return p.is_file() or p.is_symlink()

    def summary(self) -> RunSummary:
        return RunSummary.load(self.path)

    def _text(self, name: str) -> str | None:
        p = self.path / name
        if not p.is_file() and not p.is_symlink():
            return None
        try:
            return read_file(p).decode("utf-8")
        except UnicodeDecodeError:
            raise ResultsError(f"{p}: not UTF-8 text") from None

    def labels(self) -> np.ndarray:
        """``labels.csv``: one cluster per sample, -1 where no label came back (empty: no file)."""
        text = self._text(self.LABELS)
        if text is None:
            return np.zeros(0, dtype=np.int64)
        try:
            return np.array([int(r["cluster"]) for r in csv.DictReader(io.StringIO(text))], dtype=np.int64)
        except (KeyError, TypeError, ValueError, csv.Error):
            raise ResultsError(f"{self.path / self.LABELS}: corrupt (expected sample,cluster rows of integers)") from None

    def labels_sha256(self) -> str | None:
        """The SHA-256 of ``labels.csv`` as written (``None``: no file)."""
        p = self.path / self.LABELS
        if not p.is_file() and not p.is_symlink():
            return None
        return hashlib.sha256(read_file(p)).hexdigest()

    def rounds(self) -> list[RoundRecord]:
        """``rounds.jsonl``: one :class:`~raymvc.runtime.records.RoundRecord` per round."""
        text = self._text(self.ROUNDS)
        known = {f.name for f in fields(RoundRecord)}
        out = []
        for i, line in enumerate((text or "").splitlines()):
            if line.strip():
                try:
                    d = json.loads(line)
                    out.append(RoundRecord(**{k: v for k, v in d.items() if k in known}))
                except (ValueError, TypeError, AttributeError, RecursionError):  # AttributeError: not an object
                    raise ResultsError(f"{self.path / self.ROUNDS}: corrupt line {i + 1}") from None
        return out

    def ledger(self) -> list[dict[str, Any]]:
        """``messages.csv``: one dict of typed values per message."""
        text = self._text(self.MESSAGES)
        try:
            return [{k: csv_value(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(text or ""))]
        except (csv.Error, TypeError, ValueError) as e:  # TypeError: a row longer or shorter than the header
            raise ResultsError(f"{self.path / self.MESSAGES}: corrupt ({e})") from None

    def scenario(self) -> dict[str, Any]:
        """``scenario.yaml`` as a mapping (empty when it is missing or unreadable)."""
        return read_scenario(self.path)
