"""FCUIF on handwritten in the paper's three settings, seeds 0-2, with FedDMVC on setting (b).

Runs in process (``runtime.backend: local``, one torch thread per party, clients one
after another), default parameters:

* (a) ``scenarios/hw-fcuif-unaligned.yaml``: unaligned rate 0.5;
* (b) ``scenarios/hw-fcuif-missing.yaml``: missing rate 0.5 (point pattern);
* (c) ``scenarios/hw-fcuif-both.yaml``: both at 0.5;
* FedDMVC on the (b) split (``scenarios/hw-feddmvc-partial.yaml``: the same data keys and
  seed, so the same samples miss the same views).

Reports mean ± std over the seeds of ACC / NMI / ARI, protocol MB and wall seconds, the
label-free alignment scores of the last round and how often imputation was kept; writes
``benchmarks/fcuif_hw.md``.

    python benchmarks/fcuif_hw.py
    python benchmarks/fcuif_hw.py --seeds 0 --set params.rounds=1

Reference (FCUIF paper, Table 1, HW): (a) ACC 0.773, NMI 0.666; (b) 0.926 / 0.844;
(c) 0.785 / 0.738.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from _seeds import parser, pm, run, seeds_and_out

from raymvc.scenario import ScenarioError

ROOT = Path(__file__).resolve().parents[1]
SC = ROOT / "scenarios"
CASES = (
    ("(a) unaligned 0.5", "FCUIF", SC / "hw-fcuif-unaligned.yaml", "0.773 / 0.666"),
    ("(b) missing 0.5", "FCUIF", SC / "hw-fcuif-missing.yaml", "0.926 / 0.844"),
    ("(b) missing 0.5", "FedDMVC", SC / "hw-feddmvc-partial.yaml", "--"),
    ("(c) both 0.5", "FCUIF", SC / "hw-fcuif-both.yaml", "0.785 / 0.738"),
)


def _last_info(run_dir: Path) -> dict:
    """The server's info of the last round, and how many rounds kept the imputation."""
    infos = [json.loads(line).get("info") or {} for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    kept = [i["imputation"]["used"] for i in infos if "imputation" in i]
    last = infos[-1] if infos else {}
    return {"match": last.get("align_holdout_match"), "agree": last.get("align_cluster_agreement"),
            "imputed": f"{sum(kept)}/{len(kept)}" if kept else "--"}


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, ROOT / "benchmarks" / "fcuif_hw.md").parse_args(argv)
    seeds, out = seeds_and_out(args, "fcuif-hw-")
    runs: dict[int, list] = {i: [] for i in range(len(CASES))}
    print(f"{'case':<18} {'method':<8} {'seed':>4} {'ACC':>6} {'NMI':>6} {'ARI':>6} {'MB':>6} {'wall s':>7}  status")
    for seed in seeds:  # seed by seed, so the first seed of every case is there first
        for i, (case, method, path, _) in enumerate(CASES):
            run_dir = out / f"{path.stem}-seed{seed}"
            try:
                row = run(path, seed, args.overrides, run_dir)
            except ScenarioError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            row.update(_last_info(run_dir))
            runs[i].append(row)
            print(f"{case:<18} {method:<8} {seed:>4} {row['acc']:6.3f} {row['nmi']:6.3f} {row['ari']:6.3f} "
                  f"{row['mb']:6.2f} {row['wall']:7.1f}  {row['status']}", flush=True)

    lines = [
        "# FCUIF on handwritten (6 clients, one view each)",
        "",
        f"`python benchmarks/fcuif_hw.py` ({time.strftime('%Y-%m-%d')}, seeds {args.seeds}, default params"
        + (f", overrides {' '.join(args.overrides)}" if args.overrides else "")
        + f"; in-process backend, one torch thread per party, {os.cpu_count()} CPU cores shared with other work).",
        "MB: protocol traffic on the wire. Paper: Table 1 of the FCUIF paper (ACC / NMI).",
        "Match: share of held-out aligned rows the learned alignment puts back in place (last round; chance is",
        "1 in the number held out, about 1/200); agreement: share of unaligned rows whose match lies in the same",
        "cluster for the anchor and the member (last round). Imputed: rounds in which the label-free score kept",
        "the imputed features. None of these read labels.",
        "",
        "| setting | method | ACC | NMI | ARI | MB | wall s | match | agreement | imputed | paper |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (case, method, path, paper) in enumerate(CASES):
        rows = runs[i]
        if not rows:
            continue
        col = {k: np.array([r[k] for r in rows], dtype=float) for k in ("acc", "nmi", "ari", "mb", "wall")}
        match = [r["match"] for r in rows if r["match"] is not None]
        agree = [r["agree"] for r in rows if r["agree"] is not None]
        match = f"{np.mean(match):.3f}" if match else "--"
        agree = f"{np.mean(agree):.3f}" if agree else "--"
        lines.append(f"| {case} | {method} | {pm(col['acc'])} | {pm(col['nmi'])} | {pm(col['ari'])} | "
                     f"{col['mb'].mean():.2f} | {pm(col['wall'], '.0f')} | {match} | {agree} | ")
        lines[-1] += f"{', '.join(r['imputed'] for r in rows)} | {paper} |"
    lines += ["", "Per run:", "", "| scenario | seed | ACC | NMI | ARI | MB | wall s | status |",
              "|---|---|---|---|---|---|---|---|"]
    for i, (_, _, path, _) in enumerate(CASES):
        for r in runs[i]:
            lines.append(f"| `{path.name}` | {r['seed']} | {r['acc']:.3f} | {r['nmi']:.3f} | {r['ari']:.3f} | "
                         f"{r['mb']:.2f} | {r['wall']:.0f} | {r['status']} |")
    text = "\n".join(lines) + "\n"
    args.md.write_text(text)
    print(text)
    print(f"runs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
