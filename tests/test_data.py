"""Tests for data loading, normalisation and partitioning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io

from raymvc.data import (
    DataError,
    horizontal,
    list_builtin,
    load_dataset,
    missing_mask,
    normalize,
    unalign,
    vertical,
)
from raymvc.data.types import MultiViewDataset

PROTEIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "proteinfold" / "proteinFold_Per0.5.mat"


@pytest.fixture(scope="module")
def hw():
    return load_dataset("handwritten")


def rng(seed=0):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- builtins


def test_list_builtin():
    names = list_builtin()
    assert {"handwritten", "handwritten-pix", "digits", "synthetic"} <= set(names)
    assert all(isinstance(d, str) and d for d in names.values())


def test_handwritten_shapes(hw):
    assert hw.n_samples == 2000
    assert hw.dims == [216, 76, 64, 6, 240, 47]
    assert hw.view_names == ["fac", "fou", "kar", "mor", "pix", "zer"]
    assert np.array_equal(np.bincount(hw.labels), np.full(10, 200))
    assert all(X.dtype == np.float64 for X in hw.views)
    assert hw.image_shapes == {4: (16, 15)}
    assert hw.present is None


def test_handwritten_pix_and_view_selection(hw):
    pix = load_dataset("handwritten-pix")
    assert pix.dims == [240] and pix.image_shapes == {0: (16, 15)}
    assert np.array_equal(pix.views[0], hw.views[4])
    sub = load_dataset("handwritten", views=["zer", 4])
    assert sub.dims == [47, 240] and sub.image_shapes == {1: (16, 15)}
    with pytest.raises(DataError, match="no view named"):
        load_dataset("handwritten", views=["nope"])


def test_digits():
    ds = load_dataset("digits")
    assert ds.n_samples == 1797 and ds.dims == [64] and ds.n_clusters == 10
    assert ds.image_shapes == {0: (8, 8)}


def test_synthetic_reproducible():
    a = load_dataset("synthetic", n_samples=300, n_views=2, dims=[5, 7], n_clusters=3, seed=4)
    b = load_dataset("synthetic", n_samples=300, n_views=2, dims=[5, 7], n_clusters=3, seed=4)
    c = load_dataset("synthetic", n_samples=300, n_views=2, dims=[5, 7], n_clusters=3, seed=5)
    assert a.dims == [5, 7]
    assert np.array_equal(np.bincount(a.labels), [100, 100, 100])
    assert all(np.array_equal(x, y) for x, y in zip(a.views, b.views))
    assert np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.views[0], c.views[0])


def test_synthetic_defaults():
    ds = load_dataset("synthetic")
    assert ds.n_samples == 1000 and ds.dims == [20, 20, 20] and ds.n_clusters == 5


def test_bad_names_and_options():
    with pytest.raises(DataError, match="unknown data set"):
        load_dataset("nope")
    with pytest.raises(DataError, match="only the 'synthetic'"):
        load_dataset("digits", n_samples=10)
    with pytest.raises(DataError):
        load_dataset()


# --------------------------------------------------------------------------- normalize


def small_incomplete():
    r = rng(1)
    views = [r.normal(3, 2, (20, 4)), r.normal(-1, 5, (20, 3))]
    present = np.ones((20, 2), dtype=bool)
    present[:5, 0] = False
    present[10:12, 1] = False
    for X, p in zip(views, present.T):
        X[~p] = 0.0
    views[0][6] = 0.0  # a present all-zero row
    return MultiViewDataset("t", views, np.arange(20) % 2, present=present)


def test_normalize_l2():
    ds = small_incomplete()
    out = normalize(ds, "l2")
    norms = np.linalg.norm(out.views[0], axis=1)
    assert np.allclose(norms[ds.present[:, 0] & (np.arange(20) != 6)], 1.0)
    assert norms[6] == 0 and np.all(norms[:5] == 0)
    assert out is not ds and ds.views[0][7].any() and not np.allclose(np.linalg.norm(ds.views[0][7]), 1)


def test_normalize_zscore_minmax():
    ds = small_incomplete()
    z = normalize(ds, "zscore")
    for v in range(2):
        P = z.views[v][ds.present[:, v]]
        assert np.allclose(P.mean(axis=0), 0) and np.allclose(P.std(axis=0), 1)
        assert np.all(z.views[v][~ds.present[:, v]] == 0)
    mm = normalize(ds, "minmax")
    P = mm.views[1][ds.present[:, 1]]
    assert np.allclose(P.min(axis=0), 0) and np.allclose(P.max(axis=0), 1)
    assert np.array_equal(normalize(ds, "none").views[0], ds.views[0])
    with pytest.raises(DataError):
        normalize(ds, "bogus")


# --------------------------------------------------------------------------- user files


def test_npz_round_trip(tmp_path):
    ds = load_dataset("synthetic", n_samples=50, dims=[3, 4], n_clusters=5)
    f = tmp_path / "a.npz"
    np.savez(f, X0=ds.views[0], X1=ds.views[1].T, y=ds.labels + 10)
    back = load_dataset(path=str(f))
    assert back.dims == [3, 4] and back.name == "a"
    assert np.array_equal(back.views[1], ds.views[1]) and np.array_equal(back.labels, ds.labels)

    present = np.ones((50, 2), dtype=bool)
    present[:3, 1] = False
    g = tmp_path / "b.npz"
    np.savez(g, view_0=ds.views[0], view_1=ds.views[1], gt=ds.labels, present=present)
    back = load_dataset(path=str(g))
    assert np.array_equal(back.present, present) and np.all(back.views[1][:3] == 0)

    views = np.empty(2, dtype=object)  # numpy pickles object arrays: refused, never unpickled
    views[0], views[1] = ds.views
    h = tmp_path / "c.npz"
    np.savez(h, views=views, gt=ds.labels)
    with pytest.raises(DataError, match="pickled object arrays"):
        load_dataset(path=str(h))


def test_npz_image_shape(tmp_path):
    """``image_shape`` in an .npz: one (rows, columns) pair for every view or one per view, (0, 0) = not an image."""
    r = np.random.default_rng(0)
    f = tmp_path / "img.npz"
    np.savez(f, X=r.integers(0, 256, (20, 12), dtype=np.uint8), Y=np.arange(20) % 2, image_shape=np.array([3, 4]))
    assert load_dataset(path=str(f)).image_shapes == {0: (3, 4)}
    g = tmp_path / "two.npz"
    np.savez(g, X0=r.normal(size=(20, 5)), X1=r.normal(size=(20, 6)), Y=np.arange(20) % 2,
             image_shape=np.array([[0, 0], [2, 3]]))
    ds = load_dataset(path=str(g))
    assert ds.image_shapes == {1: (2, 3)}
    assert load_dataset(path=str(g), views=[1]).image_shapes == {0: (2, 3)}
    for bad, msg in [(np.array([4, 4]), "view 0 has 12 values per sample, not 4 x 4"),
                     (np.array([1, 2, 3]), r"one pair per view \(1 x 2\), got shape \(3,\)"),
                     (np.array([1.5, 8.0]), "expected whole numbers")]:
        h = tmp_path / "bad.npz"
        np.savez(h, X=np.zeros((20, 12)), Y=np.arange(20) % 2, image_shape=bad)
        with pytest.raises(DataError, match=msg) as e:
            load_dataset(path=str(h))
        assert "\n" not in str(e.value) and "image_shape" in str(e.value)


def test_scenario_image_shape_reaches_the_shards(tmp_path):
    """``data.image_shape`` sets the image shape of a user file's rows; CCFC clients reshape with it."""
    from raymvc.driver import prepare
    from raymvc.scenario import ScenarioError, scenario_from_dict

    r = np.random.default_rng(0)
    f = tmp_path / "flat.npz"
    np.savez(f, X=r.integers(0, 256, (40, 24), dtype=np.uint8), Y=np.arange(40) % 4)
    raw = {"name": "img", "method": "ccfc", "data": {"path": str(f), "partition": "horizontal"},
           "params": {"channels": [4, 8, 8], "proj_hidden": 8, "latent_dim": 8, "pred_dim": 4}}
    _, part = prepare(scenario_from_dict(raw))
    assert "image_shape" not in part.shards[0].meta  # nothing said: 24 values are no square image
    _, part = prepare(scenario_from_dict(raw, values={"data.image_shape": [4, 6]}))
    assert all(s.meta["image_shape"] == (4, 6) for s in part.shards) and part.n_clients == 4
    from raymvc.protocol import ClientContext
    from raymvc.protocols.ccfc import CCFCClient, Config

    client = CCFCClient(Config(**raw["params"]), part.shards[0], ClientContext(0, 4, 4, 0))
    assert tuple(client.x.shape[1:]) == (1, 4, 6)
    with pytest.raises(ScenarioError, match="data.image_shape: view 0 has 24 values per sample, not 5 x 5"):
        prepare(scenario_from_dict(raw, values={"data.image_shape": [5, 5]}))
    with pytest.raises(ScenarioError, match="data.image_shape"):
        scenario_from_dict(raw, values={"data.image_shape": [0, 24]})


