"""Centralised references: ``central: true`` pools a horizontal method's rows at one party
with no faults; ``method: kmeans`` and ``method: fcm`` always run so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from raymvc.cli import main
from raymvc.protocol import ClientContext
from raymvc.protocols import ffcm, kfed
from raymvc.runtime import prepare
from raymvc.runtime.engine import run_scenario
from raymvc.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[1]
KFED = ROOT / "scenarios" / "digits-kfed.yaml"
QUIET = {"progress": lambda line: None}


def _direct(sc, summary_fn) -> tuple[np.ndarray, np.ndarray]:
    """The pooled rows clustered in this process, as the one party does: its summary from
    its own stream, its rows labelled by the nearest centroid."""
    _, part = prepare(sc)
    X = np.asarray(part.shards[0].X, dtype=np.float64)
    ctx = ClientContext(client_id=0, n_clients=1, n_clusters=10, seed=sc.seed)
    return np.asarray(part.rows[0]), kfed.nearest(X, summary_fn(X, ctx.rng_for("summary")))


@pytest.mark.parametrize("overrides, summary_fn", [
    (["central=true"], lambda X, rng: kfed.local_summary(X, 10, rng, 10, 300)[0]),
    (["method=kmeans"], lambda X, rng: kfed.local_summary(X, 10, rng, 10, 300)[0]),
    (["method=fcm", "params.m=1.3"], lambda X, rng: ffcm.fuzzy_summary(X, 10, 1.3, rng)[0]),
])
def test_a_centralised_run_equals_clustering_the_pooled_rows_directly(tmp_path, overrides, summary_fn):
    sc = load_scenario(KFED, [*overrides, "runtime.backend=local"])
    s = run_scenario(sc, tmp_path / "run", **QUIET)
    assert s["central"] is True and s["n_clients"] == 1 and s["status"] == "completed"
    labels = np.loadtxt(tmp_path / "run" / "labels.csv", delimiter=",", skiprows=1, usecols=1, dtype=int)
    rows, direct = _direct(sc, summary_fn)
    assert sorted(rows) == list(range(len(labels)))  # every row at the one party
    assert adjusted_rand_score(labels[rows], direct) == pytest.approx(1.0)


def test_a_federated_run_says_nothing_of_central_and_its_fingerprint_stays(tmp_path):
    s = run_scenario(load_scenario(KFED, ["runtime.backend=local"]), tmp_path / "fed", **QUIET)
    assert "central" not in s and s["n_clients"] == 10
    assert "central" not in load_scenario(KFED).to_yaml()


@pytest.mark.parametrize("overrides, want", [
    (["central=true", "faults.dropout.rate=0.2"], "central: a centralised reference clusters the pooled data with no "
                                                  "faults"),
    (["method=kmeans", "faults.stragglers.fraction=0.5"], "no faults"),
])
def test_a_centralised_reference_with_faults_is_refused(overrides, want):
    with pytest.raises(ScenarioError, match=want):
        prepare(load_scenario(KFED, overrides))


def test_a_vertical_method_has_no_centralised_form_yet(capsys):
    assert main(["validate", str(ROOT / "scenarios" / "hw-cefmc.yaml"), "--set", "central=true"]) == 2
    assert "central: method cefmc splits views among clients (vertical)" in capsys.readouterr().err


def test_the_summary_line_says_a_run_is_the_centralised_reference(tmp_path, capsys):
    assert main(["run", str(KFED), "--set", "method=kmeans", "--backend", "local", "--out", str(tmp_path / "r")]) == 0
    assert "central   the centralised reference" in capsys.readouterr().out
