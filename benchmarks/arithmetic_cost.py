"""What pinned arithmetic costs: the same cell with the libraries' code paths pinned and free.

Each method's cell runs in a fresh process (``raymvc run --backend local``), once with
``RAYMVC_ARITHMETIC=pinned`` (the default) and once with ``native``, the two alternating
``--repeat`` times, so that both see the same machine load. Reports the median wall time of
the protocol per mode, their ratio, and whether the two modes gave the same labels (they
need not: pinning picks other kernels than this CPU would). Writes
``benchmarks/arithmetic_cost.md``.

    python benchmarks/arithmetic_cost.py --repeat 2
    python benchmarks/arithmetic_cost.py --only cefmc,feddmvc --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SC = ROOT / "scenarios"
# method -> (scenario, extra --set overrides): the shipped scenario at its shipped budget
CELLS = {
    "cefmc": ("hw-cefmc.yaml", []),
    "efimvc": ("hw-efimvc-missing.yaml", []),
    "kfed": ("digits-kfed.yaml", []),
    "ccfc": ("digits-ccfc.yaml", []),
    "feddmvc": ("hw-feddmvc-partial.yaml", []),
    "fcuif": ("hw-fcuif-missing.yaml", []),
}


def one(method: str, mode: str, seed: int, tmp: Path) -> tuple[float, str]:
    scenario, extra = CELLS[method]
    out = tmp / f"{method}-{mode}-{time.monotonic_ns()}"
    from raymvc import arithmetic

    # native: the environment as it was before this process imported raymvc (which pinned it)
    env = dict(arithmetic.original_environ() if mode == "native" else os.environ, RAYMVC_ARITHMETIC=mode)
    cmd = [sys.executable, "-m", "raymvc.cli", "run", str(SC / scenario), "--backend", "local", "--seed", str(seed),
           "--out", str(out), "--json", "--quiet", *[a for kv in extra for a in ("--set", kv)]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{method} ({mode}) failed: {done.stderr.strip().splitlines()[-1:]}")
    s = json.loads(done.stdout)
    if s["arithmetic"]["mode"] != mode or (mode == "native" and s["arithmetic"].get("found", {}).get("MKL_CBWR")):
        raise SystemExit(f"{method}: ran in {s['arithmetic']['mode']} mode with {s['arithmetic'].get('found')}, "
                         f"asked for {mode}")
    labels = hashlib.sha256((out / "labels.csv").read_bytes()).hexdigest()
    return s["timing"]["protocol_s"], labels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(CELLS), help="comma-separated methods")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--md", type=Path, default=ROOT / "benchmarks" / "arithmetic_cost.md")
    args = ap.parse_args(argv)

    from raymvc.bench.machine import cpu_model

    methods = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(CELLS))
    if unknown:
        raise SystemExit(f"--only: unknown {', '.join(unknown)} (known: {', '.join(CELLS)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="arith-") as tmp:
        for m in methods:
            times: dict[str, list[float]] = {"pinned": [], "native": []}
            labels: dict[str, set] = {"pinned": set(), "native": set()}
            for i in range(args.repeat):
                for mode in (("pinned", "native") if i % 2 == 0 else ("native", "pinned")):
                    t, h = one(m, mode, args.seed, Path(tmp))
                    times[mode].append(t)
                    labels[mode].add(h)
                    print(f"{m:8s} {mode:6s} {t:7.2f} s  labels {h[:12]}", file=sys.stderr, flush=True)
            p, n = statistics.median(times["pinned"]), statistics.median(times["native"])
            rows.append((m, CELLS[m][0], p, n, p / n, len(labels["pinned"]) == 1, labels["pinned"] == labels["native"]))
    lines = [
        "# What pinned arithmetic costs",
        "",
        f"- command: `python benchmarks/arithmetic_cost.py --only {','.join(methods)} --repeat {args.repeat}"
        f"{'' if args.seed == 0 else f' --seed {args.seed}'}`",
        f"- machine: {os.cpu_count()} cores ({cpu_model()})",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- each cell: the shipped scenario at its shipped budget, seed {args.seed}, in process, in a fresh "
        f"process per run; modes alternating, {args.repeat} runs each; protocol seconds (median)",
        "",
        "| method | scenario | pinned, s | native, s | pinned / native | pinned runs agree | same labels as native |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, sc, p, n, r, agree, same in rows:
        again = "-" if args.repeat < 2 else "yes" if agree else "no"  # one run per mode: nothing to agree with
        lines.append(f"| {m} | {sc} | {p:.2f} | {n:.2f} | {r:.2f} | {again} | {'yes' if same else 'no'} |")
    lines += [
        "",
        "Pinned: the code paths of `raymvc.arithmetic.PINNED` (MKL's COMPATIBLE branch, OpenBLAS's Haswell "
        "kernels, ATen's and oneDNN's AVX2, numpy's loops up to AVX2), and the torch methods' products on "
        "OpenBLAS. Native: what each library picks on this CPU, torch's products on MKL. Labels may differ "
        "between the modes: pinning fixes one code path per library on every machine, so that the labels "
        "do not move with a machine's settings (and, where benchmarks/cross_cpu.md shows it for both CPU "
        "kinds, not with its vendor). `RAYMVC_ARITHMETIC=native` is for results that need not travel "
        "(docs/reproducibility.md).",
        "",
    ]
    args.md.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
