"""Text for the user: values and errors on one bounded line."""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

MAX_ERROR_CHARS = 400  # a whole error line
MAX_VALUE_CHARS = 80  # a value quoted in an error

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = MAX_VALUE_CHARS
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxlevel = 3


def short(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """``repr(value)`` on one line, at most ``limit`` characters (cut with ``...``)."""
    text = _repr.repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` with line breaks folded and at most ``limit`` characters."""
    text = " ".join(str(text).split("\n"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_value(v: Any) -> str:
    """A value as compact one-line YAML (``0.1``, ``[{client: 2, at_round: 2}]``)."""
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
