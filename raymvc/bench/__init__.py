"""Helpers for the scripts in ``benchmarks/``: protocols that measure the engine, not a method."""
