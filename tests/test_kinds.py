"""Fault kinds as an open set (raymvc.kinds): a built-in kind (churn), a kind of one's own
from a module beside the scenario (examples/own_fault: a battery), the same on Ray and in
process, checked like the rest of a scenario, and nothing moved for scenarios without one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from raymvc import kinds, streams
from raymvc.cli import main
from raymvc.driver import run_scenario
from raymvc.runtime.faults import FaultPlan
from raymvc.scenario import FaultsCfg, load_scenario
from raymvc.streams import stream

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "examples" / "own_fault" / "echo-battery.yaml"


def echo(tmp_path: Path, kind_list: list, *, rounds: int = 6, name: str = "echo", method: str = "raymvc.bench.fedavg_echo",
         **faults) -> Path:
    sc = {"name": name, "method": method, "params": {"rounds": rounds, "floats": 4} if "echo" in method else {},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 8},
          "faults": {"kinds": kind_list, "min_clients": 0, **faults}, "runtime": {"backend": "local"}, "seed": 3}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def rounds_of(path: Path, out: Path, *overrides: str) -> list[dict]:
    s = run_scenario(load_scenario(path, list(overrides)), out, progress=lambda line: None)
    assert s["status"] in ("completed", "degraded"), s.get("error")
    return [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]


@pytest.fixture
def own_modules(monkeypatch):
    """Each test's folder is the only scenario folder searched, and its modules load afresh."""
    from raymvc import protocols

    monkeypatch.setattr(protocols, "_SEARCH", [])
    monkeypatch.setattr(protocols, "_FROM_FOLDER", {})
    for name in ("battery", "badkind", "gremlin"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("battery", "badkind", "gremlin"):
        sys.modules.pop(name, None)


def test_churn_takes_a_client_away_for_good_from_its_drawn_round():
    ids = list(range(10))
    plan = FaultPlan(FaultsCfg(kinds=[{"kind": "churn", "rate": 0.2, "from_round": 2}]), ids, seed=5)
    churn = plan.kinds[0]
    for c in ids:  # a geometric draw of the kind's own stream, from round 2 on
        want = 2 + stream(5, streams.KIND, "churn", 0, c).geometric(0.2) - 1
        assert churn.leaves_at(c) == want
        assert [plan.dropped(r, c) for r in range(30)] == [r >= want for r in range(30)]
    assert churn.record(40, ids) == {"gone": sorted(c for c in ids if churn.leaves_at(c) <= 40)}


def test_without_kinds_the_plan_draws_and_the_scenario_reads_as_before(tmp_path):
    """No kind: the same dropouts and delays as a plan that knows none, and no ``kinds`` key
    in the resolved scenario (so no fingerprint moved)."""
    cfg = FaultsCfg(dropout={"rate": 0.3}, stragglers={"fraction": 0.5})
    a = FaultPlan(cfg, list(range(8)), seed=1)
    b = FaultPlan(FaultsCfg(dropout={"rate": 0.3}, stragglers={"fraction": 0.5}, kinds=[]), list(range(8)), seed=1)
    assert [k.name for k in a.kinds] == ["stragglers"]  # faults.stragglers is a built-in kind's own key
    assert [a.dropped(r, c) for r in range(5) for c in range(8)] == \
        [b.dropped(r, c) for r in range(5) for c in range(8)]
    assert [a.delay(r, c) for r in range(5) for c in range(8)] == [b.delay(r, c) for r in range(5) for c in range(8)]
    assert "kinds" not in load_scenario(ROOT / "scenarios" / "hw-cefmc.yaml").to_yaml()
    assert "kinds" in load_scenario(echo(tmp_path, [{"kind": "churn", "rate": 0.1}])).to_yaml()


def _old_straggler_delay(seed, ids, fraction, mean, r, client, sub):
    """The delay as the fault plan drew it before stragglers became a kind (the streams the
    records' labels were made with): the slow clients once from STRAGGLERS, then a lognormal
    of mean ``mean`` (sigma 0.5) per round, client and exchange from DELAY."""
    import math

    import numpy as np

    n_slow = int(round(fraction * len(ids)))
    slow = set(int(c) for c in stream(seed, streams.STRAGGLERS).choice(np.array(ids), n_slow, replace=False))
    if client not in slow:
        return 0.0
    rng = stream(seed, streams.DELAY, r, client, *((sub,) if sub else ()))
    return float(rng.lognormal(math.log(mean) - 0.5**2 / 2.0, 0.5))


def test_stragglers_are_a_fault_kind_drawing_every_exchange_as_before(tmp_path, capsys):
    """``faults.stragglers`` is the built-in kind ``stragglers``: the same delays as the plan
    drew before it was one (every exchange of a round, so secure aggregation's too), the same
    by its key and in ``faults.kinds``, nothing built while its share is 0, listed by ``raymvc list``."""
    ids = list(range(10))
    cfg = {"fraction": 0.4, "delay_s": {"mean": 3.0}}
    by_key = FaultPlan(FaultsCfg(stragglers=cfg, deadline_s=3.0), ids, seed=7, exchanges=3)
    by_kind = FaultPlan(FaultsCfg(kinds=[{"kind": "stragglers", **cfg}], deadline_s=3.0), ids, seed=7, exchanges=3)
    want = [_old_straggler_delay(7, ids, 0.4, 3.0, r, c, sub) for r in range(6) for c in ids for sub in range(3)]
    assert sum(d > 0 for d in want) == 4 * 6 * 3  # four slow clients, every round and exchange
    assert [by_key.delay(r, c, sub) for r in range(6) for c in ids for sub in range(3)] == want
    assert [by_kind.delay(r, c, sub) for r in range(6) for c in ids for sub in range(3)] == want
    assert FaultPlan(FaultsCfg(), ids, seed=7).kinds == []  # the default share 0 builds no kind
    assert by_key.kind_records(2) is None  # a late reply is the round's own record, not the kind's
    first = rounds_of(echo(tmp_path, [], name="key", stragglers=cfg, deadline_s=3.0), tmp_path / "key")
    second = rounds_of(echo(tmp_path, [{"kind": "stragglers", **cfg}], name="listed", deadline_s=3.0), tmp_path / "kinds")
    keep = ("replied", "late", "virtual_end_s")
    assert [{k: r[k] for k in keep} for r in first] == [{k: r[k] for k in keep} for r in second]
    assert any(r["late"] for r in first)
    assert main(["list"]) == 0
    kinds_part = capsys.readouterr().out.split("fault kinds")[1]
    assert "stragglers" in kinds_part and "fraction, delay_s" in kinds_part


def test_a_built_in_kind_given_by_its_key_and_in_the_list_is_refused_and_the_list_counts_as_its_key(tmp_path, capsys):
    """Both ways at once would act twice (stragglers: the same clients, twice the delay): one
    line naming both; the listed kind alone is what its key is, for the checks too (buffered
    rounds need clients that take different times)."""
    path = echo(tmp_path, [{"kind": "stragglers", "fraction": 0.4}], stragglers={"fraction": 0.4})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give faults.stragglers or faults.kinds: [{kind: stragglers, ...}], not both" in err
    ccfc = ROOT / "scenarios" / "digits-ccfc.yaml"
    for how in ("faults.stragglers.fraction=0.4", "faults.kinds=[{kind: stragglers, fraction: 0.4}]"):
        assert main(["validate", str(ccfc), "--set", how, "--set", "faults.asynchronous={buffer: 3}"]) == 0, how
    assert main(["validate", str(ccfc), "--set", "faults.asynchronous={buffer: 3}"]) == 2
    assert "needs clients that take different times" in capsys.readouterr().err


def test_a_churned_client_misses_its_rounds_and_the_round_record_says_who_is_gone(tmp_path):
    rounds = rounds_of(echo(tmp_path, [{"kind": "churn", "rate": 0.3}], rounds=6), tmp_path / "out")
    gone_before: set[int] = set()
    for r in rounds[:-1]:
        gone = set(r["kinds"]["churn"]["gone"])
        assert gone >= gone_before and gone <= set(r["dropped"]) and not gone & set(r["replied"])
        gone_before = gone
    assert gone_before  # at 0.3 a round, someone has gone within six rounds (seed 3)


def test_a_kind_of_ones_own_runs_the_same_on_ray_and_in_process(ray_session, tmp_path, monkeypatch, capsys,
                                                                own_modules):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    seen = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        assert main(["run", str(OWN), "--backend", backend, "--set", "runtime.clients_per_actor=6", "--set",
                     "runtime.client_cpus=0.25", "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
        rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
        seen[backend] = [(r["replied"], r["dropped"], r["late"], r.get("kinds")) for r in rounds]
    assert seen["ray"] == seen["local"]
    rested = [r for _, dropped, _, k in seen["local"] if k for r in k["battery"]["resting"]]
    late = [c for _, _, lt, _ in seen["local"] for c in lt]
    assert rested and late  # devices ran flat and rested; slow ones missed the deadline
    for replied, dropped, _, k in seen["local"]:
        if k:
            assert set(k["battery"]["resting"]) <= set(dropped) and not set(k["battery"]["resting"]) & set(replied)


def test_a_kind_is_checked_like_the_rest_of_a_scenario(tmp_path, capsys):
    cases = [([{"kind": "gremlins"}], "unknown fault kind 'gremlins'; built in: churn"),
             ([{"kind": "churn"}], "rate: field required"),
             ([{"kind": "churn", "rate": 2}], "rate: input should be less than or equal to 1"),
             ([{"kind": "churn", "rate": 0.1, "speed": 3}], "speed: extra inputs are not permitted"),
             ([{"rate": 0.1}], "faults.kinds.0.kind: required key is missing"),
             ([{"kind": "nowhere_here:Kind"}], "importing nowhere_here failed")]
    for kind_list, want in cases:
        assert main(["validate", str(echo(tmp_path, kind_list))]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "faults.kinds" in err and want in err.lower(), err


BAD_KIND = '''
from raymvc.kinds import FaultKind, ModelConfig


class Bad(FaultKind):
    class Config(ModelConfig):
        answer: str = "text"
        needs: list[str] = []

    requires = frozenset()

    def away(self, round, client):
        return {"text": "yes", "number": 1, "ok": False}[self.cfg.answer]

    def work(self, round, client):
        return 0.5
'''


@pytest.mark.parametrize("answer", ["text", "number"])
def test_a_kind_that_answers_no_truth_value_ends_the_run_naming_it(tmp_path, answer, own_modules):
    (tmp_path / "badkind.py").write_text(BAD_KIND)
    path = echo(tmp_path, [{"kind": "badkind:Bad", "answer": answer}])
    s = run_scenario(load_scenario(path), tmp_path / "out", progress=lambda line: None)
    assert s["status"] == "error"
    assert "fault kind 'badkind:Bad': away(0, 0) returned" in s["error"] and "not True or False" in s["error"]


def test_a_kinds_work_share_reaches_the_clients_and_the_round_record(tmp_path, own_modules):
    (tmp_path / "badkind.py").write_text(BAD_KIND)
    rounds = rounds_of(echo(tmp_path, [{"kind": "badkind:Bad", "answer": "ok"}], rounds=3), tmp_path / "out")
    assert all(r["partial_work"] == r["replied"] for r in rounds[:-1])


def test_a_kind_that_needs_what_the_method_lacks_is_refused_in_one_line(tmp_path, capsys, own_modules):
    (tmp_path / "badkind.py").write_text(BAD_KIND.replace("requires = frozenset()",
                                                          "requires = frozenset({'partial_work'})"))
    path = echo(tmp_path, [{"kind": "badkind:Bad", "answer": "ok"}])  # the echo declares no partial_work
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "faults.kinds.0" in err and "partial_work" in err and "Protocol.supports" in err


def test_a_kind_of_ones_own_is_part_of_the_fingerprint(tmp_path, own_modules):
    from raymvc.results.provenance import fingerprint

    (tmp_path / "badkind.py").write_text(BAD_KIND)
    path = echo(tmp_path, [{"kind": "badkind:Bad", "answer": "ok"}])
    before = fingerprint(load_scenario(path))
    (tmp_path / "badkind.py").write_text(BAD_KIND.replace("return 0.5", "return 0.25"))
    assert fingerprint(load_scenario(path)) != before


def test_raymvc_list_shows_every_kind(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in kinds.REGISTRY) and "\n  kinds " in out


def test_disconnect_drop_and_crash_are_kinds_that_decide_as_before():
    """The three keys switch on built-in kinds (offline, away and crashes hooks), with the
    draws they always made: the same clients disconnected, the scheduled round missed in its
    first exchange, a client listed twice crashing at its earliest round."""
    ids = list(range(10))
    cfg = FaultsCfg(disconnect={"rate": 0.3}, drop=[{"client": 2, "at_round": 1}],
                    crash=[{"client": 4, "at_round": 3}, {"client": 4, "at_round": 2}])
    plan = FaultPlan(cfg, ids, seed=7, exchanges=3)
    assert [k.name for k in plan.kinds] == ["disconnect", "drop", "crash"]
    assert plan.disconnected == {int(c) for c in stream(7, streams.DISCONNECT).choice(np.array(ids), 3, replace=False)}
    assert [plan.dropped(1, 2, sub) for sub in range(3)] == [True, False, False]
    assert not plan.dropped(2, 2) and not plan.dropped(1, 3)
    assert [plan.crashes_now(r) for r in range(5)] == [[], [], [4], [], []]
    assert FaultPlan(FaultsCfg(), ids, seed=7).kinds == []  # nothing switched on, nothing built


def test_a_scheduled_drop_given_by_its_key_or_listed_as_a_kind_runs_the_same_and_both_are_refused(tmp_path, capsys):
    at = [{"client": 1, "at_round": 1}, {"client": 5, "at_round": 2}]
    keyed = rounds_of(echo(tmp_path, [], rounds=4, name="keyed", drop=at), tmp_path / "a")
    listed = rounds_of(echo(tmp_path, [{"kind": "drop", "at": at}], rounds=4, name="listed"), tmp_path / "b")
    assert [(r["replied"], r["dropped"]) for r in keyed] == [(r["replied"], r["dropped"]) for r in listed]
    assert 1 in keyed[1]["dropped"] and 5 in keyed[2]["dropped"]
    assert main(["validate", str(echo(tmp_path, [{"kind": "drop", "at": at}], name="both", drop=at))]) == 2
    assert "give faults.drop or faults.kinds: [{kind: drop, ...}], not both" in capsys.readouterr().err
    for kind_list, faults, key in (([], {"crash": [{"client": 9, "at_round": 1}]}, "faults.crash"),
                                   ([{"kind": "crash", "at": [{"client": 9, "at_round": 1}]}], {}, "faults.kinds.0")):
        assert main(["validate", str(echo(tmp_path, kind_list, name="nine", **faults))]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{key}: client 9 does not exist (clients are 0..7)" in err, err


GREMLIN = '''
from raymvc.kinds import FaultKind, ModelConfig


class Gremlin(FaultKind):
    """Unplugs one client for the run and kills another's actor in one round."""

    class Config(ModelConfig):
        unplug: int = 1
        kill: int = 2
        at_round: int = 2

    def offline(self, client):
        return client == self.cfg.unplug

    def crashes(self, round, client):
        return client == self.cfg.kill and round == self.cfg.at_round
'''


def test_a_kind_of_ones_own_disconnects_and_crashes_clients_the_same_on_ray_and_in_process(ray_session, tmp_path,
                                                                                            own_modules):
    (tmp_path / "gremlin.py").write_text(GREMLIN)
    path = echo(tmp_path, [{"kind": "gremlin:Gremlin"}], rounds=4)
    seen = {}
    for backend in ("local", "ray"):
        sc = load_scenario(path, [f"runtime.backend={backend}", "runtime.clients_per_actor=8",
                                  "runtime.client_cpus=0.25"])
        s = run_scenario(sc, tmp_path / backend, progress=lambda line: None)
        assert s["status"] in ("completed", "degraded"), s.get("error")
        rounds = [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]
        seen[backend] = (s["faults"]["disconnected_clients"], s["faults"]["crashed_clients"],
                         [r["replied"] for r in rounds])
    assert seen["ray"] == seen["local"]
    disconnected, crashed, replied = seen["local"]
    assert disconnected == [1] and crashed == [2]
    assert all(1 not in r for r in replied) and 2 in replied[1] and all(2 not in r for r in replied[2:])


def test_a_sweep_counts_crashes_of_every_crash_kind_as_the_scenarios_own(tmp_path, own_modules):
    """A cell whose clients crashed by a listed crash kind or a kind of one's own is not taken
    for a run a leaving node spoiled (which a sweep on Ray would run again)."""
    from raymvc.study.cells import Cell
    from raymvc.study.execute import _hit_by

    (tmp_path / "gremlin.py").write_text(GREMLIN)
    summary = {"status": "degraded", "rounds": 4, "faults": {"crashed_clients": [2]},
               "data_info": {"client_sizes": [10] * 8}}
    for name, kind_list, faults in (("listed", [{"kind": "crash", "at": [{"client": 2, "at_round": 1}]}], {}),
                                    ("own", [{"kind": "gremlin:Gremlin"}], {}),
                                    ("keyed", [], {"crash": [{"client": 2, "at_round": 1}]})):
        cell = Cell(scenario=str(echo(tmp_path, kind_list, name=name, **faults)), name=name, method="m", point={},
                    seed=3, overrides={}, run_dir=tmp_path)
        assert not _hit_by(summary, set(), cell), name
    other = Cell(scenario=str(echo(tmp_path, [], name="none")), name="none", method="m", point={}, seed=3,
                 overrides={}, run_dir=tmp_path)
    assert _hit_by(summary, set(), other)  # nothing crashes client 2 on purpose there
