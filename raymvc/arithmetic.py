"""Pinned arithmetic: the numerical libraries' code paths fixed, so that a seed gives the
same labels whatever a machine's environment variables and thread settings say, and every
machine takes one code path per library. It does not make a deep method's labels equal
between an Intel and an AMD CPU: measured in ``benchmarks/cross_cpu.md`` (the operations one
by one: ``benchmarks/cross_cpu_ops.py``); docs/reproducibility.md.

The libraries under a run choose their kernels from the CPU they find: MKL (inside torch)
takes other branches on Intel and on AMD, OpenBLAS (numpy's and scipy's) other kernels on
AVX-512 machines, ATen (torch's own kernels) and oneDNN their widest vector unit, numpy its
widest ufunc loops. Each choice moves the last bits of a float sum, and a deep method's
labels with them. Each library also offers a switch that fixes its choice; this module sets
them, and says which it set, in every process of a run:

* in the driver when :mod:`raymvc` is imported (:func:`apply`; ``raymvc/__init__.py`` calls it
  before anything imports numpy or torch), which covers the in-process backend;
* in the workers of the Ray instance raymvc starts here, by inheritance: Ray's processes
  start from the driver's environment, which :func:`apply` has pinned already (a job-level
  ``runtime_env`` would cost every run its prestarted workers);
* in the workers of a cluster raymvc joins (``runtime.address``), through the job's
  ``runtime_env`` (:func:`ray_runtime_env`), set before each worker process starts, so an
  actor on another machine computes the same way; a worker of a Ray instance someone else
  started pins itself when it imports raymvc (the actor and task code does, before it
  imports numpy), and reports what it got;
* thread counts are fixed per run (``runtime.threads``, :mod:`raymvc.runtime.threads`);
* the torch methods take every product of their models and losses from OpenBLAS, not MKL
  (``protocols/_torch.py``): MKL's COMPATIBLE branch, documented as the same on every CPU,
  gives other bits on an Intel Xeon and an AMD EPYC for some product shapes (measured in
  ``benchmarks/cross_cpu_ops.md``); OpenBLAS with its core type fixed gave the same bits on
  both for every operation probed.

``RAYMVC_ARITHMETIC=native`` (set before Python imports raymvc) leaves the libraries to
choose, for speed; the summary's ``arithmetic`` block says which mode each run used and
whether every process of it was pinned (:func:`describe`, :func:`combine`). The cost of
pinning per method is measured by ``benchmarks/arithmetic_cost.py``.

A machine that fixes OpenBLAS's core type itself (``OPENBLAS_CORETYPE``: older OpenBLAS
builds compute wrong results on some processors) keeps its value; the summary lists it
under ``kept``. Every other variable below is set to the pinned value whatever the
environment says (a perturbing ``MKL_CBWR``, ``MKL_ENABLE_INSTRUCTIONS`` or
``ATEN_CPU_CAPABILITY`` loses).

This module imports nothing but the standard library: it runs before numpy loads.
"""

from __future__ import annotations

import os
import sys

MODE_VAR = "RAYMVC_ARITHMETIC"
MODES = ("pinned", "native")

# variable -> (pinned value, what it fixes). MKL documents only its COMPATIBLE branch as
# giving the same results on Intel and non-Intel processors (its AVX2 branch falls back to
# automatic dispatch off Intel); COMPATIBLE is SSE2 without the approximate rcpps/rsqrtps.
PINNED: dict[str, tuple[str, str]] = {
    "MKL_CBWR": ("COMPATIBLE", "MKL (torch's BLAS and LAPACK): its branch documented as identical on "
                               "Intel and other CPUs, with fixed cache sizes and deterministic reductions"),
    "OPENBLAS_CORETYPE": ("Haswell", "OpenBLAS (numpy's and scipy's BLAS and LAPACK): its AVX2 kernels "
                                     "on every CPU"),
    "ATEN_CPU_CAPABILITY": ("avx2", "ATen (torch's own kernels and their vector maths): the AVX2 build"),
    "ONEDNN_MAX_CPU_ISA": ("AVX2", "oneDNN (torch's fused kernels): at most AVX2"),
    "DNNL_MAX_CPU_ISA": ("AVX2", "oneDNN, under its older name"),
    "NPY_DISABLE_CPU_FEATURES": ("", "numpy's ufunc loops: at most AVX2 (X86_V3), never the AVX-512 ones"),
}
# numpy's names for its AVX-512 dispatch targets (numpy warns of names it does not know)
_NPY_AVX512 = {"new": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy >= 2.3
               "old": "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"}


