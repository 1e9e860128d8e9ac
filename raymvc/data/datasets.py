"""Data set loading: built-in data sets, user ``.npz`` / ``.mat`` files, normalisation.

Every loader returns a :class:`MultiViewDataset` with float64 views, labels remapped to
``0..k-1`` (all ``-1`` for a file without labels; rows are then samples) and, where some
samples lack some views, a ``present`` mask (absent rows are zero-filled).

An ``.npz`` may say which views are images with an integer array ``image_shape``:
``(2,)`` = ``(rows, columns)`` of every view, or ``(V, 2)`` = one row per view, ``(0, 0)``
for a view that is not an image (methods that train on images, such as CCFC, read it).

User files are checked before anything runs: views must be real, finite numbers (a row
that is NaN throughout marks the view absent for that sample; any other NaN or an
infinity is an error), there must be at least one sample and one feature per view, and
labels must be finite real numbers or strings. Labels of a single class only warn
(:class:`DataWarning`): the scores are then trivial, which may be what the user wants.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .assemble import VIEW_KEYS, DataError, DataWarning, assemble, dense, short_label  # noqa: F401 (re-exported)
from .types import MultiViewDataset

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
HW_VIEWS = ["fac", "fou", "kar", "mor", "pix", "zer"]
HW_PIX_SHAPE = (16, 15)  # rows x columns, verified by drawing samples

_BUILTINS = {
    "handwritten": "UCI Multiple Features digits: 2000 samples, 6 views "
    "(fac 216, fou 76, kar 64, mor 6, pix 240, zer 47), 10 classes",
    "handwritten-pix": "UCI Multiple Features pixel view only: 2000 images of 16x15, 10 classes",
    "digits": "scikit-learn 8x8 digits: 1797 samples, 1 view of 64 pixels, 10 classes",
    "synthetic": "seeded multi-view Gaussian mixture (n_samples, n_views, dims, n_clusters, noise)",
}

# Data sets the project builds from a fetched one (name -> (the fetched one, description)).
DERIVED = {
    "noisy-mnist": ("mnist10k", "two-view MNIST from mnist10k: 10,000 samples, view 'pixels' (784, in [0, 1]) and "
                                "view 'rotated_noisy' (the same digit rotated by a random angle in [-45, 45] degrees "
                                "plus uniform noise in [0, 1), clipped to [0, 1]), 10 classes; one fixed draw"),
}
NOISY_MNIST_SEED = 20151  # the data set's own draw: the same two views whatever a scenario's seed

LABEL_KEYS = ("Y", "y", "gt", "labels", "label", "truelabel", "truth", "gnd")
_NUMBERED_VIEW = re.compile(r"^(?:X|x|view_?|View_?)(\d+)$")
_SYNTH_ARGS = ("n_samples", "n_views", "dims", "n_clusters", "noise")
MAX_SYNTHETIC_VALUES = 100_000_000  # n_samples x total dims of a synthetic data set (800 MB of float64)


def _remotes() -> list[str]:
    from .fetch import REMOTES

    return list(REMOTES)


def list_builtin() -> dict[str, str]:
    """Names of the built-in data sets mapped to one-line descriptions."""
    return dict(_BUILTINS)


def load_dataset(
    name: str | None = None,
    path: str | None = None,
    *,
    n_samples: int | None = None,
    n_views: int | None = None,
    dims: int | Sequence[int] | None = None,
    n_clusters: int | None = None,
    noise: float | None = None,
    seed: int = 0,
    views: Sequence[int | str] | None = None,
    label_column: str | int | None = None,
) -> MultiViewDataset:
    """Load a built-in data set by ``name`` or user data by ``path``: an ``.npz`` / ``.mat``
    file, a ``.csv`` / ``.tsv`` table, a list of tables (one view each) or a folder of them
    (:mod:`raymvc.data.tables`; ``label_column`` names their label column).

    ``n_samples``, ``n_views``, ``dims``, ``n_clusters``, ``noise`` and ``seed`` shape
    the ``"synthetic"`` data set only. ``views`` keeps a subset of views, by index or
    name, in the order given.
    """
    if (name is None) == (path is None):
        raise DataError("give exactly one of a built-in data set name or a file path")
    synth = {k: v for k, v in zip(_SYNTH_ARGS, (n_samples, n_views, dims, n_clusters, noise)) if v is not None}
    if name != "synthetic" and synth:
        raise DataError(f"{', '.join(synth)}: only the 'synthetic' data set takes generation options")
    if label_column is not None and not _tabular(path):
        raise DataError("data.label_column applies to .csv/.tsv data only")
    if path is not None:
        ds = _load_file(path, label_column)
    elif name == "handwritten":
        ds = _handwritten()
    elif name == "handwritten-pix":
        ds = select_views(_handwritten(), ["pix"])
        ds.name = "handwritten-pix"
    elif name == "digits":
        ds = _digits()
    elif name == "synthetic":
        ds = synthetic(**synth, seed=seed)
    elif name == "noisy-mnist":
        from .fetch import fetch

        ds = noisy_mnist(_load_file(fetch(DERIVED[name][0])))
    elif name in _remotes():
        from .fetch import fetch

        ds = _load_file(fetch(name))
        ds.name = name
    else:
        raise DataError(f"unknown data set {name!r}; built-in data sets: {', '.join(_BUILTINS)}; fetched on "
                        f"first use: {', '.join(_remotes())}; built from a fetched one: {', '.join(DERIVED)}")
    return select_views(ds, views) if views is not None else ds


# --------------------------------------------------------------------------- builtins


def _handwritten() -> MultiViewDataset:
    with np.load(BUILTIN_DIR / "handwritten.npz") as f:
        views = [f[v].astype(np.float64) for v in HW_VIEWS]
        labels = f["labels"].astype(np.int64)
    return MultiViewDataset(
        name="handwritten",
        views=views,
        labels=labels,
        view_names=list(HW_VIEWS),
        image_shapes={HW_VIEWS.index("pix"): HW_PIX_SHAPE},
        source="UCI Multiple Features (builtin/handwritten.npz)",
    )


def _digits() -> MultiViewDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    return MultiViewDataset(
        name="digits",
        views=[d.data.astype(np.float64)],
        labels=d.target.astype(np.int64),
        view_names=["pixels"],
        image_shapes={0: (8, 8)},
        source="sklearn.datasets.load_digits",
    )


def noisy_mnist(mnist: MultiViewDataset, seed: int = NOISY_MNIST_SEED) -> MultiViewDataset:
    """Two views of each MNIST digit, as in the usual "Noisy MNIST" construction: its pixels
    scaled to [0, 1], and a copy rotated by an angle drawn uniformly in [-45, 45] degrees
    (bilinear, the same 28x28 frame) with uniform noise in [0, 1) added and clipped to [0, 1].

    Labels play no part in building the views; one fixed ``seed`` makes one data set.
    """
    from scipy.ndimage import rotate

    X = np.asarray(mnist.views[0], dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 784:
        raise DataError(f"{mnist.name}: noisy-mnist needs 28x28 images (784 columns), got {X.shape[1]}")
    pixels = X / 255.0 if X.max() > 1.0 else X.copy()
    rng = np.random.default_rng(seed)
    angles = rng.uniform(-45.0, 45.0, size=len(pixels))
    noise = rng.uniform(0.0, 1.0, size=pixels.shape)
    turned = np.empty_like(pixels)
    for i, (img, a) in enumerate(zip(pixels.reshape(-1, 28, 28), angles)):
        turned[i] = rotate(img, a, reshape=False, order=1, mode="constant", cval=0.0).ravel()
    noisy = np.clip(np.clip(turned, 0.0, 1.0) + noise, 0.0, 1.0)
    return MultiViewDataset(
        name="noisy-mnist",
        views=[pixels, noisy],
        labels=np.asarray(mnist.labels, dtype=np.int64).copy(),
        view_names=["pixels", "rotated_noisy"],
        image_shapes={0: (28, 28), 1: (28, 28)},
        source=f"built from {mnist.name} (raymvc.data.datasets.noisy_mnist, seed {seed})",
    )


def synthetic(
    n_samples: int = 1000,
    n_views: int | None = None,
    dims: int | Sequence[int] = 20,
    n_clusters: int = 5,
    noise: float = 1.0,
    seed: int = 0,
) -> MultiViewDataset:
    """A multi-view Gaussian mixture with balanced clusters.

    Each view ``v`` has its own cluster means drawn from ``N(0, I)`` in ``dims[v]``
    dimensions; a sample of cluster ``c`` is ``mean_v[c] + noise * N(0, I)`` in every
    view. Defaults: 1000 samples, 3 views of 20 dims, 5 clusters, noise 1.0.
    """
    if isinstance(dims, (int, np.integer)):
        n_views = 3 if n_views is None else n_views
        dims = [int(dims)] * n_views
    else:
        dims = [int(d) for d in dims]
        n_views = len(dims) if n_views is None else n_views
        if len(dims) != n_views:
            raise DataError(f"synthetic: dims has {len(dims)} entries but n_views is {n_views}")
    if n_samples * sum(max(d, 0) for d in dims) > MAX_SYNTHETIC_VALUES:
        raise DataError(f"synthetic: n_samples x total dims = {n_samples} x {sum(dims)} is more than the limit "
                        f"of {MAX_SYNTHETIC_VALUES:.0e} values")
    if not np.isfinite(noise):
        raise DataError(f"synthetic: noise must be finite, got {noise}")
    if n_samples < n_clusters or n_clusters < 1 or n_views < 1 or min(dims) < 1 or noise < 0:
        raise DataError(
            f"synthetic: need n_samples >= n_clusters >= 1, n_views >= 1, dims >= 1, noise >= 0 "
            f"(got n_samples={n_samples}, n_clusters={n_clusters}, n_views={n_views}, dims={dims}, noise={noise})"
        )
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n_samples) % n_clusters)
    views = []
    for d in dims:
        means = rng.standard_normal((n_clusters, d))
        X = rng.standard_normal((n_samples, d))
        X *= noise
        X += means[labels]
        views.append(X)
    return MultiViewDataset(
        name="synthetic",
        views=views,
        labels=labels.astype(np.int64),
        source=f"synthetic(n_samples={n_samples}, dims={dims}, n_clusters={n_clusters}, noise={noise}, seed={seed})",
    )


def select_views(ds: MultiViewDataset, keep: Sequence[int | str]) -> MultiViewDataset:
    """A copy of ``ds`` holding only the views in ``keep`` (indices or names)."""
    idx = []
    for k in keep:
        if isinstance(k, str):
            if k not in ds.view_names:
                raise DataError(f"{ds.name}: no view named {k!r}; views: {ds.view_names}")
            idx.append(ds.view_names.index(k))
        elif 0 <= int(k) < ds.n_views:
            idx.append(int(k))
        else:
            raise DataError(f"{ds.name}: view index {k} out of range 0..{ds.n_views - 1}")
    if not idx:
        raise DataError(f"{ds.name}: view selection is empty")
    present = None if ds.present is None else ds.present[:, idx]
    return dataclasses.replace(
        ds,
        views=[ds.views[i] for i in idx],
        present=present,
        view_names=[ds.view_names[i] for i in idx],
        image_shapes={j: ds.image_shapes[i] for j, i in enumerate(idx) if i in ds.image_shapes},
    )


# --------------------------------------------------------------------------- user files


def _tabular(path) -> bool:
    from .tables import TABLE_SUFFIXES

    if path is None:
        return False
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
    return all(p.is_dir() or p.suffix.lower() in TABLE_SUFFIXES for p in paths)


def _load_file(path, label_column: str | int | None = None) -> MultiViewDataset:
    from .tables import TABLE_SUFFIXES, load_tables, table_files

    if isinstance(path, (list, tuple)):
        paths = [Path(p) for p in path]
        if not paths:
            raise DataError("data.path: an empty list of files")
        for p in paths:
            if not p.is_file():
                raise DataError(f"{p}: file not found")
            if p.suffix.lower() not in TABLE_SUFFIXES:
                raise DataError(f"{p}: a list of files holds .csv/.tsv tables, one view each")
        return load_tables(paths, label_column, str(paths[0].parent))
    path = Path(path)
    if path.is_dir():
        files = table_files(path)
        if not files:
            raise DataError(f"{path}: a folder without .csv/.tsv files")
        return load_tables(files, label_column, str(path))
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    suffix = path.suffix.lower()
    if suffix in TABLE_SUFFIXES:
        ds = load_tables([path], label_column, str(path.with_suffix("")))
        ds.source = str(path)
        return ds
    if suffix == ".npz":
        raw_views, labels, present, index, names, shapes = _read_npz(path)
    elif suffix == ".mat":
        raw_views, labels, present, index, names = _read_mat(path)
        shapes = None
    else:
        raise DataError(f"{path}: unsupported file type {suffix!r}; use .npz, .mat, .csv or .tsv (or a list or "
                        "folder of .csv/.tsv files, one view each)")
    ds = assemble(path, raw_views, labels, present, index, names)
    if shapes is not None:
        try:
            ds.image_shapes = image_shapes_for(ds, shapes)
        except DataError as exc:
            raise DataError(f"{path}: image_shape: {exc}") from None
    return ds


def image_shapes_for(ds: MultiViewDataset, shape) -> dict[int, tuple[int, int]]:
    """Image shapes of the views of ``ds`` from ``(rows, columns)`` (every view) or one such pair per view.

    A pair ``(0, 0)`` marks a view that is not an image; any other pair must hold the
    view's width exactly (``rows x columns`` values).
    """
    a = np.asarray(shape)
    if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a))):
        from ..text import short

        raise DataError(f"expected whole numbers, got {short(a)}")
    a = a.astype(np.int64)
    if a.shape == (2,):
        a = np.tile(a, (ds.n_views, 1))
    if a.shape != (ds.n_views, 2):
        raise DataError(f"expected (rows, columns) or one pair per view ({ds.n_views} x 2), got shape {a.shape}")
    out = {}
    for v, (h, w) in enumerate(a.tolist()):
        if h == 0 and w == 0:
            continue
        if h < 1 or w < 1 or h * w != ds.dims[v]:
            raise DataError(f"view {v} has {ds.dims[v]} values per sample, not {h} x {w}")
        out[v] = (int(h), int(w))
    return out



def _check_npz_size(path: Path) -> None:
    """Refuse an archive whose arrays would not fit in memory, from their headers and the
    archive's directory alone, before anything is decompressed: a few hundred bytes can
    declare 800 GB, and a small zip can inflate to gigabytes."""
    import zipfile

    from .. import safeio

    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"{path}: cannot read .npz archive ({exc})") from None
    declared, inflated, biggest = 0, 0, ("", 0)
    with zf:
        for info in zf.infolist():
            inflated += info.file_size
            try:  # every member numpy would read as an array: by its magic, whatever its name
                with zf.open(info) as fh:
                    if fh.read(6) != b"\x93NUMPY":
                        continue
                    fh.seek(0)
                    version = np.lib.format.read_magic(fh)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(fh)
            except Exception:  # noqa: BLE001 - a header numpy cannot read is left to np.load's error
                continue
            n = int(np.prod(shape, dtype=object)) * int(dtype.itemsize)
            declared += n
            if n > biggest[1]:
                biggest = (f"{info.filename.removesuffix('.npy')}: {' x '.join(map(str, shape))} {dtype}", n)
            if n > info.file_size:
                raise DataError(f"{path}: array {biggest[0] if biggest[1] == n else info.filename} declares {n / 1e9:.3g} "
                                f"GB but holds {info.file_size} bytes: the archive is corrupt")
    avail = safeio.available_memory()
    need = max(declared, inflated)
    if avail is not None and need > avail:  # what it takes after reading is checked once it is read
        raise DataError(f"{path}: its arrays take {need / 1e9:.3g} GB once read (largest {biggest[0]}), more than "
                        f"the {avail / 1e9:.3g} GB this machine has available")


def _read_npz(path: Path):
    """Views, labels, present mask, index and view names from an ``.npz`` archive.

    Archives are read without unpickling: a list of views of different widths must be
    stored as separate arrays ``X0, X1, ...`` (numpy would pickle an object array).
    """
    _check_npz_size(path)
    try:
        f = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a data error
        raise DataError(f"{path}: cannot read .npz archive ({exc})") from exc
    try:
        return _npz_fields(f)
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise DataError(f"{path}: holds pickled object arrays, which are not loaded; store the views "
                            "as separate arrays X0, X1, ... instead") from None
        raise


def _npz_fields(f):
    with f:
        keys = list(f.keys())
        views = None
        for k in ("X", "views"):
            if k in keys:
                arr = f[k]
                if arr.dtype == object:
                    views = list(arr.ravel()) if arr.ndim != 1 else list(arr)
                elif arr.ndim == 3:
                    views = list(arr)
                else:
                    views = [arr]
                break
        if views is None:
            numbered = sorted((int(m.group(1)), k) for k in keys if (m := _NUMBERED_VIEW.match(k)))
            views = [f[k] for _, k in numbered] or None
        label_key = next((k for k in LABEL_KEYS if k in keys), None)
        labels = f[label_key] if label_key else None
        present = f["present"] if "present" in keys else None
        names = [str(s) for s in f["view_names"]] if "view_names" in keys else None
        shapes = f["image_shape"] if "image_shape" in keys else None
    return views, labels, present, None, names, shapes


def _read_mat(path: Path):
    """Views, labels, present mask (none), index and view names from a MATLAB v5/v7 file."""
    import scipy.io

    try:
        m = scipy.io.loadmat(path)
    except NotImplementedError as exc:
        raise DataError(
            f"{path}: MATLAB v7.3 (HDF5) files are not supported; re-save it in MATLAB with "
            f"save('{path.name}', ..., '-v7')"
        ) from exc
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: cannot read .mat file ({exc})") from exc
    views = None
    for k in VIEW_KEYS:
        if k in m:
            arr = m[k]
            views = [dense(a) for a in arr.ravel()] if arr.dtype == object else [dense(arr)]
            break
    label_key = next((k for k in LABEL_KEYS if k in m), None)
    labels = _unwrap_cell(m[label_key]) if label_key else None
    index = None
    if "index" in m:
        arr = m["index"]
        index = [np.asarray(a).ravel() for a in arr.ravel()] if arr.dtype == object else [arr.ravel()]
    return views, labels, None, index, None


def _unwrap_cell(a) -> np.ndarray:
    """Labels stored directly or inside a cell (the first cell entry is used)."""
    a = np.asarray(a)
    while a.dtype == object:
        a = np.asarray(a.ravel()[0])
    return a.ravel()


# --------------------------------------------------------------------------- normalisation

NORMALIZE_METHODS = ("none", "l2", "zscore", "minmax")


def normalise_rows(X: np.ndarray) -> np.ndarray:
    """Every row of ``X`` scaled to unit Euclidean norm; zero rows stay zero."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