@pytest.mark.parametrize("transpose", [False, True])
def test_mat_round_trip(tmp_path, transpose):
    ds = load_dataset("synthetic", n_samples=40, dims=[6, 9], n_clusters=4, seed=2)
    cell = np.empty((1, 2), dtype=object)
    for v, X in enumerate(ds.views):
        cell[0, v] = X.T if transpose else X
    f = tmp_path / "m.mat"
    scipy.io.savemat(f, {"X": cell, "Y": (ds.labels + 1)[:, None]})
    back = load_dataset(path=str(f))
    assert back.dims == [6, 9] and back.present is None
    assert all(np.allclose(a, b) for a, b in zip(back.views, ds.views))
    assert np.array_equal(back.labels, ds.labels)


def test_mat_index_cell_and_label_cell(tmp_path):
    r = rng(3)
    n = 30
    views = [r.normal(size=(5, n)), r.normal(size=(7, n))]
    keep = [np.arange(1, n + 1)[r.random(n) < 0.7], np.arange(1, n + 1)[::2]]
    for X, idx in zip(views, keep):
        absent = np.setdiff1d(np.arange(n), idx - 1)
        X[:, absent] = np.nan
    data = np.empty((2, 1), dtype=object)
    data[0, 0], data[1, 0] = views
    index = np.empty((1, 2), dtype=object)
    index[0, 0], index[0, 1] = keep[0][:, None], keep[1][:, None]
    labels = np.empty((2, 1), dtype=object)
    labels[0, 0] = labels[1, 0] = (np.arange(n) % 3 + 1)[:, None]
    f = tmp_path / "idx.mat"
    scipy.io.savemat(f, {"data": data, "index": index, "truelabel": labels})
    ds = load_dataset(path=str(f))
    assert ds.dims == [5, 7] and ds.n_clusters == 3
    for v in range(2):
        expect = np.zeros(n, dtype=bool)
        expect[keep[v] - 1] = True
        assert np.array_equal(ds.present[:, v], expect)
        assert not np.isnan(ds.views[v]).any() and np.all(ds.views[v][~expect] == 0)
        assert np.allclose(ds.views[v][expect], views[v].T[expect])

    # without the index the mask comes from all-NaN rows
    f2 = tmp_path / "nan.mat"
    scipy.io.savemat(f2, {"data": data, "truelabel": labels})
    assert np.array_equal(load_dataset(path=str(f2)).present, ds.present)


