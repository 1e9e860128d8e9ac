"""How do methods degrade when clients drop out? A sweep, its aggregate and a plot.

    python examples/dropout_robustness.py [SCENARIO ...] [--backend local] [--jobs 2] [--out runs/dropout]

The same as::

    raymvc sweep scenarios/hw-cefmc.yaml scenarios/hw-efimvc-missing.yaml scenarios/digits-kfed.yaml \\
        --grid 'faults.dropout.rate=[0, 0.1, 0.3, 0.5]' --seeds 0-2 --backend local --jobs 2 --out runs/dropout
    raymvc plot runs/dropout

Prints, per method and dropout rate, mean ± std over the seeds of ACC/NMI/ARI/MB and
how many runs finished (completed or degraded) of how many; failed runs are counted,
never averaged, and the plot shows the share that failed at every point.
Rerunning with the same --out resumes: finished runs are not run again.
"""

import argparse
from pathlib import Path

import yaml

import raymvc
from raymvc.cli import main

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"

ap = argparse.ArgumentParser()
ap.add_argument("scenarios", nargs="*", default=[str(SCENARIOS / f) for f in
                                                 ("hw-cefmc.yaml", "hw-efimvc-missing.yaml", "digits-kfed.yaml")])
ap.add_argument("--backend", default="local", choices=["ray", "local"])
ap.add_argument("--rates", default="[0, 0.1, 0.3, 0.5]", help="a YAML list of dropout rates")
ap.add_argument("--seeds", default="0-2", help="first-last")
ap.add_argument("--jobs", type=int, default=1)
ap.add_argument("--out", default="runs/dropout")
args = ap.parse_args()

first, last = (int(x) for x in args.seeds.split("-"))
s = raymvc.sweep(args.scenarios, grid={"faults.dropout.rate": yaml.safe_load(args.rates)},
                 seeds=range(first, last + 1), backend=args.backend, jobs=args.jobs, out=args.out, progress=True)
for row in s.aggregate:
    finished = int(row["completed"]) + int(row["degraded"])
    scores = (f"ACC {float(row['acc_mean']):.4f} ± {float(row['acc_std'] or 0):.4f}  MB {float(row['mb_mean']):.3f}"
              if row["acc_mean"] not in (None, "") else "no finished run")
    print(f"{row['scenario']:<20} dropout {row['faults.dropout.rate']:<4} {finished}/{row['runs']} finished  {scores}")
raise SystemExit(main(["plot", args.out]))
