"""Scenarios in rooms: the schema, reading and overriding, error lines, side files.

* :mod:`.schema` -- the typed :class:`Scenario` and its sections; an actor imports this
  alone (it reads no YAML and applies no override);
* :mod:`.load` -- YAML -> :class:`Scenario` with ``--set`` overrides (:func:`load_scenario`,
  :func:`scenario_from_dict`), every check that needs no data in one place;
* :mod:`.errors` -- :class:`ScenarioError` and the one line that names the file (or the
  ``--set``) and the key, e.g. ``scenarios/x.yaml: faults.dropout.rate: must be <= 1, got 1.5``;
  an unknown key always suggests the closest valid one;
* :mod:`.yamlio` -- bounded YAML reading (files over 1 MB, alias bombs, deep nesting refused);
* :mod:`.sidefiles` -- files a scenario names beside itself: availability traces and device
  profiles.

Every public name is reachable from here (``from raymvc.scenario import load_scenario``);
each is imported from its room on first use, so importing :mod:`raymvc.scenario.schema`
loads neither the reader nor the side files.
"""

from __future__ import annotations

import importlib
from typing import Any

_ROOMS = {
    "errors": ("ScenarioError", "ScenarioWarning", "show_override", "blame_override", "unknown_key_message",
               "valid_keys", "MAX_ERROR_CHARS", "MAX_VALUE_CHARS", "one_line", "short", "short_value"),
    "yamlio": ("MAX_FILE_BYTES", "MAX_ALIASES", "MAX_DEPTH", "safe_yaml_load"),
    "sidefiles": ("MAX_TRACE_BYTES", "MAX_PROFILE_BYTES", "read_trace", "read_profile", "availability_trace",
                  "device_classes"),
    "schema": ("Scenario", "MissingCfg", "SyntheticCfg", "DataCfg", "ChannelCfg", "RateCfg", "DelayCfg",
               "StragglerCfg", "PartialWorkCfg", "SamplingCfg", "StaleCfg", "AsyncCfg", "CrashCfg", "DropCfg",
               "OwnAvailability", "AVAILABILITY_MODELS", "Availability", "FaultsCfg", "NetworkCfg", "DeviceDraw",
               "DEVICE_QUANTITIES", "DeviceClass", "DevicesCfg", "RuntimeCfg", "NAME_RE", "MAX_SIGMA", "MAX_SECONDS",
               "MAX_ROUNDS_SPAN", "MAX_VIEWS", "MAX_SYNTHETIC_VALUES", "Rate"),
    "load": ("load_scenario", "scenario_from_dict", "parse_override", "parse_sets", "as_overrides", "merge_overrides"),
}
_WHERE = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    room = _WHERE.get(name)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{room}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
