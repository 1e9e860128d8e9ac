"""Fourth hardening round: results that were silently wrong now are right or refused in one line."""

from __future__ import annotations

import pytest

from raymvc.protocols import get
from raymvc.scenario import ScenarioWarning, load_scenario


def test_switching_method_starts_from_the_new_methods_defaults_and_says_what_was_dropped(scenario_path):
    """``--grid 'method=[cefmc, efimvc]'`` ran EFIMVC with CeFMC's lambda and max_rounds."""
    defaults = get("efimvc").config()
    with pytest.warns(ScenarioWarning, match=r"the file's params for 'cefmc' are not carried over \(lambda, "
                                             r"max_rounds, tol\); 'efimvc' starts from its own defaults"):
        sc = load_scenario(scenario_path("hw-cefmc.yaml"), {"method": "efimvc"})
    cfg = sc.protocol_config()
    assert (cfg.max_rounds, cfg.lam, cfg.tol) == (defaults.max_rounds, defaults.lam, defaults.tol) == (100, 0.001, 0.001)
    # a parameter the overrides set again is kept
    with pytest.warns(ScenarioWarning, match=r"not carried over \(lambda, tol\)"):
        sc = load_scenario(scenario_path("hw-cefmc.yaml"), {"method": "efimvc", "params.max_rounds": 4})
    assert sc.protocol_config().max_rounds == 4
    # a method that does not know the file's parameters: no longer an error blamed on the file
    with pytest.warns(ScenarioWarning, match=r"\(k_local, kmeans_init, weighted\)"):
        sc = load_scenario(scenario_path("digits-kfed.yaml"), {"method": "ccfc"})
    assert sc.method == "ccfc" and sc.protocol_config() == get("ccfc").config()


BAD_MODEL = '''
from typing import Literal
from raymvc.availability import AvailabilityModel, ModelConfig


class Odd(AvailabilityModel):
    name = "odd:Odd"

    class Config(ModelConfig):
        model: Literal["odd:Odd"]
        answer: str = "nan"

    def unavailable(self, round, client):
        return {"nan": float("nan"), "neg": -0.5, "inf": float("inf"), "huge": 1e308, "none": None,
                "text": "0.5", "ok": 0.25}[self.cfg.answer]
'''


@pytest.mark.parametrize("answer, shown", [("nan", "nan"), ("neg", "-0.5"), ("inf", "inf"), ("huge", "1e+308"),
                                           ("none", "None"), ("text", "'0.5'")])
def test_an_availability_model_that_answers_no_probability_ends_the_run_naming_it(tmp_path, answer, shown):
    """NaN or a negative number meant "always there", inf or 1e308 "always away", silently;
    None or a string failed blamed on the driver."""
    import json

    from raymvc.cli import main

    (tmp_path / "odd.py").write_text(BAD_MODEL)
    (tmp_path / "s.yaml").write_text(
        "name: odd\nmethod: raymvc.bench.fedavg_echo\nparams: {rounds: 3, floats: 4}\n"
        "data: {dataset: digits, partition: horizontal, n_clients: 4}\n"
        f"faults:\n  availability: {{model: 'odd:Odd', answer: {answer}}}\nruntime: {{backend: local}}\nseed: 0\n")
    rc = main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert rc != 0 and s["status"] == "error"
    assert f"availability model 'odd:Odd': unavailable(round=0, client=0) returned {shown}; it must return a " \
           "probability in [0, 1]" in s["error"]
    (tmp_path / "s.yaml").write_text((tmp_path / "s.yaml").read_text().replace(f"answer: {answer}", "answer: ok"))
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run2"), "--quiet"]) == 0


