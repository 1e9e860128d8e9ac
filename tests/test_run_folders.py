"""Run and sweep folders that are safe, and checkpoints that are plain data.

raymvc holds a folder for the whole run or sweep (a lock), writes a marker into the
folders it makes, deletes only the files it writes, never writes through a link, writes
every result file whole (a full disk keeps the file before), and resumes only from a
checkpoint of the same code whose files are unchanged, building no object by a name
read from it.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raymvc.channel import codec
from raymvc.channel.meter import Ledger, LedgerRow
from raymvc.cli import main
from raymvc.driver import checkpoint, run_scenario
from raymvc.messages import Message
from raymvc.results import folder as results
from raymvc.results.folder import LOCK, MARKER, OutputFolder, ResultsError, RunWriter, folder_kind
from raymvc.runtime.state import StateError, dump_state, load_state
from raymvc.scenario import ScenarioError, load_scenario

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "scenarios" / "hw-cefmc.yaml"
LOCAL = ["--backend", "local", "--quiet", "--set", "params.max_rounds=4"]


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def stopped_run(out: Path, sets: list[str] = ()) -> Path:
    """A run with checkpoints, stopped (like Ctrl-C) after its second round."""
    sc = load_scenario(str(QUICK), ["runtime.backend=local", "runtime.checkpoint=true", "params.max_rounds=6",
                                    "params.tol=0", *sets])

    def stop(record):
        if record["round"] == 1:
            raise KeyboardInterrupt

    assert run_scenario(sc, out, progress=lambda line: None, on_round=stop)["status"] == "interrupted"
    assert (out / "checkpoint.json").is_file()
    return out


def checkpoint_file(out: Path, name: str) -> Path:
    return out / json.loads((out / "checkpoint.json").read_text())["folder"] / name


# --------------------------------------------------------------------------- deleting only what raymvc wrote
def test_overwrite_never_empties_a_folder_raymvc_did_not_make(tmp_path, capsys):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "notes.txt").write_text("notes")
    (proj / "src" / "code.py").write_text("print(1)")
    (proj / "scenario.yaml").write_text("x: 1")  # looks like a run folder, but raymvc did not make it
    before = files(proj)
    err = one_line_error(capsys, ["run", str(QUICK), *LOCAL, "--out", str(proj), "--overwrite"])
    assert f"--out {proj}: not a run folder" in err
    assert files(proj) == before and not (proj / LOCK).exists() and not (proj / MARKER).exists()


def test_overwrite_removes_only_the_files_a_run_writes(tmp_path):
    out = stopped_run(tmp_path / "r")
    (out / "notes.txt").write_text("mine")
    (out / "errors.log").write_text("of the run before")
    assert folder_kind(out) == "run"
    assert main(["run", str(QUICK), *LOCAL, "--set", "seed=5", "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "errors.log").exists() and not (out / "checkpoint.json").exists()
    assert not list(out.glob(".checkpoint-*"))
    assert json.loads((out / "summary.json").read_text())["seed"] == 5


# --------------------------------------------------------------------------- one run or sweep per folder
HOLD = """
import sys
from raymvc.results.folder import OutputFolder
with OutputFolder(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_a_folder_held_by_another_process_is_refused_at_once(tmp_path, capsys, kind):
    out = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out), kind], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cmd = (["run", str(QUICK), *LOCAL, "--out", str(out), "--overwrite"] if kind == "run"
               else ["sweep", str(QUICK), *LOCAL, "--out", str(out)])
        err = one_line_error(capsys, cmd)
        assert "another raymvc run or sweep is writing into this folder" in err
        assert sorted(os.listdir(out)) == sorted([LOCK, MARKER])  # the second one wrote nothing
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert main(["run", str(QUICK), *LOCAL, "--out", str(out)] if kind == "run"
                else ["sweep", str(QUICK), *LOCAL, "--out", str(out)]) == 0  # free again once released


