"""Checks every registered method must pass, the way scikit-learn checks every estimator.

Each method runs with its ``quick_params`` on a small split of the kind it expects
(vertical: a synthetic three-view set; horizontal: 8x8 digits over three clients) and
must:

(a) give identical labels and bytes on Ray and in-process;
(b) survive a missing reply from one client in any single round without failing;
(c) never receive labels: no shard, context or config holds them, and a run whose
    label array is replaced by random labels gives identical cluster assignments;
(d) be deterministic for a seed (labels and the whole ledger);
(e) where it declares ``analytic_bytes``, match the ledger's protocol data bytes;
(f) checkpoint its state (``runtime.checkpoint``) and, stopped after its first round
    (its second, where it has more than two) and resumed, end exactly as the
    uninterrupted run;
(g) where it declares secure sums (``Protocol.secure_sums``), run with
    ``channel.secure_aggregation`` on: its server never sees a declared field, the
    labels are the plain run's, and a client lost in either of the layer's
    exchanges degrades the run without any error.

A new method gets all of this by being registered in ``raymvc.protocols``.
"""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score

from raymvc.driver import prepare, run_scenario
from raymvc.protocol import RunFacts
from raymvc.protocols import available, get
from raymvc.runtime import nodes
from raymvc.scenario import ScenarioError, scenario_from_dict

METHODS = available()


# the data situations a method exists for, so that its checks exercise them
DATA_EXTRAS = {"fcuif": {"unaligned": 0.4, "missing": {"rate": 0.3, "pattern": "point"}}}


def _scenario(method: str, **over):
    proto = get(method)
    if proto.partition == "vertical":
        data = {"dataset": "synthetic", "normalize": "zscore",
                "synthetic": {"n_samples": 150, "n_views": 3, "dims": [6, 8, 10], "n_clusters": 3, "noise": 0.6},
                **DATA_EXTRAS.get(method, {})}
    else:
        data = {"dataset": "digits", "partition": "horizontal", "n_clients": 3, "heterogeneity": 0.0}
    raw = {"name": f"conf-{method}", "method": method, "params": dict(proto.quick_params), "data": data,
           "runtime": {"backend": "local", "client_cpus": 0.25, "server_cpus": 0.25}, "seed": 3}
    return scenario_from_dict(raw, values=over)


def _run(sc, out, prepared=None):
    return run_scenario(sc, out, progress=lambda line: None, prepared=prepared)


def _labels(summary) -> np.ndarray:
    with open(f"{summary['out_dir']}/labels.csv", newline="") as fh:
        return np.array([int(r["cluster"]) for r in csv.DictReader(fh)])


