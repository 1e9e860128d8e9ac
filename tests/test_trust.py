"""Results that cannot be silently wrong: a sweep never reuses a cell whose settings or code
changed, a stopped sweep still writes its tables, code that raised is an ``error`` (never an
injected fault) in every phase, evaluation included, and every traceback reaches ``errors.log``."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import raymvc.study.execute as sweep_mod
from raymvc.cli import main
from raymvc.driver import run_scenario
from raymvc.messages import Done
from raymvc.protocols import kfed
from raymvc.results.folder import format_summary
from raymvc.scenario import load_scenario

TINY = """
name: tiny
method: kfed
params: {kmeans_init: 1, max_iter: 50}
data:
  dataset: synthetic
  partition: horizontal
  n_clients: 3
  synthetic: {n_samples: 150, n_views: 1, dims: 4, n_clusters: 3}
runtime: {backend: local}
seed: 0
"""


def _tiny(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    return p


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _run(tmp_path: Path, name: str, *overrides: str) -> dict:
    return run_scenario(load_scenario(_tiny(tmp_path), list(overrides)), tmp_path / name, progress=lambda line: None)


@pytest.fixture
def count_runs(monkeypatch):
    calls: list[str] = []
    real = sweep_mod._run_cell
    monkeypatch.setattr(sweep_mod, "_run_cell", lambda *a, **k: calls.append(Path(a[2]).name) or real(*a, **k))
    return calls


# --------------------------------------------------------------------------- 1. stale cells
def test_a_sweep_with_other_settings_runs_every_cell_again(tmp_path, count_runs, capsys):
    sc, out = _tiny(tmp_path), tmp_path / "S"
    argv = ["sweep", str(sc), "--seeds", "0-1", "--out", str(out), "--quiet"]
    assert main(argv) == 0 and len(count_runs) == 2
    before = {r["seed"]: r for r in _rows(out / "sweep.csv")}
    assert {r["dropped_replies"] for r in before.values()} == {"0"}

    count_runs.clear()
    assert main([*argv, "--set", "faults.dropout.rate=0.5", "--set", "channel.encryption=aes-gcm"]) == 0
    assert sorted(count_runs) == ["tiny_seed0", "tiny_seed1"]  # nothing reused from the dropout-0 sweep
    after = {r["seed"]: r for r in _rows(out / "sweep.csv")}
    assert all(after[k]["fingerprint"] != before[k]["fingerprint"] for k in before)
    assert sum(int(r["dropped_replies"]) for r in after.values()) > 0
    for r in after.values():  # every cell's files say the same thing
        s = json.loads((out / r["run_dir"] / "summary.json").read_text())
        assert s["fingerprint"] == r["fingerprint"] and s["faults"]["dropped_replies"] == int(r["dropped_replies"])
        assert "rate: 0.5" in (out / r["run_dir"] / "scenario.yaml").read_text()

    # the same command again reuses everything and says so
    count_runs.clear()
    capsys.readouterr()
    assert main([*argv[:-1], "--set", "faults.dropout.rate=0.5", "--set", "channel.encryption=aes-gcm"]) == 0
    assert count_runs == [] and "2 reused" in capsys.readouterr().err


def test_editing_the_yaml_runs_the_cells_again(tmp_path, count_runs):
    sc, out = _tiny(tmp_path), tmp_path / "S"
    argv = ["sweep", str(sc), "--seeds", "0", "--out", str(out), "--quiet"]
    assert main(argv) == 0 and count_runs == ["tiny_seed0"]
    count_runs.clear()
    sc.write_text(TINY.replace("max_iter: 50", "max_iter: 5"))
    assert main(argv) == 0 and count_runs == ["tiny_seed0"]
    s = json.loads((out / "tiny_seed0" / "summary.json").read_text())
    assert "max_iter: 5\n" in (out / "tiny_seed0" / "scenario.yaml").read_text() and s["status"] == "completed"


def test_a_changed_method_code_runs_the_cells_again(tmp_path, count_runs, monkeypatch):
    from raymvc.results import provenance

    sc, out = _tiny(tmp_path), tmp_path / "S"
    argv = ["sweep", str(sc), "--seeds", "0", "--out", str(out), "--quiet"]
    assert main(argv) == 0 and count_runs == ["tiny_seed0"]
    count_runs.clear()
    monkeypatch.setattr(provenance, "method_version", lambda method: "edited")
    assert main(argv) == 0 and count_runs == ["tiny_seed0"]


def test_a_method_built_on_another_counts_its_code():
    """FCUIF's client, server and config derive from FedDMVC's: an edit of feddmvc.py is an
    edit of FCUIF, so its version covers that file (and FedDMVC's does not cover FCUIF's)."""
    from raymvc.results.provenance import method_files

    fcuif = {f.name for f in method_files("fcuif")}
    feddmvc = {f.name for f in method_files("feddmvc")}
    assert {"fcuif.py", "feddmvc.py", "_torch.py"} <= fcuif
    assert "feddmvc.py" in feddmvc and "fcuif.py" not in feddmvc
    assert "protocol.py" not in fcuif  # the engine's base classes are the engine's version
    assert {f.name for f in method_files("kfed")} & {"feddmvc.py", "fcuif.py"} == set()


def test_a_stopped_sweep_starts_nothing_more_and_writes_its_tables(tmp_path, monkeypatch):
    sc, out = _tiny(tmp_path), tmp_path / "S"
    started: list[str] = []
    real = sweep_mod._run_cell

    def run_then_signal(*a, **k):
        started.append(Path(a[2]).name)
        summary = real(*a, **k)
        if len(started) == 2:  # Ctrl-C arrives between the second and the third run
            os.kill(os.getpid(), signal.SIGINT)
        return summary

    monkeypatch.setattr(sweep_mod, "_run_cell", run_then_signal)
    code = main(["sweep", str(sc), "--seeds", "0-4", "--out", str(out), "--quiet"])
    assert code == 130 and started == ["tiny_seed0", "tiny_seed1"]
    rows = _rows(out / "sweep.csv")
    assert [r["seed"] for r in rows] == ["0", "1"] and {r["status"] for r in rows} == {"completed"}
    (agg,) = _rows(out / "aggregate.csv")
    assert agg["runs"] == "2" and agg["completed"] == "2"
    # the same command carries on with the three that never started
    started.clear()
    monkeypatch.setattr(sweep_mod, "_run_cell", lambda *a, **k: started.append(Path(a[2]).name) or real(*a, **k))
    assert main(["sweep", str(sc), "--seeds", "0-4", "--out", str(out), "--quiet"]) == 0
    assert started == ["tiny_seed2", "tiny_seed3", "tiny_seed4"] and len(_rows(out / "sweep.csv")) == 5


def test_an_interrupted_run_reads_the_same_in_its_summary_and_report(tmp_path):
    def stop(record):
        if record["round"] == 0:
            os.kill(os.getpid(), signal.SIGINT)  # a first Ctrl-C: stop after the rounds under way

    sc = load_scenario(_tiny(tmp_path), ["runtime.checkpoint=true"])  # one round per call to the server
    s = run_scenario(sc, tmp_path / "run", progress=lambda line: None, on_round=stop)
    assert s["status"] == "interrupted" and s["error"] == "SIGINT" and s["rounds"] == 1
    assert s["timing"]["protocol_s"] > 0  # the round it did is timed
    text = format_summary(json.loads((tmp_path / "run" / "summary.json").read_text()))
    assert "status    interrupted (SIGINT)" in text and "interrupted (interrupted" not in text
    assert f"{s['timing']['protocol_s']:.2f} s protocol" in text


# --------------------------------------------------------------------------- 2. errors are not faults
def test_a_client_that_raises_makes_an_error_never_a_degraded_run(tmp_path, monkeypatch, count_runs):
    real = kfed.KFedClient.handle

    def broken(self, msg):
        if self.ctx.client_id == 1 and self.ctx.round == 0:
            raise KeyError("centroids")
        return real(self, msg)

    monkeypatch.setattr(kfed.KFedClient, "handle", broken)
    out = tmp_path / "S"
    assert main(["sweep", str(_tiny(tmp_path)), "--seeds", "0-1", "--out", str(out), "--quiet"]) == 1  # runs in error
    rows = _rows(out / "sweep.csv")
    assert {r["status"] for r in rows} == {"error"} and {r["errors"] for r in rows} == {"1"}
    (agg,) = _rows(out / "aggregate.csv")
    assert agg["error"] == "2" and agg["completed"] == agg["degraded"] == "0" and agg["acc_mean"] == ""
    s = json.loads((out / "tiny_seed0" / "summary.json").read_text())
    assert s["metrics"]["acc"] > 0  # scored all the same, for whoever wants to look
    assert s["errors"] == ["client 1 protocol round 0: KeyError: 'centroids'"]


def test_an_injected_drop_alone_is_degraded(tmp_path):
    s = _run(tmp_path, "drop", "faults.drop=[{client: 1, at_round: 0}]")
    assert s["status"] == "degraded" and s["errors"] == [] and s["faults"]["dropped_replies"] == 1


# --------------------------------------------------------------------------- 3. the evaluation path
@pytest.mark.parametrize("bad,words", [
    (lambda y: (_ for _ in ()).throw(RuntimeError("no model")), "RuntimeError: no model"),
    (lambda y: np.full(len(y), np.nan), "whole numbers"),
    (lambda y: y - 5, "non-negative"),
    (lambda y: y[:-3], "labels (shape"),
])
def test_a_client_whose_predict_fails_is_an_error(tmp_path, monkeypatch, bad, words):
    real = kfed.KFedClient.predict

    def predict(self):
        y = real(self)
        return bad(y) if self.ctx.client_id == 2 else y

    monkeypatch.setattr(kfed.KFedClient, "predict", predict)
    s = _run(tmp_path, "eval")
    assert s["status"] == "error"
    (err,) = s["faults"]["client_errors"]
    assert (err["client"], err["path"]) == (2, "eval") and words in err["error"]
    assert s["unlabelled_samples"] > 0 and s["metrics"] is not None  # the others' labels are kept and scored
    assert (tmp_path / "eval" / "messages.csv").is_file() and words in (tmp_path / "eval" / "errors.log").read_text()


def test_server_labels_of_the_wrong_length_are_one_line_and_keep_the_results(tmp_path, monkeypatch, capsys):
    from raymvc.protocols import cefmc

    real = cefmc.CeFMCServer.step

    def short(self, r, replies, missing):
        out = real(self, r, replies, missing)
        return Done(labels=out.labels[:-7], info=out.info) if isinstance(out, Done) else out

    monkeypatch.setattr(cefmc.CeFMCServer, "step", short)
    hw = Path(__file__).resolve().parents[1] / "scenarios" / "hw-cefmc.yaml"
    out = tmp_path / "run"
    code = main(["run", str(hw), "--backend", "local", "--out", str(out), "--json", "--quiet"])
    s = json.loads(capsys.readouterr().out)
    assert code == 1 and s["status"] == "error"
    assert s["errors"] == [f"server eval round {s['rounds']}: Done(labels=...): 1993 labels (shape (1993,)) for 2000 samples"]
    assert (out / "messages.csv").is_file() and len(_rows(out / "labels.csv")) == 2000


# --------------------------------------------------------------------------- 4. tracebacks
def test_a_server_that_raises_leaves_its_full_traceback(tmp_path, monkeypatch):
    def oops(self, r, replies, missing):
        return {}["oops"]

    monkeypatch.setattr(kfed.KFedServer, "step", oops)
    s = _run(tmp_path, "srv")
    assert s["status"] == "error" and s["error"] == "server step 0 raised KeyError: 'oops'"
    assert s["errors"] == ["server step round 0: KeyError: 'oops'"]
    log = (tmp_path / "srv" / "errors.log").read_text()
    assert "Traceback (most recent call last)" in log and "in oops" in log and 'return {}["oops"]' in log
    assert len(json.dumps(s.to_dict())) < 20_000


def test_server_labels_may_leave_a_sample_unlabelled_with_minus_one(tmp_path, monkeypatch, capsys):
    """-1 in a server's Done labels is "no label" (e.g. no client holding the sample ever
    answered): the run completes with the sample unlabelled; -2 is still the server's error."""
    from raymvc.protocols import cefmc

    real = cefmc.CeFMCServer.step
    mark = {"value": -1}

    def some_unlabelled(self, r, replies, missing):
        out = real(self, r, replies, missing)
        if isinstance(out, Done):
            labels = np.array(out.labels, copy=True)
            labels[:5] = mark["value"]
            return Done(labels=labels, info=out.info)
        return out

    monkeypatch.setattr(cefmc.CeFMCServer, "step", some_unlabelled)
    hw = Path(__file__).resolve().parents[1] / "scenarios" / "hw-cefmc.yaml"
    assert main(["run", str(hw), "--backend", "local", "--out", str(tmp_path / "a"), "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["status"] == "completed" and s["unlabelled_samples"] == 5 and s["errors"] == []
    assert [r["cluster"] for r in _rows(tmp_path / "a" / "labels.csv")[:5]] == ["-1"] * 5
    mark["value"] = -2
    assert main(["run", str(hw), "--backend", "local", "--out", str(tmp_path / "b"), "--json", "--quiet"]) == 1
    s = json.loads(capsys.readouterr().out)
    assert s["status"] == "error" and "negative label -2" in s["errors"][0]
