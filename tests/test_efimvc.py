"""Tests for EFIMVC: the batched simplex QP, the alignment step, the monotone overall
objective, the missing-reply policy and an end-to-end ProteinFold run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize

from raymvc.data.types import Shard
from raymvc.messages import Done, Message
from raymvc.protocol import ClientContext, ServerContext
from raymvc.protocols import efimvc as E

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "proteinfold"
SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


# --------------------------------------------------------------------------- solver
def _obj(W, t, z):
    return float(z @ W @ z - 2.0 * t @ z)


def _fw_gap(W, t, z):
    g = 2.0 * (W @ z - t)
    return float(z @ g - g.min())


def _exhaustive(W, t):
    """Exact minimiser on the simplex: best feasible stationary point over all faces."""
    m = len(t)
    best, arg = np.inf, None
    for r in range(1, m + 1):
        for S in itertools.combinations(range(m), r):
            S = list(S)
            K = np.zeros((r + 1, r + 1))
            K[:r, :r] = 2.0 * W[np.ix_(S, S)]
            K[:r, r] = K[r, :r] = 1.0
            rhs = np.concatenate([2.0 * t[S], [1.0]])
            try:
                sol = np.linalg.solve(K, rhs)
            except np.linalg.LinAlgError:
                continue
            if sol[:r].min() < -1e-12:
                continue
            z = np.zeros(m)
            z[S] = np.maximum(sol[:r], 0.0)
            z /= z.sum()
            f = _obj(W, t, z)
            if f < best:
                best, arg = f, z
    return arg, best


def _slsqp(W, t):
    m = len(t)
    res = minimize(lambda z: _obj(W, t, z), np.full(m, 1.0 / m), jac=lambda z: 2.0 * (W @ z - t),
                   bounds=[(0.0, None)] * m, method="SLSQP",
                   constraints=[{"type": "eq", "fun": lambda z: z.sum() - 1.0, "jac": lambda z: np.ones(m)}],
                   options={"ftol": 1e-15, "maxiter": 2000})
    return res.x, float(res.fun)


def _random_problem(rng, m, n, d, ridge):
    A = rng.standard_normal((d, m))
    X = rng.standard_normal((d, n)) + rng.standard_normal((d, 1))
    return A.T @ A + ridge * np.eye(m), A.T @ X


def test_projection_matches_bisection():
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 17, 60):
        V = rng.standard_normal((300, m)) * rng.choice([0.01, 1.0, 30.0])
        P = E.project_simplex_rows(V)
        lo, hi = V.min(axis=1) - 1.0, V.max(axis=1)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            over = np.maximum(V - mid[:, None], 0.0).sum(axis=1) > 1.0
            lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
        ref = np.maximum(V - hi[:, None], 0.0)
        assert np.allclose(P.sum(axis=1), 1.0) and P.min() >= 0.0
        assert np.abs(P - ref).max() < 1e-9


def test_qp_matches_exhaustive_on_tiny_problems():
    rng = np.random.default_rng(1)
    for m in (2, 3, 4, 5):
        W, T = _random_problem(rng, m, 30, 3, 0.05)
        Z, info = E.simplex_qp(W, T, tol=1e-12)
        for j in range(T.shape[1]):
            z_ref, f_ref = _exhaustive(W, T[:, j])
            assert _obj(W, T[:, j], Z[:, j]) <= f_ref + 1e-10
            assert np.abs(Z[:, j] - z_ref).max() < 1e-6  # W is positive definite: unique minimiser


@pytest.mark.parametrize("ridge", [1e-3, 1.0])
def test_qp_shared_matrix_vs_slsqp(ridge):
    rng = np.random.default_rng(2)
    m, n = 12, 40
    W, T = _random_problem(rng, m, n, 5, ridge)  # rank-5 Gram + ridge: badly conditioned for small ridge
    Z, info = E.simplex_qp(W, T, tol=1e-10)
    assert Z.min() >= 0.0 and np.allclose(Z.sum(axis=0), 1.0)
    for j in range(n):
        _, f_ref = _slsqp(W, T[:, j])
        assert _obj(W, T[:, j], Z[:, j]) <= f_ref + 1e-9
        assert _fw_gap(W, T[:, j], Z[:, j]) < 1e-8  # KKT: z^T g = min g


def test_qp_grouped_matrices_vs_slsqp():
    rng = np.random.default_rng(3)
    m, n = 10, 45
    B = rng.standard_normal((m, m))
    R = 0.3 * (B @ B.T)
    Wg = np.stack([c * np.eye(m) + R for c in range(4)])  # like the server: count * I + regulariser
    groups = rng.integers(1, 4, size=n)
    T = rng.random((m, n)) * groups
    Z, info = E.simplex_qp(Wg, T, groups=groups, tol=1e-10)
    assert info["unconverged"] == 0
    for j in range(n):
        W = Wg[groups[j]]
        _, f_ref = _slsqp(W, T[:, j])
        assert _obj(W, T[:, j], Z[:, j]) <= f_ref + 1e-9
        assert _fw_gap(W, T[:, j], Z[:, j]) < 1e-8


def test_qp_never_worse_than_warm_start():
    rng = np.random.default_rng(4)
    W, T = _random_problem(rng, 20, 200, 6, 1e-3)
    Z0 = E.project_simplex_rows(rng.random((200, 20))).T
    f0 = E.qp_objective(W, T, Z0)
    for iters, polish in ((1, False), (3, False), (10, True)):
        Z, _ = E.simplex_qp(W, T, Z0, max_iter=iters, tol=0.0, polish=polish)
        assert np.all(E.qp_objective(W, T, Z) <= f0 + 1e-12)


def test_gpi_increases_objective_and_stays_orthogonal():
    rng = np.random.default_rng(5)
    m = 8
    S = E.anchor_similarity(rng.standard_normal((4, m)), None)
    L = E.laplacian(S)
    Lt = np.linalg.eigvalsh(L)[-1] * np.eye(m) - L
    Z = E.project_simplex_rows(rng.random((50, m))).T
    K = E.project_simplex_rows(rng.random((50, m))).T @ Z.T
    P = np.eye(m)

    def f(P):
        return 0.7 * np.sum((Lt @ P @ Z @ Z.T) * P) + np.sum(P * K)

    vals = [f(P)]
    for _ in range(10):
        P, _ = E.gpi(P, Lt, Z @ Z.T, K, 0.7, iters=1, tol=0.0)
        vals.append(f(P))
    assert np.all(np.diff(vals) >= -1e-12)
    assert np.allclose(P.T @ P, np.eye(m), atol=1e-10)


# --------------------------------------------------------------------------- protocol
def _federation(n=120, V=3, k=3, seed=0, **params):
    """Clients and server on a small incomplete data set; sample 0 exists only in view 0."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % k
    present = rng.random((n, V)) < 0.7
    present[present.sum(axis=1) == 0, 0] = True
    present[0] = [True] + [False] * (V - 1)
    clients = {}
    cfg = E.Config(**{"anchors": 2, "beta": 0.1, "lambda": 1.0, **params})
    for v in range(V):
        means = 3.0 * rng.standard_normal((k, 6))
        X = means[labels] + rng.standard_normal((n, 6))
        X[~present[:, v]] = 0.0
        shard = Shard(views=[X], present=[present[:, v].copy()])
        clients[v] = E.EFIMVCClient(cfg, shard, ClientContext(v, V, k, seed))
    server = E.EFIMVCServer(cfg, ServerContext(client_ids=list(range(V)), n_clusters=k,
                                               seed=seed, n_samples=n))
    return clients, server, labels, present


