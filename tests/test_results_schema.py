"""One results schema: every score a run reports and every number of its protocol_info reach
sweep.csv, the aggregate, ``raymvc plot --metric`` and study files (e.g. Kappa)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import commit_all

import raymvc
from raymvc.cli import main
from raymvc.scenario import ScenarioError
from raymvc.study.files import load_study
from raymvc.study.sweep import column_of, info_numbers
from raymvc_reports.pages import _row_cell, cell_digests, write_pages

ROOT = Path(__file__).resolve().parent.parent


def test_protocol_info_numbers_become_info_columns_and_flags_lists_and_odd_keys_stay_out():
    info = {"objective": 1.5, "rounds_trained": 7, "converged": True, "members": [1, 2], "bad key": 3.0,
            "nan": float("nan"), "early": None}
    assert info_numbers(info) == {"info.objective": 1.5, "info.rounds_trained": 7}
    assert info_numbers(None) == {} and info_numbers([1]) == {}
    assert [column_of(m) for m in ("acc", "mb", "kappa", "metric.purity", "info.objective")] == \
        ["acc", "mb", "metric.kappa", "metric.purity", "info.objective"]


@pytest.fixture(scope="module")
def kfed_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("schema") / "sweep"
    s = raymvc.sweep(str(ROOT / "scenarios" / "digits-kfed.yaml"), seeds=[0, 1], backend="local", out=str(out))
    return out, s


def test_a_horizontal_sweep_carries_kappa_and_the_methods_numbers_in_sweep_csv_and_its_aggregate(kfed_sweep):
    out, s = kfed_sweep
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        summary = json.loads((out / r["run_dir"] / "summary.json").read_text())
        assert float(r["metric.kappa"]) == pytest.approx(summary["metrics"]["kappa"])
        assert int(r["info.global_centroids"]) == summary["protocol_info"]["global_centroids"]
    agg = s.aggregate[0]
    assert agg["info.global_centroids_mean"] == pytest.approx(
        sum(int(r["info.global_centroids"]) for r in rows) / len(rows))
    assert "metric.kappa_mean" in agg


def test_sweep_csv_carries_the_fewest_and_most_rows_a_client_held(kfed_sweep):
    out, _ = kfed_sweep
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        sizes = json.loads((out / r["run_dir"] / "summary.json").read_text())["data_info"]["client_sizes"]
        assert (int(r["client_rows_min"]), int(r["client_rows_max"])) == (min(sizes), max(sizes))


def test_every_key_a_summary_writes_is_in_docs_results(kfed_sweep):
    """docs/results.md names every top-level key of a run's summary.json and every key of
    its fixed sections (the method's protocol_info, placement and platform are open)."""
    out, _ = kfed_sweep
    doc = (ROOT / "docs" / "results.md").read_text()
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    keys = list(summary)
    for section in ("communication", "faults", "timing", "data_info", "metrics"):
        keys += list(summary[section])
    keys += [k for k in next(iter(summary["per_client_bytes"].values()))]
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, f"docs/results.md does not name {missing}"


def test_plot_draws_kappa_and_an_info_number_and_names_what_a_sweep_has(kfed_sweep, capsys):
    out, _ = kfed_sweep
    assert main(["plot", str(out), "--metric", "kappa", "--metric", "info.global_centroids"]) == 0
    assert (out / "sweep.png").stat().st_size > 0
    assert main(["plot", str(out), "--metric", "info.nothing"]) != 0
    assert "info.global_centroids" in capsys.readouterr().err


def _study(tmp_path: Path, metrics: str, extra: str = "") -> Path:
    path = tmp_path / "studies" / "demo-kappa.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("study:\n  paper: demo\n  title: Kappa table\n  seeds: 0-1\n"
                    f"  metrics: {metrics}\n  readme: false\n"
                    "  runs:\n    - {id: kfed, label: k-FED, variant: baseline, "
                    f"scenario: {ROOT / 'scenarios' / 'digits-kfed.yaml'}}}\n"
                    f"{extra}")
    return path


def test_a_study_asks_for_kappa_and_an_info_number_and_its_page_shows_them_with_the_papers_kappa(tmp_path, kfed_sweep):
    out, _ = kfed_sweep
    study = _study(tmp_path, "[kappa, info.global_centroids]", "  paper_results:\n    - {run: kfed, kappa: 0.4321}\n")
    st = load_study(study)
    assert st.spec.metrics == ["kappa", "info.global_centroids"]
    head = commit_all(tmp_path)  # declared before its runs
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    rows = [{**r, "scenario": "kfed", "seeds_commit": head, "head_commit": head, "study": "demo-kappa",
             "code_version": "v", "platform": "p", "labels_sha256": "h", "joined": ""} for r in rows]
    rows = [{**r, "cell": cell_digests(st).get(_row_cell(r, st), "")} for r in rows]
    record = tmp_path / "studies" / "results" / "demo-kappa.csv"
    record.parent.mkdir()
    with record.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_pages(tmp_path / "studies", tmp_path / "runs")
    page = (tmp_path / "studies" / "demo.md").read_text()
    kappas = [float(r["metric.kappa"]) for r in rows]
    table_head = next(line for line in page.splitlines() if line.startswith("| run |"))
    assert "| Kappa | info.global_centroids | Kappa, 95% CI of the mean | paper Kappa |" in table_head
    row = next(line for line in page.splitlines() if line.startswith("| k-FED |"))
    assert f"| 2/2 | {sum(kappas) / 2:.3f} ± " in row and "| 0.432 |" in row
    assert row.endswith(" | " + " / ".join(f"{k:.3f}" for k in kappas) + " |")  # each seed's Kappa


def test_a_study_asking_for_a_score_no_run_reports_is_refused_in_one_line(tmp_path):
    study = _study(tmp_path, "[acc, kapa]")
    with pytest.raises(ScenarioError, match=r"kapa.*no score a run reports.*info\.<key>"):
        load_study(study)
