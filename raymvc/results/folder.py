"""The run directory: ``summary.json``, ``rounds.jsonl``, ``messages.csv``, ``scenario.yaml``,
``labels.csv``.

``rounds.jsonl`` gets one line per round as the round ends (flushed), so a long run
can be watched with ``tail -f`` and a crash mid-run still leaves every finished round.
Every other file is written whole to a temporary name in the folder and renamed over
the old one (:func:`write_file`), so a failed write (a full disk) leaves the previous
file as it was, and a link in the folder is replaced, never written through.

Paths are checked, not trusted: a run folder's default name comes from the scenario's
``name`` (letters, digits, ``.``, ``_``, ``-`` only, so it never leaves ``runs/``), a
chosen folder must be creatable and writable (:func:`check_out_dir`), and reading a
missing or corrupt ``summary.json`` raises :class:`ResultsError` with one line.

A run or sweep holds its folder for its whole length (:class:`OutputFolder`): a lock
file in it keeps a second run or sweep out, and a marker file says that raymvc made
the folder and for what. Only a folder with the marker is ever emptied, and then only
of the files raymvc writes there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..text import short_value  # noqa: F401 (re-exported)

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")  # one path component, never "." or ".."


class ResultsError(ValueError):
    """A run folder or one of its files cannot be used; the message is one line."""


def csv_value(text: str) -> Any:
    """A CSV cell as the number it holds (``""`` -> ``None``), else the text."""
    if text == "":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        items = sorted(x) if isinstance(x, set) else x
        return [jsonable(v) for v in items]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        return jsonable(x.item())
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

    Raises :class:`ResultsError` with one line saying why not (a file or a link is in
    the way, a parent cannot be created, no permission).
    """
    p = Path(path)
    if p.is_symlink():
        raise ResultsError(f"{p}: is a symbolic link; give the folder itself")
    if p.exists() and not p.is_dir():
        raise ResultsError(f"{p}: exists and is not a folder")
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ResultsError(f"{p}: cannot create the folder ({e.strerror or e})") from None
        probe = p / f".raymvc-write-test-{os.getpid()}"
        try:
            probe.unlink(missing_ok=True)
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
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


