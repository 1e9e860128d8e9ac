"""Client sampling (faults.sampling): each round the server asks a seeded share of the
clients; the others get no message, reach the server's step as missing and are listed as
not_sampled in rounds.jsonl, never counted as faults; the same on Ray and in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from raymvc.cli import main
from raymvc.driver import run_scenario
from raymvc.runtime.faults import FaultPlan
from raymvc.scenario import FaultsCfg, load_scenario

ROOT = Path(__file__).resolve().parents[1]


def echo_file(tmp_path: Path, fraction: float, *, n_clients: int = 10, rounds: int = 8, **faults) -> Path:
    """FedAvg-echo (every client asked every round) on digits, split horizontally."""
    sc = {"name": "echo", "method": "raymvc.bench.fedavg_echo", "params": {"rounds": rounds, "floats": 4},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": n_clients},
          "faults": {"sampling": {"fraction": fraction}, **faults}, "runtime": {"backend": "local"}, "seed": 5}
    path = tmp_path / "echo.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def run(path: Path, out: Path, *overrides: str) -> tuple[dict, list[dict]]:
    s = run_scenario(load_scenario(path, list(overrides)), out, progress=lambda line: None)
    return s, [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]


def test_the_draw_asks_a_fixed_seeded_share_each_round():
    ids = list(range(10))
    plan = FaultPlan(FaultsCfg(sampling={"fraction": 0.3}), ids, seed=5)
    picks = [plan.sampled(r) for r in range(50)]
    assert all(len(p) == 3 and p <= set(ids) for p in picks)
    assert len({frozenset(p) for p in picks}) > 10  # a new draw every round
    again = FaultPlan(FaultsCfg(sampling={"fraction": 0.3}), list(reversed(ids)), seed=5)
    assert [again.sampled(r) for r in (49, 0, 7)] == [picks[49], picks[0], picks[7]]
    assert FaultPlan(FaultsCfg(sampling={"fraction": 0.3}), ids, seed=6).sampled(0) != picks[0] or \
        FaultPlan(FaultsCfg(sampling={"fraction": 0.3}), ids, seed=6).sampled(1) != picks[1]
    assert FaultPlan(FaultsCfg(sampling={"fraction": 0.01}), ids, seed=5).sampled(3).__len__() == 1  # at least one
    for cfg in (FaultsCfg(), FaultsCfg(sampling={"fraction": 1.0})):
        assert FaultPlan(cfg, ids, seed=5).sampled(0) is None  # everyone


def test_only_the_sampled_are_asked_and_the_rest_are_no_fault(tmp_path):
    path = echo_file(tmp_path, 0.3)
    plan = FaultPlan(load_scenario(path).faults, list(range(10)), seed=5)
    s, rounds = run(path, tmp_path / "a")
    assert s["status"] == "completed"  # not degraded: sampling is no fault
    assert s["faults"]["dropped_replies"] == 0 and s["faults"]["late_replies"] == 0
    assert len(rounds) == 8
    for rec in rounds:
        asked = sorted(plan.sampled(rec["round"]))
        assert rec["replied"] == asked and rec["missing"] == [] and rec["dropped"] == []
        assert rec["not_sampled"] == sorted(set(range(10)) - set(asked))
        assert rec["info"]["aggregated"] == asked
        assert rec["messages"] == 2 * len(asked)  # the others got no message
    _, again = run(path, tmp_path / "b")
    assert [r["not_sampled"] for r in again] == [r["not_sampled"] for r in rounds]


def test_the_server_step_sees_the_unsampled_as_missing(tmp_path, monkeypatch):
    from raymvc.bench import fedavg_echo

    seen = []
    real = fedavg_echo.EchoServer.step
    monkeypatch.setattr(fedavg_echo.EchoServer, "step",
                        lambda self, r, replies, missing: seen.append((r, sorted(replies), sorted(missing)))
                        or real(self, r, replies, missing))
    path = echo_file(tmp_path, 0.5, rounds=3, n_clients=6, dropout={"rate": 0.3})
    _, rounds = run(path, tmp_path / "m")
    assert len(seen) == 3
    for (r, replied, missing), rec in zip(seen, rounds):
        assert replied == rec["replied"]
        assert missing == sorted(rec["missing"] + rec["not_sampled"])  # faults and the unsampled alike
        assert not set(rec["dropped"]) & set(rec["not_sampled"])  # an unsampled client cannot drop out


def test_sampling_with_secure_aggregation_sums_the_asked(tmp_path, capsys):
    path = echo_file(tmp_path, 0.5, rounds=3, n_clients=8)
    # set up among all 8, a majority (5) is needed to unmask: 4 asked could never reach it
    assert main(["validate", str(path), "--set", "channel.secure_aggregation=true"]) == 2
    assert "faults.sampling: asks 4 of 8 clients per round, fewer than the 5 secure aggregation needs" in \
        capsys.readouterr().err
    s, rounds = run(path, tmp_path / "s", "channel.secure_aggregation=true", "channel.secagg_threshold=0.3")
    assert s["status"] == "completed", s.get("error")
    for rec in rounds:
        assert rec["info"]["aggregated"] == rec["replied"] and len(rec["replied"]) == 4


def test_kfed_with_sampling_asks_the_left_out_later(tmp_path):
    sc = ROOT / "scenarios" / "digits-kfed.yaml"
    out = tmp_path / "k"
    assert main(["run", str(sc), "--backend", "local", "--set", "faults.sampling={fraction: 0.5}", "--set",
                 "params.retry_rounds=8", "--out", str(out), "--quiet", "--json"]) == 0
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert rounds[0]["not_sampled"] and sorted(rounds[0]["replied"] + rounds[0]["not_sampled"]) == \
        list(range(len(rounds[0]["replied"] + rounds[0]["not_sampled"])))
    summarised = set().union(*(r["replied"] for r in rounds))
    assert len(summarised) > len(rounds[0]["replied"])  # clients left out of round 0 summarised later
    assert all(not r["missing"] for r in rounds)


@pytest.mark.parametrize(("extra", "words"), [
    (["--set", "faults.sampling={fraction: 0}"], "faults.sampling.fraction"),
    (["--set", "faults.sampling={fraction: 0.2}", "--set", "faults.min_clients=3"],
     "faults.min_clients: 3 is more than the 2 clients faults.sampling asks per round"),
])
def test_bad_sampling_is_one_line(tmp_path, capsys, extra, words):
    path = echo_file(tmp_path, 1.0)
    assert main(["validate", str(path), *extra]) == 2 or main(["run", str(path), *extra, "--out",
                                                                str(tmp_path / "x"), "--quiet"]) == 2
    assert words in capsys.readouterr().err


def test_sampling_is_for_horizontal_methods(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["run", str(ROOT / "scenarios" / "hw-cefmc.yaml"), "--backend", "local", "--set",
                 "faults.sampling={fraction: 0.5}", "--out", str(out), "--quiet"]) == 2
    assert "faults.sampling: client sampling is for horizontal methods" in capsys.readouterr().err


def test_sampling_is_the_same_on_ray_and_in_process(ray_session, tmp_path):
    path = echo_file(tmp_path, 0.4, dropout={"rate": 0.2})
    seen = {}
    for backend in ("local", "ray"):
        _, rounds = run(path, tmp_path / backend, f"runtime.backend={backend}", "runtime.client_cpus=0.25",
                        "runtime.clients_per_actor=5")
        seen[backend] = [(r["replied"], r["missing"], r["not_sampled"]) for r in rounds]
    assert seen["ray"] == seen["local"]


def _kfed_sampled(tmp_path, name: str, *extra: str, backend: str = "local") -> dict:
    out = tmp_path / name
    assert main(["run", str(ROOT / "scenarios" / "digits-kfed.yaml"), "--backend", backend, "--set",
                 "data.n_clients=20", "--set", "faults.sampling={fraction: 0.2}", *extra, "--out", str(out),
                 "--quiet"]) == 0
    return json.loads((out / "summary.json").read_text())


def test_an_inference_round_hands_the_final_model_to_every_available_client(tmp_path):
    """Sampled, most clients never hear of the centroids and their rows stay unlabelled; an
    inference round reaches them all (metered: the MB grow; one round more)."""
    off = _kfed_sampled(tmp_path, "off")
    on = _kfed_sampled(tmp_path, "on", "--set", "faults.inference_round=true")
    assert off["unlabelled_samples"] > 500 and "inference_round" not in off["protocol_info"]
    info = on["protocol_info"]["inference_round"]
    assert info == {"round": off["rounds"], "addressed": 20, "reached": 20, "missing": [], "crashed": []}
    assert on["unlabelled_samples"] == 0 and on["metrics"]["acc"] > off["metrics"]["acc"] + 0.2
    assert on["rounds"] == off["rounds"] + 1
    k, d = 10, 64  # 20 copies of the 10 x 64 float64 centroids, on top of the same rounds
    assert on["communication"]["mb_total"] - off["communication"]["mb_total"] > 20 * k * d * 8 / 1e6
    # subject to faults: under dropouts some clients miss it, and only theirs stay unlabelled
    lossy = _kfed_sampled(tmp_path, "lossy", "--set", "faults.inference_round=true",
                          "--set", "faults.dropout={rate: 0.5}")
    info = lossy["protocol_info"]["inference_round"]
    assert 0 < info["reached"] < 20 and len(info["missing"]) == 20 - info["reached"]
    assert 0 <= lossy["unlabelled_samples"] < off["unlabelled_samples"]


def test_the_inference_round_is_the_same_on_ray_and_in_process(ray_session, tmp_path):
    seen = {}
    for backend in ("local", "ray"):
        s = _kfed_sampled(tmp_path, backend, "--set", "faults.inference_round=true", "--set",
                          "faults.dropout={rate: 0.3}", "--set", "runtime.client_cpus=0.25", "--set",
                          "runtime.clients_per_actor=5", backend=backend)
        assert s["backend"] == backend
        labels = (tmp_path / backend / "labels.csv").read_text()
        seen[backend] = (s["protocol_info"]["inference_round"], s["unlabelled_samples"], labels)
    assert seen["ray"] == seen["local"]
