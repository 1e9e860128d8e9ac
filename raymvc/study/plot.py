"""``raymvc plot SWEEP_DIR``: metrics and MB against the swept key, one line per method.

Reads ``sweep.csv`` (and ``sweep.json`` for the grid keys), aggregates over seeds as
``aggregate.csv`` does and writes ``sweep.png`` and ``sweep.svg`` into the sweep folder.

Every grid point is shown, whatever became of its runs. The first panel gives, per grid
point and line, the share of runs that did not finish (status ``failed``, ``error`` or
``interrupted``), with the count ``k/n`` beside each point where some did. The other
panels (ACC, NMI,
ARI where the runs have them, and MB) draw the mean ± std *over the finished runs*
(``completed`` or ``degraded``), with the number of finished runs ``n=`` beside each
point where that is fewer than the runs made there (an open ring); a point where no
run finished is marked ``×`` at the bottom of the panel. The legend says, per line, how
many runs each point holds and at how many points fewer finished. A curve over
survivors looks better the more often a method fails: read it with the failure panel.

The x axis is the first grid key (numeric when every value is a number) and holds every
grid point; other grid keys and several scenarios of one method give separate lines. The
numbers drawn come from :func:`plot_points`, a pure function of the aggregate. The study
pages draw their figures with the same :func:`draw`, adding the papers' numbers.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..metrics import score_title
from ..results.status import FINISHED, NOT_FINISHED
from ..scenario import safe_yaml_load
from .sweep import num, read_sweep, short_key

PANELS = (("acc", "ACC"), ("nmi", "NMI"), ("ari", "ARI"), ("mb", "MB (protocol traffic)"))
# drawn by default too when a sweep has them (unlabelled data has no ACC): the label-free scores
LABEL_FREE = (("metric.silhouette", "silhouette"), ("metric.calinski_harabasz", "Calinski-Harabasz"))


def metric_title(m: str) -> str:
    """A panel's name for the score ``m`` (``acc``, ``metric.purity``, ...)."""
    return dict((*PANELS, *LABEL_FREE)).get(m) or score_title(m)


@dataclass(frozen=True)
class PlotPoint:
    """What the plot draws for one line at one grid point."""

    line: str
    x: str  # the grid value as sweep.csv writes it ("all" without a grid)
    runs: int
    finished: int  # completed + degraded: the runs every mean is taken over
    failed: int  # failed + error + interrupted: counted, never averaged
    stats: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # metric -> (mean, std)

    @property
    def failed_share(self) -> float:
        return self.failed / self.runs if self.runs else 0.0


@dataclass(frozen=True)
class Reference:
    """A published number drawn beside the lines: ``value`` of ``metric`` at grid value ``x``."""

    name: str
    metric: str
    x: str
    value: float


def _x_value(text: str):
    try:
        v = safe_yaml_load(text)
    except yaml.YAMLError:
        return text
    return v


def _x_positions(xs_text: list[str]) -> tuple[dict[str, float], bool]:
    """x positions: numeric when every value is a number, else categories in grid order."""
    xs_val = [_x_value(t) for t in xs_text]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs_val)
    pos = {t: (float(v) if numeric else i) for i, (t, v) in enumerate(zip(xs_text, xs_val))}
    return pos, numeric


def _line_names(agg: list[dict], other: list[str]) -> list[str]:
    """One line per method (and scenario, and other grid keys), one name per aggregate row."""
    methods_per_scenario: dict[str, set] = {}
    for r in agg:
        methods_per_scenario.setdefault(r["method"], set()).add(r["scenario"])

    def line_name(r) -> str:
        name = r["method"] if len(methods_per_scenario[r["method"]]) == 1 else f"{r['method']} ({r['scenario']})"
        if other:
            name += " " + " ".join(f"{short_key(k)}={r[k]}" for k in other)
        return name

    return [line_name(r) for r in agg]


