"""Scoring a run along its rounds (runtime.score_every): after every N-th round each live client
labels its rows with the server's model as it stands, on a copy of its state; the engine
scores those labels into the round's line. Nothing is metered, timed or faulted, and the run
ends with the labels, ledger and clock it has without it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from helpers import validate_fails_in_one_line

from raymvc.driver.engine import run_scenario
from raymvc.messages import Message
from raymvc.protocols import ccfc
from raymvc.scenario import load_scenario


def ccfc_path(tmp_path, name="ccfc", **extra):
    sc = {"name": name, "method": "ccfc", "params": dict(ccfc.PROTOCOL.quick_params, warmup_rounds=2, cluster_rounds=3),
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 4},
          "faults": {"dropout": {"rate": 0.3}}, "runtime": {"backend": "local"}, "seed": 3, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def run(path, out, *overrides):
    s = run_scenario(load_scenario(path, list(overrides)), out, progress=lambda line: None)
    lines = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    return s, lines


def without_scores(lines):
    return [{k: v for k, v in x.items() if k not in ("scores", "wall_s")} for x in lines]


def test_scoring_along_the_rounds_leaves_the_run_as_it_was(tmp_path):
    path = ccfc_path(tmp_path)
    plain, plain_lines = run(path, tmp_path / "plain")
    scored, lines = run(path, tmp_path / "scored", "runtime.score_every=1")
    for name in ("labels.csv", "messages.csv"):  # the same labels, and nothing more on the wire
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "scored" / name).read_bytes()
    assert without_scores(lines) == without_scores(plain_lines)  # the same rounds, clock included
    assert not any("scores" in x for x in plain_lines)
    # no model before the first global centroids; then every round the run goes on from
    assert [x["round"] for x in lines if "scores" in x] == [x["round"] for x in lines[1:-1]]
    assert any(x["missing"] for x in lines[1:-1])  # scored although clients were away that round
    assert all(x["scores"]["labelled"] == 1.0 for x in lines if "scores" in x)  # every live client, no fault
    assert scored["metrics"] == plain["metrics"]


def test_the_last_model_scores_as_the_run_does(tmp_path):
    """Without faults the last model before the final round is the final model that every
    client labels with: its scores are the run's."""
    s, lines = run(ccfc_path(tmp_path, faults={}), tmp_path / "run", "runtime.score_every=1")
    last = [x for x in lines if "scores" in x][-1]
    assert last["round"] == lines[-2]["round"]
    for k in ("acc", "nmi", "ari"):
        assert last["scores"][k] == pytest.approx(s["metrics"][k], abs=1e-12)
    assert len({x["scores"]["acc"] for x in lines if "scores" in x}) > 1  # the model moves between rounds
    # read back as a study record keeps it: ACC by virtual time, round by round
    from raymvc.results.runfolder import RunFolder
    from raymvc_reports.pages import acc_curve, final_round_start, parse_curve

    text = acc_curve(RunFolder(tmp_path / "run"))
    curve = parse_curve(text)
    assert [a for _, a in curve] == [x["scores"]["acc"] for x in lines if "scores" in x]  # exact
    assert [t for t, _ in curve] == [x["virtual_end_s"] for x in lines if "scores" in x]
    assert curve[-1][1] == s["metrics"]["acc"] and final_round_start(text) == lines[-1]["virtual_start_s"]


def test_every_nth_round(tmp_path):
    _, lines = run(ccfc_path(tmp_path), tmp_path / "run", "runtime.score_every=2", "params.cluster_rounds=4")
    assert [x["round"] for x in lines if "scores" in x] == [1, 3, 5]


def test_scoring_asynchronous_steps_changes_nothing(tmp_path):
    path = ccfc_path(tmp_path, devices={"base_compute_s": 1.0, "speed": {"dist": "lognormal", "mean": 1.0, "sigma": 1.0}},
                     faults={"asynchronous": {"buffer": 2}})
    _, plain = run(path, tmp_path / "plain")
    _, lines = run(path, tmp_path / "scored", "runtime.score_every=1")
    assert without_scores(lines) == without_scores(plain)
    assert any(x["buffered"]["in_flight"] and "scores" in x for x in lines)  # probed with updates on their way
    assert (tmp_path / "plain" / "labels.csv").read_bytes() == (tmp_path / "scored" / "labels.csv").read_bytes()


