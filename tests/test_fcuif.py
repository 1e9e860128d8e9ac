"""FCUIF: alignment network and matching, label-free imputation choice, unaligned rows end to end.

Tiny synthetic splits and tiny networks (seconds each).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import raymvc.protocols.fcuif as fc  # noqa: E402
from raymvc.driver import prepare, run_scenario  # noqa: E402
from raymvc.messages import Message  # noqa: E402
from raymvc.protocol import ClientContext, RunFacts, ServerContext  # noqa: E402
from raymvc.scenario import scenario_from_dict  # noqa: E402


def tiny_scenario(unaligned=0.5, missing=0.3, seed=0, **extra):
    raw = {
        "name": "tiny-fcuif",
        "method": "fcuif",
        "params": dict(fc.PROTOCOL.quick_params),
        "data": {"dataset": "synthetic", "partition": "vertical",
                 "synthetic": {"n_samples": 160, "n_views": 3, "dims": 10, "n_clusters": 4, "noise": 0.4},
                 "missing": {"rate": missing, "pattern": "point"}, "unaligned": unaligned},
        "runtime": {"backend": "local"},
        "seed": seed,
    }
    return scenario_from_dict(raw, values=extra)


def _match_rate(net_a, net_m, Ha, Hm, rng):
    shuffle = rng.permutation(len(Ha))
    col = fc.match_rows(net_a, net_m, Ha, Hm[shuffle])
    return float(np.mean(shuffle[col] == np.arange(len(Ha))))


# ---------------------------------------------------------------------------
def test_alignment_loss_rewards_the_true_permutation():
    g = torch.Generator().manual_seed(0)
    Fa = 3.0 * torch.randn(16, 64, generator=g)
    perm = torch.randperm(16, generator=g)
    right = fc.alignment_loss(Fa, Fa[perm], perm, alpha=1.0)
    wrong = fc.alignment_loss(Fa, Fa[perm], torch.roll(perm, 1), alpha=1.0)
    assert right < 0.1 < wrong


def test_learned_alignment_recovers_rows_a_fixed_map_relates():
    """Member features are a rotation of the anchor's plus noise: training on matched rows
    must let held-out rows, shuffled, be put back in place far above chance (1 in 60).
    (α = 1 here; at the paper's α = 0.1 the regression term slows this down: 0.32 after 80 epochs.)"""
    rng = np.random.default_rng(0)
    Ha = rng.standard_normal((260, 12))
    R, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    Hm = Ha @ R + 0.05 * rng.standard_normal(Ha.shape)
    cfg = fc.Config(alpha=1.0, align_epochs=80, align_batch=64, align_lr=3e-3)
    untrained = fc.fit_alignment(Ha[:200], [Hm[:200]], cfg.model_copy(update={"align_epochs": 1, "align_lr": 1e-9}), 1)
    trained = fc.fit_alignment(Ha[:200], [Hm[:200]], cfg, 1)
    before = _match_rate(untrained[0], untrained[1][0], Ha[200:], Hm[200:], rng)
    after = _match_rate(trained[0], trained[1][0], Ha[200:], Hm[200:], rng)
    assert after >= 0.9 and before <= 0.1


def test_match_rows_is_a_permutation_and_handles_odd_shapes():
    net = fc.Versatility(4, (8,))
    rng = np.random.default_rng(1)
    col = fc.match_rows(net, net, rng.standard_normal((7, 4)), rng.standard_normal((7, 4)))
    assert sorted(col) == list(range(7))
    col = fc.match_rows(net, net, rng.standard_normal((5, 4)), rng.standard_normal((3, 4)))
    assert (col >= 0).sum() == 3 and len(set(col[col >= 0])) == 3
    assert len(fc.match_rows(net, net, np.zeros((0, 4)), rng.standard_normal((3, 4)))) == 0


@pytest.mark.parametrize("criterion", ["silhouette", "calinski_harabasz"])
def test_view_score_prefers_the_labelling_the_views_support(criterion):
    rng = np.random.default_rng(2)
    y = np.repeat(np.arange(3), 40)
    d = 2
    Z = np.hstack([5.0 * np.eye(3)[y][:, :d] + 0.3 * rng.standard_normal((120, d)) for _ in range(2)])
    H = np.ones((120, 2), dtype=bool)
    H[:30, 1] = False
    Z[:30, d:] = 99.0  # absent rows hold garbage: the score must not look at them
    good = fc.view_score(y, Z, H, d, criterion, seed=0)
    bad = fc.view_score(rng.permutation(y), Z, H, d, criterion, seed=0)
    assert good > bad
    assert fc.view_score(np.zeros(120, dtype=int), Z, H, d, criterion, seed=0) == -np.inf


def test_client_sends_which_rows_are_aligned_never_their_true_ids():
    sc = tiny_scenario(missing=0.0)
    ds, part = prepare(sc)
    cfg = fc.Config(**sc.params)
    shard = part.shards[1]
    client = fc.FCUIFClient(cfg, shard, ClientContext(1, 3, ds.n_clusters, sc.seed))
    reply = client.handle(Message("pretrain"))
    assert np.array_equal(reply["aligned"].astype(bool), shard.meta["aligned"])
    assert np.array_equal(reply["idx"], np.arange(shard.n_local))  # slots, not the shuffled sample ids
    assert not np.array_equal(part.rows[1], np.arange(shard.n_local))  # the split did shuffle client 1


def test_server_matches_unaligned_rows_to_the_anchor_and_answers_in_each_clients_order():
    sc = tiny_scenario(missing=0.0)
    ds, part = prepare(sc)
    cfg = fc.Config(**sc.params)
    ids = list(range(part.n_clients))
    clients = {c: fc.FCUIFClient(cfg, part.shards[c], ClientContext(c, len(ids), ds.n_clusters, sc.seed)) for c in ids}
    server = fc.FCUIFServer(cfg, ServerContext(ids, ds.n_clusters, sc.seed, n_samples=part.n_samples))
    replies = {c: clients[c].handle(m) for c, m in server.start().items()}
    out = server.step(0, replies, set())
    aligned = part.shards[0].meta["aligned"]
    assert np.array_equal(server.rows(0), np.arange(part.n_samples))  # the anchor keeps its order
    for c in (1, 2):
        ref = server.rows(c)
        assert sorted(ref) == list(range(part.n_samples))  # a one-to-one match
        assert np.array_equal(ref[aligned], np.flatnonzero(aligned))  # aligned rows stay
        assert not np.array_equal(ref, server.ids[c])  # unaligned ones were re-matched
        np.testing.assert_array_equal(out[c]["P"], server.P[ref].astype(np.float32))
    assert 0.0 <= server.info["align_holdout_match"] <= 1.0
    assert 0.0 <= server.info["align_cluster_agreement"] <= 1.0 and server.info["n_unaligned"] == (~aligned).sum()


def test_imputation_is_kept_or_dropped_by_the_label_free_score(monkeypatch):
    sc = tiny_scenario(unaligned=0.0, missing=0.5)
    ds, part = prepare(sc)
    ids = list(range(part.n_clients))

    def first_step(**params):
        cfg = fc.Config(**{**sc.params, "prototypes": "inertia", **params})  # view_score only for imputation
        clients = {c: fc.FCUIFClient(cfg, part.shards[c], ClientContext(c, len(ids), ds.n_clusters, sc.seed)) for c in ids}
        server = fc.FCUIFServer(cfg, ServerContext(ids, ds.n_clusters, sc.seed, n_samples=part.n_samples))
        server.step(0, {c: clients[c].handle(m) for c, m in server.start().items()}, set())
        return server

    adaptive = first_step()
    info = adaptive.info["imputation"]
    assert info["used"] == (info["score_imputed"] >= info["score_raw"])
    never, always = first_step(impute="never"), first_step(impute="always")
    assert "imputation" not in never.info and "imputation" not in always.info
    assert not np.array_equal(never.P, always.P)  # the two feature sets differ
    np.testing.assert_array_equal(adaptive.P, always.P if info["used"] else never.P)
    # the choice follows the score: make the raw features win and the imputation is dropped
    scores = iter([0.0, 1.0])
    monkeypatch.setattr(fc, "view_score", lambda *a, **k: next(scores))
    dropped = first_step()
    assert dropped.info["imputation"]["used"] is False
    np.testing.assert_array_equal(dropped.P, never.P)


def test_a_run_with_unaligned_and_missing_rows_reports_alignment_and_matches_its_bytes(tmp_path):
    sc = tiny_scenario(unaligned=0.5, missing=0.3)
    s = run_scenario(sc, tmp_path / "run", progress=lambda line: None)
    assert s["status"] == "completed", s["error"]
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert all("align_cluster_agreement" in r["info"] and "imputation" in r["info"] for r in rounds)
    ds, part = prepare(sc)
    ids = list(range(part.n_clients))
    facts = RunFacts(n_samples=part.n_samples, n_clusters=ds.n_clusters, client_ids=ids,
                     client_sizes={c: part.shards[c].rows_held for c in ids},
                     client_dims={c: int(part.shards[c].views[0].shape[1]) for c in ids}, rounds=s["rounds"])
    assert s["communication"]["data_bytes"] == fc.analytic_bytes(fc.Config(**sc.params), facts)


def test_prototypes_keep_the_restart_the_label_free_score_prefers(monkeypatch):
    cfg = fc.Config(**{**fc.PROTOCOL.quick_params, "kmeans_init": 4, "prototypes": "score"})  # the project's option
    server = fc.FCUIFServer(cfg, ServerContext([0, 1], 3, 0, n_samples=90))
    server.Z = {0: None, 1: None}  # two members
    Zc = np.random.default_rng(3).standard_normal((90, 2 * cfg.latent_dim))  # no clear clusters: restarts differ
    seen = []

    def score(y, *a, **k):  # the third restart wins, whatever its quality
        seen.append(y.copy())
        return 1.0 if len(seen) == 3 else 0.0

    monkeypatch.setattr(fc, "view_score", score)
    C, labels = server.prototypes(Zc, np.ones(90, dtype=bool), round=0)
    assert len(seen) == 4 and server.info["prototype_score"] == 1.0
    np.testing.assert_array_equal(labels, seen[2])
    assert not all(np.array_equal(seen[2], y) for y in seen)
    np.testing.assert_allclose(C, np.stack([Zc[labels == j].mean(axis=0) for j in range(3)]))
    seen.clear()
    server.config = cfg.model_copy(update={"prototypes": "inertia"})
    server.prototypes(Zc, np.ones(90, dtype=bool), round=0)
    assert seen == []  # FedDMVC's rule: the lowest k-means objective, no score


def test_defaults_are_the_papers_procedure():
    cfg = fc.Config()
    assert (cfg.prototypes, cfg.labels, cfg.view_patterns, cfg.align_patterns, cfg.standardize) == \
        ("inertia", "q", "mlp", True, 0.0)
    # Sec. 4.1's budget: encoder 500-500-2000-10, 500 pretraining and 300 local epochs, batch 256,
    # Adam 1e-3, γ = α = 0.1, R = 3
    assert (cfg.hidden, cfg.latent_dim, cfg.pretrain_epochs, cfg.finetune_epochs, cfg.batch_size, cfg.lr,
            cfg.gamma, cfg.alpha, cfg.rounds) == ((500, 500, 2000), 10, 500, 300, 256, 1e-3, 0.1, 0.1, 3)


def test_shipped_scenarios_say_they_shorten_the_budget():
    """A scenario that trains less than the paper says so in its description (what a run's label shows)."""
    from raymvc.scenario import load_scenario

    root = Path(__file__).resolve().parents[1] / "scenarios"
    for f in sorted(root.glob("*.yaml")):
        sc = load_scenario(f)
        if sc.method not in ("feddmvc", "fcuif"):
            continue
        cfg = sc.protocol_config()
        if (cfg.pretrain_epochs, cfg.finetune_epochs) != (500, 300):
            assert f"shortened to {cfg.pretrain_epochs} + {cfg.finetune_epochs} epochs (paper 500 + 300)" in \
                sc.description, f.name


def test_view_patterns_mlp_learns_a_nonlinear_map_the_linear_fit_misses():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 4))
    Y = np.tanh(2 * X) ** 2 - X[:, ::-1]  # not linear in X
    cfg = fc.Config(**{**fc.PROTOCOL.quick_params, "align_epochs": 200, "align_batch": 64, "align_lr": 3e-3})
    net = fc.fit_pattern_mlp(X[:500], Y[:500], cfg, seed=1)
    with torch.no_grad():
        pred = net(torch.from_numpy(X[500:].astype(np.float32))).numpy()
    W = np.linalg.lstsq(X[:500], Y[:500], rcond=None)[0]
    assert np.mean((pred - Y[500:]) ** 2) < 0.5 * np.mean((X[500:] @ W - Y[500:]) ** 2)


