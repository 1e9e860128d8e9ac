"""Scenario errors: one line that names the file (or the ``--set``) and the key path.

:func:`format_error` turns pydantic's validation errors into that line; an unknown key always
suggests the closest valid one (:func:`unknown_key_message`); :func:`blame_override`
re-attributes a problem phrased against the file to the override that caused it.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .. import availability as _availability
from ..text import MAX_ERROR_CHARS, MAX_VALUE_CHARS, one_line, short, short_value  # noqa: F401 (re-exported)


class ScenarioWarning(UserWarning):
    """Something a scenario's reader should know that is not an error (shown as one
    ``warning:`` line by the command line)."""


class ScenarioError(ValueError):
    """A scenario problem, already phrased as one line for the user (at most 400 characters)."""

    def __init__(self, message: str = ""):
        super().__init__(one_line(message))


# ---------------------------------------------------------------------------
def _model_in(annotation) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``X``, ``X | None`` or ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated, list, tuple):
        for arg in typing.get_args(annotation):
            m = _model_in(arg)
            if m is not None:
                return m
    return None


def _availability_configs() -> dict[str, type[BaseModel] | None]:
    """The tags of ``faults.availability``: each built-in model's name -> its ``Config``, and
    ``own`` (a model of one's own, whose keys only it knows)."""
    return {**{n: c.Config for n, c in _availability.REGISTRY.items()}, "own": None}


def valid_keys(model: type[BaseModel] | None, path: list) -> list[str] | None:
    """The keys accepted at ``path`` (a location below ``model``), or None if unknown."""
    tags = _availability_configs()
    for i, part in enumerate(path):
        if model is None:
            return None
        if isinstance(part, int) or str(part).isdigit():
            continue
        if i and path[i - 1] == "availability" and part in tags:  # the model's tag
            model = tags[part]
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        model = _model_in(field.annotation)
    if model is None:
        return None
    return sorted((f.alias or n) for n, f in model.model_fields.items() if not f.exclude)


def unknown_key_message(bad: str, valid: list[str] | None) -> str:
    if not valid:
        return "unknown key"
    close = difflib.get_close_matches(bad, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (valid keys: {', '.join(valid)})"


def blame_override(text: str, source: str | None, overrides: Mapping[str, Any] | None) -> str:
    """``FILE: key: msg`` -> ``--set key=value: key: msg`` when an override set that key."""
    if not overrides:
        return text
    rest = text[len(source) + 2:] if source and text.startswith(f"{source}: ") else text
    key = rest.split(": ", 1)[0]
    items = list(overrides.items())[::-1]
    for okey, value in items:
        if key == okey or key.startswith(okey + ".") or okey.startswith(key + "."):
            return f"--set {show_override(okey, value)}: {rest}"
    if key == "data" or key.startswith("data."):  # a problem of data given on the command line
        for okey, value in items:
            if okey in ("data.path", "data.dataset"):
                return f"--set {show_override(okey, value)}: {rest}"
    return text


_BRANCHES = {"int", "list[int]", "constrained-float", "DeviceDraw"}  # union branch names pydantic puts in a location


def format_error(source: str | None, err: ValidationError, prefix: tuple = (), model=None, overrides=()) -> str:
    """pydantic's first error as one line: the file (or the ``--set`` at fault), the key path
    as the user wrote it and what is wrong, with the valid keys where one is unknown."""
    tags = _availability_configs()
    errors = err.errors()
    e = errors[0]
    if isinstance(e.get("input"), dict) and e["type"] in ("float_type", "float_parsing"):
        # a mapping where a number or a mapping may stand (a device quantity): its own problem, not "a number"
        e = next((x for x in errors[1:] if len(x["loc"]) > len(e["loc"])), e)
    raw_loc = [x for x in e["loc"] if not str(x).startswith("function-")]
    loc = [str(x) for x in (*prefix, *raw_loc)]
    # pydantic adds the union/literal branch name to the location; drop it
    loc = [x if len(x) <= 40 else x[:37] + "..." for x in loc if x not in _BRANCHES]
    # faults.availability.<tag>.key -> faults.availability.key
    loc = [x for i, x in enumerate(loc) if not (i and loc[i - 1] == "availability" and x in tags)]
    typ = e["type"]
    if typ in ("union_tag_invalid", "union_tag_not_found"):  # the key that picks the kind (model: ...)
        loc.append("model" if e["ctx"]["discriminator"] == "_availability_tag()" else e["ctx"]["discriminator"].strip("'"))
    key = ".".join(loc) or "(top level)"
    if typ == "union_tag_not_found" and e["ctx"]["discriminator"] == "_availability_tag()":
        m = e["input"].get("model") if isinstance(e["input"], dict) else None
        msg = ("required key is missing" if m is None else
               f"unknown value {short(m)} (valid: {', '.join(_availability.REGISTRY)}, or module.path:ClassName "
               "of your own)")
    elif typ == "union_tag_invalid":
        msg = f"unknown value {short(e['ctx']['tag'])} (valid: {e['ctx']['expected_tags'].replace(chr(39), '')})"
    elif typ == "union_tag_not_found":
        msg = "required key is missing"
    elif typ == "extra_forbidden":
        within = [x for x in raw_loc[:-1] if str(x) not in _BRANCHES]
        msg = unknown_key_message(str(raw_loc[-1])[:200], valid_keys(model, within))
    elif typ == "missing":
        msg = "required key is missing"
    elif typ in ("model_type", "dict_type"):  # a value where a mapping belongs: name its keys, not a class
        within = [str(x) for x in raw_loc if str(x) not in _BRANCHES]
        try:
            keys = valid_keys(model, within) or []
        except Exception:  # noqa: BLE001 -- the plain message is still right
            keys = []
        msg = f"expected a mapping of its keys{' (' + ', '.join(keys) + ')' if keys else ''}, got {short(e['input'])}"
        if len(keys) == 1 and not isinstance(e["input"], dict):
            msg += f"; did you mean {key}.{keys[0]}?"
    else:
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        msg = msg[0].lower() + msg[1:]
        if "input" in e and typ not in {"value_error", "model_type", "dict_type"}:
            msg += f", got {short(e['input'])}"
    where = f"{source}: " if source else ""
    return blame_override(f"{where}{key}: {msg}", source, overrides)


def show_override(key: str, value: Any) -> str:
    """An override as its ``--set`` text: ``faults.dropout.rate=0.2`` (mappings keep their order)."""
    if value is None:
        return f"{key}=null"
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False, allow_unicode=True)
    return f"{key}={text.strip().removesuffix('...').strip()}"
