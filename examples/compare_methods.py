"""Compare methods on accuracy and megabytes: one row per scenario file.

    python examples/compare_methods.py scenarios/hw-cefmc.yaml scenarios/hw-cefmch.yaml [--backend local]
"""

import argparse
import tempfile
from pathlib import Path

import raymvc

ap = argparse.ArgumentParser()
ap.add_argument("scenarios", nargs="+")
ap.add_argument("--backend", default="ray", choices=["ray", "local"])
ap.add_argument("--set", action="append", default=[], help="override applied to every scenario")
args = ap.parse_args()

print(f"{'scenario':<28} {'method':<9} {'ACC':>7} {'NMI':>7} {'MB':>8} {'rounds':>6} {'status':>9}")
with tempfile.TemporaryDirectory() as tmp:
    for path in args.scenarios:
        r = raymvc.run(path, overrides=args.set, backend=args.backend, out=Path(tmp) / Path(path).stem)
        m = r.metrics or {}
        print(f"{Path(path).stem:<28} {r.summary['method']:<9} {m.get('acc', float('nan')):7.4f} "
              f"{m.get('nmi', float('nan')):7.4f} {r.communication['mb_total']:8.3f} {len(r.rounds):6d} {r.status:>9}")
