"""The driver's side of a run: the engine that prepares the data and drives the rounds, the
Ray instance it starts or joins, where actors go, warm actors, checkpoints, stop signals and
a sweep's cells as Ray tasks. Nothing here runs in a party's actor (tests/test_layout.py
checks it in a worker); the parties' side is :mod:`raymvc.runtime`.

The entry points are imported lazily, so that importing this package costs nothing.
"""

from __future__ import annotations

__all__ = ["run_scenario", "prepare", "init_ray"]


def __getattr__(name: str):
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