def plot_points(agg: list[dict], keys: list[str]) -> list[PlotPoint]:
    """The numbers the plot draws: one point per aggregate row (line, grid point), in order.

    ``agg`` is :func:`raymvc.study.sweep.aggregate`'s output (or ``aggregate.csv``'s rows) over
    the grid ``keys``; the first key is the x axis. A grid point whose runs all failed is
    kept, with ``finished == 0`` and no means.
    """
    xkey = keys[0] if keys else None
    points = []
    for name, r in zip(_line_names(agg, list(keys[1:])), agg):
        finished = sum(int(r.get(k) or 0) for k in FINISHED)
        failed = sum(int(r.get(k) or 0) for k in NOT_FINISHED)
        names = dict.fromkeys([*(m for m, _ in PANELS), *(k[:-5] for k in r if k.endswith("_mean"))])
        stats = {m: (num(r.get(f"{m}_mean")), num(r.get(f"{m}_std"))) for m in names}
        points.append(PlotPoint(line=name, x=str(r[xkey]) if xkey else "all", runs=int(r["runs"]),
                                finished=finished, failed=failed, stats=stats))
    return points


def sweep_points(sweep_dir: str | Path) -> list[PlotPoint]:
    """:func:`plot_points` of a sweep folder (its ``sweep.csv`` and ``sweep.json``)."""
    meta, _rows, agg = read_sweep(sweep_dir)
    return plot_points(agg, list(meta.get("grid_keys") or []))


def _by_line(points: list[PlotPoint], pos: dict[str, float]) -> dict[str, list[PlotPoint]]:
    lines: dict[str, list[PlotPoint]] = {}
    for p in points:
        lines.setdefault(p.line, []).append(p)
    return {k: sorted(v, key=lambda p: pos[p.x]) for k, v in lines.items()}


def _draw_failures(ax, lines: dict[str, list[PlotPoint]], pos: dict[str, float], colors: dict[str, str],
                   logx: bool = False) -> None:
    span = (max(pos.values()) - min(pos.values())) or 1.0
    for i, (name, pts) in enumerate(lines.items()):
        k = i - (len(lines) - 1) / 2  # lines side by side, none hidden under another
        x = [pos[p.x] * 1.03 ** k if logx else pos[p.x] + k * 0.012 * span for p in pts]
        y = [p.failed_share for p in pts]
        ax.plot(x, y, marker="s", markersize=5, linewidth=1.2, linestyle="--", color=colors[name])
        for xi, yi, p in zip(x, y, pts):
            if p.failed:
                ax.annotate(f"{p.failed}/{p.runs}", (xi, yi), textcoords="offset points", xytext=(0, 6 + 9 * i),
                            ha="center", fontsize=7, color=colors[name])
    ax.set_ylim(-0.05, 1.25)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])


def _draw_panel(ax, m: str, lines: dict[str, list[PlotPoint]], pos: dict[str, float],
                colors: dict[str, str]) -> None:
    for i, (name, pts) in enumerate(lines.items()):
        color = colors[name]
        done = [p for p in pts if p.stats.get(m, (None, None))[0] is not None]
        for p in pts:  # no finished run here: a mark at the bottom, never a vanished point
            if p.stats.get(m, (None, None))[0] is None:
                ax.plot([pos[p.x]], [0.0], marker="x", markersize=8, color=color, clip_on=False,
                        transform=ax.get_xaxis_transform())
                ax.annotate(f"n=0 of {p.runs}", (pos[p.x], 0.0), xycoords=("data", "axes fraction"),
                            textcoords="offset points", xytext=(0, 7 + 9 * i), ha="center", fontsize=7,
                            color=color)
        if not done:
            continue
        x = [pos[p.x] for p in done]
        y = [p.stats.get(m, (None, None))[0] for p in done]
        e = [p.stats.get(m, (None, None))[1] or 0.0 for p in done]
        ax.errorbar(x, y, yerr=e, marker="o", markersize=4, capsize=3, linewidth=1.5, color=color)
        for xi, yi, p in zip(x, y, done):
            if p.finished < p.runs:  # a mean over fewer runs: an open ring and its count
                ax.plot([xi], [yi], marker="o", markersize=9, color=color, markerfacecolor="none")
                ax.annotate(f"n={p.finished} of {p.runs}", (xi, yi), textcoords="offset points",
                            xytext=(0, 6 + 9 * i), ha="center", fontsize=7, color=color)


