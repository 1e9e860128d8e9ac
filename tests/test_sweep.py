"""Studies: grid parsing, resumable sweeps, the aggregate (failed runs counted, never averaged), plots, report."""

from __future__ import annotations

import csv
import json

import pytest

import raymvc.study.execute as sweep_mod
from raymvc.cli import main
from raymvc.scenario import ScenarioError
from raymvc.study.sweep import aggregate, parse_grid, parse_seeds

TINY = """
name: {name}
method: kfed
params: {{kmeans_init: 1, max_iter: 50}}
data:
  dataset: synthetic
  partition: horizontal
  n_clients: 3
  synthetic: {{n_samples: 150, n_views: 1, dims: 4, n_clusters: 3}}
runtime: {{backend: local}}
seed: 0
"""


def tiny(tmp_path, name="tiny"):
    p = tmp_path / f"{name}.yaml"
    p.write_text(TINY.format(name=name))
    return p


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_grid_values_are_one_yaml_list():
    grid = parse_grid(["faults.crash=[[], [{client: 2, at_round: 2}]]", "faults.dropout.rate=0,0.1",
                       "data.views=[[0], [0, 1]]", "channel.encryption=[none, aes-gcm]"])
    assert grid[0] == ("faults.crash", [[], [{"client": 2, "at_round": 2}]])
    assert grid[1] == ("faults.dropout.rate", [0, 0.1])
    assert grid[2] == ("data.views", [[0], [0, 1]])
    assert grid[3] == ("channel.encryption", ["none", "aes-gcm"])
    for bad, words in [("faults.crash=[[}", "not a valid YAML list"), ("faults.crash=[]", "non-empty"),
                       ("nokey", "expected key.path="), ("a..b=[1]", "bad key path")]:
        with pytest.raises(ScenarioError, match=words):
            parse_grid([bad])
    with pytest.raises(ScenarioError, match="given twice"):
        parse_grid(["seed=[1]", "seed=[2]"])


def test_seeds():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(ScenarioError, match="--seeds"):
        parse_seeds("a")


def test_aggregate_excludes_failed_runs_and_counts_statuses():
    rows = [
        {"scenario": "s", "method": "m", "k": "0", "status": "completed", "acc": 0.8, "nmi": 0.5, "ari": 0.4, "mb": 1.0},
        {"scenario": "s", "method": "m", "k": "0", "status": "degraded", "acc": 0.6, "nmi": 0.3, "ari": 0.2, "mb": 3.0},
        {"scenario": "s", "method": "m", "k": "0", "status": "failed", "acc": 0.1, "nmi": 0.0, "ari": 0.0, "mb": 9.0},
        {"scenario": "s", "method": "m", "k": "0", "status": "interrupted", "acc": "", "nmi": "", "ari": "", "mb": ""},
        # a client raised: the run kept going on the others, but it is no measurement of the method
        {"scenario": "s", "method": "m", "k": "0", "status": "error", "acc": 0.53, "nmi": 0.2, "ari": 0.1, "mb": 5.0},
    ]
    (a,) = aggregate(rows, ["k"])
    assert (a["runs"], a["completed"], a["degraded"], a["failed"], a["error"], a["interrupted"]) == (5, 1, 1, 1, 1, 1)
    assert a["acc_mean"] == pytest.approx(0.7) and a["mb_mean"] == pytest.approx(2.0)
    assert a["acc_std"] == pytest.approx(0.1414213, rel=1e-5)
    (b,) = aggregate(rows[2:3], ["k"])
    assert b["acc_mean"] is None and b["failed"] == 1


