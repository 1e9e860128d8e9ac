"""The Python API: raymvc.run / raymvc.sweep, typed results, data held in memory, check_protocol."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import raymvc
from raymvc.runtime.records import RoundRecord

REPO = Path(__file__).resolve().parents[1]
HW = REPO / "scenarios" / "hw-cefmc.yaml"


def test_run_returns_what_the_run_folder_holds(tmp_path):
    r = raymvc.run(HW, backend="local", out=tmp_path / "r")
    assert r.status == "completed" and r.metrics["acc"] == pytest.approx(0.946, abs=1e-9)
    assert r.labels.shape == (2000,) and r.labels.dtype == np.int64 and (r.labels >= 0).all()
    assert all(isinstance(x, RoundRecord) for x in r.rounds) and [x.round for x in r.rounds] == list(range(len(r.rounds)))
    assert len(r.ledger) == r.summary["communication"]["messages"] + r.summary["communication_eval"]["messages"] \
        + r.summary["communication_setup"]["messages"]
    assert all(isinstance(x["wire_bytes"], int) for x in r.ledger) and max(x["wire_bytes"] for x in r.ledger) > 0
    again = raymvc.RunResult.load(r.out)
    np.testing.assert_array_equal(again.labels, r.labels)
    assert again.summary == r.summary
    # overrides and a Scenario object as the scenario
    sc = raymvc.load_scenario(HW)
    d = raymvc.run(sc, overrides=["faults.dropout.rate=0.3"], backend="local", out=tmp_path / "d")
    assert d.status == "degraded" and d.faults["dropped_replies"] > 0
    with pytest.raises(raymvc.ScenarioError, match="faults.dropout.rate"):
        raymvc.run(HW, overrides=["faults.dropout.rate=2"], backend="local", out=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    # overrides as a mapping of Python values: the same run as the --set strings
    m = raymvc.run(sc, overrides={"faults.dropout": {"rate": 0.3}}, backend="local", out=tmp_path / "m")
    np.testing.assert_array_equal(m.labels, d.labels)
    with pytest.raises(raymvc.ScenarioError, match=r"^overrides faults.dropout.rate=2: faults.dropout.rate: "):
        raymvc.run(HW, overrides={"faults.dropout.rate": 2}, backend="local", out=tmp_path / "bad")
    with pytest.raises(raymvc.ScenarioError, match="bad key path"):
        raymvc.run(HW, overrides={"faults..rate": 2}, backend="local", out=tmp_path / "bad")


def test_overrides_travel_as_values_from_the_command_line_to_the_cells(tmp_path):
    from raymvc.cli import build_parser, sweep_request
    from raymvc.study.sweep import plan

    args = build_parser().parse_args(["sweep", str(HW), "--set", "params.beta=0.5", "--set", "name=hw 2",
                                      "--set", "faults.dropout={rate: 0.1}", "--set", "faults.dropout.rate=0.2",
                                      "--grid", "params.lambda=[0.001, 8]", "--seeds", "3"])
    req = sweep_request(args)  # every --set string is parsed here, once
    assert list(req.overrides) == [("params.beta", 0.5), ("name", "hw 2"), ("faults.dropout", {"rate": 0.1}),
                                   ("faults.dropout.rate", 0.2)]  # in the order given, as YAML reads them
    cells = plan([str(HW)], list(req.grid), list(req.seeds), {"params.kmeans_init": 2}, tmp_path / "s")
    assert [c.overrides for c in cells] == [{"params.kmeans_init": 2, "params.lambda": lam, "seed": 3}
                                            for lam in (0.001, 8)]
    assert type(cells[0].overrides["params.lambda"]) is float and type(cells[1].overrides["params.lambda"]) is int


def test_ledger_to_pandas(tmp_path):
    pd = pytest.importorskip("pandas")
    r = raymvc.run(HW, backend="local", out=tmp_path / "r")
    df = r.ledger.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == len(r.ledger) and "wire_bytes" in df.columns
    # the summary counts the protocol's messages; the ledger also holds the evaluation and setup paths
    protocol = r.ledger.on("protocol")
    assert len(protocol) == r.communication["messages"] < len(r.ledger)
    assert len(protocol) + len(r.ledger.on("eval")) + len(r.ledger.on("setup")) == len(r.ledger)


def _blobs(seed=0):
    rng = np.random.default_rng(seed)
    X0 = np.vstack([rng.normal(m, 0.5, (40, 4)) for m in (0, 5, 10)])
    X1 = np.vstack([rng.normal(m, 0.5, (40, 3)) for m in (0, -6, 6)])
    return X0, X1, np.repeat([0, 1, 2], 40)


def test_data_held_in_memory_with_and_without_labels(tmp_path):
    X0, X1, y = _blobs()
    spec = {"name": "mem", "method": "cefmc", "data": {"n_clusters": 3}}
    u = raymvc.run(spec, data=raymvc.MultiViewData(views=[X0, X1]), backend="local", out=tmp_path / "u")
    assert u.status == "completed" and set(u.metrics) == {"silhouette", "calinski_harabasz"}
    assert u.labels.shape == (120,) and u.summary["dataset"] == "memory"
    lab = raymvc.run({"name": "mem", "method": "cefmc"}, data=raymvc.MultiViewData(views=[X0, X1], labels=y),
                     backend="local", out=tmp_path / "l")
    assert {"acc", "nmi", "ari"} <= set(lab.metrics) and lab.metrics["nmi"] > 0.4  # scored against the labels given
    # other arrays, another fingerprint: a sweep never mistakes one for the other
    other = raymvc.run(spec, data=raymvc.MultiViewData(views=[X0 + 1.0, X1]), backend="local", out=tmp_path / "o")
    assert other.summary["fingerprint"] != u.summary["fingerprint"]


def test_bad_data_in_memory_is_one_clear_error(tmp_path):
    X0, X1, _ = _blobs()
    spec = {"name": "mem", "method": "cefmc", "data": {"n_clusters": 3}}
    X0 = X0.copy()
    X0[3, 1] = np.inf
    with pytest.raises(ValueError, match=r"MultiViewData: view 0 has 1 non-finite value"):
        raymvc.run(spec, data=raymvc.MultiViewData(views=[X0, X1]), backend="local", out=tmp_path / "a")
    with pytest.raises(ValueError, match=r"MultiViewData: view 1 has shape \(119, 3\)"):
        raymvc.run(spec, data=raymvc.MultiViewData(views=[_blobs()[0], X1[:-1]]), backend="local",
                   out=tmp_path / "b")


def test_sweep_returns_runs_and_aggregate(tmp_path):
    s = raymvc.sweep(HW, grid={"faults.dropout.rate": [0.0, 0.3]}, seeds=[0, 1], backend="local",
                     out=tmp_path / "s")
    assert len(s.runs) == 4 and len(s.aggregate) == 2
    assert {r["faults.dropout.rate"] for r in s.runs} == {0.0, 0.3} and {r["seed"] for r in s.runs} == {0, 1}
    first = s.result(0)
    assert first.status in ("completed", "degraded") and first.labels.shape == (2000,)
    again = raymvc.sweep(HW, grid={"faults.dropout.rate": [0.0, 0.3]}, seeds=[0, 1], backend="local",
                         out=tmp_path / "s")  # every cell still stands: reused, same table
    assert again.runs == s.runs
    pd = pytest.importorskip("pandas")
    runs, agg = s.to_pandas(), s.to_pandas(aggregate=True)
    assert isinstance(runs, pd.DataFrame) and len(runs) == 4 and set(runs["seed"]) == {0, 1}
    assert len(agg) == 2 and list(agg["faults.dropout.rate"]) == [0.0, 0.3]


BROKEN = '''
"""A method whose clients label from an unseeded generator: not deterministic."""
import numpy as np
from raymvc.messages import Done, Message
from raymvc.protocol import Client, Protocol, ProtocolConfig, Server


class Config(ProtocolConfig):
    pass


class C(Client):
    def handle(self, msg):
        return Message("n", n=int(self.shard.n_local))

    def predict(self):
        return np.random.default_rng().integers(0, 3, self.shard.n_local)


class S(Server):
    def start(self):
        return {c: Message("hi") for c in self.ctx.client_ids}

    def step(self, round, replies, missing):
        return Done(labels=None)


PROTOCOL = Protocol(name="broken", config=Config, client=C, server=S, partition="horizontal")
'''


def test_check_protocol_passes_a_good_method_and_names_what_a_bad_one_breaks(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples" / "own_method"))
    monkeypatch.delitem(sys.modules, "fedlloyd", raising=False)
    passed = raymvc.testing.check_protocol("fedlloyd")
    assert passed[:4] == ["completes", "deterministic", "missing_reply", "labels_unseen"]
    (tmp_path / "brokenmethod.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AssertionError) as e:
        raymvc.testing.check_protocol("brokenmethod")
    text = str(e.value)
    assert "brokenmethod failed raymvc's protocol checks" in text and "deterministic: a second run" in text


def test_the_readme_python_snippet_runs(tmp_path):
    """The README's Python API section, as printed, in a fresh process (run from a copy of
    the scenarios so its runs/ folder lands in the temporary folder)."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Python API.*?```python\n(.*?)```", text, re.S).group(1)
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "hw-cefmc.yaml").write_text(HW.read_text())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(block)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("completed 0.946 (2000,)")
    assert (tmp_path / "runs" / "api-sweep" / "aggregate.csv").is_file()
    # the in-memory example's three clusters come back whole (its data has no labels; they
    # are known here from how the snippet draws it: 50 samples per centre, in order)
    from sklearn.metrics import adjusted_rand_score

    got = np.loadtxt(tmp_path / "runs" / "api-memory" / "labels.csv", delimiter=",", skiprows=1, dtype=int)[:, 1]
    assert adjusted_rand_score(np.repeat([0, 1, 2], 50), got) >= 0.99


