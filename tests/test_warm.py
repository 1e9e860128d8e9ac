"""A sweep on Ray: actors kept from one run to the next, and runs side by side.

Every run here is compared with the same run in-process (fresh objects, one at a time):
labels, metrics and every metered message must be the same, so nothing of one run
reaches the next through a reused actor and nothing of a run depends on its neighbours.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from raymvc.cli import main

pytestmark = pytest.mark.usefixtures("ray_session")

REPO = Path(__file__).resolve().parents[1]
QUICK = str(REPO / "scenarios" / "hw-cefmc.yaml")
SMALL = ["--set", "runtime.client_cpus=0.25", "--set", "runtime.server_cpus=0.25"]  # 1.75 CPUs a run
SAME = ("status", "acc", "nmi", "ari", "mb", "rounds", "dropped_replies", "crashed_clients")


def _rows(out: Path) -> list[dict]:
    with open(out / "sweep.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _same_runs(a: Path, b: Path) -> None:
    ra, rb = _rows(a), _rows(b)
    assert [[r[k] for k in SAME] for r in ra] == [[r[k] for k in SAME] for r in rb]
    for x, y in zip(ra, rb):
        for name in ("labels.csv", "messages.csv"):
            assert (a / x["run_dir"] / name).read_text() == (b / y["run_dir"] / name).read_text(), (x["run_dir"], name)


def _reused(out: Path) -> list[bool]:
    return [json.loads((out / r["run_dir"] / "summary.json").read_text())["placement"]["reused_actors"]
            for r in _rows(out)]


def _sweep(out: Path, *args: str) -> str:
    return main(["sweep", QUICK, *SMALL, "--out", str(out), "--quiet", *args])


def test_reused_actors_give_what_fresh_ones_give_and_a_crashed_crew_is_not_reused(tmp_path):
    grid = ["--grid", "faults.crash=[[], [{client: 2, at_round: 0}]]", "--grid", "faults.dropout.rate=[0.3, 0]"]
    assert _sweep(tmp_path / "here", *grid, "--seeds", "0", "--backend", "local") == 0
    assert _sweep(tmp_path / "warm", *grid, "--seeds", "0", "--jobs", "1") == 0
    _same_runs(tmp_path / "here", tmp_path / "warm")
    assert [r["status"] for r in _rows(tmp_path / "warm")] == ["degraded", "completed", "degraded", "degraded"]
    # run 2 and 3 reuse the actors of the run before; run 3's crash fault kills one of them, so run 4 starts anew
    assert _reused(tmp_path / "warm") == [False, True, True, False]


def test_fresh_actors_on_request(tmp_path):
    assert _sweep(tmp_path / "fresh", "--seeds", "0,1", "--jobs", "1", "--fresh-actors") == 0
    assert _reused(tmp_path / "fresh") == [False, False]


def test_runs_side_by_side_on_ray_match_the_runs_one_at_a_time(tmp_path, capsys):
    grid = ["--grid", "faults.dropout.rate=[0, 0.3]", "--seeds", "0,1"]
    assert _sweep(tmp_path / "here", *grid, "--backend", "local") == 0
    assert main(["sweep", QUICK, *SMALL, *grid, "--jobs", "3", "--out", str(tmp_path / "side")]) == 0
    assert "[sweep] 3 runs at a time on Ray" in capsys.readouterr().err  # 8 CPUs hold 4 runs; --jobs caps it
    _same_runs(tmp_path / "here", tmp_path / "side")


def test_how_many_runs_a_cluster_holds(tmp_path, ray_session):
    from raymvc.scenario import load_scenario
    from raymvc.study.sweep import footprint, plan, ray_slots

    sc = load_scenario(QUICK, ["runtime.client_cpus=auto"])
    assert footprint(sc, 6) == 6 * 1.0 + 0.5  # auto counts a whole CPU per actor
    two = load_scenario(QUICK, ["runtime.threads=2"])
    assert footprint(two, 6) == 6 * 2 + 2  # two threads per party: two CPUs each, whatever each reserved
    cells = plan([QUICK], [], [0, 1, 2, 3, 4], {"runtime.client_cpus": 0.5}, tmp_path / "p")
    assert ray_slots(cells, None) == 2  # 3.5 CPUs a run, 8 in the session's instance
    assert ray_slots(cells, 1) == 1
    assert ray_slots(cells[:1], None) == 1


def test_one_crew_serves_runs_of_different_client_counts(tmp_path):
    kfed = str(REPO / "scenarios" / "digits-kfed.yaml")
    args = [kfed, *SMALL, "--grid", "data.n_clients=[3, 5, 4]", "--seeds", "0", "--quiet"]
    assert main(["sweep", *args, "--backend", "local", "--out", str(tmp_path / "here")]) == 0
    assert main(["sweep", *args, "--jobs", "1", "--out", str(tmp_path / "warm")]) == 0
    _same_runs(tmp_path / "here", tmp_path / "warm")
    # the first run reserves room for five client actors and starts three; the next starts two more
    assert _reused(tmp_path / "warm") == [False, True, True]
    nodes = [json.loads((tmp_path / "warm" / r["run_dir"] / "summary.json").read_text())["placement"]
             for r in _rows(tmp_path / "warm")]
    assert [len(p["client_node"]) for p in nodes] == [3, 5, 4]
    assert [p["actors_started"] for p in nodes] == [4, 2, 0]  # server + 3 pools, then 2 more pools, then none


def test_a_crew_reserves_the_planned_room_only_where_the_cluster_could_hold_it():
    from raymvc.driver.warm import WarmActors

    class Seats:
        def release(self):
            pass

    warm, asked = WarmActors(), []
    warm.plan([("kind", 10), ("kind", 3)])

    def reserve(room):
        asked.append(room)
        return Seats()

    big = warm.acquire("kind", 3, reserve)
    assert (big.room, asked) == (10, [10])  # room for the sweep's largest run of the kind
    small = warm.acquire("kind", 3, reserve, fits=lambda room: room <= 4)
    assert (small.room, asked[-1]) == (3, 3)  # the cluster could never hold 10: the run's own need
    warm.idle += [big, small]
    assert warm.take("kind", 3) is small  # the smallest crew with room enough
    assert warm.take("kind", 11) is None and warm.take("other", 1) is None
    assert warm.take("kind", 8) is big
