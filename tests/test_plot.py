"""The sweep plot shows every grid point: failures counted per point, means over finished runs labelled."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import raymvc
from raymvc.study.plot import plot_points, plot_sweep, sweep_points
from raymvc.study.sweep import RUN_FIELDS, aggregate

ROOT = Path(__file__).resolve().parents[1]
KEY = "faults.dropout.rate"


def _row(rate, seed, status, acc=None):
    return {"scenario": "hw-cefmc", "method": "cefmc", KEY: str(rate), "seed": seed, "status": status,
            "acc": acc, "nmi": acc, "ari": acc, "mb": 1.0 if acc is not None else None}


def _write_sweep(d: Path, rows: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    fields = ["scenario", "method", KEY, *RUN_FIELDS]
    with open(d / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r.get(k) for k in fields})
    (d / "sweep.json").write_text(json.dumps({"grid_keys": [KEY], "seeds": [0, 1]}))


# what `raymvc sweep scenarios/hw-cefmc.yaml --grid 'faults.dropout.rate=[0, 0.2, 0.4]'
# --set faults.min_clients=5 --seeds 0-1` gives: every run at 0.2 and 0.4 fails
MIN_CLIENTS_ROWS = [_row(0, 0, "completed", 0.946), _row(0, 1, "completed", 0.9445),
                    _row(0.2, 0, "failed", 0.946), _row(0.2, 1, "failed", 0.926),
                    _row(0.4, 0, "failed"), _row(0.4, 1, "error", 0.926)]


def test_points_keep_every_grid_point_with_its_failures():
    pts = plot_points(aggregate(MIN_CLIENTS_ROWS, [KEY]), [KEY])
    assert [(p.x, p.runs, p.finished, p.failed) for p in pts] == [("0", 2, 2, 0), ("0.2", 2, 0, 2), ("0.4", 2, 0, 2)]
    assert [p.failed_share for p in pts] == [0.0, 1.0, 1.0]
    assert {p.line for p in pts} == {"cefmc"}
    mean, std = pts[0].stats["acc"]
    assert mean == pytest.approx(0.94525) and std == pytest.approx(0.0010607, rel=1e-4)
    # failed runs never enter a mean, even when they carry scores
    assert all(p.stats[m] == (None, None) for p in pts[1:] for m in ("acc", "nmi", "ari", "mb"))


def test_a_mean_over_fewer_runs_counts_both_and_lines_split_by_the_other_keys():
    rows = [dict(r, **{"k2": k2}) for k2 in ("a", "b") for r in
            [_row(0, 0, "completed", 0.9), _row(0, 1, "interrupted"), _row(0, 2, "degraded", 0.7)]]
    pts = plot_points(aggregate(rows, [KEY, "k2"]), [KEY, "k2"])
    assert [(p.line, p.finished, p.failed) for p in pts] == [("cefmc k2=a", 2, 1), ("cefmc k2=b", 2, 1)]
    assert pts[0].stats["acc"][0] == pytest.approx(0.8)


def test_plot_of_a_sweep_where_every_run_failed_still_draws(tmp_path):
    d = tmp_path / "sw"
    _write_sweep(d, [_row(0.5, 0, "failed"), _row(0.5, 1, "error")])
    assert [(p.x, p.finished, p.failed) for p in sweep_points(d)] == [("0.5", 0, 2)]
    for path in plot_sweep(d):
        assert path.stat().st_size > 1000


def test_min_clients_sweep_plots_all_three_points(tmp_path):
    out = tmp_path / "minclients"
    s = raymvc.sweep(ROOT / "scenarios" / "hw-cefmc.yaml", grid={KEY: [0, 0.2, 0.4]}, seeds=[0, 1],
                     overrides=["faults.min_clients=5"], backend="local", out=out)
    assert len(s.runs) == 6
    pts = sweep_points(out)
    assert [(p.x, p.runs, p.finished, p.failed) for p in pts] == [("0", 2, 2, 0), ("0.2", 2, 0, 2), ("0.4", 2, 0, 2)]
    assert pts[0].stats["acc"][0] > 0.9
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text kept as text
        (path,) = plot_sweep(out, formats=("svg",))
    svg = path.read_text()
    assert "mean over finished runs" in svg and "2/2" in svg and "n=0 of 2" in svg


@pytest.mark.parametrize("values, shown", [
    (["proteinfold-per0.1", "proteinfold-per0.3", "proteinfold-per0.5", "crash-at-round-one-of-five"], "per0.3"),
    (["proteinfold-per0.1", "proteinfold-per0.3", "proteinfold-per0.5"], "per0.3"),
    (["lr-1e-05", "lr-1e-04", "lr-1e-03"], "1e-05"),  # an exponent's "-" is not a separator
    (["x=-1", "x=-2", "x=-3"], "-2"),  # nor is a minus sign
])
def test_categorical_ticks_that_share_a_long_prefix_stay_distinct(tmp_path, monkeypatch, values, shown):
    import matplotlib.figure

    from raymvc.study.plot import draw
    pts = plot_points(aggregate([{**_row(0, 0, "completed", 0.5), KEY: v} for v in values], [KEY]), [KEY])
    seen: list[list[str]] = []
    real = matplotlib.figure.Figure.savefig

    def keep_ticks(fig, *a, **kw):
        seen.extend([t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes
                    if ax.get_visible() and ax.get_xlabel() == "scenario")
        return real(fig, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep_ticks)
    draw(pts, [tmp_path / "f.png"], x_values=values, x_label="scenario", title="t")
    assert seen and all(len(set(ticks)) == len(values) for ticks in seen)
    assert all("…" not in t for ticks in seen for t in ticks)
    # a shared "proteinfold-" is not what tells them apart, yet each keeps its own part, whole
    assert any(shown in t.replace("\n", "") for t in seen[0])


def test_dollar_signs_in_labels_and_grid_values_are_drawn_as_text(tmp_path):
    """A grid value "$^$" or a label "CeFMC $\\frac{1$ x" is text: matplotlib's math parser
    never sees it (it raised on both)."""
    d = tmp_path / "sw"
    rows = [{**_row("$^$", s, "completed", 0.5 + s / 10), "scenario": "CeFMC $\\frac{1$ x"} for s in (0, 1)]
    _write_sweep(d, rows + [_row(0.1, 0, "completed", 0.6)])
    for path in plot_sweep(d):
        assert path.stat().st_size > 1000
    from raymvc.study.plot import draw

    pts = plot_points(aggregate(rows, [KEY]), [KEY])
    (path,) = draw(pts, [tmp_path / "f.png"], x_values=["$^$"], x_label="$x_{", title="CeFMC $\\frac{1$ x")
    assert path.stat().st_size > 1000