# --------------------------------------------------------------------------- files
def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (the one place a result file's bytes reach the disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(path: str | Path, data: str | bytes, dir_fd: int | None = None) -> Path:
    """Write ``path`` whole: to a temporary name beside it, then renamed over it.

    A link at ``path`` is replaced, never written through; a failed write (a full
    disk) leaves the file that was there. With ``dir_fd`` (an open folder), ``path``'s
    name is written in that folder whatever its path names now: a folder swapped for a
    link while a run writes is not followed. Raises :class:`ResultsError` with one line.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    name, tmp_name = (path.name, tmp.name) if dir_fd is not None else (path, tmp)
    at = {"dir_fd": dir_fd} if dir_fd is not None else {}
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name, **at)
        fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, **at)
        try:
            _write_all(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, name, **({"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd} if dir_fd is not None else {}))
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name, **at)
        raise ResultsError(f"{path}: cannot write ({e.strerror or e}); the file there before is kept") from None
    return path


def _open_nofollow(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ResultsError(f"{path}: is a symbolic link; raymvc never follows a link in its folders") from None
        raise


def read_file(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``, refusing a link (:class:`ResultsError`); ``limit``: at most that many."""
    path = Path(path)
    try:
        fd = _open_nofollow(path, os.O_RDONLY)
    except OSError as e:
        raise ResultsError(f"{path}: cannot read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as fh:
        try:
            return fh.read() if limit is None else fh.read(limit)
        except OSError as e:
            raise ResultsError(f"{path}: cannot read ({e.strerror or e})") from None


def sha256_file(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- folders
MARKER = ".raymvc"  # "raymvc run" or "raymvc sweep": raymvc made this folder, for that
LOCK = ".raymvc.lock"  # flock'ed by the run or sweep writing into the folder
# the files of a run folder (read and written through raymvc.results.runfolder.RunFolder)
SUMMARY_FILE, ROUNDS_FILE, MESSAGES_FILE = "summary.json", "rounds.jsonl", "messages.csv"
SCENARIO_FILE, LABELS_FILE, ERRORS_FILE = "scenario.yaml", "labels.csv", "errors.log"
RUN_FILES = (SUMMARY_FILE, ROUNDS_FILE, MESSAGES_FILE, SCENARIO_FILE, LABELS_FILE, ERRORS_FILE, "checkpoint.json")
# what else a run writes: checkpoint folders and the temporary names of files being written
_RUN_EXTRAS = re.compile(r"\.checkpoint-\d+|\.(?:%s)\.\d+\.tmp|\.raymvc-write-test-\d+"
                         % "|".join(re.escape(f) for f in (*RUN_FILES, MARKER)))
KINDS = ("run", "sweep")


def folder_kind(path: str | Path) -> str | None:
    """``"run"`` or ``"sweep"`` for a folder raymvc made (its marker says which), else ``None``."""
    try:
        text = read_file(Path(path) / MARKER, limit=64).decode("ascii", "replace").split()
    except (OSError, ResultsError):
        return None
    return text[1] if len(text) == 2 and text[0] == "raymvc" and text[1] in KINDS else None


def remove_entry(path: Path) -> None:
    """Remove one of raymvc's own entries; a link is removed itself, never what it points to."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class OutputFolder:
    """Hold a run or sweep folder for as long as the ``with`` block (or until :meth:`release`).

    Creates the folder if needed and takes the lock first (``fcntl.flock`` on
    ``.raymvc.lock``; the system drops it if the process dies), so that of two runs
    into one folder the second is refused at once. Then the folder must be one raymvc
    can use:

    - empty (but for the lock), or marked by raymvc as a folder of this ``kind``;
    - a run folder already used needs ``overwrite`` (its run files are removed, nothing
      else) or ``resume`` (kept as they are);
    - a sweep folder is reused as it is (a sweep carries on where it stopped).

    Anything else is a :class:`ResultsError` with one line, and the folder is left as
    it was. The marker is written into a folder that lacks it.
    """

    def __init__(self, path: str | Path, kind: str, *, overwrite: bool = False, resume: bool = False):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.path, self.kind = Path(path), kind
        self._fd: int | None = None
        p = self.path
        if resume and not (p.is_dir() or p.is_symlink()):
            raise ResultsError(f"{p}: no such folder")
        existed = p.is_dir()
        check_out_dir(p)  # no link, creatable, writable
        created = self._lock()
        self._fresh = created and folder_kind(p) is None  # nothing of raymvc's here before: undo on failure
        self._made = not existed
        try:
            self._check(overwrite, resume)
        except BaseException:
            if created:  # refused: leave the folder as it was found
                with contextlib.suppress(OSError):
                    (p / LOCK).unlink()
            self.release()
            raise

    def _lock(self) -> bool:
        lock = self.path / LOCK
        for _ in range(3):  # the file may vanish between the two opens (a refused attempt removes its own)
            try:
                try:
                    fd, created = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), True
                except FileExistsError:
                    fd, created = _open_nofollow(lock, os.O_RDWR), False
                break
            except FileNotFoundError:
                continue
            except OSError as e:
                raise ResultsError(f"{self.path}: cannot create the lock file {LOCK} ({e.strerror or e})") from None
        else:
            raise ResultsError(f"{self.path}: cannot create the lock file {LOCK}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ResultsError(f"{self.path}: another raymvc run or sweep is writing into this folder") from None
            raise ResultsError(f"{self.path}: cannot lock the folder ({e.strerror or e})") from None
        self._fd = fd
        return created

    def _check(self, overwrite: bool, resume: bool) -> None:
        p, kind = self.path, self.kind
        found = folder_kind(p)
        entries = [e for e in os.listdir(p) if e not in (LOCK, MARKER)]
        if found is None and resume:
            raise ResultsError(f"{p}: not a raymvc run folder (no {MARKER} marker)")
        if found is None and (entries or (p / MARKER).is_symlink()):
            raise ResultsError(f"{p}: not a {kind} folder (not empty, and no {MARKER} marker); "
                               "raymvc writes only into an empty folder or one it made")
        if found is not None and found != kind:
            raise ResultsError(f"{p}: is a raymvc {found} folder; a {kind} needs a folder of its own")
        if kind == "run" and entries and not resume:
            if not overwrite:
                raise ResultsError(f"{p}: the folder is not empty; choose another or pass --overwrite")
            for name in entries:  # only what a run writes; anything else stays
                if name in RUN_FILES or _RUN_EXTRAS.fullmatch(name):
                    try:
                        remove_entry(p / name)
                    except OSError as e:
                        raise ResultsError(f"{p / name}: cannot remove ({e.strerror or e})") from None
        if found is None:
            write_file(p / MARKER, f"raymvc {kind}\n")

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the lock

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self._fresh:  # failed before writing anything: leave no trace
            with contextlib.suppress(OSError):
                if set(os.listdir(self.path)) <= {LOCK, MARKER}:
                    (self.path / MARKER).unlink(missing_ok=True)
                    (self.path / LOCK).unlink(missing_ok=True)
                    if self._made:
                        self.path.rmdir()
        self.release()


class RunWriter:
    """Writes one run's files as the run goes."""

    def __init__(self, out_dir: str | Path, keep_rounds: int | None = None):
        """``keep_rounds``: resuming -- keep that many lines of ``rounds.jsonl`` and append.

        The folder is opened once; every file goes into that open folder, so swapping its
        path for a link during the run redirects nothing."""
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._dfd = _open_nofollow(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        path = self.dir / ROUNDS_FILE
        kept = b""
        if keep_rounds is not None and (path.exists() or path.is_symlink()):
            kept = b"".join(read_file(path).splitlines(keepends=True)[:keep_rounds])
        self._write(ROUNDS_FILE, kept)
        self._rounds_hash = hashlib.sha256(kept)  # of every byte of rounds.jsonl (a checkpoint records it)
        try:
            fd = os.open(ROUNDS_FILE, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dfd)
            self._rounds = os.fdopen(fd, "a", encoding="utf-8")
        except OSError as e:
            raise ResultsError(f"{path}: cannot open ({e.strerror or e})") from None

    def _write(self, name: str, data: str | bytes) -> Path:
        return write_file(self.dir / name, data, dir_fd=self._dfd)

    def scenario(self, text: str) -> None:
        self._write(SCENARIO_FILE, text)

    def round(self, record: dict) -> None:
        line = json.dumps(jsonable(record)) + "\n"
        try:
            self._rounds.write(line)
            self._rounds.flush()
            self._rounds_hash.update(line.encode("utf-8"))
        except OSError as e:
            raise ResultsError(f"{self.dir / ROUNDS_FILE}: cannot write ({e.strerror or e})") from None

    def rounds_sha256(self) -> str:
        """The SHA-256 of ``rounds.jsonl`` as written so far."""
        return self._rounds_hash.hexdigest()

    def labels(self, labels, n_samples: int) -> Path:
        """``labels.csv``: ``sample,cluster``, one row per sample, -1 where nothing labelled it."""
        y = np.full(n_samples, -1, dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64).ravel()
        return self._write(LABELS_FILE, "sample,cluster\n" + "".join(f"{i},{c}\n" for i, c in enumerate(y.tolist())))

    def errors(self, text: str) -> None:
        """``errors.log``: the full tracebacks of every party whose code raised (none: no file)."""
        if text:
            self._write(ERRORS_FILE, text)
        else:
            with contextlib.suppress(FileNotFoundError):  # a resumed run's earlier attempt
                os.unlink(ERRORS_FILE, dir_fd=self._dfd)

    def messages(self, ledger) -> None:
        self._write(MESSAGES_FILE, ledger.csv_text())

    def summary(self, summary: dict) -> Path:
        return self._write(SUMMARY_FILE, json.dumps(jsonable(summary), indent=2) + "\n")

    def close(self) -> None:
        if not self._rounds.closed:
            with contextlib.suppress(OSError):
                self._rounds.close()
        if self._dfd is not None:
            fd, self._dfd = self._dfd, None
            with contextlib.suppress(OSError):
                os.close(fd)


def read_summary(out_dir: str | Path) -> dict:
    """The ``summary.json`` of a run folder; :class:`ResultsError` if it is missing, corrupt or a link."""
    path = Path(out_dir) / SUMMARY_FILE
    try:
        with os.fdopen(_open_nofollow(path, os.O_RDONLY), "rb") as fh:  # a link is a ResultsError
            data = json.loads(fh.read().decode("utf-8"))
    except ResultsError:
        raise
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


def sizes_text(sizes) -> str:
    """``rows per client 179-180`` (or each client's count, up to 12 clients); empty for none."""
    if not isinstance(sizes, list) or not sizes or not all(isinstance(x, int) for x in sizes):
        return ""
    if len(sizes) <= 12:
        return "rows per client " + ", ".join(str(x) for x in sizes)
    return f"rows per client {min(sizes)}-{max(sizes)} (mean {sum(sizes) / len(sizes):.0f})"


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
    rows = sizes_text((s.get("data_info") or {}).get("client_sizes"))
    if rows:
        lines.append(f"  data      {rows}")
    if s.get("central") is True:
        lines.append("  central   the centralised reference: all the data at one party, no faults (its MB is not a "
                     "federation's)")
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
    from ..scenario import MAX_FILE_BYTES, safe_yaml_load

    p = Path(out_dir) / SCENARIO_FILE
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


def run_dir_for(name: str, overrides: dict) -> Path:
    """``runs/<name>[_<key><value>...]-<time>``: the overrides show in the folder name."""
    import hashlib

    from ..study.grid import short_key, slug

    bits = []
    for key, value in overrides.items():
        if isinstance(value, (dict, list)) and not value:
            text = "empty"  # params={} or a list emptied
        else:
            text = slug(short_value(value)) if slug(short_value(value)) != "x" else "none"
        if len(text) > 16:  # a long value (a path, a mapping): its start and a digest keep names short and apart
            text = f"{text[:11]}-{hashlib.sha1(short_value(value).encode()).hexdigest()[:4]}"
        bits.append(f"{short_key(key)}{'-' if text[:1].isalpha() else ''}{text}")
    return default_out_dir("_".join([name, *bits])[:80])