@pytest.mark.skipif(not PROTEIN.exists(), reason="ProteinFold data not available")
def test_proteinfold():
    ds = load_dataset(path=str(PROTEIN))
    assert ds.n_views == 12 and ds.n_samples == 694 and ds.n_clusters == 27
    assert ds.dims == [27] * 12
    m = scipy.io.loadmat(PROTEIN)
    for v in range(12):
        expect = np.zeros(694, dtype=bool)
        expect[m["index"][0, v].ravel() - 1] = True
        assert np.array_equal(ds.present[:, v], expect)
    assert ds.present.any(axis=1).all()
    assert abs(ds.present.all(axis=1).mean() - 0.5) < 0.01


def test_file_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_dataset(path=str(tmp_path / "missing.mat"))
    f = tmp_path / "noviews.mat"
    scipy.io.savemat(f, {"Y": np.arange(5)})
    with pytest.raises(DataError, match="noviews.mat: no views found"):
        load_dataset(path=str(f))
    f = tmp_path / "nolabels.npz"
    np.savez(f, X0=np.zeros((4, 2)))
    ds = load_dataset(path=str(f))  # no labels: rows are samples, labels all -1 (give data.n_clusters)
    assert ds.n_samples == 4 and not ds.has_labels and (ds.labels == -1).all()
    f = tmp_path / "shape.npz"
    np.savez(f, X0=np.zeros((4, 2)), X1=np.zeros((3, 2)), y=np.arange(4))
    with pytest.raises(DataError, match="shape.npz: view 1 has shape"):
        load_dataset(path=str(f))
    f = tmp_path / "x.txt"
    f.write_text("1,2\n")
    with pytest.raises(DataError, match=r"unsupported file type '.txt'; use .npz, .mat, .csv or .tsv"):
        load_dataset(path=str(f))


