"""Study files: every shipped one validates; a tiny study runs, resumes and gets its generated page."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import commit_all

from raymvc.cli import main
from raymvc.scenario import ScenarioError
from raymvc.study.files import is_study_file, load_study
from raymvc_reports.pages import README_BEGIN, README_END, write_pages

ROOT = Path(__file__).resolve().parent.parent
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))


def sweep_committed(*argv: str) -> int:
    """``raymvc sweep ARGV`` after committing the working directory (the study file and the
    scenarios it names): rows swept from no commit would stay out of every page."""
    commit_all(Path.cwd())
    return main(["sweep", *argv])

SCENARIO = """
name: tiny
method: kfed
params: {kmeans_init: 1, max_iter: 50}
data:
  dataset: synthetic
  partition: horizontal
  n_clients: 3
  synthetic: {n_samples: 150, n_views: 1, dims: 4, n_clusters: 3, noise: 1.5}
runtime: {backend: local}
seed: 0
"""

STUDY = """
# A tiny study of k-FED on synthetic blobs.
study:
  paper: kfed
  title: Restarts on synthetic blobs
  source: Table 9
  seeds: 0-2
  grid: {data.synthetic.noise: [0.5, 3.0]}
  metrics: [acc, nmi]
  runs:
    - {id: paper, label: k-FED, scenario: ../tiny.yaml}
    - {id: ours, label: k-FED more restarts, variant: project, scenario: ../tiny.yaml, set: {params.kmeans_init: 5}}
  paper_results:
    - {run: paper, at: {data.synthetic.noise: 0.5}, acc: 0.912, nmi: 0.8}
  spread: {run: paper, set: {runtime.threads: 2}}