def _title(meta: dict, points: list[PlotPoint], xkey: str | None) -> str:
    n_runs = sum(p.runs for p in points)
    n_failed = sum(p.failed for p in points)
    seeds = meta.get("seeds")
    over = f" of seeds {','.join(map(str, seeds))}" if seeds else ""
    text = f"{xkey or 'runs'}: metrics are the mean ± std over the finished runs{over}"
    if n_failed:
        text += (f"; {n_failed} of {n_runs} runs failed, raised an error or were interrupted: counted in the "
                 f"first panel, left out of the means (open rings: n = finished runs; × where none finished)")
    else:
        text += f"; all {n_runs} runs finished"
    return text


def _legend_label(name: str, pts: list[PlotPoint]) -> str:
    lo, hi = min(p.runs for p in pts), max(p.runs for p in pts)
    each = f"{hi} run{'s' if hi != 1 else ''} per point" if lo == hi else f"{lo}-{hi} runs per point"
    fewer = sum(p.finished < p.runs for p in pts)
    name = literal(name)
    return f"{name}: mean over finished runs\n({each}; fewer at {fewer} of {len(pts)} points)" if fewer else \
        f"{name}: mean over finished runs\n({each}, all finished)"


def _separates(labels: list[str], i: int) -> bool:
    """Whether the character at ``i`` (shared by every label) separates words: "_", " ",
    "/", "=", or a "-" between letters (never a minus sign or an exponent's "-")."""
    c = labels[0][i]
    if c in "_ /=":
        return True
    return c == "-" and i > 0 and labels[0][i - 1].isalpha() and all(v[i + 1:i + 2].isalpha() for v in labels)


def _category_labels(values: list[str], width: int = 14) -> list[str]:
    """Tick labels for a categorical axis, each still telling its point apart: a prefix all
    share (up to a separator) is dropped, and a long label is wrapped, never cut."""
    labels = list(values)
    if len(labels) > 1:
        shared = os.path.commonprefix(labels)
        cut = max((i + 1 for i in range(len(shared)) if _separates(labels, i)), default=0)
        if cut and all(len(v) > cut for v in labels):
            labels = [v[cut:] for v in labels]
    return [literal("\n".join(textwrap.wrap(v, width, break_on_hyphens=True)) or v) for v in labels]


def _style_axis(ax, x_label, xs_text, pos, numeric, logx) -> None:
    ax.set_xlabel(literal(x_label))
    ticks = list(pos.values())
    if logx:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(ticks)
    if numeric:
        ax.set_xticklabels([literal(t) if len(t) <= 8 else f"{float(_x_value(t)):.3g}" for t in xs_text])
        if logx:
            ratio = (max(ticks) / min(ticks)) ** 0.08
            ax.set_xlim(min(ticks) / ratio, max(ticks) * ratio)
        else:
            span = (max(ticks) - min(ticks)) or 1.0
            ax.set_xlim(min(ticks) - 0.08 * span, max(ticks) + 0.08 * span)
    else:
        ax.set_xticklabels(_category_labels(xs_text), rotation=20, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(ticks) - 0.5)
    ax.grid(True, alpha=0.3)


def literal(text: str) -> str:
    """``text`` as matplotlib draws it literally: a ``$`` (which would start TeX math) escaped."""
    return str(text).replace("$", r"\$")


