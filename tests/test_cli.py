"""The command line: broken scenarios exit 2 with one line; validate, list, run, report, sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raymvc.cli import main
from raymvc.scenario import ScenarioError, load_scenario, parse_override

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "scenarios" / "hw-cefmc.yaml"


def write(tmp_path, text, name="x.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def base() -> dict:
    return yaml.safe_load(QUICK.read_text())


BROKEN = {
    "unknown-key": (lambda d: d["faults"].update(droput={"rate": 0.1}), "faults.droput: unknown key"),
    "out-of-range": (lambda d: d["faults"]["dropout"].update(rate=1.5), "faults.dropout.rate: "),
    "unknown-method": (lambda d: d.update(method="kmeans++"), "method: unknown method 'kmeans++'"),
    "wrong-type": (lambda d: d["faults"].update(min_clients="three"), "faults.min_clients: "),
    "missing-file": (lambda d: (d["data"].pop("dataset"), d["data"].update(path="nope/data.mat")),
                     "data.path: file not found"),
    "bad-param": (lambda d: d["params"].update(lambda_=2), "params.lambda_: unknown key"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_scenarios_exit_2_with_one_line(tmp_path, capsys, case):
    mutate, expected = BROKEN[case]
    d = base()
    mutate(d)
    p = write(tmp_path, yaml.safe_dump(d))
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith(f"error: {p}: ")
    assert expected in err
    if case == "out-of-range":
        assert "1.5" in err


def test_invalid_yaml_and_missing_scenario(tmp_path, capsys):
    p = write(tmp_path, "name: x\nmethod: [cefmc\n")
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {p}: invalid YAML") and "\n" not in err
    assert main(["run", str(tmp_path / "absent.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_broken_scenario_in_a_real_process_has_no_traceback(tmp_path):
    d = base()
    d["faults"]["dropout"]["rate"] = 1.5
    p = write(tmp_path, yaml.safe_dump(d))
    r = subprocess.run([sys.executable, "-m", "raymvc.cli", "run", str(p)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == f"error: {p}: faults.dropout.rate: input should be less than or equal to 1, got 1.5"


def test_overrides_are_parsed_as_yaml_and_validated():
    assert parse_override("faults.crash=[{client: 2, at_round: 2}]") == ("faults.crash", [{"client": 2, "at_round": 2}])
    sc = load_scenario(QUICK, ["faults.crash=[{client: 2, at_round: 2}]", "channel.encryption=aes-gcm"])
    assert sc.faults.crash[0].client == 2 and sc.channel.encryption == "aes-gcm"
    with pytest.raises(ScenarioError, match=r"channel.encryption: "):
        load_scenario(QUICK, ["channel.encryption=rot13"])
    with pytest.raises(ScenarioError, match=r"faults.crash: client 9 does not exist"):
        from raymvc.runtime import prepare

        prepare(load_scenario(QUICK, ["faults.crash=[{client: 9, at_round: 1}]"]))


def test_partition_mismatch_is_a_scenario_error(tmp_path, capsys):
    assert main(["validate", str(QUICK), "--set", "data.partition=horizontal"]) == 2
    assert "data.partition: method cefmc needs a vertical split" in capsys.readouterr().err


def test_validate_and_list(capsys):
    assert main(["validate", str(QUICK)]) == 0
    assert "ok -- cefmc on handwritten (2000 samples, 6 views, 10 clusters)" in capsys.readouterr().out
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("cefmc", "cefmc-h", "handwritten", "digits", "synthetic", "dropout.rate", "crash"):
        assert word in out


def test_run_json_then_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(out), "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["status"] == "completed" and s["out_dir"] == str(out)
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "status    completed" in text and "MB" in text
    assert main(["report", str(tmp_path)]) == 2


def test_sweep_over_dropout(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["sweep", str(QUICK), "--backend", "local", "--grid", "faults.dropout.rate=0,0.4", "--out", str(out),
               "--quiet"])
    assert rc == 0
    rows = (out / "sweep.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("faults.dropout.rate,seed,status")
    assert rows[1].split(",")[2] == "completed" and rows[2].split(",")[2] == "degraded"
