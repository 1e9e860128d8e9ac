"""Tests for k-FED (one-shot federated k-means)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import raymvc.protocols.kfed as kfed
from raymvc.messages import Message
from raymvc.protocol import ServerContext
from raymvc.runtime import prepare, run_scenario
from raymvc.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]


def scenario(**data_over):
    raw = {
        "name": "test-kfed",
        "method": "kfed",
        "data": {"dataset": "digits", "partition": "horizontal", "heterogeneity": 0.0, **data_over},
        "runtime": {"backend": "local"},
        "seed": 0,
    }
    return scenario_from_dict(raw)


def test_kfed_digits_end_to_end(tmp_path):
    s = run_scenario(scenario(), tmp_path, progress=lambda line: None)
    assert s["status"] == "completed", s["error"]
    assert s["rounds"] == 2
    assert s["n_clients"] == 10
    assert s["unlabelled_samples"] == 0
    assert s["metrics"]["nmi"] > 0.65
    assert s["metrics"]["kappa"] > 0.6
    # traffic: k' x 64 centroids + k' counts up, k x 64 global centroids down, per client
    rows = [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[0]["info"]["local_centroids"] == 100


def test_kfed_heterogeneous_and_kprime(tmp_path):
    raw = {
        "name": "test-kfed-p1", "method": "kfed", "params": {"k_local": 3},
        "data": {"dataset": "digits", "partition": "horizontal", "heterogeneity": 1.0},
        "runtime": {"backend": "local"},
    }
    s = run_scenario(scenario_from_dict(raw), tmp_path, progress=lambda line: None)
    assert s["status"] == "completed"
    assert s["metrics"]["nmi"] > 0.5


def test_kfed_disconnected_clients(tmp_path):
    sc = scenario_from_dict({
        "name": "test-kfed-dc", "method": "kfed",
        "data": {"dataset": "digits", "partition": "horizontal"},
        "faults": {"disconnect": {"rate": 0.3}},
        "runtime": {"backend": "local"},
    })
    s = run_scenario(sc, tmp_path, progress=lambda line: None)
    gone = s["faults"]["disconnected_clients"]
    assert len(gone) == 3 and s["status"] == "degraded"
    _, part = prepare(sc)
    assert s["unlabelled_samples"] == sum(len(part.rows[c]) for c in gone)


def test_server_uses_only_replies():
    cfg = kfed.Config(kmeans_init=2)
    srv = kfed.KFedServer(cfg, ServerContext(client_ids=[0, 1, 2], n_clusters=2, seed=0))
    assert set(srv.start()) == {0, 1, 2}
    replies = {
        0: Message("local_centroids", C=np.array([[0.0, 0.0], [10.0, 10.0]]), counts=np.array([5, 5])),
        2: Message("local_centroids", C=np.array([[0.2, 0.0], [10.2, 10.0]]), counts=np.array([5, 15])),
    }
    out = srv.step(0, replies, {1})
    assert set(out) == {0, 1, 2}  # the missing client still gets the global centroids
    C = out[1]["C"]
    C = C[np.argsort(C[:, 0])]
    np.testing.assert_allclose(C, [[0.1, 0.0], [10.15, 10.0]])  # size-weighted means
    done = srv.step(1, {c: Message("ack") for c in (0, 1, 2)}, set())
    assert done.labels is None


def test_local_summary_caps_kprime():
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    C, counts = kfed.local_summary(X, 10, np.random.default_rng(0), n_init=1)
    assert len(C) == 2 and counts.sum() == 3


def test_scenario_files_validate():
    for name in ("digits-kfed", "hwpix-kfed", "digits-ccfc", "hwpix-ccfc"):
        sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        assert sc.data.partition == "horizontal" and sc.data.heterogeneity == 0.0
        assert sc.runtime.backend == "ray"
