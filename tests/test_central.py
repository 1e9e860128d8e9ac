"""Centralised references: ``central: true`` pools a horizontal method's rows (a vertical
method's views side by side) at one party with no faults; ``method: kmeans`` and ``method: fcm`` always run so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from raymvc.cli import main
from raymvc.driver import prepare
from raymvc.driver.engine import run_scenario
from raymvc.protocol import ClientContext
from raymvc.protocols import ffcm, kfed
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


def _cefmc_directly(sc) -> np.ndarray:
    """CeFMC's client and server in this process, on every view side by side in one matrix
    (no engine, no channel): what clustering the pooled views in one place gives."""
    from raymvc.data import normalize
    from raymvc.data.datasets import load_dataset
    from raymvc.data.types import Shard
    from raymvc.messages import Done
    from raymvc.protocol import ServerContext
    from raymvc.protocols import cefmc

    ds = normalize(load_dataset(sc.data.dataset), sc.data.normalize)
    X = np.hstack([np.asarray(v, dtype=np.float64) for v in ds.views])
    config = cefmc.PROTOCOL.config(**sc.params)
    shard = Shard(views=[X], meta={"view_index": 0})
    client = cefmc.CeFMCClient(config, shard, ClientContext(client_id=0, n_clients=1, n_clusters=ds.n_clusters,
                                                            seed=sc.seed))
    server = cefmc.CeFMCServer(config, ServerContext(client_ids=[0], n_clusters=ds.n_clusters, seed=sc.seed,
                                                     n_samples=ds.n_samples, client_sizes={0: ds.n_samples}))
    out, round = server.start(), 0
    while not isinstance(out, Done):  # round r: the server's message, the reply, the server's step
        client.ctx.round = round
        out = server.step(round, {0: client.handle(out[0])}, set())
        round += 1
    return np.asarray(out.labels)


def test_a_vertical_method_pools_every_view_at_one_party(tmp_path, capsys):
    hw = ROOT / "scenarios" / "hw-cefmc.yaml"
    assert main(["run", str(hw), "--set", "central=true", "--backend", "local", "--out", str(tmp_path / "r")]) == 0
    assert "central   the centralised reference" in capsys.readouterr().out
    labels = np.loadtxt(tmp_path / "r" / "labels.csv", delimiter=",", skiprows=1, usecols=1, dtype=int)
    direct = _cefmc_directly(load_scenario(hw))
    assert labels.shape == direct.shape and np.array_equal(labels, direct)


@pytest.mark.parametrize("overrides, want", [
    (["data.missing.rate=0.3"], "leave data.missing.rate out"),
    (["data.unaligned=0.2"], "leave data.unaligned out"),
])
def test_a_vertical_centralised_reference_needs_aligned_complete_views(overrides, want, capsys):
    assert main(["validate", str(ROOT / "scenarios" / "hw-cefmc.yaml"), "--set", "central=true",
                 *[a for o in overrides for a in ("--set", o)]]) == 2
    err = capsys.readouterr().err
    assert "central: the centralised reference of a vertical method pools every view" in err and want in err


def test_the_summary_line_says_a_run_is_the_centralised_reference(tmp_path, capsys):
    assert main(["run", str(KFED), "--set", "method=kmeans", "--backend", "local", "--out", str(tmp_path / "r")]) == 0
    assert "central   the centralised reference" in capsys.readouterr().out
