"""The command line: broken scenarios exit 2 with one line; validate, list, params, run, report; own data and methods."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
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
        from raymvc.driver import prepare

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
    assert "status    completed" in text and "MB" in text and "start-up" in text
    assert main(["report", str(tmp_path / "nothing")]) == 2
    lines = (out / "labels.csv").read_text().splitlines()
    assert lines[0] == "sample,cluster" and len(lines) == 1 + s["n_samples"] == 2001
    assert [int(x.split(",")[0]) for x in lines[1:]] == list(range(2000))
    assert {int(x.split(",")[1]) for x in lines[1:]} <= set(range(10))


def test_progress_lines_when_not_a_terminal(tmp_path, capsys):
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert "[hw-cefmc] round 1/30" in err and " MB  6 replies, 0 missing" in err


def test_set_errors_name_the_set_and_suggest_keys(capsys):
    assert main(["validate", str(QUICK), "--set", "params.lamda=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --set params.lamda=2: params.lamda: unknown key; did you mean 'lambda'?")
    keys = "beta, h_step, inner_iters, inner_tol, kmeans_init, lambda, max_rounds, stop_on_cycle, tol"
    assert f"valid keys: {keys}" in err and "\n" not in err
    assert main(["run", str(QUICK), "--set", "faults.droput.rate=0.1"]) == 2
    assert "error: --set faults.droput.rate=0.1: faults.droput: unknown key; did you mean 'dropout'?" \
        in capsys.readouterr().err
    # problems found while loading the data name the --set too
    assert main(["validate", str(QUICK), "--set", "faults.crash=[{client: 9, at_round: 1}]"]) == 2
    assert capsys.readouterr().err.startswith("error: --set faults.crash=[{client: 9, at_round: 1}]: faults.crash: ")
    assert main(["validate", str(QUICK), "--set", "method=cefmx"]) == 2
    assert "did you mean 'cefmc'?" in capsys.readouterr().err
    # a value where a mapping belongs names the mapping's keys, never an internal class
    assert main(["validate", str(QUICK), "--set", "faults.dropout=0.3"]) == 2
    err = capsys.readouterr().err
    assert "faults.dropout: expected a mapping of its keys (rate), got 0.3; did you mean faults.dropout.rate?" in err
    assert "Cfg" not in err


def test_params_and_version(capsys):
    assert main(["params", "cefmc"]) == 0
    out = capsys.readouterr().out
    assert "lambda" in out and "float" in out and "(0.0, inf)" in out and "weight of the label term" in out
    assert main(["params", "cefmc", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["max_rounds"]["default"] == "30" and rows["max_rounds"]["range"] == "[1, inf)"
    assert main(["params", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: method: unknown method 'nope'")
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    from importlib.metadata import version

    assert capsys.readouterr().out.strip() == f"raymvc {version('raymvc')}"


def test_report_into_a_closed_pipe_is_quiet(tmp_path):
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--backend", "local", "--out", str(out), "--quiet"]) == 0
    p = subprocess.Popen([sys.executable, "-m", "raymvc.cli", "report", "--json", str(out), str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # like `| head` that has gone away before the output comes
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def _npz(path, labelled=True, n=90):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), n // 3)
    views = {f"X{v}": rng.standard_normal((n, 4 + v)) + 3 * y[:, None] for v in range(2)}
    if labelled:
        views["Y"] = y
    np.savez(path, **views)
    return path


def test_data_path_on_the_command_line_replaces_the_dataset_and_resolves_here(tmp_path, monkeypatch):
    _npz(tmp_path / "mine.npz")
    monkeypatch.chdir(tmp_path)
    sc = load_scenario(QUICK, ["data.path=mine.npz"])
    assert sc.data.dataset is None and sc.data_path() == tmp_path / "mine.npz"
    # through the API a path may be a pathlib.Path: the same scenario as its text
    via_api = load_scenario(QUICK, {"data.path": Path("mine.npz")})
    assert via_api.data == sc.data and via_api.data_path() == tmp_path / "mine.npz"
    for missing in ({"data.path": Path("gone.npz")}, {"data": {"path": tmp_path / "gone.npz"}}):
        with pytest.raises(ScenarioError, match="data.path: file not found"):  # its error shows it as text
            load_scenario(QUICK, missing)
    from raymvc.driver import prepare

    ds, part = prepare(sc)
    assert ds.n_samples == 90 and part.n_clients == 2
    # written in a YAML file, a relative path resolves against that file's folder
    sub = tmp_path / "sub"
    sub.mkdir()
    d = base()
    d["data"] = {"path": "../mine.npz", "normalize": "l2"}
    (sub / "s.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.chdir(REPO)
    sc = load_scenario(sub / "s.yaml")
    assert sc.data_path().resolve() == (tmp_path / "mine.npz").resolve()
    # and --set data.dataset puts a built-in data set back
    assert load_scenario(sub / "s.yaml", ["data.dataset=handwritten"]).data.path is None


def test_unlabelled_data_needs_n_clusters_and_gets_label_free_scores(tmp_path, capsys, monkeypatch):
    _npz(tmp_path / "raw.npz", labelled=False)
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(QUICK), "--set", "data.path=raw.npz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --set data.path=raw.npz: data.n_clusters: raw has no labels")
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--backend", "local", "--set", "data.path=raw.npz", "--set", "data.n_clusters=3",
                 "--out", str(out), "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["n_clusters"] == 3 and set(s["metrics"]) == {"silhouette", "calinski_harabasz"}
    assert s["metrics"]["silhouette"] > 0.3
    assert len((out / "labels.csv").read_text().splitlines()) == 91


def test_method_by_import_path_from_the_current_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO / "examples" / "own_method")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "run"
    assert main(["run", "fedlloyd.yaml", "--backend", "local", "--set", "params.max_rounds=3", "--out", str(out),
                 "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["method"] == "fedlloyd" and s["status"] == "completed" and s["metrics"]["acc"] > 0.3
    assert main(["params", "fedlloyd"]) == 0
    assert "Lloyd rounds after the start" in capsys.readouterr().out
    # the example users copy keeps its word: what a client sends at the start is local
    # centroids and counts, never rows of its own data
    import fedlloyd

    from raymvc.driver import prepare
    from raymvc.messages import Message
    from raymvc.protocol import ClientContext
    from raymvc.scenario import load_scenario

    _, part = prepare(load_scenario("fedlloyd.yaml", ["runtime.backend=local"]))
    for cid, shard in enumerate(part.shards[:3]):
        ctx = ClientContext(client_id=cid, n_clients=part.n_clients, n_clusters=10, seed=0)
        reply = fedlloyd.LloydClient(fedlloyd.Config(), shard, ctx).handle(Message("candidates"))
        X, C = np.asarray(shard.X), np.asarray(reply["C"])
        assert set(reply.fields) == {"C", "counts"} and int(reply["counts"].sum()) == len(X)
        singletons = np.flatnonzero(reply["counts"] == 1)
        rows = {r.tobytes() for r in X}
        assert [i for i in range(len(C)) if C[i].tobytes() in rows and i not in singletons] == []


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_method_beside_its_scenario_file_runs_from_any_folder(backend, tmp_path, capsys, monkeypatch, request):
    """``method: fedlloyd`` resolves beside the scenario file, as ``data.path`` does, in the
    driver and (the folder handed to them) in the Ray actors."""
    import raymvc.protocols as protocols

    if backend == "ray":
        request.getfixturevalue("ray_session")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(protocols, "_SEARCH", [])
    monkeypatch.delitem(sys.modules, "fedlloyd", raising=False)
    path_before, env_before = list(sys.path), os.environ.get("PYTHONPATH")
    scenario = REPO / "examples" / "own_method" / "fedlloyd.yaml"
    assert main(["validate", str(scenario)]) == 0
    assert sys.path == path_before and os.environ.get("PYTHONPATH") == env_before  # found without editing either
    assert "ok -- fedlloyd" in capsys.readouterr().out
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--backend", backend, "--set", "params.max_rounds=2", "--set",
                 "runtime.clients_per_actor=5", "--set", "runtime.client_cpus=0.25", "--out", str(out),
                 "--json", "--quiet"]) == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)
    assert s["method"] == "fedlloyd" and s["status"] == "completed" and s["backend"] == backend
    assert sys.path == path_before and os.environ.get("PYTHONPATH") == env_before


def test_method_from_an_entry_point(monkeypatch):
    from importlib.metadata import EntryPoint

    import raymvc.protocols as protocols

    ep = EntryPoint(name="kfed-alias", value="raymvc.protocols.kfed", group=protocols.ENTRY_POINT_GROUP)
    monkeypatch.setattr(protocols, "_entry_points", lambda: {"kfed-alias": ep})
    assert "kfed-alias" in protocols.available()
    assert protocols.get("kfed-alias").name == "kfed"
    sc = load_scenario(REPO / "scenarios" / "digits-kfed.yaml", ["method=kfed-alias"])
    assert sc.method == "kfed-alias"


def test_the_command_exits_quickly_but_completely(tmp_path):
    """entry() skips the interpreter's teardown, not the exit handlers, threads or output."""
    out, mark = tmp_path / "run", tmp_path / "atexit-ran"
    code = ("import atexit, sys, threading, time\n"
            "from raymvc.cli import entry\n"
            f"atexit.register(lambda: open({str(mark)!r}, 'w').write('ran'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.5), print('late thread', file=sys.stderr))).start()\n"
            "from concurrent.futures import ThreadPoolExecutor\n"
            "ThreadPoolExecutor(2).submit(time.sleep, 0.1)  # never shut down: the interpreter's exit hooks do it\n"
            f"sys.argv = ['raymvc', 'run', {str(QUICK)!r}, '--backend', 'local', '--json', '--out', {str(out)!r}]\n"
            "entry()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads((out / "summary.json").read_text())  # all of stdout was flushed
    assert mark.read_text() == "ran" and "late thread" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: [")
    r = subprocess.run([sys.executable, "-m", "raymvc.cli", "validate", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {bad}: invalid YAML")


def test_report_over_methods_shows_the_method_once_and_no_foreign_parameters(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(REPO / "scenarios" / "hw-cefmc.yaml"), "--backend", "local", "--out", str(a), "--quiet"]) == 0
    assert main(["run", str(REPO / "scenarios" / "digits-kfed.yaml"), "--backend", "local", "--out", str(b),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[1].split()
    assert head.count("method") == 1 and not any(h.startswith("params") for h in head)
    assert "parameters differ by method" in lines[0] and len(head) < 20


def test_validate_takes_several_files_and_stops_at_the_first_that_fails(tmp_path, capsys):
    root = Path(__file__).resolve().parents[1]
    good = [str(root / "scenarios" / "digits-kfed.yaml"), str(root / "studies" / "cefmc-headline.yaml")]
    assert main(["validate", *good]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok -- ") == 2
    assert main(["validate", good[0], str(tmp_path / "missing.yaml"), good[1]]) == 2
    captured = capsys.readouterr()
    assert captured.out.count(": ok -- ") == 1 and "missing.yaml" in captured.err


def test_more_clusters_than_samples_is_refused_naming_n_clusters(capsys):
    root = Path(__file__).resolve().parents[1]
    assert main(["validate", str(root / "scenarios" / "digits-kfed.yaml"), "--set", "data.n_clusters=3000"]) == 2
    err = capsys.readouterr().err
    assert "data.n_clusters: 3000 clusters for 1797 samples" in err and "clients" not in err


def test_validate_and_the_summary_show_the_rows_each_client_holds(tmp_path, capsys):
    root = Path(__file__).resolve().parents[1]
    sc = str(root / "scenarios" / "digits-kfed.yaml")
    assert main(["validate", sc, "--set", "data.n_clients=3"]) == 0
    assert "horizontal split over 3 clients; rows per client 599, 599, 599" in capsys.readouterr().out
    assert main(["run", sc, "--backend", "local", "--set", "data.n_clients=20", "--out", str(tmp_path / "r")]) == 0
    assert "  data      rows per client 89-90 (mean 90)" in capsys.readouterr().out


def test_a_run_folder_named_from_overrides_stays_short_and_says_what_was_set():
    from raymvc.results.folder import run_dir_for

    empty = run_dir_for("hw", {"params": {}}).name
    assert empty.startswith("hw_params-empty-")
    long = {"data.path": "/very/long/folder/of/someone/with/data/views.csv", "faults.dropout.rate": 0.3}
    name = run_dir_for("hw", long).name
    assert len(name) < 60 and "dropout0.3" in name and name.startswith("hw_path-")
    other = run_dir_for("hw", {**long, "data.path": long["data.path"].replace("views", "other")}).name
    assert other.split("_")[1] != name.split("_")[1]  # two long values stay apart