def test_mat_v73_message(tmp_path):
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64".ljust(124, b" ") + b"\x00\x02IM"
    f = tmp_path / "big.mat"
    f.write_bytes(header + b"\x00" * 512)
    with pytest.raises(DataError, match="v7.3.*-v7"):
        load_dataset(path=str(f))


# --------------------------------------------------------------------------- missing_mask


@pytest.mark.parametrize("pattern", ["point", "block", "imbalanced"])
@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5, 0.97])
def test_missing_mask_rate_and_coverage(pattern, rate):
    n, V = 503, 4
    m = missing_mask(n, V, rate, pattern, rng(7))
    assert m.shape == (n, V) and m.dtype == bool
    assert (~m.all(axis=1)).sum() == round(rate * n)
    assert m.any(axis=1).all()
    assert np.array_equal(m, missing_mask(n, V, rate, pattern, rng(7)))


def runs(flags):
    """Lengths of maximal runs of True."""
    edges = np.diff(np.concatenate([[0], flags.astype(int), [0]]))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def test_block_runs_at_least_six():
    for seed in range(20):
        m = missing_mask(400, 3, 0.3, "block", rng(seed))
        lengths = runs(~m.all(axis=1))
        assert lengths.sum() == 120 and lengths.min() >= 6


def test_point_is_scattered_and_seeds_differ():
    a = missing_mask(1000, 3, 0.3, "point", rng(0))
    b = missing_mask(1000, 3, 0.3, "point", rng(1))
    assert not np.array_equal(a, b)
    assert runs(~a.all(axis=1)).min() == 1  # isolated incomplete samples exist


def test_imbalanced_is_uneven():
    m = missing_mask(2000, 5, 0.5, "imbalanced", rng(3))
    lost = (~m).sum(axis=0)
    assert lost.sum() == 1000 and lost.max() > 2 * lost.min()


def test_missing_mask_base_and_single_view():
    base = np.ones((50, 2), dtype=bool)
    base[:10, 0] = False
    m = missing_mask(50, 2, 0.6, "point", rng(0), base=base)
    assert not m[:10, 0].any() and m.any(axis=1).all()
    assert np.array_equal(missing_mask(5, 1, 0.0, "point", rng(0)), np.ones((5, 1), bool))
    with pytest.raises(ValueError):
        missing_mask(5, 1, 0.2, "point", rng(0))
    with pytest.raises(ValueError):
        missing_mask(5, 2, 0.2, "nope", rng(0))


# --------------------------------------------------------------------------- vertical


def test_vertical(hw):
    part = vertical(hw, rng(0), missing={"rate": 0.5, "pattern": "point"})
    assert part.kind == "vertical" and part.n_clients == 6 and part.n_samples == 2000
    assert part.info["missing_rate"] == 0.5
    mask = np.stack([s.present[0] if s.present[0] is not None else np.ones(2000, bool) for s in part.shards], 1)
    assert mask.any(axis=1).all()
    for v, (s, r) in enumerate(zip(part.shards, part.rows)):
        assert np.array_equal(r, np.arange(2000))
        assert s.meta["view_index"] == v and s.meta["view_name"] == hw.view_names[v]
        assert np.all(s.X[~mask[:, v]] == 0)
        assert np.array_equal(s.X[mask[:, v]], hw.views[v][mask[:, v]])
    assert part.shards[4].meta["image_shape"] == (16, 15)
    full = vertical(hw, rng(0))
    assert full.info["missing_rate"] == 0.0 and all(s.present == [None] for s in full.shards)


