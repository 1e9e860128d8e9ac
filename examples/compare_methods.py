"""Compare methods on accuracy and megabytes: one row per scenario file.

    python examples/compare_methods.py scenarios/hw-cefmc.yaml scenarios/hw-cefmch.yaml [--backend local]
"""

import argparse
import tempfile
from pathlib import Path

from raymvc.runtime import run_scenario
from raymvc.scenario import load_scenario

ap = argparse.ArgumentParser()
ap.add_argument("scenarios", nargs="+")
ap.add_argument("--backend", default="ray", choices=["ray", "local"])
ap.add_argument("--set", action="append", default=[], help="override applied to every scenario")
args = ap.parse_args()

print(f"{'scenario':<28} {'method':<9} {'ACC':>7} {'NMI':>7} {'MB':>8} {'rounds':>6} {'status':>9}")
with tempfile.TemporaryDirectory() as tmp:
    for path in args.scenarios:
        sc = load_scenario(path, [f"runtime.backend={args.backend}", *args.set])
        s = run_scenario(sc, Path(tmp) / Path(path).stem, progress=lambda line: None)
        m = s["metrics"] or {}
        print(f"{Path(path).stem:<28} {s['method']:<9} {m.get('acc', float('nan')):7.4f} "
              f"{m.get('nmi', float('nan')):7.4f} {s['communication']['mb_total']:8.3f} {s['rounds']:6d} {s['status']:>9}")
