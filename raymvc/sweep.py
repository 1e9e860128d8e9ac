"""``raymvc sweep``: one scenario over a grid of overrides, one Ray instance for all runs.

Typical use is a dropout-robustness study::

    raymvc sweep scenarios/hw-cefmc.yaml --grid faults.dropout.rate=0,0.1,0.2,0.3 --repeats 3

Each grid point and seed gets its own run directory under the sweep directory, and
``sweep.csv`` collects one row per run (status, metrics, MB, faults).
"""

from __future__ import annotations

import csv
import itertools
import sys
from pathlib import Path

import yaml

from .results import default_out_dir
from .scenario import ScenarioError, load_scenario


def parse_grid(items: list[str]) -> list[tuple[str, list]]:
    grid = []
    for item in items:
        if "=" not in item:
            raise ScenarioError(f"--grid {item}: expected key.path=v1,v2,...")
        key, vals = item.split("=", 1)
        try:
            values = [yaml.safe_load(v) for v in vals.split(",")]
        except yaml.YAMLError:
            raise ScenarioError(f"--grid {key}: values are not valid YAML") from None
        grid.append((key.strip(), values))
    return grid


def _fmt(v) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def run_sweep(args) -> int:
    from .runtime import prepare, run_scenario

    grid = parse_grid(args.grid)
    base = list(args.set or [])
    if args.address:
        base.append(f"runtime.address={args.address}")
    if getattr(args, "backend", None):
        base.append(f"runtime.backend={args.backend}")
    first = load_scenario(args.scenario, base)
    seed0 = args.seed if args.seed is not None else first.seed
    points = []
    for combo in itertools.product(*[vals for _, vals in grid]):
        for rep in range(args.repeats):
            over = base + [f"{k}={_fmt(v)}" for (k, _), v in zip(grid, combo)] + [f"seed={seed0 + rep}"]
            sc = load_scenario(args.scenario, over)  # validate every point before running any
            points.append((combo, rep, sc, prepare(sc)))
    out = Path(args.out) if args.out else default_out_dir(f"{first.name}-sweep")
    out.mkdir(parents=True, exist_ok=True)
    keys = [k for k, _ in grid]
    fields = keys + ["seed", "status", "acc", "nmi", "ari", "mb_total", "rounds", "dropped_replies",
                     "late_replies", "crashed_clients", "run_dir"]
    rows = []
    quiet = args.quiet
    for i, (combo, rep, sc, prepared) in enumerate(points):
        tag = "_".join(f"{k.split('.')[-2] if k.endswith('rate') else k.split('.')[-1]}{_fmt(v)}" for k, v in zip(keys, combo))
        run_dir = out / f"{i:03d}-{tag}-seed{sc.seed}"
        if not quiet:
            print(f"[sweep] {i + 1}/{len(points)}: {dict(zip(keys, combo))} seed {sc.seed}", file=sys.stderr, flush=True)
        s = run_scenario(sc, run_dir, progress=(lambda line: None), prepared=prepared)
        m = s.get("metrics") or {}
        row = dict(zip(keys, combo))
        row.update(seed=sc.seed, status=s["status"], acc=m.get("acc"), nmi=m.get("nmi"), ari=m.get("ari"),
                   mb_total=s["communication"]["mb_total"], rounds=s["rounds"],
                   dropped_replies=s["faults"]["dropped_replies"], late_replies=s["faults"]["late_replies"],
                   crashed_clients=len(s["faults"]["crashed_clients"]), run_dir=str(run_dir))
        rows.append(row)
    with open(out / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    print(" ".join(f"{k:>14}" for k in keys) + f" {'seed':>4} {'status':>9} {'ACC':>6} {'NMI':>6} {'MB':>8} {'drop':>5}")
    for r in rows:
        cells = " ".join(f"{_fmt(r[k]):>14}" for k in keys)
        acc = "  n/a " if r["acc"] is None else f"{r['acc']:6.3f}"
        nmi = "  n/a " if r["nmi"] is None else f"{r['nmi']:6.3f}"
        print(f"{cells} {r['seed']:>4} {r['status']:>9} {acc} {nmi} {r['mb_total']:8.3f} {r['dropped_replies']:>5}")
    print(f"sweep results: {out / 'sweep.csv'}", file=sys.stderr)
    return 0
