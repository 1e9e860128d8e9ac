"""The parties' side of a run: the client and server nodes a Ray actor (or the in-process
backend) hosts, their rounds, exchanges and transport, fault injection, secure aggregation
and the state a checkpoint saves. The driver's side is :mod:`raymvc.driver`; this package
imports none of it, so a worker that hosts a node pays only for what the node needs.

``run_scenario``, ``prepare`` and ``init_ray`` are still reachable from here (resolved
lazily from :mod:`raymvc.driver`), as they were before the two sides were split.
"""

from __future__ import annotations

__all__ = ["run_scenario", "prepare", "init_ray"]


def __getattr__(name: str):
    if name in __all__:
        from .. import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
