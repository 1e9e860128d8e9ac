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
    for table in _tabulars(tex):  # LaTeX's own reading: every row has the columns its spec declares
        assert table["rows"] and all(n == table["columns"] for n in table["rows"])
    import raymvc

    res = raymvc.SweepResult.load(out)
    assert main(["report", str(out), "--format", "latex"]) == 0
    assert res.to_latex() in capsys.readouterr().out and _tabulars(res.to_latex())
    assert "| digits-kfed | 0 | 2/2 | **" in res.to_markdown()


def _tabulars(tex: str) -> list[dict]:
    """Each ``tabular`` of ``tex`` as pylatexenc parses it: the columns its spec declares
    and the cells in each row (``&`` separated, rows ended by ``\\``)."""
    from pylatexenc.latexwalker import LatexEnvironmentNode, LatexGroupNode, LatexSpecialsNode, LatexWalker

    def walk(nodes):
        for n in nodes or []:
            if isinstance(n, LatexEnvironmentNode) and n.environmentname == "tabular":
                yield n
            yield from walk(getattr(n, "nodelist", None))

    out = []
    for env in walk(LatexWalker(tex, tolerant_parsing=False).get_latex_nodes()[0]):
        spec = env.nodeargd.argnlist[-1]
        assert isinstance(spec, LatexGroupNode)
        columns = sum(c in "lcr" for c in spec.latex_verbatim().strip("{}"))
        rows, cells = [], 1
        for n in env.nodelist:
            if isinstance(n, LatexSpecialsNode) and n.specials_chars == "&":
                cells += 1
            elif getattr(n, "macroname", None) == "\\":
                rows.append(cells)
                cells = 1
        out.append({"columns": columns, "rows": rows})
    return out


def test_report_on_two_sweeps_says_what_differs_between_them(tmp_path, capsys):
    scen = str(ROOT / "scenarios" / "digits-kfed.yaml")
    for name, rate in (("a", "0.1"), ("b", "0.3")):
        assert main(["sweep", scen, "--set", f"faults.dropout.rate={rate}", "--seeds", "0", "--backend", "local",
                     "--out", str(tmp_path / name), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    assert "differing sweep settings: overrides.faults.dropout.rate" in text
    assert "faults.dropout.rate=0.1" in text and "faults.dropout.rate=0.3" in text
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "markdown"]) == 0
    assert "(overrides.faults.dropout.rate=0.3)" in capsys.readouterr().out
