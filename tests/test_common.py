"""Tests for the shared protocol helpers (protocols/_common.py) and for the library calls
that replaced hand-written formulas: each compared with the old formula, written here."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from raymvc.protocol import seed_from
from raymvc.protocols import _common as common
from raymvc.protocols import efimvc, kfed


@pytest.mark.parametrize("shape", [(10, 10), (60, 10), (10, 60), (54, 54), (3, 1), (1, 3)])
def test_polar_equals_thin_svd_factor(shape):
    rng = np.random.default_rng(0)
    for _ in range(5):
        M = rng.standard_normal(shape)
        U, _, Wt = np.linalg.svd(M, full_matrices=False)
        P = common.polar(M)
        assert P.shape == M.shape
        np.testing.assert_allclose(P, U @ Wt, atol=1e-12)
        r = min(shape)
        G = P.T @ P if shape[0] >= shape[1] else P @ P.T
        np.testing.assert_allclose(G, np.eye(r), atol=1e-12)


def test_laplacian_equals_degree_minus_similarity():
    rng = np.random.default_rng(1)
    for m in (2, 5, 30):
        S = rng.random((m, m))  # not symmetric, with a diagonal: both as the old formula saw them
        Ss = 0.5 * (S + S.T)
        old = np.diag(Ss.sum(axis=1)) - Ss
        np.testing.assert_allclose(efimvc.laplacian(S), old, atol=1e-13)


def test_nearest_equals_expanded_distance_argmin():
    rng = np.random.default_rng(2)
    for n, k, d in ((200, 10, 64), (50, 1, 3), (7, 7, 2)):
        X, C = rng.standard_normal((n, d)), rng.standard_normal((k, d))
        old = np.argmin((X * X).sum(1)[:, None] - 2.0 * X @ C.T + (C * C).sum(1)[None, :], axis=1)
        np.testing.assert_array_equal(kfed.nearest(X, C), old)


def _old_capped(X, k, rng, n_init, w=None):
    kk = max(1, min(k, len(np.unique(X, axis=0))))
    km = KMeans(n_clusters=kk, n_init=n_init, random_state=seed_from(rng)).fit(X, sample_weight=w)
    C = km.cluster_centers_
    if kk < k:
        C = np.vstack([C, C[np.arange(k - kk) % kk]])
    return C, km.labels_


@pytest.mark.parametrize("weighted", [False, True])
def test_kmeans_capped_equals_previous_code(weighted):
    rng = np.random.default_rng(3)
    X = np.vstack([rng.standard_normal((30, 4)), np.repeat(rng.standard_normal((1, 4)), 5, axis=0)])
    w = rng.random(len(X)) if weighted else None
    for k, rows in ((5, X), (8, X[:3]), (4, X[-5:])):  # enough rows, fewer distinct rows, one distinct row
        C, labels = common.kmeans_capped(rows, k, np.random.default_rng(7), n_init=2,
                                         sample_weight=None if w is None else w[: len(rows)])
        C0, labels0 = _old_capped(rows, k, np.random.default_rng(7), 2, None if w is None else w[: len(rows)])
        np.testing.assert_array_equal(C, C0)
        np.testing.assert_array_equal(labels, labels0)
        assert len(C) == k
    C, _ = common.kmeans_capped(X[-5:], 4, np.random.default_rng(7), n_init=1, pad=False)
    assert len(C) == 1


def test_normalise_rows_and_rel_change():
    X = np.array([[3.0, 4.0], [0.0, 0.0], [0.0, -2.0]])
    np.testing.assert_array_equal(common.normalise_rows(X), [[0.6, 0.8], [0.0, 0.0], [0.0, -1.0]])
    assert common.rel_change(9.0, 10.0) == pytest.approx(0.1)
    assert common.rel_change(-11.0, -10.0) == pytest.approx(0.1)
    assert common.rel_change(1.0, 0.0) >= 1e299  # a zero reference is floored, never divides by zero


def test_membership():
    m = common.Membership([0, 1, 2, 3])
    assert m.join([2, 0]) == [0, 2] and m.members == [0, 2]
    assert m.left_out() == [1, 3]
    assert m.stale({0: "reply"}) == [2] and m.fresh({0: "reply", 1: "reply"}) == [0]
    assert m.join([3, 0]) == [3] and m.members == [0, 2, 3] and m.index(3) == 2  # joiners go last
    assert 3 in m and 1 not in m and len(m) == 3 and list(m) == [0, 2, 3]
