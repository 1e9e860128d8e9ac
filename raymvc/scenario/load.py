"""Scenario files: YAML -> validated, typed :class:`~.schema.Scenario`.

Overrides (key path -> value; ``--set key.path=value`` on the command line, parsed once
into that form by :func:`parse_sets`) are applied to the raw YAML before validation, so
they are checked exactly like keys written in the file; a problem that comes from an
override is reported against it (``--set params.lamda=2: params.lamda: unknown key;
did you mean 'lambda'? ...``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..text import short
from .errors import ScenarioError, ScenarioWarning, blame_override, format_error, show_override
from .schema import Scenario
from .sidefiles import availability_trace, device_classes
from .yamlio import MAX_FILE_BYTES, safe_yaml_load, yaml_problem


def _set_path(raw: dict, dotted: str, value: Any, source: str | None) -> None:
    keys = dotted.split(".")
    node = raw
    for i, k in enumerate(keys[:-1]):
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(f"--set {dotted}=...: {'.'.join(keys[: i + 1])}: cannot set a key inside a "
                                f"{type(nxt).__name__}")
        node = nxt
    node[keys[-1]] = value


def _apply_override(raw: dict, key: str, value: Any, source: str | None) -> None:
    """Set one override; a data source given on the command line replaces the other one."""
    if key == "data.path" and isinstance(value, str):
        p = Path(value).expanduser()
        value = str(p if p.is_absolute() else Path(os.getcwd()) / p)  # command line: relative to here
    _set_path(raw, key, value, source)
    data = raw.get("data")
    if isinstance(data, dict) and value is not None:
        if key == "data.path":
            data.pop("dataset", None)
        elif key == "data.dataset":
            data.pop("path", None)


def parse_override(text: str) -> tuple[str, Any]:
    """``'faults.dropout.rate=0.2'`` -> ``('faults.dropout.rate', 0.2)`` (value parsed as YAML)."""
    if "=" not in text:
        raise ScenarioError(f"--set {text}: expected key.path=value")
    key, val = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ScenarioError(f"--set {text}: bad key path {key!r}")
    try:
        value = safe_yaml_load(val) if val.strip() else None
    except yaml.YAMLError as e:
        raise ScenarioError(f"--set {key}: value is not valid YAML ({yaml_problem(e)})") from None
    return key, value


def parse_sets(items: Iterable[str]) -> dict[str, Any]:
    """``--set`` strings (``"key.path=yaml"``) as overrides, key -> value, parsed once; a
    key given twice keeps its last value."""
    return merge_overrides(*(dict([parse_override(item)]) for item in items))


def as_overrides(overrides: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """Overrides as key -> value: a mapping (its keys checked), or ``--set`` strings (parsed)."""
    if overrides is None:
        return {}
    if isinstance(overrides, str):
        raise ScenarioError(f"overrides: a mapping of key -> value or a list of key=value strings, got {overrides!r}")
    if not isinstance(overrides, Mapping):
        return parse_sets(overrides)
    for key in overrides:
        if not isinstance(key, str) or not key.strip() or any(not part for part in key.strip().split(".")):
            raise ScenarioError(f"overrides: bad key path {short(key)}")
    return {k.strip(): _plain(v) for k, v in overrides.items()}


def _plain(value: Any) -> Any:
    """A value as YAML would give it: a path-like (``pathlib.Path``) becomes its text, also
    inside mappings and lists, so every override can be shown and fingerprinted."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def merge_overrides(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """Several sets of overrides as one, applied in order: a key given again takes its
    last value and its last place."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out.pop(key, None)
            out[key] = value
    return out


def load_scenario(path: str | Path, overrides: Mapping[str, Any] | Iterable[str] | None = None) -> Scenario:
    """Read, override and validate a scenario file; every error is a ScenarioError.
    ``overrides``: key -> value (``{"faults.dropout.rate": 0.2}``), applied in order; a list
    of ``--set`` strings is parsed first."""
    path = Path(path)
    src = str(path)
    try:
        if not path.is_file():
            raise ScenarioError(f"{src}: file not found")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ScenarioError(f"{src}: {size} bytes; a scenario file may have at most {MAX_FILE_BYTES}")
        raw = safe_yaml_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{src}: invalid YAML: {yaml_problem(e)}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{src}: not a text file") from None
    except OSError as e:
        raise ScenarioError(f"{src}: cannot read ({e.strerror or e})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{src}: the top level must be a mapping of keys, got {type(raw).__name__}")
    from ..protocols import add_search_path

    add_search_path(path.parent)  # a method module beside the file is found, as data.path is
    return scenario_from_dict(raw, source=src, overrides=overrides)


