"""Files a scenario names beside itself: availability traces (``faults.availability:
{model: trace, path: ...}``) and device profiles (``devices.profile``). Each is read
bounded, parsed once per process (by path, size and modification time) and refused with a
one-line ``ValueError`` that names the line at fault."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml
from pydantic import ValidationError

from ..text import short
from .errors import ScenarioError, format_error, unknown_key_message
from .schema import NAME_RE, DeviceClass, Scenario
from .yamlio import safe_yaml_load, yaml_problem

MAX_TRACE_BYTES = 50_000_000


_TRACES: dict[tuple, dict[int, np.ndarray]] = {}  # parsed trace files, by (path, size, mtime)


def read_trace(path: Path) -> dict[int, np.ndarray]:
    """A trace file: a header ``client,start_s,end_s``, then one interval a line when that
    client is available (``start_s <= t < end_s``, seconds). Blank lines are skipped.
    Returns each client's intervals as a ``(k, 2)`` array (read-only; parsed once per file
    version and process). Raises ValueError naming the file and line."""
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    st = path.stat()
    if st.st_size > MAX_TRACE_BYTES:
        raise ValueError(f"{path}: more than {MAX_TRACE_BYTES} bytes")
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _TRACES:
        out = _fast_trace(path)
        if out is None:  # something is off: the line-by-line reader names it (or agrees)
            try:
                lines = path.read_text().splitlines()
            except UnicodeDecodeError:
                raise ValueError(f"{path}: not a text file") from None
            out = {c: np.asarray(v, dtype=np.float64).reshape(-1, 2)
                   for c, v in _read_trace_lines(path, lines).items()}
        for a in out.values():
            a.flags.writeable = False
        _TRACES.clear()  # one file at a time is all a process needs
        _TRACES[key] = out
    return _TRACES[key]


def _fast_trace(path: Path) -> dict[int, np.ndarray] | None:
    """The intervals of a well-formed trace, read by numpy's parser in one pass over the file;
    None if the header or any line is not ``integer,number,number`` with finite start < end
    (the line reader then names it)."""
    try:
        with open(path, encoding="utf-8") as fh:
            header = fh.readline()
    except (OSError, ValueError):
        return None
    if [x.strip() for x in header.split(",")] != ["client", "start_s", "end_s"]:
        return None
    try:
        rows = np.loadtxt(path, delimiter=",", skiprows=1, comments=None, ndmin=1,
                          dtype=[("c", np.int64), ("s", np.float64), ("e", np.float64)])
    except (ValueError, OverflowError):
        return None
    c, span = rows["c"], np.stack([rows["s"], rows["e"]], axis=1) if len(rows) else np.zeros((0, 2))
    if (c < 0).any() or not (np.isfinite(span).all() and (span[:, 0] < span[:, 1]).all()):
        return None
    order = np.argsort(c, kind="stable")
    c, span = c[order], span[order]
    cuts = np.flatnonzero(np.diff(c)) + 1
    return {int(g[0]): s for g, s in zip(np.split(c, cuts), np.split(span, cuts)) if len(g)}


def _read_trace_lines(path: Path, lines: list[str]) -> dict[int, list[tuple[float, float]]]:
    """A trace file: a header ``client,start_s,end_s``, then one interval a line when that
    client is available (``start_s <= t < end_s``, seconds). Blank lines are skipped.
    Raises ValueError naming the file and line."""
    if not lines or [x.strip() for x in lines[0].split(",")] != ["client", "start_s", "end_s"]:
        raise ValueError(f"{path} line 1: the header must be client,start_s,end_s")
    out: dict[int, list[tuple[float, float]]] = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = [x.strip() for x in line.split(",")]
        where = f"{path} line {n}"
        if len(cells) != 3:
            raise ValueError(f"{where}: expected 3 values (client,start_s,end_s), got {len(cells)}")
        try:
            client = int(cells[0])
        except ValueError:
            raise ValueError(f"{where}: client must be an integer, got {short(cells[0])}") from None
        try:
            start, end = float(cells[1]), float(cells[2])
        except ValueError:
            raise ValueError(f"{where}: start_s and end_s must be numbers, got {short(cells[1])}, "
                             f"{short(cells[2])}") from None
        if client < 0 or not (math.isfinite(start) and math.isfinite(end)) or not start < end:
            raise ValueError(f"{where}: need client >= 0 and finite start_s < end_s, got {short(line.strip())}")
        out.setdefault(client, []).append((start, end))
    return out


MAX_PROFILE_BYTES = 1_000_000


def read_profile(path: Path) -> dict[str, DeviceClass]:
    """A device profile file: a YAML mapping ``class name -> {speed, up_mbps, down_mbps,
    latency_ms}``. Raises ValueError naming the file and the key."""
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    if path.stat().st_size > MAX_PROFILE_BYTES:
        raise ValueError(f"{path}: more than {MAX_PROFILE_BYTES} bytes")
    try:
        raw = safe_yaml_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {yaml_problem(e)}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a mapping of device classes (name: {{speed, up_mbps, down_mbps, "
                         f"latency_ms}}), got {short(raw)}")
    out = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError(f"{path}: {short(name)}: a class name is letters, digits, '.', '_' or '-'")
        extra = [k for k in entry if k not in DeviceClass.model_fields] if isinstance(entry, dict) else []
        if extra:  # before a missing key: a misspelt key is what is wrong
            bad = str(extra[0])[:40]
            raise ValueError(f"{path}: {name}.{bad}: {unknown_key_message(bad, sorted(DeviceClass.model_fields))}")
        try:
            out[name] = DeviceClass(**entry) if isinstance(entry, dict) else DeviceClass.model_validate(entry)
        except ValidationError as e:
            raise ValueError(format_error(str(path), e, prefix=(name,), model=DeviceClass)) from None
        except TypeError as e:  # a key that is not a string
            raise ValueError(f"{path}: {name}: {e}") from None
    return out


def availability_trace(sc: Scenario) -> dict[int, np.ndarray] | None:
    """The intervals of ``sc``'s ``faults.availability: {model: trace}``, or None for another
    model; a bad file raises ScenarioError naming the key."""
    p = sc.trace_path()
    if p is None:
        return None
    try:
        return read_trace(p)
    except ValueError as e:
        where = f"{sc.source}: " if sc.source else ""
        raise sc.blame(ScenarioError(f"{where}faults.availability.path: {e}")) from None


def device_classes(sc: Scenario) -> dict[str, DeviceClass] | None:
    """The classes of ``sc``'s ``devices.profile`` that ``devices.classes`` names, or None
    without a profile; a bad file or an unknown class raises ScenarioError."""
    p = sc.profile_path()
    if p is None:
        return None
    where = f"{sc.source}: " if sc.source else ""
    try:
        known = read_profile(p)
    except ValueError as e:
        raise sc.blame(ScenarioError(f"{where}devices.profile: {e}")) from None
    for name in sc.devices.classes:
        if name not in known:
            raise sc.blame(ScenarioError(f"{where}devices.classes.{name[:40]}: not a class of {p} "
                                         f"(classes: {', '.join(sorted(known))})"))
    return {name: known[name] for name in sc.devices.classes}
