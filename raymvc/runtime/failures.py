"""A party's failure as the run keeps it: one bounded plain line for ``summary.json``, the
traceback (bounded too) for ``errors.log``.

The exception comes from a party's code (a method's client or server, which may be anyone's):
printing it may itself raise or return megabytes, so every helper here is defensive.
"""

from __future__ import annotations

import re
import traceback

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE_LIMIT = 300  # characters of a client error in summary.json
TRACEBACK_LIMIT = 64_000  # characters of its traceback (errors.log)


def cut_line(line: str, limit: int = LINE_LIMIT) -> str:
    """``line`` at most ``limit`` characters, ``...`` marking a cut."""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _str(e: BaseException) -> str:
    """``str(e)``, which is client code for a client's exception: it may raise, or be huge."""
    try:
        return str(e)[:100_000]
    except BaseException:
        return "(its message could not be printed)"


def one_line(e: BaseException, limit: int = LINE_LIMIT) -> str:
    """An exception as one plain line: type, first line of the message, no colour codes."""
    text = _ANSI.sub("", _str(e)).strip().splitlines()
    first = text[0] if text else ""
    line = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return cut_line(line, limit)


def traceback_text(e: BaseException, limit: int = TRACEBACK_LIMIT) -> str:
    """The exception's traceback, at most ``limit`` characters (its start and its end)."""
    try:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    except BaseException:
        text = one_line(e)
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]}\n... ({len(text) - 2 * half} characters cut) ...\n{text[-half:]}"


def party_error(party: str, phase: str, r: int, e: BaseException) -> dict:
    """One error of a party's code: a bounded line for the summary, the full traceback for ``errors.log``."""
    return {"party": party, "phase": phase, "round": r, "error": one_line(e), "traceback": traceback_text(e)}