def normalize(ds: MultiViewDataset, method: str) -> MultiViewDataset:
    """Return a new data set with every view normalised.

    ``"l2"`` scales each present row to unit Euclidean norm (zero rows stay zero);
    ``"zscore"`` and ``"minmax"`` work per feature using present rows only (constant
    features become 0); absent rows stay 0; ``"none"`` copies the views.
    """
    if method not in NORMALIZE_METHODS:
        raise DataError(f"unknown normalisation {method!r}; choose one of {', '.join(NORMALIZE_METHODS)}")
    mask = ds.present_mask()
    out = []
    for v, X in enumerate(ds.views):
        rows = mask[:, v]
        Y = np.zeros_like(X, dtype=np.float64)
        P = np.asarray(X[rows], dtype=np.float64)
        if method == "l2":
            P = normalise_rows(P)
        elif method == "zscore" and len(P):
            std = P.std(axis=0)
            P = (P - P.mean(axis=0)) / np.where(std > 0, std, 1.0)
        elif method == "minmax" and len(P):
            lo, span = P.min(axis=0), np.ptp(P, axis=0)
            P = (P - lo) / np.where(span > 0, span, 1.0)
        Y[rows] = P
        out.append(Y)
    return dataclasses.replace(
        ds,
        views=out,
        present=None if ds.present is None else ds.present.copy(),
        view_names=list(ds.view_names),
        image_shapes=dict(ds.image_shapes),
    )
