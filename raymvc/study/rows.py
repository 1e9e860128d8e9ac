"""A sweep's tables: one row of ``sweep.csv`` per run (from its ``summary.json``), the
aggregate over seeds per scenario and grid point, and reading a sweep folder back.
Scope: rows and numbers only; nothing here runs a cell."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..results.folder import ResultsError, read_file, short_value, write_file
from ..results.runfolder import RunFolder
from ..results.status import ALL, FINISHED, Status
from ..results.summary import RunSummary
from ..safeio import SafeReadError, csv_rows, json_loads
from .grid import MAX_SEEDS, check_size, parse_grid, parse_seeds, short_key, slug  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from .cells import Cell


METRICS = ("acc", "nmi", "ari")
SIZE_FIELDS = ("client_rows_min", "client_rows_max")  # the fewest and most rows a client held (data_info)
METRIC_PREFIX = "metric."  # sweep.csv's column of every other score a run's summary reports (metric.purity, ...)
INFO_PREFIX = "info."  # sweep.csv's column of each number a method reports in protocol_info (info.objective, ...)
MAX_SWEEP_JSON = 64 << 20  # bytes of sweep.json read back
MAX_SWEEP_CSV = 512 << 20  # bytes of sweep.csv read back
RUN_FIELDS = ("seed", "status", "acc", "nmi", "ari", "mb", "rounds", "wall", "dropped_replies", "late_replies",
              "crashed_clients", "errors", "fingerprint", "run_dir")



def collect(cells: list[Cell], out: Path) -> list[dict]:
    """One row per cell from its summary.json (cells without one count as failed)."""
    rows = []
    for c in cells:
        try:
            s = RunFolder(c.run_dir).summary()
        except (OSError, ValueError):
            s = RunSummary.from_dict({"status": Status.FAILED.value})
        rows.append(summary_row(c.name, s.method or c.method, c.point, c.seed, s, c.run_dir, out))
    return rows


def summary_row(name: str, method: str, point: dict, seed: int, s: RunSummary, run_dir: Path, out: Path) -> dict:
    """A run's row of ``sweep.csv``."""
    m = s.metrics or {}
    f = s.faults
    try:
        rel = str(Path(run_dir).relative_to(out))
    except ValueError:
        rel = str(run_dir)
    row = {"scenario": name, "method": method}
    row.update({k: short_value(v) for k, v in point.items()})
    row.update(seed=seed, status=s.status.value, acc=m.get("acc"), nmi=m.get("nmi"), ari=m.get("ari"), mb=s.mb,
               rounds=s.rounds, wall=s.wall_s, dropped_replies=f.get("dropped_replies"),
               late_replies=f.get("late_replies"), crashed_clients=len(f.get("crashed_clients") or []),
               errors=len(s.errors), fingerprint=s.fingerprint or None, run_dir=rel)
    row.update({METRIC_PREFIX + k: v for k, v in m.items() if k not in METRICS})  # whatever else the run scored
    row.update(info_numbers(s.raw.get("protocol_info")))
    sizes = (s.raw.get("data_info") or {}).get("client_sizes")
    if isinstance(sizes, list) and sizes and all(isinstance(x, int) for x in sizes):
        row.update(client_rows_min=min(sizes), client_rows_max=max(sizes))  # the split's extremes
    return row


