"""Reading back run, sweep and study files that were edited or forged: one line, never a
traceback, and no folder outside the sweep's is read."""

from __future__ import annotations

import csv

import pytest

from raymvc.cli import main
from raymvc.safeio import SafeReadError, confined, csv_rows, json_depth, json_loads, within
from raymvc_reports.pages import _read_record, _run_facts
from tests.test_sweep import tiny


def test_json_depth_skips_strings_and_bounds_the_parse():
    assert json_depth('{"a": [1, {"b": "[[[["}]}') == 3
    assert json_loads('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(SafeReadError, match="nested 100000 levels deep"):
        json_loads("[" * 100_000 + "]" * 100_000, what="x.json")
    with pytest.raises(SafeReadError, match="not UTF-8"):
        json_loads(b'{"a": "\xff"}')
    with pytest.raises(SafeReadError, match="not valid JSON"):
        json_loads("{nope")


def test_csv_rows_name_the_row_that_is_wrong():
    assert csv_rows("a,b\n1,2\n\n3,4\n") == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]
    with pytest.raises(SafeReadError, match="line 3 has 1 fields, the header 2"):
        csv_rows("a,b\n1,2\n3\n")
    with pytest.raises(SafeReadError, match="not a CSV table"):
        csv_rows("a,b\n" + "x" * 200 + ",1\n", max_field=100)
    with pytest.raises(SafeReadError, match="not UTF-8"):
        csv_rows(b"a,b\n\xff,1\n")
    with pytest.raises(SafeReadError, match="no 'run_dir' column"):
        csv_rows("a,b\n1,2\n", required=("run_dir",))


def test_confined_refuses_escapes_and_links(tmp_path):
    (tmp_path / "sweep" / "cell").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "sweep" / "link").symlink_to(tmp_path / "elsewhere")
    assert confined(tmp_path / "sweep", "cell") == tmp_path / "sweep" / "cell"
    for bad in ("../elsewhere", "/etc", "link", "link/x", ""):
        assert confined(tmp_path / "sweep", bad) is None, bad
    assert within(tmp_path / "sweep", tmp_path / "sweep" / "cell")
    assert not within(tmp_path / "sweep", tmp_path / "sweep" / "link")


@pytest.fixture
def swept(tmp_path):
    out = tmp_path / "sw"
    assert main(["sweep", str(tiny(tmp_path)), "--seeds", "0,1", "--out", str(out), "--quiet"]) == 0
    return out


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_report_and_plot_survive_a_deep_sweep_json(swept, capsys, tmp_path):
    (swept / "sweep.json").write_text("[" * 100_000 + "]" * 100_000)
    capsys.readouterr()
    assert main(["report", str(swept)]) == 0  # the grid keys come from sweep.csv instead
    assert main(["plot", str(swept)]) in (0, 2)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("damage, words", [
    (lambda text: text.replace("completed", "completed" + "x" * (2 << 20), 1), "not a CSV table"),
    (lambda text: text.encode().replace(b"completed", b"compl\xffted", 1), "not UTF-8"),
    (lambda text: text.rstrip("\n") + "\nshort,row\n", "fields, the header"),
])
def test_a_damaged_sweep_csv_is_one_line(swept, capsys, damage, words):
    bad = damage((swept / "sweep.csv").read_text())
    (swept / "sweep.csv").write_bytes(bad if isinstance(bad, bytes) else bad.encode())
    capsys.readouterr()
    assert main(["report", str(swept)]) == 2
    assert words in _one_line(capsys)


def test_page_facts_are_read_only_inside_the_sweep(swept, tmp_path):
    rows = list(csv.DictReader(open(swept / "sweep.csv", newline="")))
    assert _run_facts(swept, rows[0])["code_version"]  # its own folder: read
    foreign = tmp_path / "elsewhere" / "foreign"
    foreign.parent.mkdir()
    (swept / rows[0]["run_dir"]).rename(foreign)
    for run_dir in ("../elsewhere/foreign", str(foreign)):
        assert not any(_run_facts(swept, {**rows[0], "run_dir": run_dir}).values())
    (swept / rows[0]["run_dir"]).symlink_to(foreign)
    assert not any(_run_facts(swept, rows[0]).values())
    assert not any(_run_facts(swept, {k: v for k, v in rows[0].items() if k != "run_dir"}).values())


def test_a_short_row_in_a_record_is_one_error(tmp_path):
    from raymvc.results.folder import ResultsError

    record = tmp_path / "r.csv"
    record.write_text("study,scenario,seed,status\nx,a,0,completed\nx,a\n")
    with pytest.raises(ResultsError, match="line 3"):
        _read_record(record, type("S", (), {"name": "x"})())


def test_a_cell_folder_linked_to_a_run_elsewhere_is_not_reused(swept, tmp_path, capsys):
    """Not counted as this sweep's finished cell, and nothing is written through the link:
    the sweep stops with one line naming the folder."""
    rows = list(csv.DictReader(open(swept / "sweep.csv", newline="")))
    cell = swept / rows[0]["run_dir"]
    elsewhere = tmp_path / "elsewhere"
    cell.rename(elsewhere)
    cell.symlink_to(elsewhere)
    before = (elsewhere / "summary.json").read_bytes()
    capsys.readouterr()
    code = main(["sweep", str(tmp_path / "tiny.yaml"), "--seeds", "0,1", "--out", str(swept), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "reusing 2 of 2" not in err and "Traceback" not in err
    assert f"{cell}: is a symbolic link" in err
    assert (elsewhere / "summary.json").read_bytes() == before