# --------------------------------------------------------------------------- horizontal


def assert_disjoint_cover(part, n):
    allrows = np.concatenate(part.rows)
    assert len(allrows) == len(np.unique(allrows)) == n
    assert sum(part.info["client_sizes"]) == n


def test_horizontal_p1_one_class_per_client(hw):
    part = horizontal(hw, None, rng(0), heterogeneity=1.0, view=4)
    assert part.n_clients == 10
    assert_disjoint_cover(part, 2000)
    for c, r in enumerate(part.rows):
        assert np.all(hw.labels[r] == c)
        assert np.array_equal(part.shards[c].X, hw.views[4][r])
    assert part.shards[0].meta["image_shape"] == (16, 15)
    assert "labels" not in part.shards[0].meta


def test_horizontal_p0_roughly_uniform(hw):
    part = horizontal(hw, 5, rng(1), heterogeneity=0.0)
    assert_disjoint_cover(part, 2000)
    for r in part.rows:
        counts = np.bincount(hw.labels[r], minlength=10)
        assert len(r) == 400 and counts.min() >= 20 and counts.max() <= 65


def test_horizontal_partial_skew(hw):
    part = horizontal(hw, 10, rng(2), heterogeneity=0.5)
    assert_disjoint_cover(part, 2000)
    for c, r in enumerate(part.rows):
        assert np.mean(hw.labels[r] == c) >= 0.5


def test_horizontal_dirichlet_sizes(hw):
    a = horizontal(hw, 8, rng(3), heterogeneity=0.0, dirichlet_alpha=0.3)
    b = horizontal(hw, 8, rng(3), heterogeneity=0.0, dirichlet_alpha=0.3)
    sizes = np.array(a.info["client_sizes"])
    assert_disjoint_cover(a, 2000)
    assert sizes.min() >= 2 and sizes.max() > 3 * sizes.min()
    assert all(np.array_equal(x, y) for x, y in zip(a.rows, b.rows))


def test_horizontal_digits_exhaustion():
    ds = load_dataset("digits")
    part = horizontal(ds, None, rng(0), heterogeneity=1.0)
    assert_disjoint_cover(part, 1797)
    assert np.mean([np.mean(ds.labels[r] == c) for c, r in enumerate(part.rows)]) > 0.95


# --------------------------------------------------------------------------- unalign


def test_unalign():
    ds = load_dataset("synthetic", n_samples=200, n_views=3, dims=4)
    part = vertical(ds, rng(0), missing={"rate": 0.2, "pattern": "point"})
    un = unalign(part, 0.5, rng(1))
    complete = np.ones(200, dtype=bool)
    for s in part.shards:
        complete &= s.present[0] if s.present[0] is not None else True
    assert un.info["n_unaligned"] == round(0.5 * complete.sum())
    aligned = un.shards[0].meta["aligned"]
    assert (~aligned).sum() == un.info["n_unaligned"] and not np.any(~aligned & ~complete)
    assert np.array_equal(un.rows[0], np.arange(200))
    for c, (s, r) in enumerate(zip(un.shards, un.rows)):
        assert np.array_equal(s.meta["aligned"], aligned)
        assert np.array_equal(r[aligned], np.arange(200)[aligned])
        assert np.array_equal(np.sort(r), np.arange(200))
        assert np.array_equal(s.X, part.shards[c].X[r])  # rows[c] still maps local -> global
    assert not np.array_equal(un.rows[1], un.rows[0])
    assert np.all(unalign(part, 0.0, rng(1)).shards[2].meta["aligned"])
    with pytest.raises(ValueError):
        unalign(horizontal(ds, 2, rng(0)), 0.5, rng(0))


# --------------------------------------------------------------------------- memory per client


def _owns(a: np.ndarray, *parents: np.ndarray) -> bool:
    return a.base is None and not any(np.shares_memory(a, p) for p in parents)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_horizontal_shards_own_their_rows(p):
    r = rng(3)
    X = r.normal(size=(400, 3))
    ds = MultiViewDataset(name="m", views=[X], labels=r.integers(0, 4, 400))
    part = horizontal(ds, 40, rng(), heterogeneity=p)
    for shard, rows in zip(part.shards, part.rows):
        assert _owns(shard.X, X) and _owns(rows)


