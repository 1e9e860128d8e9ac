"""External clustering scores: ACC, NMI, ARI, purity, pairwise F-score, matched Kappa.

Predicted labels may contain ``-1`` for samples that received no label. Such samples
count as wrong for ACC, purity and Kappa, belong to no pair for the F-score, and form
one extra cluster for NMI and ARI. They stay in the denominator everywhere.

Every score is computed from one contingency table built with NumPy, and the matching with
SciPy's ``linear_sum_assignment``; NMI and ARI are the textbook formulas on that table
(``tests/test_metrics.py`` holds them to scikit-learn's to 1e-12 on many labellings).
Importing ``sklearn.metrics`` costs a run's driver about 0.8 CPU s, most of the scoring
step of a short run (``benchmarks/quickstart_process.md``); the label-free scores, which
need the data, still use it.
"""

from __future__ import annotations

import math

import numpy as np

UNLABELLED = -1

# Every score a run reports, by its name in summary.json's ``metrics``: how tables, pages
# and figures title it and with how many digits. A name not here (a method's own
# ``info.<key>``, a score added later) is shown as it is, with three digits.
SCORES: dict[str, tuple[str, int]] = {
    "acc": ("ACC", 3), "nmi": ("NMI", 3), "ari": ("ARI", 3), "purity": ("purity", 3), "fscore": ("F-score", 3),
    "kappa": ("Kappa", 3), "silhouette": ("silhouette", 4), "calinski_harabasz": ("Calinski-Harabasz", 1),
    "mb": ("MB", 3),
}


def score_title(name: str) -> str:
    """``acc`` -> ``ACC``, ``metric.kappa`` -> ``Kappa``; other names as they are."""
    return SCORES.get(name.removeprefix("metric."), (name, 3))[0]


def score_digits(name: str) -> int:
    return SCORES.get(name.removeprefix("metric."), (name, 3))[1]


def _full(y_true, y_pred) -> tuple[np.ndarray, bool]:
    """The contingency table over every predicted label, ``-1`` included (its first column
    then), and whether any sample is unlabelled; the input checks every score shares."""
    y_true = np.asarray(y_true).ravel()
    y_pred = np.asarray(y_pred).ravel()
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true has {y_true.size} labels but y_pred has {y_pred.size}")
    if y_true.size == 0:
        raise ValueError("cannot score an empty labelling")
    return _contingency(y_true, y_pred), bool(np.any(y_pred == UNLABELLED))


def _table(y_true, y_pred) -> tuple[np.ndarray, np.ndarray, int]:
    """Contingency table (classes x labelled clusters), the classes' sizes and n.

    Class sizes include samples predicted ``-1``; the table's columns do not.
    """
    full, unlabelled = _full(y_true, y_pred)
    table = full[:, 1:] if unlabelled else full
    return table, full.sum(axis=1), int(full.sum())


