"""FedDMVC: server pieces (alignment, imputation, target), missing replies, traffic, determinism.

Everything runs on tiny synthetic splits with tiny networks (seconds each).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import raymvc.protocols.feddmvc as fd  # noqa: E402
from raymvc.data import partition as parts  # noqa: E402
from raymvc.driver import prepare, run_scenario  # noqa: E402
from raymvc.messages import Done  # noqa: E402
from raymvc.protocol import ClientContext, RunFacts, ServerContext  # noqa: E402
from raymvc.scenario import ScenarioError, scenario_from_dict  # noqa: E402

TINY = fd.PROTOCOL.quick_params


def tiny_scenario(missing=0.4, seed=0, **extra):
    raw = {
        "name": "tiny-feddmvc",
        "method": "feddmvc",
        "params": dict(TINY),
        "data": {"dataset": "synthetic", "partition": "vertical",
                 "synthetic": {"n_samples": 120, "n_views": 3, "dims": 10, "n_clusters": 4, "noise": 0.5},
                 "missing": {"rate": missing, "pattern": "point"}},
        "runtime": {"backend": "local"},
        "seed": seed,
    }
    return scenario_from_dict(raw, values=extra)


def parties(sc):
    ds, part = prepare(sc)
    cfg = fd.Config(**sc.params)
    ids = list(range(part.n_clients))
    clients = {c: fd.FedDMVCClient(cfg, part.shards[c], ClientContext(c, len(ids), ds.n_clusters, sc.seed)) for c in ids}
    server = fd.FedDMVCServer(cfg, ServerContext(ids, ds.n_clusters, sc.seed, n_samples=part.n_samples))
    return ds, part, clients, server


def deliver(clients, out, r, drop=()):
    replies = {}
    for c, m in out.items():
        clients[c].ctx.round = r
        reply = clients[c].handle(m)
        if c not in drop:
            replies[c] = reply
    return replies


# ---------------------------------------------------------------------------
def test_alignment_recovers_a_known_permutation():
    rng = np.random.default_rng(0)
    k = 6
    anchor = rng.integers(0, k, 300)
    perm = rng.permutation(k)  # local cluster perm[a] is anchor cluster a
    labels = perm[anchor]
    noisy = labels.copy()
    flip = rng.random(300) < 0.15  # some disagreement does not change the matching
    noisy[flip] = rng.integers(0, k, flip.sum())
    assert np.array_equal(fd.align_permutation(anchor, labels, k), perm)
    assert np.array_equal(fd.align_permutation(anchor, noisy, k), perm)
    # permuting Q's columns with it puts them in the anchor's order
    Q = np.eye(k)[labels]
    assert np.array_equal(Q[:, perm].argmax(1), anchor)


def test_imputation_reproduces_rows_of_a_known_pattern():
    rng = np.random.default_rng(1)
    n, k, d = 200, 5, 4
    Q = rng.dirichlet(np.ones(k), size=n)
    Cm = rng.standard_normal((k, d))
    W = rng.standard_normal((d, d))
    Zm = (Q @ Cm) @ W.T  # z_i^m = W (q_i C^m)
    seen = np.arange(n) < 120  # the "complete" rows fit W, the rest are imputed
    Wt = fd.fit_patterns((Q @ Cm)[seen], Zm[seen], ridge=0.0)
    assert np.allclose(Wt, W.T, atol=1e-8)
    assert np.allclose((Q @ Cm)[~seen] @ Wt, Zm[~seen], atol=1e-8)


def test_target_is_decs_sharpened_distribution():
    S = np.array([[0.8, 0.2], [0.4, 0.6], [0.5, 0.5]])
    P = fd.target_distribution(S)
    f = S.sum(axis=0)  # cluster frequencies 1.7, 1.3
    want = np.array([[S[i, j] ** 2 / f[j] for j in range(2)] for i in range(3)])
    want /= want.sum(axis=1, keepdims=True)
    assert np.allclose(P, want)
    assert P[0, 0] == pytest.approx((0.64 / 1.7) / (0.64 / 1.7 + 0.04 / 1.3))
    assert P[0, 0] > S[0, 0] and np.allclose(P.sum(1), 1.0)  # sharper, still distributions
    # Student-t rows are distributions, closer centre -> larger weight
    St = fd.student_t(np.array([[0.0, 0.0]]), np.array([[0.0, 1.0], [0.0, 2.0]]))
    assert np.allclose(St, [[(1 / 2) / (1 / 2 + 1 / 5), (1 / 5) / (1 / 2 + 1 / 5)]])


def test_client_that_missed_pretraining_joins_later():
    sc = tiny_scenario()
    ds, part, clients, server = parties(sc)
    out = server.start()
    replies = deliver(clients, out, 0, drop={2})  # client 2's pretraining reply is lost
    out = server.step(0, replies, {2})
    assert server.members == [0, 1]
    assert out[2].kind == "finetune" and "P_all" in out[2] and "C" not in out[2]
    assert out[0].kind == "finetune" and "C" in out[0] and "P" in out[0]
    replies = deliver(clients, out, 1)
    assert "idx" in replies[2] and "idx" not in replies[0]
    out = server.step(1, replies, set())
    assert server.members == [0, 1, 2] and server.info["joined"] == [2]
    assert "C" in out[2] and out[2]["P"].shape == (clients[2].n, ds.n_clusters)
    assert server.C.shape == (ds.n_clusters, 3 * TINY["latent_dim"])
    np.testing.assert_array_equal(server.ids[2], clients[2].idx)
    replies = deliver(clients, out, 2)
    done = server.step(2, replies, set())
    assert isinstance(done, Done) and (done.labels >= 0).all()


def test_member_that_misses_a_round_is_represented_by_its_last_embeddings():
    sc = tiny_scenario()
    _, _, clients, server = parties(sc)
    out = server.step(0, deliver(clients, server.start(), 0), set())
    Z1 = server.Z[1].copy()
    replies = deliver(clients, out, 1, drop={1})
    out = server.step(1, replies, {1})
    assert server.info["stale_clients"] == [1] and server.members == [0, 1, 2]
    np.testing.assert_array_equal(server.Z[1], Z1)
    assert "C" in out[1]  # it still gets its prototypes and targets


def test_no_embedding_at_all_asks_again():
    sc = tiny_scenario()
    _, _, clients, server = parties(sc)
    out = server.step(0, {}, {0, 1, 2})
    assert all(m.kind == "pretrain" for m in out.values())
    assert server.result() is None  # no labels yet: nothing to report early, and no error


def _ledger(out_dir):
    with open(Path(out_dir) / "messages.csv", newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["path"] == "protocol"]


def test_analytic_bytes_match_the_ledger(tmp_path):
    sc = tiny_scenario(missing=0.4)
    ds, part = prepare(sc)
    s = run_scenario(sc, tmp_path / "run", progress=lambda line: None)
    assert s["status"] == "completed"
    rows = _ledger(s["out_dir"])
    sizes = dict(enumerate(part.info["client_sizes"]))
    assert min(sizes.values()) < part.n_samples  # some clients lack samples
    facts = RunFacts(n_samples=part.n_samples, n_clusters=ds.n_clusters, client_ids=list(sizes), client_sizes=sizes,
                     client_dims={c: int(sh.X.shape[1]) for c, sh in enumerate(part.shards)}, rounds=s["rounds"])
    assert s["rounds"] == TINY["rounds"] + 1
    assert fd.analytic_bytes(fd.Config(**sc.params), facts) == sum(int(r["data_bytes"]) for r in rows)
    per = fd.communication(sizes[0], part.n_samples, ds.n_clusters, TINY["latent_dim"], TINY["rounds"])
    assert per["up"] == sum(int(r["data_bytes"]) for r in rows if r["src"] == "client:0")


def _run_by_hand(sc, away):
    """Drive a server and its clients; ``away(r)`` is the set of clients whose reply is lost in round r."""
    _, _, clients, server = parties(sc)
    out, r, asked = server.start(), 0, []
    while True:
        asked.append(sorted(out))
        lost = away(r) & set(out)
        out = server.step(r, deliver(clients, out, r, drop=lost), lost)
        if isinstance(out, Done):
            return out.labels, asked, server
        r += 1


def _labels(sc):
    return _run_by_hand(sc, lambda r: set())[0]


def test_same_seed_same_labels_and_bytes(tmp_path):
    a = run_scenario(tiny_scenario(), tmp_path / "a", progress=lambda line: None)
    b = run_scenario(tiny_scenario(), tmp_path / "b", progress=lambda line: None)
    assert a["communication"] == b["communication"] and a["metrics"] == b["metrics"]
    assert [r["data_bytes"] for r in _ledger(a["out_dir"])] == [r["data_bytes"] for r in _ledger(b["out_dir"])]
    ya = _labels(tiny_scenario())
    np.testing.assert_array_equal(ya, _labels(tiny_scenario()))
    assert not np.array_equal(ya, _labels(tiny_scenario(seed=1)))


def test_dropouts_degrade_but_complete(tmp_path):
    sc = tiny_scenario(**{"faults.dropout.rate": 0.3, "params.rounds": 3})
    s = run_scenario(sc, tmp_path / "drop", progress=lambda line: None)
    assert s["status"] == "degraded" and s["faults"]["dropped_replies"] > 0
    assert s["metrics"]["acc"] > 0.25


# ---------------------------------------------------------------------------
# overlap rate and sample-size imbalance in the data layer
def test_overlap_rate_maps_to_point_missing_rate():
    rng = np.random.default_rng(0)
    mask = parts.missing_mask(1000, 4, 0.5, "point", rng)  # δ = 0.5
    assert mask.all(axis=1).mean() == pytest.approx(0.5)
    kept = mask.sum(axis=1)
    assert kept.min() >= 1 and set(np.unique(kept[kept < 4])) == {1, 2, 3}


def test_imbalance_alpha_skews_client_sizes_and_keeps_a_view():
    sizes = {}
    for alpha in (1e-2, 1e2):
        spreads = []
        for seed in range(5):
            mask = parts.missing_mask(2000, 6, 0.5, "point", np.random.default_rng(seed), imbalance_alpha=alpha)
            assert mask.any(axis=1).all() and mask.all(axis=1).mean() == pytest.approx(0.5)
            n_m = mask.sum(axis=0)
            spreads.append(n_m.max() - n_m.min())
        sizes[alpha] = np.mean(spreads)
    assert sizes[1e-2] > 3 * sizes[1e2]
    # without alpha the draws are exactly those of before
    a = parts.missing_mask(300, 3, 0.3, "point", np.random.default_rng(4))
    b = parts.missing_mask(300, 3, 0.3, "point", np.random.default_rng(4), imbalance_alpha=None)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        parts.missing_mask(10, 3, 0.3, "point", np.random.default_rng(0), imbalance_alpha=0.0)


def test_imbalance_alpha_is_validated():
    with pytest.raises(ScenarioError, match="imbalance_alpha"):
        tiny_scenario(missing=0.0, **{"data.imbalance_alpha": 0.01})
    with pytest.raises(ScenarioError, match="imbalance_alpha"):
        tiny_scenario(**{"data.imbalance_alpha": -1.0})
    assert tiny_scenario(**{"data.imbalance_alpha": 0.01}).data.imbalance_alpha == 0.01


def test_prepare_honours_imbalance_alpha():
    plain = prepare(tiny_scenario(missing=0.5))[1].info["client_sizes"]
    skew = prepare(tiny_scenario(missing=0.5, **{"data.imbalance_alpha": 0.01}))[1].info["client_sizes"]
    assert skew != plain


def test_embeddings_are_standardised_after_pretraining():
    sc = tiny_scenario(**{"params.standardize": 1.0})  # the project's option; the paper's default is off
    _, _, clients, server = parties(sc)
    replies = deliver(clients, server.start(), 0)
    for c, r in replies.items():
        assert float(np.std(r["Z"])) == pytest.approx(1.0, rel=1e-3), c
        assert r["Z"].dtype == np.float32 and r["Q"].shape == (clients[c].n, 4)
    off = tiny_scenario(**{"params.standardize": 0.0})
    _, _, clients, server = parties(off)
    assert any(abs(float(np.std(r["Z"])) - 1.0) > 0.05 for r in deliver(clients, server.start(), 0).values())


@pytest.mark.parametrize("extension", ["no_w", "none"])
def test_the_data_extension_ablation_changes_the_imputed_blocks(extension, monkeypatch):
    import raymvc.protocols.feddmvc as fdm

    seen = {}
    original = fdm.FedDMVCServer.choose_features

    def keep(self, imputed, raw, H, C, round):
        seen[self.config.extension] = (imputed.copy(), raw.copy(), H.copy())
        return original(self, imputed, raw, H, C, round)

    monkeypatch.setattr(fdm.FedDMVCServer, "choose_features", keep)
    for ext in ("full", extension):
        sc = tiny_scenario(missing=0.5, **{"params.extension": ext})
        _, _, clients, server = parties(sc)
        out = server.start()
        for r in range(3):
            out = server.step(r, deliver(clients, out, r), set())
            if not isinstance(out, dict):
                break
    full, other = seen["full"], seen[extension]
    hole = ~full[2]
    d = full[0].shape[1] // full[2].shape[1]
    holes = np.repeat(hole, d, axis=1) & full[2].any(axis=1, keepdims=True)
    if extension == "none":
        np.testing.assert_array_equal(other[0], other[1])  # nothing imputed: the mean-filled features
    assert not np.allclose(full[0][holes], other[0][holes])


def _after_round0(**extra):
    sc = tiny_scenario(**extra)
    _, _, clients, server = parties(sc)
    out = server.step(0, deliver(clients, server.start(), 0), set())
    return clients, server, out


def test_paper_alignment_puts_c_in_the_first_clients_order():
    clients, server, out = _after_round0()
    assert server.config.align_to == "client1"
    mem, d = server.members, server.config.latent_dim
    rows = {c: set(server.rows(c).tolist()) for c in mem}
    complete = sorted(set.intersection(*rows.values()))
    Z = np.hstack([server.Z[c][[list(server.rows(c)).index(i) for i in complete]] for c in mem])
    proto = ((Z[:, None, :] - server.C[None]) ** 2).sum(-1).argmin(1)  # the prototypes' own k-means labels
    first = server.Q[mem[0]][[list(server.rows(mem[0])).index(i) for i in complete]].argmax(1)
    # C's rows are in client 1's cluster order: matching them to client 1's labels is the identity
    assert np.array_equal(fd.align_permutation(first, proto, server.k), np.arange(server.k))
    assert Z.shape[1] == len(mem) * d


@pytest.mark.parametrize("restart, warm_calls", [("fresh", 0), ("fresh_or_warm", 1)])
def test_paper_prototypes_are_fresh_k_means_each_round(restart, warm_calls, monkeypatch):
    clients, server, out = _after_round0(**{"params.prototype_restart": restart})
    calls = []
    original = fd.FedDMVCServer.warm_start
    monkeypatch.setattr(fd.FedDMVCServer, "warm_start", lambda self, *a: calls.append(1) or original(self, *a))
    server.step(1, deliver(clients, out, 1), set())
    assert len(calls) == warm_calls


# --------------------------------------------------------------------------- server_norm (the authors' L1 rows)
def test_l1_rows_divides_each_row_by_its_l1_norm():
    Z = np.array([[3.0, -1.0], [0.0, 0.0], [0.5, 0.5]])
    out = fd.l1_rows(Z)
    np.testing.assert_allclose(out, [[0.75, -0.25], [0.0, 0.0], [0.5, 0.5]])
    np.testing.assert_allclose(np.abs(out[[0, 2]]).sum(axis=1), 1.0)


@pytest.mark.parametrize("norm", ["none", "l1"])
def test_server_norm_fuses_normalised_rows_and_sends_prototypes_in_the_clients_space(norm):
    """With ``server_norm: l1`` the server clusters L1-normalised rows (every view weighs the same),
    but each client's ``C^m`` is the mean of its own rows per server cluster, in the scale it sent;
    without it ``C^m`` is the block of ``C`` as before."""
    sc = tiny_scenario(missing=0.0, seed=3, **{"params.server_norm": norm})
    ds, part, clients, server = parties(sc)
    out = server.start()
    replies = deliver(clients, out, 0)
    for c in replies:  # one client's embeddings far larger than the others': the raw fusion is dominated by it
        replies[c].fields["Z"] = replies[c]["Z"] * (50.0 if c == 0 else 1.0)
    out = server.step(0, replies, set())
    d = server.config.latent_dim
    for j, c in enumerate(server.members):
        sent = out[c]["C"]
        if norm == "none":
            np.testing.assert_allclose(sent, server.C[:, j * d:(j + 1) * d], rtol=1e-6)
            continue
        np.testing.assert_allclose(np.abs(server.Z[c]).sum(axis=1), 1.0, rtol=1e-6)  # what the server fused
        raw = np.asarray(replies[c]["Z"], dtype=np.float64)
        y = server.y[server.rows(c)]
        for a in np.unique(y):
            np.testing.assert_allclose(sent[a], raw[y == a].mean(axis=0), rtol=1e-5)
    scale = np.abs(out[0]["C"]).mean() / np.abs(out[1]["C"]).mean()
    assert (scale > 10) if norm == "l1" else True  # client 0 gets prototypes at its own (large) scale


def test_server_norm_runs_end_to_end_and_is_deterministic(tmp_path):
    sc = tiny_scenario(missing=0.3, seed=1, **{"params.server_norm": "l1"})
    a = run_scenario(sc, tmp_path / "a", progress=lambda line: None)
    b = run_scenario(sc, tmp_path / "b", progress=lambda line: None)
    assert a["status"] == "completed" and a["metrics"] == b["metrics"]
    np.testing.assert_array_equal(_labels(sc), _labels(sc))


def test_init_xavier_is_the_authors_initialisation():
    """``init: xavier``: every linear layer Xavier-uniform with ReLU's gain and zero biases
    (the authors' code, the default); ``init: torch`` keeps PyTorch's, whose biases are not zero."""
    import math

    import torch

    torch.manual_seed(0)
    ae = fd.AutoEncoder(40, (64, 64, 128), 10, 3, init="xavier")
    linears = [m for m in (*ae.encoder, *ae.decoder) if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 8 and all(float(m.bias.detach().abs().max()) == 0.0 for m in linears)
    for m in linears:
        fan_out, fan_in = m.weight.shape
        assert float(m.weight.detach().abs().max()) <= math.sqrt(2.0) * math.sqrt(6.0 / (fan_in + fan_out)) + 1e-6
    plain = fd.AutoEncoder(40, (64, 64, 128), 10, 3, init="torch")
    assert any(float(m.bias.detach().abs().max()) > 0 for m in plain.encoder if isinstance(m, torch.nn.Linear))
    assert fd.Config().init == "xavier" and fd.Config(init="torch").init == "torch"


def test_the_paper_losses_sum_over_features_and_the_authors_average():
    """``loss: sum`` (Eqs. 1 and 3, the default) and ``mean`` (the authors' mse_loss) train the
    same weights (Adam does not see a constant factor) but report L_r D = 10 times apart, so
    at the same γ the KL term weighs D times less under the paper's sums."""
    out = {}
    for loss in ("sum", "mean"):
        sc = tiny_scenario(**{"params.loss": loss})
        _, _, clients, server = parties(sc)
        replies = deliver(clients, server.start(), 0)
        out[loss] = (clients[0].last_loss, replies[0]["Z"])
    assert out["sum"][0] == pytest.approx(10.0 * out["mean"][0], rel=1e-3)
    assert np.allclose(out["sum"][1], out["mean"][1], atol=1e-3)
    assert fd.Config().loss == "sum"


# ---------------------------------------------------------------------------
# quorum: a remedy for availability tied to what a client holds
def test_quorum_repeats_rounds_below_it_and_then_counts_them():
    sc = tiny_scenario(**{"params.quorum": 0.6, "params.patience": 5})
    # clients 1 and 2 away in rounds 0-1: pretraining below the quorum (1 of 3 < 2) twice
    labels, asked, server = _run_by_hand(sc, lambda r: {1, 2} if r < 2 else ({2} if r in (3, 4) else set()))
    assert asked[1] == [1, 2] and asked[2] == [1, 2]  # only the clients not in yet are asked again
    assert asked[3] == [0, 1, 2]  # fine-tuning starts once two of three are in
    # fine-tune rounds 3 and 4 have two fresh replies (>= the quorum): they count; the run
    # ends after the pretraining round and TINY's two fine-tune rounds have counted
    assert server.counted == TINY["rounds"] + 1 and server.waited == 2 and len(asked) == 5
    assert (labels >= 0).all()
    assert server.info["quorum_clients"] == 2  # 0.6 of three clients, rounded up, as the run reports it


def test_quorum_counts_every_round_past_its_patience():
    sc = tiny_scenario(**{"params.quorum": 1.0, "params.patience": 2})
    _, asked, server = _run_by_hand(sc, lambda r: {2})  # client 2 never replies: the quorum is never met
    assert server.waited == 2 and len(asked) == 2 + TINY["rounds"] + 1
    assert 2 not in server.members and server.info["quorum_clients"] == 3


def test_quorum_changes_nothing_when_every_client_replies():
    _, _, server = _run_by_hand(tiny_scenario(), lambda r: {1} if r == 1 else set())
    assert "counted" not in server.info and "waited" not in server.info  # off: the round log as before
    base = _labels(tiny_scenario())
    np.testing.assert_array_equal(base, _labels(tiny_scenario(**{"params.quorum": 1.0})))
    sc = tiny_scenario(**{"params.quorum": 1.0})
    _, asked, server = _run_by_hand(sc, lambda r: set())
    assert server.waited == 0 and server.counted == len(asked) == TINY["rounds"] + 1


def test_quorum_repeats_a_fine_tune_round_below_it():
    sc = tiny_scenario(**{"params.quorum": 1.0, "params.patience": 5})
    # all in at pretraining; client 1 away in rounds 1 and 2: those fine-tune rounds do not count
    _, asked, server = _run_by_hand(sc, lambda r: {1} if r in (1, 2) else set())
    assert asked[1] == asked[2] == [0, 1, 2]  # a fine-tune round below the quorum runs as usual
    assert server.waited == 2 and len(asked) == TINY["rounds"] + 1 + 2