def test_a_summed_weight_the_rows_do_not_back_is_refused_under_secure_aggregation(tmp_path):
    """A client reporting 1e9 rows made the secure sum's weight huge (or, wrapped, negative):
    -4.5e11 against 1,797 rows, and no word. 0 < sum of weights <= the contributors' rows."""
    import json

    from raymvc.cli import main

    sc = ("name: liar\nmethod: raymvc.bench.misbehave\nparams: {rounds: 3, floats: 4, client: 1, round: 1, act: weight}\n"
          "data: {dataset: digits, partition: horizontal, n_clients: 4}\n"
          "channel: {secure_aggregation: true}\nruntime: {backend: local}\nseed: 0\n")
    (tmp_path / "s.yaml").write_text(sc)
    main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    rounds = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    by_round = {r["round"]: r["info"] for r in rounds if r.get("info")}
    assert "aggregation_failed" not in by_round[0]
    assert by_round[1]["aggregation_failed"].startswith("summed weight 1e+09 is not in (0, 1797], the rows its 4 "
                                                        "contributors hold")
    assert by_round[1]["weight"] == 0.0 and by_round[2]["weight"] == 1797.0  # nothing of the lie was used


def test_small_inputs_that_were_read_loosely(tmp_path, scenario_path):
    """``asynchronous.buffer: true`` or ``"3"`` were taken as 1 and 3; a study's ``seeds: 0``
    was refused as "valid string"."""
    from raymvc.scenario import ScenarioError
    from raymvc.study.files import load_study

    for bad in ("true", '"3"'):
        with pytest.raises(ScenarioError, match="faults.asynchronous.buffer: input should be a valid integer"):
            load_scenario(scenario_path("digits-ccfc.yaml"), [f"faults.asynchronous={{buffer: {bad}}}"])
    f = tmp_path / "one.yaml"
    f.write_text("study:\n  paper: kfed\n  title: one seed\n  seeds: 0\n  runs:\n"
                 f"    - {{id: paper, label: k-FED, scenario: {scenario_path('digits-kfed.yaml')}}}\n")
    assert load_study(f).seeds() == [0]


@pytest.mark.parametrize("setting, words", [
    ("runtime.threads=100000", "runtime.threads: input should be less than or equal to 1024"),
    ("runtime.reply_timeout_s=1e10", "runtime.reply_timeout_s: input should be less than or equal to 1000000"),
    ("runtime.num_cpus=99999999999999999999", "runtime.num_cpus: input should be less than or equal to 65536"),
    ("seed=99999999999999999999999", "seed: input should be less than or equal to 4294967295"),
])
def test_settings_that_crashed_or_hung_a_run_are_refused_up_front(scenario_path, capsys, setting, words):
    """threads 100000 crashed the process (SIGSEGV), a 1e10 s timeout made every client
    "could not connect: OverflowError", huge ints failed blamed on the driver."""
    from raymvc.cli import main

    assert main(["validate", str(scenario_path("digits-kfed.yaml")), "--set", setting]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0]


def test_a_module_in_the_working_directory_is_never_imported(tmp_path, monkeypatch, capsys):
    """``evil.py`` in the working directory (not beside the scenario) ran at validate."""
    from raymvc.cli import main

    here, there = tmp_path / "cwd", tmp_path / "scenarios"
    here.mkdir()
    there.mkdir()
    (here / "evilmod.py").write_text("import pathlib\npathlib.Path('RAN').write_text('x')\n")
    (there / "s.yaml").write_text("name: s\nmethod: evilmod\ndata: {dataset: digits, partition: horizontal, "
                                  "n_clients: 3}\nruntime: {backend: local}\n")
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))  # as `python -m` puts it first
    assert main(["validate", str(there / "s.yaml")]) == 2
    assert "unknown method 'evilmod'" in capsys.readouterr().err and not (here / "RAN").exists()
    (there / "evilmod.py").write_text((here / "evilmod.py").read_text())  # beside the scenario: code it names
    main(["validate", str(there / "s.yaml")])
    assert (here / "RAN").exists()


def test_asynchronous_rounds_without_a_clock_that_tells_clients_apart_are_refused(scenario_path):
    """Without devices, every update arrived at virtual time 0 and clients 0-4 filled every
    buffer: clients 5-9 were never aggregated while the summary said all answered."""
    from raymvc.data.prepare import prepare
    from raymvc.scenario import ScenarioError

    sc = load_scenario(scenario_path("digits-ccfc.yaml"), {"faults.asynchronous": {"buffer": 5}})
    with pytest.raises(ScenarioError, match="faults.asynchronous: needs clients that take different times: give a "
                                            "devices block"):
        prepare(sc)
    ok = load_scenario(scenario_path("digits-ccfc.yaml"), {"faults.asynchronous": {"buffer": 5},
                                                            "faults.stragglers.fraction": 0.4})
    prepare(ok)


