"""Records that verify themselves (raymvc.study.records, ``raymvc verify``): a record keeps
each row's labels, every number a row states is computed again from them, and only rows
made from a commit that declares their study's seeds (or legacy rows the legacy file
vouches for) enter a page."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import commit_all, git
from test_study_files import SCENARIO

from raymvc.cli import main
from raymvc.results.runfolder import RunFolder
from raymvc.study.files import load_study
from raymvc.study.records import (
    check_record,
    decode_labels,
    encode_labels,
    labels_sha256,
    read_labels_store,
)
from raymvc_reports.pages import write_pages

STUDY = """study:
  paper: kfed
  title: Verified records
  seeds: 0-2
  runs:
    - {id: paper, label: k-FED, scenario: ../tiny.yaml}
"""


def test_labels_travel_compactly_and_hash_as_labels_csv(tmp_path):
    for y in (np.array([0, 2, -1, 1, 1]), np.arange(-1, 300), np.array([], dtype=np.int64), np.full(70_000, 65_600)):
        code = encode_labels(y)
        assert code.split(":")[0] == ("u1" if y.size == 0 or y.max() < 255 else "u2" if y.max() < 65_535 else "u4")
        assert np.array_equal(decode_labels(code), y)
    y = np.array([3, 0, -1, 2])
    from raymvc.results.folder import RunWriter

    w = RunWriter(tmp_path / "r")
    w.labels(y, 4)
    w.close()
    assert labels_sha256(y) == RunFolder(tmp_path / "r").labels_sha256()
    big = encode_labels(np.zeros(1000, dtype=np.int64))
    for bad in ("u3:4:AAAA", "u1:99999999999:AAAA", "u1:4:!!!", big.replace(":1000:", ":999:"), "u1:4:" + big[8:]):
        with pytest.raises(ValueError):
            decode_labels(bad)


@pytest.fixture
def swept(tmp_path, monkeypatch):
    """A committed three-seed k-FED study, swept and written to its record and page."""
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "s.yaml").write_text(STUDY)
    commit_all(tmp_path)  # declares seeds 0-2
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "studies/s.yaml", "--quiet"]) == 0
    write_pages(tmp_path / "studies", tmp_path / "runs" / "studies")
    shutil.rmtree(tmp_path / "runs")  # pages regenerate from the record alone
    return tmp_path


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def test_a_record_keeps_its_labels_and_verify_recomputes_every_row(swept, capsys):
    record = swept / "studies" / "results" / "s.csv"
    rows = _rows(record)
    codes = read_labels_store(record.with_suffix(".labels"))
    assert len(rows) == 3 and len(codes) == 3
    assert {r["arithmetic"] for r in rows} == {"pinned"}  # the record says how its numbers were computed
    for r in rows:
        assert labels_sha256(decode_labels(codes[(r["cell"], r["fingerprint"])])) == r["labels_sha256"]
    assert main(["verify", "studies"]) == 0
    assert capsys.readouterr().out.strip() == "s: 3 rows admitted (3 recomputed from their labels)"
    page = (swept / "studies" / "kfed.md").read_text()
    assert "Recomputed from their stored labels (`raymvc verify studies`): 3 of the 3 rows used here." in page


def test_an_edited_number_is_refused_by_verify_and_left_out_of_the_page(swept, capsys):
    record = swept / "studies" / "results" / "s.csv"
    rows = _rows(record)
    page_before = (swept / "studies" / "kfed.md").read_text()
    true_acc = rows[1]["acc"]
    rows[1]["acc"] = "0.999"
    _write(record, rows)
    assert main(["verify", "studies"]) == 1
    out = capsys.readouterr().out
    assert "s: 2 rows admitted (2 recomputed from their labels); 1 REFUSED" in out
    assert f"refused: s paper seed 1: acc 0.999 recorded, {float(true_acc)!r} from its labels" in out
    write_pages(swept / "studies", swept / "runs")
    page = (swept / "studies" / "kfed.md").read_text()
    assert "0.999" not in page.split("Refused:")[0] and page != page_before
    assert "| k-FED | paper | 2/2 |" in page  # the refused row is not one of the runs used
    assert "Refused: paper seed 1 (acc 0.999 recorded" in page
    # a labels hash that is not that of the stored labels is refused the same way
    rows[1]["acc"] = true_acc
    rows[2]["labels_sha256"] = "0" * 64
    _write(record, rows)
    assert main(["verify", "studies"]) == 1
    assert "seed 2: labels_sha256 is not the hash of its stored labels" in capsys.readouterr().out


def test_rows_with_a_moved_or_blank_commit_are_listed_apart(swept, capsys):
    record = swept / "studies" / "results" / "s.csv"
    rows = _rows(record)
    first = git(swept, "rev-list", "--max-parents=0", "HEAD")
    (swept / "notes.txt").write_text("later work\n")
    git(swept, "add", "notes.txt")
    git(swept, "commit", "-q", "-m", "later")
    # seed 0 "ran" before the study was declared: its study file changes after it
    (swept / "studies" / "s.yaml").write_text(STUDY.replace("Verified records", "Verified records, renamed"))
    git(swept, "commit", "-q", "-am", "the study file changes after its runs")
    rows[1]["seeds_commit"] = rows[1]["head_commit"] = ""  # seed 1: commits blanked
    _write(record, rows)
    st = load_study(swept / "studies" / "s.yaml")
    res = check_record(st, swept / "studies")
    assert [r["seed"] for r in res.admitted] == []  # every row now predates the declaring commit or has none
    assert sorted((r["seed"], why) for r, why, _ in res.apart) == [("0", "before"), ("1", "not recorded"),
                                                                   ("2", "before")]
    assert first  # the checkout has history for is-ancestor
    write_pages(swept / "studies", swept / "runs")
    page = (swept / "studies" / "kfed.md").read_text()
    assert ("Left out of every mean, table and sentence: 2 ran before the commit that declares the study's seeds; "
            "1 no commit recorded (and not a legacy row of this study).") in page
    assert "| k-FED | paper | 0/0 | n/a |" in page


def test_a_legacy_row_is_used_only_where_the_old_record_holds_it_unchanged(swept):
    studies = swept / "studies"
    record = studies / "results" / "s.csv"
    rows = _rows(record)
    for r in rows:  # a record as it was before cells named their commits
        r["seeds_commit"] = r["head_commit"] = ""
    _write(record, rows)
    git(swept, "add", "studies/results/s.csv")
    git(swept, "commit", "-q", "-m", "an old record")
    old = git(swept, "rev-parse", "HEAD")
    git(swept, "commit", "-q", "--allow-empty", "-m", "records name their commits from here on")
    scheme = git(swept, "rev-parse", "HEAD")
    st = load_study(studies / "s.yaml")
    assert len(check_record(st, studies).admitted) == 0  # no legacy file: blank commits stay out
    (studies / "results" / "legacy.yaml").write_text(
        f"scheme_commit: {scheme}\nstudies:\n  s: recorded before cell records named the commits they ran at\n")
    res = check_record(st, studies)
    assert res.legacy == 3 and len(res.admitted) == 3 and old
    rows[0]["acc"], rows[0]["labels_sha256"] = "0.5", "1" * 64  # not the row the old record holds
    _write(record, rows)
    (record.with_suffix(".labels")).unlink()  # nothing to recompute: only the old record can tell
    res = check_record(st, studies)
    assert res.legacy == 2 and [(r["seed"], why) for r, why, _ in res.apart] == [("0", "not recorded")]
    (studies / "results" / "legacy.yaml").write_text(f"scheme_commit: {scheme}\nstudies:\n  s: old\n")
    with pytest.raises(Exception, match="give the reason in a sentence"):
        check_record(st, studies, None)


def test_rows_of_seeds_the_study_no_longer_declares_are_listed_not_dropped(swept):
    studies = swept / "studies"
    (studies / "s.yaml").write_text(STUDY.replace("seeds: 0-2", "seeds: 0-1"))
    st = load_study(studies / "s.yaml")
    res = check_record(st, studies)
    assert [(r["seed"], why) for r, why, _ in res.apart if why == "seed"] == [("2", "seed")]


def test_every_committed_record_verifies():
    """The repository's own records: no row's numbers differ from its stored labels."""
    assert main(["verify", str(Path(__file__).resolve().parent.parent / "studies")]) == 0


def test_a_number_that_is_no_score_is_refused_even_without_labels(swept):
    """ACC 1e308 in a record gave "nan%" and "inf ± inf" on the page."""
    record = swept / "studies" / "results" / "s.csv"
    rows = _rows(record)
    rows[0]["acc"] = "1e308"
    _write(record, rows)
    record.with_suffix(".labels").unlink()
    res = check_record(load_study(swept / "studies" / "s.yaml"), swept / "studies")
    assert [(r["seed"], why, detail) for r, why, detail in res.apart] == \
        [("0", "refused", "acc 1e308 is not a score (outside [0, 1])")]


def test_a_row_made_since_records_keep_labels_must_have_them(swept):
    """Deleting a row's line from the labels file would otherwise pass it as an old row."""
    studies = swept / "studies"
    record = studies / "results" / "s.csv"
    first = git(swept, "rev-list", "--max-parents=0", "HEAD")
    (studies / "results" / "legacy.yaml").write_text(f"scheme_commit: {first}\nlabels_commit: {first}\nstudies: {{}}\n")
    st = load_study(studies / "s.yaml")
    assert len(check_record(st, studies).admitted) == 3
    lines = record.with_suffix(".labels").read_text().splitlines()
    record.with_suffix(".labels").write_text("\n".join(lines[:-1]) + "\n")  # one row's labels gone
    res = check_record(st, studies)
    assert len(res.admitted) == 2 and [(why, d) for _, why, d in res.apart] == \
        [("refused", "its labels are not stored beside the record")]
    (studies / "results" / "legacy.yaml").write_text(f"scheme_commit: {first}\nlabels_commit: --output=x\nstudies: {{}}\n")
    with pytest.raises(Exception, match="labels_commit: a full commit hash"):
        check_record(st, studies, None)


def test_rows_whose_scenario_file_changed_after_they_ran_are_listed_apart(swept):
    """The cell digest names the scenario file, not what it holds: after an edit of its data
    set or params every old row was still read as one of the study's cells."""
    studies = swept / "studies"
    st = load_study(studies / "s.yaml")
    tiny = swept / "tiny.yaml"
    # comments and where the parts run change no result: the rows stay in
    tiny.write_text("# a comment\n" + SCENARIO.replace("runtime: {backend: local}", "runtime: {backend: local, threads: 1}"))
    commit_all(swept)
    assert len(check_record(st, studies).admitted) == 3
    tiny.write_text(SCENARIO.replace("n_samples: 150", "n_samples: 180"))  # another data set, uncommitted
    res = check_record(st, studies)
    assert res.admitted == [] and {why for _, why, _ in res.apart} == {"scenario"}
    assert all(detail.startswith("tiny.yaml is not what it was at ") for _, _, detail in res.apart)
    commit_all(swept)  # committed, the same
    assert [why for _, why, _ in check_record(st, studies).apart] == ["scenario"] * 3
    write_pages(studies, swept / "runs")
    page = (studies / "kfed.md").read_text()
    assert "3 a scenario or side file its run names changed after it ran" in page