"""


def test_there_are_at_least_ten_studies_over_the_five_papers():
    papers = {load_study(p).spec.paper for p in STUDIES}
    assert len(STUDIES) >= 10 and {"cefmc", "efimvc", "ccfc", "feddmvc", "fcuif"} <= papers


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_study_validates(path, capsys):
    study = load_study(path)
    assert is_study_file(path) and study.seeds()
    assert study.check() >= len(study.entries())  # every run's scenario at every grid point loads
    assert all(r.variant in ("paper", "project", "ablation", "baseline") for r in study.spec.runs)
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    if code == 2 and "cannot fetch it" in err and not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("its data set is fetched, and this checkout has no shared data folder to fetch it from offline")
    assert code == 0, err
    assert "ok -- a study of" in out


@pytest.mark.parametrize("text, words", [
    ("study: {paper: x, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}], bogus: 1}", "study.bogus"),
    ("study: {paper: x, title: t, runs: []}", "study.runs"),
    ("study: {paper: x, title: t, runs: [{id: a, label: A, scenario: nowhere.yaml}]}", "study.runs.0.scenario"),
    ("study: {paper: x, title: t, runs: [{id: 'a b', label: A, scenario: ../tiny.yaml}]}", "study.runs.0.id"),
    ("study: {paper: x, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}], spread: {run: b, set: {}}}",
     "study.spread.0.run"),
    ("study: {paper: x, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}], "
     "spread: [{run: a, set: {runtime.threads: 2}}, {run: b, set: {}}]}", "study.spread.1.run"),
    ("study: {paper: x, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}], "
     "spread: [{run: a, set: {runtime.threads: 2}}, {run: a, set: {runtime.threads: 2}}]}",
     "study.spread.1: its run id 'a.threads2' is taken"),
    ("study: {paper: x, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}], "
     "spread: [{run: a, set: {runtime.threads: 2}, lable: x}]}", "study.spread.0.lable"),
    ("study: {paper: x, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}], spread: {run: a}}",
     "study.spread.0.set"),
    ("study: {paper: x, title: t, grid: {seed: [1]}, runs: [{id: a, label: A, scenario: ../tiny.yaml}], "
     "paper_results: [{at: {params.k: 1}, acc: 0.5}]}", "paper_results.0.at"),
    # a tuning study's default is a point of its grid
    ("study: {paper: x, title: t, seeds: 100-102, readme: false, grid: {params.kmeans_init: [1, 5], "
     "params.max_iter: [50, 100]}, tuning: {default: {params.kmeans_init: 1}}, "
     "runs: [{id: a, label: A, scenario: ../tiny.yaml}]}", "study.tuning.default: name the default of every grid key"),
    ("study: {paper: x, title: t, seeds: 100-102, readme: false, grid: {params.kmeans_init: [1, 5]}, "
     "tuning: {default: {params.kmeans_init: 3}}, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}",
     "study.tuning.default.params.kmeans_init"),
    ("study: {paper: x, title: t, seeds: 100-102, readme: false, grid: {params.kmeans_init: [1, 5]}, "
     "tuning: {default: {params.max_iter: 50}}, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}",
     "study.tuning.default.params.max_iter"),
    # a study's page is studies/<paper>.md: never a path out of studies/
    ("study: {paper: ../OUTSIDE, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}", "study.paper"),
    ("study: {paper: /tmp/x, title: t, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}", "study.paper"),
    # bounded sizes: one line, at once
    ("study: {paper: x, title: t, seeds: 0-100000000000, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}",
     "study.seeds 0-100000000000: more than 10000 seeds"),
    ("study: {paper: x, title: t, seeds: 0-2, runs: [{id: a, label: A, scenario: ../tiny.yaml, seeds: 5}]}",
     "runs.a.seeds: 5 is not a subset of the study's seeds"),
    ("study: {paper: x, title: t, grid: {" + ", ".join(f"params.k{i}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" for i in range(14))
     + "}, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}", "study.grid: the sweep has more than 100000 runs"),
])
def test_a_broken_study_is_one_line_naming_file_and_key(tmp_path, capsys, text, words):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "s").mkdir()
    f = tmp_path / "s" / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ScenarioError, match=words):
        load_study(f)
    assert main(["sweep", str(f), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(f) in err[0] and words.split(".")[-1] in err[0]


def test_a_study_narrows_to_its_own_cells_and_one_cell_runs_again_alone(tmp_path, capsys):
    """--seeds and --grid pick among the study's declared seeds and grid values (nothing
    else); --only, --seeds and --grid together rerun one cell and keep every other row."""
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "studies").mkdir()
    f = tmp_path / "studies" / "tiny-study.yaml"
    f.write_text(STUDY)
    commit_all(tmp_path)
    out = tmp_path / "out"
    for bad, words in ((["--seeds", "5"], "--seeds 5: not among the study's declared seeds (0-2)"),
                       (["--grid", "data.synthetic.noise=[1.0]"], "not among the study's declared values (0.5, 3.0)"),
                       (["--grid", "seed=[1]"], "--grid seed: not a key of the study's grid"),
                       (["--seed", "1"], "the seeds come from the study file")):
        assert main(["sweep", str(f), *bad, "--out", str(out), "--quiet"]) == 2
        assert words in capsys.readouterr().err
    assert main(["sweep", str(f), "--out", str(out), "--quiet"]) == 0
    before = {(r["scenario"], r["data.synthetic.noise"], r["seed"]): r["fingerprint"]
              for r in csv.DictReader((out / "sweep.csv").open())}
    assert len(before) == 2 * 2 * 3 + 3 * 2  # two runs and the spread at every point and seed
    cell = out / "paper_noise3.0_seed1"
    (cell / "summary.json").unlink()  # that one cell runs again; nothing else does
    assert main(["sweep", str(f), "--only", "paper", "--seeds", "1", "--grid", "data.synthetic.noise=[3.0]",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 runs executed" in err and "0 reused" in err
    after = {(r["scenario"], r["data.synthetic.noise"], r["seed"]): r["fingerprint"]
             for r in csv.DictReader((out / "sweep.csv").open())}
    assert after == before


def _with_cells(rows: list[dict], study_file) -> list[dict]:
    """Hand-made record rows with the cell digest that the page generator writes and checks,
    made (as far as git can tell) after a commit that declares the study: the study's folder
    becomes a git checkout with everything committed, and each row names its HEAD."""
    from raymvc_reports.pages import _row_cell, cell_digests

    st = load_study(study_file)
    digests = cell_digests(st)
    head = commit_all(Path(study_file).resolve().parent.parent)
    return [{"seeds_commit": head, "head_commit": head, **r, "cell": digests.get(_row_cell(r, st), "")} for r in rows]


def _copy_papers(tmp_path: Path, *papers: str) -> Path:
    """The shipped study files, records and notes of ``papers`` (and every scenario) under
    ``tmp_path``: enough to write those papers' pages without the other pages' time.
    ``tmp_path`` is a clone of this repository first (sharing its objects), so the commits the
    records name, and the records as they were before they named commits, are there too."""
    import subprocess

    done = subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(ROOT), str(tmp_path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"needs this repository's git history ({done.stderr.strip()[:100]})")
    studies = tmp_path / "studies"
    for sub in ("results", "notes"):
        (studies / sub).mkdir(parents=True, exist_ok=True)
    for paper in papers:
        for f in (ROOT / "studies").glob(f"{paper}-*.yaml"):
            shutil.copy(f, studies / f.name)
        for f in (ROOT / "studies" / "results").glob(f"{paper}-*.*"):
            shutil.copy(f, studies / "results" / f.name)
        if (ROOT / "studies" / "notes" / f"{paper}.md").is_file():
            shutil.copy(ROOT / "studies" / "notes" / f"{paper}.md", studies / "notes" / f"{paper}.md")
    shutil.copy(ROOT / "studies" / "results" / "legacy.yaml", studies / "results" / "legacy.yaml")
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    return studies


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_tiny_study_runs_resumes_and_gets_its_page(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "tiny-study.yaml").write_text(STUDY)
    monkeypatch.chdir(tmp_path)
    assert sweep_committed("studies/tiny-study.yaml", "--quiet") == 0
    out = tmp_path / "runs" / "studies" / "tiny-study"  # the study's default folder
    rows = _csv(out / "sweep.csv")
    assert len(rows) == 3 * 2 * 3  # (paper, ours, paper with 2 threads) x 2 noise levels x 3 seeds
    assert {r["scenario"] for r in rows} == {"paper", "ours", "paper.threads2"}
    capsys.readouterr()
    assert sweep_committed("studies/tiny-study.yaml") == 0
    assert "0 runs executed" in capsys.readouterr().err  # nothing changed: every cell reused
    import raymvc

    again = raymvc.sweep("studies/tiny-study.yaml", allow_uncommitted=True)  # the library takes a study file too, same folder
    assert again.out.resolve() == out.resolve() and len(again.runs) == len(rows)

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_BEGIN}\nold table\n{README_END}\n\nafter\n")
    written = write_pages(studies, tmp_path / "runs" / "studies", readme)
    page = (studies / "kfed.md").read_text()
    assert studies / "kfed.md" in written and (studies / "figures" / "tiny-study.png").stat().st_size > 1000
    # the page's means are the sweep's own numbers, per run and point
    for run, label in (("paper", "k-FED"), ("ours", "k-FED more restarts")):
        accs = [float(r["acc"]) for r in rows if r["scenario"] == run and r["data.synthetic.noise"] == "3.0"]
        cell = f"{statistics.mean(accs):.3f} ± {statistics.stdev(accs):.3f}"
        line = next(x for x in page.splitlines() if x.startswith(f"| {label} |") and "| 3.0 |" in x)
        assert cell in line and "3/3" in line
        assert " / ".join(f"{a:.3f}" for a in accs) in line  # every seed's value
    paper_line = next(x for x in page.splitlines() if x.startswith("| k-FED |") and "| 0.5 |" in x)
    assert "0.912" in paper_line and "0.800" in paper_line
    assert "A tiny study of k-FED on synthetic blobs." in page and "Table 9" in page
    assert "run again with `runtime.threads: 2`: 6 of 6 wrote the same `labels.csv`" in page
    text = readme.read_text()
    assert "old table" not in text and text.endswith("after\n") and "[tiny-study](studies/kfed.md#" in text
    # the command under the table reruns its one cell alone and gives the recorded labels hash again
    cmd, recorded, labels = re.search(r"One cell again: `([^`]+)` .* labels hash `([0-9a-f]{12})…`.*"
                                      r"`sha256sum ([^`]+)`", page).groups()
    args = shlex.split(cmd)
    assert args[:3] == ["raymvc", "sweep", "studies/tiny-study.yaml"] and "--grid" in args
    row = next(r for r in _csv(studies / "results" / "tiny-study.csv") if r["labels_sha256"].startswith(recorded))
    assert Path(labels) == Path("runs/studies/tiny-study") / row["run_dir"] / "labels.csv"
    (tmp_path / labels).unlink()
    (tmp_path / labels).with_name("summary.json").unlink()
    capsys.readouterr()
    assert main(args[1:]) == 0
    assert "1 runs executed" in capsys.readouterr().err
    assert hashlib.sha256((tmp_path / labels).read_bytes()).hexdigest() == row["labels_sha256"]
    assert len(_csv(out / "sweep.csv")) == len(rows)

    # the cell record the page was written from regenerates the same page once the run folders are gone
    assert studies / "results" / "tiny-study.csv" in written
    record = _csv(studies / "results" / "tiny-study.csv")
    assert len(record) == len(rows) and all(len(r["labels_sha256"]) == 64 and r["code_version"] for r in record)
    import numpy

    assert all(f"numpy {numpy.__version__}" in r["platform"] for r in record)  # what a cell may move with
    assert f"Platform of these runs: {record[0]['platform']}, {record[0]['arithmetic']} arithmetic." in page
    assert record[0]['arithmetic'] in ('pinned', 'native')
    shutil.rmtree(out)
    (studies / "kfed.md").write_text("stale")
    write_pages(studies, tmp_path / "runs" / "studies", readme)
    assert (studies / "kfed.md").read_text() == page and readme.read_text() == text
    # a study with neither folder nor record keeps its section and README rows as they were, also on a
    # page written before sections had their opening line, and wherever it stands among the others
    (studies / "results" / "tiny-study.csv").unlink()
    for name, title in (("other", "Another look"), ("zz", "Last look")):
        (studies / f"{name}.yaml").write_text(f"study: {{paper: kfed, title: {title}, seeds: 0-1, runs: "
                                              "[{id: paper, label: k-FED, scenario: ../tiny.yaml}]}\n")
        assert sweep_committed(f"studies/{name}.yaml", "--quiet") == 0
    (studies / "kfed.md").write_text("\n".join(x for x in page.splitlines() if not x.startswith("<!-- study:")) + "\n")
    for _ in range(2):
        told = []
        write_pages(studies, tmp_path / "runs" / "studies", readme, log=told.append)
        both = (studies / "kfed.md").read_text()
        assert both.index("## Another look") < both.index(page.split("\n## ", 1)[1]) < both.index("## Last look")
        assert both.count("## Restarts on synthetic blobs") == 1
        assert told == [f"{studies / 'kfed.md'}: kept the section of tiny-study as it was (no sweep folder or "
                        "cell record)"]
    table = readme.read_text()
    assert all(line in table for line in text.splitlines() if line.startswith("| [tiny-study]"))
    assert "| [other](studies/kfed.md#another-look) | k-FED |" in table


def test_readme_mean_averages_each_seed_over_the_grid_first(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "avg.yaml").write_text("""
study:
  paper: kfed
  title: Averaged over the noise
  seeds: 0-2
  grid: {data.synthetic.noise: [0.5, 3.0]}
  readme: mean
  runs:
    - {id: paper, label: k-FED, scenario: ../tiny.yaml}
  paper_results:
    - {method: "k-FED (paper, mean of the points)", acc: 0.777}
