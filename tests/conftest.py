"""Shared fixtures: one Ray instance for the whole session, started only if a test needs it."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

# Before any test module loads numpy or torch: importing raymvc pins the numerical libraries'
# code paths in this process (raymvc.arithmetic), as it does in every process of a run. A
# test module that imported numpy first would leave the in-process parties on the CPU's own
# kernels (AVX-512 OpenBLAS and numpy loops where the CPU has them) while Ray's workers are
# pinned, and the two backends would differ in their last bits.
import raymvc  # noqa: E402,F401  (imported for its effect)

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _ray_temp_root():
    """Ray's temporary root for the whole session (``RAY_TMPDIR``), a fresh short folder
    removed afterwards: any Ray a test starts -- an embedded instance a run starts itself,
    a subprocess's, a test cluster's pointer file -- keeps its session files there, not
    under /tmp/ray."""
    old = os.environ.get("RAY_TMPDIR")
    root = tempfile.mkdtemp(prefix="rmvc-", dir="/tmp")  # short: Ray's socket paths live here
    os.makedirs(os.path.join(root, "ray"), exist_ok=True)
    os.environ["RAY_TMPDIR"] = root
    yield root
    if old is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = old
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance (pinned logical CPUs, two logical GPUs, no dashboard), shared by
    all tests. The GPUs are Ray's bookkeeping only: actors that ask for one get an id,
    whether or not the machine has a GPU behind it.

    It authenticates with a token held in the environment only and keeps its session
    files in a temporary folder removed afterwards, so the tests leave no token in
    ~/.ray and no Ray state under /tmp/ray for another program to pick up.
    """
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    tmp = tempfile.mkdtemp(prefix="rmvc-", dir="/tmp")  # short: Ray's socket paths live here
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _temp_dir=tmp)
    yield ray
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _data_from_the_shared_folder_only(tmp_path_factory):
    """Fetched data sets come from a temporary cache, seeded through the shared data folder as
    a mirror where there is one: no test downloads anything or writes to the user's cache."""
    old = {k: os.environ.get(k) for k in ("RAYMVC_DATA", "RAYMVC_DATA_MIRROR", "RAYMVC_DATA_OFFLINE")}
    os.environ["RAYMVC_DATA"] = str(tmp_path_factory.mktemp("data-cache"))
    os.environ["RAYMVC_DATA_OFFLINE"] = "1"
    if SHARED_DATA.is_dir():
        os.environ["RAYMVC_DATA_MIRROR"] = str(SHARED_DATA)
    else:
        os.environ["RAYMVC_DATA_MIRROR"] = str(tmp_path_factory.mktemp("no-mirror"))
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def scenario_path():
    return lambda name: SCENARIOS / name


# The files an embedded Ray leaves behind for other programs to find: a token in the home
# folder, a pointer to the running cluster and the latest session's folder under /tmp/ray.
# The suite must create none of them.
_RAY_LEFTOVERS = (Path.home() / ".ray" / "auth_token", Path("/tmp/ray/ray_current_cluster"),
                  Path("/tmp/ray/session_latest"))


@pytest.fixture(scope="session", autouse=True)
def _leaves_no_ray_state_behind():
    """Fail the session if it created ``~/.ray/auth_token`` or anything of the above under /tmp/ray."""
    before = {p: p.exists() for p in _RAY_LEFTOVERS}
    yield
    created = [str(p) for p, existed in before.items() if not existed and p.exists()]
    if created:
        pytest.fail("the test session created files outside its temporary folders: " + ", ".join(created) +
                    " (tests must keep Ray's token in RAY_AUTH_TOKEN and its state in a temporary folder)",
                    pytrace=False)
