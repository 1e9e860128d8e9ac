"""Client selection as an open set (raymvc.selection): the uniform draw of before, a
deadline-aware rule after FedCS, power-of-choice, and a rule of one's own from a module
beside the scenario, the same on Ray and in process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from raymvc import selection, streams
from raymvc.cli import main
from raymvc.driver import run_scenario
from raymvc.runtime.faults import FaultPlan
from raymvc.scenario import FaultsCfg, load_scenario
from raymvc.streams import stream

ROOT = Path(__file__).resolve().parents[1]
OWN = ROOT / "examples" / "own_selection" / "echo-least-recent.yaml"


def echo(tmp_path: Path, sampling: dict, *, n_clients: int = 12, rounds: int = 6, name: str = "echo", **extra) -> Path:
    sc = {"name": name, "method": "raymvc.bench.fedavg_echo", "params": {"rounds": rounds, "floats": 4},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": n_clients},
          "faults": {"sampling": sampling, "min_clients": 0, **extra.pop("faults", {})},
          "runtime": {"backend": "local"}, "seed": 3, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def rounds_of(path: Path, out: Path, *overrides: str) -> list[dict]:
    s = run_scenario(load_scenario(path, list(overrides)), out, progress=lambda line: None)
    return [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]


def asked(r: dict, n: int) -> set[int]:
    return set(range(n)) - set(r["not_sampled"])


def test_uniform_is_the_draw_sampling_always_made():
    """The default rule keeps every earlier result: round(F x n) of all clients from the
    stream (seed, SAMPLING, round)."""
    ids = list(range(10))
    plan = FaultPlan(FaultsCfg(sampling={"fraction": 0.3}), ids, seed=5)
    for r in range(20):
        old = {int(c) for c in stream(5, streams.SAMPLING, r).choice(ids, 3, replace=False)}
        assert plan.sampled(r) == old
    assert FaultsCfg(sampling={"fraction": 0.3}).sampling.rule == "uniform"


def test_the_deadline_rule_asks_the_quickest_devices_that_fit(tmp_path):
    """After FedCS: a client whose last answer took longer than the deadline is not asked
    again while quicker ones fit; before any answer, the devices' reported speeds decide."""
    path = echo(tmp_path, {"fraction": 0.5, "rule": "deadline"}, rounds=5,
                devices={"base_compute_s": 1.0, "speed": {"mean": 1.0, "sigma": 1.0}},
                faults={"deadline_s": 1.5})
    from raymvc.runtime.faults import DeviceProfiles

    sc = load_scenario(path)
    rounds = rounds_of(path, tmp_path / "d")
    profiles = DeviceProfiles(sc.devices, list(range(12)), 3, sc.network)  # not by samples: sizes play no part
    compute = {c: profiles.compute_s(c) for c in range(12)}
    quick = sorted(range(12), key=lambda c: compute[c])
    fits = [c for c in quick if compute[c] <= 1.5]
    assert 0 < len(fits) < 12
    assert asked(rounds[0], 12) == set(fits[:6])  # round 0: reported speeds
    for r in rounds:  # no client asked is one the server knew to be too slow
        assert all(compute[c] <= 1.5 or not fits for c in asked(r, 12))
    # uniform asks slow devices too, and more of them come late
    uni = rounds_of(echo(tmp_path, {"fraction": 0.5}, rounds=5, name="u",
                         devices={"base_compute_s": 1.0, "speed": {"mean": 1.0, "sigma": 1.0}},
                         faults={"deadline_s": 1.5}), tmp_path / "u")
    assert sum(len(r["late"]) for r in uni) > sum(len(r["late"]) for r in rounds)


def test_power_of_choice_asks_the_largest_of_its_draw():
    sizes = {c: 10 + 10 * c for c in range(10)}
    rule = selection.build("power_of_choice", {"choices": 2.0})
    view = selection.View(seed=1, round=4, candidates=tuple(range(10)), k=3, clients=tuple(range(10)), rows=sizes)
    drawn = [int(c) for c in view.rng().choice(list(range(10)), 6, replace=False)]
    got = selection.checked(rule, view)
    assert got == sorted(sorted(drawn, key=lambda c: -sizes[c])[:3])
    seen = {c: selection.Seen(asked=4, answered=4 - c % 4) for c in range(10)}
    rel = selection.checked(selection.build("power_of_choice", {"by": "reliability", "choices": 10}),
                            selection.View(seed=1, round=4, candidates=tuple(range(10)), k=3, clients=tuple(range(10)),
                                           seen=seen))
    assert all(seen[c].answered == 4 for c in rel)


