"""Text tables as data: ``.csv`` / ``.tsv`` files, one view each.

``data.path`` may name one such file (one view), a list of them (one view per file,
rows in the same sample order), or a folder whose ``.csv``/``.tsv`` files are the views
in name order. A first row with text in a feature column is a header (so is text in the
label column above numeric labels); a UTF-8 byte-order mark is dropped. ``data.label_column``
names the column of ground-truth labels: a header name (taken from every file whose
header has it; they must agree), or a 0-based column index (of the first file); without
it every column is a feature and the data counts as unlabelled. An empty cell
is a missing value: a row empty throughout marks the view absent for that sample, any
other empty or non-numeric cell is an error naming the file, row and column.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

TABLE_SUFFIXES = (".csv", ".tsv")


def table_files(path: Path) -> list[Path]:
    """The table files a folder holds, in name order."""
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)


def _number(cell: str) -> float | None:
    s = cell.strip()
    if not s:
        return np.nan
    try:
        return float(s)
    except ValueError:
        return None


def _is_header(rows: list[list[str]], label_column: str | int | None) -> bool:
    """Whether the first row names the columns. A text cell in a feature column makes it a
    header; with a label column given by index, text there alone does only when the label
    cells below are numbers (else it is a header-less file with text labels: its first row
    is a sample, never dropped)."""
    first = rows[0]
    j = None
    if label_column is not None and (not isinstance(label_column, str) or label_column.lstrip("-").isdigit()):
        j = int(label_column) % len(first) if -len(first) <= int(label_column) < len(first) else None
    if any(_number(c) is None for k, c in enumerate(first) if k != j):
        return True
    if j is None or _number(first[j]) is not None:
        return False
    return all(len(r) > j and _number(r[j]) is not None for r in rows[1:])


def read_table(path: Path, label_column: str | int | None = None):
    """``(features (n, d) float64, labels (n,) str array or None, feature names)`` of one file."""
    from .assemble import DataError

    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = [r for r in csv.reader(fh, delimiter=delim) if r]  # a blank line is no row; "," is one
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: cannot read it as a table ({e})") from None
    if not rows:
        raise DataError(f"{path}: no rows")
    header = None
    if _is_header(rows, label_column):
        header, rows = [c.strip() for c in rows[0]], rows[1:]
        if not rows:
            raise DataError(f"{path}: a header and no rows")
    width = len(header) if header is not None else len(rows[0])
    for i, r in enumerate(rows):
        if len(r) != width:
            raise DataError(f"{path}: row {i + 1 + (header is not None)} has {len(r)} fields, expected {width}")
    j = None
    if label_column is not None:
        if isinstance(label_column, str) and not label_column.lstrip("-").isdigit():
            if header is None or label_column not in header:
                raise DataError(f"{path}: no column named {label_column!r} for data.label_column"
                                + (f" (columns: {', '.join(header[:8])}{', ...' if len(header) > 8 else ''})"
                                   if header else " (the file has no header row)"))
            j = header.index(label_column)
        else:
            j = int(label_column)
            if not -width <= j < width:
                raise DataError(f"{path}: data.label_column {j} is out of range for {width} columns")
            j %= width
    labels = None if j is None else np.asarray([r[j].strip() for r in rows])
    keep = [c for c in range(width) if c != j]
    if not keep:
        raise DataError(f"{path}: no feature columns besides the labels")
    X = np.empty((len(rows), len(keep)), dtype=np.float64)
    for i, r in enumerate(rows):
        for k, c in enumerate(keep):
            v = _number(r[c])
            if v is None:
                name = header[c] if header else str(c)
                raise DataError(f"{path}: row {i + 1 + (header is not None)}, column {name}: "
                                f"not a number: {r[c].strip()[:40]!r}")
            X[i, k] = v
    if labels is not None and np.any(labels == ""):
        raise DataError(f"{path}: {int(np.sum(labels == ''))} empty label cell(s)")
    names = [header[c] for c in keep] if header else []
    return X, labels, names


def load_tables(paths: Sequence[Path], label_column: str | int | None, name: str):
    """The views of several table files (one each) and the labels of those that hold them."""
    from .assemble import DataError, assemble

    views, labels, where = [], None, None
    for i, p in enumerate(paths):
        named = isinstance(label_column, str) and not label_column.lstrip("-").isdigit()
        holds = _has_column(p, label_column) if named else (label_column is not None and i == 0)
        X, y, _ = read_table(p, label_column) if holds else read_table(p)
        views.append(X)
        if y is not None:
            if labels is not None and (len(y) != len(labels) or np.any(y != labels)):
                raise DataError(f"{p}: its labels disagree with those of {where}")
            labels, where = y, p
    if label_column is not None and labels is None:
        delim = "\t" if paths[0].suffix.lower() == ".tsv" else ","
        with open(paths[0], newline="", encoding="utf-8-sig") as fh:
            first = [c.strip() for c in next(csv.reader(fh, delimiter=delim), [])]
        cols = f"{', '.join(first[:4])}, ..., {', '.join(first[-2:])}" if len(first) > 6 else ", ".join(first)
        raise DataError(f"{paths[0]}: no column named {label_column!r} for data.label_column"
                        f"{' in any of the files' if len(paths) > 1 else ''} (columns: {cols})")
    odd = next((i for i, v in enumerate(views) if len(v) != len(views[0])), None)
    if odd is not None:
        raise DataError(f"{paths[odd]}: {len(views[odd])} rows, the first file has {len(views[0])}")
    # NaN rows mark absent views (as in .npz), labels as strings are remapped to 0..k-1
    return assemble(Path(name), views, labels, None, None, [p.stem for p in paths] if len(paths) > 1 else None)


def _has_column(path: Path, label_column: str) -> bool:
    """Whether ``path``'s header names the label column."""
    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, newline="", encoding="utf-8-sig") as fh:
        first = next(csv.reader(fh, delimiter=delim), [])
    return label_column in [c.strip() for c in first]
