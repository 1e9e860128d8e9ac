"""How does a method degrade when clients drop out? One Ray instance, many runs.

    python examples/dropout_robustness.py [scenarios/hw-cefmc.yaml] [--backend local]

Prints mean ACC/NMI and MB per dropout rate over three seeds.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

from raymvc.runtime import run_scenario
from raymvc.scenario import load_scenario

ap = argparse.ArgumentParser()
ap.add_argument("scenario", nargs="?", default=str(Path(__file__).parents[1] / "scenarios" / "hw-cefmc.yaml"))
ap.add_argument("--backend", default="ray", choices=["ray", "local"])
ap.add_argument("--rates", default="0,0.1,0.2,0.3,0.5")
ap.add_argument("--seeds", type=int, default=3)
args = ap.parse_args()

print(f"{'dropout':>8} {'ACC':>7} {'NMI':>7} {'MB':>7} {'dropped':>8}")
with tempfile.TemporaryDirectory() as tmp:
    for rate in [float(r) for r in args.rates.split(",")]:
        runs = []
        for seed in range(args.seeds):
            sc = load_scenario(args.scenario, [f"faults.dropout.rate={rate}", f"seed={seed}",
                                               f"runtime.backend={args.backend}"])
            runs.append(run_scenario(sc, Path(tmp) / f"{rate}-{seed}", progress=lambda line: None))
        ok = [r for r in runs if r["metrics"]]
        acc = statistics.mean(r["metrics"]["acc"] for r in ok)
        nmi = statistics.mean(r["metrics"]["nmi"] for r in ok)
        mb = statistics.mean(r["communication"]["mb_total"] for r in runs)
        dropped = sum(r["faults"]["dropped_replies"] for r in runs)
        print(f"{rate:8.2f} {acc:7.4f} {nmi:7.4f} {mb:7.3f} {dropped:8d}")