def test_sweep_resumes_aggregates_plots_and_reports(tmp_path, capsys, monkeypatch):
    sc = tiny(tmp_path)
    out = tmp_path / "sw"
    calls = []
    real = sweep_mod._run_cell
    monkeypatch.setattr(sweep_mod, "_run_cell", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    argv = ["sweep", str(sc), "--grid", "faults.dropout.rate=[0, 1.0]", "--seeds", "0,1", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    assert len(calls) == 4
    table = capsys.readouterr().out
    assert "done/deg/fail" in table and "0/0/2" in table and "raised an error or were interrupted are left out" in table
    rows = read_csv(out / "sweep.csv")
    assert list(rows[0])[:7] == ["scenario", "method", "faults.dropout.rate", "seed", "status", "acc", "nmi"]
    assert {(r["faults.dropout.rate"], r["seed"], r["status"]) for r in rows} == {
        ("0", "0", "completed"), ("0", "1", "completed"), ("1.0", "0", "failed"), ("1.0", "1", "failed")}
    assert all((out / r["run_dir"] / "summary.json").is_file() for r in rows)
    assert {r["run_dir"] for r in rows} == {"tiny_dropout0_seed0", "tiny_dropout0_seed1",
                                             "tiny_dropout1.0_seed0", "tiny_dropout1.0_seed1"}
    agg = {r["faults.dropout.rate"]: r for r in read_csv(out / "aggregate.csv")}
    assert agg["0"]["completed"] == "2" and agg["0"]["acc_mean"] != ""
    assert agg["1.0"]["failed"] == "2" and agg["1.0"]["acc_mean"] == ""

    # resume: nothing to do; then one unfinished cell is run again
    calls.clear()
    assert main(argv) == 0
    assert calls == []
    (out / "tiny_dropout0_seed1" / "summary.json").unlink()
    assert main(argv) == 0
    assert [p.rsplit("/", 1)[-1] for p in calls] == ["tiny_dropout0_seed1"]
    capsys.readouterr()

    assert main(["plot", str(out)]) == 0
    for ext in ("png", "svg"):
        assert (out / f"sweep.{ext}").stat().st_size > 1000

    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"sweep {out}: 4 runs over faults.dropout.rate" in text and "0/0/2" in text
    assert main(["report", str(out / "tiny_dropout0_seed0"), str(out / "tiny_dropout1.0_seed1")]) == 0
    text = capsys.readouterr().out
    assert "differing scenario keys: faults.dropout.rate, seed" in text
    assert main(["report", "--json", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sweeps"][0]["grid_keys"] == ["faults.dropout.rate"]


def test_sweep_two_scenarios_over_a_crash_list(tmp_path, capsys):
    a, b = tiny(tmp_path, "one"), tiny(tmp_path, "two")
    out = tmp_path / "sw"
    rc = main(["sweep", str(a), str(b), "--grid", "faults.crash=[[], [{client: 2, at_round: 0}]]", "--out", str(out),
               "--quiet"])
    assert rc == 0
    rows = read_csv(out / "sweep.csv")
    assert len(rows) == 4
    assert {(r["scenario"], r["faults.crash"], r["status"]) for r in rows} == {
        ("one", "[]", "completed"), ("one", "[{at_round: 0, client: 2}]", "degraded"),
        ("two", "[]", "completed"), ("two", "[{at_round: 0, client: 2}]", "degraded")}


def test_sweep_errors_name_the_grid(tmp_path, capsys):
    sc = tiny(tmp_path)
    assert main(["sweep", str(sc), "--grid", "faults.dropout.rate=[0, 1.5]", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --grid faults.dropout.rate=1.5: faults.dropout.rate: ") and "\n" not in err
    assert not (tmp_path / "s").exists()


def test_sweep_jobs_run_in_processes(tmp_path, capsys):
    sc = tiny(tmp_path)
    out = tmp_path / "sw"
    assert main(["sweep", str(sc), "--seeds", "0-1", "--jobs", "2", "--out", str(out), "--quiet"]) == 0
    assert [r["status"] for r in read_csv(out / "sweep.csv")] == ["completed", "completed"]


@pytest.mark.parametrize("args, words", [
    (["--seeds", "0-100000000000"], "--seeds 0-100000000000: more than 10000 seeds"),
    (["--seeds", "4-0"], "--seeds 4-0: a range runs from low to high"),
    ([arg for i in range(6) for arg in ("--grid", f"params.x{i}=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]")],
     "the sweep has more than 100000 runs"),
])
def test_oversized_sweeps_are_one_line_before_any_work(tmp_path, capsys, args, words):
    sc = tmp_path / "tiny.yaml"
    sc.write_text("name: tiny\nmethod: kfed\ndata: {dataset: digits, partition: horizontal}\n")
    assert main(["sweep", str(sc), *args, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert not (tmp_path / "out").exists()


def test_a_grid_may_give_a_key_the_scenario_requires(tmp_path):
    """The Markov model needs mean_off; the grid alone gives it."""
    sc = tmp_path / "tiny.yaml"
    sc.write_text("name: tiny\nmethod: kfed\ndata: {dataset: digits, partition: horizontal}\n"
                  "faults: {availability: {model: markov, mean_on: 4.0}}\nruntime: {backend: local}\n")
    assert main(["sweep", str(sc), "--grid", "faults.availability.mean_off=[1.0, 2.0]", "--seeds", "0",
                 "--out", str(tmp_path / "out"), "--quiet"]) == 0
    with open(tmp_path / "out" / "sweep.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 2


def test_cells_as_ray_tasks_give_the_in_process_sweep(tmp_path, ray_session):
    """--cells tasks: every cell an in-process run inside one Ray task; the same rows
    (fingerprints included) as --backend local, the run folders written on the driver."""
    sc = tiny(tmp_path)
    args = ["sweep", str(sc), "--seeds", "0-2", "--grid", "faults.dropout.rate=[0, 0.5]", "--quiet"]
    assert main([*args, "--cells", "tasks", "--out", str(tmp_path / "tasks")]) == 0
    assert main([*args, "--backend", "local", "--out", str(tmp_path / "here")]) == 0
    tasks, here = read_csv(tmp_path / "tasks" / "sweep.csv"), read_csv(tmp_path / "here" / "sweep.csv")
    assert len(tasks) == 6
    assert [{k: v for k, v in r.items() if k != "wall"} for r in tasks] == \
        [{k: v for k, v in r.items() if k != "wall"} for r in here]
    for r in tasks:
        run = tmp_path / "tasks" / r["run_dir"]
        s = json.loads((run / "summary.json").read_text())
        assert s["cell"]["executor"] == "ray-task" and s["cell"]["node"]
        assert s["out_dir"] == str(run)
        assert (run / "labels.csv").read_bytes() == (tmp_path / "here" / r["run_dir"] / "labels.csv").read_bytes()
    # a second sweep into the folder reuses every cell
    assert main([*args, "--cells", "tasks", "--out", str(tmp_path / "tasks")]) == 0
    assert read_csv(tmp_path / "tasks" / "sweep.csv") == tasks


def test_cells_as_tasks_refuse_the_local_backend(tmp_path, capsys):
    sc = tiny(tmp_path)
    assert main(["sweep", str(sc), "--cells", "tasks", "--backend", "local", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cells tasks" in err[0]


def test_a_sweep_of_tasks_on_a_cluster_that_does_not_answer_is_one_line(tmp_path):
    """As a user runs it (a fresh process: no Ray of this test session to fall back on)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sc = tiny(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env["HOME"] = str(tmp_path / "home")
    r = subprocess.run([sys.executable, "-m", "raymvc.cli", "sweep", str(sc), "--seeds", "0", "--cells", "tasks",
                        "--address", f"127.0.0.1:{port}", "--out", str(tmp_path / "o"), "--quiet"],
                       capture_output=True, text=True, timeout=300, env=env)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert err[-1].startswith("error: ") and "runtime.address" in err[-1]


def test_a_second_signal_stops_the_cells_under_way_at_once(tmp_path):
    """A cell that never finishes (its future never completes): after the first signal the
    sweep waits for it; after the second, its worker is killed, the cell is recorded as
    interrupted and the loop returns. Driven by events, not by time."""
    from concurrent.futures import Future

    from raymvc.study.execute import Outcome, _drain, _SweepStop
    from raymvc.study.sweep import plan

    sc = tiny(tmp_path)
    cells = plan([str(sc)], [], [0, 1], {}, tmp_path / "sw")
    stop = _SweepStop()
    hung: list[Future] = []
    killed: list[list] = []

    def submit(cell):
        f = Future()
        f.set_running_or_notify_cancel()
        hung.append(f)
        if len(hung) == 1:
            stop.signal = "SIGINT"  # the first signal, while the first cell runs
        return f

    class Prog:
        def finished(self, label, summary):
            pass

    rounds = {"n": 0}

    def on_stop(running):
        rounds["n"] += 1
        stop.force = "SIGINT"  # the second signal comes while the cell still hangs

    res = Outcome()
    _drain(cells, 2, submit, Prog(), stop, res, on_stop=on_stop, on_force=killed.append)
    assert len(hung) == 1 and rounds["n"] == 1 and len(killed) == 1 and len(killed[0]) == 1
    assert res.executed == 1
    assert json.loads((cells[0].run_dir / "summary.json").read_text())["status"] == "interrupted"


def test_every_score_a_run_reports_reaches_the_sweep(tmp_path, capsys):
    """Unlabelled data: the runs report silhouette and Calinski-Harabasz only; the sweep's
    tables carry them, its text table shows them and its plot draws them. Labelled data:
    purity and F-score ride along as metric.* columns and can be plotted by name."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 0.3, size=(40, 2)) for c in (0, 3, 6)])
    table = tmp_path / "points.csv"
    table.write_text("x,y\n" + "".join(f"{a:.4f},{b:.4f}\n" for a, b in X))
    sc = tmp_path / "unlabelled.yaml"
    sc.write_text("name: unlabelled\nmethod: kfed\nparams: {kmeans_init: 1, max_iter: 50}\n"
                  "data: {path: points.csv, n_clusters: 3, partition: horizontal, n_clients: 3}\n"
                  "runtime: {backend: local}\nseed: 0\n")
    out = tmp_path / "sw"
    assert main(["sweep", str(sc), "--seeds", "0,1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SIL" in text and "CH" in text and "ACC" not in text
    rows = read_csv(out / "sweep.csv")
    assert all(float(r["metric.silhouette"]) > 0.5 and float(r["metric.calinski_harabasz"]) > 10 for r in rows)
    assert rows[0]["acc"] == ""
    agg = read_csv(out / "aggregate.csv")
    assert float(agg[0]["metric.silhouette_mean"]) > 0.5
    from raymvc.study.plot import plot_sweep, sweep_points

    assert sweep_points(out)[0].stats["metric.silhouette"][0] > 0.5
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_sweep(out, formats=("svg",))
    assert "silhouette" in svg.read_text() and "Calinski-Harabasz" in svg.read_text()
    labelled = tmp_path / "sw2"
    assert main(["sweep", str(tiny(tmp_path)), "--seeds", "0,1", "--out", str(labelled), "--quiet"]) == 0
    rows = read_csv(labelled / "sweep.csv")
    assert {"metric.purity", "metric.fscore"} <= set(rows[0]) and float(rows[0]["metric.purity"]) > 0
    assert main(["plot", str(labelled), "--metric", "purity", "--metric", "acc"]) == 0
    capsys.readouterr()
    assert main(["plot", str(labelled), "--metric", "nope"]) == 2
    assert "--metric nope: the sweep has no such score" in capsys.readouterr().err


def _csv_study(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = np.vstack([rng.normal(c, 0.3, size=(20, 3)) for c in (0, 3, 6)])
    lines = ["a,b,c,y"] + [f"{r[0]:.4f},{r[1]:.4f},{r[2]:.4f},{k // 20}" for k, r in enumerate(x)]
    (tmp_path / "mine.csv").write_text("\n".join(lines) + "\n")
    sc = tmp_path / "own.yaml"
    sc.write_text("name: own\nmethod: kfed\ndata: {path: mine.csv, label_column: y, n_clusters: 3, "
                  "partition: horizontal, n_clients: 3}\nruntime: {backend: local}\n")
    return sc


def test_a_cell_task_on_a_node_without_the_data_file_ends_in_error_in_one_line(tmp_path, ray_session, monkeypatch):
    """``--cells tasks`` on a cluster whose nodes lack the scenario's data file: every cell
    failed with Ray's coloured remote traceback as its error, and the sweep exited 0."""
    from raymvc.driver import cell_tasks
    from raymvc.study.sweep import execute, plan

    sc = _csv_study(tmp_path)
    cells = plan([str(sc)], [], [0, 1], {"runtime.backend": "local"}, tmp_path / "out")
    submit = cell_tasks.submit

    def elsewhere(*args):  # the driver has the file; the node each task runs on has not
        (tmp_path / "mine.csv").unlink(missing_ok=True)
        return submit(*args)

    monkeypatch.setattr(cell_tasks, "submit", elsewhere)
    res = execute(cells, quiet=True, as_tasks=True)
    assert res.executed == 2 and len(res.errors) == 2
    for c in cells:
        s = json.loads((c.run_dir / "summary.json").read_text())
        assert s["status"] == "error" and "\n" not in s["error"] and "\x1b" not in s["error"]
        assert s["error"].startswith("ScenarioError: ") and "mine.csv" in s["error"]
        assert "a cell runs on whichever node Ray picks, which must see the scenario's files" in s["error"]
        assert "Traceback" not in s["error"]


def test_a_sweep_in_which_a_run_ended_in_error_exits_1_and_says_so(tmp_path, capsys):
    from raymvc.study.sweep import execute, plan

    sc = _csv_study(tmp_path)
    cells = plan([str(sc)], [], [0, 1], {}, tmp_path / "out")
    (tmp_path / "mine.csv").unlink()
    res = execute(cells, quiet=True)  # in process: the cell's own start fails
    assert len(res.errors) == 2
    assert json.loads((cells[0].run_dir / "summary.json").read_text())["status"] == "error"
    # the command: one line that says how many and which came first, exit 1; no error: exit 0
    d = tmp_path / "cmd"
    d.mkdir()
    (d / "boomecho.py").write_text(
        "from dataclasses import replace\nfrom raymvc.bench import fedavg_echo\n\n\n"
        "class Boom(fedavg_echo.EchoServer):\n    def step(self, round, replies, missing):\n"
        "        if round == 1 and self.ctx.seed == 1:\n            raise RuntimeError('the server broke')\n"
        "        return super().step(round, replies, missing)\n\n\n"
        "PROTOCOL = replace(fedavg_echo.PROTOCOL, name='boomecho', server=Boom)\n")
    (d / "s.yaml").write_text("name: boom\nmethod: boomecho\nparams: {rounds: 3, floats: 4}\n"
                              "data: {dataset: digits, partition: horizontal, n_clients: 3}\nruntime: {backend: local}\n")
    assert main(["sweep", str(d / "s.yaml"), "--seeds", "0", "--out", str(tmp_path / "ok"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["sweep", str(d / "s.yaml"), "--seeds", "0-2", "--out", str(tmp_path / "bad"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sweep: 1 of 3 runs ended in error; the first: boom seed 1: ") and "the server broke" in err[-1]
    assert len(read_csv(tmp_path / "bad" / "sweep.csv")) == 3  # the results are on disk all the same
