"""Runs across several Ray nodes: a three-node ``ray.cluster_utils.Cluster`` on this machine.

The cluster runs without token authentication; every driver is a subprocess with its
own HOME (so no token file of the user's is read or written) joining by address.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "scenarios" / "hw-cefmc.yaml"
SLOW = REPO / "scenarios" / "hw-efimvc-missing.yaml"


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RAY_AUTH")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    tmp = tempfile.mkdtemp(prefix="rmvc-", dir="/tmp")
    try:
        c = Cluster(initialize_head=True, connect=False,
                    head_node_args={"num_cpus": 2, "temp_dir": tmp, "include_dashboard": False})
        workers = [c.add_node(num_cpus=2) for _ in range(2)]
        c.wait_for_nodes()
    finally:
        os.environ.pop("RAY_AUTH_MODE", None)
        os.environ.update(saved)
    home = Path(tempfile.mkdtemp(prefix="rmvc-home-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env["HOME"] = str(home)
    yield c, workers, env
    c.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)


def _cli(args, env, **kw):
    return subprocess.run([sys.executable, "-m", "raymvc.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, **kw)


def _labels(out: Path) -> str:
    return (out / "labels.csv").read_text()


def test_clients_spread_over_three_nodes_same_results(cluster, tmp_path):
    c, workers, env = cluster
    r = _cli(["run", str(QUICK), "--address", c.address, "--set", "runtime.placement=spread",
              "--out", str(tmp_path / "multi"), "--json", "--quiet"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["status"] == "completed"
    assert len(s["placement"]["nodes"]) == 3  # the six client actors sit on all three nodes
    assert s["placement"]["server_node"] == c.head_node.node_id  # beside the driver
    local = _cli(["run", str(QUICK), "--backend", "local", "--out", str(tmp_path / "one"), "--json", "--quiet"], env)
    one = json.loads(local.stdout)
    assert _labels(tmp_path / "multi") == _labels(tmp_path / "one")
    assert s["metrics"] == one["metrics"] and s["communication"] == one["communication"]


def test_removing_a_node_mid_run_crashes_its_clients(cluster, tmp_path):
    c, workers, env = cluster
    out = tmp_path / "lose-node"
    proc = subprocess.Popen([sys.executable, "-m", "raymvc.cli", "run", str(SLOW), "--address", c.address,
                             "--set", "runtime.placement=spread", "--set", "params.tol=0",
                             "--set", "params.max_rounds=40", "--out", str(out), "--json", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rounds = out / "rounds.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if rounds.exists() and len(rounds.read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before a node could be removed"
    victim = workers[1]
    c.remove_node(victim, allow_graceful=False)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-2000:]
    assert stdout.strip(), stderr[-3000:]
    s = json.loads(stdout)  # Ray's own messages about the lost node go to stderr, not into the JSON
    on_victim = sorted(int(cid) for cid, node in s["placement"]["client_node"].items() if node == victim.node_id)
    assert on_victim, "no client was placed on the removed node"
    assert s["status"] == "degraded"
    assert s["faults"]["crashed_clients"] == on_victim
    for name in ("summary.json", "messages.csv", "rounds.jsonl", "labels.csv"):
        assert (out / name).is_file(), name


def test_stale_token_file_is_one_clear_error(cluster, tmp_path):
    c, _, env = cluster
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)  # left over from another cluster
    r = _cli(["run", str(QUICK), "--address", c.address, "--out", str(tmp_path / "x")], {**env, "HOME": str(home)})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "runtime.address" in last and "RAY_AUTH_MODE=disabled" in last
