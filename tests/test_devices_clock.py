"""Device profiles on the virtual clock (``devices``): a round's virtual time is what its
slowest awaited client takes (downlink + compute + uplink, from the metered bytes); the
deadline makes late exactly the clients whose profile is too slow; Ray and in-process agree;
a bad profile is a one-line error naming the file and the key."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import validate_fails_in_one_line

from raymvc.driver import prepare, run_scenario
from raymvc.runtime.faults import DeviceProfiles
from raymvc.scenario import DevicesCfg, NetworkCfg, load_scenario
from raymvc.scenario.sidefiles import device_classes

ROOT = Path(__file__).resolve().parents[1]
PROFILE = {"slow": {"speed": 0.1, "up_mbps": 1, "down_mbps": 2, "latency_ms": 100},
           "fast": {"speed": 1.0, "up_mbps": 20, "down_mbps": 50, "latency_ms": 10}}


def echo_file(tmp_path, devices: dict, *, faults: dict | None = None, rounds: int = 4, n_clients: int = 5,
              name: str = "echo") -> Path:
    """A FedAvg-echo scenario (every client asked every round) on digits, split horizontally with skewed sizes."""
    sc = {"name": name, "method": "raymvc.bench.fedavg_echo", "params": {"rounds": rounds, "floats": 3000},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": n_clients, "dirichlet_alpha": 0.5},
          "faults": faults or {}, "devices": devices, "runtime": {"backend": "local"}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def run(path: Path, out: Path, *overrides: str) -> tuple[dict, list[dict], list[dict]]:
    s = run_scenario(load_scenario(path, list(overrides)), out, progress=lambda line: None)
    assert s["status"] in ("completed", "degraded"), s.get("error")
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    with open(out / "messages.csv", newline="") as fh:
        ledger = list(csv.DictReader(fh))
    return s, rounds, ledger


def bytes_by_round(ledger: list[dict]) -> dict[tuple[int, int], tuple[int, int]]:
    """(round, client) -> (bytes down, bytes up) of the protocol's messages."""
    down, up = defaultdict(int), defaultdict(int)
    for row in ledger:
        if row["path"] != "protocol":
            continue
        r = int(row["round"])
        if row["src"] == "server":
            down[r, int(row["dst"].split(":")[1])] += int(row["wire_bytes"])
        else:
            up[r, int(row["src"].split(":")[1])] += int(row["wire_bytes"])
    return {k: (down[k], up[k]) for k in down}


def link_s(nbytes: int, mbps: float, latency_ms: float) -> float:
    return latency_ms / 1000 + nbytes * 8 / (mbps * 1e6)


def test_round_time_is_the_slowest_clients_down_compute_up(tmp_path):
    dev = {"base_compute_s": 1.5, "by_samples": True, "speed": 2.0, "up_mbps": 1.0, "down_mbps": 4.0,
           "latency_ms": 30}
    path = echo_file(tmp_path, dev)
    s, rounds, ledger = run(path, tmp_path / "out")
    _, part = prepare(load_scenario(path))
    rows = {c: part.shards[c].rows_held for c in range(5)}
    assert len(set(rows.values())) > 1  # sizes differ, so compute times differ
    mean = np.mean(list(rows.values()))
    nbytes = bytes_by_round(ledger)
    assert len(rounds) == 4
    for rec in rounds:
        r = rec["round"]
        want = {c: link_s(nbytes[r, c][0], 4.0, 30) + 1.5 * rows[c] / mean / 2.0 + link_s(nbytes[r, c][1], 1.0, 30)
                for c in range(5)}
        assert {int(c): t for c, t in rec["client_s"].items()} == pytest.approx(want, rel=1e-12)
        assert rec["virtual_end_s"] - rec["virtual_start_s"] == pytest.approx(max(want.values()), rel=1e-12)
    assert s["timing"]["virtual_s"] == pytest.approx(
        sum(r["virtual_end_s"] - r["virtual_start_s"] for r in rounds), rel=1e-12)
    # without devices a round's line carries no per-client times, as before
    plain = tmp_path / "plain.yaml"
    raw = yaml.safe_load(path.read_text())
    del raw["devices"]
    plain.write_text(yaml.safe_dump(raw))
    _, base, _ = run(plain, tmp_path / "plain-out")
    assert all("client_s" not in rec and rec["virtual_end_s"] == 0.0 for rec in base)


