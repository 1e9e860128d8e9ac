"""Runs across several Ray nodes: a three-node ``ray.cluster_utils.Cluster`` on this machine.

The head node is small (1 CPU, the workers 2 each): the server (0.5 CPU) still runs
beside the driver and the client actors fill the rest. The cluster runs without token
authentication; every driver is a subprocess with its own HOME (so no token file of the
user's is read or written) joining by address. Its nodes' health checks tolerate a
machine busy with other work (a node is declared dead after about 20 s of failed checks,
not after a few slow answers).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from gated_run import GatedRun

REPO = Path(__file__).resolve().parents[1]
# a check may take 20 s to answer and 10 must fail in a row, 2 s apart
TOLERANT = {"health_check_timeout_ms": 20_000, "health_check_failure_threshold": 10, "health_check_period_ms": 2_000}
QUICK = REPO / "scenarios" / "hw-cefmc.yaml"
SLOW = REPO / "scenarios" / "hw-efimvc-missing.yaml"


@contextlib.contextmanager
def _nodes(n_workers: int = 2):
    """A head of 1 CPU and ``n_workers`` workers of 2 CPUs on this machine, without token
    authentication, its Ray files in a temporary folder; yields (cluster, workers, env)."""
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RAY_AUTH")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    tmp = tempfile.mkdtemp(prefix="rmvc-", dir="/tmp")
    # Cluster writes a pointer to itself under Ray's temporary root (``$RAY_TMPDIR/ray``,
    # /tmp/ray by default, which may not exist): keep it in this folder
    old_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    # the nodes' workers inherit TMPDIR: a cell task killed with its node leaves its
    # temporary run folder in this folder, never in the machine's /tmp
    old_plain_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"), exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="rmvc-home-"))
    c = None
    try:
        try:
            c = Cluster(initialize_head=True, connect=False,
                        head_node_args={"num_cpus": 1, "temp_dir": tmp, "include_dashboard": False,
                                        "_system_config": TOLERANT})
            workers = [c.add_node(num_cpus=2) for _ in range(n_workers)]
            c.wait_for_nodes()
        finally:
            os.environ.pop("RAY_AUTH_MODE", None)
            os.environ.update(saved)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
        env["HOME"] = str(home)
        yield c, workers, env
    finally:
        if c is not None:
            c.shutdown()
        for key, old in (("RAY_TMPDIR", old_tmpdir), ("TMPDIR", old_plain_tmp)):
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    with _nodes(2) as nodes:
        yield nodes


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


def test_a_small_head_node_hosts_the_server_and_the_clients_go_elsewhere(cluster, tmp_path):
    c, _, env = cluster
    r = _cli(["run", str(QUICK), "--address", c.address, "--out", str(tmp_path / "r"), "--json", "--quiet"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["status"] == "completed"
    assert s["placement"]["server_node"] == c.head_node.node_id  # beside the driver, though the head has 1 CPU
    on_head = [cid for cid, node in s["placement"]["client_node"].items() if node == c.head_node.node_id]
    assert len(on_head) <= 1  # 0.5 of the head's CPU is left after the server


def test_actors_no_node_can_take_are_one_line_error_not_a_wait(cluster, tmp_path):
    c, _, env = cluster
    # 6 clients in 3 actors of 1.25 CPU: 4.25 of the cluster's 5 CPUs, but the head (1 CPU, half of it the
    # server's) takes none of them and each worker (2 CPUs) one
    out = tmp_path / "r"
    r = _cli(["run", str(QUICK), "--address", c.address, "--set", "runtime.client_cpus=1.25",
              "--set", "runtime.clients_per_actor=2", "--set", "runtime.placement_timeout_s=2", "--out", str(out)], env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "runtime: 1 of 3 client actors (1.25 CPU each) could not be placed within " \
        "2 s (runtime.placement_timeout_s); the cluster has 4.5 of 5 CPUs free" in last, last
    assert not out.exists() or not any(out.iterdir())  # nothing written: the run never started


GATED_METHOD = """
import dataclasses, os, time
from pathlib import Path

import ray

from raymvc.protocols import kfed

GATE = Path(__file__).with_name("gate")


class GatedClient(kfed.KFedClient):
    def handle(self, msg):
        if self.ctx.client_id == 0:  # once per run: say where it runs, then wait for the test
            node = ray.get_runtime_context().get_node_id()
            (GATE / f"{node}.{os.getpid()}.{time.monotonic_ns()}").write_text("")
            while not (GATE / "go").exists():
                time.sleep(0.05)
        return super().handle(msg)


PROTOCOL = dataclasses.replace(kfed.PROTOCOL, name="gatedkfed", client=GatedClient)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return not open(f"/proc/{pid}/stat").read().split(") ", 1)[1].startswith("Z")  # a zombie has ended
    except FileNotFoundError:
        return False


READY = """
import sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
ray.init(address=sys.argv[1], log_to_driver=False)
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
ping = ray.remote(num_cpus=0)(lambda: True)
assert all(ray.get([ping.options(scheduling_strategy=On(n, soft=False)).remote() for n in nodes], timeout=540))
"""


