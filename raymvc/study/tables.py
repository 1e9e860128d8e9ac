"""Tables to paste (``raymvc report --format markdown|latex``): a sweep's aggregate (mean ± std
over the seeds, the runs that entered each mean) and a set of runs, with the best value of
each score column in bold (the highest; for MB the lowest; a method's own ``info.*``
numbers unmarked). LaTeX tables use booktabs rules (``\\usepackage{booktabs}``). Text from
folders and scenario files is escaped for the format, so a name cannot break the table or inject markup.
"""

from __future__ import annotations

import math

from ..metrics import score_digits, score_title
from .sweep import INFO_PREFIX, METRIC_PREFIX, METRICS, short_key

FORMATS = ("markdown", "latex")
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$"}


def escape(text, fmt: str) -> str:
    """``text`` as one cell of a ``fmt`` table: one line, no markup of its own."""
    s = " ".join(str(text).split())
    if fmt == "latex":
        return "".join(_LATEX.get(ch, ch) for ch in s)
    for ch in "\\|*_`<>[]$":
        s = s.replace(ch, "\\" + ch)
    return s


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _bold(text: str, fmt: str) -> str:
    return rf"\textbf{{{text}}}" if fmt == "latex" else f"**{text}**"


def _render(head: list[str], rows: list[list[str]], fmt: str, caption: str) -> str:
    if fmt == "latex":
        lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{escape(caption, fmt)}}}",
                 r"\begin{tabular}{" + "l" * len(head) + "}", r"\toprule", " & ".join(head) + r" \\", r"\midrule"]
        lines += [" & ".join(r) + r" \\" for r in rows]
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        return "\n".join(lines)
    lines = [f"*{escape(caption, fmt)}*", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _score_columns(cells: list[dict[str, tuple[float | None, float | None]]]) -> list[str]:
    """The scores some cell has, in the order ACC, NMI, ARI, other scores, method numbers, MB."""
    have = {k for c in cells for k, (m, _) in c.items() if m is not None}
    extra = sorted(k for k in have if k.startswith(METRIC_PREFIX))
    info = sorted(k for k in have if k.startswith(INFO_PREFIX))
    return [k for k in (*METRICS, *extra, *info, "mb") if k in have]


def _best(values: list[float | None], lower: bool) -> float | None:
    xs = [v for v in values if v is not None]
    return (min(xs) if lower else max(xs)) if len(xs) > 1 else None


def _fill(head: list[str], rows: list[list[str]], cells, cols: list[str], fmt: str, with_std: bool) -> None:
    """Append each score column to ``head`` and ``rows``, the best value in bold."""
    for col in cols:
        digits = 3 if col == "mb" else score_digits(col)
        scored = not col.startswith(INFO_PREFIX)  # a method's own number has no best
        best = _best([c.get(col, (None, None))[0] for c in cells], lower=col == "mb") if scored else None
        head.append(escape("MB" if col == "mb" else score_title(col), fmt))
        pm = r" $\pm$ " if fmt == "latex" else " ± "
        for row, c in zip(rows, cells):
            mean, std = c.get(col, (None, None))
            if mean is None:
                row.append("n/a")
                continue
            text = f"{mean:.{digits}f}" + (f"{pm}{std:.{digits}f}" if with_std and std is not None else "")
            row.append(_bold(text, fmt) if best is not None and round(mean, digits) == round(best, digits) else text)


def sweep_table(agg: list[dict], keys: list[str], fmt: str, caption: str) -> str:
    """A sweep's aggregate as a ``fmt`` table: scenario, grid values, runs in the mean, then
    mean ± std of each score."""
    head = ["scenario", *(escape(short_key(k), fmt) for k in keys), "runs"]
    rows, cells = [], []
    for a in agg:
        finished = int(_num(a.get("completed")) or 0) + int(_num(a.get("degraded")) or 0)
        rows.append([escape(a.get("scenario", ""), fmt), *(escape(a.get(k, ""), fmt) for k in keys),
                     f"{finished}/{int(_num(a.get('runs')) or 0)}"])
        cells.append({k[: -len("_mean")]: (_num(v), _num(a.get(k[: -len("_mean")] + "_std")))
                      for k, v in a.items() if k.endswith("_mean")})
    _fill(head, rows, cells, _score_columns(cells), fmt, with_std=True)
    return _render(head, rows, fmt, caption)


def runs_table(names: list[str], summaries: list[dict], fmt: str, caption: str) -> str:
    """Runs side by side as a ``fmt`` table: run, method, seed, status, then each score."""
    head = ["run", "method", "seed", "status"]
    rows, cells = [], []
    for name, s in zip(names, summaries):
        rows.append([escape(x, fmt) for x in (name, s.get("method", ""), s.get("seed", ""), s.get("status", ""))])
        m = s.get("metrics") or {}
        cell = {(k if k in METRICS else METRIC_PREFIX + k): (_num(v), None) for k, v in m.items()}
        cell["mb"] = (_num((s.get("communication") or {}).get("mb_total")), None)
        cells.append(cell)
    _fill(head, rows, cells, _score_columns(cells), fmt, with_std=False)
    return _render(head, rows, fmt, caption)