def test_a_rule_of_ones_own_runs_the_same_on_ray_and_in_process(ray_session, tmp_path, monkeypatch, capsys):
    import sys

    from raymvc import protocols

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(protocols, "_SEARCH", [])
    monkeypatch.delitem(sys.modules, "least_recent", raising=False)
    seen = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        assert main(["run", str(OWN), "--backend", backend, "--set", "runtime.clients_per_actor=6", "--set",
                     "runtime.client_cpus=0.25", "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
        rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
        seen[backend] = [(sorted(asked(r, 12)), r["replied"]) for r in rounds]
    assert seen["ray"] == seen["local"]
    # least recently answered first: round 0 asks 0-3, round 1 the next four (never answered)
    assert seen["local"][0][0] == [0, 1, 2, 3] and seen["local"][1][0] == [4, 5, 6, 7]
    assert seen["local"][2][0][:1] != [0] or 0 not in seen["local"][0][1]


def test_a_rule_is_checked_like_the_rest_of_a_scenario(tmp_path, capsys):
    cases = [({"fraction": 0.5, "rule": "fastest"}, "unknown selection rule 'fastest'; built in: uniform, deadline, "
                                                   "power_of_choice"),
             ({"fraction": 0.5, "rule": "power_of_choice", "choices": 0.5}, "choices: input should be greater than or "
                                                                            "equal to 1"),
             ({"fraction": 0.5, "rule": "uniform", "k": 3}, "k: extra inputs are not permitted"),
             ({"fraction": 0.5, "rule": "nowhere_here:Rule"}, "importing nowhere_here failed")]
    for sampling, want in cases:
        assert main(["validate", str(echo(tmp_path, sampling))]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "faults.sampling" in err and want in err.lower().replace("'", "'"), err


BAD_RULE = '''
from raymvc.selection import ModelConfig, SelectionRule


class Bad(SelectionRule):
    name = "badrule:Bad"

    class Config(ModelConfig):
        answer: str = "none"

    def select(self, view):
        return {"none": [], "outside": [99], "twice": [0, 0], "text": "0"}[self.cfg.answer]
'''


@pytest.fixture
def own_modules(monkeypatch):
    """Each test's folder is the only scenario folder searched, and its module loads afresh."""
    import sys

    from raymvc import protocols

    monkeypatch.setattr(protocols, "_SEARCH", [])
    monkeypatch.setattr(protocols, "_FROM_FOLDER", {})
    monkeypatch.delitem(sys.modules, "badrule", raising=False)
    yield
    sys.modules.pop("badrule", None)


@pytest.mark.parametrize("answer", ["none", "outside", "twice", "text"])
def test_a_rule_that_answers_no_set_of_candidates_ends_the_run_naming_it(tmp_path, answer, own_modules):
    (tmp_path / "badrule.py").write_text(BAD_RULE)
    path = echo(tmp_path, {"fraction": 0.5, "rule": "badrule:Bad", "answer": answer})
    s = run_scenario(load_scenario(path), tmp_path / "out", progress=lambda line: None)
    assert s["status"] == "error"
    assert "selection rule 'badrule:Bad': select(round=0) returned" in s["error"]
    assert "it must return 1 to 6 distinct clients of the run" in s["error"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "error"


def test_a_rule_of_ones_own_is_part_of_the_fingerprint(tmp_path, own_modules):
    from raymvc.results.provenance import fingerprint

    (tmp_path / "badrule.py").write_text(BAD_RULE)
    path = echo(tmp_path, {"fraction": 0.5, "rule": "badrule:Bad"})
    before = fingerprint(load_scenario(path))
    (tmp_path / "badrule.py").write_text(BAD_RULE.replace('"none": []', '"none": [1]'))
    assert fingerprint(load_scenario(path)) != before
    assert np.isfinite(len(before))


def test_raymvc_list_shows_every_fault_key_and_every_rule(capsys):
    """The list was kept by hand and had lost stale_replies and asynchronous; it is read
    from the schema and the registries now."""
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {key} " in out for key in [*FaultsCfg.model_fields, *selection.REGISTRY])
    assert "\n  stale_replies " in out and "\n  asynchronous " in out