@pytest.mark.parametrize("params", [{"view_patterns": "linear"}, {"view_patterns": "none"},
                                    {"align_patterns": False}, {"labels": "q"}, {"server_norm": "l1"}])
def test_ablation_switches_change_the_run_and_keep_it_whole(tmp_path, params):
    # argmax P on standardised embeddings: labels that use every cluster, so a switch shows in them
    common = {"params.labels": "p", "params.standardize": 1.0}
    sc = tiny_scenario(**{**common, **{f"params.{k}": v for k, v in params.items()}})
    base = run_scenario(tiny_scenario(**common), tmp_path / "base", progress=lambda line: None)
    s = run_scenario(sc, tmp_path / "x", progress=lambda line: None)
    assert s["status"] == "completed" and base["status"] == "completed"
    a = np.loadtxt(tmp_path / "base" / "labels.csv", delimiter=",", skiprows=1)[:, 1]
    b = np.loadtxt(tmp_path / "x" / "labels.csv", delimiter=",", skiprows=1)[:, 1]
    assert (a >= 0).all() and (b >= 0).all() and not np.array_equal(a, b)


def test_quorum_reaches_fcuif_and_waits_out_data_tied_absences(tmp_path):
    """FCUIF's server is FedDMVC's: with every client away half the rounds (availability tied
    to view width; the three views are equally wide) a quorum of all three is rarely met, so
    the run takes its patience's extra rounds and says so."""
    faults = {"faults.availability.model": "data", "faults.availability.by": "dimension",
              "faults.availability.rate": 0.5, "faults.min_clients": 0}
    sc = tiny_scenario(**faults, **{"params.quorum": 1.0, "params.patience": 3})
    s = run_scenario(sc, tmp_path / "q", progress=False)
    rounds = [json.loads(x) for x in (tmp_path / "q" / "rounds.jsonl").read_text().splitlines()]
    info = rounds[-1]["info"]
    assert s["status"] in ("completed", "degraded") and info["waited"] == 3
    assert len(rounds) == fc.PROTOCOL.quick_params["rounds"] + 1 + 3 and info["counted"] == len(rounds) - 3