def test_vertical_and_unaligned_shards_own_their_rows():
    r = rng(4)
    views = [r.normal(size=(60, 2)), r.normal(size=(60, 3))]
    ds = MultiViewDataset(name="m", views=views, labels=r.integers(0, 3, 60))
    mask = missing_mask(60, 2, 0.3, "point", rng())
    for part in (vertical(ds, rng(), missing=mask), unalign(vertical(ds, rng(), missing=mask), 0.5, rng())):
        for shard, rows in zip(part.shards, part.rows):
            assert _owns(shard.X, *views) and _owns(rows)
            assert shard.present[0] is None or _owns(shard.present[0], mask)


def test_horizontal_memory_grows_with_the_data_not_the_clients():
    """Building many clients' shards holds about the data once more, not a class's worth
    of indices per client (an empty slice kept its parent array alive)."""
    import tracemalloc

    r = rng(5)
    n = 20_000
    X = r.normal(size=(n, 2))
    ds = MultiViewDataset(name="m", views=[X], labels=r.integers(0, 2, n))
    tracemalloc.start()
    try:
        part = horizontal(ds, 2_000, rng())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    held = sum(s.X.nbytes for s in part.shards) + sum(x.nbytes for x in part.rows)
    assert peak < 2 * held + 32 * n * 8, (peak, held)  # a class of indices per client: 80 times more


def _digit_images(n: int = 40) -> MultiViewDataset:
    """A stand-in for mnist10k: ``n`` 28x28 uint8 images, each a bar whose position follows its label."""
    X = np.zeros((n, 28, 28), dtype=np.uint8)
    labels = np.arange(n) % 10
    for i, c in enumerate(labels):
        X[i, 4:24, 2 + 2 * c: 5 + 2 * c] = 255
    return MultiViewDataset(name="mnist10k", views=[X.reshape(n, 784).astype(np.float64)], labels=labels)


def test_noisy_mnist_builds_two_views_of_each_digit():
    """View 0 is the digit's pixels in [0, 1]; view 1 the same digit turned and noised: more ink, every
    value in [0, 1], and one fixed draw (the scenario's seed plays no part)."""
    from raymvc.data.datasets import noisy_mnist

    src = _digit_images()
    ds = noisy_mnist(src)
    a, b = ds.views
    assert ds.name == "noisy-mnist" and ds.view_names == ["pixels", "rotated_noisy"]
    assert a.shape == b.shape == (40, 784) and ds.image_shapes == {0: (28, 28), 1: (28, 28)}
    np.testing.assert_array_equal(a, src.views[0] / 255.0)
    np.testing.assert_array_equal(ds.labels, src.labels)
    assert b.min() >= 0.0 and b.max() <= 1.0 and not np.array_equal(b, a)
    assert b.mean() > a.mean() + 0.3  # uniform noise in [0, 1) adds about half a unit of ink where there was none
    np.testing.assert_array_equal(noisy_mnist(src).views[1], b)  # the same data set every time
    assert not np.array_equal(noisy_mnist(src, seed=1).views[1], b)
    rng = np.random.default_rng(0)
    with pytest.raises(DataError, match="784 columns"):
        noisy_mnist(MultiViewDataset(name="x", views=[rng.random((5, 10))], labels=np.zeros(5, dtype=int)))


def test_noisy_mnist_correlates_with_the_turned_digit():
    """Row i of view 1 is image i turned: its noise-free part correlates with image i more than with others."""
    from raymvc.data.datasets import noisy_mnist

    src = _digit_images()
    b = noisy_mnist(src).views[1]
    a = src.views[0] / 255.0
    own = [np.corrcoef(a[i], b[i])[0, 1] for i in range(10)]
    other = [np.corrcoef(a[i], b[(i + 5) % 10])[0, 1] for i in range(10)]
    assert np.mean(own) > np.mean(other) + 0.1


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist10k").is_dir(),
                    reason="mnist10k not in the shared data folder")
def test_noisy_mnist_by_name_from_the_fetched_mnist():
    ds = load_dataset("noisy-mnist")
    assert ds.name == "noisy-mnist" and [v.shape for v in ds.views] == [(10000, 784), (10000, 784)]
    assert ds.n_clusters == 10 and ds.present is None