def test_cells_as_tasks_fill_every_node_and_a_lost_node_reruns_its_cells(tmp_path):
    """A study's cells as Ray tasks: running cells sit on every node of the cluster; a
    node removed while its cells run costs nothing but a rerun of those cells elsewhere.
    A cluster of its own (head and three workers), so the module's cluster never holds a
    node that is gone but not yet declared dead."""
    with _nodes(3) as (c, workers, env):
        _tasks_on_every_node(c, workers[2], env, tmp_path)
    # the killed cells' temporary folders went with the cluster's own (its "gated" runs; any
    # other program's cells may come and go in the machine's /tmp meanwhile)
    assert not list(Path(tempfile.gettempdir()).glob("raymvc-cell-*/gated*"))


def _tasks_on_every_node(c, extra, env, tmp_path):
    import time

    ready = subprocess.run([sys.executable, "-c", READY, c.address], env=env, capture_output=True, text=True,
                           timeout=600)  # every node runs a task before the sweep joins (a loaded machine is slow)
    assert ready.returncode == 0, ready.stderr[-2000:]
    (tmp_path / "gatedkfed.py").write_text(GATED_METHOD)
    gate = tmp_path / "gate"
    gate.mkdir()
    sc = tmp_path / "gated.yaml"
    sc.write_text("name: gated\nmethod: gatedkfed\nparams: {kmeans_init: 1}\n"
                  "data: {dataset: digits, partition: horizontal, n_clients: 3}\nseed: 0\n")
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "raymvc.cli", "sweep", str(sc), "--seeds", "0-7", "--cells", "tasks",
                             "--address", c.address, "--out", str(out), "--quiet"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a bound on a hung cluster, not a timing assumption
        while len(list(gate.iterdir())) < 7 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # 7 cells under way: the cluster's 7 CPUs, one task each
        started = [p.name.split(".")[0] for p in gate.iterdir()]
        assert len(started) == 7, proc.stderr.read() if proc.poll() is not None else started
        nodes = {c.head_node.node_id, *(w.node_id for w in c.worker_nodes)}
        assert set(started) == nodes  # every node runs cells, the head's one CPU included
        on_extra = started.count(extra.node_id)
        assert on_extra >= 1
        pids = [int(p.name.split(".")[1]) for p in gate.iterdir() if p.name.startswith(extra.node_id)]
        c.remove_node(extra, allow_graceful=False)
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline + 120:
            time.sleep(0.1)  # its workers end with their node: only then may the cells go on
        assert not any(_alive(pid) for pid in pids)
        (gate / "go").write_text("")
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        (gate / "go").write_text("")
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    rows = list(csv.DictReader(open(out / "sweep.csv", newline="")))
    assert [r["status"] for r in rows] == ["completed"] * 8
    where = [json.loads((out / r["run_dir"] / "summary.json").read_text())["cell"]["node"] for r in rows]
    assert extra.node_id not in where  # the removed node's cells ran again on the nodes left
    starts = [p.name for p in gate.iterdir() if p.name != "go"]
    assert len(starts) >= 8 + on_extra  # each of its cells started a second time


