"""Federated clustering methods, one module each (installed as ``raymvc.protocols``).

Each module defines ``PROTOCOL``, a :class:`raymvc.protocol.Protocol`. Modules are
imported lazily so that a numpy-only method never pays for importing torch.
"""

from __future__ import annotations

import importlib

from raymvc.protocol import Protocol

# method name -> module (relative to this package)
_REGISTRY: dict[str, str] = {
    "cefmc": "cefmc",
    "cefmc-h": "cefmc",
    "efimvc": "efimvc",
    "kfed": "kfed",
    "ccfc": "ccfc",
    "feddmvc": "feddmvc",
}


def available() -> list[str]:
    """Names of all registered methods."""
    return sorted(_REGISTRY)


def get(name: str) -> Protocol:
    """The :class:`Protocol` registered under ``name``."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown method {name!r}; choose one of {', '.join(available())}")
    module = importlib.import_module(f"{__name__}.{_REGISTRY[name]}")
    protocols = getattr(module, "PROTOCOLS", None) or {module.PROTOCOL.name: module.PROTOCOL}
    return protocols[name]