""")
    monkeypatch.chdir(tmp_path)
    assert sweep_committed("studies/avg.yaml", "--quiet") == 0
    rows = _csv(tmp_path / "runs" / "studies" / "avg" / "sweep.csv")
    per_seed = [statistics.mean(float(r["acc"]) for r in rows if r["seed"] == s) for s in ("0", "1", "2")]
    readme = tmp_path / "README.md"
    readme.write_text(f"{README_BEGIN}\n{README_END}\n")
    write_pages(studies, tmp_path / "runs" / "studies", readme)
    line = next(x for x in readme.read_text().splitlines() if x.startswith("| [avg]"))
    assert "mean over noise" in line and "0.777" in line and "3/3" in line
    assert f"{statistics.mean(per_seed):.3f} ± {statistics.stdev(per_seed):.3f}" in line
    assert "Mean over the grid's points" in (studies / "kfed.md").read_text()


TUNING = """
study:
  paper: kfed
  title: Tuning the restarts
  seeds: 100-102
  grid: {params.kmeans_init: [1, 5], data.synthetic.noise: [0.5, 4.0]}
  readme: false
  tuning: {default: {params.kmeans_init: 1, data.synthetic.noise: 4.0}, metric: acc}
  runs:
    - {id: paper, label: k-FED, scenario: ../tiny.yaml}
"""


def test_a_tuning_default_must_be_what_the_scenario_resolves_to(tmp_path):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)  # kmeans_init 1, noise 1.5
    (tmp_path / "s").mkdir()
    f = tmp_path / "s" / "tune.yaml"
    f.write_text(TUNING)
    with pytest.raises(ScenarioError, match=r"tuning.default.data.synthetic.noise: 4.0, but run 'paper' "
                                            r"resolves it to 1.5"):
        load_study(f).check()
    f.write_text(TUNING.replace("noise: 4.0}, metric", "noise: 0.5}, metric").replace("0.5, 4.0]", "0.5, 1.5]")
                 .replace("noise: 0.5}, metric", "noise: 1.5}, metric"))
    assert load_study(f).check() == 12


def test_a_tuning_page_names_the_best_point_and_where_the_default_stands(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(SCENARIO.replace("noise: 1.5", "noise: 4.0"))
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "tune.yaml").write_text(TUNING)
    monkeypatch.chdir(tmp_path)
    assert sweep_committed("studies/tune.yaml", "--quiet") == 0
    rows = _csv(tmp_path / "runs" / "studies" / "tune" / "sweep.csv")
    assert {r["seed"] for r in rows} == {"100", "101", "102"}
    means = {}
    for r in rows:
        means.setdefault((r["params.kmeans_init"], r["data.synthetic.noise"]), []).append(float(r["acc"]))
    means = {k: statistics.mean(v) for k, v in means.items()}
    best = max(means, key=means.get)
    write_pages(studies, tmp_path / "runs" / "studies")
    line = next(x for x in (studies / "kfed.md").read_text().splitlines() if x.startswith("**Tuning**"))
    assert f"Of 4 grid points of *k-FED*, the best mean ACC is {means[best]:.3f}" in line
    tied = sum(1 for m in means.values() if m == means[best])
    assert (f"at kmeans_init = {best[0]}, noise = {best[1]}" if tied == 1 else f"shared by {tied} points (equal") in line
    default = ("1", "4.0")
    if means[default] == means[best]:
        assert ("That is the default (kmeans_init = 1, noise = 4.0)." if tied == 1 else
                "The default (kmeans_init = 1, noise = 4.0) is one of them.") in line
    else:
        rank = 1 + sorted(means.values(), reverse=True).index(means[default])
        assert f"The default (kmeans_init = 1, noise = 4.0) ranks {rank} of 4 with {means[default]:.3f}" in line
        assert f"{means[best] - means[default]:.3f} below the best" in line


class _FakeResult:
    """A study's results as tuning_summary reads them: (mean, std) per grid point."""

    def __init__(self, study, means):
        self.study, self.means = study, means

    def points(self):
        return self.study.points()

    def stat(self, run_id, point, metric):
        mean, std, *counts = self.means[point["params.kmeans_init"]]
        ok, total = counts or (3, 3)
        return (mean if ok else None), std, ok, total

    def values(self, run_id, point, metric):
        """Three seeds at mean - std, mean, mean + std (their sample std is std)."""
        mean, std, *_ = self.means[point["params.kmeans_init"]]
        return {"100": mean - std, "101": mean, "102": mean + std}


@pytest.mark.parametrize("means, words", [
    ({1: (0.90, 0.01), 5: (0.80, 0.02)}, "the best mean ACC is 0.900 ± 0.010, at kmeans_init = 1. That is the default"),
    ({1: (0.85, 0.01), 5: (0.85, 0.01)}, "shared by 2 points (equal means: kmeans_init = 1; kmeans_init = 5). "
                                         "The default (kmeans_init = 1) is one of them."),
    # a point with a failed seed takes no part; the default with one has no verdict
    ({1: (0.80, 0.01), 5: (0.95, 0.01, 2, 3)}, "Of 1 grid points of *k-FED* (1 of 2 left out: not every seed "
                                               "finished), the best mean ACC is 0.800 ± 0.010, at kmeans_init = 1."),
    ({1: (0.80, 0.01, 2, 3), 5: (0.95, 0.01)}, "The default (kmeans_init = 1) has 2 of 3 seeds finished (1 failed)"),
    ({1: (0.80, 0.01, 1, 1), 5: (0.95, 0.01)}, "The default (kmeans_init = 1) has 1 of 3 seeds finished: no verdict"),
    ({1: (0.80, 0.01), 5: (0.90, 0.05)}, "The default (kmeans_init = 1) ranks 2 of 2 with 0.800 ± 0.010, 0.100 "
                                         "below the best (below it beyond noise: best minus default paired over "
                                         "seeds, 95% CI 0.001 to 0.199)."),
    ({1: (0.88, 0.01), 5: (0.90, 0.05)}, "0.020 below the best (within noise: best minus default paired over seeds, "
                                         "95% CI -0.079 to 0.119)."),
])
def test_the_tuning_line_says_where_the_default_stands(tmp_path, means, words):
    from raymvc_reports.pages import tuning_summary

    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "s").mkdir()
    f = tmp_path / "s" / "tune.yaml"
    f.write_text(TUNING.replace(", data.synthetic.noise: [0.5, 4.0]", "").replace(", data.synthetic.noise: 4.0", ""))
    line = tuning_summary(_FakeResult(load_study(f), means))
    assert line.startswith("**Tuning") and words in line


def test_a_tuning_default_is_matched_to_the_grid_value_and_may_name_another_run(tmp_path):
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "s").mkdir()
    f = tmp_path / "s" / "tune.yaml"
    f.write_text("""
study:
  paper: kfed
  title: t
  seeds: 100-101
  readme: false
  grid: {params.kmeans_init: [1, 5]}
  tuning: {run: more, default: {params.kmeans_init: 5.0}}
  runs:
    - {id: paper, label: k-FED, scenario: ../tiny.yaml}
    - {id: more, label: k-FED more, scenario: ../tiny.yaml, set: {params.kmeans_init: 5}}
""")
    st = load_study(f)
    assert st.spec.tuning.default == {"params.kmeans_init": 5} and st.tuned_run().id == "more"
    st.check()  # 'more' resolves kmeans_init to 5: the default holds
    f.write_text(f.read_text().replace("tuning: {run: more,", "tuning: {run: paper,"))
    with pytest.raises(ScenarioError, match="tuning.default.params.kmeans_init: 5, but run 'paper' resolves it to 1"):
        load_study(f).check()
    assert main(["sweep", str(f), "--quiet", "--out", str(tmp_path / "out")]) == 2  # the sweep checks it too