def test_removing_a_node_mid_run_crashes_its_clients(cluster, tmp_path):
    c, workers, env = cluster
    out = tmp_path / "lose-node"
    args = ["run", str(SLOW), "--address", c.address, "--set", "runtime.placement=spread", "--set", "params.tol=0",
            "--set", "params.max_rounds=40", "--out", str(out), "--json", "--quiet"]
    victim = workers[1]
    with GatedRun(args, at_round=1, env=env) as run:
        run.wait_ready()  # two rounds done, the run waits at the gate
        c.remove_node(victim, allow_graceful=False)
        run.go()
        stdout, stderr = run.proc.communicate(timeout=600)
    assert run.proc.returncode == 0, stderr[-2000:]
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_cluster_commands_on_a_two_cpu_ray_start_cluster(tmp_path):
    """README's two cluster commands as printed (HEAD = this machine), on a cluster of 2 CPUs
    started with `ray start --block` and stopped by ending that one process (never `ray stop`)."""
    import re
    import signal
    import time

    readme = (REPO / "README.md").read_text()
    block = re.search(r"## On a Ray cluster\n\n```bash\n(.*?)```", readme, re.S).group(1)
    start_line, run_line = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    port = _free_port()
    home, tmp = tmp_path / "home", Path(tempfile.mkdtemp(prefix="rmvc-", dir="/tmp"))
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env["HOME"] = str(home)
    start = start_line.replace("6379", str(port)).split() + ["--temp-dir", str(tmp), "--include-dashboard=false",
                                                             "--block"]
    head = subprocess.Popen(start, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = head.stdout.readline()
            lines.append(line)
            if "Ray runtime started" in line or head.poll() is not None:
                break
        assert head.poll() is None, "".join(lines)[-2000:]
        assert not (home / ".ray" / "auth_token").exists()  # as README says: no token written
        args = run_line.replace("HEAD:6379", f"127.0.0.1:{port}").split()
        assert args[:2] == ["raymvc", "run"]
        r = _cli([*args[1:], "--out", str(tmp_path / "r"), "--json", "--quiet"], env, cwd=REPO)
        assert r.returncode == 0, r.stderr[-2000:]
        s = json.loads(r.stdout)
        assert s["status"] == "completed" and s["placement"]["client_cpus"] == 0.25
        # the same without auto: the fixed default does not fit, one line says so
        fixed = [a.replace("runtime.client_cpus=auto", "runtime.client_cpus=0.5") for a in args[1:]]
        r = _cli([*fixed, "--out", str(tmp_path / "f")], env, cwd=REPO)
        assert r.returncode == 2 and "has 2 CPUs, the run needs 3.5" in r.stderr and "set it to auto" in r.stderr
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_sweep_on_the_cluster_reruns_the_run_a_removed_node_hit(cluster, tmp_path):
    """A sweep on three nodes; one node is taken away while the first run waits at a gate:
    that run is run again on the nodes left, and the sweep ends with every run done and
    the same numbers as the same sweep in-process."""
    c, _, env = cluster
    # the node joins as the fixture's did: without token authentication, whatever this process's environment
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RAY_AUTH")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        victim = c.add_node(num_cpus=2)
        c.wait_for_nodes()
    finally:
        os.environ.pop("RAY_AUTH_MODE", None)
        os.environ.update(saved)
    # checkpoints make the driver ask for one round at a time: the run stops at the gate after round 1
    cells = [str(QUICK), "--set", "runtime.client_cpus=0.25", "--set", "runtime.server_cpus=0.25",
             "--set", "runtime.checkpoint=true", "--seeds", "0-2"]
    # one run at a time: the run at the gate is seed 0, its actors spread over all three nodes
    args = ["sweep", *cells, "--address", c.address, "--set", "runtime.placement=spread", "--jobs", "1",
            "--out", str(tmp_path / "ray")]
    with GatedRun(args, at_round=1, env=env) as run:
        run.wait_ready()
        c.remove_node(victim, allow_graceful=False)
        run.go()
        stdout, stderr = run.proc.communicate(timeout=600)
    assert run.proc.returncode == 0, stderr[-3000:]
    assert "seed 0: a node it ran on left the cluster; running it again" in stderr, stderr[-3000:]
    here = _cli(["sweep", *cells, "--backend", "local", "--out", str(tmp_path / "here"), "--quiet"], env)
    assert here.returncode == 0, here.stderr[-2000:]
    rows = {p: list(csv.DictReader(open(tmp_path / p / "sweep.csv"))) for p in ("ray", "here")}
    assert [r["status"] for r in rows["ray"]] == ["completed"] * 3
    keys = ("seed", "acc", "nmi", "ari", "mb", "rounds")
    assert [[r[k] for k in keys] for r in rows["ray"]] == [[r[k] for k in keys] for r in rows["here"]]
    for r in rows["ray"]:  # every run, the one hit included, ran on the nodes left
        s = json.loads((tmp_path / "ray" / r["run_dir"] / "summary.json").read_text())
        assert victim.node_id not in s["placement"]["nodes"]


def test_the_example_cluster_script_stops_only_what_it_started(tmp_path):
    """examples/local_cluster.sh: start prints the address, a run joins it, stop ends every
    process it started and removes its folder (no `ray stop`, nothing left behind)."""
    script = REPO / "examples" / "local_cluster.sh"
    too_long = subprocess.run(["bash", str(script), "start", str(tmp_path / ("x" * 40))], capture_output=True, text=True)
    assert too_long.returncode == 2 and "at most 40 characters" in too_long.stderr
    where = Path(tempfile.mkdtemp(prefix="rmvc-lc-", dir="/tmp")) / "c"  # short: Ray's socket paths live here
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env["HOME"] = str(tmp_path / "home")
    port = str(_free_port())
    start = subprocess.run(["bash", str(script), "start", str(where), port, "2"], capture_output=True, text=True,
                           timeout=300, env=env)
    try:
        assert start.returncode == 0, start.stderr[-2000:]
        address = start.stdout.strip().splitlines()[-1]
        assert address == f"127.0.0.1:{port}"
        r = _cli(["run", str(QUICK), "--address", address, "--set", "runtime.client_cpus=auto",
                  "--out", str(tmp_path / "run"), "--json", "--quiet"], {**env, "RAY_AUTH_MODE": "disabled"})
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout)["status"] == "completed"
    finally:
        stop = subprocess.run(["bash", str(script), "stop", str(where)], capture_output=True, text=True,
                              timeout=300, env=env)
    assert stop.returncode == 0, stop.stderr[-2000:]
    left = subprocess.run(["pgrep", "-f", str(where)], capture_output=True, text=True).stdout.split()
    assert left == [] and not where.exists()
    assert not (tmp_path / "home" / ".ray").exists()  # no token written
    where.parent.rmdir()
