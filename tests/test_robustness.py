"""A run keeps its results whatever stops it, and one client's failure is that client's alone."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from gated_run import GatedRun

from raymvc.cli import main
from raymvc.driver import run_scenario
from raymvc.messages import Message
from raymvc.protocols import cefmc
from raymvc.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "scenarios" / "hw-cefmc.yaml"
SLOW = REPO / "scenarios" / "hw-efimvc-missing.yaml"


def run(tmp_path, name, *overrides, backend="local", **kw):
    sc = load_scenario(QUICK, [f"runtime.backend={backend}", *overrides])
    return run_scenario(sc, tmp_path / name, progress=lambda line: None, **kw)


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_used_out_folder_is_refused_or_emptied(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(out), "--quiet"]) == 0
    (out / "stray.txt").write_text("from another run")
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(out), "--quiet", "--set", "seed=7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --out") and "--overwrite" in err
    assert json.loads((out / "summary.json").read_text())["seed"] == 0  # untouched
    (out / "errors.log").write_text("from the run before")  # a file raymvc writes: removed by --overwrite
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(out), "--quiet", "--set", "seed=7",
                 "--overwrite"]) == 0
    assert (out / "stray.txt").read_text() == "from another run"  # raymvc deletes only what it writes
    assert not (out / "errors.log").exists()
    assert json.loads((out / "summary.json").read_text())["seed"] == 7
    assert "seed: 7" in (out / "scenario.yaml").read_text()


def _stop_after_rounds(args, out: Path, sig: int, rounds: int = 2):
    """Send ``sig`` while the run waits at a gate after ``rounds`` rounds, then let it go on."""
    with GatedRun(["run", *args, "--out", str(out), "--quiet"], at_round=rounds - 1) as run:
        run.wait_ready()
        os.kill(run.proc.pid, sig)
        run.go()
        _, err = run.proc.communicate(timeout=600)
    return run.proc.returncode, err


@pytest.mark.parametrize("sig,backend", [(signal.SIGINT, "local"), (signal.SIGTERM, "ray")])
def test_a_stopped_run_writes_its_summary_and_ledger(tmp_path, sig, backend):
    out = tmp_path / "stopped"
    code, err = _stop_after_rounds([str(SLOW), "--backend", backend, "--set", "params.tol=0",
                                    "--set", "params.max_rounds=200"], out, sig)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted"
    done = len((out / "rounds.jsonl").read_text().splitlines())
    assert s["rounds"] >= done >= 2
    ledger = rows(out / "messages.csv")
    assert ledger and s["communication"]["messages"] == sum(r["path"] == "protocol" for r in ledger)
    assert len(rows(out / "labels.csv")) == s["n_samples"]


def test_an_unencodable_reply_is_that_clients_error(tmp_path, monkeypatch):
    real = cefmc.CeFMCClient.handle

    def bad(self, msg):
        reply = real(self, msg)
        if self.ctx.client_id == 1 and self.ctx.round == 2:
            return Message(reply.kind, reply.fields, note="\ud800")  # a lone surrogate: no UTF-8 for it
        return reply

    monkeypatch.setattr(cefmc.CeFMCClient, "handle", bad)
    s = run(tmp_path, "bad-reply")
    assert s["status"] == "error"
    errs = s["faults"]["client_errors"]
    assert [(e["round"], e["client"]) for e in errs] == [(2, 1)] and "unencodable reply" in errs[0]["error"]
    assert s["participation"][1]["missed"] == 1
    rounds = [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]
    assert rounds[2]["client_errors"] == [1] and s["rounds"] == len(rounds)
    assert s["metrics"]["acc"] > 0.9


def test_complex_arrays_cannot_be_put_in_a_message():
    with pytest.raises(TypeError, match="unsupported dtype"):
        Message("x", a=np.ones(3, dtype=complex))


@pytest.mark.parametrize("evict_after,evicted", [(3, []), (1, [2])])
def test_a_hung_client_times_out_in_process_and_can_be_evicted(tmp_path, monkeypatch, evict_after, evicted):
    """Client 2 hangs in round 1 until the wall-clock limit on its call rings. The limit's
    clock is the test's: the alarm the server arms for every call never rings by itself,
    only when the hung client lets its time run out, so a slow machine makes no other
    client late."""
    armed = []
    monkeypatch.setattr(signal, "setitimer", lambda which, seconds, interval=0.0: armed.append(seconds) or (0.0, 0.0))
    real = cefmc.CeFMCClient.handle
    hung = []

    def hangs(self, msg):
        if self.ctx.client_id == 2 and self.ctx.round == 1:
            hung.append(armed[-1])
            assert signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN), "no limit on this call"
            signal.raise_signal(signal.SIGALRM)  # the limit runs out while the client hangs
            raise AssertionError("the call went on after its limit rang")
        return real(self, msg)

    monkeypatch.setattr(cefmc.CeFMCClient, "handle", hangs)
    s = run(tmp_path, f"hung{evict_after}", "runtime.reply_timeout_s=0.5", f"runtime.evict_after={evict_after}")
    assert hung == [0.5]  # the call had runtime.reply_timeout_s, and hung once
    assert s["status"] == "degraded"
    assert s["faults"]["late_replies"] == 1 and s["faults"]["evicted_clients"] == evicted
    ledger = rows(Path(s["out_dir"]) / "messages.csv")
    hung_rows = [r for r in ledger if r["round"] == "1" and r["dst"] == "client:2"]
    assert [r["status"] for r in hung_rows] == ["late"]  # counted the same way in summary and ledger
    if evicted:
        assert s["faults"]["crashed_clients"] == [2]
    else:
        assert s["participation"][2]["last_replied"] == s["rounds"] - 1  # back after the hang


def test_a_round_lost_to_the_wall_clock_limit_names_the_setting(tmp_path, monkeypatch):
    """Every client outlives runtime.reply_timeout_s in round 1 (a long local step): the run
    fails as too few replies, and its error says which setting they met."""
    monkeypatch.setattr(signal, "setitimer", lambda which, seconds, interval=0.0: (0.0, 0.0))
    real = cefmc.CeFMCClient.handle

    def hangs(self, msg):
        if self.ctx.round == 1:
            signal.raise_signal(signal.SIGALRM)  # the limit runs out while the client works
        return real(self, msg)

    monkeypatch.setattr(cefmc.CeFMCClient, "handle", hangs)
    s = run(tmp_path, "slow", "runtime.reply_timeout_s=7.5")
    assert s["status"] == "failed" and s["rounds"] == 2
    assert s["error"].startswith("round 1: 0 of ") and s["error"].endswith(
        "did not answer within runtime.reply_timeout_s = 7.5 s of wall time (raise it for long local work)")


def test_a_handshake_timeout_is_a_clean_failure(ray_session, tmp_path):
    s = run(tmp_path, "tiny-timeout", "runtime.reply_timeout_s=0.001", backend="ray")
    assert s["status"] == "failed"
    assert "\x1b[" not in json.dumps(s.to_dict())
    errs, faults = s["faults"]["client_errors"], s["faults"]
    # an idle actor can answer the handshake within a millisecond; whoever did not is a
    # setup error of one plain line, and whoever did is late in round 0
    assert all(e["path"] == "setup" and e["error"].startswith("could not connect") and "\n" not in e["error"]
               for e in errs)
    assert {e["client"] for e in errs} == set(faults["disconnected_clients"])
    assert len(errs) + faults["late_replies"] == s["n_clients"]
    assert "\n" not in s["error"]


def test_sigkill_then_resume_gives_the_uninterrupted_result(tmp_path, capsys):
    full = tmp_path / "full"
    assert main(["run", str(SLOW), "--backend", "local", "--out", str(full), "--quiet"]) == 0
    out = tmp_path / "killed"
    args = ["run", str(SLOW), "--backend", "local", "--checkpoint", "--out", str(out), "--quiet"]
    with GatedRun(args, at_round=2, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as run:
        run.wait_ready()  # rounds 0-2 are on disk and checkpointed; the run waits
        run.proc.kill()  # SIGKILL: nothing of the driver runs any more
        run.proc.wait(timeout=60)
    pointer = out / "checkpoint.json"
    assert json.loads(pointer.read_text())["rounds_logged"] == 3
    assert not (out / "summary.json").exists()
    kept = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()][:3]
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 0
    said = capsys.readouterr()
    lines = (said.out + said.err).splitlines()
    so_far = sum(r["wire_bytes"] for r in kept) / 1e6
    assert f"resumed after round 3 ({so_far:.3f} MB so far)" in "\n".join(lines)  # counted as progress counts
    fourth = next(x for x in lines if re.search(r"\] round 4\b", x))  # the MB goes on from the rounds before the kill
    assert float(fourth.split(" MB")[0].split()[-1]) > so_far
    a, b = (json.loads((d / "summary.json").read_text()) for d in (out, full))
    assert a["metrics"] == b["metrics"] and a["communication"] == b["communication"] and a["rounds"] == b["rounds"]
    assert (out / "labels.csv").read_text() == (full / "labels.csv").read_text()
    assert len((out / "rounds.jsonl").read_text().splitlines()) == a["rounds"]
    assert not pointer.exists()  # a finished run drops its checkpoints


def test_resume_needs_a_checkpoint_and_says_when_the_run_has_ended(tmp_path, capsys):
    for flags in ([], ["--checkpoint"]):  # a finished run keeps no checkpoint, whether it saved them or not
        out = tmp_path / f"plain{len(flags)}"
        assert main(["run", str(QUICK), "--backend", "local", "--out", str(out), "--quiet", *flags]) == 0
        assert main(["run", "--resume", str(out), "--quiet"]) == 2
        assert f"--resume {out}: the run there ended (completed); nothing to resume" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    assert "no checkpoint there" in capsys.readouterr().err


def test_a_crash_in_a_dropout_round_is_still_a_crash_and_checkpoints_go_on(tmp_path):
    s = run(tmp_path, "crash-drop", "faults.crash=[{client: 1, at_round: 2}]", "faults.drop=[{client: 1, at_round: 2}]",
            "runtime.checkpoint=true")
    assert s["status"] == "degraded", s["error"]
    assert s["faults"]["crashed_clients"] == [1]


def test_bad_combinations_are_one_line_errors(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(out), "--quiet", "--checkpoint"]) == 0
    assert main(["run", "--resume", str(out), "--seed", "3"]) == 2  # another seed would be another data split
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(tmp_path / "notes"), "--overwrite"]) == 2
    assert (tmp_path / "notes" / "mine.txt").exists()  # --overwrite empties run folders only
    assert main(["validate", str(QUICK), "--set", "faults.drop=[{client: 9, at_round: 1}]"]) == 2
    echo = tmp_path / "echo.yaml"
    echo.write_text("method: raymvc.bench.fedavg_echo\nparams: {rounds: 2}\n"
                    "data: {dataset: digits, partition: horizontal, n_clients: 3}\n"
                    "channel: {secure_aggregation: true}\nruntime: {checkpoint: true}\n")
    assert main(["validate", str(echo)]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(lines) == 4
    assert "--seed" in lines[0] and "not a run folder" in lines[1] and "faults.drop: client 9 does not exist" in lines[2]
    assert "runtime.checkpoint: cannot be combined with channel.secure_aggregation" in lines[3]


def test_pooled_clients_match_unpooled_and_crash_alone(ray_session, tmp_path):
    kfed = REPO / "scenarios" / "digits-kfed.yaml"
    common = ["data.n_clients=20", "runtime.client_cpus=0.25", "faults.crash=[{client: 3, at_round: 1}]"]
    runs = {}
    for name, extra in (("local", ["runtime.backend=local"]), ("ray1", ["runtime.clients_per_actor=1"]),
                        ("ray5", ["runtime.clients_per_actor=5"])):
        sc = load_scenario(kfed, [*common, *extra])
        runs[name] = run_scenario(sc, tmp_path / name, progress=lambda line: None)
    for name, s in runs.items():
        assert s["status"] == "degraded" and s["faults"]["crashed_clients"] == [3], name
    labels = {n: (tmp_path / n / "labels.csv").read_text() for n in runs}
    assert labels["ray5"] == labels["ray1"] == labels["local"]
    assert runs["ray5"]["communication"] == runs["ray1"]["communication"] == runs["local"]["communication"]
    assert runs["ray5"]["placement"]["clients_per_actor"] == 5
    crashed_rows = [r for r in rows(tmp_path / "ray5" / "labels.csv") if r["cluster"] == "-1"]
    assert 0 < len(crashed_rows) < runs["ray5"]["n_samples"] / 10  # only client 3's samples lack a label


# --------------------------------------------------------------------------- a client isolated from the driver


class _NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr for you")

    def __str__(self):
        raise RuntimeError("no str either")


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), _Unprintable(),
                                 ValueError("x" * 10_000 + "\n" + "more\n" * 12)])
def test_whatever_a_client_raises_is_its_error_in_process(tmp_path, monkeypatch, exc):
    """SystemExit and KeyboardInterrupt from client code end neither the driver nor the run;
    summary.json keeps one bounded line, the traceback travels apart in RunEnd."""
    from raymvc.runtime.nodes import ServerNode

    real, real_finish = cefmc.CeFMCClient.handle, ServerNode.finish
    ends = []

    def bad(self, msg):
        if self.ctx.client_id == 1 and self.ctx.round == 1:
            raise exc
        return real(self, msg)

    def finish(self, *a, **k):
        ends.append(real_finish(self, *a, **k))
        return ends[-1]

    monkeypatch.setattr(cefmc.CeFMCClient, "handle", bad)
    monkeypatch.setattr(ServerNode, "finish", finish)
    s = run(tmp_path, "raises")
    assert s["status"] == "error"  # the client's code raised: an error, not an injected fault
    (err,) = s["faults"]["client_errors"]
    assert (err["round"], err["client"]) == (1, 1) and set(err) == {"round", "client", "path", "error"}
    assert err["error"].startswith(type(exc).__name__) and "\n" not in err["error"] and len(err["error"]) <= 300
    (record,) = ends[0].client_errors
    assert "Traceback" in record["traceback"] and "in bad" in record["traceback"]
    assert len(record["traceback"]) <= 64_000
    assert len(json.dumps(s["faults"])) < 1_000
    assert "in bad" in (Path(s["out_dir"]) / "errors.log").read_text()


def test_a_reply_whose_repr_raises_is_that_clients_error(tmp_path, monkeypatch):
    real = cefmc.CeFMCClient.handle

    def bad(self, msg):
        reply = real(self, msg)
        if self.ctx.client_id == 2 and self.ctx.round == 1:
            reply.fields["junk"] = _NoRepr()  # neither repr, str nor the codec can take it
        return reply

    monkeypatch.setattr(cefmc.CeFMCClient, "handle", bad)
    s = run(tmp_path, "norepr")
    assert s["status"] == "error"
    (err,) = s["faults"]["client_errors"]
    assert (err["round"], err["client"]) == (1, 2)
    assert err["error"].startswith("unencodable reply (Message 'labels'): CodecError") and len(err["error"]) <= 300


def _pool(monkeypatch, behave):
    """A pool of clients 0 and 1 (FedAvg echo) and frames for them; ``behave(cid)`` runs in
    every client call first."""
    from raymvc.bench import fedavg_echo
    from raymvc.channel import Endpoint
    from raymvc.data.types import Shard
    from raymvc.runtime.nodes import SERVER, ClientPool, client_party
    from raymvc.runtime.spec import RunSpec
    from raymvc.scenario import ChannelCfg, FaultsCfg, NetworkCfg

    real = fedavg_echo.EchoClient.handle

    def handle(self, msg):
        behave(self.ctx.client_id)
        return real(self, msg)

    monkeypatch.setattr(fedavg_echo.EchoClient, "handle", handle)
    shards = {c: Shard(views=[np.zeros((3, 2))]) for c in (0, 1)}
    spec = RunSpec(method="raymvc.bench.fedavg_echo", params={"floats": 4}, n_clients=2, n_clusters=2, seed=0,
                   channel=ChannelCfg(), faults=FaultsCfg(), network=NetworkCfg())
    pool = ClientPool(shards, spec)
    server = Endpoint(SERVER)
    keys = pool.hello_all(None)
    for c in keys:
        server.add_peer(client_party(c), None)
    rnd = iter(range(100))

    def frames():
        r = next(rnd)
        return {c: server.seal(client_party(c), r, Message("model", w=np.ones(4))).parts for c in (0, 1)}

    return pool, frames


def test_a_hung_pooled_client_times_out_alone(monkeypatch):
    release = __import__("threading").Event()
    hang = {0}

    def behave(cid):
        if cid in hang:
            release.wait()

    pool, frames = _pool(monkeypatch, behave)
    try:
        # the wait bounds the hung client; the healthy one answers long before it on a loaded machine
        out = pool.deliver(frames(), 3.0)
        assert [out[c][0] for c in (0, 1)] == ["timeout", "ok"]
        out = pool.deliver(frames(), 3.0)  # still busy with the first call: late at once
        assert [out[c][0] for c in (0, 1)] == ["timeout", "ok"] and "still busy" in out[0][2]
        hang.clear()
    finally:
        release.set()
    pool.busy[0].done.wait(10)
    out = pool.deliver(frames(), 10)
    assert [out[c][0] for c in (0, 1)] == ["ok", "ok"]  # back once its abandoned call returned
    pool.kill(0)
    assert pool.deliver(frames(), 10)[0][0] == "crashed"


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
def test_an_exit_in_a_pooled_client_is_its_error_alone(monkeypatch, exc):
    def behave(cid):
        if cid == 0:
            raise exc(5)

    pool, frames = _pool(monkeypatch, behave)
    out = pool.deliver(frames(), 10)
    assert out[0][0] == "error" and out[0][2].startswith(exc.__name__) and "Traceback" in out[0][4]
    assert out[1][0] == "ok"


MISBEHAVE = """
name: misbehave-{act}
method: raymvc.bench.misbehave
params: {{rounds: 4, floats: 8, client: 0, round: 1, act: {act}, hang_s: 120}}
data: {{dataset: digits, partition: horizontal, n_clients: 4}}
runtime: {{backend: ray, clients_per_actor: 2, reply_timeout_s: 5, evict_after: 1, client_cpus: 0.25}}
seed: 0
"""


@pytest.mark.parametrize("act", ["hang", "exit", "raise"])
def test_a_pooled_client_on_ray_harms_no_neighbour(ray_session, tmp_path, act):
    """Clients 0 and 1 share an actor; client 0 hangs, exits or raises in round 1. Only
    client 0 misses a round or leaves; client 1 answers every round."""
    path = tmp_path / "s.yaml"
    path.write_text(MISBEHAVE.format(act=act))
    s = run_scenario(load_scenario(path), tmp_path / act, progress=lambda line: None)
    part = s["participation"]
    assert part[1] == {"addressed": 4, "replied": 4, "missed": 0, "last_replied": 3}, part
    assert [c for c, p in part.items() if p["missed"]] == [0]
    if act == "hang":  # late, then evicted alone: a fault, not an error
        assert s["status"] == "degraded" and s["faults"]["evicted_clients"] == [0]
        assert s["faults"]["crashed_clients"] == [0] and s["faults"]["late_replies"] == 1
    else:  # its code raised: the run's error, the neighbour untouched
        assert s["status"] == "error" and s["faults"]["crashed_clients"] == []
        (err,) = s["faults"]["client_errors"]
        assert (err["client"], err["round"]) == (0, 1)
        assert err["error"] == ("SystemExit: 3" if act == "exit" else "RuntimeError: client 0 misbehaves in round 1")
        assert part[0]["missed"] == 1 and part[0]["last_replied"] == 3


def test_with_secure_aggregation_a_rounds_dropout_is_shared_by_its_exchanges():
    from raymvc.runtime.faults import FaultPlan
    from raymvc.scenario import FaultsCfg

    ids = list(range(50))
    plan = FaultPlan(FaultsCfg(dropout={"rate": 0.2}), ids, seed=1, exchanges=3)
    lost = [any(plan.dropped(r, c, sub) for sub in range(3)) for r in range(200) for c in ids]
    assert abs(np.mean(lost) - 0.2) < 0.02  # the rate is the chance of missing the round
    plain = FaultPlan(FaultsCfg(dropout={"rate": 0.2}), ids, seed=1)
    assert [plain.dropped(r, c) for r in range(20) for c in ids] == \
        [FaultPlan(FaultsCfg(dropout={"rate": 0.2}), ids, seed=1).dropped(r, c) for r in range(20) for c in ids]


def test_a_method_left_with_nothing_by_injected_faults_fails_not_errors(tmp_path, monkeypatch):
    from raymvc.protocol import NoInput

    def nothing(self, round, replies, missing):
        raise NoInput("cefmc: no client delivered its embedding")

    monkeypatch.setattr(cefmc.CeFMCServer, "step", nothing)
    s = run(tmp_path, "nothing")
    assert s["status"] == "failed" and "no client delivered" in s["error"]
    assert not s["faults"]["client_errors"] and not (tmp_path / "nothing" / "errors.log").exists()


def test_a_second_signal_stops_a_ray_run_whose_client_hangs(tmp_path):
    """The clients hang in round 1 under a 300 s reply limit; after round 0 is on disk, two
    SIGINTs to a sweep: its cell's run hears them through the sweep's handler and ends as
    interrupted by both, without waiting for the limit (a wait inside Ray is cut into short
    slices that a signal can end), and the sweep starts nothing more."""
    command = "sweep"
    sc = tmp_path / "hang.yaml"
    sc.write_text("name: hang\nmethod: hang_in_round_one\n"
                  "data: {dataset: digits, partition: horizontal, n_clients: 2}\n"
                  "runtime: {backend: ray, reply_timeout_s: 300, client_cpus: 0.5}\n")
    out = tmp_path / "out"
    argv = [command, str(sc), "--out", str(out)] + (["--seeds", "0,1"] if command == "sweep" else [])
    mark = tmp_path / "hanging"
    env = dict(os.environ, RAYMVC_TEST_HANG_MARK=str(mark),
               PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "methods"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "raymvc.cli", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(1800):  # until a client hangs in round 1 (it leaves the mark)
            if mark.exists():
                break
            assert proc.poll() is None, proc.communicate()[0]
            threading.Event().wait(0.1)
        assert mark.exists(), "no client reached round 1"
        proc.send_signal(signal.SIGINT)
        threading.Event().wait(1.0)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)  # far below the 300 s reply limit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, text
    summary = json.loads(((out / "hang_seed0") if command == "sweep" else out).joinpath("summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == "SIGINT, then SIGINT", summary["error"]
    assert not (out / "hang_seed1").exists()