def _check_split_options(sc: Scenario) -> None:
    """Options that only one kind of split uses are errors on the other kind, not silently ignored."""
    from ..protocols import get

    kind = sc.data.partition or get(sc.method).partition
    where = f"{sc.source}: " if sc.source else ""
    if kind == "horizontal":
        if sc.data.missing.rate > 0:
            raise sc.blame(ScenarioError(f"{where}data.missing.rate: missing views apply to vertical splits; "
                                         f"this is a horizontal split ({sc.method}), so set it to 0"))
        if sc.data.unaligned > 0:
            raise sc.blame(ScenarioError(f"{where}data.unaligned: unaligned rows apply to vertical splits; "
                                         f"this is a horizontal split ({sc.method}), so set it to 0"))
    elif sc.data.heterogeneity > 0 or sc.data.dirichlet_alpha is not None:
        key = "data.heterogeneity" if sc.data.heterogeneity > 0 else "data.dirichlet_alpha"
        raise sc.blame(ScenarioError(f"{where}{key}: label and quantity skew apply to horizontal splits; "
                                     f"this is a vertical split ({sc.method})"))


def _drop_other_methods_params(raw: dict, file_method, file_params: Mapping, overrides: Mapping, source) -> None:
    """A ``method`` override (``--set method=X``, a grid of methods) starts from X's own
    defaults: the file's ``params``, written for its own method, are dropped -- even where a
    name is shared, since its value was chosen for the other method -- except those the
    overrides set again; a warning names what was dropped."""
    import warnings

    if "params" in overrides:  # the overrides give the whole params block
        return
    again = {k.split(".", 2)[1] for k in overrides if k.startswith("params.")}
    params = raw.get("params") if isinstance(raw.get("params"), dict) else {}
    raw["params"] = {k: v for k, v in params.items() if k in again}
    dropped = sorted(str(k) for k in file_params if k not in again)
    if dropped:
        where = f"{source}: " if source else ""
        warnings.warn(f"{where}method {raw.get('method')!r} replaces {file_method!r}: the file's params for "
                      f"{file_method!r} are not carried over ({', '.join(dropped)}); {raw.get('method')!r} starts "
                      "from its own defaults", ScenarioWarning, stacklevel=3)


def scenario_from_dict(raw: dict, source: str | None = None, overrides: Mapping[str, Any] | Iterable[str] | None = None,
                       values: Mapping[str, Any] | None = None) -> Scenario:
    """A validated :class:`Scenario` from a raw mapping. ``overrides``: key -> value, as
    ``--set`` applies them (a data source replaces the other, a relative ``data.path`` is
    taken from the working folder, errors name the override); ``values``: key -> value set
    as they are, before the overrides."""
    raw = copy.deepcopy(raw)
    for key, value in (values or {}).items():
        _set_path(raw, key, copy.deepcopy(value), source)
    overrides = as_overrides(overrides)
    file_method, file_params = raw.get("method"), raw.get("params")
    for key, value in overrides.items():
        try:
            _apply_override(raw, key, copy.deepcopy(value), source)
        except ScenarioError as e:
            raise ScenarioError(str(e).replace(f"--set {key}=...", f"--set {show_override(key, value)}", 1)) from None
    if "method" in overrides and raw.get("method") != file_method and isinstance(file_params, Mapping):
        _drop_other_methods_params(raw, file_method, file_params, overrides, source)
    raw.pop("source", None)
    try:
        sc = Scenario(**raw, source=source)
    except ValidationError as e:
        raise ScenarioError(format_error(source, e, model=Scenario, overrides=overrides)) from None
    except TypeError as e:  # e.g. a key that is not a string
        where = f"{source}: " if source else ""
        raise ScenarioError(f"{where}(top level): {e}") from None
    sc._overrides = overrides
    sc.protocol_config()
    _check_split_options(sc)
    p = sc.data_path()
    for q in (p if isinstance(p, list) else [] if p is None else [p]):
        if not (q.is_file() or (q.is_dir() and not isinstance(p, list))):
            where = f"{source}: " if source else ""
            raise ScenarioError(blame_override(f"{where}data.path: file not found: {q}", source, overrides))
    availability_trace(sc)  # a trace file is read and checked now
    device_classes(sc)  # so is a device profile
    if sc.data.label_column is not None and p is None:
        where = f"{source}: " if source else ""
        raise ScenarioError(blame_override(f"{where}data.label_column: applies to .csv/.tsv data (data.path)",
                                           source, overrides))
    return sc
