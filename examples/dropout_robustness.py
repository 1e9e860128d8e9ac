"""How do methods degrade when clients drop out? A sweep, its aggregate and a plot.

    python examples/dropout_robustness.py [SCENARIO ...] [--backend local] [--jobs 2] [--out runs/dropout]

The same as::

    raymvc sweep scenarios/hw-cefmc.yaml scenarios/hw-efimvc-missing.yaml scenarios/digits-kfed.yaml \\
        --grid 'faults.dropout.rate=[0, 0.1, 0.3, 0.5]' --seeds 0-2 --backend local --jobs 2 --out runs/dropout
    raymvc plot runs/dropout

Prints, per method and dropout rate, mean ± std over the seeds of ACC/NMI/ARI/MB and
how many runs completed, were degraded or failed (failed runs are not averaged).
Rerunning with the same --out resumes: finished runs are not run again.
"""

import argparse
import sys
from pathlib import Path

from raymvc.cli import main

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"

ap = argparse.ArgumentParser()
ap.add_argument("scenarios", nargs="*", default=[str(SCENARIOS / f) for f in
                                                 ("hw-cefmc.yaml", "hw-efimvc-missing.yaml", "digits-kfed.yaml")])
ap.add_argument("--backend", default="local", choices=["ray", "local"])
ap.add_argument("--rates", default="[0, 0.1, 0.3, 0.5]", help="a YAML list of dropout rates")
ap.add_argument("--seeds", default="0-2")
ap.add_argument("--jobs", type=int, default=1)
ap.add_argument("--out", default="runs/dropout")
args = ap.parse_args()

rc = main(["sweep", *args.scenarios, "--grid", f"faults.dropout.rate={args.rates}", "--seeds", args.seeds,
           "--backend", args.backend, "--jobs", str(args.jobs), "--out", args.out])
sys.exit(rc or main(["plot", args.out]))
