"""``raymvc plot RUN``: a run's own figure, scores by round and by virtual time, MB per round
and who took part, from its rounds.jsonl."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raymvc.cli import main
from raymvc.driver.engine import run_scenario
from raymvc.protocols import ccfc
from raymvc.results.plot import PARTICIPATION, _scored
from raymvc.results.runfolder import RunFolder
from raymvc.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runplot")
    sc = {"name": "ccfc-scored", "method": "ccfc",
          "params": dict(ccfc.PROTOCOL.quick_params, warmup_rounds=2, cluster_rounds=2),
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 4},
          "faults": {"dropout": {"rate": 0.3}, "min_clients": 0, "stragglers": {"fraction": 0.5}, "deadline_s": 2.5},
          "runtime": {"backend": "local", "score_every": 1}, "seed": 3}
    path = tmp / "ccfc.yaml"
    path.write_text(yaml.safe_dump(sc))
    out = tmp / "run"
    run_scenario(load_scenario(path), out, progress=lambda line: None)
    return out


def test_a_run_is_plotted_with_its_scores_traffic_and_participation(scored_run, capsys):
    assert main(["plot", str(scored_run)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(scored_run / "run.png"), str(scored_run / "run.svg")]
    svg = (scored_run / "run.svg").read_text()
    for text in ("Scores by round", "Scores by virtual time", "Traffic per round", "Who took part", "replied",
                 "away (dropped out)"):
        assert text in svg, text
    rounds = RunFolder(scored_run).rounds()
    names, scored = _scored(rounds, None)
    assert names == ["acc", "nmi", "ari"] and len(scored) == len([r for r in rounds if r.scores])
    # the participation bars count every client each round: replied + away + late + ... + not asked
    for r in rounds[:-1]:
        assert sum(len(getattr(r, k) or []) for keys, _, _ in PARTICIPATION for k in keys) == 4, r


def test_a_score_the_run_never_reported_by_round_is_refused_naming_what_it_has(scored_run, capsys):
    assert main(["plot", str(scored_run), "--metric", "kappa"]) == 0  # a horizontal run scores Kappa by round too
    capsys.readouterr()
    assert main(["plot", str(scored_run), "--metric", "silhouette"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--metric silhouette" in err and "acc" in err


def test_a_run_without_scores_by_round_still_shows_traffic_and_participation(tmp_path, capsys):
    out = tmp_path / "kfed"
    assert main(["run", str(ROOT / "scenarios" / "digits-kfed.yaml"), "--backend", "local", "--out", str(out), "--quiet"]) == 0
    assert main(["plot", str(out)]) == 0
    svg = (out / "run.svg").read_text()
    assert "Traffic per round" in svg and "Scores by round" not in svg
    (out / "rounds.jsonl").write_text("")  # a folder whose rounds are gone
    assert main(["plot", str(out)]) != 0
    assert "holds no rounds" in capsys.readouterr().err


def test_plot_says_what_a_folder_lacks(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) != 0
    assert "no sweep.csv or rounds.jsonl here" in capsys.readouterr().err