def test_late_clients_are_exactly_those_the_profile_makes_slow(tmp_path):
    (tmp_path / "devices.yaml").write_text(yaml.safe_dump(PROFILE))
    dev = {"base_compute_s": 1.0, "profile": "devices.yaml", "classes": {"slow": 0.4, "fast": 0.6}}
    deadline = 3.0
    path = echo_file(tmp_path, dev, faults={"deadline_s": deadline}, n_clients=5)
    s, rounds, ledger = run(path, tmp_path / "out")
    sc = load_scenario(path)
    profiles = DeviceProfiles(sc.devices, list(range(5)), sc.seed, NetworkCfg(), classes=device_classes(sc))
    slow = {c for c, d in profiles.devices.items() if d.cls == "slow"}
    assert len(slow) == 2  # round(0.4 x 5) clients of the class
    nbytes = bytes_by_round(ledger)
    late_total = 0
    for rec in rounds:
        r = rec["round"]
        times = {}
        for c in range(5):
            d = PROFILE["slow" if c in slow else "fast"]
            times[c] = (link_s(nbytes[r, c][0], d["down_mbps"], d["latency_ms"]) + 1.0 / d["speed"]
                        + link_s(nbytes[r, c][1], d["up_mbps"], d["latency_ms"]))
        assert sorted(rec["late"]) == sorted(c for c, t in times.items() if t > deadline) == sorted(slow)
        assert sorted(rec["replied"]) == sorted(set(range(5)) - slow)
        assert {int(c): t for c, t in rec["client_s"].items()} == pytest.approx(times, rel=1e-12)
        assert rec["virtual_end_s"] - rec["virtual_start_s"] == pytest.approx(deadline)  # waits for the late
        late_total += len(rec["late"])
    assert s["faults"]["late_replies"] == late_total == 2 * len(rounds)
    assert s["status"] == "degraded"


def test_the_same_clock_on_ray_and_in_process(ray_session, tmp_path):
    dev = {"base_compute_s": 1.0, "speed": {"dist": "lognormal", "mean": 1.0, "sigma": 0.8},
           "up_mbps": {"dist": "uniform", "mean": 2.0}, "down_mbps": 10, "latency_ms": 50}
    path = echo_file(tmp_path, dev, faults={"deadline_s": 2.0}, rounds=3, n_clients=6)
    seen = {}
    for backend in ("local", "ray"):
        s, rounds, _ = run(path, tmp_path / backend, f"runtime.backend={backend}", "runtime.client_cpus=0.25",
                           "runtime.clients_per_actor=3")
        seen[backend] = ([(r["replied"], r["late"], r["client_s"], r["virtual_start_s"], r["virtual_end_s"])
                          for r in rounds], s["timing"]["virtual_s"], s["faults"])
    assert seen["ray"] == seen["local"]
    times = [t for _, _, ct, _, _ in seen["local"][0] for t in ct.values()]
    assert len(set(np.round(times, 9))) > 1  # drawn per client


