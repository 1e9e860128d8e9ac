"""``raymvc plot SWEEP_DIR``: metrics and MB against the swept key, one line per method.

Reads ``sweep.csv`` (and ``sweep.json`` for the grid keys), aggregates over seeds as
``aggregate.csv`` does (failed runs left out of the means) and writes ``sweep.png`` and
``sweep.svg`` into the sweep folder: one panel per metric (ACC, NMI, ARI where the runs
have them) and one for MB, mean ± std as error bars. The x axis is the first grid key
(numeric when every value is a number); other grid keys and several scenarios of one
method give separate lines.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .scenario import safe_yaml_load
from .studies import _num, read_sweep, short_key

PANELS = (("acc", "ACC"), ("nmi", "NMI"), ("ari", "ARI"), ("mb", "MB (protocol traffic)"))


def _x_value(text: str):
    try:
        v = safe_yaml_load(text)
    except yaml.YAMLError:
        return text
    return v


def _x_positions(agg: list[dict], xkey: str | None) -> tuple[list[str], dict[str, float], bool]:
    """x positions: numeric when every value is a number, else categories in grid order."""
    xs_text = list(dict.fromkeys(str(r[xkey]) for r in agg)) if xkey else ["all"]
    xs_val = [_x_value(t) for t in xs_text]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs_val)
    pos = {t: (float(v) if numeric else i) for i, (t, v) in enumerate(zip(xs_text, xs_val))}
    return xs_text, pos, numeric


def _lines(agg: list[dict], other: list[str]) -> dict[str, list[dict]]:
    """Aggregate rows grouped into one line per method (and scenario, and other grid keys)."""
    methods_per_scenario: dict[str, set] = {}
    for r in agg:
        methods_per_scenario.setdefault(r["method"], set()).add(r["scenario"])

    def line_name(r) -> str:
        name = r["method"] if len(methods_per_scenario[r["method"]]) == 1 else f"{r['method']} ({r['scenario']})"
        if other:
            name += " " + " ".join(f"{short_key(k)}={r[k]}" for k in other)
        return name

    lines: dict[str, list[dict]] = {}
    for r in agg:
        lines.setdefault(line_name(r), []).append(r)
    return lines


def _left_out(r: dict) -> int:
    """Runs of an aggregate row that no mean includes: failed, error, interrupted."""
    return sum(int(r.get(k) or 0) for k in ("failed", "error", "interrupted"))


def _draw_panel(ax, m: str, lines: dict[str, list[dict]], xkey: str | None, pos: dict[str, float]) -> None:
    for name, rs in lines.items():
        rs = sorted(rs, key=lambda r: pos[str(r[xkey])] if xkey else 0)
        pts = [(pos[str(r[xkey])] if xkey else 0, _num(r.get(f"{m}_mean")), _num(r.get(f"{m}_std")) or 0.0,
                _left_out(r), int(r["runs"])) for r in rs]
        pts = [p for p in pts if p[1] is not None]
        if not pts:
            continue
        x, y, e, failed, runs = zip(*pts)
        line = ax.errorbar(x, y, yerr=e, marker="o", markersize=4, capsize=3, linewidth=1.5, label=name)
        color = line[0].get_color()
        for xi, yi, fi, ni in zip(x, y, failed, runs):
            if fi:  # a mean over fewer runs: an open ring and the count of failed runs
                ax.plot([xi], [yi], marker="o", markersize=9, color=color, markerfacecolor="none",
                        markeredgecolor=color)
                ax.annotate(f"{fi}/{ni} left out", (xi, yi), textcoords="offset points", xytext=(0, 9),
                            ha="center", fontsize=7, color=color)


def _title(meta: dict, agg: list[dict], xkey: str | None) -> str:
    n_runs = sum(int(r["runs"]) for r in agg)
    n_failed = sum(_left_out(r) for r in agg)
    seeds = meta.get("seeds")
    sub = f"mean ± std over seeds {','.join(map(str, seeds))}" if seeds else "mean ± std over seeds"
    if n_failed:
        sub += f"; {n_failed} of {n_runs} runs failed, raised an error or were interrupted: left out of the means (open rings)"
    return f"{xkey or 'runs'}: {sub}"


def plot_sweep(sweep_dir: str | Path, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(sweep_dir)
    meta, rows, agg = read_sweep(d)
    keys = list(meta.get("grid_keys") or [])
    xkey = keys[0] if keys else None
    panels = [(m, title) for m, title in PANELS if any(_num(r.get(f"{m}_mean")) is not None for r in agg)]
    if not panels:
        raise ValueError(f"{d}: no finished run has scores to plot")
    xs_text, pos, numeric = _x_positions(agg, xkey)
    lines = _lines(agg, keys[1:])

    ncols = 2 if len(panels) > 2 else len(panels)
    nrows = (len(panels) + ncols - 1) // ncols
    fig, grid_axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.3 * nrows + 0.9), squeeze=False)
    axes = list(grid_axes.ravel())
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    mb_values = [v for r in agg if (v := _num(r.get("mb_mean"))) is not None and v > 0]
    for ax, (m, title) in zip(axes, panels):
        _draw_panel(ax, m, lines, xkey, pos)
        ax.set_title(title)
        ax.set_xlabel(short_key(xkey) if xkey else "")
        if not numeric:
            ax.set_xticks(list(pos.values()))
            ax.set_xticklabels([t if len(t) <= 14 else t[:13] + "…" for t in xs_text], rotation=20, ha="right")
        if m == "mb" and mb_values and max(mb_values) / min(mb_values) > 50:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle(_title(meta, agg, xkey), fontsize=10)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=min(len(labels), 4),
               fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / fig.get_size_inches()[1]))
    written = []
    for fmt in formats:
        path = d / f"sweep.{fmt}"
        fig.savefig(path, dpi=130)
        written.append(path)
    plt.close(fig)
    return written
