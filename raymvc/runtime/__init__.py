"""Ray actors, the round engine, the in-process backend and fault injection.

The driver's entry points are imported lazily: a Ray worker that only hosts a client
node (``raymvc.runtime.nodes``) does not pay for the driver's imports (metrics,
scikit-learn, results).
"""

from __future__ import annotations

__all__ = ["run_scenario", "prepare", "init_ray"]


def __getattr__(name: str):
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
