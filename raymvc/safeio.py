"""Bounded readers for the files raymvc reads back: JSON nested no deeper than a limit, CSV
tables with a field-size limit, UTF-8 checked and every row as wide as its header.

Every reader of a run, sweep, study or checkpoint file goes through these two functions, so
a file that was edited or forged -- a description nested 100,000 deep, a 1 GiB field, a
short row, bytes that are not UTF-8 -- ends in one :class:`SafeReadError` line that names
the problem, never in a ``RecursionError``, ``csv.Error`` or ``UnicodeDecodeError``.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

MAX_DEPTH = 64  # JSON nesting: raymvc's own files stay far below (a state tree ~12, a summary ~5)
MAX_FIELD = 1 << 20  # characters of one CSV field
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class SafeReadError(ValueError):
    """A file that cannot be read as what it should be; the message is one line."""


def json_depth(data: bytes | str) -> int:
    """How deep the arrays and objects of the JSON text ``data`` nest (strings skipped)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    b = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    if not b.size:
        return 0
    step = (np.isin(b, (0x5B, 0x7B)).astype(np.int64) - np.isin(b, (0x5D, 0x7D)).astype(np.int64))
    return int(max(np.cumsum(step).max(), 0))


def json_loads(data: bytes | str, *, max_depth: int = MAX_DEPTH, what: str = "JSON") -> Any:
    """``json.loads`` of text nested at most ``max_depth`` deep; a :class:`SafeReadError` otherwise."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise SafeReadError(f"{what}: not UTF-8 text") from None
    depth = json_depth(data)
    if depth > max_depth:
        raise SafeReadError(f"{what}: nested {depth} levels deep (at most {max_depth})")
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise SafeReadError(f"{what}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except (ValueError, RecursionError):
        raise SafeReadError(f"{what}: not valid JSON") from None


def csv_rows(data: bytes | str, *, what: str = "CSV", required: Iterable[str] = (),
             max_field: int = MAX_FIELD) -> list[dict[str, str]]:
    """The rows of a CSV table with a header, as dicts; every row as wide as the header, every
    field at most ``max_field`` characters, ``required`` columns present: a
    :class:`SafeReadError` (one line, naming the row) otherwise."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SafeReadError(f"{what}: not UTF-8 text (byte {e.start})") from None
    old = csv.field_size_limit()
    csv.field_size_limit(max_field)
    try:
        reader = csv.reader(io.StringIO(data, newline=""))
        header = next(reader, None)
        if header is None:
            return []
        if len(set(header)) != len(header):
            raise SafeReadError(f"{what}: a column is named twice in the header")
        missing = [c for c in required if c not in header]
        if missing:
            raise SafeReadError(f"{what}: no {missing[0]!r} column")
        rows = []
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise SafeReadError(f"{what}: line {reader.line_num} has {len(row)} fields, the header {len(header)}")
            rows.append(dict(zip(header, row)))
        return rows
    except csv.Error as e:
        raise SafeReadError(f"{what}: not a CSV table ({str(e)[:80]})") from None
    finally:
        csv.field_size_limit(old)


def confined(base: Path, rel: str | Path) -> Path | None:
    """``base / rel`` if ``rel`` is a relative path that stays inside ``base`` with no symbolic
    link on the way (the folder itself included); ``None`` otherwise."""
    rel = Path(str(rel))
    if not rel.parts or rel.is_absolute() or ".." in rel.parts:
        return None
    p = Path(base)
    for part in rel.parts:
        p = p / part
        if p.is_symlink():
            return None
    return p


def within(base: Path, path: Path) -> bool:
    """Whether ``path`` lies under ``base`` with no symbolic link between them."""
    try:
        rel = Path(path).relative_to(base)
    except ValueError:
        return False
    return confined(base, rel) is not None


def available_memory() -> int | None:
    """Bytes this process may still allocate: the kernel's ``MemAvailable``, or less under an
    address-space limit (``ulimit -v``); ``None`` where neither can be read."""
    import resource

    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        avail = soft if avail is None else min(avail, soft)
    return avail