EXITER = '''
import sys
from raymvc.bench import fedavg_echo
from raymvc.protocol import Protocol


class ExitingServer(fedavg_echo.EchoServer):
    def step(self, round, replies, missing):
        if round == 1:
            sys.exit(3)
        return super().step(round, replies, missing)


PROTOCOL = Protocol(name="exiter", config=fedavg_echo.Config, client=fedavg_echo.EchoClient, server=ExitingServer,
                    partition="horizontal", summary="the echo, whose server calls sys.exit in round 1")
'''


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_sys_exit_in_server_side_code_is_an_error_with_its_rounds_kept(tmp_path, backend, request, capsys):
    """``SystemExit`` in Server.step made ``raymvc run`` exit with that code: no output, no
    summary.json, an empty rounds.jsonl after rounds ran (on Ray: failed, rounds 0)."""
    import json

    from raymvc.cli import main

    if backend == "ray":
        request.getfixturevalue("ray_session")
    (tmp_path / "exiter.py").write_text(EXITER)
    (tmp_path / "s.yaml").write_text("name: ex\nmethod: exiter\nparams: {rounds: 4, floats: 4}\n"
                                     "data: {dataset: digits, partition: horizontal, n_clients: 3}\n"
                                     f"runtime: {{backend: {backend}, client_cpus: 0.25}}\nseed: 0\n")
    rc = main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert rc != 0 and s["status"] == "error" and s["rounds"] == 2, (rc, s["status"], s["rounds"], s["error"])
    assert s["error"] == "server step 1 raised SystemExit: 3"
    assert "SystemExit" in (tmp_path / "run" / "errors.log").read_text()
    assert len((tmp_path / "run" / "rounds.jsonl").read_text().splitlines()) == 2  # round 0, and the round that ended it


def test_sys_exit_at_import_or_in_an_availability_model_is_one_line(tmp_path, capsys):
    from raymvc.cli import main

    (tmp_path / "bye.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "s.yaml").write_text("name: bye\nmethod: bye\ndata: {dataset: digits, partition: horizontal, "
                                     "n_clients: 3}\nruntime: {backend: local}\n")
    assert main(["validate", str(tmp_path / "s.yaml")]) == 2
    assert "method 'bye': importing it failed: SystemExit: 3" in capsys.readouterr().err
    (tmp_path / "oddexit.py").write_text(BAD_MODEL.replace("odd:Odd", "oddexit:Odd").replace(
        'return {"nan"', 'import sys; sys.exit(3)\n        return {"nan"'))
    (tmp_path / "m.yaml").write_text(
        "name: odd\nmethod: raymvc.bench.fedavg_echo\nparams: {rounds: 3, floats: 4}\n"
        "data: {dataset: digits, partition: horizontal, n_clients: 4}\n"
        "faults:\n  availability: {model: 'oddexit:Odd'}\nruntime: {backend: local}\nseed: 0\n")
    assert main(["run", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "run"), "--quiet"]) != 0
    import json

    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "error" and "called sys.exit(3)" in s["error"]


def _npz_with_header(path, shape, body: bytes = b"\0" * 16) -> None:
    import io
    import zipfile

    import numpy as np

    npy = io.BytesIO()
    np.lib.format.write_array_header_1_0(npy, {"descr": "<f8", "fortran_order": False, "shape": shape})
    y = io.BytesIO()
    np.save(y, np.zeros(3, dtype=np.int64))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("X.npy", npy.getvalue() + body)
        z.writestr("y.npy", y.getvalue())