def _round(clients, out, drop=()):
    replies = {c: clients[c].handle(msg) for c, msg in out.items() if c not in drop}
    return replies, {c for c in out if c in drop}


@pytest.mark.parametrize("lam", [1e-3, 1.0])
def test_overall_objective_never_increases(lam):
    clients, server, labels, _ = _federation(tol=0.0, max_rounds=5, **{"lambda": lam})
    out = server.start()
    objs = []
    r = 0
    while True:
        replies, missing = _round(clients, out)
        res = server.step(r, replies, missing)
        objs.append(server.info["objective"])
        if r > 0:
            # clients' graph updates, then the server's loop, each lower the objective
            assert server.info["objective_after_clients"] <= objs[-2] * (1 + 1e-12)
            assert server.info["objective"] <= server.info["objective_after_clients"] * (1 + 1e-12)
            assert np.all(np.diff(server.server_trace) <= 1e-12 * abs(server.server_trace[0]))
            for c in clients.values():
                assert np.all(np.diff(c.trace) <= 1e-12 * abs(c.trace[0]))
        if isinstance(res, Done):
            break
        out = res
        r += 1
    assert r == 5
    assert np.all(np.diff(objs) <= 1e-12 * np.abs(objs[:-1]))
    assert objs[-1] < objs[0]
    from raymvc.metrics import acc
    assert acc(labels, res.labels) > 0.9  # well-separated toy clusters


