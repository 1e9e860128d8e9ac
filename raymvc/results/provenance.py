"""What a run's result depends on, as digests: the code that ran and the resolved scenario.

A sweep reuses a finished cell only when its ``fingerprint`` is unchanged, and a
checkpoint is resumed only by the same code, so neither can report or continue a
result that other code or other settings produced.

* :func:`code_version` -- a digest of the engine (every file of the ``raymvc`` package,
  its built-in data included) and of the method: the modules that define its client,
  server and config and the private helper modules (``_*.py``) beside them.
* :func:`fingerprint` -- a digest of the resolved scenario (the YAML after every
  ``--set`` and grid value, seed included), the content of a user data file and of an
  availability trace it names, and the code version.
* :func:`platform_info` -- what else a result can move with, recorded but not part of the
  fingerprint: the numerical libraries' versions, the interpreter, the CPU architecture,
  model and count. Two machines with the same code and seed may differ in these and in the
  last digits of a float sum, which can move a seed's labels (or number its clusters
  otherwise) with the same scores: a hash of ``labels.csv`` holds on one platform.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

_ENGINE = Path(__file__).resolve().parents[1]  # the raymvc package


def _digest_files(files: list[Path], root: Path, h) -> None:
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")


def _is_source(f: Path) -> bool:
    return f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo")


@functools.lru_cache(maxsize=1)
def engine_version() -> str:
    h = hashlib.sha256()
    _digest_files([f for f in _ENGINE.rglob("*") if _is_source(f)], _ENGINE, h)
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=64)  # which files: fixed once imported; their content is digested on every call
def method_files(method: str) -> list[Path]:
    """The modules that define ``method`` (its client, server and config, and the classes
    they derive from beside them: FCUIF's are FedDMVC's) and the private helper modules
    (``_*.py``) beside them, sorted."""
    from ..protocols import get

    proto = get(method)
    files: set[Path] = set()
    for cls in (proto.client, proto.server, proto.config):
        path = Path(getattr(sys.modules.get(cls.__module__), "__file__", "") or "")
        if not path.is_file():
            continue
        files |= {path.resolve(), *(f.resolve() for f in path.parent.glob("_*.py") if f.name != "__init__.py")}
        for base in cls.__mro__[1:]:  # a base class in a module beside it is part of the method
            base_path = Path(getattr(sys.modules.get(base.__module__), "__file__", "") or "")
            if base_path.is_file() and base_path.resolve().parent == path.resolve().parent:
                files.add(base_path.resolve())
    return sorted(files)


def method_version(method: str) -> str:
    """The digest of :func:`method_files`, read again whenever a file changed (size or
    modification time): a method of one's own edited between two runs of one process
    gets another version."""
    h = hashlib.sha256(method.encode() + b"\0")
    for f in sorted(method_files(method)):
        st = f.stat()
        h.update(f.name.encode() + b"\0" + _file_digest(str(f), st.st_size, st.st_mtime_ns).encode() + b"\0")
    return h.hexdigest()[:16]


def own_model_files(sc) -> list[Path]:
    """The modules of an availability model (``model: module:Class``), a selection rule
    (``faults.sampling.rule``) and the fault kinds (``faults.kinds``) of one's own, as files."""
    from .. import availability, kinds, selection

    found = []
    model = getattr(getattr(sc.faults, "availability", None), "model", None)
    if isinstance(model, str) and availability.is_import_path(model):
        found.append(availability.get_model(model))
    rule = getattr(getattr(sc.faults, "sampling", None), "rule", None)
    if isinstance(rule, str) and selection.is_import_path(rule):
        found.append(selection.get_rule(rule))
    for entry in getattr(sc.faults, "kinds", None) or []:
        if entry.kind not in kinds.REGISTRY:
            found.append(kinds.get_kind(entry.kind))
    paths = [Path(getattr(sys.modules.get(cls.__module__), "__file__", "") or "") for cls in found]
    return [p.resolve() for p in paths if p.is_file()]


PLATFORM_PACKAGES = ("numpy", "scipy", "scikit-learn", "torch", "ray")


@functools.lru_cache(maxsize=1)
def platform_info() -> dict:
    """The driver process's platform: ``{"python", "machine", "cpu", "cpus", <package>: version}``
    for the installed ones of :data:`PLATFORM_PACKAGES` (read from their metadata, nothing
    imported); ``cpu`` is the processor's model where the system says it."""
    import os
    import platform
    from importlib import metadata

    out: dict = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    if cpu := cpu_model():
        out["cpu"] = cpu
    for name in PLATFORM_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else what :mod:`platform`
    says), on one line; empty where neither tells."""
    import platform

    try:
        with open("/proc/cpuinfo", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return " ".join(value.split())[:100]
    except OSError:
        pass
    return " ".join((platform.processor() or "").split())[:100]


def cpu_kind(text: str) -> str:
    """"Intel", "AMD" or "" (another CPU, or a text without its model): the kind of CPU a
    processor's model name (or a platform line holding it) names."""
    return next((k for k in ("Intel", "AMD") if k in text), "")


def platform_text(info: dict | None) -> str:
    """``numpy 2.4.6, scipy 1.17.1, ...; Python 3.11.7, x86_64 (Intel(R) Xeon(R) Processor), 2 CPUs``
    (empty for none; runs recorded before the CPU's model was leave it out)."""
    if not info or not isinstance(info, dict):  # none, or not what the engine writes
        return ""
    libs = ", ".join(f"{k} {info[k]}" for k in PLATFORM_PACKAGES if info.get(k))
    cpu = f" ({info['cpu']})" if isinstance(info.get("cpu"), str) and info["cpu"] else ""
    where = f"Python {info.get('python', '?')}, {info.get('machine', '?')}{cpu}, {info.get('cpus', '?')} CPUs"
    return f"{libs}; {where}" if libs else where


def code_version(method: str) -> str:
    return f"{engine_version()}-{method_version(method)}"


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def fingerprint(sc, data_source: str | None = None) -> str:
    """A digest of everything that determines a run's result (see the module's docstring);
    ``data_source`` ``memory:<digest>`` stands for data handed over in memory."""
    h = hashlib.sha256(sc.to_yaml().encode())
    if data_source and data_source.startswith("memory:"):
        h.update(data_source.encode())
    trace = [sc.trace_path()] if sc.trace_path() is not None else []  # an availability trace
    trace += [sc.profile_path()] if sc.profile_path() is not None else []  # a device profile
    # an availability model of one's own is code the result depends on, as the method's is
    for p in (sc.data_files() if sc.data.path is not None else []) + trace + own_model_files(sc):
        p = p.resolve()
        st = p.stat()
        h.update(_file_digest(str(p), st.st_size, st.st_mtime_ns).encode())
    h.update(code_version(sc.method).encode())
    return h.hexdigest()[:24]