def _ledger(summary, drop_times: bool = False) -> list[dict]:
    with open(f"{summary['out_dir']}/messages.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    if drop_times:
        rows = [{k: v for k, v in r.items() if k not in ("send_t", "arrive_t")} for r in rows]
    return rows


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One fault-free in-process run per method, shared by the checks."""
    root = tmp_path_factory.mktemp("conformance")
    cache: dict[str, dict] = {}

    def get_run(method: str) -> dict:
        if method not in cache:
            cache[method] = _run(_scenario(method), root / method)
        return cache[method]

    return get_run


@pytest.mark.parametrize("method", METHODS)
def test_completes_and_labels_every_sample(method, baseline):
    s = baseline(method)
    assert s["status"] == "completed", s["error"]
    assert s["errors"] == [] and s["faults"]["client_errors"] == []
    y = _labels(s)
    assert len(y) == s["n_samples"] and (y >= 0).all()
    # it clusters, not just answers: its labels agree with the truth far beyond what the same
    # labels reach against shuffled truths, and they hold a fair share of what k-means on the
    # pooled data finds (the quick parameters trade quality for seconds, hence a quarter)
    ds, _ = prepare(_scenario(method))
    truth = np.asarray(ds.labels)
    rng = np.random.default_rng(0)
    chance = [normalized_mutual_info_score(rng.permutation(truth), y) for _ in range(50)]
    nmi = normalized_mutual_info_score(truth, y)
    assert nmi > np.mean(chance) + 10 * np.std(chance) + 0.05, (nmi, max(chance))
    pooled = np.hstack([np.nan_to_num(v) for v in ds.views])
    reference = normalized_mutual_info_score(truth, KMeans(ds.n_clusters, n_init=10, random_state=0).fit_predict(pooled))
    assert nmi >= 0.25 * reference, (nmi, reference)


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_for_a_seed(method, baseline, tmp_path):
    s = baseline(method)
    again = _run(_scenario(method), tmp_path / "again")
    np.testing.assert_array_equal(_labels(again), _labels(s))
    assert _ledger(again) == _ledger(s)


@pytest.mark.parametrize("method", METHODS)
def test_ray_and_in_process_agree(method, baseline, ray_session, tmp_path):
    s = baseline(method)
    on_ray = _run(_scenario(method, **{"runtime.backend": "ray"}), tmp_path / "ray")
    assert on_ray["status"] == "completed", on_ray["error"]
    np.testing.assert_array_equal(_labels(on_ray), _labels(s))
    assert _ledger(on_ray, drop_times=True) == _ledger(s, drop_times=True)


@pytest.mark.parametrize("method", METHODS)
def test_survives_one_missing_reply_in_any_round(method, baseline, tmp_path):
    rounds = baseline(method)["rounds"]
    assert rounds >= 1
    if get(method).pooled:  # a centralised reference injects no fault: asking for one is a one-line error
        with pytest.raises(ScenarioError, match="no faults"):
            _run(_scenario(method, **{"faults.drop": [{"client": 0, "at_round": 0}]}), tmp_path / "drop")
        return
    for r in range(rounds):
        s = _run(_scenario(method, **{"faults.drop": [{"client": 0, "at_round": r}]}), tmp_path / f"drop{r}")
        assert s["status"] == "degraded", f"client 0 missing in round {r}: {s['status']} {s['error']}"
        # degraded by the injected drop alone: no party's code raised on the way
        assert s["errors"] == [] and s["faults"]["client_errors"] == [], s["errors"]
        assert s["faults"]["dropped_replies"] == 1
        assert s["participation"][0]["missed"] == 1
        assert s["metrics"] is not None and s["unlabelled_samples"] < s["n_samples"]


@pytest.mark.parametrize("method", METHODS)
def test_protocols_never_see_labels(method, baseline, tmp_path, monkeypatch):
    sc = _scenario(method)
    ds, part = prepare(sc)
    for shard, rows in zip(part.shards, part.rows):
        truth = np.asarray(ds.labels)[rows]
        arrays = [*shard.views, *(p for p in shard.present if p is not None),
                  *(np.asarray(v) for v in shard.meta.values() if isinstance(v, (list, tuple, np.ndarray)))]
        columns = [a if a.ndim == 1 else a.reshape(len(a), -1).T for a in arrays if len(a) == len(truth)]
        for col in (c for group in columns for c in (group if group.ndim == 2 else [group])):
            # no column of anything a client holds may encode the labels, whatever their numbering
            if len(np.unique(col)) <= 2 * ds.n_clusters:
                assert normalized_mutual_info_score(truth, col) < 0.95, "a shard carries the ground-truth labels"
    noise = np.random.default_rng(99).integers(0, ds.n_clusters, size=len(ds.labels))
    built = []  # every context and config a party is built from in the run below
    for name in ("ClientContext", "ServerContext"):
        cls = getattr(nodes, name)
        monkeypatch.setattr(nodes, name, lambda *a, _cls=cls, **k: built.append(_cls(*a, **k)) or built[-1])
    s = _run(sc, tmp_path / "random-labels", prepared=(dataclasses.replace(ds, labels=noise), part))
    np.testing.assert_array_equal(_labels(s), _labels(baseline(method)))
    assert s["metrics"]["nmi"] < 0.2  # the scores did use the (random) labels
    assert {type(b).__name__ for b in built} == {"ClientContext", "ServerContext"}
    config = sc.protocol_config().model_dump()
    for value in [*config.values(), *(v for b in built for v in vars(b).values())]:
        # the random labels are distinctive: nothing a party is built from may hold them
        values = list(value.values()) if isinstance(value, dict) else value
        if isinstance(values, (list, tuple, np.ndarray)) and len(values) == len(noise):
            assert normalized_mutual_info_score(noise, np.asarray(values).ravel()) < 0.5


@pytest.mark.parametrize("method", [m for m in METHODS if get(m).analytic_bytes is not None])
def test_analytic_bytes_match_the_ledger(method, baseline):
    s = baseline(method)
    sc = _scenario(method)
    ds, part = prepare(sc)
    ids = list(range(part.n_clients))
    facts = RunFacts(n_samples=part.n_samples, n_clusters=ds.n_clusters, client_ids=ids,
                     client_sizes={c: part.shards[c].rows_held for c in ids},
                     client_dims={c: int(part.shards[c].views[0].shape[1]) for c in ids}, rounds=s["rounds"])
    want = get(method).analytic_bytes(sc.protocol_config(), facts)
    assert s["communication"]["data_bytes"] == want


@pytest.mark.parametrize("method", METHODS)
def test_checkpoint_and_resume_end_as_the_uninterrupted_run(method, baseline, tmp_path):
    s = baseline(method)
    stop_at = 1 if s["rounds"] > 2 else 0
    sc = _scenario(method, **{"runtime.checkpoint": True})

    def stop(record):
        if record["round"] == stop_at:
            raise KeyboardInterrupt

    out = tmp_path / "stopped"
    first = run_scenario(sc, out, progress=lambda line: None, on_round=stop)
    assert first["status"] == "interrupted"
    again = run_scenario(sc, out, progress=lambda line: None, resume=True)
    assert again["status"] == "completed"
    np.testing.assert_array_equal(_labels(again), _labels(s))
    assert again["communication"] == s["communication"]
    assert [r for r in _ledger(again) if r["path"] == "protocol"] == [r for r in _ledger(s) if r["path"] == "protocol"]


SECURE = [m for m in METHODS if get(m).secure_sums]


@pytest.mark.parametrize("method", SECURE)
def test_secure_sums_under_the_engine_layer(method, baseline, tmp_path, monkeypatch):
    from raymvc.runtime.faults import FaultPlan

    proto = get(method)
    plain = baseline(method)
    seen: list[str] = []
    real_step = proto.server.step

    def step(self, round, replies, missing):
        seen.extend(f"{m.kind}.{name}" for m in replies.values() for spec in proto.secure_sums
                    if m.kind == spec.kind for name in m.fields if spec.covers(name))
        return real_step(self, round, replies, missing)

    monkeypatch.setattr(proto.server, "step", step)
    s = _run(_scenario(method, **{"channel.secure_aggregation": True}), tmp_path / "secure")
    assert s["status"] == "completed", s["error"]
    assert s["errors"] == [] and s["faults"]["client_errors"] == []
    assert seen == [], seen[:5]
    assert s["rounds"] == plain["rounds"] and s["communication_secagg"]["messages"] > 0
    np.testing.assert_array_equal(_labels(s), _labels(plain))  # declared sums are the same fixed-point sums
    real_dropped = FaultPlan.dropped
    for sub in (1, 2):  # lost before its masked input, or while the others unmask
        monkeypatch.setattr(FaultPlan, "dropped",
                            lambda self, r, c, x=0, sub=sub: (r, c, x) == (0, 0, sub) or real_dropped(self, r, c, x))
        d = _run(_scenario(method, **{"channel.secure_aggregation": True}), tmp_path / f"sub{sub}")
        assert d["status"] == "degraded", (sub, d["status"], d["error"])
        assert d["errors"] == [] and d["faults"]["client_errors"] == [] and d["faults"]["dropped_replies"] == 1


@pytest.mark.parametrize("method", SECURE)
def test_secure_sums_agree_on_ray_and_in_process(method, ray_session, tmp_path):
    over = {"channel.secure_aggregation": True, "faults.dropout.rate": 0.2}
    local = _run(_scenario(method, **over), tmp_path / "local")
    on_ray = _run(_scenario(method, **{**over, "runtime.backend": "ray"}), tmp_path / "ray")
    assert local["status"] == on_ray["status"] and not on_ray["errors"], on_ray["error"]
    np.testing.assert_array_equal(_labels(on_ray), _labels(local))
    assert _ledger(on_ray, drop_times=True) == _ledger(local, drop_times=True)