def test_a_second_run_during_a_run_is_refused_before_anything(tmp_path):
    out = tmp_path / "r"
    sc = load_scenario(str(QUICK), ["runtime.backend=local", "params.max_rounds=3"])
    second: list[str] = []

    def during(record):
        if record["round"] == 0:
            with pytest.raises(ScenarioError) as e:
                run_scenario(sc, out, progress=lambda line: None, overwrite=True)
            second.append(str(e.value))

    assert run_scenario(sc, out, progress=lambda line: None, on_round=during)["status"] == "completed"
    assert second and "another raymvc run or sweep is writing into this folder" in second[0]


def test_sweep_and_run_folders_are_not_interchangeable(tmp_path, capsys):
    run_dir = tmp_path / "run1"
    assert main(["run", str(QUICK), *LOCAL, "--out", str(run_dir)]) == 0
    before = files(run_dir)
    err = one_line_error(capsys, ["sweep", str(QUICK), *LOCAL, "--out", str(run_dir)])
    assert "is a raymvc run folder; a sweep needs a folder of its own" in err
    assert files(run_dir) == before
    sweep_dir = tmp_path / "sw"
    assert main(["sweep", str(QUICK), *LOCAL, "--out", str(sweep_dir)]) == 0
    capsys.readouterr()
    before = files(sweep_dir)
    err = one_line_error(capsys, ["run", str(QUICK), *LOCAL, "--out", str(sweep_dir), "--overwrite"])
    assert "is a raymvc sweep folder; a run needs a folder of its own" in err
    assert files(sweep_dir) == before


# --------------------------------------------------------------------------- links
def test_a_linked_out_folder_is_one_line(tmp_path, capsys):
    real = tmp_path / "real"
    assert main(["run", str(QUICK), *LOCAL, "--out", str(real)]) == 0
    before = files(real)
    (tmp_path / "link").symlink_to(real)
    err = one_line_error(capsys, ["run", str(QUICK), *LOCAL, "--out", str(tmp_path / "link"), "--overwrite"])
    assert "is a symbolic link" in err
    err = one_line_error(capsys, ["sweep", str(QUICK), *LOCAL, "--out", str(tmp_path / "link")])
    assert "is a symbolic link" in err
    assert files(real) == before


def test_resume_replaces_a_linked_result_file_instead_of_writing_through_it(tmp_path, capsys):
    out = stopped_run(tmp_path / "r")
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (out / "labels.csv").unlink()
    (out / "labels.csv").symlink_to(outside)
    (out / "summary.json").unlink()
    (out / "summary.json").symlink_to(outside)
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert outside.read_text() == "precious"
    assert not (out / "labels.csv").is_symlink() and (out / "labels.csv").read_text().startswith("sample,cluster")
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    (out / "summary.json").rename(tmp_path / "summary.json")
    (out / "summary.json").symlink_to(tmp_path / "summary.json")
    err = one_line_error(capsys, ["report", str(out)])
    assert "summary.json: is a symbolic link" in err


def test_resume_refuses_linked_checkpoint_files_and_rounds(tmp_path, capsys):
    out = stopped_run(tmp_path / "r")
    node = checkpoint_file(out, "node.bin")
    copy = tmp_path / "node-copy.bin"
    copy.write_bytes(node.read_bytes())  # same bytes, so the checksum alone would pass
    node.unlink()
    node.symlink_to(copy)
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert err.startswith(f"error: --resume {out}: ") and "node.bin: is a symbolic link" in err
    node.unlink()
    copy.rename(node)
    rounds = (out / "rounds.jsonl").read_text()
    elsewhere = tmp_path / "rounds-elsewhere.jsonl"
    elsewhere.write_text(rounds)
    (out / "rounds.jsonl").unlink()
    (out / "rounds.jsonl").symlink_to(elsewhere)
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "rounds.jsonl: is a symbolic link" in err
    assert elsewhere.read_text() == rounds


# --------------------------------------------------------------------------- checkpoints: plain data, checked
CLOSER = "raymvc.bench.timed:tempfile._TemporaryFileCloser"  # deletes the file it names when collected