def test_a_grid_value_given_as_text_is_read_as_the_command_line_reads_it(tmp_path):
    """``grid={"faults.dropout.rate": "0,0.3"}`` is two grid points, not one per character;
    a lone number is a one-line error."""
    scen = Path(__file__).resolve().parents[1] / "scenarios" / "digits-kfed.yaml"
    s = raymvc.sweep(scen, grid={"faults.dropout.rate": "0,0.3"}, seeds=[0], backend="local", out=tmp_path / "sw")
    assert sorted(str(r["faults.dropout.rate"]) for r in s.aggregate) == ["0", "0.3"]
    with pytest.raises(raymvc.ScenarioError, match=r"grid faults.dropout.rate: expected a non-empty list of values"):
        raymvc.sweep(scen, grid={"faults.dropout.rate": 0.3}, seeds=[0], backend="local", out=tmp_path / "bad")


@pytest.mark.parametrize("call, want", [
    (lambda out: raymvc.run(HW, overrides={"data.label_column": "cultivr"}, out=out),
     r"^overrides data.label_column=cultivr: data.label_column: applies to .csv/.tsv data"),
    (lambda out: raymvc.run(HW, overrides=["faults.dropout.rat=0.2"], out=out),
     r"^overrides faults.dropout.rat=0.2: faults.dropout.rat: unknown key; did you mean 'rate'"),
    (lambda out: raymvc.sweep(HW, grid={"faults.dropout.ratee": [0.1]}, seeds=[0], out=out),
     r"^grid faults.dropout.ratee=0.1: faults.dropout.ratee: unknown key"),
])
def test_the_apis_errors_name_the_argument_that_caused_them(tmp_path, call, want):
    """The Python API's caller wrote ``overrides=`` and ``grid=``, not ``--set`` and ``--grid``."""
    with pytest.raises(raymvc.ScenarioError, match=want) as e:
        call(tmp_path / "out")
    assert "--set" not in str(e.value) and "--grid" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_method_set_on_the_command_line_is_blamed_for_the_split_it_needs(capsys):
    from raymvc.cli import main

    assert main(["validate", str(HW), "--set", "method=kfed"]) == 2
    err = capsys.readouterr().err
    assert "error: --set method=kfed: method kfed needs a horizontal split;" in err
    assert "has data.partition: vertical (add --set data.partition=horizontal" in err
