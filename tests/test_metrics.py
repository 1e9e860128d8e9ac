"""Tests for the clustering scores."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, cohen_kappa_score, normalized_mutual_info_score

from raymvc.metrics import acc, clustering_scores, matched_kappa, pairwise_fscore, purity

KEYS = {"acc", "nmi", "ari", "purity", "fscore"}


def brute_fscore(y, p):
    """Pairwise F-score by enumerating all pairs (reference for small inputs)."""
    tp = fp = fn = 0
    for i, j in combinations(range(len(y)), 2):
        same_t, same_p = y[i] == y[j], p[i] == p[j] and p[i] != -1
        tp += same_t and same_p
        fp += same_p and not same_t
        fn += same_t and not same_p
    prec, rec = tp / (tp + fp), tp / (tp + fn)
    return 2 * prec * rec / (prec + rec)


def test_perfect_labels():
    y = np.array([0, 0, 1, 1, 2, 2, 2])
    s = clustering_scores(y, (y + 1) % 3 + 7, kappa=True)
    assert set(s) == KEYS | {"kappa"}
    assert all(isinstance(v, float) for v in s.values())
    assert all(v == pytest.approx(1.0) for v in s.values())


def test_hand_computed():
    y = [0, 0, 0, 1, 1, 1]
    p = [1, 1, 0, 0, 0, 0]
    # best matching: cluster1->class0 (2), cluster0->class1 (3): 5/6
    assert acc(y, p) == pytest.approx(5 / 6)
    # cluster 1 pure (2), cluster 0 has 3 of class 1 out of 4
    assert purity(y, p) == pytest.approx(5 / 6)
    # pairs: same-pred = 1 + 6 = 7, same-true = 3 + 3 = 6, both = 1 + 3 = 4
    prec, rec = 4 / 7, 4 / 6
    assert pairwise_fscore(y, p) == pytest.approx(2 * prec * rec / (prec + rec))


def test_more_clusters_than_classes():
    y = [0, 0, 0, 1, 1, 1]
    p = [0, 0, 1, 2, 2, 3]
    assert acc(y, p) == pytest.approx(4 / 6)
    assert purity(y, p) == pytest.approx(1.0)
    assert acc([0, 1, 2, 3], [0, 0, 1, 1]) == pytest.approx(0.5)


def test_against_sklearn_and_brute_force():
    r = np.random.default_rng(0)
    for _ in range(10):
        y = r.integers(0, 4, 60)
        p = r.integers(0, 5, 60)
        s = clustering_scores(y, p)
        assert s["nmi"] == pytest.approx(normalized_mutual_info_score(y, p))
        assert s["ari"] == pytest.approx(adjusted_rand_score(y, p))
        assert s["fscore"] == pytest.approx(brute_fscore(y, p))


def test_kappa_matches_sklearn_after_mapping():
    y = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 2])
    p = np.array([5, 5, 3, 3, 3, 3, 9, 9, 9, 5])
    # Hungarian: 5->0, 3->1, 9->2
    mapped = np.array([0, 0, 1, 1, 1, 1, 2, 2, 2, 0])
    assert matched_kappa(y, p) == pytest.approx(cohen_kappa_score(y, mapped))


def test_kappa_unmatched_cluster_counts_as_wrong():
    y = np.array([0, 0, 0, 1, 1, 1])
    p = np.array([0, 0, 2, 1, 1, 1])  # cluster 2 has no class left
    wrong = np.array([0, 0, 99, 1, 1, 1])
    assert matched_kappa(y, p) == pytest.approx(cohen_kappa_score(y, wrong))
    assert matched_kappa(y, p) < 1.0


def test_permutation_invariance():
    r = np.random.default_rng(1)
    y = r.integers(0, 3, 50)
    p = r.integers(0, 4, 50)
    relabelled = np.array([7, 2, 9, 4])[p]
    a = clustering_scores(y, p, kappa=True)
    b = clustering_scores(y, relabelled, kappa=True)
    assert a == pytest.approx(b)
    order = r.permutation(50)
    assert clustering_scores(y[order], p[order], kappa=True) == pytest.approx(a)


def test_unlabelled_count_as_wrong():
    y = np.array([0, 0, 1, 1])
    p = np.array([0, -1, 1, 1])
    assert acc(y, p) == pytest.approx(0.75)
    assert purity(y, p) == pytest.approx(0.75)
    assert matched_kappa(y, p) == pytest.approx(cohen_kappa_score(y, [0, 9, 1, 1]))
    assert pairwise_fscore(y, p) == pytest.approx(brute_fscore(y, p))
    s = clustering_scores(y, np.full(4, -1), kappa=True)
    assert s["acc"] == 0.0 and s["purity"] == 0.0 and s["fscore"] == 0.0


def test_large_input_uses_counts():
    r = np.random.default_rng(2)
    y = r.integers(0, 10, 200_000)
    p = np.where(r.random(200_000) < 0.8, y, r.integers(0, 10, 200_000))
    s = clustering_scores(y, p, kappa=True)
    assert 0.8 < s["acc"] < 0.85 and 0.0 <= s["fscore"] <= 1.0


def test_length_mismatch():
    with pytest.raises(ValueError):
        acc([0, 1], [0])


# --------------------------------------------------------------------------- library replacements
def _old_table(y_true, y_pred):
    """The contingency table as computed before scikit-learn's contingency_matrix."""
    y_true, y_pred = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    _, t = np.unique(y_true, return_inverse=True)
    labelled = y_pred != -1
    _, p = np.unique(y_pred[labelled], return_inverse=True)
    k_true = int(t.max()) + 1
    k_pred = int(p.max()) + 1 if p.size else 0
    table = np.zeros((k_true, k_pred), dtype=np.int64)
    np.add.at(table, (t[labelled], p), 1)
    return table, np.bincount(t, minlength=k_true), int(y_true.size)


