"""``raymvc report``: one run's summary, runs side by side with the scenario keys that
differ, sweeps' aggregates with the settings that differ between them; as text, JSON,
Markdown or LaTeX. Scope: printing what folders hold; nothing here runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..text import one_line


def _fail(msg: str) -> int:
    print(f"error: {one_line(msg)}", file=sys.stderr)
    return 2  # the command line's usage error


def report_command(args) -> int:
    import csv

    from ..study.sweep import read_sweep
    from .folder import ResultsError
    from .runfolder import RunFolder

    runs, sweeps = [], []
    for d in args.runs:
        p = Path(d)
        if RunFolder(p).has_summary():
            runs.append(p)
        elif (p / "sweep.csv").is_file():
            sweeps.append(p)
        elif p.is_dir() and any(RunFolder(c).has_summary() for c in p.iterdir() if c.is_dir()):
            runs.extend(sorted(c for c in p.iterdir() if RunFolder(c).has_summary()))
        else:
            return _fail(f"{d}: neither a run folder (summary.json) nor a sweep folder (sweep.csv)")
    summaries = []
    for p in runs:
        try:
            summaries.append(RunFolder(p).summary().to_dict())
        except ResultsError as e:
            return _fail(str(e))
        except (AttributeError, TypeError, ValueError) as e:
            return _fail(f"{p / RunFolder.SUMMARY}: corrupt (unexpected content: {type(e).__name__}: "
                         f"{one_line(str(e), 80)})")
    sweep_data = []
    for p in sweeps:
        try:
            sweep_data.append((p, *read_sweep(p)))
        except ResultsError as e:
            return _fail(str(e))
        except (OSError, ValueError, KeyError, TypeError, csv.Error) as e:
            return _fail(f"{p / 'sweep.csv'}: corrupt ({one_line(str(e), 120)})")
    try:
        return _print_report(args, runs, summaries, sweeps, sweep_data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return _fail(f"{runs[0] if len(runs) == 1 else 'report'}: a summary.json is corrupt "
                     f"(unexpected content: {type(e).__name__}: {one_line(str(e), 80)})")


def _print_report(args, runs, summaries, sweeps, sweep_data) -> int:
    from ..study.sweep import format_aggregate
    from .folder import differing_keys, flatten, format_summary, short_value
    from .runfolder import RunFolder

    scen = [RunFolder(p).scenario() for p in runs]
    diff = differing_keys(scen) if len(runs) > 1 else []
    # several sweeps: what their sweep.json files say differently (overrides, grid, seeds, scenarios)
    settings = [flatten({k: meta.get(k) for k in ("scenarios", "grid", "seeds", "overrides")})
                for _, meta, _, _ in sweep_data]
    sweep_diff = differing_keys(settings) if len(sweep_data) > 1 else []
    told = [", ".join(f"{k}={short_value(f.get(k))}" for k in sweep_diff) for f in settings]
    if args.format in ("markdown", "latex"):
        from ..study.tables import runs_table, sweep_table

        parts = [runs_table([p.name for p in runs], summaries, args.format, "runs")] if summaries else []
        parts += [sweep_table(agg, list(meta.get("grid_keys") or []), args.format,
                              f"{p.name}{f' ({t})' if t else ''}: mean ± std over the seeds of the runs that finished")
                  for (p, meta, _, agg), t in zip(sweep_data, told)]
        print("\n\n".join(parts))
        return 0
    if args.json or args.format == "json":
        out = {"runs": summaries, "differing_keys": diff,
               "sweeps": [{"dir": str(p), "grid_keys": meta.get("grid_keys"), "aggregate": agg}
                          for p, meta, _, agg in sweep_data]}
        if not sweeps and len(runs) == 1:
            out = summaries[0]
        print(json.dumps(out, indent=2))
        return 0
    if len(summaries) == 1:
        print(format_summary(summaries[0]))
    elif summaries:
        methods = {str(s.get("method")) for s in summaries}
        # the method is a column of its own; parameters of different methods are not comparable, and a
        # key whose whole subtree already shows (params when one run has none) is not a column either
        diff_cols = [k for k in diff if k not in ("name", "method", "params", "data")
                     and not (len(methods) > 1 and k.startswith("params."))]
        flat = [flatten(s) for s in scen]
        print("differing scenario keys: " + (", ".join(diff) if diff else "none")
              + ("; parameters differ by method (raymvc report RUN shows one run's)" if len(methods) > 1 else ""))
        head = ["run", *diff_cols, "method", "status", "ACC", "NMI", "MB", "rounds"]
        body = []
        for p, s, f in zip(runs, summaries, flat):
            m = s.get("metrics") or {}
            acc, nmi = (f"{m[k]:.4f}" if m.get(k) is not None else "n/a" for k in ("acc", "nmi"))
            body.append([p.name, *[short_value(f.get(k)) for k in diff_cols], str(s.get("method")),
                         str(s.get("status")), acc, nmi,
                         f"{(s.get('communication') or {}).get('mb_total', 0):.3f}", str(s.get("rounds"))])
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        for row in [head, *body]:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if len(sweep_data) > 1:
        print("differing sweep settings: " + (", ".join(sweep_diff) if sweep_diff else "none"))
    for (p, meta, rows, agg), t in zip(sweep_data, told):
        if summaries or len(sweep_data) > 1:
            print()
        print(f"sweep {p}: {len(rows)} runs over {', '.join(meta.get('grid_keys') or []) or 'seeds only'}"
              + (f"; {t}" if t else ""))
        print(format_aggregate(agg, list(meta.get("grid_keys") or [])))
    return 0
