"""Joining an existing Ray cluster (`ray start --head`) instead of starting one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.5)
    return False


@pytest.fixture
def isolated_env():
    """Environment for a head node and its drivers that touches nothing of the user's.

    HOME points at a temporary folder (``ray start`` writes its token to ~/.ray) and Ray's
    temporary root is a fresh short folder (its socket paths must stay short), removed
    afterwards, so no stale cluster pointer is left for other Ray programs.
    """
    home = Path(tempfile.mkdtemp(prefix="rmvc-home-"))
    ray_tmp = Path(tempfile.mkdtemp(prefix="rmvc-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(HOME=str(home), RAY_TMPDIR=str(ray_tmp))
    try:
        yield env, ray_tmp
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture
def head_node(isolated_env):
    env, ray_tmp = isolated_env
    port = _free_port()
    # the same interpreter as the tests, so the workers import this checkout of raymvc
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
                             "--num-cpus=4", "--include-dashboard=false", "--node-ip-address=127.0.0.1",
                             f"--temp-dir={ray_tmp}", "--block"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        if not _wait_listening(port, 90):
            pytest.fail("the Ray head node did not start")
        yield f"127.0.0.1:{port}", env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)  # the whole process group: head, raylet, workers
            head.wait(timeout=30)


def test_run_joins_a_running_cluster(head_node, tmp_path):
    head_node, env = head_node
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "raymvc.cli", "run", str(REPO / "scenarios" / "hw-cefmc.yaml"),
                        "--address", head_node, "--out", str(out), "--json", "--quiet"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["backend"] == "ray" and s["status"] == "completed"
    assert s["metrics"]["acc"] >= 0.93
    assert "runtime:\n  backend: ray\n  address: " + head_node in (out / "scenario.yaml").read_text()


def test_unreachable_cluster_is_one_clean_error(tmp_path):
    port = _free_port()  # nothing listens there
    r = subprocess.run([sys.executable, "-m", "raymvc.cli", "run", str(REPO / "scenarios" / "hw-cefmc.yaml"),
                        "--address", f"127.0.0.1:{port}", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"runtime.address: cannot join the Ray cluster at 127.0.0.1:{port}" in last


EMBEDDED = r"""
import json, os, sys
import ray
from raymvc.driver import cluster
from raymvc.scenario import load_scenario
sc = load_scenario(sys.argv[1], ["runtime.num_cpus=2"])
pids, monitor_at_shutdown = [], []
plain_shutdown = ray.shutdown
def shutdown(*a, **k):  # what Ray's shutdown finds: the monitor must be gone already
    node = ray._private.worker._global_node
    monitor_at_shutdown.extend(i.process.poll() for i in node.all_processes.get("monitor", []))
    return plain_shutdown(*a, **k)
ray.shutdown = shutdown
for round_ in range(2):  # start, stop, start again: the second instance must come up as the first did
    cluster.init_ray(sc, 2)
    node = ray._private.worker._global_node
    pids += [info.process.pid for infos in node.all_processes.values() for info in infos]
    assert ray.get(ray.remote(lambda: 1).remote()) == 1
    if round_ == 0:
        cluster.stop_embedded()
        assert not ray.is_initialized()
        assert monitor_at_shutdown and None not in monitor_at_shutdown, monitor_at_shutdown