def test_an_npz_that_declares_or_inflates_to_more_than_memory_is_refused_before_loading(tmp_path, scenario_path,
                                                                                         monkeypatch, capsys):
    """A 580-byte .npz declaring 100000 x 1000000 float64 gave numpy's ArrayMemoryError as a
    traceback in validate and run; a small zip of gigabytes of zeros the same under a limit."""
    from raymvc import safeio
    from raymvc.cli import main

    _npz_with_header(tmp_path / "bomb.npz", (100000, 1000000))
    assert main(["validate", str(scenario_path("hw-cefmc.yaml")), "--set", f"data.path={tmp_path / 'bomb.npz'}"]) == 2
    err = capsys.readouterr().err
    assert "array X: 100000 x 1000000 float64 declares 800 GB but holds 144 bytes: the archive is corrupt" in err
    _npz_with_header(tmp_path / "zeros.npz", (3, 1000), b"\0" * 24000)  # honest, 24 kB once read
    monkeypatch.setattr(safeio, "available_memory", lambda: 20_000)  # as under a tight memory limit
    assert main(["validate", str(scenario_path("hw-cefmc.yaml")), "--set", f"data.path={tmp_path / 'zeros.npz'}"]) == 2
    assert "its arrays take 2.43e-05 GB once read (largest X: 3 x 1000 float64), more than the 2e-05 GB" \
           in capsys.readouterr().err


def test_a_hung_client_of_an_in_process_run_started_off_the_main_thread_is_left_behind(tmp_path):
    """From a thread other than the main one SIGALRM cannot fire: the reply timeout was not
    enforced, and a hung client hung the caller for good."""
    import threading

    import raymvc

    sc = {"name": "hang", "method": "raymvc.bench.misbehave",
          "params": {"rounds": 3, "floats": 4, "client": 1, "round": 1, "act": "hang", "hang_s": 120},
          "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 3},
          "runtime": {"backend": "local", "reply_timeout_s": 0.5}, "seed": 0}
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", raymvc.run(sc, out=tmp_path / "run")), daemon=True)
    t.start()
    t.join(100)  # a liveness bound far above the run's own half-second deadline, not a timing assertion
    assert not t.is_alive(), "the run waited on the hung client"
    r = got["r"]
    assert r.status.value == "degraded" and r.summary["faults"]["late_replies"] >= 1
    assert [rec.missing for rec in r.rounds][1:] == [[1], [1]]  # hung in round 1, then left out