TWO_SPREADS = STUDY.replace("  spread: {run: paper, set: {runtime.threads: 2}}\n",
                            "  spread:\n    - {run: paper, set: {runtime.threads: 2}}\n"
                            "    - {run: paper, set: {params.device: cuda}, label: on a GPU}\n")


def test_spreads_swept_apart_join_one_page(tmp_path, monkeypatch, capsys):
    """Two spreads; the CUDA one is skipped where torch sees none, --only sweeps a subset (as
    on another machine), and the page takes cells from both folders."""
    import raymvc.study.sweep as studies_mod

    monkeypatch.setattr(studies_mod, "_has_cuda", lambda: False)
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "tiny-study.yaml").write_text(TWO_SPREADS)
    assert load_study(studies / "tiny-study.yaml").spread_ids() == ["paper.threads2", "paper.devicecuda"]
    monkeypatch.chdir(tmp_path)
    main_dir, other = tmp_path / "main" / "tiny-study", tmp_path / "other" / "tiny-study"
    assert sweep_committed("studies/tiny-study.yaml", "--only", "paper,ours", "--out", str(main_dir)) == 0
    assert {r["scenario"] for r in _csv(main_dir / "sweep.csv")} == {"paper", "ours"}
    capsys.readouterr()
    assert sweep_committed("studies/tiny-study.yaml", "--only", "paper.threads2",
                 "--only", "paper.devicecuda", "--out", str(other)) == 0
    assert "skipped paper.devicecuda (a spread on CUDA; torch sees no CUDA device here)" in capsys.readouterr().err
    assert {r["scenario"] for r in _csv(other / "sweep.csv")} == {"paper.threads2"}
    import raymvc

    assert {r["scenario"] for r in raymvc.sweep("studies/tiny-study.yaml", out=other, only=["paper.threads2"],
                                                 allow_uncommitted=True).runs} \
        == {"paper.threads2"}  # the library's sweep picks runs too (here: every cell reused)
    page_alone = paper_page_text(studies, tmp_path / "main", [])
    assert "no pair of runs finished" in page_alone and "run again with `runtime.threads: 2`" not in page_alone
    page = paper_page_text(studies, tmp_path / "main", [tmp_path / "other"])
    assert "run again with `runtime.threads: 2`: 6 of 6 wrote the same `labels.csv`" in page
    assert "**Across platforms** (`params.device: cuda`, as *on a GPU*): no pair of runs finished." in page
    assert "(+6 runs swept on another machine and joined with `--also`)" in page
    # the record keeps the joined cells: the page comes out the same without --also, and without the run folders
    assert paper_page_text(studies, tmp_path / "main", []) == page
    shutil.move(main_dir, tmp_path / "aside")
    assert paper_page_text(studies, tmp_path / "main", []) == page
    shutil.move(tmp_path / "aside", main_dir)
    (studies / "results" / "tiny-study.csv").unlink()  # below, what the folders alone say
    # a run folder rerun since (another fingerprint) is not compared as if it were the row's run
    victim = next(r for r in _csv(other / "sweep.csv"))
    summary = other / victim["run_dir"] / "summary.json"
    summary.write_text(summary.read_text().replace(victim["fingerprint"], "0" * 24))
    page = paper_page_text(studies, tmp_path / "main", [tmp_path / "other"])
    assert "5 of 5 (of 6; 1 no longer on disk as run) wrote the same `labels.csv`" in page
    # a partial sweep into the study's folder keeps the rows of the runs it leaves out, read
    # again from their run folders: an edited value is not carried over, a row without its folder is dropped
    rows = _csv(main_dir / "sweep.csv")
    edited = next(r for r in rows if r["scenario"] == "paper")
    true_acc, edited["acc"] = edited["acc"], "0.999"
    gone = next(r for r in rows if r["scenario"] == "paper" and r is not edited)
    shutil.rmtree(main_dir / gone["run_dir"])
    with open(main_dir / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    capsys.readouterr()
    assert sweep_committed("studies/tiny-study.yaml", "--only", "ours", "--out", str(main_dir),
                 "--quiet") == 0
    assert "1 earlier rows of other runs left out of sweep.csv" in capsys.readouterr().err
    after = _csv(main_dir / "sweep.csv")
    assert {r["scenario"] for r in after} == {"paper", "ours"}
    assert [r["acc"] for r in after if r["run_dir"] == edited["run_dir"]] == [true_acc]
    assert not [r for r in after if r["run_dir"] == gone["run_dir"]]
    assert sweep_committed("studies/tiny-study.yaml", "--quiet", "--out", str(main_dir)) == 0
    assert {r["scenario"] for r in _csv(main_dir / "sweep.csv")} == {"paper", "ours", "paper.threads2"}
    assert "skipped paper.devicecuda" in capsys.readouterr().err  # said even with --quiet
    for bad, words in ((["--only", "nope"], "--only nope: no such run (runs: paper, ours, paper.threads2"),
                       (["--only", "paper.devicecuda"], "nothing to run here (runs picked: paper.devicecuda; "
                                                         "skipped paper.devicecuda (a spread on CUDA")):
        assert sweep_committed("studies/tiny-study.yaml", *bad, "--out", str(tmp_path / "x")) == 2
        assert words in capsys.readouterr().err
    assert main(["sweep", "tiny.yaml", "--only", "paper"]) == 2
    assert "--only: picks runs of a study file" in capsys.readouterr().err


def paper_page_text(studies, runs, elsewhere):
    write_pages(studies, runs, None, elsewhere)
    return (studies / "kfed.md").read_text()


def _readme_studies() -> list[str]:
    text = (ROOT / "README.md").read_text()
    table = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    return sorted({line.split("]", 1)[0][3:] for line in table.splitlines() if line.startswith("| [")})


def test_every_readme_row_regenerates_from_a_committed_cell_record_with_its_platform():
    names = _readme_studies()
    assert names, "README's results table is empty"
    for name in names:
        assert load_study(ROOT / "studies" / f"{name}.yaml").spec.readme, f"{name}: in README but readme: false"
        record = ROOT / "studies" / "results" / f"{name}.csv"
        assert record.is_file(), f"README row {name} has no cell record ({record.relative_to(ROOT)})"
        with record.open() as f:
            rows = list(csv.DictReader(f))
        assert rows and all(r["platform"] for r in rows), f"{name}: a cell without its platform"
        assert all(r["labels_sha256"] for r in rows if r["status"] in ("completed", "degraded")), name


def test_a_study_with_modes_counts_seeds_per_mode_on_its_page_and_in_readme(tmp_path):
    study = tmp_path / "studies" / "bimodal.yaml"
    study.parent.mkdir()
    study.write_text(
        "study:\n  paper: demo\n  title: Two outcomes\n  seeds: 0-4\n  metrics: [acc]\n"
        "  modes: {metric: acc, split: 0.88, below: merged, above: separated}\n"
        f"  runs:\n    - {{id: paper, label: Demo, scenario: {ROOT / 'scenarios' / 'hw-cefmc.yaml'}}}\n")
    accs = [0.95, 0.82, 0.96, 0.83, 0.81]
    rows = [{"scenario": "paper", "method": "cefmc", "seed": str(s), "status": "completed", "acc": str(a), "nmi": "0.9",
             "ari": "0.9", "mb": "1.0", "rounds": "3", "wall": "1.0", "fingerprint": f"f{s}", "run_dir": "",
             "code_version": "v", "platform": "p", "labels_sha256": "h", "joined": "", "study": "bimodal"}
            for s, a in enumerate(accs)]
    rows = _with_cells(rows, study)
    rec = tmp_path / "studies" / "results" / "bimodal.csv"
    rec.parent.mkdir()
    with rec.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{README_BEGIN}\n{README_END}\n")
    write_pages(tmp_path / "studies", tmp_path / "runs", readme)
    page = (tmp_path / "studies" / "demo.md").read_text()
    assert "2 separated, 3 merged" in page and "seeds per mode" in page
    assert "| 5/5 | 2 separated, 3 merged (separated 40%, Wilson 95% CI 12% to 77%) |" in readme.read_text()
    digest = hashlib.sha256("\n".join(f"{s}:h" for s in range(5)).encode()).hexdigest()[:12]
    assert f"| `{digest}`, arithmetic not recorded |" in readme.read_text()


def test_a_readme_rows_labels_digest_follows_every_runs_labels_hash_and_names_arithmetic_and_cpu():
    from raymvc_reports.pages import labels_text
    rows = [{"seed": str(s), "status": "completed", "labels_sha256": f"h{s}", "arithmetic": "pinned",
             "platform": "numpy 2; Python 3.11, x86_64 (AMD EPYC 9B14), 2 CPUs"} for s in range(3)]
    first = labels_text(rows)
    assert first.endswith(", pinned, AMD") and len(first.split("`")[1]) == 12
    assert labels_text(list(reversed(rows))) == first  # the order of the rows does not matter
    rows[1]["labels_sha256"] = "other"
    assert labels_text(rows) != first
    rows[2]["platform"] = "x86_64 (Intel(R) Xeon(R) Processor)"
    assert labels_text(rows).endswith(", pinned, AMD + Intel")
    rows[0]["labels_sha256"] = ""
    assert labels_text(rows) == "not kept"
    rows[0]["status"] = "failed"  # a failed run's labels do not count
    assert labels_text(rows).startswith("`")


def test_a_papers_notes_open_its_page(tmp_path):
    _copy_papers(tmp_path, "cefmc")
    (tmp_path / "studies" / "notes" / "cefmc.md").write_text("## Coverage\n\nTable III: covered.\n")
    write_pages(tmp_path / "studies", tmp_path / "runs")
    page = (tmp_path / "studies" / "cefmc.md").read_text()
    assert page.index("## Coverage") < page.index("<!-- study: ")


def test_text_from_study_files_and_records_cannot_inject_markup(tmp_path):
    """Titles, labels, notes, comments and record fields are escaped: no HTML, no marker
    that could stand for another section or end README's table, no broken table row."""
    studies = tmp_path / "studies"
    studies.mkdir()
    sc = ROOT / "scenarios" / "hw-cefmc.yaml"
    evil = "x <script>alert(1)</script> | y `z <!-- study: victim --> <!-- study-results:end -->"
    (studies / "evil.yaml").write_text(
        "# a comment <!-- study: victim -->\n"
        "study:\n  paper: demo\n"
        f"  title: {json.dumps(evil)}\n  source: {json.dumps(evil)}\n  seeds: 0-1\n  metrics: [acc]\n"
        f"  notes: {json.dumps(evil)}\n"
        f"  runs:\n    - {{id: paper, label: {json.dumps(evil)}, scenario: {sc}}}\n")
    (studies / "victim.yaml").write_text(
        "study:\n  paper: demo\n  title: Victim\n  seeds: 0-1\n  metrics: [acc]\n"
        f"  runs:\n    - {{id: paper, label: V, scenario: {sc}}}\n")
    (studies / "results").mkdir()
    for name in ("evil", "victim"):
        rows = [{"scenario": "paper", "method": "cefmc", "seed": str(s), "status": "completed" if s else evil,
                 "acc": "0.9", "nmi": "0.9", "ari": "0.9", "mb": "1", "rounds": "3", "wall": "1", "fingerprint": "f",
                 "run_dir": "", "code_version": evil, "platform": evil, "labels_sha256": "h", "joined": "",
                 "study": name} for s in (0, 1)]
        rows = _with_cells(rows, studies / f"{name}.yaml")
        with (studies / "results" / f"{name}.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{README_BEGIN}\n{README_END}\nafter\n")
    for _ in range(2):  # twice: nothing grows on regeneration
        write_pages(studies, tmp_path / "runs", readme)
    page = (studies / "demo.md").read_text()
    assert "<script>" not in page and "<!-- study: victim -->" in page and page.count("<!-- study: victim -->") == 1
    assert "## Victim" in page  # the victim's section is still there
    text = readme.read_text()
    assert text.count(README_END) == 1 and text.endswith("after\n") and "<script>" not in text
    for doc in (page, text):
        _tables_keep_their_columns(doc)


def _tables_keep_their_columns(doc: str) -> None:
    """Every row of every markdown table has as many cells as its header."""
    width = None
    for line in doc.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = line.replace("\\|", "").count("|")
        if width is None:
            width = cells
        assert cells == width, line


def test_a_record_copied_under_another_name_is_not_that_studys_results(tmp_path):
    studies = _copy_papers(tmp_path, "cefmc")
    shutil.copy(studies / "results" / "cefmc-hw.csv", studies / "results" / "cefmc-lambda.csv")
    write_pages(studies, tmp_path / "runs")
    section = (studies / "cefmc.md").read_text().split("<!-- study: cefmc-lambda -->")[1].split("<!-- study:")[0]
    assert "| 0/0 |" in section and "0.946" not in section


def test_a_record_renamed_into_another_study_is_checked_against_its_cells(tmp_path):
    """Same run ids, same seeds, no grid: only the cell digest tells FedDMVC's rows from FCUIF's."""
    studies = _copy_papers(tmp_path, "feddmvc", "fcuif")
    theirs = _csv(studies / "results" / "feddmvc-second-data.csv")
    text = (studies / "results" / "feddmvc-second-data.csv").read_text()
    (studies / "results" / "fcuif-second-data.csv").write_text(text.replace(",feddmvc-second-data\n",
                                                                             ",fcuif-second-data\n"))
    said = []
    write_pages(studies, tmp_path / "runs", log=said.append)
    section = (studies / "fcuif.md").read_text().split("<!-- study: fcuif-second-data -->")[1].split("<!-- study:")[0]
    accs = {f"{float(r['acc']):.3f}" for r in theirs}
    assert "| 0/0 |" in section and not any(a in section for a in accs)
    assert any(f"{len(theirs)} row(s) left out: not cells of fcuif-second-data" in m for m in said)
    # the record as written is read: FedDMVC's own page still shows its rows
    section = (studies / "feddmvc.md").read_text().split("<!-- study: feddmvc-second-data -->")[1]
    assert "| 3/3 |" in section.split("<!-- study:")[0]


def test_validate_a_study_whose_data_cannot_be_obtained_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYMVC_DATA", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("RAYMVC_DATA_MIRROR", str(tmp_path / "no-mirror"))
    monkeypatch.setenv("RAYMVC_DATA_OFFLINE", "1")
    assert main(["validate", str(ROOT / "studies" / "efimvc-ablation.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study run 'paper'" in err[0] and "data.dataset: proteinfold-per0.5: cannot fetch" in err[0]


def test_a_run_that_never_starts_leaves_no_empty_folder(tmp_path):
    """In a process of its own: this test process may hold a Ray of its own already."""
    import subprocess
    import sys

    out = tmp_path / "runs" / "x"
    r = subprocess.run([sys.executable, "-m", "raymvc.cli", "run", str(ROOT / "scenarios" / "hw-cefmc.yaml"),
                        "--address", "127.0.0.1:1", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "cannot join the Ray cluster" in r.stderr
    assert not out.exists()


def test_a_run_may_sweep_a_subset_of_the_seeds(tmp_path, monkeypatch, capsys):
    """A run too slow for every seed takes its own subset; its page row counts only those."""
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "few.yaml").write_text(STUDY.replace("scenario: ../tiny.yaml, set: {params.kmeans_init: 5}}",
                                                    "scenario: ../tiny.yaml, set: {params.kmeans_init: 5}, seeds: 1}"))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "studies/few.yaml"]) == 0
    assert "fewer seeds for ours" in capsys.readouterr().out
    assert sweep_committed("studies/few.yaml", "--quiet") == 0
    rows = _csv(tmp_path / "runs" / "studies" / "few" / "sweep.csv")
    assert sorted({r["seed"] for r in rows if r["scenario"] == "ours"}) == ["1"]
    assert sorted({r["seed"] for r in rows if r["scenario"] == "paper"}) == ["0", "1", "2"]
    write_pages(studies, tmp_path / "runs" / "studies", None)
    page = (studies / "kfed.md").read_text()
    assert "| k-FED more restarts | project | 0.5 | 1/1 |" in page
    assert "*k-FED more restarts* on seeds 1" in page


def test_the_atlas_page_ranks_methods_per_fault_kind(tmp_path, monkeypatch):
    """Studies of the page ``robustness``: a ranking per kind by ACC at the harshest point,
    a rank matrix and a figure of ACC against MB and virtual time."""
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    studies = tmp_path / "studies"
    studies.mkdir()
    atlas = """
study:
  paper: robustness
  title: Dropouts
  seeds: 0-1
  grid: {{faults.dropout.rate: [0.0, 0.6]}}
  metrics: [acc, mb]
  readme: false
  runs:
    - {{id: few, label: one start, variant: baseline, scenario: ../tiny.yaml, set: {{params.kmeans_init: 1, {extra}}}}}
    - {{id: many, label: five starts, variant: baseline, scenario: ../tiny.yaml, set: {{params.kmeans_init: 5}}}}
"""
    (studies / "robustness-drop.yaml").write_text(atlas.format(extra="params.max_iter: 1"))
    # a kind of one grid point: ranked, but no change to report
    (studies / "robustness-one.yaml").write_text(atlas.format(extra="params.max_iter: 1").replace(
        "title: Dropouts", "title: One point").replace("[0.0, 0.6]", "[0.3]"))
    monkeypatch.chdir(tmp_path)
    assert sweep_committed("studies/robustness-drop.yaml", "--quiet") == 0
    assert sweep_committed("studies/robustness-one.yaml", "--quiet") == 0
    write_pages(studies, tmp_path / "runs" / "studies", None)
    page = (studies / "robustness.md").read_text()
    rows = _csv(tmp_path / "runs" / "studies" / "robustness-drop" / "sweep.csv")
    harsh = {rid: statistics.mean(float(r["acc"]) for r in rows if r["scenario"] == rid
                                  and r["faults.dropout.rate"] == "0.6" and r["status"] in ("completed", "degraded"))
             for rid in ("few", "many")}
    first, second = sorted(harsh, key=lambda k: -harsh[k])
    label = {"few": "one start", "many": "five starts"}
    assert "## Ranking per fault kind" in page
    assert f"| 1 | {label[first]} |" in page and f"| 2 | {label[second]} |" in page
    assert "**Ranks at a glance**" in page and "| run | drop | one |" in page
    assert "**One point** (one point: " in page and " (n/a) |" in page and "+0.000" not in page
    assert (studies / "figures" / "robustness-atlas.png").stat().st_size > 1000
    assert "centralised" not in page.split("**Ranks at a glance**")[1].split("\n\n")[0]  # no references yet
    # the centralised references (robustness-central, no grid): a last column of the rank matrix
    (studies / "robustness-central.yaml").write_text(atlas.format(extra="central: true").replace(
        "title: Dropouts", "title: Pooled").replace("  grid: {faults.dropout.rate: [0.0, 0.6]}\n", "").replace(
        "params.kmeans_init: 5}", "params.kmeans_init: 5, central: true}"))
    assert sweep_committed("studies/robustness-central.yaml", "--quiet") == 0
    write_pages(studies, tmp_path / "runs" / "studies", None)
    page = (studies / "robustness.md").read_text()
    pooled = _csv(tmp_path / "runs" / "studies" / "robustness-central" / "sweep.csv")
    assert len(pooled) == 4
    matrix = page.split("**Ranks at a glance**")[1].split("\n\n")[1]
    assert matrix.splitlines()[0] == "| run | drop | one | centralised |"
    for rid in ("few", "many"):
        accs = [float(r["acc"]) for r in pooled if r["scenario"] == rid]
        line = next(x for x in matrix.splitlines() if x.startswith(f"| {label[rid]} |"))
        assert line.endswith(f"| {statistics.mean(accs):.3f} ± {statistics.stdev(accs):.3f} (2/2) |")
    assert "central" not in page.split("## Ranking per fault kind")[1].split("**Ranks at a glance**")[0]
    record = _csv(studies / "results" / "robustness-drop.csv")
    assert all(r["virtual_s"] != "" for r in record)  # the virtual clock of every cell is kept


def test_a_study_figure_is_the_sweep_figure_with_failures_counted_and_the_papers_numbers(tmp_path, monkeypatch):
    import raymvc.study.plot

    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "tiny-study.yaml").write_text(STUDY.replace("  spread: {run: paper, set: {runtime.threads: 2}}\n", ""))
    monkeypatch.chdir(tmp_path)
    assert sweep_committed("studies/tiny-study.yaml", "--quiet") == 0
    out = tmp_path / "runs" / "studies" / "tiny-study"
    sweep = out / "sweep.csv"  # one seed of "ours" at noise 3.0 failed
    rows = _csv(sweep)
    bad = next(r for r in rows if r["scenario"] == "ours" and r["data.synthetic.noise"] == "3.0")
    bad["status"], bad["acc"], bad["nmi"] = "failed", "", ""
    with open(sweep, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    seen = []
    real = raymvc.study.plot.draw
    monkeypatch.setattr(raymvc.study.plot, "draw", lambda points, paths, **kw: seen.append((points, kw)) or real(
        points, paths, **kw))
    write_pages(studies, tmp_path / "runs" / "studies")
    (points, kw), = seen
    assert (studies / "figures" / "tiny-study.png").stat().st_size > 1000
    at = {(p.line, p.x): p for p in points}
    assert at[("k-FED more restarts", "3.0")].failed == 1 and at[("k-FED more restarts", "3.0")].finished == 2
    assert at[("k-FED", "3.0")].failed == 0 and kw["x_values"] == ["0.5", "3.0"]
    assert [(r.metric, r.x, r.value) for r in kw["references"]] == [("acc", "0.5", 0.912), ("nmi", "0.5", 0.8)]


@pytest.mark.parametrize("text, words", [
    ("study: {paper: x, title: t, seeds: 0-2, readme: false, grid: {params.kmeans_init: [1, 5]}, "
     "tuning: {default: {params.kmeans_init: 1}}, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}",
     "study.tuning: a tuning study runs on seeds >= 100"),
    ("study: {paper: x, title: t, seeds: 100-102, grid: {params.kmeans_init: [1, 5]}, "
     "tuning: {default: {params.kmeans_init: 1}}, runs: [{id: a, label: A, scenario: ../tiny.yaml}]}",
     "study.tuning: a tuning study has no rows in README's table"),
])
def test_this_repositorys_seed_policy_is_kept_by_its_pages_not_by_the_library(tmp_path, text, words):
    """A tuning study on seeds below 100, or with README rows, is a valid study for raymvc
    (a user may tune on any seeds); this repository's page generator refuses it."""
    from raymvc_reports.pages import check_policy

    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    (tmp_path / "s").mkdir()
    f = tmp_path / "s" / "tune.yaml"
    f.write_text(text)
    study = load_study(f)  # raymvc takes it
    with pytest.raises(ScenarioError, match=words):
        check_policy(study)
    with pytest.raises(ScenarioError, match=words):
        write_pages(tmp_path / "s", tmp_path / "runs")
    import subprocess
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "study_pages.py"), "--studies", str(tmp_path / "s"),
                        "--runs", str(tmp_path / "runs"), "--readme", str(tmp_path / "README.md")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and words in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and str(f) in r.stderr
    for path in STUDIES:  # every shipped study keeps the policy
        check_policy(load_study(path))


def _key_of(point: dict) -> tuple:
    from raymvc_reports.pages import _key

    return _key(point)


def _atlas_kind(study: str):
    """A shipped study of the atlas (``robustness-...``) read from its committed record."""
    from raymvc_reports.pages import StudyResult

    return StudyResult.from_record(load_study(ROOT / "studies" / f"{study}.yaml"),
                                   ROOT / "studies" / "results" / f"{study}.csv")


def test_atlas_notes_quote_the_ranking_instead_of_copying_it(tmp_path):
    """``{{atlas:KIND:RUN:FIELD}}`` in a notes file becomes that run's number in the kind's
    ranking; a placeholder naming nothing there is one error naming the notes file."""
    from raymvc_reports.pages import atlas_ranking, fill_atlas_values

    res = _atlas_kind("robustness-crash")
    e = {x["run"].id: x for x in atlas_ranking(res)}["efimvc"]
    notes = tmp_path / "robustness.md"
    text = fill_atlas_values("EFIMVC: {{atlas:crash:efimvc:mild}} -> {{atlas:crash:efimvc:harsh}} "
                             "({{atlas:crash:efimvc:change}}) in {{atlas:crash:efimvc:harsh_s}}", [res], notes)
    assert text == f"EFIMVC: {e['mild']:.3f} -> {e['harsh']:.3f} ({e['change']:+.3f}) in {e['harsh_s']:.1f} s"
    for bad, words in [("{{atlas:crash:nobody:mild}}", "no mild of run 'nobody' in the atlas kind 'crash'"),
                       ("{{atlas:flood:efimvc:mild}}", "kind 'flood' (kinds: crash)"),
                       ("{{atlas:crash:efimvc:best}}", "expected {{atlas:KIND:RUN:mild|harsh|change|mild_s|harsh_s}}")]:
        with pytest.raises(ScenarioError, match=re.escape(words)) as err:
            fill_atlas_values(f"x {bad} y", [res], notes)
        assert str(notes) in str(err.value)


def test_a_share_of_a_drop_in_the_atlas_notes_is_computed_from_its_tables(tmp_path):
    """``{{atlas-share:KIND:A:B:C}}`` becomes ``(A - B) / (A - C)`` of the runs' mean ACC at
    the harshest point, in percent, so a sentence saying what part of a drop one cause
    accounts for cannot drift from the table. Means over different seeds (a run not all of
    whose runs finished there), a change too small to share out, and a run or kind not there
    are each one error naming the notes file and what is wrong."""
    from raymvc_reports.pages import atlas_ranking, fill_atlas_values

    crash, data = _atlas_kind("robustness-crash"), _atlas_kind("robustness-data")
    harsh = {e["run"].id: e["harsh"] for e in atlas_ranking(crash)}
    a, b, c = "cefmc", "kfed", "efimvc"
    notes = tmp_path / "robustness.md"
    text = fill_atlas_values(f"{{{{atlas-share:crash:{a}:{b}:{c}}}}} of it", [crash, data], notes)
    share = f"{100 * (harsh[a] - harsh[b]) / (harsh[a] - harsh[c]):.0f}%"
    assert re.fullmatch(re.escape(share) + r" \(95% CI -?\d+% to -?\d+%(; within noise)?\) of it", text), text
    assert fill_atlas_values(f"{{{{atlas-share:crash:{a}:{c}:{c}}}}}", [crash], notes) == "100% (95% CI 100% to 100%)"
    from raymvc_reports.pages import _extremes

    unfinished = "feddmvc"  # one of its runs at the harshest point failed
    data.cells[(unfinished, _key_of(_extremes(data)[1]))][0]["status"] = "failed"
    assert next(e for e in atlas_ranking(data) if e["run"].id == unfinished)["ok"] == 4
    for bad, words in [(f"{{{{atlas-share:crash:{a}:{b}:{a}}}}}", "differ by 0.000, too little to share out"),
                       (f"{{{{atlas-share:crash:{a}:nobody:{c}}}}}", "no ACC of run 'nobody'"),
                       (f"{{{{atlas-share:data:kfed:{unfinished}:ccfc}}}}",
                        f"run '{unfinished}' finished 4 of 5 runs there"),
                       (f"{{{{atlas-share:flood:{a}:{b}:{c}}}}}", "no atlas kind 'flood' (kinds: crash, data)"),
                       (f"{{{{atlas-share:crash:{a}:{b}}}}}", "expected {{atlas-share:KIND:A:B:C}}")]:
        with pytest.raises(ScenarioError, match=re.escape(words)) as err:
            fill_atlas_values(f"x {bad} y", [crash, data], notes)
        assert str(notes) in str(err.value)


def test_a_study_of_the_atlas_without_a_grid_stays_out_of_its_rankings(tmp_path):
    """robustness-data-attribution compares runs at one setting: its numbers fill the notes'
    placeholders, but the ranking per kind, the rank matrix and the figure leave it out; a
    kind of one grid point (robustness-async-mnist) stays in."""
    from raymvc_reports.pages import atlas_overview, fill_atlas_values

    names = ("robustness-crash", "robustness-async-mnist", "robustness-data-attribution")
    results = [_atlas_kind(n) for n in names]
    assert not results[2].study.spec.grid and len(results[1].points()) == 1
    text = atlas_overview(results, tmp_path, tmp_path)
    assert "what the drop of FedDMVC and FCUIF is made of" not in text and "data-attribution" not in text
    assert "over 2 kinds" in text and "| async-mnist | crash |" in text
    quoted = fill_atlas_values("{{atlas:data-attribution:feddmvc-no-mor:harsh}}", results, tmp_path / "n.md")
    assert re.fullmatch(r"0\.\d{3}", quoted)


def test_an_ordering_claim_of_the_atlas_notes_is_checked_against_its_tables(tmp_path):
    """``{{atlas-order:KIND/RUN>KIND/RUN...}}`` renders nothing when the drops fall in that
    order (``KIND/*``: every other run) and stops the page, naming the notes file, when the
    tables say otherwise; the shipped notes' claims hold for the committed records."""
    from raymvc_reports.pages import atlas_ranking, fill_atlas_values

    res = _atlas_kind("robustness-crash")
    drops = sorted(((-e["change"], e["run"].id) for e in atlas_ranking(res) if e["change"] is not None), reverse=True)
    worst, runner_up = drops[0][1], drops[1][1]
    notes = tmp_path / "robustness.md"
    claim = f"{{{{atlas-order:crash/{worst}>crash/*}}}}"
    assert fill_atlas_values(f"A{claim}B", [res], notes) == "AB"
    assert fill_atlas_values(f"{{{{atlas-order:crash/{worst}>crash/{runner_up}}}}}", [res], notes) == ""
    for bad, words in [(f"{{{{atlas-order:crash/{runner_up}>crash/{worst}}}}}", "the tables say otherwise"),
                       (f"{{{{atlas-order:crash/{runner_up}>crash/*}}}}", "the tables say otherwise"),
                       ("{{atlas-order:flood/x>crash/*}}", "no atlas kind 'flood'"),
                       ("{{atlas-order:crash/nobody>crash/*}}", "no change of run 'nobody'"),
                       ("{{atlas-order:crash/efimvc}}", "expected {{atlas-order:KIND/RUN>KIND/RUN>...}}")]:
        with pytest.raises(ScenarioError, match=re.escape(words)) as err:
            fill_atlas_values(f"x {bad} y", [res], notes)
        assert str(notes) in str(err.value)
    shipped = ROOT / "studies" / "notes" / "robustness.md"
    results = [_atlas_kind(p.stem) for p in sorted((ROOT / "studies").glob("robustness-*.yaml"))
               if (ROOT / "studies" / "results" / f"{p.stem}.csv").is_file()]  # a study declared, not yet run: none
    text = fill_atlas_values(shipped.read_text(), results, shipped)
    assert "{{" not in text and "atlas-order" in shipped.read_text()


def test_time_to_accuracy_reads_when_a_scored_run_first_reached_the_reference(tmp_path):
    """``{{time-to-accuracy:KIND:REF:RUN}}``: per seed, the first scored round of RUN at or
    above REF's final ACC, as a share of REF's virtual time, with and without RUN's final
    round; the sentence under the table counts the seeds within half of it."""
    from raymvc_reports.pages import CURVE, StudyResult, _row_cell, cell_digests, fill_atlas_values

    st = load_study(ROOT / "studies" / "robustness-async.yaml")
    key, digests = "faults.stragglers.fraction", cell_digests(st)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("needs this repository's git history")

    def row(run, seed, acc, virtual_s, curve=""):  # made after the study file's commit: rows it uses
        r = {"scenario": run, key: "0.4", "seed": str(seed), "status": "completed", "acc": str(acc),
             "virtual_s": str(virtual_s), CURVE: curve, "seeds_commit": head, "head_commit": head}
        return {**r, "cell": digests[_row_cell(r, st)]}

    res = StudyResult(st, [row("ccfc", 700, 0.5, 100.0, "30:0.4 60:0.52 90:0.5"), row("ccfc", 701, 0.6, 100.0),
                           row("ccfc-async", 700, 0.55, 63.0, "10:0.3 40:0.5 60:0.55 final@60.0"),
                           row("ccfc-async", 701, 0.58, 63.0, "10:0.3 40:0.5 60:0.58 final@60.0"),
                           row("ccfc-async", 702, 0.7, 63.0, "10:0.7")])  # no reference at 702: left out
    text = fill_atlas_values("{{time-to-accuracy:async:ccfc:ccfc-async}}", [res], tmp_path / "notes.md")
    lines = [x for x in text.splitlines() if x.startswith("| ")]
    assert len(lines) == 3  # the header and seeds 700, 701
    assert "| 700 | 0.500 | 100.0 s | 60.0 s | 40.0 s | 0.40 | 43.0 s (0.43) | 0.550 |" in lines[1]
    assert "| 701 | 0.600 | 100.0 s | - | never | - | - | 0.580 |" in lines[2]
    assert ("within half of its virtual time at 1 of 2 seeds (1 counting its final round), never at 1; before "
            "CCFC (20 + 20 rounds) itself first stood there at 1 of 1.") in text
    with pytest.raises(ScenarioError, match="no run 'nobody' in robustness-async"):
        fill_atlas_values("{{time-to-accuracy:async:nobody:ccfc-async}}", [res], tmp_path / "notes.md")
    with pytest.raises(ScenarioError, match=re.escape("expected {{time-to-accuracy:KIND:REF:RUN}}")):
        fill_atlas_values("{{time-to-accuracy:async:ccfc}}", [res], tmp_path / "notes.md")


def test_a_share_refuses_runs_of_different_seed_sets_and_says_when_it_is_within_noise(tmp_path):
    """A run that names its own seed subset cannot be shared out against the others' means;
    a share whose interval (seeds resampled together) holds zero says so."""
    from raymvc_reports.pages import ATLAS_SHARE, atlas_share

    def entry(accs, seeds=("700", "701", "702", "703", "704")):
        by_seed = dict(zip(seeds, accs))
        return {"harsh": sum(accs) / len(accs), "ok": len(accs), "total": len(accs), "seeds": list(seeds),
                "harsh_by_seed": by_seed}

    table = {"a": entry([0.9, 0.88, 0.91, 0.89, 0.9]), "c": entry([0.7, 0.72, 0.65, 0.7, 0.71]),
             "half": entry([0.8, 0.8, 0.78, 0.8, 0.8]), "flip": entry([0.9, 0.7, 0.91, 0.7, 0.9]),
             "sub": entry([0.8, 0.8, 0.8], seeds=("700", "701", "702"))}
    notes = tmp_path / "n.md"

    def share(text):
        return atlas_share(ATLAS_SHARE.search(text), {"k": table}, notes)

    assert share("{{atlas-share:k:a:half:c}}") == "50% (95% CI 49% to 52%)"
    assert share("{{atlas-share:k:a:flip:c}}").endswith("; within noise)")
    with pytest.raises(ScenarioError, match=r"the runs sweep different seeds \(a: 700, 701, 702, 703, 704; sub: 700, "
                                            r"701, 702; c: 700, 701, 702, 703, 704\)"):
        share("{{atlas-share:k:a:sub:c}}")


def test_a_paired_difference_says_above_only_where_its_interval_excludes_zero(tmp_path):
    from raymvc_reports.pages import ATLAS_DIFF, atlas_diff

    def entry(accs, seeds=("700", "701", "702", "703", "704")):
        return {"harsh_by_seed": dict(zip(seeds, accs))}

    table = {"a": entry([0.70, 0.72, 0.65, 0.70, 0.71]), "up": entry([0.80, 0.81, 0.76, 0.80, 0.80]),
             "flip": entry([0.90, 0.60, 0.85, 0.62, 0.71]), "one": entry([0.9], seeds=("709",))}
    notes = tmp_path / "n.md"

    def diff(text):
        return atlas_diff(ATLAS_DIFF.search(text), {"k": table}, notes)

    assert diff("{{atlas-diff:k:a:up}}") == "+0.098 (95% CI 0.088 to 0.108, paired over 5 seeds; above)"
    assert diff("{{atlas-diff:k:up:a}}").endswith("; below)")
    assert diff("{{atlas-diff:k:a:flip}}").endswith("; within noise)")
    with pytest.raises(ScenarioError, match="0 seeds where both finished"):
        diff("{{atlas-diff:k:a:one}}")
    with pytest.raises(ScenarioError, match="no run 'nope'"):
        diff("{{atlas-diff:k:a:nope}}")


def test_misspelt_placeholders_malformed_curves_and_untimed_runs_are_one_line_errors(tmp_path):
    """A misspelt or spaced placeholder was copied into the page as it was; a run without
    virtual time divided by zero; a malformed acc_by_time raised a traceback."""
    from raymvc_reports.pages import CURVE, StudyResult, _row_cell, cell_digests, fill_atlas_values

    notes = tmp_path / "notes.md"
    for bad in ("{{atlas-shar:crash:a:b:c}}", "{{ atlas-share:crash:a:b:c }}"):
        with pytest.raises(ScenarioError, match=re.escape(f"{notes}: {bad}: not a placeholder")):
            fill_atlas_values(f"x {bad} y", [], notes)
    st = load_study(ROOT / "studies" / "robustness-async.yaml")
    key, digests = "faults.stragglers.fraction", cell_digests(st)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("needs this repository's git history")

    def row(run, virtual_s, curve):
        r = {"scenario": run, key: "0.4", "seed": "700", "status": "completed", "acc": "0.5",
             "virtual_s": str(virtual_s), CURVE: curve, "seeds_commit": head, "head_commit": head}
        return {**r, "cell": digests[_row_cell(r, st)]}

    untimed = StudyResult(st, [row("ccfc", 0.0, ""), row("ccfc-async", 0.0, "0.0:0.6 final@0.0")])
    with pytest.raises(ScenarioError, match=r"'ccfc' has no virtual time at seed\(s\) 700"):
        fill_atlas_values("{{time-to-accuracy:async:ccfc:ccfc-async}}", [untimed], notes)
    bad = StudyResult(st, [row("ccfc", 9.0, ""), row("ccfc-async", 5.0, "3:0.4 oops final@4")])
    with pytest.raises(ScenarioError, match=r"acc_by_time: 'oops' is not T:ACC or final@T"):
        fill_atlas_values("{{time-to-accuracy:async:ccfc:ccfc-async}}", [bad], notes)