def test_missing_reply_keeps_last_graph_and_columns():
    clients, server, _, present = _federation(tol=0.0, max_rounds=4)
    out = server.start()
    replies, missing = _round(clients, out)
    out = server.step(0, replies, missing)
    replies, missing = _round(clients, out)
    out = server.step(1, replies, missing)
    before_Zv = server.Zv[0].copy()
    before_S = server.S[0].copy()
    before_recon = server.recon[0]
    before_Z = server.Z.copy()
    prev = server.obj
    replies, missing = _round(clients, out, drop={0})
    assert missing == {0}
    out = server.step(2, replies, missing)
    assert server.info["stale_clients"] == [0]
    assert np.array_equal(server.Zv[0], before_Zv) and np.array_equal(server.S[0], before_S)
    assert server.recon[0] == before_recon
    only0 = present[:, 0] & ~present[:, 1:].any(axis=1)
    assert only0[0]
    assert np.array_equal(server.Z[:, only0], before_Z[:, only0])  # no fresh view: column kept
    assert not np.allclose(server.Z[:, ~only0], before_Z[:, ~only0])  # the rest moved on
    assert server.obj <= prev * (1 + 1e-12)
    assert set(out) == {0, 1, 2}  # the silent client still gets the guidance next round
    replies, missing = _round(clients, out)
    server.step(3, replies, missing)
    assert server.info["stale_clients"] == []


def test_client_missing_from_the_start_is_left_out():
    clients, server, _, present = _federation(tol=0.0, max_rounds=2)
    out = server.start()
    replies, missing = _round(clients, out, drop={2})
    out = server.step(0, replies, missing)
    assert set(out) == {0, 1} and server.info["left_out"] == [2]
    r = 1
    while True:
        replies, missing = _round(clients, out)
        res = server.step(r, replies, missing)
        if isinstance(res, Done):
            break
        out, r = res, r + 1
    assert len(res.labels) == len(present)
    only2 = present[:, 2] & ~present[:, :2].any(axis=1)
    assert np.allclose(server.Z[:, only2], 1.0 / server.m)  # no information: uniform column


def test_client_preprocessing_ignores_scale_and_absent_rows():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((30, 4))
    mask = rng.random(30) < 0.6
    X[~mask] = 0.0
    cfg = E.Config(m=4)
    a = E.EFIMVCClient(cfg, Shard(views=[X], present=[mask]), ClientContext(0, 1, 2, 0))
    b = E.EFIMVCClient(cfg, Shard(views=[X * 50.0], present=[mask]), ClientContext(0, 1, 2, 0))
    assert np.allclose(a.X, b.X) and a.X.shape == (mask.sum(), 4)
    assert np.allclose(np.linalg.norm(a.X, axis=1), 1.0)
    msg = a.handle(Message("init"))
    assert msg["Z"].shape == (4, mask.sum()) and np.array_equal(msg["idx"], np.flatnonzero(mask))


# --------------------------------------------------------------------------- end to end
@pytest.mark.skipif(not (DATA / "proteinFold_Per0.5.mat").is_file(), reason="ProteinFold data not present")
def test_proteinfold_end_to_end(tmp_path):
    from raymvc.runtime import run_scenario
    from raymvc.scenario import load_scenario

    sc = load_scenario(SCENARIOS / "proteinfold-efimvc.yaml", overrides=[
        "runtime.backend=local", f"data.path={DATA / 'proteinFold_Per0.5.mat'}", "params.max_rounds=2"])
    s = run_scenario(sc, tmp_path / "run", progress=lambda line: None)
    assert s["status"] == "completed" and s["rounds"] <= 3
    assert s["unlabelled_samples"] == 0
    assert s["metrics"]["acc"] > 0.2 and s["metrics"]["nmi"] > 0.25  # 27 classes, largest holds 11%
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    objs = [r["info"]["objective"] for r in rounds]
    assert np.all(np.diff(objs) <= 1e-12 * np.abs(objs[:-1]))