def test_runs_this_machine_cannot_hold_are_refused_before_anything_starts(tmp_path, capsys):
    """2,000 clients on Ray at one client an actor sized Ray to 1,001 CPUs and started a
    process per client (never reaching round 0); secure aggregation over 20,000 clients
    metered 32 GB of key set-up and ignored the first Ctrl-C."""
    import os

    from raymvc.cli import main

    f = tmp_path / "s.yaml"
    f.write_text("name: many\nmethod: kfed\ndata: {dataset: synthetic, partition: horizontal, n_clients: 2000,\n"
                 "  synthetic: {n_samples: 20000, n_views: 1, dims: 2, n_clusters: 3}}\n"
                 "runtime: {backend: ray, client_cpus: 0.01}\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    cap = 64 * (os.cpu_count() or 1)
    assert f"runtime.clients_per_actor: 1 makes 2001 actor processes for 2000 clients; this machine ({os.cpu_count()} " \
           f"CPUs" in err and "set runtime.clients_per_actor to" in err and len(err.splitlines()) == 1
    assert cap < 2001
    assert main(["validate", str(f), "--set", "runtime.clients_per_actor=1000"]) == 0
    capsys.readouterr()
    f.write_text(f.read_text().replace("n_clients: 2000", "n_clients: 20000").replace(
        "runtime: {backend: ray, client_cpus: 0.01}", "runtime: {backend: local}\nmethod: raymvc.bench.fedavg_echo\n"
        "channel: {secure_aggregation: true}").replace("method: kfed\n", ""))
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "channel.secagg_neighbours: secure aggregation among 20000 of 20000 clients needs about 160.0 GB" in err
    assert main(["validate", str(f), "--set", "channel.secagg_neighbours=50"]) == 0


def test_the_inference_round_draws_the_whole_dropout_rate_under_secure_aggregation(tmp_path):
    """It drew the per-exchange share of a three-exchange round: at dropout 0.5 it reached 28-35
    of 40 clients instead of 17-23, so turning secure aggregation on moved all-rows ACC; so
    did every other round without a secure sum (CCFC's third lost 3 clients of 40 at 0.3, not 12)."""
    import raymvc

    reach, dropped, sums = {}, {}, {}
    for sa in (False, True):
        for rate in (0.3,):
            sc = {"name": "inf", "method": "ccfc", "params": dict(get("ccfc").quick_params),
                  "data": {"dataset": "digits", "partition": "horizontal", "n_clients": 40},
                  "faults": {"dropout": {"rate": rate}, "inference_round": True, "min_clients": 0},
                  "channel": {"secure_aggregation": sa}, "runtime": {"backend": "local"}, "seed": 1}
            r = raymvc.run(sc, out=tmp_path / f"{sa}-{rate}")
            reach[sa] = r.summary["protocol_info"]["inference_round"]["reached"]
            dropped[sa] = [sorted(x.dropped) for x in r.rounds]
            sums[sa] = [bool(x.secure_sums) for x in r.rounds]
    assert reach[True] == reach[False] < 34  # the same draws, at the whole rate (per-exchange: about 35)
    # every round, with a secure sum (three exchanges) or without one (CCFC's third), loses the
    # clients the run without the layer loses: the same draw at the round's whole rate
    assert sums[True] == [True, True, False] and sums[False] == [False] * 3
    assert dropped[True] == dropped[False] and [len(d) for d in dropped[True]] == [12, 11, 12]


WRITER = '''
import numpy as np
from raymvc.bench import fedavg_echo
from raymvc.messages import Message
from raymvc.protocol import Protocol


class WritingClient(fedavg_echo.EchoClient):
    """Writes into its shard and its context each time it handles a model."""

    def handle(self, msg):
        if not hasattr(self, "base"):
            self.base = float(self.shard.views[0][0, 0])
        self.shard.views[0][:, 0] += 1.0  # counts the models it handled, in its data
        return super().handle(msg)

    def predict(self):
        return np.full(self.shard.n_local, int(round(float(self.shard.views[0][0, 0]) - self.base)) % 10)


class Server(fedavg_echo.EchoServer):
    def current_model(self):
        return Message("model", w=self.w)


PROTOCOL = Protocol(name="writer", config=fedavg_echo.Config, client=WritingClient, server=Server,
                    partition="horizontal", summary="the echo, whose clients write into their shard")
'''


def test_a_probe_that_writes_into_its_shard_or_context_never_touches_the_real_client(tmp_path):
    """runtime.score_every's copy of a client shared its live ctx and shard: a method writing
    either while handling the probe changed the real client (the docs promise "never touched")."""
    import raymvc

    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "s.yaml").write_text("name: w\nmethod: writer\nparams: {rounds: 4, floats: 4}\n"
                                     "data: {dataset: digits, partition: horizontal, n_clients: 3}\n"
                                     "runtime: {backend: local}\nseed: 0\n")
    plain = raymvc.run(tmp_path / "s.yaml", out=tmp_path / "plain")
    scored = raymvc.run(tmp_path / "s.yaml", overrides={"runtime.score_every": 1}, out=tmp_path / "scored")
    assert scored.rounds[0].scores is not None  # the probe ran
    assert set(plain.labels.tolist()) == {4} and (scored.labels == plain.labels).all()


def _folders_with_a_module(tmp_path, module: str, names: tuple[str, str]) -> None:
    """Two scenario folders, each with its own ``module.py`` (an availability model that keeps
    everyone, or no one, away) and a scenario naming it."""
    for name, away in zip(names, (0.0, 1.0)):
        d = tmp_path / name
        d.mkdir()
        (d / f"{module}.py").write_text(BAD_MODEL.replace("odd:Odd", f"{module}:Odd").replace(
            '"ok": 0.25}[self.cfg.answer]', f'"ok": {away}}}[self.cfg.answer]'))
        (d / "s.yaml").write_text(
            f"name: {name}\nmethod: raymvc.bench.fedavg_echo\nparams: {{rounds: 2, floats: 4}}\n"
            "data: {dataset: digits, partition: horizontal, n_clients: 4}\n"
            f"faults:\n  availability: {{model: '{module}:Odd', answer: ok}}\n  min_clients: 0\nruntime: {{backend: local}}\n")


