"""EFIMVC on ProteinFold at five missing-view levels with the one default setting.

Runs ``scenarios/proteinfold-efimvc.yaml`` on ``proteinFold_Per0.{1,3,5,7,9}.mat``
in process (``runtime.backend: local``) and prints ACC / NMI / purity, rounds,
traffic (MB on the wire) and wall seconds per file, then the mean. PerX is the
fraction of samples that have every view.

    python benchmarks/efimvc_proteinfold.py
    python benchmarks/efimvc_proteinfold.py --data /path/to/proteinfold --set params.beta=0.1

Reference (paper, Table 2; averages over Per0.1..0.9, best of a 48-point grid per file):
ACC 31.71, NMI 40.33, purity 37.95.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from raymvc.driver import run_scenario
from raymvc.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "proteinfold-efimvc.yaml"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "proteinfold"
LEVELS = ("0.1", "0.3", "0.5", "0.7", "0.9")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding proteinFold_Per0.X.mat")
    ap.add_argument("--levels", default=",".join(LEVELS), help="comma-separated PerX values")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="scenario override, as for `raymvc run --set` (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="where the run folders go (default: a temp folder)")
    args = ap.parse_args(argv)

    out = args.out or Path(tempfile.mkdtemp(prefix="efimvc-proteinfold-"))
    rows = []
    print(f"{'file':<22} {'ACC':>7} {'NMI':>7} {'purity':>7} {'rounds':>6} {'MB':>8} {'seconds':>8}")
    for level in args.levels.split(","):
        path = args.data / f"proteinFold_Per{level}.mat"
        try:
            sc = load_scenario(SCENARIO, overrides=["runtime.backend=local", f"data.path={path}", *args.overrides])
        except ScenarioError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        s = run_scenario(sc, out / f"Per{level}", progress=lambda line: None)
        m = s["metrics"] or {}
        row = (m.get("acc", np.nan), m.get("nmi", np.nan), m.get("purity", np.nan), s["rounds"],
               s["communication"]["mb_total"], s["timing"]["wall_s"])
        rows.append(row)
        print(f"{path.name:<22} {row[0]:7.4f} {row[1]:7.4f} {row[2]:7.4f} {row[3]:6d} {row[4]:8.2f} {row[5]:8.2f}",
              flush=True)
    a = np.array(rows, dtype=float)
    mean = a.mean(axis=0)
    print(f"{'mean':<22} {mean[0]:7.4f} {mean[1]:7.4f} {mean[2]:7.4f} {mean[3]:6.1f} {mean[4]:8.2f} {mean[5]:8.2f}")
    print(f"runs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
