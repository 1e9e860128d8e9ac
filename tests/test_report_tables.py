"""``raymvc report --format markdown|latex``: tables to paste, means ± std, the best of each
score column in bold, text from folders escaped for the format."""

from __future__ import annotations

from pathlib import Path

import pytest

from raymvc.cli import main
from raymvc.study.tables import escape, runs_table, sweep_table

ROOT = Path(__file__).resolve().parents[1]


def _agg(rows):
    return [{"scenario": s, "faults.dropout.rate": r, "runs": 3, "completed": 3, "degraded": 0, "acc_mean": a,
             "acc_std": 0.01, "mb_mean": mb, "mb_std": 0.0, "info.objective_mean": 5.0, "info.objective_std": 0.0}
            for s, r, a, mb in rows]


@pytest.mark.parametrize("fmt", ["markdown", "latex"])
def test_the_best_of_each_score_column_is_bold_and_mb_counts_lower_as_better(fmt):
    text = sweep_table(_agg([("a", 0.0, 0.9, 2.0), ("a", 0.3, 0.7, 1.0)]), ["faults.dropout.rate"], fmt, "demo")
    bold = (lambda t: rf"\textbf{{{t}}}") if fmt == "latex" else (lambda t: f"**{t}**")
    pm = r" $\pm$ " if fmt == "latex" else " ± "
    assert bold(f"0.900{pm}0.010") in text and bold(f"1.000{pm}0.000") in text  # ACC high, MB low
    assert bold(f"0.700{pm}0.010") not in text and bold(f"2.000{pm}0.000") not in text
    assert bold(f"5.000{pm}0.000") not in text  # a method's own number is not ranked
    if fmt == "latex":
        assert text.startswith(r"\begin{table}") and r"\toprule" in text and text.count(r" \\") == 3
    else:
        assert text.splitlines()[2].startswith("| scenario | dropout | runs | ACC |")


def test_names_from_folders_cannot_break_a_table_or_inject_markup():
    evil = "x|y *b* _i_ `c` <s> & 50% $m$ #1 {a} ~ ^ \\"
    md = escape(evil, "markdown")
    assert "|" not in md.replace("\\|", "") and "<s>" not in md
    tex = escape(evil, "latex")
    for bad in ("&", "%", "$", "#", "{", "}", "_"):
        assert tex.replace("\\" + bad, "").replace(r"\textbackslash{}", "").replace(r"\textasciitilde{}", "") \
            .replace(r"\textasciicircum{}", "").count(bad) == 0, bad
    table = runs_table([evil], [{"method": "m", "seed": 0, "status": "completed", "metrics": {"acc": 0.5},
                                 "communication": {"mb_total": 1.0}}], "markdown", "runs")
    rows = [line for line in table.splitlines()[2:] if not line.startswith("|---")]
    assert len(rows) == 2 and all(line.count(" | ") == 5 for line in rows)  # 6 columns in every row
    assert "$m$" not in table  # no math either


def test_report_prints_markdown_and_latex_for_a_sweep_and_its_runs(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", str(ROOT / "scenarios" / "digits-kfed.yaml"), "--grid", "faults.dropout.rate=[0, 0.3]",
                 "--seeds", "0-1", "--backend", "local", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(out), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| digits-kfed | 0 | 2/2 | **" in md and "| Kappa |" in md
    assert main(["report", str(out), *sorted(str(p) for p in out.glob("*seed0")), "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    assert tex.count(r"\begin{table}") == 2 and r"digits-kfed\_dropout0\_seed0" in tex