def test_two_scenario_folders_with_modules_of_one_name_are_refused(tmp_path, capsys):
    """Each of two folders had its own ``wk.py``: in one sweep the first loaded served both, and
    results swapped with the order of the cells."""
    from raymvc.cli import main

    _folders_with_a_module(tmp_path, "wk", ("a", "b"))
    rc = main(["sweep", str(tmp_path / "a" / "s.yaml"), str(tmp_path / "b" / "s.yaml"), "--out", str(tmp_path / "sw"),
               "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "module 'wk' lies beside two scenario files read in this process" in err
    assert "one would serve both: give them different names" in err and err.count("\n") == 1


def test_an_inference_round_for_a_method_without_a_final_model_is_refused(scenario_path):
    """``faults.inference_round: true`` on a method that hands no final model was accepted
    and ignored."""
    from raymvc.data.prepare import prepare
    from raymvc.scenario import ScenarioError

    sc = load_scenario(scenario_path("digits-kfed.yaml"), {"method": "raymvc.bench.fedavg_echo",
                                                           "faults.inference_round": True})
    with pytest.raises(ScenarioError, match="faults.inference_round: method raymvc.bench.fedavg_echo ends with no "
                                            "final model"):
        prepare(sc)
    prepare(load_scenario(scenario_path("digits-kfed.yaml"), {"faults.inference_round": True}))


def test_a_current_model_that_is_no_message_is_the_servers_error(tmp_path):
    """``current_model`` returning a str ended the run blamed on the driver."""
    import json

    from raymvc.cli import main

    (tmp_path / "strmodel.py").write_text(WRITER.replace('return Message("model", w=self.w)', 'return "a model"'))
    (tmp_path / "s.yaml").write_text("name: w\nmethod: strmodel\nparams: {rounds: 2, floats: 4}\n"
                                     "data: {dataset: digits, partition: horizontal, n_clients: 3}\n"
                                     "runtime: {backend: local, score_every: 1}\nseed: 0\n")
    main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "error" and s["errors"][0].startswith("server current_model")
    assert "returned str, not a Message" in s["errors"][0]


def test_an_own_availability_model_is_part_of_the_fingerprint(tmp_path):
    """After editing one's own model, a sweep reused the old cell under the same fingerprint and
    --resume accepted a run whose rounds ran different models."""
    from raymvc.results.provenance import fingerprint

    (tmp_path / "oddfp.py").write_text(BAD_MODEL.replace("odd:Odd", "oddfp:Odd"))
    (tmp_path / "s.yaml").write_text(
        "name: fp\nmethod: raymvc.bench.fedavg_echo\nparams: {rounds: 2, floats: 4}\n"
        "data: {dataset: digits, partition: horizontal, n_clients: 4}\n"
        "faults:\n  availability: {model: 'oddfp:Odd', answer: ok}\nruntime: {backend: local}\nseed: 0\n")
    sc = load_scenario(tmp_path / "s.yaml")
    before = fingerprint(sc)
    assert fingerprint(sc) == before
    import os

    (tmp_path / "oddfp.py").write_text(BAD_MODEL.replace("odd:Odd", "oddfp:Odd").replace('"ok": 0.25', '"ok": 0.5'))
    os.utime(tmp_path / "oddfp.py", ns=(1, 1))  # another time stamp even within one clock tick
    assert fingerprint(sc) != before


def test_a_module_of_one_name_beside_two_scenarios_run_one_after_the_other_is_refused(tmp_path):
    """Outside a sweep too: a second run in the same process (a notebook, a script) was served
    by the first scenario's ``wk.py``, and its results were the first's."""
    import raymvc
    from raymvc.scenario import ScenarioError

    _folders_with_a_module(tmp_path, "wk1", ("a1", "b1"))
    first = raymvc.run(tmp_path / "a1" / "s.yaml", out=tmp_path / "r1")
    assert first.status == "completed"
    with pytest.raises(ScenarioError, match=r"module 'wk1' lies beside two scenario files read in this process"):
        raymvc.run(tmp_path / "b1" / "s.yaml", out=tmp_path / "r2")
    # the same file content beside two scenarios is one module: no refusal
    (tmp_path / "c1").mkdir()
    (tmp_path / "c1" / "wk1.py").write_text((tmp_path / "a1" / "wk1.py").read_text())
    (tmp_path / "b1" / "wk1.py").unlink()
    assert raymvc.run(tmp_path / "a1" / "s.yaml", out=tmp_path / "r3").status == "completed"
