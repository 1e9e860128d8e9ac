"""Tests for k-FED (one-shot federated k-means)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import raymvc.protocols.kfed as kfed
from raymvc.driver import prepare, run_scenario
from raymvc.messages import Message
from raymvc.protocol import ServerContext
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
    assert out[1].kind == "summarise" and out[0].kind == "global_centroids"  # ... and is asked again
    C = out[1]["C"]
    C = C[np.argsort(C[:, 0])]
    np.testing.assert_allclose(C, [[0.1, 0.0], [10.15, 10.0]])  # size-weighted means
    done = srv.step(1, {c: Message("ack") for c in (0, 2)}, {1})  # nothing new: the run ends
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


def _clients_and_server(k_local=None, retry_rounds=2, patience=1):
    """Three clients, k = 3 in the plane; only client 0 holds the cluster around (0, 10)."""
    from raymvc.data.types import Shard
    from raymvc.protocol import ClientContext

    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    owned = {0: [2, 2, 0], 1: [0, 1, 1], 2: [0, 1, 0]}  # clusters of each client's blocks of 20 rows
    data = {c: (centres[ys].repeat(20, axis=0) + 0.3 * rng.standard_normal((60, 2)), np.repeat(ys, 20))
            for c, ys in owned.items()}
    cfg = kfed.Config(k_local=k_local, kmeans_init=3, retry_rounds=retry_rounds, patience=patience)
    clients = {c: kfed.KFedClient(cfg, Shard(views=[X]), ClientContext(c, 3, 3, 0)) for c, (X, _) in data.items()}
    server = kfed.KFedServer(cfg, ServerContext(client_ids=[0, 1, 2], n_clusters=3, seed=0))
    return clients, server, data


def _drive(clients, server, drop):
    out, r = server.start(), 0
    while True:
        lost = set(drop(r)) & set(out)
        for c in clients.values():
            c.ctx.round = r
        done = server.step(r, {c: clients[c].handle(m) for c, m in out.items() if c not in lost}, lost)
        if not isinstance(done, dict):
            return r
        out, r = done, r + 1


def test_k_local_sets_the_number_of_local_centroids():
    from raymvc.messages import Message as M

    for k_local, want in ((None, 3), (1, 1), (5, 5)):
        clients, _, _ = _clients_and_server(k_local=k_local)
        for c in clients.values():
            assert len(c.handle(M("summarise"))["C"]) == want


def test_client_missing_in_round_0_is_asked_again_and_counts():
    from raymvc.metrics import acc

    def score(drop, retry_rounds=2):
        clients, server, data = _clients_and_server(retry_rounds=retry_rounds)
        rounds = _drive(clients, server, drop)
        pred = np.concatenate([clients[c].predict() for c in sorted(clients)])
        return acc(np.concatenate([data[c][1] for c in sorted(data)]), pred), rounds, server

    full, rounds, _ = score(lambda r: ())
    assert full == 1.0 and rounds == 1  # no faults: two rounds, as before
    late, rounds, server = score(lambda r: {0} if r == 0 else ())
    assert late == 1.0 and sorted(server.summaries) == [0, 1, 2]  # its cluster got a global centroid
    assert rounds == 2  # one extra round to send the new centroids
    never, _, _ = score(lambda r: {0} if r == 0 else (), retry_rounds=0)
    assert never < 0.9  # without asking again its cluster shares a centroid with another


def test_patience_waits_out_a_burst_and_changes_nothing_without_faults():
    """Client 0 away for rounds 0-4 (an off-stretch of five rounds): the default run ends in
    the first quiet round and client 0's rows stay unlabelled; with patience 10 the server
    keeps asking, client 0 summarises in round 5 and every client ends with the latest
    centroids. Without faults the two runs are the same."""
    from raymvc.metrics import acc

    def run(drop, patience):
        clients, server, data = _clients_and_server(patience=patience)
        rounds = _drive(clients, server, drop)
        pred = [clients[c].predict() for c in sorted(clients)]
        truth = np.concatenate([data[c][1] for c in sorted(data)])
        pred = np.concatenate([p if p is not None else np.full(60, -1) for p in pred])
        return acc(truth, pred), rounds, server, pred

    away = lambda r: {0} if r <= 4 else ()  # noqa: E731
    short, r1, s1, p1 = run(away, 1)
    assert r1 == 1 and 0 not in s1.summaries and (p1[:60] == -1).all() and short < 0.7
    long_, r10, s10, p10 = run(away, 10)
    assert long_ == 1.0 and 0 in s10.summaries and r10 == 6  # summary in round 5, the centroids acknowledged in 6
    assert all(s10.holds[c] == s10.version for c in (0, 1, 2))
    (a, ra, _, pa), (b, rb, _, pb) = run(lambda r: (), 1), run(lambda r: (), 10)
    assert a == b == 1.0 and ra == rb == 1 and np.array_equal(pa, pb)
    # a client that never comes back: the run ends after `patience` quiet rounds
    _, rn, sn, _ = run(lambda r: {0}, 4)
    assert rn == 4 and 0 not in sn.summaries


def test_min_clients_0_lets_a_round_nobody_answered_reach_the_method(tmp_path):
    """With faults.min_clients 0 a round without replies is the method's to judge: k-FED with
    patience waits through it instead of the run failing."""
    sc = scenario_from_dict({"name": "t", "method": "kfed", "params": {"patience": 6, "kmeans_init": 2},
                             "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 2},
                             "faults": {"drop": [{"client": 1, "at_round": r} for r in range(4)]
                                        + [{"client": 0, "at_round": r} for r in (1, 2)], "min_clients": 0},
                             "runtime": {"backend": "local"}, "seed": 0})
    s = run_scenario(sc, out_dir=tmp_path / "r", progress=False)
    rounds = [json.loads(x) for x in (tmp_path / "r" / "rounds.jsonl").read_text().splitlines()]
    assert s["status"] == "degraded" and rounds[1]["replied"] == [] and rounds[2]["replied"] == []
    assert rounds[4]["replied"] == [1]  # client 1 back in round 4, its summary counts
    sc = sc.model_copy(update={"faults": sc.faults.model_copy(update={"min_clients": 1})})
    assert run_scenario(sc, out_dir=tmp_path / "f", progress=False)["status"] == "failed"


def test_recomputed_global_centroids_keep_their_numbers():
    """A late summary reruns the global k-means; the new centroids are numbered like the old
    ones, so a client that keeps the old copy (its new one was lost) labels consistently."""
    from raymvc.messages import Message
    from raymvc.protocol import ServerContext

    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])

    def summary():
        C = centres + rng.normal(scale=0.3, size=centres.shape)
        return Message("local_centroids", C=C[rng.permutation(4)], counts=np.full(4, 25, dtype=np.int64))

    srv = kfed.KFedServer(kfed.Config(), ServerContext(client_ids=[0, 1, 2], n_clusters=4, seed=0))
    srv.start()
    srv.step(0, {0: summary(), 1: summary()}, {2})
    old = srv.C.copy()
    srv.step(1, {0: Message("ack"), 1: Message("ack"), 2: summary()}, set())
    assert not np.array_equal(srv.C, old)  # recomputed with client 2's summary
    nearest_old = np.argmin(((srv.C[:, None, :] - old[None, :, :]) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(nearest_old, np.arange(4))
