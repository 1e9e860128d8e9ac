"""Partial work (faults.partial_work): which clients do only part of their local work is
seeded per client and round, the same in-process and on Ray, recorded in rounds.jsonl and
seen by the clients as ``ctx.work``; the deep methods cut their local steps to it, the
closed-form ones ignore it and ``raymvc params`` says which."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import run_rounds

from raymvc import streams
from raymvc.cli import main
from raymvc.driver import prepare
from raymvc.protocol import ClientContext, work_steps
from raymvc.protocols import get
from raymvc.runtime.faults import FaultPlan, work_share
from raymvc.scenario import FaultsCfg, PartialWorkCfg, scenario_from_dict
from raymvc.streams import stream

PARTIAL = {"fraction": 0.4, "work": 0.5}

# a method whose clients tell the server the share of work they were given: the engine's
# ctx.work, seen end to end (the server puts it in rounds.jsonl's info)
WORKECHO = '''
from raymvc.messages import Done, Message
from raymvc.protocol import Client, Protocol, ProtocolConfig, Server


class Config(ProtocolConfig):
    rounds: int = 6


class WorkClient(Client):
    def handle(self, msg):
        return Message("work", work=float(self.ctx.work))

    def predict(self):
        import numpy as np
        return np.zeros(self.shard.n_local, dtype=np.int64)


class WorkServer(Server):
    def start(self):
        return {c: Message("go") for c in self.ctx.client_ids}

    def step(self, round, replies, missing):
        self.info = {"work": {str(c): float(m["work"]) for c, m in replies.items()}}
        if round + 1 >= self.config.rounds:
            return Done(labels=None)
        return self.start()

    def result(self):
        return Done(labels=None)


PROTOCOL = Protocol(name="workecho", config=Config, client=WorkClient, server=WorkServer,
                    partition="horizontal", supports=frozenset({"partial_work"}))
'''


def workecho_file(tmp_path: Path, n_clients: int = 8, rounds: int = 6, **faults) -> Path:
    (tmp_path / "workecho_method.py").write_text(WORKECHO)
    sc = {"name": "workecho", "method": "workecho_method", "params": {"rounds": rounds},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": n_clients},
          "faults": {"partial_work": PARTIAL, **faults}, "runtime": {"backend": "local"}, "seed": 3}
    path = tmp_path / "workecho.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path




# --------------------------------------------------------------------------- the draw
def test_the_draw_is_seeded_per_client_and_round_with_the_given_share():
    faults = FaultsCfg(partial_work=PARTIAL)
    ids = list(range(20))
    a, b = FaultPlan(faults, ids, seed=7), FaultPlan(faults, list(reversed(ids)), seed=7)
    grid = np.array([[a.work(r, c) for c in ids] for r in range(200)])
    assert set(np.unique(grid)) == {0.5, 1.0}
    # the same whatever the client order or what was asked before; work_share is the plan's
    assert all(b.work(r, c) == grid[r, c] == work_share(b.kinds, r, c) for r in (199, 0, 57) for c in ids)
    # the coin is the stream keyed (seed, tag, client, round) it always was: runs keep their labels
    coin = np.array([[stream(7, streams.PARTIAL, c, r).random() for c in ids] for r in range(200)])
    assert np.array_equal(grid, np.where(coin < 0.4, 0.5, 1.0))
    assert abs((grid < 1).mean() - 0.4) < 0.03
    assert not np.array_equal(grid, [[FaultPlan(faults, ids, seed=8).work(r, c) for c in ids] for r in range(200)])
    # off: no partial work at all
    for cfg in (None, PartialWorkCfg(fraction=0.0, work=0.5), PartialWorkCfg(fraction=1.0, work=1.0)):
        assert FaultPlan(FaultsCfg(partial_work=cfg), ids, 7).work(3, 1) == 1.0
    assert FaultPlan(FaultsCfg(partial_work={"fraction": 1.0, "work": 0.25}), ids, 0).work(5, 3) == 0.25


def test_partial_work_is_a_fault_kind_of_the_registry_and_its_key_a_shorthand(tmp_path, capsys):
    """``faults.partial_work`` is the built-in kind ``partial_work``: listed with the kinds,
    and the same run whether a scenario names it by its key or in ``faults.kinds``."""
    from raymvc import kinds

    assert kinds.REGISTRY["partial_work"].shorthand == "partial_work"
    assert PartialWorkCfg is kinds.REGISTRY["partial_work"].Config  # the schema's key takes the kind's parameters
    ids = list(range(12))
    by_key = FaultPlan(FaultsCfg(partial_work=PARTIAL), ids, seed=5)
    by_kind = FaultPlan(FaultsCfg(kinds=[{"kind": "partial_work", **PARTIAL}]), ids, seed=5)
    assert [[by_key.work(r, c) for c in ids] for r in range(30)] == [[by_kind.work(r, c) for c in ids] for r in range(30)]
    assert by_key.kind_records(3) is None  # it adds nothing to a round's record beyond partial_work
    path = workecho_file(tmp_path)
    first = run_rounds(path, tmp_path / "key")
    listed = yaml.safe_load(path.read_text())
    listed["faults"] = {"kinds": [{"kind": "partial_work", **PARTIAL}]}
    other = tmp_path / "listed.yaml"
    other.write_text(yaml.safe_dump(listed))
    second = run_rounds(other, tmp_path / "kinds")
    assert [(r["partial_work"], r["info"]) for r in second] == [(r["partial_work"], r["info"]) for r in first]
    assert any(r["partial_work"] for r in first)
    assert main(["list"]) == 0
    kinds_part = capsys.readouterr().out.split("fault kinds")[1]
    assert "partial_work" in kinds_part and "fraction, work" in kinds_part


def test_bad_partial_work_is_a_scenario_error(tmp_path, capsys):
    path = workecho_file(tmp_path)
    for bad, words in [("faults.partial_work.work=0", "faults.partial_work.work"),
                       ("faults.partial_work.fraction=1.5", "faults.partial_work.fraction"),
                       ("faults.partial_work.share=0.1", "unknown key")]:
        assert main(["validate", str(path), "--set", bad]) == 2
        assert words in capsys.readouterr().err


def test_clients_see_the_recorded_share_and_runs_repeat(tmp_path):
    path = workecho_file(tmp_path)
    plan = FaultPlan(FaultsCfg(partial_work=PARTIAL), list(range(8)), seed=3)
    first = run_rounds(path, tmp_path / "a")
    assert len(first) == 6
    for rec in first:
        r = rec["round"]
        assert rec["partial_work"] == [c for c in range(8) if plan.work(r, c) < 1]
        assert rec["info"]["work"] == {str(c): plan.work(r, c) for c in rec["replied"]}
        assert rec["missing"] == []  # partial work is no fault
    assert any(rec["partial_work"] for rec in first)
    again = run_rounds(path, tmp_path / "b")
    assert [(x["partial_work"], x["info"]) for x in again] == [(x["partial_work"], x["info"]) for x in first]


def test_a_dropped_client_did_no_work_at_all(tmp_path):
    path = workecho_file(tmp_path, dropout={"rate": 0.5})
    recs = run_rounds(path, tmp_path / "d")
    assert any(set(r["dropped"]) for r in recs)
    for r in recs:
        assert not set(r["partial_work"]) & set(r["dropped"])


def test_partial_work_is_the_same_on_ray_and_in_process(ray_session, tmp_path):
    path = workecho_file(tmp_path)
    seen = {}
    for backend in ("local", "ray"):
        recs = run_rounds(path, tmp_path / backend, f"runtime.backend={backend}", "runtime.client_cpus=0.25",
                          "runtime.clients_per_actor=4")
        seen[backend] = [(r["partial_work"], r["info"]["work"]) for r in recs]
    assert seen["ray"] == seen["local"]


# --------------------------------------------------------------------------- the methods
def test_local_batches_cut_to_the_share_lazily():
    calls = []

    def one_pass():
        calls.append(1)
        return list(range(4))

    ctx = ClientContext(0, 1, 2, 0)
    assert list(ctx.local_batches(3, one_pass)) == [0, 1, 2, 3] * 3 and len(calls) == 3
    calls.clear()
    ctx.work = 0.5
    assert list(ctx.local_batches(3, one_pass)) == [0, 1, 2, 3, 0, 1] and len(calls) == 2
    ctx.work = 0.01
    assert list(ctx.local_batches(3, one_pass)) == [0]  # at least one step
    assert (work_steps(1.0, 10), work_steps(0.5, 10), work_steps(0.25, 10), work_steps(0.5, 0)) == (10, 5, 3, 0)


def count_steps(monkeypatch) -> list[int]:
    steps = []
    real = torch.optim.Adam.step
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, *a, **k: steps.append(1) or real(self, *a, **k))
    return steps


def test_feddmvc_trains_half_the_epochs_at_work_one_half(monkeypatch):
    import raymvc.protocols.feddmvc as fd

    sc = scenario_from_dict({
        "method": "feddmvc", "params": {**get("feddmvc").quick_params, "batch_size": 32},
        "data": {"dataset": "synthetic", "partition": "vertical",
                 "synthetic": {"n_samples": 128, "n_views": 2, "dims": 6, "n_clusters": 3}},
        "runtime": {"backend": "local"}})
    ds, part = prepare(sc)
    cfg = fd.Config(**sc.params)
    steps = count_steps(monkeypatch)
    for work in (1.0, 0.5):
        client = fd.FedDMVCClient(cfg, part.shards[0], ClientContext(0, 2, ds.n_clusters, 0, work=work))
        steps.clear()
        client._train(10, None, seed=1)
        assert len(steps) == (40 if work == 1 else 20)  # 10 epochs of 4 batches; half: 5 epochs


def test_ccfc_trains_half_its_steps_at_work_one_half(monkeypatch):
    import raymvc.protocols.ccfc as ccfc
    from raymvc.messages import Message
    from raymvc.protocol import ServerContext

    sc = scenario_from_dict({
        "method": "ccfc", "params": {**get("ccfc").quick_params, "batch_size": 16, "local_epochs": 2},
        "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 20},
        "runtime": {"backend": "local"}})
    ds, part = prepare(sc)
    cfg = ccfc.Config(**sc.params)
    server = ccfc.CCFCServer(cfg, ServerContext(list(range(20)), ds.n_clusters, 0))
    (msg, *_) = server.start().values()
    steps = count_steps(monkeypatch)
    counts = {}
    for work in (1.0, 0.5):
        client = ccfc.CCFCClient(cfg, part.shards[0], ClientContext(0, 20, ds.n_clusters, 0, work=work))
        steps.clear()
        assert isinstance(client.handle(Message(msg.kind, dict(msg.fields))), Message)
        counts[work] = len(steps)
    n_batches = -(-part.shards[0].n_local // 16)
    assert counts == {1.0: 2 * n_batches, 0.5: n_batches}


@pytest.mark.parametrize(("method", "honours"), [("cefmc", False), ("efimvc", False), ("kfed", False),
                                                 ("feddmvc", True), ("fcuif", True), ("ccfc", True)])
def test_params_say_whether_a_method_honours_partial_work(method, honours, capsys):
    assert ("partial_work" in get(method).supports) is honours
    assert main(["params", method]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("partial work")][0]
    assert ("honoured" if honours else "ignored") in line
