"""Command line: ``raymvc run | validate | list | sweep | report``.

Scenario problems exit with code 2 and one line naming the file and key; they are
found before Ray starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .scenario import ScenarioError, load_scenario

EXIT_USAGE = 2


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _load(args) -> object:
    overrides = list(args.set or [])
    if getattr(args, "address", None):
        overrides.append(f"runtime.address={args.address}")
    if getattr(args, "backend", None):
        overrides.append(f"runtime.backend={args.backend}")
    if getattr(args, "seed", None) is not None:
        overrides.append(f"seed={args.seed}")
    return load_scenario(args.scenario, overrides)


def cmd_run(args) -> int:
    from .results import format_summary
    from .runtime import prepare, run_scenario
    from .runtime.engine import ClusterError

    try:
        sc = _load(args)
        prepared = prepare(sc)  # data problems surface here, before Ray starts
    except ScenarioError as e:
        return _fail(str(e))
    progress = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        summary = run_scenario(sc, args.out, progress=progress, prepared=prepared)
    except ClusterError as e:
        return _fail(f"{args.scenario}: {e}")
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0 if summary["status"] != "failed" else 1


def cmd_validate(args) -> int:
    from .runtime import prepare

    try:
        sc = _load(args)
        ds, part = prepare(sc)
    except ScenarioError as e:
        return _fail(str(e))
    print(f"{args.scenario}: ok -- {sc.method} on {ds.name} ({ds.n_samples} samples, {ds.n_views} views, "
          f"{ds.n_clusters} clusters), {part.kind} split over {part.n_clients} clients")
    return 0


def cmd_list(args) -> int:
    from .data import list_builtin
    from .protocols import available, get

    print("methods:")
    for name in available():
        try:
            p = get(name)
            print(f"  {name:<10} {p.partition:<10} {p.summary}")
        except Exception as e:  # e.g. torch missing for a deep method
            print(f"  {name:<10} (unavailable: {e})")
    print("datasets:")
    for name, text in list_builtin().items():
        print(f"  {name:<16} {text}")
    print("  (or data.path: a .npz or .mat file)")
    print("faults:")
    for name, text in [
        ("dropout.rate", "chance that a client misses a round (per client, per round)"),
        ("disconnect.rate", "fraction of clients offline for the whole run"),
        ("crash", "[{client: C, at_round: R}]: the client's actor is killed at round R"),
        ("stragglers", "fraction of slow clients and their delay distribution (virtual seconds)"),
        ("deadline_s", "round deadline on the virtual clock; later replies count as late"),
        ("min_clients", "fewest replies a round needs; fewer ends the run as failed"),
    ]:
        print(f"  {name:<16} {text}")
    return 0


def cmd_sweep(args) -> int:
    from .sweep import run_sweep

    try:
        return run_sweep(args)
    except ScenarioError as e:
        return _fail(str(e))


def cmd_report(args) -> int:
    from .results import format_summary, read_summary

    rows = []
    for d in args.runs:
        p = Path(d)
        if not (p / "summary.json").is_file():
            return _fail(f"{d}: no summary.json here")
        rows.append(read_summary(p))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if len(rows) == 1:
        print(format_summary(rows[0]))
        return 0
    print(f"{'run':<32} {'method':<9} {'status':<9} {'ACC':>6} {'NMI':>6} {'MB':>8} {'rounds':>6}")
    for s in rows:
        m = s.get("metrics") or {}
        print(f"{Path(s.get('out_dir', '')).name[:32]:<32} {s['method']:<9} {s['status']:<9} "
              f"{m.get('acc', float('nan')):6.3f} {m.get('nmi', float('nan')):6.3f} "
              f"{s['communication']['mb_total']:8.3f} {s['rounds']:6d}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raymvc", description="Federated multi-view clustering simulator on Ray.")
    sub = p.add_subparsers(dest="cmd", required=True)

    def scenario_args(q):
        q.add_argument("scenario", help="scenario YAML file")
        q.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a scenario key (value parsed as YAML); repeatable")
        q.add_argument("--backend", choices=["ray", "local"], help="same as --set runtime.backend=...")
        q.add_argument("--seed", type=int, help="same as --set seed=...")

    r = sub.add_parser("run", help="run a scenario and write its results")
    scenario_args(r)
    r.add_argument("--out", help="run directory (default: runs/<name>-<time>)")
    r.add_argument("--address", help="join this Ray cluster (same as --set runtime.address=...)")
    r.add_argument("--json", action="store_true", help="print summary.json to stdout")
    r.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    r.set_defaults(fn=cmd_run)

    v = sub.add_parser("validate", help="check a scenario (and load its data) without running it")
    scenario_args(v)
    v.set_defaults(fn=cmd_validate)

    ls = sub.add_parser("list", help="list methods, datasets and fault kinds")
    ls.set_defaults(fn=cmd_list)

    sw = sub.add_parser("sweep", help="run a scenario over a grid of overrides and tabulate")
    scenario_args(sw)
    sw.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...",
                    help="a key and the values to try (YAML each); repeat for a product grid")
    sw.add_argument("--repeats", type=int, default=1, help="seeds per grid point (seed, seed+1, ...)")
    sw.add_argument("--out", help="sweep directory (default: runs/<name>-sweep-<time>)")
    sw.add_argument("--address", help="join this Ray cluster")
    sw.add_argument("--quiet", action="store_true")
    sw.set_defaults(fn=cmd_sweep)

    rp = sub.add_parser("report", help="show one run's summary or compare several runs")
    rp.add_argument("runs", nargs="+", help="run directories")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(fn=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
