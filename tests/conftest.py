"""Shared fixtures: one Ray instance for the whole session, started only if a test needs it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance (pinned logical CPUs, no dashboard), shared by all tests."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def scenario_path():
    return lambda name: SCENARIOS / name
