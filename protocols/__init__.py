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
   ``PYTHONPATH`` or beside the scenario file that names it; never from the working
   directory alone. The engine hands the folders it searched to every party it starts.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
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
    "kmeans": "kfed",
    "ffcm": "ffcm",
    "fcm": "ffcm",
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


_SEARCH: list[str] = []  # folders of scenario files read in this process, searched for methods
_FROM_FOLDER: dict[str, str] = {}  # top-level module name -> the file it was loaded from (one of _SEARCH)


def add_search_path(folder: str | os.PathLike) -> None:
    """Look for a method's module in ``folder`` too (a scenario file's folder), after the
    installed packages and ``PYTHONPATH``."""
    folder = os.path.abspath(folder)
    if folder not in _SEARCH:
        _SEARCH.append(folder)


def search_paths() -> list[str]:
    """The folders :func:`add_search_path` added, in order (the engine passes them to the parties)."""
    return list(_SEARCH)


def _not_here() -> list[str]:
    """``sys.path`` without the working directory (``""``, ``"."`` or its absolute path):
    a module is never taken from wherever the command happens to run."""
    cwd = os.path.realpath(os.getcwd())
    return [p for p in sys.path if p not in ("", ".") and os.path.realpath(p) != cwd]


def import_user_module(path: str):
    """Import ``path`` from the installed packages and ``PYTHONPATH`` (never the working
    directory), else from the first of the scenario files' folders (:func:`add_search_path`)
    that holds its top-level module.

    A module already imported is used as it is. Otherwise the module (or its top-level
    package) is loaded from the folder it was found in, by its file location; ``sys.path``
    and the environment are left as they are. Every party the engine starts gets the same
    folders, so a Ray worker finds the module the same way. A scenario that names a module
    runs that module's code: see docs/threat-model.md.
    """
    top = path.split(".")[0]
    if top in _FROM_FOLDER:  # loaded from a scenario's folder earlier in this process
        _one_file(top)
    if top in sys.modules or top in sys.builtin_module_names:
        return importlib.import_module(path)
    saved = sys.path[:]
    try:  # installed packages and PYTHONPATH, every finder included (editable installs), never the working directory
        sys.path[:] = _not_here()
        if importlib.util.find_spec(top) is not None:
            return importlib.import_module(path)
    finally:
        sys.path[:] = saved
    _one_file(top)
    for folders in ([f] for f in _SEARCH):
        spec = importlib.machinery.PathFinder.find_spec(top, folders)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[top] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(top, None)
            raise
        _FROM_FOLDER[top] = os.path.realpath(spec.origin or folders[0])
        return module if path == top else importlib.import_module(path)
    raise ModuleNotFoundError(f"No module named {top!r}", name=top)


class AmbiguousModuleError(ImportError):
    """One module name lies beside two scenario files read in one process."""


def _one_file(top: str) -> None:
    """Refuse a name that two of the scenario folders read in this process hold as different
    files: whichever loaded first would serve every scenario that names it (a run after
    another in one process, a sweep, a notebook), and results would follow the order."""
    files = module_files(top, _SEARCH)
    if len({_content(f) for f in files}) > 1:
        raise AmbiguousModuleError(
            f"module {top!r} lies beside two scenario files read in this process, and one would serve both: "
            f"give them different names ({', '.join(files)})", name=top)


def _content(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return path.encode()


def own_class(name: str, base: type, what: str) -> type:
    """The class ``module.path:ClassName`` names, imported as a method of one's own is, if it
    derives from ``base`` and has a pydantic ``Config``; else KeyError naming ``what``."""
    from pydantic import BaseModel

    module_name, _, attr = name.partition(":")
    try:
        module = import_user_module(module_name)
    except (Exception, SystemExit) as e:  # not found, or the user's module raised (or exited) while importing
        raise KeyError(f"{what} {name!r}: importing {module_name} failed: {type(e).__name__}: {e}") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, base) and isinstance(getattr(cls, "Config", None), type)
            and issubclass(cls.Config, BaseModel)):
        raise KeyError(f"{what} {name!r}: {module_name} has no {base.__name__} subclass {attr!r} with a pydantic Config")
    return cls


def module_files(top: str, folders) -> list[str]:
    """The distinct files that module ``top`` would be loaded from in each of ``folders``."""
    found = []
    for folder in folders:
        spec = importlib.machinery.PathFinder.find_spec(top, [os.path.abspath(folder)])
        if spec is not None and spec.origin and os.path.realpath(spec.origin) not in found:
            found.append(os.path.realpath(spec.origin))
    return found


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
            module = import_user_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                raise KeyError(_unknown(name)) from None
            raise KeyError(f"method {name!r}: importing it failed: {e}") from None
        except (Exception, SystemExit) as e:  # the user's module raised (or called sys.exit) while importing
            raise KeyError(f"method {name!r}: importing it failed: {type(e).__name__}: {e}") from None
        return _from_module(module, name)
    raise KeyError(_unknown(name))


def _unknown(name: str) -> str:
    import difflib

    names = available()
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"unknown method {name!r}; {hint}choose one of {', '.join(names)}, or the import path of a "
            "module that defines PROTOCOL (installed, on PYTHONPATH or beside the scenario file)")
