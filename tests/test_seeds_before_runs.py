"""Seeds before runs: a study file runs only from a commit that holds it unchanged, every
cell records that commit, and the pages say how the runs stand to it; README's row
carries a headline's second draw; pages say where a label hash holds."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import commit_all
from test_study_files import SCENARIO  # k-FED on synthetic blobs: a run takes a fraction of a second

from raymvc.cli import main
from raymvc.results.provenance import platform_text
from raymvc.scenario import ScenarioError
from raymvc.study.declared import check_committed
from raymvc.study.files import load_study
from raymvc_reports.pages import README_BEGIN, README_END, _row_cell, cell_digests, write_pages

ROOT = Path(__file__).resolve().parent.parent

STUDY = """study:
  paper: kfed
  title: Declared seeds
  seeds: 0-1
  runs:
    - {id: paper, label: k-FED, scenario: ../tiny.yaml}
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=raymvc tests", "-c", "user.email=tests@raymvc",
                           "-c", "commit.gpgsign=false", *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git checkout holding a committed scenario and a study file not yet added."""
    git(tmp_path, "init", "-q")
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "s.yaml").write_text(STUDY)
    git(tmp_path, "add", "tiny.yaml")
    git(tmp_path, "commit", "-q", "-m", "scenario")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def sweep(*extra: str) -> list[str]:
    return ["sweep", "studies/s.yaml", "--quiet", *extra]


def test_a_study_runs_only_from_a_commit_and_its_cells_name_it(repo, capsys):
    out = repo / "runs" / "studies" / "s"
    err = one_line_error(capsys, sweep())
    assert err == ("error: studies/s.yaml: not committed (git does not track it); commit the study file (its "
                   "seeds, grid and modes) before running it")
    git(repo, "add", "studies/s.yaml")  # staged is not committed
    assert one_line_error(capsys, sweep()) == ("error: studies/s.yaml: has uncommitted changes; commit the study "
                                               "file (its seeds, grid and modes) before running it")
    assert not out.exists()  # refused before anything ran
    git(repo, "commit", "-q", "-m", "declare seeds 0-1")
    declared = git(repo, "log", "-1", "--format=%H", "--", "studies/s.yaml")
    git(repo, "commit", "-q", "--allow-empty", "-m", "later work")  # the cells run at a later HEAD
    head = git(repo, "rev-parse", "HEAD")
    assert main(sweep()) == 0
    rows = list(csv.DictReader(open(out / "sweep.csv", newline="")))
    assert len(rows) == 2 and {r["status"] for r in rows} == {"completed"}
    for r in rows:
        summary = json.loads((out / r["run_dir"] / "summary.json").read_text())
        assert summary["study"] == {"file": "studies/s.yaml", "seeds_commit": declared, "head_commit": head}
    assert json.loads((out / "sweep.json").read_text())["study"]["seeds_commit"] == declared

    # the record names both commits, and the page says every run came after the seeds
    write_pages(repo / "studies", repo / "runs" / "studies")
    record = list(csv.DictReader(open(repo / "studies" / "results" / "s.csv", newline="")))
    assert [(r["seeds_commit"], r["head_commit"]) for r in record] == [(declared, head)] * 2
    page = (repo / "studies" / "kfed.md").read_text()
    assert f"Seeds declared in `{declared[:7]}` (the study file's last commit: its seeds, grid and modes); " \
           "all 2 runs ran at or after it." in page

    # an edit after the commit is refused, staged or not, and so is an edit of a scenario it names
    path = repo / "studies" / "s.yaml"
    path.write_text(STUDY.replace("seeds: 0-1", "seeds: 0-2"))
    assert "studies/s.yaml: has uncommitted changes; commit the study file" in one_line_error(capsys, sweep())
    path.write_text(STUDY)
    (repo / "tiny.yaml").write_text(SCENARIO.replace("max_iter: 50", "max_iter: 30"))
    assert one_line_error(capsys, sweep()) == ("error: studies/../tiny.yaml: a scenario of studies/s.yaml, has "
                                               "uncommitted changes; commit it before running studies/s.yaml")
    git(repo, "checkout", "-q", "--", "tiny.yaml")

    # a later change of the study file (here, a split of modes) comes after these runs: the page says so,
    # and reusing the cells keeps the commits they ran at
    path.write_text(STUDY + "  modes: {metric: acc, split: 0.5, below: poor, above: good}\n")
    git(repo, "commit", "-q", "-am", "a split of modes, after the runs")
    later = git(repo, "log", "-1", "--format=%H", "--", "studies/s.yaml")
    capsys.readouterr()
    assert main(["sweep", "studies/s.yaml"]) == 0 and "0 runs executed, 2 reused" in capsys.readouterr().err
    write_pages(repo / "studies", repo / "runs" / "studies")
    page = (repo / "studies" / "kfed.md").read_text()
    assert f"Seeds declared in `{later[:7]}` (the study file's last commit: its seeds, grid and modes); of its 2 " \
           "runs, 2 ran before it." in page


def test_outside_a_checkout_a_study_runs_only_when_told_and_records_that(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "s.yaml").write_text(STUDY)
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, sweep())
    assert err.startswith("error: studies/s.yaml: not in a git checkout, so no commit declares its seeds;")
    assert "--allow-uncommitted" in err
    assert main(sweep("--allow-uncommitted")) == 0
    write_pages(tmp_path / "studies", tmp_path / "runs" / "studies")
    record = list(csv.DictReader(open(tmp_path / "studies" / "results" / "s.csv", newline="")))
    assert {(r["seeds_commit"], r["head_commit"]) for r in record} == {("uncommitted", "uncommitted")}
    page = (tmp_path / "studies" / "kfed.md").read_text()
    assert "Seeds declared in: no commit known here (the study file is not in a git checkout or not committed); " \
           "of its 2 runs, 2 ran from a study file no commit held." in page
    assert one_line_error(capsys, ["sweep", "tiny.yaml", "--allow-uncommitted"]).startswith(
        "error: --allow-uncommitted: waives a study file's commit check")


def test_a_scenario_outside_the_checkout_is_refused(tmp_path):
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere.yaml"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "s.yaml").write_text("x")
    git(repo, "add", "s.yaml")
    git(repo, "commit", "-q", "-m", "s")
    with pytest.raises(ScenarioError, match="lies outside its git checkout"):
        check_committed(repo / "s.yaml", [elsewhere])
    assert check_committed(repo / "s.yaml", [elsewhere], allow_uncommitted=True).seeds_commit == "uncommitted"
    assert check_committed(repo / "s.yaml", []).seeds_commit == git(repo, "rev-parse", "HEAD")


def _record(path: Path, study: str, run: str, seeds: range, accs: list[float], commits: str = "",
            grid: dict | None = None, accs_more: list[float] | None = None) -> None:
    """A hand-made record; ``commits``: what its rows name as their commits ("" for none);
    ``grid``: one key and its two values, ``accs`` at the first, ``accs_more`` at the second."""
    def row(s, a, extra):
        return {"scenario": run, "method": "cefmc", **extra, "seed": str(s), "status": "completed", "acc": str(a),
                "nmi": "0.9", "ari": "0.9", "mb": "1.0", "rounds": "3", "wall": "1.0",
                "fingerprint": f"f{s}{''.join(extra.values())}", "run_dir": "", "code_version": "v",
                "platform": "numpy 2; Python 3.11, x86_64, 2 CPUs", "labels_sha256": "h", "seeds_commit": commits,
                "head_commit": commits, "joined": "", "study": study}
    if grid is None:
        rows = [row(s, a, {}) for s, a in zip(seeds, accs)]
    else:
        (key, values), = grid.items()
        rows = [row(s, a, {key: v}) for v, some in zip(values, (accs, accs_more)) for s, a in zip(seeds, some)]
    st = load_study(path.parent.parent / f"{study}.yaml")  # the cell digest the page generator checks
    rows = [{**r, "cell": cell_digests(st).get(_row_cell(r, st), "")} for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _demo_study(studies: Path, name: str, title: str, seeds: str, extra: str = "",
                more_runs: tuple[tuple[str, str], ...] = (), paper_acc: float | None = None) -> None:
    """A study file of the paper ``demo`` on the quickstart scenario: run ``paper`` (Demo),
    ``more_runs`` as (id, label) project variants, ``extra`` lines (grid, modes, readme)."""
    scenario = ROOT / "scenarios" / "hw-cefmc.yaml"
    runs = f"    - {{id: paper, label: Demo, scenario: {scenario}}}\n" + "".join(
        f"    - {{id: {i}, label: {label}, variant: project, scenario: {scenario}}}\n" for i, label in more_runs)
    paper = "" if paper_acc is None else f"  paper_results:\n    - {{run: paper, acc: {paper_acc}}}\n"
    (studies / f"{name}.yaml").write_text(f"study:\n  paper: demo\n  title: {title}\n  seeds: {seeds}\n"
                                          f"  metrics: [acc]\n{extra}  runs:\n{runs}{paper}")


def _readme_rows(tmp_path: Path, studies: Path, prefix: str) -> list[str]:
    """The README table rows starting with ``prefix``, after writing every page of ``studies``."""
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{README_BEGIN}\n{README_END}\n")
    write_pages(studies, tmp_path / "runs", readme)
    return [line for line in readme.read_text().splitlines() if line.startswith(prefix)]


def test_readme_shows_a_headlines_second_draw_beside_it_and_old_records_read_as_not_recorded(tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    modes = "  modes: {metric: acc, split: 0.88, below: merged, above: separated}\n"
    _demo_study(studies, "demo-headline", "Headline", "300-304", modes, (("ours", "Demo+"),), paper_acc=0.9)
    _demo_study(studies, "demo-headline-check", "Second draw", "400-404", modes + "  readme: false\n")
    head = commit_all(tmp_path)  # the study files declared before their runs
    _record(studies / "results" / "demo-headline.csv", "demo-headline", "paper", range(300, 305),
            [0.95, 0.96, 0.82, 0.95, 0.94], commits=head)
    _record(studies / "results" / "demo-headline-check.csv", "demo-headline-check", "paper", range(400, 405),
            [0.95, 0.82, 0.83, 0.95, 0.81], commits=head)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{README_BEGIN}\n{README_END}\n")
    write_pages(studies, tmp_path / "runs", readme)
    rows = [line for line in readme.read_text().splitlines() if line.startswith("| [demo-headline]")]
    assert len(rows) == 2 and not any("[demo-headline-check]" in line for line in readme.read_text().splitlines())
    paper = next(line for line in rows if "| Demo |" in line)
    assert ("| 5/5 | 4 separated, 1 merged (separated 80%, Wilson 95% CI 38% to 96%) | seeds 400-404: "
                          "0.872 ± 0.072 (5/5), 2 separated, 3 merged (separated 40%, Wilson 95% CI 12% to 77%); within "
                          "noise of the paper's 0.900 (95% CI 0.783 to 0.961) | ") in paper
    assert paper.endswith(", arithmetic not recorded |")  # the labels digest, then what made them
    # no draw of its own, no finished run
    assert next(line for line in rows if "| Demo+ |" in line).endswith("| 0/0 | 0 separated, 0 merged |  |  |")
    page = (studies / "demo.md").read_text()
    assert page.count("all 5 runs ran at or after it.") == 2
    # where a label hash holds: the platform, on every page that has one
    assert "Platform of these runs: numpy 2; Python 3.11, x86_64, 2 CPUs. The label hashes in " \
           "`studies/results/demo-headline.csv` are reproducible on the platform each row names" in page
    assert "a SHA-256 of a cell's labels is reproducible on the platform" in page
    # records written before cells named their commit read as "not recorded"; rows run from no commit, so
    # too; neither enters a mean
    _record(studies / "results" / "demo-headline.csv", "demo-headline", "paper", range(300, 305),
            [0.95, 0.96, 0.82, 0.95, 0.94])
    _record(studies / "results" / "demo-headline-check.csv", "demo-headline-check", "paper", range(400, 405),
            [0.95, 0.82, 0.83, 0.95, 0.81], commits="uncommitted")
    write_pages(studies, tmp_path / "runs", readme)
    page = (studies / "demo.md").read_text()
    assert "of its 5 runs, 5 not recorded (made before cell records named their commit)." in page
    assert "of its 5 runs, 5 ran from a study file no commit held." in page
    assert "Left out of every mean, table and sentence: 5 ran from a study file no commit held." in page
    assert "| Demo | paper | 0/0 | n/a |" in page


def test_a_run_the_check_file_lacks_takes_its_second_draw_from_a_check_file_of_its_own(tmp_path):
    """``<headline>-check-<x>.yaml`` holds a second draw for a run that ``<headline>-check``
    does not have (adding the run there would declare that file again, after its rows)."""
    studies = tmp_path / "studies"
    studies.mkdir()
    _demo_study(studies, "demo-headline", "Headline", "300-304", "", (("ours", "Demo+"),), paper_acc=0.9)
    _demo_study(studies, "demo-headline-check", "Second draw", "400-404", "  readme: false\n")
    (studies / "demo-headline-check-ours.yaml").write_text(
        "study:\n  paper: demo\n  title: Second draw of Demo+\n  seeds: 400-404\n  metrics: [acc]\n  readme: false\n"
        f"  runs:\n    - {{id: ours, label: Demo+, variant: project, scenario: {ROOT / 'scenarios' / 'hw-cefmc.yaml'}}}\n")
    head = commit_all(tmp_path)
    _record(studies / "results" / "demo-headline.csv", "demo-headline", "paper", range(300, 305), [0.95] * 5, commits=head)
    _record(studies / "results" / "demo-headline-check.csv", "demo-headline-check", "paper", range(400, 405),
            [0.94] * 5, commits=head)
    _record(studies / "results" / "demo-headline-check-ours.csv", "demo-headline-check-ours", "ours", range(400, 405),
            [0.80, 0.82, 0.84, 0.81, 0.83], commits=head)
    rows = _readme_rows(tmp_path, studies, "| [demo-headline]")
    paper = next(line for line in rows if "| Demo |" in line)
    ours = next(line for line in rows if "| Demo+ |" in line)
    assert "seeds 400-404: 0.940 ± 0.000 (5/5)" in paper and "0.820" not in paper
    assert "| seeds 400-404: 0.820 ± 0.016 (5/5) |" in ours, ours


def test_a_grid_means_second_draw_carries_the_interval_of_its_seeds_means(tmp_path):
    """A README row that is the mean over a grid (``readme: mean``) sets its second draw
    against the paper with the interval of the per-seed means over the grid."""
    studies = tmp_path / "studies"
    studies.mkdir()
    grid = "  grid: {params.lambda: [1.0, 2.0]}\n"
    _demo_study(studies, "demo-grid", "Grid", "300-304", grid + "  readme: mean\n", paper_acc=0.9)
    _demo_study(studies, "demo-grid-check", "Second draw", "400-404", grid + "  readme: false\n")
    head = commit_all(tmp_path)
    for name, seeds, accs in (("demo-grid", range(300, 305), ([0.95, 0.96, 0.93, 0.95, 0.94], [0.93] * 5)),
                              ("demo-grid-check", range(400, 405), ([0.80, 0.82, 0.84, 0.81, 0.83], [0.82] * 5))):
        _record(studies / "results" / f"{name}.csv", name, "paper", seeds, accs[0], commits=head,
                grid={"params.lambda": ["1.0", "2.0"]}, accs_more=accs[1])
    row = _readme_rows(tmp_path, studies, "| [demo-grid]")[0]
    # per seed (0.80 + 0.82) / 2 ... (0.83 + 0.82) / 2, their mean 0.820; its interval lies below 0.9
    assert "seeds 400-404: 0.820 ± 0.008 (5/5); below the paper's 0.900 (95% CI 0.810 to 0.830)" in row, row


def test_the_readme_rows_of_feddmvc_and_fcuif_carry_their_second_draw():
    text = (ROOT / "README.md").read_text().split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    for study, label, paper in (("feddmvc-headline", "FedDMVC, 30 + 10 epochs (paper 500 + 300)", "0.893"),
                                ("fcuif-headline", "FCUIF (b) missing 0.5, 30 + 10 epochs (paper 500 + 300)", "0.926")):
        row = next(line for line in text.splitlines() if line.startswith(f"| [{study}]") and f"| {label} |" in line)
        draw, labels = row.rstrip(" |").rsplit(" | ", 2)[1:]
        assert re.fullmatch(r"`[0-9a-f]{12}`, .+", labels), row
        assert draw.startswith("seeds 400-409: ") and "(10/10)" in draw and "two digits merged" in draw, row
        assert re.search(rf"(below|above|within noise of) the paper's {paper} \(95% CI 0\.\d{{3}} to 0\.\d{{3}}\)$",
                         draw), row


def test_the_feddmvc_page_names_the_platform_and_the_seed_whose_labels_moved():
    page = (ROOT / "studies" / "feddmvc.md").read_text()
    section = page.split("<!-- study: feddmvc-headline -->", 1)[1].split("<!-- study:", 1)[0]
    assert ("Platform of these runs: " in section or "Platforms of these runs: " in section)  # one, or each named
    assert "are reproducible on the platform each row names" in section
    assert "Seed 303 of the headline (feddmvc-headline)" in page.replace("\n", " ")


def test_a_platform_names_its_cpu_model_where_recorded():
    info = {"python": "3.11.7", "machine": "x86_64", "cpus": 2, "numpy": "2.4.6", "cpu": "Intel(R) Xeon(R) Processor"}
    assert platform_text(info) == "numpy 2.4.6; Python 3.11.7, x86_64 (Intel(R) Xeon(R) Processor), 2 CPUs"
    assert platform_text({k: v for k, v in info.items() if k != "cpu"}) == "numpy 2.4.6; Python 3.11.7, x86_64, 2 CPUs"