def _npy_avx512() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(x) for x in version("numpy").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return _NPY_AVX512["new"]
    return _NPY_AVX512["new" if (major, minor) >= (2, 3) else "old"]


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (``None`` where there is none to read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_supports_pin() -> tuple[bool, str]:
    """Whether this CPU can run the pinned kernels (x86-64 with AVX2 and FMA), and if not, why."""
    import platform

    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return False, f"not an x86-64 CPU ({machine})"
    flags = cpu_flags()
    if flags is None:
        return True, ""  # no /proc/cpuinfo to read: trust the architecture
    return ("avx2" in flags and "fma" in flags), "the CPU has no AVX2"
# variables that would let a library choose again (numpy refuses both NPY_* set at once)
CLEARED = ("MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "NPY_ENABLE_CPU_FEATURES")
# set by a machine for its own sake: kept as found
KEPT = ("OPENBLAS_CORETYPE",)

_state: dict = {"mode": None, "error": None, "kept": {}, "overridden": {}, "cleared": {}, "late": []}


def mode_from(environ) -> tuple[str, str | None]:
    """``(mode, error)`` from ``RAYMVC_ARITHMETIC`` (unset or empty: ``pinned``)."""
    raw = str(environ.get(MODE_VAR, "") or "").strip().lower()
    if not raw:
        return "pinned", None
    if raw not in MODES:
        return "pinned", f"{MODE_VAR}: must be one of {', '.join(MODES)}, got {raw[:40]!r}"
    return raw, None


def pinned_value(var: str) -> str:
    return _npy_avx512() if var == "NPY_DISABLE_CPU_FEATURES" else PINNED[var][0]


def settings_for(environ) -> tuple[dict[str, str], dict[str, str]]:
    """``(settings, kept)``: the values pinned arithmetic puts in force given ``environ``."""
    settings, kept = {}, {}
    for var in PINNED:
        value, have = pinned_value(var), environ.get(var)
        if var in KEPT and have:
            settings[var] = kept[var] = have
        else:
            settings[var] = value
    return settings, kept


def pin(environ) -> dict:
    """Put the pinned values into ``environ`` (a mapping); returns what it did:
    ``kept``, ``overridden`` (variable -> the value it replaced), ``cleared`` and ``changed``."""
    settings, kept = settings_for(environ)
    done: dict = {"kept": kept, "overridden": {}, "cleared": {}, "changed": False}
    for var, value in settings.items():
        old = environ.get(var)
        if old is not None and old != value:
            done["overridden"][var] = old
        done["changed"] = done["changed"] or old != value
        environ[var] = value
    for var in CLEARED:
        if var in environ:
            done["cleared"][var] = environ.pop(var)
            done["changed"] = True
    return done


def apply(environ=None) -> str:
    """Put the mode's variables in force in this process (once; later calls only return it).

    Called by ``raymvc/__init__.py``. Libraries that were imported before it (a caller that
    imported numpy or torch first) may have chosen already: they are listed under ``late``
    in :func:`describe`, and that process is reported as not pinned where a check shows it.
    """
    if _state["mode"] is not None:
        return _state["mode"]
    environ = os.environ if environ is None else environ
    mode, error = mode_from(environ)
    ok, why = cpu_supports_pin()
    if mode == "pinned" and not ok:  # the pinned kernels would not run here: the libraries choose
        mode, _state["unsupported"] = "native", why
    _state["original"] = {v: environ.get(v) for v in (*PINNED, *CLEARED)}
    _state.update(mode=mode, error=error)
    if mode == "pinned":
        done = pin(environ)
        _state.update(kept=done["kept"], overridden=done["overridden"], cleared=done["cleared"])
        # a library loaded before a variable changed may have chosen its path already
        _state["late"] = sorted(m for m in ("numpy", "scipy", "torch") if m in sys.modules) if done["changed"] else []
    return mode


def original_environ(environ=None) -> dict[str, str]:
    """This process's environment as it was before :func:`apply` changed it: what a child
    process started in ``native`` mode must get (it would otherwise inherit the pin)."""
    apply()
    env = dict(os.environ if environ is None else environ)
    for var, value in (_state.get("original") or {}).items():
        if value is None:
            env.pop(var, None)
        else:
            env[var] = value
    return env


def mode() -> str:
    return apply()


def check() -> str | None:
    """A one-line error when ``RAYMVC_ARITHMETIC`` holds no known mode (else ``None``)."""
    apply()
    return _state["error"]


def ray_runtime_env() -> dict:
    """The ``runtime_env`` that puts this process's mode into a Ray worker before it starts
    (given to ``ray.init`` for the whole job when joining a cluster: every worker shares it,
    so none is started apart for it)."""
    if apply() == "native":
        return {"env_vars": {MODE_VAR: "native"}}
    settings, kept = settings_for(os.environ)
    # a value this machine kept is its own, not the other nodes': each worker's own pin decides there
    env = {k: v for k, v in settings.items() if k not in kept}
    return {"env_vars": {MODE_VAR: "pinned", **env, "NPY_ENABLE_CPU_FEATURES": ""}}


def _openblas() -> list[str]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - a dependency
        return []
    return sorted({str(d.get("architecture")) for d in threadpool_info() if d.get("internal_api") == "openblas"})


def _numpy_widest() -> str | None:
    if "numpy" not in sys.modules:
        return None
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy 1.x
        try:
            from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        except ImportError:
            return None
    on = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    return on[-1] if on else "baseline"


def _aten() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # pragma: no cover - an old torch
        return None


def describe() -> dict:
    """What this process computes with: the mode, the variables in force, what was kept,
    overridden or cleared, the libraries that loaded before the pin, and what the loaded
    libraries report (OpenBLAS's core types, ATen's capability, numpy's widest ufunc loop).

    ``pinned`` is true only in pinned mode, with every variable at its pinned value (a
    machine's own ``OPENBLAS_CORETYPE``, kept, makes it false), torch not loaded before the pin (MKL's
    branch cannot be read back) and every report matching the pinned value (OpenBLAS's and
    numpy's choices are read back, so a numpy loaded early that chose right still counts).
    """
    mode = apply()
    out: dict = {"mode": mode}
    if mode == "native":
        out["pinned"] = False
        out["found"] = {v: os.environ[v] for v in (*PINNED, *CLEARED) if os.environ.get(v)}
        if _state.get("unsupported"):
            out["unsupported"] = _state["unsupported"]
    else:
        settings, _ = settings_for(os.environ)
        out["settings"] = settings
        out["kept"] = dict(_state["kept"])
        out["overridden"] = dict(_state["overridden"])
        out["cleared"] = dict(_state["cleared"])
        out["late"] = list(_state["late"])
    # the products of the torch methods' models and losses (protocols/_torch.py)
    out["torch_products"] = "OpenBLAS (through numpy) on the CPU" if mode == "pinned" else "torch's own"
    reports = {"openblas": _openblas(), "aten": _aten(), "numpy": _numpy_widest()}
    out["reports"] = {k: v for k, v in reports.items() if v not in (None, [])}
    if mode == "pinned":
        want = settings["OPENBLAS_CORETYPE"].lower()
        # what is in force now, read back: every pinned value, no variable that would choose again
        ok = all(os.environ.get(v) == pinned_value(v) for v in PINNED) and not any(os.environ.get(v) for v in CLEARED)
        ok = ok and "torch" not in _state["late"] and all(a.lower() == want for a in reports["openblas"])
        ok = ok and reports["aten"] in (None, "AVX2") and reports["numpy"] in (None, "baseline", "X86_V3", "AVX2")
        out["pinned"] = bool(ok)
    return out


def combine(parts: dict[str, dict], expected: int | None = None) -> dict:
    """One summary block from the descriptions of a run's processes (``{"driver": d, ...}``):
    the driver's description, ``pinned`` only if every process was, and the processes whose
    description differs from the driver's (by name). ``expected``: how many processes the run
    had; one that did not report (unreachable) makes ``pinned`` false (``unreported``)."""
    driver = parts.get("driver") or describe()
    others = {k: v for k, v in parts.items() if k != "driver" and v}
    out = dict(driver)
    out["pinned"] = bool(driver.get("pinned")) and all(v.get("pinned") for v in others.values())
    out["processes"] = 1 + len(others)
    if expected is not None and expected > out["processes"]:
        out["unreported"] = expected - out["processes"]
        out["pinned"] = False
    key = _comparable(driver)
    out["differing"] = sorted(k for k, v in others.items() if _comparable(v) != key)
    return out


def _comparable(d: dict) -> tuple:
    return (d.get("mode"), bool(d.get("pinned")), tuple(sorted((d.get("settings") or {}).items())))


__all__ = ["MODE_VAR", "MODES", "PINNED", "CLEARED", "KEPT", "apply", "mode", "check", "describe", "combine",
           "ray_runtime_env", "settings_for", "mode_from", "pin", "original_environ"]