def info_numbers(info) -> dict[str, float | int]:
    """``info.<key>`` for each number (not a flag, not a list) of a run's ``protocol_info``;
    keys that are not plain names are left out (they would make odd column names)."""
    if not isinstance(info, dict):
        return {}
    return {INFO_PREFIX + k: v for k, v in info.items()
            if isinstance(k, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", k)
            and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def column_of(metric: str) -> str:
    """sweep.csv's column of a score as a study file or ``--metric`` names it: a column of
    every row (``acc``, ``mb``, ``rounds``, a record's ``virtual_s``) and ``info.<key>`` as
    they are, any other score (``kappa``, ``purity``, ...) under ``metric.``."""
    if metric in (*RUN_FIELDS, "virtual_s") or metric.startswith((INFO_PREFIX, METRIC_PREFIX)):
        return metric
    return METRIC_PREFIX + metric


def extra_metrics(rows: list[dict]) -> list[str]:
    """The ``metric.*`` and ``info.*`` columns the rows carry (every score beyond ACC, NMI
    and ARI, and the numbers methods report), sorted: scores first."""
    return sorted({k for r in rows for k in r if k.startswith((METRIC_PREFIX, INFO_PREFIX))},
                  key=lambda k: (k.startswith(INFO_PREFIX), k))


def sweep_fields(keys: list[str], rows: list[dict]) -> list[str]:
    """sweep.csv's columns: the fixed ones, then every other score some run reported."""
    sizes = [k for k in SIZE_FIELDS if any(k in r for r in rows)]
    return ["scenario", "method", *keys, *RUN_FIELDS, *sizes, *extra_metrics(rows)]


def metric_names(rows: list[dict]) -> list[str]:
    """Every score a mean is taken of: ACC, NMI, ARI, the ``metric.*`` columns, MB."""
    return [*METRICS, *extra_metrics(rows), "mb"]


def num(v) -> float | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def aggregate(rows: list[dict], keys: list[str]) -> list[dict]:
    """Mean and std (over seeds, sample std) per scenario and grid point, of the runs that
    ended ``completed`` or ``degraded``; runs that ended ``error`` (some party's code
    raised), ``interrupted`` or ``failed`` (missing included) are counted, never averaged.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["method"], *[str(r[k]) for k in keys]), []).append(r)
    out = []
    for gkey, rs in groups.items():
        ok = [r for r in rs if r["status"] in FINISHED]
        agg = {"scenario": gkey[0], "method": gkey[1]}
        agg.update(zip(keys, gkey[2:]))
        agg.update(runs=len(rs), completed=sum(r["status"] == "completed" for r in rs),
                   degraded=sum(r["status"] == "degraded" for r in rs), error=sum(r["status"] == "error" for r in rs),
                   interrupted=sum(r["status"] == "interrupted" for r in rs))
        agg["failed"] = agg["runs"] - agg["completed"] - agg["degraded"] - agg["error"] - agg["interrupted"]
        for m in metric_names(rs):
            mean, std = mean_std([x for r in ok if (x := num(r.get(m))) is not None])
            agg[f"{m}_mean"], agg[f"{m}_std"] = mean, std
        out.append(agg)
    return out


def write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    """Written whole to a temporary name and renamed (a link there is replaced, never followed)."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    write_file(path, buf.getvalue())


def aggregate_fields(keys: list[str], rows: list[dict] = ()) -> list[str]:
    """aggregate.csv's columns (``rows``: sweep.csv's, for the scores beyond ACC/NMI/ARI)."""
    return ["scenario", "method", *keys, "runs", *ALL] + \
        [f"{m}_{s}" for m in metric_names(list(rows)) for s in ("mean", "std")]


def format_aggregate(agg: list[dict], keys: list[str]) -> str:
    """The aggregate as a text table (mean ± std; n = runs that entered the mean)."""
    def pm(r, m, digits):
        mean, std = num(r.get(f"{m}_mean")), num(r.get(f"{m}_std"))
        if mean is None:
            return "n/a"
        return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"

    def counts(r) -> str:
        extra = "".join(f" {n} {k}" for k in ("error", "interrupted") if (n := int(r.get(k) or 0)))
        return f"{r['completed']}/{r['degraded']}/{r['failed']}{extra}"

    labelled = any(num(r.get("acc_mean")) is not None for r in agg) or \
        not any(num(r.get(f"{METRIC_PREFIX}silhouette_mean")) is not None for r in agg)
    scores = [("ACC", "acc", 4), ("NMI", "nmi", 4), ("ARI", "ari", 4)] if labelled else \
        [("SIL", f"{METRIC_PREFIX}silhouette", 4), ("CH", f"{METRIC_PREFIX}calinski_harabasz", 1)]
    head = ["scenario", "method", *[short_key(k) for k in keys], "done/deg/fail", *(h for h, _, _ in scores), "MB"]
    body = [[str(r["scenario"]), str(r["method"]), *[str(r[k]) for k in keys], counts(r),
             *(pm(r, m, d) for _, m, d in scores), pm(r, "mb", 3)] for r in agg]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    if any(int(r["failed"]) + int(r.get("error") or 0) + int(r.get("interrupted") or 0) for r in agg):
        lines.append("(runs that failed, raised an error or were interrupted are left out of every mean)")
    return "\n".join(lines)


def read_sweep(sweep_dir: str | Path) -> tuple[dict, list[dict], list[dict]]:
    """(meta, rows of sweep.csv, aggregate) of a sweep folder; the aggregate is recomputed from sweep.csv."""
    d = Path(sweep_dir)
    try:
        meta = json_loads(read_file(d / "sweep.json", limit=MAX_SWEEP_JSON), what=str(d / "sweep.json"))
    except (OSError, ValueError):  # missing, a link, too big, too deep, not JSON
        meta = {}
    if not isinstance(meta, dict):  # not what a sweep writes: read the folder from sweep.csv alone
        meta = {}
    try:
        rows = csv_rows(read_file(d / "sweep.csv", limit=MAX_SWEEP_CSV), what=str(d / "sweep.csv"),
                        required=("scenario", "seed", "status"))
    except SafeReadError as e:
        raise ResultsError(str(e)) from None
    try:
        keys = meta.get("grid_keys")
        if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
            fixed = set(RUN_FIELDS) | set(SIZE_FIELDS) | {"scenario", "method", "mb_total"}
            keys = [k for k in (rows[0].keys() if rows else [])
                    if k not in fixed and not k.startswith((METRIC_PREFIX, INFO_PREFIX))]
            meta["grid_keys"] = keys
        return meta, rows, aggregate(rows, keys)
    except (csv.Error, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        detail = f"no column {e}" if isinstance(e, KeyError) else str(e)
        raise ResultsError(f"{d / 'sweep.csv'}: corrupt ({detail[:200]})") from None
