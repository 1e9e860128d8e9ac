"""The traffic ledger: one row per message, with totals per direction, client and round.

Every row on a path counts towards its totals whatever its status: a message that was
sent cost bandwidth even if it was dropped, late, rejected or lost. ``bytes_up`` are
wire bytes sent by clients (``src`` starting with ``"client"``), ``bytes_down`` wire
bytes sent by the server. MB means 10**6 bytes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from ..safeio import SafeReadError, json_loads

PATHS = ("protocol", "eval", "setup")
STATUSES = ("delivered", "dropped", "late", "rejected", "lost")
_CLIENT = re.compile(r"client:(\d+)")


@dataclass
class LedgerRow:
    """One message as the meter saw it."""

    round: int
    src: str
    dst: str
    kind: str
    path: str
    payload_bytes: int
    wire_bytes: int
    send_t: float
    arrive_t: float | None = None
    status: str = "delivered"
    data_bytes: int = 0  # array/scalar bytes without headers (see codec.data_bytes)

    def __post_init__(self) -> None:
        self.send_t = float(self.send_t)  # times are floats, so a row reads back as it was written
        if self.arrive_t is not None:
            self.arrive_t = float(self.arrive_t)
        if self.path not in PATHS:
            raise ValueError(f"ledger path must be one of {PATHS}, got {self.path!r}")
        if self.status not in STATUSES:
            raise ValueError(f"ledger status must be one of {STATUSES}, got {self.status!r}")


FIELD_NAMES = tuple(f.name for f in fields(LedgerRow))
_INT_FIELDS = ("round", "payload_bytes", "wire_bytes", "data_bytes")
_TEXT_FIELDS = ("src", "dst", "kind", "path", "status")


def client_id(party: str) -> int | None:
    """Return ``N`` for ``"client:N"``, else ``None``."""
    m = _CLIENT.fullmatch(party)
    return int(m.group(1)) if m else None


def _empty_totals() -> dict[str, Any]:
    return {"messages": 0, "data_bytes": 0, "payload_bytes": 0, "wire_bytes": 0, "bytes_up": 0,
            "bytes_down": 0, "mb_total": 0.0}


def _add(tot: dict[str, Any], row: LedgerRow) -> None:
    tot["messages"] += 1
    tot["payload_bytes"] += row.payload_bytes
    tot["data_bytes"] += row.data_bytes
    tot["wire_bytes"] += row.wire_bytes
    if row.src.startswith("client"):
        tot["bytes_up"] += row.wire_bytes
    if row.src == "server":
        tot["bytes_down"] += row.wire_bytes
    tot["mb_total"] = tot["wire_bytes"] / 1e6


class Ledger:
    """An append-only list of :class:`LedgerRow` with summaries."""

    def __init__(self) -> None:
        self.rows: list[LedgerRow] = []

    def __len__(self) -> int:
        return len(self.rows)

    def record(self, **fields: Any) -> LedgerRow:
        """Append a row built from keyword fields and return it."""
        row = LedgerRow(**fields)
        self.rows.append(row)
        return row

    def extend(self, rows: Iterable[LedgerRow]) -> None:
        """Append rows (for example the ledger of another process)."""
        for row in rows:
            if not isinstance(row, LedgerRow):
                raise TypeError(f"expected LedgerRow, got {type(row).__name__}")
            self.rows.append(row)

    def _select(self, path: str | None) -> Iterable[LedgerRow]:
        return (r for r in self.rows if path is None or r.path == path)

    def totals(self, path: str | None = "protocol") -> dict[str, Any]:
        """Message count, payload/wire bytes, up/down wire bytes and MB on ``path``.

        ``path=None`` sums every path.
        """
        tot = _empty_totals()
        for row in self._select(path):
            _add(tot, row)
        return tot

    def per_client(self, path: str | None = "protocol") -> dict[int, dict[str, int]]:
        """Per client id: ``up`` (wire bytes it sent), ``down`` (wire bytes sent to it)
        and ``messages`` (rows it took part in)."""
        out: dict[int, dict[str, int]] = {}
        for row in self._select(path):
            src, dst = client_id(row.src), client_id(row.dst)
            for cid in {src, dst} - {None}:
                out.setdefault(cid, {"up": 0, "down": 0, "messages": 0})["messages"] += 1
            if src is not None:
                out[src]["up"] += row.wire_bytes
            if dst is not None:
                out[dst]["down"] += row.wire_bytes
        return dict(sorted(out.items()))

    def per_round(self, path: str | None = "protocol") -> dict[int, dict[str, Any]]:
        """The :meth:`totals` of each round, keyed by round number."""
        out: dict[int, dict[str, Any]] = {}
        for row in self._select(path):
            _add(out.setdefault(row.round, _empty_totals()), row)
        return dict(sorted(out.items()))

    def to_columns(self) -> dict[str, np.ndarray]:
        """The rows as arrays, one per field (the text fields as codes into ``vocab``, a
        JSON list as UTF-8 bytes; ``arrive_t`` NaN and ``arrive_none`` where it is
        ``None``): what a checkpoint stores, encoded by the codec in one vectorised step."""
        rows, n = self.rows, len(self.rows)
        cols: dict[str, np.ndarray] = {f: np.fromiter((getattr(r, f) for r in rows), dtype=np.int64, count=n)
                                       for f in _INT_FIELDS}
        cols["send_t"] = np.fromiter((r.send_t for r in rows), dtype=np.float64, count=n)
        cols["arrive_none"] = np.fromiter((r.arrive_t is None for r in rows), dtype=np.bool_, count=n)
        cols["arrive_t"] = np.fromiter((math.nan if r.arrive_t is None else r.arrive_t for r in rows),
                                       dtype=np.float64, count=n)
        vocab: dict[str, int] = {}
        for f in _TEXT_FIELDS:
            cols[f] = np.fromiter((vocab.setdefault(getattr(r, f), len(vocab)) for r in rows), dtype=np.int64, count=n)
        cols["vocab"] = np.frombuffer(json.dumps(list(vocab)).encode(), dtype=np.uint8)
        return cols

    @classmethod
    def from_columns(cls, cols: Mapping[str, Any]) -> Ledger:
        """The ledger :meth:`to_columns` describes; ``ValueError`` (one line) for anything else."""
        names = (*_INT_FIELDS, *_TEXT_FIELDS, "send_t", "arrive_t", "arrive_none", "vocab")
        if set(cols) != set(names) or not all(isinstance(cols[k], np.ndarray) and cols[k].ndim == 1 for k in names):
            raise ValueError("not a ledger (its fields or their shapes differ)")
        n = len(cols["send_t"])
        kinds = {**dict.fromkeys((*_INT_FIELDS, *_TEXT_FIELDS), "i"), "send_t": "f", "arrive_t": "f",
                 "arrive_none": "b"}
        if any(cols[k].dtype.kind != kind or len(cols[k]) != n for k, kind in kinds.items()) \
                or cols["vocab"].dtype != np.uint8:
            raise ValueError("not a ledger (a column of the wrong type or length)")
        try:
            vocab = json_loads(cols["vocab"].tobytes(), max_depth=1, what="its vocabulary")
        except SafeReadError as e:
            raise ValueError(f"not a ledger ({e})") from None
        if not isinstance(vocab, list) or not all(isinstance(v, str) for v in vocab):
            raise ValueError("not a ledger (its vocabulary is not a list of strings)")
        for f in ("payload_bytes", "wire_bytes", "data_bytes"):
            if n and cols[f].min() < 0:
                raise ValueError(f"not a ledger ({f}: a negative byte count)")
        if n and cols["round"].min() < -1:
            raise ValueError("not a ledger (round: below -1)")
        for f in _TEXT_FIELDS:
            if n and (cols[f].min() < 0 or cols[f].max() >= len(vocab)):
                raise ValueError(f"not a ledger ({f}: a code outside its vocabulary)")
        out = cls()
        lists = {f: cols[f].tolist() for f in kinds}
        text = {f: [vocab[i] for i in cols[f].tolist()] for f in _TEXT_FIELDS}
        try:
            for i in range(n):
                out.rows.append(LedgerRow(
                    **{f: lists[f][i] for f in _INT_FIELDS}, **{f: text[f][i] for f in _TEXT_FIELDS},
                    send_t=lists["send_t"][i], arrive_t=None if lists["arrive_none"][i] else lists["arrive_t"][i]))
        except (TypeError, ValueError) as e:
            raise ValueError(f"not a ledger (row {i}: {e})") from None
        return out

    def to_dicts(self) -> list[dict[str, Any]]:
        """Rows as plain dicts, in recording order."""
        return [asdict(r) for r in self.rows]

    def csv_text(self) -> str:
        """All rows as CSV text with a header row; ``None`` becomes empty."""
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=FIELD_NAMES)
        writer.writeheader()
        for d in self.to_dicts():
            writer.writerow({k: ("" if v is None else v) for k, v in d.items()})
        return buf.getvalue()

    def write_csv(self, path: str) -> None:
        """Write all rows to ``path`` as CSV (:meth:`csv_text`)."""
        with open(path, "w", newline="", encoding="utf-8") as fh:
            fh.write(self.csv_text())