def _closer(file, name, delete) -> dict:
    return {"obj": CLOSER, "attrs": {"dict": [["file", file], ["name", name], ["delete", delete]]}}


def _with_tree(data: bytes, edit) -> bytes:
    """The state frame ``data`` with its description changed by ``edit(tree)``."""
    msg = codec.decode(data)
    tree = json.loads(msg["tree"].tobytes())
    edit(tree)
    return codec.encode(Message("state", {**msg.fields,
                                          "tree": np.frombuffer(json.dumps(tree).encode(), dtype=np.uint8)}))


def _plant(data: bytes, victim: Path, name: str = "evil") -> bytes:
    """A state frame with an extra attribute naming an object that deletes ``victim``."""
    return _with_tree(data, lambda t: t["dict"].append([name, _closer(_closer(None, "x", False), str(victim), True)]))


def _reseal(out: Path, edit) -> None:
    """Edit ``checkpoint.json`` as a forger who recomputes its own checksum would."""
    pointer = out / "checkpoint.json"
    meta = json.loads(pointer.read_text())
    edit(meta)
    meta["meta_sha256"] = checkpoint.seal_sum(meta)
    pointer.write_text(json.dumps(meta))


def _rewrite_sum(out: Path, name: str) -> None:
    _reseal(out, lambda meta: meta["sha256"].__setitem__(
        name, hashlib.sha256(checkpoint_file(out, name).read_bytes()).hexdigest()))


def test_a_tampered_checkpoint_is_refused_and_builds_nothing(tmp_path, capsys):
    out = stopped_run(tmp_path / "r")
    victim = tmp_path / "outside.txt"
    victim.write_text("keep me")
    node = checkpoint_file(out, "node.bin")
    node.write_bytes(_plant(node.read_bytes(), victim))
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert err.startswith(f"error: --resume {out}: ") and "node.bin: changed since the run wrote it" in err
    assert victim.exists()
    # with the checksum rewritten too: the engine's state holds no such attribute, refused
    # before anything in the folder changes
    _rewrite_sum(out, "node.bin")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "it sets 'evil', which a checkpoint never holds" in err
    gc.collect()
    assert victim.read_text() == "keep me"
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # planted in the protocol server's state (an attribute a protocol may have), the object
    # is still never built, and the refused resume writes no summary
    server = checkpoint_file(out, "server.bin")
    node_ok = stopped_run(tmp_path / "r2")
    node.write_bytes(checkpoint_file(node_ok, "node.bin").read_bytes())
    _rewrite_sum(out, "node.bin")
    server.write_bytes(_plant(server.read_bytes(), victim))
    _rewrite_sum(out, "server.bin")
    summary = (out / "summary.json").read_bytes()  # the interrupted run's
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert f"refusing to build a {CLOSER}" in err
    gc.collect()
    assert victim.read_text() == "keep me" and (out / "summary.json").read_bytes() == summary


def test_injected_engine_state_is_refused_before_the_folder_changes(tmp_path, capsys):
    out = stopped_run(tmp_path / "r")
    node = checkpoint_file(out, "node.bin")
    node.write_bytes(_with_tree(node.read_bytes(), lambda t: t["dict"].append(["min_clients", {"int": "0"}])))
    _rewrite_sum(out, "node.bin")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert err.startswith(f"error: --resume {out}: ") and "'min_clients'" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_checkpoint_of_other_code_is_refused(tmp_path, capsys):
    out = stopped_run(tmp_path / "r")
    pointer = out / "checkpoint.json"
    _reseal(out, lambda meta: meta.__setitem__("code_version", "0" * 64))
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert err.startswith(f"error: --resume {out}: ") and "another version of raymvc or of the method" in err
    pointer.write_text("{not json")
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "checkpoint.json: corrupt" in err


# --------------------------------------------------------------------------- a resume is the run that stopped
def _edited(out: Path, edit) -> None:
    import yaml

    raw = yaml.safe_load((out / "scenario.yaml").read_text())
    edit(raw)
    (out / "scenario.yaml").write_text(yaml.safe_dump(raw))


