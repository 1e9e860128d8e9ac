"""The run directory: ``summary.json``, ``rounds.jsonl``, ``messages.csv``, ``scenario.yaml``,
``labels.csv``.

``rounds.jsonl`` gets one line per round as the round ends (flushed), so a long run
can be watched with ``tail -f`` and a crash mid-run still leaves every finished round.

Paths are checked, not trusted: a run folder's default name comes from the scenario's
``name`` (letters, digits, ``.``, ``_``, ``-`` only, so it never leaves ``runs/``), a
chosen folder must be creatable and writable (:func:`check_out_dir`), and reading a
missing or corrupt ``summary.json`` raises :class:`ResultsError` with one line.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

FINAL_STATUSES = ("completed", "degraded", "failed", "error")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")  # one path component, never "." or ".."


class ResultsError(ValueError):
    """A run folder or one of its files cannot be used; the message is one line."""


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        items = sorted(x) if isinstance(x, set) else x
        return [_jsonable(v) for v in items]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def default_out_dir(name: str, root: str | Path = "runs") -> Path:
    """``root/<name>-<time>`` (``-2``, ``-3``, ... if taken); ``name`` must be a plain folder name."""
    if not _SAFE_NAME.fullmatch(name):
        raise ResultsError(f"run name {name[:80]!r} is not a plain folder name")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{name}-{stamp}"
    out, i = base, 1
    while out.exists():
        i += 1
        out = Path(f"{base}-{i}")
    return out


def check_out_dir(path: str | Path, create: bool = True) -> Path:
    """Make sure ``path`` can be a results folder: create it (``create``) and check it is writable.

    Raises :class:`ResultsError` with one line saying why not (a file is in the way, a
    parent cannot be created, no permission).
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ResultsError(f"{p}: exists and is not a folder")
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ResultsError(f"{p}: cannot create the folder ({e.strerror or e})") from None
        probe = p / f".raymvc-write-test-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ResultsError(f"{p}: cannot write in the folder ({e.strerror or e})") from None
        return p
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ResultsError(f"{p}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ResultsError(f"{p}: cannot write in {parent}")
    return p


class RunWriter:
    """Writes one run's files as the run goes."""

    def __init__(self, out_dir: str | Path, keep_rounds: int | None = None):
        """``keep_rounds``: resuming -- keep that many lines of ``rounds.jsonl`` and append."""
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "rounds.jsonl"
        if keep_rounds is not None:
            kept = path.read_text().splitlines(keepends=True)[:keep_rounds] if path.exists() else []
            path.write_text("".join(kept))
            self._rounds = open(path, "a")
        else:
            self._rounds = open(path, "w")

    def scenario(self, text: str) -> None:
        (self.dir / "scenario.yaml").write_text(text)

    def round(self, record: dict) -> None:
        self._rounds.write(json.dumps(_jsonable(record)) + "\n")
        self._rounds.flush()

    def labels(self, labels, n_samples: int) -> Path:
        """``labels.csv``: ``sample,cluster``, one row per sample, -1 where nothing labelled it."""
        y = np.full(n_samples, -1, dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64).ravel()
        path = self.dir / "labels.csv"
        with open(path, "w") as fh:
            fh.write("sample,cluster\n")
            fh.writelines(f"{i},{c}\n" for i, c in enumerate(y.tolist()))
        return path

    def errors(self, text: str) -> None:
        """``errors.log``: the full tracebacks of every party whose code raised."""
        (self.dir / "errors.log").write_text(text)

    def messages(self, ledger) -> None:
        ledger.write_csv(self.dir / "messages.csv")

    def summary(self, summary: dict) -> Path:
        path = self.dir / "summary.json"
        path.write_text(json.dumps(_jsonable(summary), indent=2) + "\n")
        return path

    def close(self) -> None:
        if not self._rounds.closed:
            self._rounds.close()


def read_summary(out_dir: str | Path) -> dict:
    """The ``summary.json`` of a run folder; :class:`ResultsError` if it is missing or corrupt."""
    path = Path(out_dir) / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path}: not found (the run never started or was removed)") from None
    except OSError as e:
        raise ResultsError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: corrupt (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: corrupt (not valid JSON: {e.msg} at line {e.lineno}, "
                           f"column {e.colno})") from None
    except (ValueError, RecursionError):
        raise ResultsError(f"{path}: corrupt (not valid JSON)") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: corrupt (expected a JSON object, got {type(data).__name__})")
    return data


def format_summary(s: dict) -> str:
    """A short human-readable report of a summary dict."""
    m = s.get("metrics") or {}
    c = s.get("communication") or {}
    f = s.get("faults") or {}
    t = s.get("timing") or {}
    lines = [
        f"{s.get('name', '')}: {s.get('method', '?')} on {s.get('dataset', '?')} "
        f"({s.get('n_samples', '?')} samples, {s.get('n_clients', '?')} clients, seed {s.get('seed', '?')})",
        f"  status    {s.get('status', '?')}" + (f" ({s['error']})" if s.get("error") else ""),
        f"  rounds    {s.get('rounds', '?')}",
    ]
    errors = s.get("errors") or []
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        lines.append(f"  errors    {errors[0]}{more}; full tracebacks in errors.log")
    if m:
        lines.append("  metrics   " + "  ".join(f"{k.upper()} {v:.4f}" for k, v in m.items() if v is not None))
    if s.get("metrics_labelled"):
        ml = s["metrics_labelled"]
        lines.append(f"  labelled  {s.get('unlabelled_samples', 0)} samples unlabelled; the rest: "
                     + "  ".join(f"{k.upper()} {v:.4f}" for k, v in ml.items() if v is not None))
    lines.append(
        f"  traffic   {c.get('mb_total', 0):.3f} MB in {c.get('messages', 0)} messages "
        f"(up {c.get('bytes_up', 0) / 1e6:.3f} MB, down {c.get('bytes_down', 0) / 1e6:.3f} MB; "
        f"payload {c.get('payload_bytes', 0) / 1e6:.3f} MB)"
    )
    fault_bits = [
        f"dropped {f.get('dropped_replies', 0)}",
        f"late {f.get('late_replies', 0)}",
        f"rejected {f.get('rejected_messages', 0)}",
        f"crashed {f.get('crashed_clients') or 'none'}",
    ]
    if f.get("disconnected_clients"):
        fault_bits.append(f"never connected {f['disconnected_clients']}")
    lines.append("  faults    " + ", ".join(fault_bits))
    part = s.get("participation") or {}
    missed = {c: p for c, p in part.items() if p.get("missed")}
    if missed:
        lines.append("  clients   " + "; ".join(f"{c} missed {p['missed']} of {p['addressed']} rounds"
                                             for c, p in sorted(missed.items(), key=lambda kv: int(kv[0]))))
    elif part:
        lines.append(f"  clients   all {len(part)} answered every round they were addressed in")
    lines.append(
        f"  time      {t.get('wall_s', 0):.2f} s wall: {t.get('ray_init_s', 0):.2f} s Ray start, "
        f"{t.get('startup_s', 0):.2f} s start-up (parties + keys), {t.get('protocol_s', 0):.2f} s protocol; "
        f"{t.get('virtual_s', 0):.2f} s virtual"
    )
    if s.get("out_dir"):
        lines.append(f"  results   {s['out_dir']}")
    return "\n".join(lines)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}}`` -> ``{'a.b': 1}`` (lists stay values)."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def read_scenario(out_dir: str | Path) -> dict:
    from .scenario import MAX_FILE_BYTES, safe_yaml_load

    p = Path(out_dir) / "scenario.yaml"
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            return {}
        data = safe_yaml_load(p.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def differing_keys(scenarios: list[dict], ignore: tuple[str, ...] = ("description",)) -> list[str]:
    """Scenario keys (dotted) whose values are not the same in every scenario given."""
    flat = [flatten(s) for s in scenarios]
    keys = sorted(set().union(*flat)) if flat else []
    return [k for k in keys if k not in ignore and len({yaml.safe_dump(f.get(k)) for f in flat}) > 1]


def short_value(v: Any) -> str:
    """A value as compact one-line YAML (``0.1``, ``[{client: 2, at_round: 2}]``)."""
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