def test_ray_scores_as_in_process(ray_session, tmp_path):
    path = ccfc_path(tmp_path)
    ray = ("runtime.backend=ray", "runtime.client_cpus=0.25", "runtime.clients_per_actor=2")
    _, local = run(path, tmp_path / "local", "runtime.score_every=1")
    _, on_ray = run(path, tmp_path / "ray", "runtime.score_every=1", *ray)
    _, plain = run(path, tmp_path / "plain", *ray)
    assert [x.get("scores") for x in on_ray] == [x.get("scores") for x in local]
    assert without_scores(on_ray) == without_scores(plain)
    for name in ("labels.csv", "messages.csv"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def test_the_probe_works_on_a_copy_of_the_client(tmp_path, monkeypatch):
    """What a client does with the probed model stays with the copy: here the copy learns to
    give labels of the wrong length (that client's error, its rows unscored), while the
    client itself labels the run's rows as without the probe."""
    handle, predict = ccfc.CCFCClient.handle, ccfc.CCFCClient.predict

    def probed_handle(self, msg):
        if msg.kind == "probe-me":
            self.probed = True
            for v in self.model.state_dict().values():  # and wrecks the copy's model
                v.zero_()
            return None
        return handle(self, msg)

    def probed_predict(self):
        return np.zeros(3, dtype=int) if getattr(self, "probed", False) else predict(self)

    monkeypatch.setattr(ccfc.CCFCClient, "handle", probed_handle)
    monkeypatch.setattr(ccfc.CCFCClient, "predict", probed_predict)
    path = ccfc_path(tmp_path)
    run(path, tmp_path / "plain")
    monkeypatch.setattr(ccfc.CCFCServer, "current_model", lambda self: Message("probe-me"))
    s, lines = run(path, tmp_path / "scored", "runtime.score_every=1")
    probe = [e for e in s["faults"]["client_errors"] if e["path"] == "probe"]
    assert probe and all(e["error"].startswith("predict(): 3 labels for ") for e in probe)
    assert all(x["scores"]["labelled"] == 0.0 for x in lines if "scores" in x)
    assert (tmp_path / "plain" / "labels.csv").read_bytes() == (tmp_path / "scored" / "labels.csv").read_bytes()


def test_a_client_that_raises_on_the_model_is_that_clients_error(tmp_path, monkeypatch):
    monkeypatch.setattr(ccfc.CCFCServer, "current_model", lambda self: Message("nonsense"))
    path = ccfc_path(tmp_path)
    plain, _ = run(path, tmp_path / "plain")
    s, lines = run(path, tmp_path / "scored", "runtime.score_every=1")
    probe = [e for e in s["faults"]["client_errors"] if e["path"] == "probe"]
    assert probe and all("unexpected message 'nonsense'" in e["error"] for e in probe)
    assert s["status"] == "error"  # code that raised, although the run went on to its end
    assert all(x["scores"]["labelled"] == 0.0 for x in lines if "scores" in x)
    assert (tmp_path / "plain" / "labels.csv").read_bytes() == (tmp_path / "scored" / "labels.csv").read_bytes()


def test_a_server_that_raises_on_its_model_is_the_servers_error(tmp_path, monkeypatch):
    def boom(self):
        raise RuntimeError("no model here")

    monkeypatch.setattr(ccfc.CCFCServer, "current_model", boom)
    s, lines = run(ccfc_path(tmp_path), tmp_path / "run", "runtime.score_every=1")
    assert any(e.startswith("server current_model round") and "no model here" in e for e in s["errors"])
    assert s["status"] == "error" and s["metrics"]["acc"] > 0  # the run's own labels are kept
    assert not any("scores" in x for x in lines)


def test_a_method_without_a_model_to_score_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "kfed.yaml"
    path.write_text(yaml.safe_dump({"name": "k", "method": "kfed", "data": {"dataset": "digits", "partition": "horizontal"},
                                    "runtime": {"backend": "local", "score_every": 1}}))
    validate_fails_in_one_line(path, capsys, "runtime.score_every: method kfed has no model to score")


def test_the_setting_off_leaves_the_scenario_as_it_was(tmp_path):
    (tmp_path / "devices").mkdir()
    fast = {"speed": 2.0, "up_mbps": 10.0, "down_mbps": 10.0, "latency_ms": 1.0}
    (tmp_path / "devices" / "phones.yaml").write_text(yaml.safe_dump({"fast": fast}))
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump({"method": "kfed", "data": {"dataset": "digits", "partition": "horizontal"},
                                    "devices": {"profile": "devices/phones.yaml", "classes": {"fast": 1.0}}}))
    for extra, has in [([], False), (["runtime.score_every=3"], True)]:
        d = yaml.safe_load(load_scenario(path, extra).to_yaml())
        assert ("score_every" in d["runtime"]) == has  # off: fingerprints of earlier runs still hold
        assert d["devices"]["profile"] == str((tmp_path / "devices" / "phones.yaml").resolve())