def _old_fscore(y_true, y_pred):
    """The pairwise F-score as computed before scikit-learn's pair_confusion_matrix."""
    def pairs(x):
        x = x.astype(np.int64)
        return int((x * (x - 1) // 2).sum())

    table, class_sizes, _ = _old_table(y_true, y_pred)
    same_both, same_pred, same_true = pairs(table), pairs(table.sum(axis=0)), pairs(class_sizes)
    if same_pred == 0 and same_true == 0:
        return 1.0 if same_both == 0 and table.sum() == class_sizes.sum() else 0.0
    precision = same_both / same_pred if same_pred else 0.0
    recall = same_both / same_true if same_true else 0.0
    return float(2 * precision * recall / (precision + recall)) if precision + recall else 0.0


def _random_labellings(seed=0, count=200):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(1, 40))
        y_true = rng.integers(0, int(rng.integers(1, 6)), n) * 7 - 3  # arbitrary label values
        y_pred = rng.integers(-1, int(rng.integers(1, 6)), n)  # -1: unlabelled
        if rng.random() < 0.1:
            y_pred[:] = -1
        if rng.random() < 0.1:
            y_pred = np.arange(n)  # all singletons
        yield y_true, y_pred


def test_table_and_fscore_equal_the_previous_formulas():
    from raymvc.metrics import _table

    for y_true, y_pred in _random_labellings():
        table, sizes, n = _table(y_true, y_pred)
        old_table, old_sizes, old_n = _old_table(y_true, y_pred)
        np.testing.assert_array_equal(table, old_table)
        np.testing.assert_array_equal(sizes, old_sizes)
        assert n == old_n
        assert pairwise_fscore(y_true, y_pred) == pytest.approx(_old_fscore(y_true, y_pred), abs=1e-12)


def test_nmi_and_ari_equal_scikit_learns_on_every_kind_of_labelling():
    """The NumPy NMI and ARI (no sklearn.metrics import in a run's driver) give scikit-learn's
    very bits, edge cases included: one class, one cluster, all singletons, unlabelled samples,
    labels that are not 0..k-1, a perfect match (exactly 1, never 1 + 4e-16)."""
    from raymvc.metrics import ari, nmi

    cases = list(_random_labellings())
    cases += [([0, 0, 0], [1, 1, 1]), ([0, 0, 0], [0, 1, 2]), ([0, 1, 2], [5, 5, 5]), ([0, 1, 2], [7, 8, 9]),
              ([3], [4]), ([0, 0, 1, 1], [-1, -1, -1, -1]), ([0, 1, 0, 1], [9, -1, 9, -1]),
              (np.repeat(np.arange(10), 700), np.tile(np.arange(10), 700))]
    rng = np.random.default_rng(1)
    for k in (2, 3, 10, 27):  # perfect and near-perfect clusterings of a few sizes, relabelled
        y = rng.integers(0, k, 500)
        cases += [(y, (y * 7 + 3) % 1000), (y, np.where(rng.random(500) < 0.05, rng.integers(0, k, 500), y))]
    for y_true, y_pred in cases:
        assert nmi(y_true, y_pred) == normalized_mutual_info_score(y_true, y_pred)
        assert ari(y_true, y_pred) == adjusted_rand_score(y_true, y_pred)


def test_scoring_a_run_does_not_import_sklearn_metrics():
    """A run's driver scores its labels without importing sklearn.metrics (0.8 CPU s of a short run)."""
    import subprocess
    import sys

    code = ("import sys; import numpy as np; from raymvc.metrics import clustering_scores; "
            "clustering_scores(np.arange(50) % 3, np.arange(50) % 4, kappa=True); "
            "print('sklearn.metrics' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
