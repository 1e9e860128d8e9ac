"""Ray actors, the round engine, the in-process backend and fault injection."""

from .engine import init_ray, prepare, run_scenario

__all__ = ["run_scenario", "prepare", "init_ray"]
