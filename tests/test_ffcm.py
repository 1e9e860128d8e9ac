"""FFCM (protocols/ffcm.py): fuzzy c-means on each client, the server's k-means over the
local centroids weighted by their fuzzy sizes, labels by the nearest global centroid."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raymvc.driver.engine import run_scenario
from raymvc.protocols import ffcm, kfed
from raymvc.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def test_fuzzy_summary_finds_separated_blobs_with_their_sizes_and_touches_no_global_state():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 0.3, (40, 2)), rng.normal(5, 0.3, (60, 2))])
    state = np.random.get_state()[1].copy()
    C, sizes = ffcm.fuzzy_summary(X, 2, 2.0, np.random.default_rng(1))
    assert np.array_equal(np.random.get_state()[1], state)  # the initial memberships come from the given stream
    order = np.argsort(C[:, 0])
    assert np.allclose(C[order], [[0, 0], [5, 5]], atol=0.2)
    assert np.allclose(sizes[order], [40, 60], atol=1.0) and np.isclose(sizes.sum(), 100)
    again, _ = ffcm.fuzzy_summary(X, 2, 2.0, np.random.default_rng(1))
    assert np.array_equal(C, again)


def test_fuzzy_summary_caps_its_clusters_at_the_distinct_rows():
    X = np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]])
    C, sizes = ffcm.fuzzy_summary(X, 5, 2.0, np.random.default_rng(0))
    assert len(C) == 2 and np.isclose(sizes.sum(), 3)
    C1, s1 = ffcm.fuzzy_summary(X[:1], 5, 2.0, np.random.default_rng(0))
    assert np.array_equal(C1, X[:1]) and s1.tolist() == [1.0]
    C0, s0 = ffcm.fuzzy_summary(X[:0], 5, 2.0, np.random.default_rng(0))
    assert C0.shape == (0, 2) and len(s0) == 0


def test_ffcm_is_k_fed_with_fuzzy_local_centroids(tmp_path):
    """The same exchange as k-FED (two rounds, the same message sizes), other centroids."""
    sc = ROOT / "scenarios" / "digits-kfed.yaml"
    quiet = {"progress": lambda line: None}
    a = run_scenario(load_scenario(sc, ["method=ffcm", "params.m=1.3", "runtime.backend=local"]), tmp_path / "ffcm",
                     **quiet)
    b = run_scenario(load_scenario(sc, ["runtime.backend=local"]), tmp_path / "kfed", **quiet)
    assert a["status"] == b["status"] == "completed" and a["rounds"] == b["rounds"] == 2
    assert a["communication"]["messages"] == b["communication"]["messages"]
    assert (tmp_path / "ffcm" / "labels.csv").read_text() != (tmp_path / "kfed" / "labels.csv").read_text()
    assert ffcm.Config().m == 1.1 and issubclass(ffcm.Config, kfed.Config)  # the tuned default (studies/ffcm-tuning*.yaml)
