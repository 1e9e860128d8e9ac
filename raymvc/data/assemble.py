"""A data set from the arrays of a file: views oriented, absent rows marked, labels checked.

Shared by every file reader (``.mat``/``.npz`` in :mod:`raymvc.data.datasets`, CSV and
Parquet tables in :mod:`raymvc.data.tables`, arrays handed over in memory).
"""

from __future__ import annotations

import warnings

import numpy as np

from .types import MultiViewDataset

VIEW_KEYS = ("X", "views", "data", "fea")


class DataError(ValueError):
    """A data set could not be loaded or is malformed."""


class DataWarning(UserWarning):
    """Data that loads but is probably not what the user meant (e.g. labels of one class)."""


def dense(a, what: str = "view") -> np.ndarray:
    """A matrix (possibly sparse) as a dense float64 array; complex or non-numeric data is a DataError."""
    if hasattr(a, "toarray"):
        a = a.toarray()
    a = np.asarray(a)
    if np.iscomplexobj(a):
        raise DataError(f"{what} holds complex numbers; store real values")
    if a.dtype.kind not in "biuf":
        raise DataError(f"{what} is not numeric (dtype {a.dtype})")
    return np.asarray(a, dtype=np.float64)


def assemble(path, raw_views, labels, present, index, names) -> MultiViewDataset:
    """Orient views, build the present mask, zero-fill absent rows, remap labels."""
    if not raw_views:
        raise DataError(
            f"{path}: no views found; expected a cell/list named one of {', '.join(VIEW_KEYS)} "
            "or arrays X0, X1, ... / view_0, view_1, ..."
        )
    unlabelled = labels is None
    try:
        if unlabelled:  # no ground truth: rows are samples; give data.n_clusters
            first = dense(raw_views[0], "view 0")
            if first.ndim == 0:
                raise DataError("view 0 is a single number, expected a matrix")
            n = first.shape[0] if first.ndim == 2 else len(first)
            labels = np.full(n, -1, dtype=np.int64)
        labels = check_labels(np.asarray(labels).ravel())
        n = len(labels)
        if n == 0:
            raise DataError("no samples (0 labels)" if not unlabelled else "no samples (view 0 has 0 rows)")
        views = [dense(X, f"view {v}") for v, X in enumerate(raw_views)]
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None
    for v, X in enumerate(list(views)):
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2:
            raise DataError(f"{path}: view {v} has {X.ndim} dimensions, expected a matrix")
        if X.shape[0] != n:
            if X.shape[1] != n:
                raise DataError(f"{path}: view {v} has shape {X.shape}, neither dimension matches "
                                f"{n} {'samples (the rows of view 0)' if unlabelled else 'labels'}")
            X = X.T
        if X.shape[1] == 0:
            raise DataError(f"{path}: view {v} has no features (shape {X.shape})")
        views[v] = np.array(X, dtype=np.float64)
    V = len(views)
    if present is not None:
        present = np.asarray(present, dtype=bool)
        if present.shape != (n, V):
            raise DataError(f"{path}: present mask has shape {present.shape}, expected ({n}, {V})")
    elif index is not None:
        if len(index) != V:
            raise DataError(f"{path}: index has {len(index)} entries but there are {V} views")
        present = np.zeros((n, V), dtype=bool)
        for v, idx in enumerate(index):
            idx = np.asarray(idx, dtype=np.int64)
            if idx.size and (idx.min() < 1 or idx.max() > n):
                raise DataError(f"{path}: index of view {v} is out of range 1..{n} (indices are 1-based)")
            present[idx - 1, v] = True
    else:
        present = np.stack([~np.isnan(X).all(axis=1) for X in views], axis=1)
    for v, X in enumerate(views):
        X[~present[:, v]] = 0.0
        bad = int(np.count_nonzero(~np.isfinite(X)))
        if bad:
            raise DataError(f"{path}: view {v} has {bad} non-finite value{'s' if bad > 1 else ''} "
                            "(NaN or infinity) in rows marked present")
    if not present.any(axis=1).all():
        empty = int(np.count_nonzero(~present.any(axis=1)))
        warnings.warn(DataWarning(f"{path}: {empty} sample{'s have' if empty > 1 else ' has'} no view at all; "
                                  "no client can cluster them (-1 in labels.csv)"), stacklevel=2)
    if present.all():
        present = None
    if not unlabelled:
        classes, labels = np.unique(labels, return_inverse=True)
        if len(classes) < 2:
            warnings.warn(DataWarning(f"{path}: the labels hold a single class ({short_label(classes)}); "
                                      "scores against them are trivial; data.n_clusters sets the number of clusters"),
                          stacklevel=2)
    if names is not None and len(names) != V:
        names = None
    return MultiViewDataset(
        name=path.stem,
        views=views,
        labels=labels.astype(np.int64),
        present=present,
        view_names=names or [],
        source=str(path),
    )


def check_labels(labels: np.ndarray) -> np.ndarray:
    """Labels as given, if they are finite real numbers or strings; else a DataError."""
    if np.iscomplexobj(labels):
        raise DataError("labels hold complex numbers")
    if labels.dtype.kind == "f":
        bad = int(np.count_nonzero(~np.isfinite(labels)))
        if bad:
            raise DataError(f"labels have {bad} non-finite value{'s' if bad > 1 else ''} (NaN or infinity)")
    elif labels.dtype.kind not in "biuUS":
        raise DataError(f"labels must be numbers or strings, got dtype {labels.dtype}")
    return labels


def short_label(classes: np.ndarray) -> str:
    return repr(classes[0].item())[:40] if len(classes) else "none"