@pytest.mark.parametrize("what, edit", [
    ("seed", lambda raw: raw.__setitem__("seed", 7)),
    ("params", lambda raw: raw.setdefault("params", {}).__setitem__("max_rounds", 9)),
    ("faults", lambda raw: raw["faults"].__setitem__("dropout", {"rate": 0.3})),
])
def test_resume_refuses_an_edited_scenario_before_the_folder_changes(tmp_path, capsys, what, edit):
    out = stopped_run(tmp_path / "r")
    _edited(out, edit)
    before = files(out)
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert err.startswith(f"error: --resume {out}: ") and "changed since it started" in err, what
    assert files(out) == before  # the interrupted run's summary and rounds stay as they were


def test_resume_refuses_a_changed_trace_file(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("client,start_s,end_s\n" + "".join(f"{c},0,1e9\n" for c in range(6)))
    out = stopped_run(tmp_path / "r", ["faults.availability.model=trace", f"faults.availability.path={trace}"])
    trace.write_text(trace.read_text() + "0,2e9,3e9\n")
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "changed since it started" in err


def test_checkpoint_json_is_checked_as_a_whole(tmp_path, capsys):
    out = stopped_run(tmp_path / "r")
    pointer = out / "checkpoint.json"
    meta = json.loads(pointer.read_text())
    edited = {**meta, "rounds_logged": 1, "folder": ".checkpoint-1"}  # the earlier rounds would be dropped
    pointer.write_text(json.dumps(edited))
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "checkpoint.json: changed since the run wrote it (its own SHA-256 differs)" in err
    # resealed by a forger: the folder no longer matches, and the rounds are not the ones covered
    pointer.write_text(json.dumps(meta))
    _reseal(out, lambda m: m.update(rounds_logged=1, folder=".checkpoint-1"))
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "missing, or not a folder" in err or "rounds" in err
    pointer.write_text(json.dumps(meta))
    _reseal(out, lambda m: m.update(rounds_sha256="0" * 64))
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "rounds.jsonl: its first" in err
    # a client taken out of the checkpoint would restart from fresh state: refused
    pointer.write_text(json.dumps(meta))
    _reseal(out, lambda m: (m["clients"].remove(2), m["sha256"].pop("client-2.bin")))
    summary = (out / "summary.json").read_bytes()
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "client 2: no state in the checkpoint" in err
    assert (out / "summary.json").read_bytes() == summary
    pointer.write_text(json.dumps(meta))  # and the untouched checkpoint still resumes
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    rounds = [json.loads(line)["round"] for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert rounds == list(range(len(rounds))) and rounds[-1] >= 3  # every round, the early ones kept


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def test_forged_checkpoints_nested_deep_or_with_negative_bytes_are_one_line(tmp_path, capsys):
    out = stopped_run(tmp_path / "r")
    node = checkpoint_file(out, "node.bin")
    original = node.read_bytes()
    node.write_bytes(codec.encode(Message("state", {**codec.decode(original).fields, "tree": np.frombuffer(
        ('{"dict": [["round", ' + _deep(100_000) + ']]}').encode(), dtype=np.uint8)})))
    _rewrite_sum(out, "node.bin")
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "levels deep" in err
    node.write_bytes(original)
    _rewrite_sum(out, "node.bin")
    ledger = checkpoint_file(out, "ledger.bin")
    good = ledger.read_bytes()
    fields = dict(codec.decode(good).fields)
    for bad, expect in [({"vocab": np.frombuffer(_deep(100_000).encode(), dtype=np.uint8)}, "levels deep"),
                        ({"wire_bytes": -np.abs(fields["wire_bytes"]) - 1}, "negative byte count")]:
        ledger.write_bytes(codec.encode(Message("ledger", {**fields, **bad})))
        _rewrite_sum(out, "ledger.bin")
        err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
        assert err.startswith(f"error: --resume {out}: ") and expect in err


class _Party:
    def __init__(self):
        self.ledger = Ledger()
        self.ledger.record(round=0, src="server", dst="client:0", kind="m", path="protocol", payload_bytes=3,
                           wire_bytes=5, send_t=0.0)
        self.rows = [LedgerRow(1, "client:0", "server", "r", "protocol", 1, 2, 0.5)]
        self.sizes = {0: 3}


def test_state_objects_come_back_only_into_fresh_objects_or_as_registered_plain_data(tmp_path):
    data = dump_state(_Party())
    fresh = _Party.__new__(_Party)
    fresh.ledger = Ledger()
    load_state(fresh, data)
    assert fresh.ledger.rows == _Party().ledger.rows and fresh.rows == _Party().rows and fresh.sizes == {0: 3}
    victim = tmp_path / "outside.txt"
    victim.write_text("keep me")
    with pytest.raises(StateError, match="refusing to build"):
        load_state(_Party(), _plant(data, victim))
    gc.collect()
    assert victim.exists()
    with pytest.raises(StateError, match="not an attribute name"):
        load_state(_Party(), _with_tree(data, lambda t: t["dict"].append(["__class__", None])))
    with pytest.raises(StateError, match="'sizes', which is not state"):
        load_state(_Party(), data, only=("ledger", "rows"))  # only declared state comes back


def test_a_long_ledger_checkpoints_as_columns_and_comes_back_row_for_row():
    """A server's checkpoint holds its ledger; 20,000 rows (a 10-client run of ~1000 rounds)
    once outgrew the codec's 1 MB header, and encoding it object by object every round
    made a 400-round checkpointed run spend 99% of its time checkpointing. It travels
    as a few columns now, apart from the engine's other state."""
    from raymvc.runtime.nodes import decode_ledger, encode_ledger

    ledger = Ledger()
    statuses = ("delivered", "dropped", "late", "rejected", "lost")
    for r in range(20_000):
        ledger.record(round=r // 20 - 1, src="server" if r % 2 else f"client:{r % 10}", dst=f"client:{r % 7}",
                      kind=f"kind{r % 3}", path=("protocol", "eval", "setup")[r % 3], payload_bytes=r,
                      wire_bytes=r + 40, data_bytes=r // 2, send_t=r / 7, arrive_t=None if r % 5 == 0 else r / 3,
                      status=statuses[r % 5])
    data = encode_ledger(ledger)
    back = decode_ledger(data)
    assert back.rows == ledger.rows and back.csv_text() == ledger.csv_text()
    assert all(type(x.round) is int and type(x.send_t) is float for x in back.rows[:50])
    assert len(data) < 100 * len(ledger)  # about 90 bytes a row
    assert decode_ledger(encode_ledger(Ledger())).rows == []
    for bad in (codec.encode(Message("ledger", {"vocab": np.zeros(3, dtype=np.uint8)})), b"junk",
                codec.encode(Message("state", ledger.to_columns()))):
        with pytest.raises(StateError, match="ledger.bin: "):
            decode_ledger(bad)
    cols = ledger.to_columns()
    cols["status"] = cols["status"] + 1000  # a code outside the vocabulary
    with pytest.raises(StateError, match="outside its vocabulary"):
        decode_ledger(codec.encode(Message("ledger", cols)))


def test_a_checkpoints_engine_state_does_not_hold_the_ledger(tmp_path, capsys):
    from raymvc.runtime.nodes import decode_ledger
    from raymvc.runtime.state import state_names

    out = stopped_run(tmp_path / "r")
    assert "ledger" not in state_names(checkpoint_file(out, "node.bin").read_bytes())
    rows = decode_ledger(checkpoint_file(out, "ledger.bin").read_bytes()).rows
    assert rows and {x.round for x in rows} >= {-1, 0, 1}
    # a ledger of the wrong shape, its checksum rewritten: one line, the folder as it was
    ledger = checkpoint_file(out, "ledger.bin")
    ledger.write_bytes(codec.encode(Message("ledger", {"round": np.zeros(2, dtype=np.int64)})))
    _rewrite_sum(out, "ledger.bin")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert err.startswith(f"error: --resume {out}: ") and "ledger.bin: not a ledger" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


# --------------------------------------------------------------------------- a full disk
def _full_disk_for(marker: bytes):
    """A low-level writer that writes half of a file starting with ``marker``, then fails: disk full."""
    real = results._write_all

    def write_all(fd: int, data: bytes) -> None:
        if data.startswith(marker):
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    return write_all


def test_a_full_disk_keeps_the_file_before(tmp_path, monkeypatch):
    w = RunWriter(tmp_path / "r")
    w.summary({"status": "interrupted", "rounds": 2})
    before = (tmp_path / "r" / "summary.json").read_bytes()
    monkeypatch.setattr(results, "_write_all", _full_disk_for(b"{"))
    with pytest.raises(ResultsError, match="summary.json: cannot write \\(No space left on device\\)"):
        w.summary({"status": "completed", "rounds": 9})
    w.close()
    assert (tmp_path / "r" / "summary.json").read_bytes() == before
    assert sorted(os.listdir(tmp_path / "r")) == ["rounds.jsonl", "summary.json"]  # no temporary file left


def test_a_full_disk_at_the_end_of_a_run_is_one_line_and_keeps_the_summary_before(tmp_path, capsys, monkeypatch):
    out = stopped_run(tmp_path / "r")
    before = (out / "summary.json").read_bytes()
    monkeypatch.setattr(results, "_write_all", _full_disk_for(b'{\n  "name"'))  # the summary
    err = one_line_error(capsys, ["run", "--resume", str(out), "--quiet"])
    assert "summary.json: cannot write (No space left on device)" in err
    assert (out / "summary.json").read_bytes() == before
    assert (out / "checkpoint.json").exists()  # not finished: it can still be resumed
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_output_folder_leaves_a_refused_folder_as_it_was(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_text("x")
    with pytest.raises(ResultsError, match="not a sweep folder"):
        OutputFolder(d, "sweep")
    assert os.listdir(d) == ["x"]
    with OutputFolder(tmp_path / "new", "sweep") as p:
        assert folder_kind(p) == "sweep"
        with pytest.raises(ResultsError, match="another raymvc run or sweep"):
            OutputFolder(p, "sweep")
    with OutputFolder(tmp_path / "new", "sweep"):  # released
        pass
    with pytest.raises(ResultsError, match="no such folder"):
        OutputFolder(tmp_path / "gone", "run", resume=True)
    assert not (tmp_path / "gone").exists()


def test_a_run_folder_swapped_for_a_link_mid_run_is_not_followed(tmp_path):
    """`mv out out.real; ln -s victim out` while the run is in round 1: every file still
    goes into the folder the run opened, none through the link."""
    import subprocess

    from gated_run import GatedRun

    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    with GatedRun(["run", str(QUICK), "--backend", "local", "--out", str(out), "--quiet"], at_round=1,
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as run:
        run.wait_ready()
        out.rename(tmp_path / "out.real")
        out.symlink_to(victim, target_is_directory=True)
        run.go()
        assert run.proc.wait(timeout=300) == 0
    assert list(victim.iterdir()) == []
    real = tmp_path / "out.real"
    assert {"summary.json", "labels.csv", "messages.csv", "rounds.jsonl"} <= {p.name for p in real.iterdir()}


def test_run_folder_reads_back_what_the_run_wrote(tmp_path):
    import ast

    import raymvc
    from raymvc.results.runfolder import RunFolder
    from raymvc.results.summary import RunSummary

    s = run_scenario(load_scenario(QUICK, {"runtime.backend": "local", "params.max_rounds": 3}), tmp_path / "r",
                     progress=lambda line: None)
    assert isinstance(s, RunSummary) and s.status == "completed" and s["out_dir"] == str(tmp_path / "r")
    run = RunFolder(tmp_path / "r")
    assert run.summary() == s and run.summary().to_dict() == json.loads((tmp_path / "r" / run.SUMMARY).read_text())
    y = run.labels()
    assert y.dtype == np.int64 and len(y) == s["n_samples"] and (y >= 0).all()
    assert run.labels_sha256() == hashlib.sha256((tmp_path / "r" / run.LABELS).read_bytes()).hexdigest()
    assert [r.round for r in run.rounds()] == list(range(s.rounds))
    ledger = run.ledger()
    assert len(ledger) == sum(s[k]["messages"] for k in ("communication", "communication_eval", "communication_setup"))
    assert all(isinstance(m["wire_bytes"], int) for m in ledger)
    assert run.scenario()["name"] == s.name
    # a cell that never ran: its summary alone, read back as a typed record
    RunFolder(tmp_path / "never").write_summary(RunSummary.failed("x", "cefmc", 4, "no worker", tmp_path / "never", "f"))
    again = RunFolder(tmp_path / "never")
    assert again.has_summary() and again.summary().status == "failed" and again.labels().size == 0
    assert again.rounds() == [] and again.ledger() == []
    # corrupt or linked files are one-line errors, never read through
    (tmp_path / "r" / run.LABELS).write_text("sample,cluster\n0,zero\n")
    with pytest.raises(ResultsError, match="labels.csv: corrupt"):
        run.labels()
    (tmp_path / "r" / run.ROUNDS).unlink()
    (tmp_path / "r" / run.ROUNDS).symlink_to(tmp_path / "never" / run.SUMMARY)
    with pytest.raises(ResultsError, match="symbolic link"):
        run.rounds()
    # files of the wrong shape or encoding are ResultsErrors too, never AttributeError or UnicodeDecodeError
    (tmp_path / "r" / run.ROUNDS).unlink()
    (tmp_path / "r" / run.ROUNDS).write_text('{"round": 0}\n[1, 2]\n')
    with pytest.raises(ResultsError, match="corrupt line 2"):
        run.rounds()
    (tmp_path / "r" / run.LABELS).write_bytes(b"sample,cluster\n0,\xff\xfe\n")
    with pytest.raises(ResultsError, match="not UTF-8"):
        run.labels()
    for bad in ({"communication": 5}, {"metrics": [1]}, {"seed": "x"}, {"errors": "abc"},
                {"communication": {"mb_total": "big"}}, {"faults": {"crashed_clients": 5}}, {"platform": "linux"},
                {"communication": {"mb_total": {"a": 1}}}, {"timing": {"wall_s": {"a": 1}}},
                {"faults": {"dropped_replies": {"a": 1}}}, {"faults": {"crashed_clients": {"a": 1}}}):
        (tmp_path / "r" / run.SUMMARY).write_text(json.dumps({**s.to_dict(), **bad}))
        with pytest.raises(ResultsError, match="not a run summary"):
            run.summary()
    (tmp_path / "r" / run.MESSAGES).write_text("round,src\n0,server,extra,fields\n")
    with pytest.raises(ResultsError, match="messages.csv: corrupt"):
        run.ledger()
    (tmp_path / "r" / run.LABELS).write_text("sample,cluster\n0," + "9" * 200_000 + "\n")
    with pytest.raises(ResultsError, match="labels.csv: corrupt"):
        run.labels()
    (tmp_path / "r" / run.ROUNDS).write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ResultsError, match="corrupt line 1"):
        run.rounds()
    # the file names live in raymvc.results.folder alone: every other module goes through RunFolder
    names = {run.SUMMARY, run.ROUNDS, run.MESSAGES, run.SCENARIO, run.LABELS, run.ERRORS}
    pkg = Path(raymvc.__file__).resolve().parent
    for path in [*pkg.rglob("*.py"), *(REPO / "raymvc_reports").rglob("*.py")]:
        if path.name == "folder.py" and path.parent == pkg / "results":
            continue
        literal = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)]
        assert not names.intersection(literal), path