def draw(points: list[PlotPoint], paths: list[Path], *, x_values: list[str], x_label: str, title: str,
         metrics: list[tuple[str, str]] | None = None, references: list[Reference] = (), dpi: int = 130) -> list[Path]:
    """The one figure of raymvc's sweeps and study pages: a panel with the share of runs
    that did not finish per grid point, then one panel per metric with the mean ± std over
    the finished runs of every line (open rings and ``n=`` where fewer finished, ``×``
    where none did) and the ``references`` as black crosses. ``x_values``: the grid
    values in order, as the points name them (a numeric axis, in log scale over two
    decades or more, when all are numbers); ``metrics``: (key, name) panels (default: each
    of ACC, NMI, ARI and MB that some point has). Writes every path and returns them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if metrics is None:
        metrics = [(m, t) for m, t in (*PANELS, *LABEL_FREE)
                   if any(p.stats.get(m, (None,))[0] is not None for p in points)]
        metrics = metrics or [PANELS[0]]
    panels = [("failed", "Runs not finished (failed / error / interrupted)")] + \
        [(m, f"{t}: mean ± std over finished runs") for m, t in metrics]
    pos, numeric = _x_positions(x_values)
    logx = numeric and min(pos.values()) > 0 and max(pos.values()) / min(pos.values()) >= 100
    lines = _by_line(points, pos)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {name: cycle[i % len(cycle)] for i, name in enumerate(lines)}

    ncols = 3 if len(panels) > 4 else min(2, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig, grid_axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows + 1.2), squeeze=False,
                                  layout="constrained")
    axes = list(grid_axes.ravel())
    for ax in axes[len(panels):]:
        ax.axis("off")
    mb = [v for p in points if (v := p.stats.get("mb", (None,))[0]) is not None and v > 0]
    handles = [Line2D([], [], color=colors[n], marker="o", label=_legend_label(n, pts)) for n, pts in lines.items()]
    refs: dict[str, list[Reference]] = {}
    for r in references:
        if r.x in pos:
            refs.setdefault(r.name, []).append(r)
    for (name, _), marker in zip(sorted(refs.items()), "xP*+D"):
        handles.append(Line2D([], [], color="k", marker=marker, linestyle=":", label=literal(name)))
    for ax, (m, name) in zip(axes, panels):
        if m == "failed":
            _draw_failures(ax, lines, pos, colors, logx)
            ax.set_ylabel("share of runs")
        else:
            _draw_panel(ax, m, lines, pos, colors)
            for (_, rs), marker in zip(sorted(refs.items()), "xP*+D"):
                xy = sorted((pos[r.x], r.value) for r in rs if r.metric == m)
                if xy:
                    ax.plot(*zip(*xy), marker=marker, linestyle=":", color="k", markersize=7, linewidth=0.8)
        ax.set_title(name, fontsize=9)
        _style_axis(ax, x_label, x_values, pos, numeric, logx)
        if m == "mb" and mb and max(mb) / min(mb) > 50:
            ax.set_yscale("log")
    width = int(fig.get_size_inches()[0] * 11)  # characters that surely fit at fontsize 10
    fig.suptitle(literal("\n".join(textwrap.wrap(title, width))), fontsize=10)
    if len(axes) > len(panels):  # a spare slot holds the legend
        axes[-1].legend(handles=handles, loc="center", fontsize=9, frameon=False)
    else:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), ncols),
                   fontsize=9 if len(handles) <= ncols else 8, frameon=False)
    written = []
    for path in paths:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
        written.append(Path(path))
    plt.close(fig)
    return written


def plot_sweep(sweep_dir: str | Path, formats: tuple[str, ...] = ("png", "svg"),
               metrics: list[str] | None = None) -> list[Path]:
    """``sweep.<format>`` in a sweep folder: :func:`draw` of its aggregate. ``metrics``: the
    scores to draw, by their sweep.csv names (``acc``, ``mb``, ``metric.purity`` or just
    ``purity``); default: ACC, NMI, ARI, MB and the label-free scores, those the sweep has."""
    d = Path(sweep_dir)
    meta, _rows, agg = read_sweep(d)
    if not agg:
        raise ValueError(f"{d}: sweep.csv holds no runs")
    keys = list(meta.get("grid_keys") or [])
    xkey = keys[0] if keys else None
    points = plot_points(agg, keys)
    panels = None
    if metrics:
        have = sorted({m for p in points for m, (mean, _) in p.stats.items() if mean is not None})
        panels = []
        for m in metrics:
            name = m if m in have else f"metric.{m}"
            if name not in have:
                raise ValueError(f"--metric {m}: the sweep has no such score (it has: {', '.join(have) or 'none'})")
            panels.append((name, metric_title(name)))
    x_values = list(dict.fromkeys(str(r[xkey]) for r in agg)) if xkey else ["all"]
    return draw(points, [d / f"sweep.{fmt}" for fmt in formats], x_values=x_values,
                x_label=short_key(xkey) if xkey else "", title=_title(meta, points, xkey), metrics=panels)
