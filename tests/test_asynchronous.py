"""Asynchronous buffered rounds (faults.asynchronous) on the virtual clock: the server steps on
the first ``buffer`` updates to arrive, as an independent event simulation says; busy clients
are not sent anything; too old updates are dropped; a final model pre-empts the work in
flight; the updates in flight survive a checkpoint; Ray and in-process agree; CCFC's step is
FedBuff's staleness-weighted one; bad combinations are one-line errors."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import yaml
from helpers import run_rounds, stopped_then_resumed, validate_fails_in_one_line

from raymvc.cli import main
from raymvc.messages import Message
from raymvc.protocol import Replies, ServerContext
from raymvc.protocols import ccfc

PROFILE = {"fast": {"speed": 2.0, "up_mbps": 100.0, "down_mbps": 100.0, "latency_ms": 1.0},
           "mid": {"speed": 0.9, "up_mbps": 100.0, "down_mbps": 100.0, "latency_ms": 3.0},
           "slow": {"speed": 0.3, "up_mbps": 100.0, "down_mbps": 100.0, "latency_ms": 7.0}}


def echo_async(tmp_path, *, buffer=2, max_staleness=10, rounds=12, n_clients=5, name="echo", **faults):
    sc = {"name": name, "method": "raymvc.bench.fedavg_echo", "params": {"rounds": rounds, "floats": 4},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": n_clients},
          "devices": {"base_compute_s": 1.0, "speed": {"dist": "lognormal", "mean": 1.0, "sigma": 1.0},
                      "latency_ms": 5.0},  # a speed of its own for every client
          "faults": {"asynchronous": {"buffer": buffer, "max_staleness": max_staleness}, **faults},
          "runtime": {"backend": "local"}, "seed": 5}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def simulate(duration: dict[int, float], buffer: int, rounds: int, max_staleness: int) -> list[dict]:
    """FedBuff on a virtual clock, written apart from the engine: every free client is sent the
    model when a step ends; its update arrives ``duration`` later; a step takes the first
    ``buffer`` arrivals (older than ``max_staleness`` steps: dropped)."""
    t, flying, out = 0.0, {}, []
    free = sorted(duration)
    for r in range(rounds):
        for c in free:
            flying[c] = (t + duration[c], r)
        taken, dropped = {}, []
        for c, (arrive, sent) in sorted(flying.items(), key=lambda kv: (kv[1][0], kv[0])):
            if len(taken) == buffer:
                break
            t = max(t, arrive)
            del flying[c]
            (dropped.append(c) if r - sent > max_staleness else taken.__setitem__(c, r - sent))
        out.append({"replied": sorted(taken), "ages": taken, "sent": free, "end": t, "dropped": sorted(dropped)})
        free = sorted([*taken, *dropped])
    return out


def _ages(rec):
    return {c: 0 for c in rec["replied"]} | {int(c): a for c, a in (rec["stale"] or {}).items()}


@pytest.mark.parametrize("buffer,max_staleness", [(2, 10), (3, 1)])
def test_buffered_steps_follow_an_event_simulation(tmp_path, buffer, max_staleness):
    recs = run_rounds(echo_async(tmp_path, buffer=buffer, max_staleness=max_staleness), tmp_path / "run")
    duration = {int(c): s for c, s in recs[0]["client_s"].items()}  # every client was sent round 0's model
    assert len(set(round(d, 6) for d in duration.values())) == 5  # no ties: the order is the clock's
    want = simulate(duration, buffer, len(recs), max_staleness)
    busy: list[int] = []
    for rec, w in zip(recs, want):
        assert rec["replied"] == w["replied"], rec["round"]
        assert _ages(rec) == w["ages"], rec["round"]
        assert rec["buffered"]["sent"] == w["sent"] and rec["buffered"]["discarded"] == w["dropped"], rec["round"]
        assert set(rec["buffered"]["sent"]).isdisjoint(busy)  # nothing goes to a client still training
        busy = rec["buffered"]["in_flight"]
        assert math.isclose(rec["virtual_end_s"], w["end"], rel_tol=1e-9), rec["round"]
        assert rec["info"]["aggregated"] == w["replied"]
    assert any(a > 0 for w in want for a in w["ages"].values())  # slow clients' updates came in old
    if max_staleness == 1:
        assert any(w["dropped"] for w in want)  # and some were too old


def test_asynchronous_rounds_are_faster_on_the_clock_than_synchronous_ones(tmp_path):
    path = echo_async(tmp_path)
    buffered = run_rounds(path, tmp_path / "async")
    rounds = run_rounds(path, tmp_path / "sync", "faults.asynchronous=null")
    assert all(r.get("buffered") is None and r["stale"] is None for r in rounds)
    assert buffered[-1]["virtual_end_s"] < 0.5 * rounds[-1]["virtual_end_s"]  # no step waits for the slowest


def test_a_final_model_pre_empts_the_work_in_flight(tmp_path, capsys):
    """CCFC's final message is not an asynchronous kind: it goes to every client at once, the
    updates in flight are dropped, and every client labels its rows."""
    (tmp_path / "devices.yaml").write_text(yaml.safe_dump(PROFILE))
    sc = {"name": "ccfc-async", "method": "ccfc", "params": dict(ccfc.PROTOCOL.quick_params, warmup_rounds=2),
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 5},
          "devices": {"base_compute_s": 1.0, "profile": "devices.yaml", "classes": {"fast": 0.4, "mid": 0.2, "slow": 0.4}},
          "faults": {"asynchronous": {"buffer": 2}}, "runtime": {"backend": "local"}, "seed": 1}
    path = tmp_path / "ccfc.yaml"
    path.write_text(yaml.safe_dump(sc))
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    recs = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    last, before = recs[-1], recs[-2]
    assert last["buffered"]["sent"] == list(range(5)) and last["buffered"]["discarded"] == before["buffered"]["in_flight"]
    assert before["buffered"]["in_flight"]  # there was work to pre-empt
    with open(out / "messages.csv") as f:  # the pre-empted updates would have arrived after the final model left
        arrive = {int(row["src"].split(":")[1]): float(row["arrive_t"]) for row in csv.DictReader(f)
                  if row["kind"] == "update" and row["src"].startswith("client:")}
    assert max(arrive[c] for c in before["buffered"]["in_flight"]) > last["virtual_start_s"]
    assert s["status"] == "completed" and s["unlabelled_samples"] == 0


def test_the_updates_in_flight_survive_a_resume(tmp_path):
    path = echo_async(tmp_path, rounds=10)
    full = run_rounds(path, tmp_path / "full")
    assert full[4]["buffered"]["in_flight"]  # stopped below with updates on their way
    resumed = stopped_then_resumed(path, tmp_path / "stopped", after_round=4)
    keys = ("replied", "stale", "buffered", "virtual_end_s")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in full]


def test_ray_and_in_process_take_the_same_buffers(ray_session, tmp_path):
    path = echo_async(tmp_path, rounds=6, n_clients=4)
    keys = ("replied", "stale", "buffered", "virtual_end_s")
    local = run_rounds(path, tmp_path / "local")
    on_ray = run_rounds(path, tmp_path / "ray", "runtime.backend=ray", "runtime.client_cpus=0.25")
    assert [[r[k] for k in keys] for r in on_ray] == [[r[k] for k in keys] for r in local]


@pytest.mark.parametrize("extra,expected", [
    ({"channel": {"secure_aggregation": True}}, "cannot be combined with channel.secure_aggregation"),
    ({"faults": {"stale_replies": {"max_age": 1}}}, "cannot be combined with faults.stale_replies"),
    ({"faults": {"sampling": {"fraction": 0.5}}}, "cannot be combined with faults.sampling"),
    ({"faults": {"asynchronous": {"buffer": 9}}}, "buffer 9 is more than the 5 clients"),
    ({"faults": {"min_clients": 3}}, "3 is more than the 2 updates"),
    ({"method": "kfed", "params": {}}, "method kfed steps on whole rounds only"),
])
def test_bad_combinations_are_one_line_errors(tmp_path, capsys, extra, expected):
    sc = yaml.safe_load(echo_async(tmp_path).read_text())
    for key, value in extra.items():
        sc[key] = {**sc.get(key, {}), **value} if isinstance(value, dict) and key in ("faults", "channel") else value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(sc))
    key = "faults.min_clients: " if "updates" in expected else "faults.asynchronous: "
    validate_fails_in_one_line(path, capsys, key + expected)


def _ccfc_server(max_staleness):
    cfg = ccfc.Config(**ccfc.PROTOCOL.quick_params)
    return ccfc.CCFCServer(cfg, ServerContext(client_ids=[0, 1, 2], n_clusters=3, seed=0,
                                              client_sizes={0: 10, 1: 30, 2: 20}, max_staleness=max_staleness))


def _update(server, shift, n):
    return Message("update", {**{k: (np.asarray(v) + shift).astype(np.asarray(v).dtype) for k, v in server.weights.items()},
                              "n": n, "loss": 0.0})


def test_ccfc_buffered_step_is_fedbuff():
    """Fresh updates: FedAvg of the buffer. An update trained on the model of tau steps ago adds
    its change to that model, weighted 1/sqrt(1 + tau) (``staleness: constant``: 1)."""
    srv = _ccfc_server(3)
    srv._train_messages(0)
    w0 = {k: np.asarray(v, dtype=np.float64) for k, v in srv.weights.items()}
    fresh = Replies({0: _update(srv, 1.0, 10), 1: _update(srv, 2.0, 30)}, ages={0: 0, 1: 0})
    assert srv.aggregate(fresh, 0) == [0, 1]
    k = next(k for k, v in srv.weights.items() if np.asarray(v).dtype.kind == "f")
    np.testing.assert_allclose(srv.weights[k], w0[k] + (10 * 1.0 + 30 * 2.0) / 40, rtol=0, atol=1e-5)
    srv._train_messages(1)
    w1 = {k: np.asarray(v, dtype=np.float64) for k, v in srv.weights.items()}
    old = Message("update", {**{k: (w0[k] + 4.0).astype(np.asarray(v).dtype) for k, v in srv.weights.items()},
                             "n": 20, "loss": 0.0})  # trained on step 0's model
    srv.aggregate(Replies({2: old}, ages={2: 1}), 1)
    np.testing.assert_allclose(srv.weights[k], w1[k] + 4.0 / math.sqrt(2.0), rtol=0, atol=1e-5)
    flat = _ccfc_server(3)
    flat.config = flat.config.model_copy(update={"staleness": "constant"})
    assert flat._staleness_weight(5) == 1.0 and srv._staleness_weight(3) == 0.5


def test_synchronous_ccfc_is_unchanged_by_the_option():
    """Without faults.asynchronous the server keeps no sent weights and averages as before
    (the fixed-point FedAvg of every reply, old or new)."""
    srv = _ccfc_server(None)
    srv._train_messages(0)
    assert srv.sent == {}
    replies = Replies({0: _update(srv, 1.0, 10), 1: _update(srv, 2.0, 30)}, ages={0: 0, 1: 3})
    want = ccfc.weighted_sum(replies, ccfc.UPDATE).mean()
    srv.aggregate(replies, 0)
    for k, v in srv.weights.items():
        if np.asarray(v).dtype.kind == "f":
            np.testing.assert_array_equal(v, want[k].astype(np.float32))


def test_ccfc_buffered_step_never_leaves_a_negative_variance():
    """BatchNorm's running variance steps with the weights; an old update whose step would take
    it below zero leaves it at zero (BatchNorm takes the square root of variance + eps)."""
    srv = _ccfc_server(3)
    var = next(k for k in srv.weights if k.endswith("running_var"))
    mean = next(k for k in srv.weights if k.endswith("running_mean"))
    srv._train_messages(0)  # step 0's model: variance 1, mean 0
    srv.weights = {**srv.weights, var: np.full_like(srv.weights[var], 0.05)}
    srv._train_messages(1)
    old = _update(srv, 0.0, 20)
    old.fields[var] = np.full_like(srv.weights[var], 0.05)  # trained on step 0's model, whose variance was 1
    old.fields[mean] = np.full_like(srv.weights[mean], 0.5)
    srv.aggregate(Replies({2: old}, ages={2: 1}), 1)
    assert (srv.weights[var] == 0.0).all()  # 0.05 + (0.05 - 1) / sqrt(2) < 0
    np.testing.assert_allclose(srv.weights[mean], 0.5 / math.sqrt(2.0), rtol=1e-6)  # a mean steps as the weights


def test_a_crash_drops_the_update_on_its_way(tmp_path):
    """The slowest client crashes in round 1 while its round-0 update is still on its way:
    that update is never taken, and nothing of the client is on its way again."""
    path = echo_async(tmp_path, rounds=8)
    first = run_rounds(path, tmp_path / "probe")
    slowest = max(first[0]["client_s"], key=first[0]["client_s"].get)
    assert int(slowest) in first[0]["buffered"]["in_flight"]
    crashed = run_rounds(path, tmp_path / "run", f"faults.crash=[{{client: {slowest}, at_round: 1}}]")
    assert crashed[1]["crashed"] == [int(slowest)]
    for rec in crashed[1:]:
        assert int(slowest) not in rec["replied"] + rec["buffered"]["in_flight"]
