"""Federated clustering methods, one module each (installed as ``raymvc.protocols``).

Each module defines ``PROTOCOL``, a :class:`raymvc.protocol.Protocol`. Modules are
imported lazily so that a numpy-only method never pays for importing torch.

A scenario's ``method`` is one of three things, looked up in this order:

1. a name registered here (``cefmc``, ``kfed``, ...);
2. a name an installed package registers in the entry-point group ``raymvc.protocols``
   (``[project.entry-points."raymvc.protocols"] mymethod = "mypkg.mymethod"``; the
   value is a module defining ``PROTOCOL``, or a ``module:attribute`` naming a Protocol);
3. an import path of a module that defines ``PROTOCOL`` (``method: mylab.mymethod``).
   The module must be importable by the driver and by the Ray workers: installed, on
   ``PYTHONPATH``, or under the current directory (which is then added to both).
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata

from raymvc.protocol import Protocol

ENTRY_POINT_GROUP = "raymvc.protocols"

# method name -> module (relative to this package)
_REGISTRY: dict[str, str] = {
    "cefmc": "cefmc",
    "cefmc-h": "cefmc",
    "efimvc": "efimvc",
    "kfed": "kfed",
    "ccfc": "ccfc",
    "feddmvc": "feddmvc",
    "fcuif": "fcuif",
}


def _entry_points() -> dict[str, metadata.EntryPoint]:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken distribution must not hide the built-in methods
        return {}
    return {ep.name: ep for ep in eps}


def available() -> list[str]:
    """Names of all registered methods (built-in and entry points)."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def _from_module(module, name: str) -> Protocol:
    protocols = getattr(module, "PROTOCOLS", None)
    if protocols and name in protocols:
        return protocols[name]
    proto = getattr(module, "PROTOCOL", None)
    if not isinstance(proto, Protocol):
        raise KeyError(f"module {module.__name__!r} defines no PROTOCOL (a raymvc.protocol.Protocol)")
    return proto


def _import_user_module(path: str):
    """Import ``path``; if it is not importable, try again with the current directory on sys.path.

    The current directory is also put on ``PYTHONPATH`` so that Ray workers started
    afterwards by this driver find the same module.
    """
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        top = path.split(".")[0]
        cwd = os.getcwd()
        if e.name not in {top, path} or cwd in sys.path:
            raise
        if not (os.path.exists(os.path.join(cwd, top + ".py")) or os.path.isdir(os.path.join(cwd, top))):
            raise
        sys.path.insert(0, cwd)
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = cwd if not old else os.pathsep.join([cwd, old])
        return importlib.import_module(path)


def get(name: str) -> Protocol:
    """The :class:`Protocol` for ``name``: a registered name, an entry point or an import path."""
    if name in _REGISTRY:
        module = importlib.import_module(f"{__name__}.{_REGISTRY[name]}")
        return _from_module(module, name)
    if name in sys.modules and "." in name:  # an import path already imported: no metadata scan
        return _from_module(sys.modules[name], name)
    eps = _entry_points()
    if name in eps:
        obj = eps[name].load()
        return obj if isinstance(obj, Protocol) else _from_module(obj, name)
    if "." in name or name.isidentifier():
        try:
            module = _import_user_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                raise KeyError(_unknown(name)) from None
            raise KeyError(f"method {name!r}: importing it failed: {e}") from None
        except Exception as e:  # the user's module raised while importing
            raise KeyError(f"method {name!r}: importing it failed: {type(e).__name__}: {e}") from None
        return _from_module(module, name)
    raise KeyError(_unknown(name))


def _unknown(name: str) -> str:
    import difflib

    names = available()
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"unknown method {name!r}; {hint}choose one of {', '.join(names)}, or the import path of a "
            "module that defines PROTOCOL (installed, on PYTHONPATH or in the current directory)")
