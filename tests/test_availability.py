"""Availability models (faults.availability): who takes part in each round, as recorded in
rounds.jsonl, follows the model's statistics; the Ray and in-process backends agree; a bad
model, value or trace file is a one-line scenario error; every shipped example runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import run_rounds, stopped_then_resumed, validate_fails_in_one_line

from raymvc.cli import main
from raymvc.driver import prepare, run_scenario
from raymvc.runtime.faults import FaultPlan
from raymvc.scenario import FaultsCfg, load_scenario
from raymvc.scenario.sidefiles import availability_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "examples" / "traces" / "small.csv"
EXAMPLES = {"iid": "digits-kfed-iid.yaml", "per_client": "digits-kfed-per-client.yaml",
            "markov": "digits-kfed-markov.yaml", "diurnal": "digits-kfed-diurnal.yaml",
            "data": "digits-kfed-data.yaml", "trace": "digits-kfed-trace.yaml"}


def echo_file(tmp_path, faults: dict, *, rounds: int, n_clients: int, name: str = "echo", **data) -> Path:
    """A FedAvg-echo scenario (every client asked every round) on digits, split horizontally."""
    sc = {"name": name, "method": "raymvc.bench.fedavg_echo", "params": {"rounds": rounds, "floats": 4},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": n_clients, **data},
          "faults": faults, "runtime": {"backend": "local"}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path




def offline(rounds: list[dict], n_clients: int) -> np.ndarray:
    """[round, client] True where the client was unavailable (dropped, so missing, no reply)."""
    off = np.zeros((len(rounds), n_clients), dtype=bool)
    for i, r in enumerate(rounds):
        assert r["round"] == i
        assert sorted(r["dropped"]) == r["missing"]  # unavailable = dropped, the only missing replies
        assert sorted(r["replied"] + r["missing"]) == list(range(n_clients))
        off[i, r["dropped"]] = True
    return off


def plan_for(path: Path, n_clients: int) -> FaultPlan:
    sc = load_scenario(path)
    return FaultPlan(sc.faults, list(range(n_clients)), sc.seed, trace=availability_trace(sc))


def plan_off(plan: FaultPlan, rounds: int, clients) -> np.ndarray:
    return np.array([[plan.dropped(r, c) for c in clients] for r in range(rounds)])


def bursts(column: np.ndarray, value: bool) -> list[int]:
    """Lengths of the runs of ``value`` that start and end inside the column (not cut by its ends)."""
    out, start = [], None
    for t, v in enumerate(column):
        if v == value and start is None:
            start = t
        elif v != value and start is not None:
            if start > 0:
                out.append(t - start)
            start = None
    return out


def test_iid_draws_exactly_what_dropout_rate_draws(tmp_path):
    n, rounds = 20, 300
    a = run_rounds(echo_file(tmp_path, {"availability": {"model": "iid", "rate": 0.3}}, rounds=rounds, n_clients=n,
                             name="iid"), tmp_path / "iid")
    b = run_rounds(echo_file(tmp_path, {"dropout": {"rate": 0.3}}, rounds=rounds, n_clients=n, name="dropout"),
                   tmp_path / "dropout")
    off = offline(a, n)
    assert np.array_equal(off, offline(b, n))
    assert abs(off.mean() - 0.3) < 0.03
    assert 0.2 < off.mean(axis=0).min() and off.mean(axis=0).max() < 0.4  # every client alike


def test_per_client_probabilities_follow_the_beta_and_rounds_follow_them(tmp_path):
    mean, conc = 0.3, 4.0
    cfg = FaultsCfg(availability={"model": "per_client", "mean": mean, "concentration": conc})
    p = np.array(list(FaultPlan(cfg, list(range(4000)), seed=0).p_client.values()))
    assert abs(p.mean() - mean) < 0.01
    assert abs(p.var() - mean * (1 - mean) / (conc + 1)) < 0.1 * mean * (1 - mean) / (conc + 1)
    assert np.array_equal(p[:20], list(FaultPlan(cfg, list(range(20)), seed=0).p_client.values()))  # per client

    n, rounds = 20, 400
    path = echo_file(tmp_path, {"availability": {"model": "per_client", "mean": mean, "concentration": conc}},
                     rounds=rounds, n_clients=n)
    off = offline(run_rounds(path, tmp_path / "out"), n)
    want = np.array([plan_for(path, n).p_client[c] for c in range(n)])
    assert want.std() > 0.1  # clients differ, unlike iid
    assert np.abs(off.mean(axis=0) - want).max() < 0.1
    assert abs(off.mean() - want.mean()) < 0.02
    assert np.corrcoef(off.mean(axis=0), want)[0, 1] > 0.95


def test_markov_bursts_have_the_mean_lengths_and_start_stationary(tmp_path):
    on, off_len = 5.0, 3.0
    cfg = FaultsCfg(availability={"model": "markov", "mean_on": on, "mean_off": off_len})
    plan = FaultPlan(cfg, list(range(1000)), seed=1)
    first = np.array([plan.dropped(0, c) for c in range(1000)])
    assert abs(first.mean() - off_len / (on + off_len)) < 0.05  # round 0 from the stationary distribution
    grid = plan_off(plan, 400, range(100))
    offs = [b for c in range(100) for b in bursts(grid[:, c], True)]
    ons = [b for c in range(100) for b in bursts(grid[:, c], False)]
    assert abs(np.mean(offs) - off_len) < 0.1 * off_len and abs(np.mean(ons) - on) < 0.1 * on
    # a client's states depend on no other client and on no order of asking
    alone = FaultPlan(cfg, [7], seed=1)
    assert [alone.dropped(r, 7) for r in (250, 3, 120)] == [grid[250, 7], grid[3, 7], grid[120, 7]]

    n, rounds = 20, 300
    path = echo_file(tmp_path, {"availability": {"model": "markov", "mean_on": on, "mean_off": off_len}},
                     rounds=rounds, n_clients=n)
    got = offline(run_rounds(path, tmp_path / "out"), n)
    assert np.array_equal(got, plan_off(plan_for(path, n), rounds, range(n)))
    recorded = [b for c in range(n) for b in bursts(got[:, c], True)]
    assert abs(np.mean(recorded) - off_len) < 0.25 * off_len
    assert max(recorded) > 3 * off_len  # bursts, not single rounds: an iid 0.375 gives almost none this long


def test_diurnal_availability_follows_the_day(tmp_path):
    period, base, amp = 10, 0.6, 0.3
    n, rounds = 30, 400
    path = echo_file(tmp_path, {"availability": {"model": "diurnal", "period": period, "base": base,
                                                 "amplitude": amp, "phase": 0}}, rounds=rounds, n_clients=n)
    avail = ~offline(run_rounds(path, tmp_path / "out"), n)
    by_hour = np.array([avail[h::period].mean() for h in range(period)])
    want = np.array([base + amp * math.sin(2 * math.pi * h / period) for h in range(period)])
    assert np.abs(by_hour - want).max() < 0.06
    assert by_hour.argmax() in (2, 3) and by_hour.argmin() in (7, 8)  # a quarter and three quarters of a day

    # each client's own phase: grouped by the client's local time, the same day appears
    cfg = FaultsCfg(availability={"model": "diurnal", "period": period, "base": base, "amplitude": amp})
    plan = FaultPlan(cfg, list(range(200)), seed=3)
    phases = np.array([plan.availability.phase[c] for c in range(200)])
    assert phases.min() >= 0 and phases.max() < 1 and phases.std() > 0.2
    grid = ~plan_off(plan, 200, range(200))
    local = (np.arange(200)[:, None] / period + phases[None, :]) % 1.0
    bins = np.floor(local * period).astype(int)
    by_local = np.array([grid[bins == h].mean() for h in range(period)])
    want_local = np.array([base + amp * math.sin(2 * math.pi * (h + 0.5) / period) for h in range(period)])
    assert np.abs(by_local - want_local).max() < 0.05
    assert np.abs(grid[::period].mean(axis=0) - grid[5::period].mean(axis=0)).mean() > 0.1  # phases differ


def test_data_model_makes_small_clients_less_available(tmp_path):
    rate, strength = 0.2, 1.0
    n, rounds = 20, 400
    path = echo_file(tmp_path, {"availability": {"model": "data", "by": "samples", "rate": rate,
                                                 "strength": strength}},
                     rounds=rounds, n_clients=n, dirichlet_alpha=1.0)
    off = offline(run_rounds(path, tmp_path / "out"), n)
    _, part = prepare(load_scenario(path))
    size = np.array([part.shards[c].rows_held for c in range(n)], dtype=float)
    want = np.minimum(1.0, rate * (size.mean() / size) ** strength)
    assert size.std() > 0.3 * size.mean()  # the split is skewed, so the model has something to act on
    assert np.abs(off.mean(axis=0) - want).max() < 0.1
    assert off[:, size.argmin()].mean() > off[:, size.argmax()].mean() + 0.2


def test_data_model_by_dimension_on_a_vertical_split(tmp_path):
    sc = load_scenario(ROOT / "scenarios" / "hw-cefmc.yaml", [
        "runtime.backend=local", "params.max_rounds=8",
        "faults.availability={model: data, by: dimension, rate: 0.2}"])
    _, part = prepare(sc)
    dims = np.array([part.shards[c].views[0].shape[1] for c in range(part.n_clients)], dtype=float)
    want = np.minimum(1.0, 0.2 * dims.mean() / dims)
    plan = FaultPlan(sc.faults, list(range(part.n_clients)), 0, client_dims=dict(enumerate(dims)))
    assert np.allclose([plan.p_client[c] for c in range(part.n_clients)], want)
    s = run_scenario(sc, tmp_path / "hw", progress=lambda line: None)
    rounds = [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]
    smallest = int(dims.argmin())  # 6 features against a mean over 100: never there
    assert want[smallest] == 1.0 and all(smallest in r["dropped"] for r in rounds)
    assert s["faults"]["dropped_replies"] < 3 * len(rounds)


def test_trace_intervals_are_followed_exactly(tmp_path):
    n = 7  # client 6 has no rows in the trace: never there
    rows = [line.split(",") for line in TRACE.read_text().splitlines()[1:] if line.strip()]
    intervals = [(int(c), float(s), float(e)) for c, s, e in rows]
    assert {c for c, _, _ in intervals} == set(range(6))
    for round_s, rounds in ((1.0, 20), (0.5, 40)):
        path = echo_file(tmp_path, {"availability": {"model": "trace", "path": str(TRACE), "round_s": round_s}},
                         rounds=rounds, n_clients=n, name=f"trace{rounds}")
        got = offline(run_rounds(path, tmp_path / f"out{rounds}"), n)
        want = np.ones((rounds, n), dtype=bool)
        for c, s, e in intervals:
            for r in range(rounds):
                if s <= r * round_s < e:
                    want[r, c] = False
        assert np.array_equal(got, want)
        assert got[:, 6].all() and not got[:, 3].any()


def test_a_trace_path_is_relative_to_the_scenario_file(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text("client,start_s,end_s\n0,0,2\n1,1,3\n")
    path = echo_file(tmp_path, {"availability": {"model": "trace", "path": "traces/t.csv"}}, rounds=3, n_clients=2)
    got = offline(run_rounds(path, tmp_path / "out"), 2)
    assert got.tolist() == [[False, True], [False, False], [True, False]]
    copied = yaml.safe_load((tmp_path / "out" / "scenario.yaml").read_text())  # the run folder's copy
    assert Path(copied["faults"]["availability"]["path"]) == (tmp_path / "traces" / "t.csv").resolve()


RAY_MODELS = {
    "iid": ({"model": "iid", "rate": 0.3}, {}),
    "per_client": ({"model": "per_client", "mean": 0.3, "concentration": 2.0}, {}),
    "markov": ({"model": "markov", "mean_on": 4, "mean_off": 2}, {}),
    "diurnal": ({"model": "diurnal", "period": 8, "base": 0.7, "amplitude": 0.25}, {}),
    "data": ({"model": "data", "by": "samples", "rate": 0.3, "strength": 1.0}, {"dirichlet_alpha": 1.0}),
    "trace": ({"model": "trace", "path": str(TRACE), "round_s": 1.0}, {}),
}


@pytest.mark.parametrize("model", sorted(RAY_MODELS))
def test_participation_is_the_same_on_ray_and_in_process(ray_session, tmp_path, model):
    n, rounds = 8, 16
    availability, data = RAY_MODELS[model]
    path = echo_file(tmp_path, {"availability": availability}, rounds=rounds, n_clients=n, **data)
    seen = {}
    for backend in ("local", "ray"):
        recs = run_rounds(path, tmp_path / backend, f"runtime.backend={backend}", "runtime.client_cpus=0.25",
                          "runtime.clients_per_actor=4")
        seen[backend] = [(r["replied"], r["missing"], sorted(r["dropped"])) for r in recs]
    assert seen["ray"] == seen["local"]
    assert len(seen["local"]) == rounds and any(m for _, m, _ in seen["local"])
    assert any(r for r, _, _ in seen["local"])


def _bad(tmp_path, availability, **extra) -> Path:
    faults = {"availability": availability} if availability is not None else {}
    return echo_file(tmp_path, {**faults, **extra}, rounds=3, n_clients=6)


def test_numerically_extreme_models_keep_their_meaning(tmp_path):
    """At the largest declared values: Markov stretches of 1e9 rounds are on half the time
    (the stationary share does not underflow); a data model of strength 100 and a day of a
    thousandth of a round draw probabilities in [0, 1] without raising."""
    n = 400
    markov = FaultsCfg.model_validate({"availability": {"model": "markov", "mean_on": 1e9, "mean_off": 1e9}})
    on = [not FaultPlan(markov, list(range(n)), 0).dropped(0, c) for c in range(n)]
    assert 0.4 < np.mean(on) < 0.6
    day = FaultsCfg.model_validate({"availability": {"model": "diurnal", "period": 1e-3}})
    assert all(0.0 <= FaultPlan(day, [0], 0).unavailable(r, 0) <= 1.0 for r in (0, 7, 10**9))
    data = FaultsCfg.model_validate({"availability": {"model": "data", "rate": 0.2, "strength": 100.0}})
    plan = FaultPlan(data, [0, 1], 0, client_sizes={0: 1, 1: 1000})
    assert plan.unavailable(0, 0) == 1.0 and 0.0 <= plan.unavailable(0, 1) < 1e-20


BROKEN = {
    "unknown-model": (lambda t: _bad(t, {"model": "weekly"}),
                      "faults.availability.model: unknown value 'weekly' (valid: iid, per_client, markov"),
    "no-model": (lambda t: _bad(t, {"rate": 0.1}), "faults.availability.model: required key is missing"),
    "rate-1.5": (lambda t: _bad(t, {"model": "iid", "rate": 1.5}),
                 "faults.availability.rate: input should be less than or equal to 1, got 1.5"),
    "unknown-key": (lambda t: _bad(t, {"model": "markov", "mean_on": 3, "mean_off": 2, "mean_of": 1}),
                    "faults.availability.mean_of: unknown key; did you mean 'mean_off'?"),
    "mean-of-beta": (lambda t: _bad(t, {"model": "per_client", "mean": 1.0}), "faults.availability.mean: "),
    "both": (lambda t: _bad(t, {"model": "iid", "rate": 0.2}, dropout={"rate": 0.1}),
             "faults: give faults.dropout.rate or faults.availability, not both"),
    "missing-trace": (lambda t: _bad(t, {"model": "trace", "path": "nope.csv"}),
                      "faults.availability.path: file not found: "),
    "bad-header": (lambda t: _bad(t, {"model": "trace", "path": _csv(t, "id,from,to\n0,0,1\n")}),
                   "t.csv line 1: the header must be client,start_s,end_s"),
    "bad-number": (lambda t: _bad(t, {"model": "trace", "path": _csv(t, "client,start_s,end_s\n0,0,1\n1,x,2\n")}),
                   "t.csv line 3: start_s and end_s must be numbers, got 'x', '2'"),
    "short-row": (lambda t: _bad(t, {"model": "trace", "path": _csv(t, "client,start_s,end_s\n0,0,1\n\n2,5\n")}),
                  "t.csv line 4: expected 3 values (client,start_s,end_s), got 2"),
    "backwards": (lambda t: _bad(t, {"model": "trace", "path": _csv(t, "client,start_s,end_s\n0,4,1\n")}),
                  "t.csv line 2: need client >= 0 and finite start_s < end_s, got '0,4,1'"),
    "no-such-client": (lambda t: _bad(t, {"model": "trace", "path": _csv(t, "client,start_s,end_s\n9,0,1\n")}),
                       "faults.availability.path: the trace names client 9, which does not exist (clients are 0..5)"),
    # values the run could not compute with are refused where they are declared
    "tiny-period": (lambda t: _bad(t, {"model": "diurnal", "period": 1e-308}), "faults.availability.period: "),
    "huge-strength": (lambda t: _bad(t, {"model": "data", "rate": 0.2, "strength": 1e6}),
                      "faults.availability.strength: "),
    "huge-markov": (lambda t: _bad(t, {"model": "markov", "mean_on": 1e308, "mean_off": 1e308}),
                    "faults.availability.mean_on: "),
    "straggler-sigma": (lambda t: _bad(t, None, stragglers={"fraction": 0.5, "delay_s": {"sigma": 1e200}}),
                        "faults.stragglers.delay_s.sigma: "),
}


def _csv(tmp_path, text) -> str:
    (tmp_path / "t.csv").write_text(text)
    return "t.csv"


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_bad_availability_is_one_line_naming_file_and_key(tmp_path, capsys, case):
    make, expected = BROKEN[case]
    validate_fails_in_one_line(make(tmp_path), capsys, expected)


@pytest.mark.parametrize("model", sorted(EXAMPLES))
def test_every_shipped_availability_example_runs_in_process(tmp_path, capsys, model):
    path = ROOT / "scenarios" / EXAMPLES[model]
    assert load_scenario(path).faults.availability.model == model
    out = tmp_path / "run"
    assert main(["run", str(path), "--backend", "local", "--out", str(out), "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["status"] in ("completed", "degraded") and s["metrics"]["acc"] > 0.3
    assert s["faults"]["dropped_replies"] > 0  # the model took clients away


def test_stale_replies_stand_in_for_missing_clients_with_their_age(tmp_path, capsys):
    """faults.stale_replies: a client that misses a round has its last reply averaged in while
    it is at most max_age rounds old; the round record names them with their ages, and
    `replied` keeps only the round's own answers. A method that does not use old replies
    refuses the setting in one line."""
    n, rounds = 8, 30
    path = echo_file(tmp_path, {"availability": {"model": "iid", "rate": 0.4}, "stale_replies": {"max_age": 2}},
                     rounds=rounds, n_clients=n)
    recs = run_rounds(path, tmp_path / "stale")
    last: dict[int, int] = {}
    used = 0
    for rec in recs:
        r = rec["round"]
        want = {c: r - last[c] for c in sorted(last) if c not in rec["replied"] and 0 < r - last[c] <= 2}
        assert {int(c): a for c, a in (rec["stale"] or {}).items()} == want, r
        assert rec["info"]["aggregated"] == sorted(set(rec["replied"]) | set(want)), r
        used += len(want)
        for c in rec["replied"]:
            last[c] = r
    assert used > 10  # the old replies did stand in, many times
    plain = run_rounds(echo_file(tmp_path, {"availability": {"model": "iid", "rate": 0.4}}, rounds=rounds,
                                 n_clients=n, name="plain"), tmp_path / "plain-run")
    assert all(rec["stale"] is None for rec in plain)
    bad = tmp_path / "kfed.yaml"
    bad.write_text("name: k\nmethod: kfed\ndata: {dataset: digits, partition: horizontal, n_clients: 3}\n"
                   "faults: {stale_replies: {max_age: 1}}\nruntime: {backend: local}\n")
    validate_fails_in_one_line(bad, capsys, "faults.stale_replies: method kfed does not use old replies")


def test_stale_replies_survive_a_resume(tmp_path):
    """The last replies are part of the server's checkpoint: a run stopped after round 5 and
    resumed stands in the same old replies as the uninterrupted run."""
    faults = {"availability": {"model": "iid", "rate": 0.4}, "stale_replies": {"max_age": 3}}
    path = echo_file(tmp_path, faults, rounds=12, n_clients=6)
    full = run_rounds(path, tmp_path / "full")
    resumed = stopped_then_resumed(path, tmp_path / "stopped", after_round=5)
    assert [(r["stale"], r["info"]["aggregated"]) for r in resumed] == [(r["stale"], r["info"]["aggregated"])
                                                                          for r in full]
    assert any(r["stale"] for r in full[6:])


# --------------------------------------------------------------------- a model of one's own
WEEKEND = ROOT / "examples" / "own_availability" / "echo-weekend.yaml"


def test_a_model_of_ones_own_runs_the_same_on_ray_and_in_process(ray_session, tmp_path, monkeypatch, capsys):
    """``model: weekend:Weekend`` from a module beside the scenario file (not on sys.path):
    the same clients are away in the same rounds on both backends, as the model says."""
    import sys

    from raymvc import protocols

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(protocols, "_SEARCH", [])
    monkeypatch.delitem(sys.modules, "weekend", raising=False)
    seen = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        assert main(["run", str(WEEKEND), "--backend", backend, "--set", "runtime.clients_per_actor=5", "--set",
                     "runtime.client_cpus=0.25", "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
        rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
        seen[backend] = [(r["replied"], r["missing"]) for r in rounds]
    assert seen["ray"] == seen["local"]
    away = {r for r, (_, missing) in enumerate(seen["local"]) if missing}
    assert away == {5, 6, 12, 13} and all(seen["local"][r][1] == [0, 1, 2, 3] for r in away)


def test_a_model_of_ones_own_is_checked_like_a_built_in_one(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    text = WEEKEND.read_text().replace("away: 0.4", "away: 1.5")
    (tmp_path / "weekend.py").write_text((WEEKEND.parent / "weekend.py").read_text())
    sc.write_text(text)
    assert main(["validate", str(sc)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "faults.availability" in err and "away: input should be less than or equal to 1" \
        in err.lower()
    sc.write_text(WEEKEND.read_text().replace("weekend:Weekend", "nowhere_at_all:Weekend"))
    assert main(["validate", str(sc)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "importing nowhere_at_all failed" in err
