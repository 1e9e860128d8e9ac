"""Progress on stderr: a live line that rewrites itself on a terminal, plain lines otherwise.

``RunProgress`` follows one run (round i/max, elapsed time, MB so far, replies and
missing clients); ``SweepProgress`` counts the runs of a sweep and shows the current
run's round in the same line. Nothing here goes to stdout, so ``--json`` output stays clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

CLEAR = "\r\033[K"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Line:
    """One status line: rewritten in place on a terminal."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = _is_tty(self.stream) if live is None else live
        self._open = False

    def show(self, text: str) -> None:
        if self.live:
            width = 200
            try:
                import shutil

                width = shutil.get_terminal_size().columns - 1
            except Exception:
                pass
            self.stream.write(CLEAR + text[:width])
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def log(self, text: str) -> None:
        """A line that stays (printed above the live line)."""
        if self.live and self._open:
            self.stream.write(CLEAR)
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.live and self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


class RunProgress:
    """Progress of one run; pass ``text`` as ``progress=`` and ``round`` as ``on_round=``."""

    def __init__(self, name: str, max_rounds: int | None = None, stream: TextIO | None = None,
                 live: bool | None = None, line: _Line | None = None, prefix: str = ""):
        self.name, self.max_rounds, self.prefix = name, max_rounds, prefix
        self.line = line or _Line(stream, live)
        self.t0 = time.perf_counter()
        self.mb = 0.0

    def text(self, msg: str) -> None:
        if self.line.live:
            self.line.show(self.prefix + msg)
        else:
            self.line.log(self.prefix + msg)

    def status(self, rec: dict) -> str:
        r = rec.get("round", 0) + 1  # rounds done, counted as summary.json counts them
        of = f"/{self.max_rounds}" if self.max_rounds else ""
        missing = rec.get("missing") or []
        return (f"[{self.name}] round {r}{of}  {time.perf_counter() - self.t0:5.1f} s  {self.mb:8.3f} MB  "
                f"{len(rec.get('replied') or [])} replies, {len(missing)} missing"
                + (f" {sorted(missing)}" if missing else ""))

    def round(self, rec: dict) -> None:
        total = rec.get("wire_bytes_total")  # the run's bytes so far (those before a resume too)
        self.mb = total / 1e6 if total is not None else self.mb + rec.get("wire_bytes", 0) / 1e6
        text = self.status(rec)
        if self.line.live:
            self.line.show(self.prefix + text)
        else:
            info = rec.get("info") or {}
            extra = "".join(f" {k}={v:.6g}" for k, v in info.items() if isinstance(v, float))
            self.line.log(self.prefix + text + extra)

    def close(self) -> None:
        self.line.close()


class SweepProgress:
    """Counts finished runs of a sweep; one line per run when not on a terminal."""

    def __init__(self, total: int, skipped: int = 0, stream: TextIO | None = None, live: bool | None = None,
                 quiet: bool = False):
        self.total, self.done, self.quiet = total, skipped, quiet
        self.ran = 0  # runs finished in this process (the reused ones took no time): the pace of the rest
        self.by_status: dict[str, int] = {}
        self.line = _Line(stream, live)
        self.t0 = time.perf_counter()

    def counter(self) -> str:
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.by_status.items()))
        width = 20
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled) if self.line.live else ""
        elapsed = time.perf_counter() - self.t0
        return (f"[sweep {bar}{' ' if bar else ''}{self.done}/{self.total}"
                f"{', ' + counts if counts else ''}, {elapsed:.0f} s{self.eta(elapsed)}]")

    def eta(self, elapsed: float) -> str:
        """``, about 12 min left``: the runs left at the pace of those finished here so far."""
        left = self.total - self.done
        if not self.ran or left <= 0:
            return ""
        secs = elapsed / self.ran * left
        return f", about {secs / 60:.0f} min left" if secs >= 90 else f", about {secs:.0f} s left"

    def run(self, name: str, max_rounds: int | None) -> RunProgress | None:
        """A RunProgress drawn inside the sweep's line (terminal only)."""
        if self.quiet or not self.line.live:
            return None
        return RunProgress(name, max_rounds, line=self.line, prefix=self.counter() + " ")

    def finished(self, label: str, summary: dict) -> None:
        self.done += 1
        self.ran += 1
        st = summary.get("status", "failed")
        self.by_status[st] = self.by_status.get(st, 0) + 1
        if self.quiet:
            return
        m = summary.get("metrics") or {}
        score = f" ACC {m['acc']:.4f}" if m.get("acc") is not None else (
            f" silhouette {m['silhouette']:.4f}" if isinstance(m.get("silhouette"), (int, float)) else "")
        mb = (summary.get("communication") or {}).get("mb_total", 0.0)
        wall = (summary.get("timing") or {}).get("wall_s", 0.0)
        err = f" ({summary['error']})" if summary.get("error") and st in ("failed", "error") else ""
        msg = f"{label}: {st}{score}, {mb:.3f} MB, {wall:.1f} s{err}"
        if self.line.live:
            if st in ("failed", "error"):
                self.line.log(f"[sweep] {msg}")
            self.line.show(f"{self.counter()} last: {msg}")
        else:
            self.line.log(f"{self.counter()} {msg}")

    def close(self) -> None:
        self.line.close()