def _contingency(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """Counts of every (class, predicted label) pair, rows and columns in sorted label order."""
    classes, ci = np.unique(y_true, return_inverse=True)
    clusters, ki = np.unique(y_pred, return_inverse=True)
    flat = np.bincount(ci.ravel() * clusters.size + ki.ravel(), minlength=classes.size * clusters.size)
    return flat.reshape(classes.size, clusters.size).astype(np.int64)


def _pairs(counts: np.ndarray) -> int:
    """Number of unordered pairs inside groups of these sizes: sum of n (n - 1) / 2."""
    c = counts.astype(np.int64)
    return int((c * (c - 1) // 2).sum())


def _entropy(sizes: np.ndarray) -> float:
    """Entropy (natural log) of a labelling with these group sizes, in sorted label order."""
    p = sizes.astype(np.float64)
    if p.size == 1:
        return 0.0
    total = p.sum()
    return float(-np.sum((p / total) * (np.log(p) - math.log(total))))


# NMI and ARI below take scikit-learn's (1.9) operations in its order, so that they give its
# very bits (tests/test_metrics.py checks equality, not closeness): recorded scores stay
# reproducible from their labels.
def nmi(y_true, y_pred) -> float:
    """Normalised mutual information, arithmetic mean of the two entropies as normaliser.

    A labelling with one class and one cluster scores 1; otherwise one with zero
    mutual information (a single class or a single cluster among them) scores 0.
    """
    full = _full(y_true, y_pred)[0].astype(np.float64)
    if full.shape == (1, 1):
        return 1.0
    rows, cols = full.sum(axis=1), full.sum(axis=0)
    if rows.size == 1 or cols.size == 1:
        return 0.0
    i, j = np.nonzero(full)  # row by row, as a sparse table lists them
    nz = full[i, j]
    total = full.sum()
    share = nz / total
    outer = rows.take(i).astype(np.int64) * cols.take(j).astype(np.int64)
    log_outer = -np.log(outer) + math.log(rows.sum()) + math.log(cols.sum())
    terms = share * (np.log(nz) - math.log(total)) + share * log_outer
    terms = np.where(np.abs(terms) < np.finfo(terms.dtype).eps, 0.0, terms)
    mi = float(np.clip(terms.sum(), 0.0, None))
    if mi == 0:
        return 0.0
    return float(mi / float(np.mean([_entropy(rows), _entropy(cols)])))


def ari(y_true, y_pred) -> float:
    """Adjusted Rand index (Hubert and Arabie), from the ordered pair counts in exact integers."""
    full = _full(y_true, y_pred)[0]
    n = int(full.sum())
    squares = int((full.astype(np.int64) ** 2).sum())
    tp = squares - n  # together in both
    fp = int((full.sum(axis=0).astype(np.int64) ** 2).sum()) - squares  # together in the prediction only
    fn = int((full.sum(axis=1).astype(np.int64) ** 2).sum()) - squares  # together in the truth only
    tn = n * n - fp - fn - squares
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))


def _matching(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hungarian matching of classes (rows) to clusters (columns), maximising agreement."""
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment(table, maximize=True)


def acc(y_true, y_pred) -> float:
    """Accuracy after the best one-to-one matching of clusters to classes."""
    table, _, n = _table(y_true, y_pred)
    r, c = _matching(table)
    return float(table[r, c].sum() / n)


def purity(y_true, y_pred) -> float:
    """Fraction of samples belonging to their cluster's majority class."""
    table, _, n = _table(y_true, y_pred)
    return float(table.max(axis=0).sum() / n) if table.size else 0.0


def pairwise_fscore(y_true, y_pred) -> float:
    """F-measure of pairwise precision and recall over sample pairs.

    Every unlabelled sample becomes a singleton cluster, so it is in no predicted pair.
    """
    table, class_sizes, n = _table(y_true, y_pred)
    unlabelled = table.sum() < n  # singletons: in no predicted pair, so only the labelled columns count
    same_both, same_pred, same_true = _pairs(table), _pairs(table.sum(axis=0)), _pairs(class_sizes)
    if same_pred == 0 and same_true == 0:
        return 0.0 if unlabelled else 1.0
    precision = same_both / same_pred if same_pred else 0.0
    recall = same_both / same_true if same_true else 0.0
    return float(2 * precision * recall / (precision + recall)) if precision + recall else 0.0


def matched_kappa(y_true, y_pred) -> float:
    """Cohen's kappa after mapping clusters to classes by the Hungarian matching.

    Clusters left unmatched, and unlabelled samples, get an extra label that no class
    has, so they count as disagreements.
    """
    table, class_sizes, n = _table(y_true, y_pred)
    k = table.shape[0]
    r, c = _matching(table)
    # confusion over classes 0..k-1 plus one "wrong" column for everything unmatched
    confusion = np.zeros((k, k + 1), dtype=np.int64)
    confusion[:, r] = table[:, c]
    confusion[:, k] = class_sizes - confusion[:, :k].sum(axis=1)
    po = np.trace(confusion[:, :k]) / n
    pe = float((class_sizes * confusion.sum(axis=0)[:k]).sum()) / (n * n)
    if pe >= 1.0:
        return 1.0 if po >= 1.0 else 0.0
    return float((po - pe) / (1.0 - pe))


def clustering_scores(y_true, y_pred, kappa: bool = False) -> dict[str, float]:
    """ACC, NMI (arithmetic), ARI, purity and pairwise F-score; plus Kappa if asked."""
    y_true = np.asarray(y_true).ravel()
    y_pred = np.asarray(y_pred).ravel()
    scores = {
        "acc": acc(y_true, y_pred),
        "nmi": nmi(y_true, y_pred),
        "ari": ari(y_true, y_pred),
        "purity": purity(y_true, y_pred),
        "fscore": pairwise_fscore(y_true, y_pred),
    }
    if kappa:
        scores["kappa"] = matched_kappa(y_true, y_pred)
    return scores


def label_free_scores(ds, y_pred, seed: int = 0, max_samples: int = 5000) -> dict[str, float | None]:
    """Scores for data without ground truth: silhouette and Calinski-Harabasz.

    Computed on the driver's copy of the data (all views side by side, as normalised
    for the run), over the samples that got a cluster. The silhouette is estimated on
    at most ``max_samples`` samples (drawn with ``seed``), since it costs O(n^2).
    ``None`` where fewer than two clusters (or too few samples) make a score undefined.
    """
    from sklearn.metrics import calinski_harabasz_score, silhouette_score

    y_pred = np.asarray(y_pred).ravel()
    X = np.hstack(ds.views)
    has = y_pred >= 0
    X, y = X[has], y_pred[has]
    k = len(np.unique(y))
    if k < 2 or k >= len(y):
        return {"silhouette": None, "calinski_harabasz": None}
    size = min(len(y), max_samples) if len(y) > max_samples else None
    return {
        "silhouette": float(silhouette_score(X, y, sample_size=size, random_state=seed)),
        "calinski_harabasz": float(calinski_harabasz_score(X, y)),
    }