print(json.dumps(pids), flush=True)
"""  # the second instance is left to the exit hook


def test_embedded_instance_stops_without_leaving_processes(isolated_env, tmp_path):
    """The exit hook (and an explicit stop) end every process of the embedded instance: the
    monitor, which Ray's own shutdown leaves to a one-second timeout, goes first."""
    env, _ = isolated_env
    r = subprocess.run([sys.executable, "-c", EMBEDDED, str(REPO / "scenarios" / "hw-cefmc.yaml")],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    pids = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(pids) >= 4  # gcs, raylet, monitor, log monitor, ... of two instances

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for good
                return f.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    end = time.time() + 30
    while time.time() < end and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


SWITCH = r"""
import sys
import ray
from raymvc.driver import cluster
from raymvc.scenario import load_scenario
cluster.init_ray(load_scenario(sys.argv[1], ["runtime.num_cpus=2"]), 2)
try:
    cluster.init_ray(load_scenario(sys.argv[1], [f"runtime.address=127.0.0.1:{sys.argv[2]}"]), 2)
except cluster.ClusterError as e:
    print("ClusterError", ray.is_initialized(), e)
"""


def test_a_run_naming_a_cluster_does_not_reuse_the_embedded_instance(isolated_env, tmp_path):
    """After an embedded run, a scenario with runtime.address must join that address (here:
    nothing listens, a one-line error), not quietly run on the embedded instance."""
    env, _ = isolated_env
    port = _free_port()
    r = subprocess.run([sys.executable, "-c", SWITCH, str(REPO / "scenarios" / "hw-cefmc.yaml"), str(port)],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ClusterError False runtime.address: cannot join the Ray cluster at "
                               f"127.0.0.1:{port}"), r.stdout


def test_placement_timeout_is_validated_like_the_other_runtime_keys(capsys):
    from raymvc.cli import main

    assert main(["validate", str(REPO / "scenarios" / "hw-cefmc.yaml"), "--set", "runtime.placement_timeout_s=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "runtime.placement_timeout_s" in err[0]


def test_the_unplaced_count_packs_bundles_node_by_node():
    from raymvc.driver.placement import _fits

    assert _fits([0.5, 2.0, 2.0], 1.25, 3) == 2  # no bundle straddles two nodes
    assert _fits([1.0, 2.0, 2.0], 0.5, 6) == 6
    assert _fits([0.0], 0.5, 2) == 0


class _FakeRay:
    """What the placement error reads from Ray: live nodes with their total and free CPUs."""

    def __init__(self, nodes: dict[str, tuple[float, float]]):
        self._nodes = nodes  # node id -> (free, total)
        self._private = type("P", (), {"state": type("S", (), {"available_resources_per_node": self._free})})

    def _free(self):
        return {n: {"CPU": f} for n, (f, _) in self._nodes.items()}

    def nodes(self):
        return [{"NodeID": n, "Alive": True, "Resources": {"CPU": t}} for n, (_, t) in self._nodes.items()]


def test_the_placement_error_names_what_could_not_be_placed(scenario_path):
    from raymvc.driver.placement import _unplaced
    from raymvc.scenario import load_scenario

    sc = load_scenario(scenario_path("hw-cefmc.yaml"), ["runtime.server_cpus=1"])
    busy = _FakeRay({"a": (0.5, 1.0), "b": (0.5, 2.0)})  # another job holds most of the CPUs
    msg = _unplaced(busy, sc, 6, server_placed=False)
    assert msg.startswith("runtime: the server (1 CPU) and 4 of 6 client actors (0.5 CPU each) could not be placed "
                          "within 60 s (runtime.placement_timeout_s); the cluster has 1 of 3 CPUs free "
                          "(per node, free/total: 0.5/1, 0.5/2)"), msg
    assert _unplaced(busy, sc, 2, server_placed=False).startswith("runtime: the server (1 CPU) could not be placed")
    # the bundles look as if they fit, yet Ray placed none: all of them are named
    assert "runtime: 2 client actors (0.5 CPU each) could not" in _unplaced(busy, sc, 2, server_placed=True)


def test_client_cpus_auto_shares_the_free_cpus_within_bounds():
    from raymvc.driver.cluster import cpus_needed
    from raymvc.driver.placement import client_cpus
    from raymvc.scenario import scenario_from_dict

    def sc(v, server=0.5):
        return scenario_from_dict({"name": "a", "method": "kfed", "data": {"dataset": "digits"},
                                   "runtime": {"client_cpus": v, "server_cpus": server}})

    assert client_cpus(sc("auto"), 6, 2.0) == 0.25  # (2 - 0.5) / 6
    assert client_cpus(sc("auto"), 3, 16.0) == 1.0  # at most one CPU an actor
    assert client_cpus(sc("auto"), 100, 2.0) == 0.05  # at least the floor, even if that oversubscribes
    assert client_cpus(sc("auto"), 7, 2.0) == 0.21  # in hundredths, rounded down
    assert client_cpus(sc(0.3), 6, 2.0) == 0.3  # a number is taken as it is
    assert cpus_needed(sc("auto"), 6) == pytest.approx(6 * 0.05 + 0.5)


def test_gpus_asked_for_enter_the_bundles_and_a_cluster_without_them_is_one_line():
    from raymvc.driver.cluster import ClusterError
    from raymvc.driver.placement import _bundle, _check_gpus
    from raymvc.scenario import scenario_from_dict

    def rt(**kw):
        return scenario_from_dict({"name": "a", "method": "kfed", "data": {"dataset": "digits"},
                                   "runtime": kw}).runtime

    class Cluster:
        def __init__(self, gpus):
            self.gpus = gpus

        def cluster_resources(self):
            return {"CPU": 16.0, **({"GPU": self.gpus} if self.gpus else {})}

    assert _bundle(0.5, 0.0) == {"CPU": 0.5} and _bundle(0.5, 0.25) == {"CPU": 0.5, "GPU": 0.25}
    _check_gpus(Cluster(0), rt(), 6)  # none asked for: nothing to check
    _check_gpus(Cluster(2), rt(client_gpus=0.25, server_gpus=0.5), 6)  # 2.0 needed, 2 there
    with pytest.raises(ClusterError, match=r"^runtime.client_gpus: the run needs 1.5 GPUs \(6 client actors x 0.25 "
                                           r"\+ server 0\), the cluster has 0$"):
        _check_gpus(Cluster(0), rt(client_gpus=0.25), 6)
    with pytest.raises(ClusterError, match="^runtime.server_gpus: the run needs 1 GPUs"):
        _check_gpus(Cluster(0.5), rt(server_gpus=1), 6)
    with pytest.raises(Exception, match="client_gpus"):
        rt(client_gpus=-1)
