"""Horizontal benchmark: k-FED and CCFC on digits for heterogeneity p in {0, 0.5, 1}.

Runs ``scenarios/digits-kfed.yaml`` and ``scenarios/digits-ccfc.yaml`` with the in-process
backend (``runtime.backend=local``), one run at a time, and prints a markdown table of
NMI and Kappa (plus ACC, traffic and time) that is also written to
``benchmarks/horizontal_table.md``.

    python benchmarks/horizontal_table.py                  # defaults of the scenario files
    python benchmarks/horizontal_table.py --set params.cluster_rounds=40 --ps 0 1

``--set`` overrides apply to the CCFC runs only. CCFC's NMI at p = 1 (every client holds
one class) is expected to collapse, as in the paper's Table 1; the table reports it as it is.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from raymvc.runtime import run_scenario
from raymvc.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
METHODS = (("k-FED", "digits-kfed"), ("CCFC", "digits-ccfc"))


def run_one(scenario: str, p: float, seed: int, extra: list[str], out_root: Path) -> dict:
    overrides = [f"data.heterogeneity={p}", "runtime.backend=local", f"seed={seed}", *extra]
    sc = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", overrides)
    out = out_root / f"{scenario}-p{p}-s{seed}"
    t = time.perf_counter()
    s = run_scenario(sc, out, progress=lambda line: None)
    s["_seconds"] = time.perf_counter() - t
    return s


def table(rows: list[dict]) -> str:
    lines = [
        "| p | method | NMI | Kappa | ACC | MB total | MB / round (mean) | rounds | seconds | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["summary"]
        m = s.get("metrics") or {}
        mb = s["communication"]["mb_total"]
        lines.append(
            f"| {r['p']:g} | {r['method']} | {m.get('nmi', float('nan')):.4f} | {m.get('kappa', float('nan')):.4f} "
            f"| {m.get('acc', float('nan')):.4f} | {mb:.2f} | {mb / max(s['rounds'], 1):.3f} | {s['rounds']} "
            f"| {s['_seconds']:.1f} | {s['status']} |"
        )
    return "\n".join(lines)


def comparison(rows: list[dict]) -> str:
    """One sentence per p: CCFC's NMI minus k-FED's, as measured."""
    nmi = {(r["p"], r["method"]): (r["summary"].get("metrics") or {}).get("nmi") for r in rows}
    parts = []
    for p in sorted({r["p"] for r in rows}):
        a, b = nmi.get((p, "CCFC")), nmi.get((p, "k-FED"))
        if a is not None and b is not None:
            parts.append(f"p = {p:g}: {a - b:+.3f}")
    return "CCFC NMI minus k-FED NMI: " + "; ".join(parts) + "." if parts else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ps", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="heterogeneity values")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for the CCFC runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "horizontal_table.md"), help="markdown file to write")
    ap.add_argument("--runs", default=None, help="directory for the run folders (default: a temporary one)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out_root = Path(args.runs) if args.runs else Path(tmp)
        rows = []
        for p in args.ps:
            for label, scenario in METHODS:
                extra = args.set if label == "CCFC" else []
                s = run_one(scenario, p, args.seed, extra, out_root)
                nmi = (s.get("metrics") or {}).get("nmi", float("nan"))
                print(f"p={p:g} {label}: NMI {nmi:.4f} ({s['_seconds']:.1f} s, {s['status']})", file=sys.stderr, flush=True)
                rows.append({"p": p, "method": label, "summary": s})

    md = table(rows)
    ccfc_params = rows[-1]["summary"]  # for the header line
    head = [
        "# Horizontal benchmark: k-FED vs CCFC on digits",
        "",
        f"digits (1797 images of 8x8, 10 classes), {ccfc_params['n_clients']} clients, label skew p "
        f"(client l takes a fraction p of its samples from class l), seed {args.seed}, in-process backend, "
        "one CPU thread per party. Scenario files: `scenarios/digits-kfed.yaml`, `scenarios/digits-ccfc.yaml`"
        + (f"; CCFC overrides: `{' '.join(args.set)}`" if args.set else "") + ".",
        "MB counts every protocol message's bytes on the wire (headers included), up and down; "
        "labels travel only on the evaluation path and are not counted. Seconds: wall time of the run.",
        "",
        md,
        "",
        comparison(rows),
        "",
        "Produced by `python benchmarks/horizontal_table.py`. CCFC's decline as p grows is expected and "
        "is reported as measured (the paper's Table 1 shows the same shape on MNIST: NMI 0.924 at p = 0, "
        "0.077 at p = 1; there CCFC still leads k-FED at p = 0.5, 0.672 vs 0.452). At p = 1 every client "
        "holds a single class: its local training sees no contrast "
        "between digits, its BatchNorm statistics describe one digit only, and its k local centroids split that "
        "one digit, so the averaged model and the global centroids carry little class structure. k-FED, which "
        "only clusters raw pixels once, does not degrade with p.",
        "",
    ]
    Path(args.out).write_text("\n".join(head))
    print(md)
    print(comparison(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
