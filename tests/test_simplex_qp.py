"""Tests for the batched simplex QP (protocols/_simplex_qp.py): the projection, exact
minimisers against exhaustive and SLSQP references, warm starts, and the pieces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import minimize

from raymvc.protocols import _simplex_qp as Q


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
        P = Q.project_simplex_rows(V)
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
        Z, info = Q.simplex_qp(W, T, tol=1e-12)
        for j in range(T.shape[1]):
            z_ref, f_ref = _exhaustive(W, T[:, j])
            assert _obj(W, T[:, j], Z[:, j]) <= f_ref + 1e-10
            assert np.abs(Z[:, j] - z_ref).max() < 1e-6  # W is positive definite: unique minimiser


@pytest.mark.parametrize("ridge", [1e-3, 1.0])
def test_qp_shared_matrix_vs_slsqp(ridge):
    rng = np.random.default_rng(2)
    m, n = 12, 40
    W, T = _random_problem(rng, m, n, 5, ridge)  # rank-5 Gram + ridge: badly conditioned for small ridge
    Z, info = Q.simplex_qp(W, T, tol=1e-10)
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
    Z, info = Q.simplex_qp(Wg, T, groups=groups, tol=1e-10)
    assert info["unconverged"] == 0
    for j in range(n):
        W = Wg[groups[j]]
        _, f_ref = _slsqp(W, T[:, j])
        assert _obj(W, T[:, j], Z[:, j]) <= f_ref + 1e-9
        assert _fw_gap(W, T[:, j], Z[:, j]) < 1e-8


def test_qp_never_worse_than_warm_start():
    rng = np.random.default_rng(4)
    W, T = _random_problem(rng, 20, 200, 6, 1e-3)
    Z0 = Q.project_simplex_rows(rng.random((200, 20))).T
    f0 = Q.qp_objective(W, T, Z0)
    for iters, polish in ((1, False), (3, False), (10, True)):
        Z, _ = Q.simplex_qp(W, T, Z0, max_iter=iters, tol=0.0, polish=polish)
        assert np.all(Q.qp_objective(W, T, Z) <= f0 + 1e-12)