def test_draws_are_seeded_per_client_and_classes_dealt_by_share():
    cfg = DevicesCfg(speed={"dist": "lognormal", "mean": 1.0, "sigma": 0.5}, latency_ms=20)
    a = DeviceProfiles(cfg, list(range(200)), 7, NetworkCfg(bandwidth_mbps=8))
    b = DeviceProfiles(cfg, list(range(100, 150)), 7, NetworkCfg(bandwidth_mbps=8))
    assert all(a.devices[c] == b.devices[c] for c in range(100, 150))  # a client's draw depends on it alone
    speeds = [d.speed for d in a.devices.values()]
    assert abs(np.mean(speeds) - 1.0) < 0.1 and len(set(speeds)) == 200
    assert {(d.up_mbps, d.down_mbps, d.latency_ms) for d in a.devices.values()} == {(8.0, 8.0, 20.0)}
    assert a.compute_s(3, work=0.5) == pytest.approx(0.5 / a.devices[3].speed)  # partial work computes less
    from raymvc.scenario import DeviceClass

    classes = {k: DeviceClass(**v) for k, v in PROFILE.items()}
    cfg = DevicesCfg(profile="p.yaml", classes={"slow": 0.25, "fast": 0.75})
    dealt = DeviceProfiles(cfg, list(range(10)), 3, NetworkCfg(), classes=classes)
    assert sorted(d.cls for d in dealt.devices.values()) == ["fast"] * 7 + ["slow"] * 3  # 2.5 -> 3, 7.5 -> 7
    again = DeviceProfiles(cfg, list(range(10)), 3, NetworkCfg(), classes=classes)
    assert again.devices == dealt.devices


def _profile(tmp_path, text: str, classes: dict | None = None) -> Path:
    (tmp_path / "p.yaml").write_text(text)
    return echo_file(tmp_path, {"profile": "p.yaml", "classes": classes or {"slow": 1.0}}, name="bad")


BROKEN = {
    "missing-file": (lambda t: echo_file(t, {"profile": "nope.yaml", "classes": {"slow": 1}}, name="bad"),
                     "devices.profile: file not found: "),
    "bad-value": (lambda t: _profile(t, "slow: {speed: 0.1, up_mbps: -1, down_mbps: 2, latency_ms: 100}\n"),
                  "p.yaml: slow.up_mbps: input should be greater than 0, got -1"),
    "missing-key": (lambda t: _profile(t, "slow: {speed: 0.1, up_mbps: 1, down_mbps: 2}\n"),
                    "p.yaml: slow.latency_ms: required key is missing"),
    "unknown-key": (lambda t: _profile(t, "slow: {sped: 0.1, up_mbps: 1, down_mbps: 2, latency_ms: 1}\n"),
                    "p.yaml: slow.sped: unknown key; did you mean 'speed'?"),
    "not-a-mapping": (lambda t: _profile(t, "- slow\n- fast\n"), "p.yaml: expected a mapping of device classes"),
    "unknown-class": (lambda t: _profile(t, yaml.safe_dump(PROFILE), {"tablet": 1.0}),
                      "devices.classes.tablet: not a class of "),
    "shares": (lambda t: _profile(t, yaml.safe_dump(PROFILE), {"slow": 0.5, "fast": 0.2}),
               "devices.classes: the shares must sum to 1, got 0.7"),
    "both": (lambda t: echo_file(t, {"profile": "p.yaml", "classes": {"slow": 1}, "speed": 2}, name="bad"),
             "devices: speed comes from the profile's classes"),
    "bad-draw": (lambda t: echo_file(t, {"speed": {"dist": "lognormal"}}, name="bad"),
                 "devices.speed.mean: required key is missing"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_bad_devices_are_one_line_naming_file_and_key(tmp_path, capsys, case):
    make, expected = BROKEN[case]
    validate_fails_in_one_line(make(tmp_path), capsys, expected)


def test_the_shipped_example_runs_in_process(tmp_path):
    s, rounds, _ = run(ROOT / "scenarios" / "digits-kfed-devices.yaml", tmp_path / "out", "runtime.backend=local")
    late = {c for r in rounds for c in r["late"]}
    assert late and s["faults"]["late_replies"] > 0
    assert all(r["client_s"][str(c)] > 5.0 for r in rounds for c in r["late"])
    assert s["metrics"]["acc"] > 0.5
