"""A run's own figure (``raymvc plot RUN``): how it went round by round, from ``rounds.jsonl``.

Panels, each only where the run has something to draw: the scores by round and by virtual
time (rounds scored with ``runtime.score_every``; the run's final scores as stars at its
last round), the MB each round moved (and their running total), and who took part in each
round (replied, away, late, crashed or in error, not asked by client sampling).
"""

from __future__ import annotations

from pathlib import Path

from ..metrics import score_title
from .runfolder import RunFolder

DEFAULT_SCORES = ("acc", "nmi", "ari", "silhouette")  # drawn when the run scored them and --metric names none
PARTICIPATION = (  # (record field(s), legend, colour): stacked per round, bottom to top
    (("replied",), "replied", "tab:green"),
    (("dropped",), "away (dropped out)", "tab:grey"),
    (("late",), "late (past the deadline)", "tab:orange"),
    (("crashed", "client_errors", "rejected"), "crashed, error or rejected", "tab:red"),
    (("not_sampled",), "not asked (sampling)", "lightsteelblue"),
)


def _scored(rounds, metrics: list[str] | None) -> tuple[list[str], list]:
    """The scores to draw and the rounds that carry scores."""
    scored = [r for r in rounds if r.scores]
    have = sorted({k for r in scored for k, v in r.scores.items() if isinstance(v, (int, float))})
    if metrics:
        bad = [m for m in metrics if m not in have]
        if bad:
            raise ValueError(f"--metric {bad[0]}: the run scored no such score by round (it has: "
                             f"{', '.join(have) or 'none; score rounds with runtime.score_every'})")
        return list(metrics), scored
    return [m for m in DEFAULT_SCORES if m in have] or have[:3], scored


def plot_run(run_dir: str | Path, formats: tuple[str, ...] = ("png", "svg"),
             metrics: list[str] | None = None) -> list[Path]:
    """``run.<format>`` in a run folder; ``metrics``: the by-round scores to draw (default:
    ACC, NMI and ARI, or the label-free scores, those the run has). ValueError for a folder
    with no rounds or a score it never reported."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    folder = RunFolder(run_dir)
    rounds = folder.rounds()
    if not rounds:
        raise ValueError(f"{folder.path}: rounds.jsonl holds no rounds (give a run folder written by raymvc run)")
    summary = folder.summary() if folder.has_summary() else None
    names, scored = _scored(rounds, metrics)
    virtual = any(r.virtual_end_s > 0 for r in rounds)
    panels = (["by_round"] + (["by_time"] if virtual else [])) if scored else []
    panels += ["mb", "who"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, 2.6 * len(panels) + 0.6), squeeze=False,
                             layout="constrained")
    axes = list(axes.ravel())
    xs = [r.round for r in rounds]
    for ax, panel in zip(axes, panels):
        if panel != "by_time":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if panel in ("by_round", "by_time"):
            for m in names:
                pts = [((r.round if panel == "by_round" else r.virtual_end_s), r.scores.get(m)) for r in scored]
                pts = [(x, y) for x, y in pts if isinstance(y, (int, float))]
                if pts:
                    line, = ax.plot(*zip(*pts), marker="o", markersize=3, label=score_title(m))
                    final = (summary.metrics or {}).get(m) if summary is not None else None
                    if panel == "by_round" and isinstance(final, (int, float)):
                        ax.plot([rounds[-1].round], [final], marker="*", markersize=11, color=line.get_color(),
                                linestyle="none")
            ax.set_xlabel("round" if panel == "by_round" else "virtual seconds (end of round)")
            ax.set_title("Scores by round (stars: the run's final scores)" if panel == "by_round" else
                         "Scores by virtual time", fontsize=9)
            ax.legend(fontsize=8, frameon=False)
        elif panel == "mb":
            mb = [r.wire_bytes / 1e6 for r in rounds]
            ax.bar(xs, mb, color="tab:blue", label="MB in the round")
            total = ax.twinx()
            running = [sum(mb[: i + 1]) for i in range(len(mb))]
            total.plot(xs, running, color="k", linewidth=1, label="running total")
            total.set_ylim(bottom=0)
            total.set_ylabel("MB, running total", fontsize=8)
            ax.set_ylabel("MB")
            ax.set_xlabel("round")
            ax.set_title("Traffic per round (wire bytes / 10^6)", fontsize=9)
        else:
            bottom = [0] * len(rounds)
            for keys, label, colour in PARTICIPATION:
                counts = [sum(len(getattr(r, k) or []) for k in keys) for r in rounds]
                if any(counts):
                    ax.bar(xs, counts, bottom=bottom, color=colour, label=label)
                    bottom = [b + c for b, c in zip(bottom, counts)]
            ax.set_ylabel("clients")
            ax.set_xlabel("round")
            ax.set_title("Who took part", fontsize=9)
            ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    title = f"{summary.name}: {summary.method}, seed {summary.seed}, {summary.status.value}" if summary else \
        str(folder.path.name)
    fig.suptitle(title.replace("$", r"\$"), fontsize=10)
    written = []
    for fmt in formats:
        path = folder.path / f"run.{fmt}"
        if path.is_symlink():  # a link there is replaced, never followed
            path.unlink()
        fig.savefig(path, dpi=120)
        written.append(path)
    plt.close(fig)
    return written
