"""Cross-device scale: k-FED and CCFC with 100 and 1,000 clients on MNIST-10k, 10% of
them asked per round, and an inference round that hands the final model to every client.

    python benchmarks/cross_device.py                     # k-FED and CCFC, 100 and 1000 clients, both backends
    python benchmarks/cross_device.py --methods ccfc --clients 1000 --backends local

* k-FED: ``scenarios/mnist-kfed.yaml`` with ``data.n_clients`` N and
  ``faults.sampling: {fraction: 0.1}`` (``retry_rounds`` 2, its default).
* CCFC: ``scenarios/mnist-ccfc.yaml`` (the project's CCFC+, its widths) shortened to 2 + 2
  rounds, the same split and sampling.
* Both with ``faults.inference_round: true``: after the last round the final model goes
  to every client, so each labels its rows (without it, a client never asked keeps -1).

Each run is a fresh process (``python -m raymvc.cli run ... --json``). On Ray the logical
clients share 8 actors (``runtime.clients_per_actor`` = ceil(N / 8)). Reported per run:
the rounds (the inference round included), seconds per round (mean ``wall_s`` of
``rounds.jsonl``, the inference round apart), MB per round and of the inference round,
the share of rows labelled, ACC over all rows and over the labelled ones, total wall time
of the process, and whether ``labels.csv`` is byte-identical between Ray and in-process.
Results: ``benchmarks/cross_device.jsonl`` (a row per run; a case run again replaces its row)
and ``benchmarks/cross_device.md``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import filecmp
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_MD = REPO / "benchmarks" / "cross_device.md"
RESULTS = REPO / "benchmarks" / "cross_device.jsonl"  # every run's row; the table shows the latest per case
MAX_ACTORS = 8
COMMON = ["faults.sampling={fraction: 0.1}", "faults.inference_round=true"]
METHODS = {
    "kfed": ("scenarios/mnist-kfed.yaml", []),
    "ccfc": ("scenarios/mnist-ccfc.yaml", ["params.warmup_rounds=2", "params.cluster_rounds=2"]),
}


def run_one(method: str, n: int, backend: str, out: Path) -> dict:
    scenario, sets = METHODS[method]
    sets = [*sets, *COMMON, f"data.n_clients={n}", f"name={method}-{n}"]
    if backend == "ray":
        sets += [f"runtime.clients_per_actor={math.ceil(n / MAX_ACTORS)}", "runtime.client_cpus=0.2",
                 "runtime.server_cpus=0.2"]
    cmd = [sys.executable, "-m", "raymvc.cli", "run", str(REPO / scenario), "--backend", backend, "--out", str(out),
           "--quiet", "--json"] + [a for s in sets for a in ("--set", s)]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"method": method, "n": n, "backend": backend, "error": (p.stderr.strip().splitlines() or ["?"])[-1],
                "wall": wall}
    s = json.loads(p.stdout)
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    inf = (s.get("protocol_info") or {}).get("inference_round") or {}
    ledger_mb = s["communication"]["mb_total"]
    with open(out / "messages.csv", newline="") as fh:  # the inference round's bytes, from the ledger
        inf_mb = sum(int(m["wire_bytes"]) for m in csv.DictReader(fh)
                     if m["path"] == "protocol" and int(m["round"]) == inf.get("round", -2)) / 1e6
    per_round_mb = (ledger_mb - inf_mb) / max(len(rounds), 1)  # the inference round has no record of its own
    labelled = 1.0 - s["unlabelled_samples"] / s["n_samples"]
    ml = s.get("metrics_labelled") or s["metrics"]
    return {"method": method, "n": n, "backend": backend, "status": s["status"], "rounds": s["rounds"],
            "s_per_round": sum(r["wall_s"] for r in rounds) / max(len(rounds), 1), "mb_total": ledger_mb,
            "mb_per_round": per_round_mb, "mb_inference": inf_mb, "reached": inf.get("reached"),
            "addressed": inf.get("addressed"),
            "labelled": labelled, "acc": s["metrics"]["acc"], "acc_labelled": ml["acc"], "wall": wall,
            "out": str(out)}


def table(rows: list[dict], same: dict) -> str:
    lines = ["# Cross-device scale: 10% of the clients a round, and an inference round", "",
             f"- command: `python benchmarks/cross_device.py` ({' '.join(sys.argv[1:]) or 'defaults'})",
             f"- machine: {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             "- MNIST-10k split horizontally over N clients; `faults.sampling: {fraction: 0.1}`, "
             "`faults.inference_round: true`; k-FED as shipped, CCFC (the shipped CCFC+) at 2 + 2 rounds; "
             "on Ray ceil(N / 8) logical clients per actor",
             "- rows: the latest run of each case (`benchmarks/cross_device.jsonl`); the machine is shared, so "
             "times compare only within one invocation (each method's rows ran together: k-FED's beside two "
             "other heavy jobs, CCFC's beside two trainings and a sweep)",
             "- s/round, MB/round: the protocol's rounds (`rounds.jsonl`; the inference round apart, its MB from "
             "`messages.csv`); MB total includes it; reached: clients the inference round reached of those it "
             "addressed; labelled: share of rows with a label", "",
             "| method | clients | backend | status | rounds | s/round | MB total | MB/round | MB inference | reached | labelled "
             "| ACC all rows | ACC labelled | wall s | labels = in-process |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['n']} | {r['backend']} | error: {r['error'][:80]} | | | | | | | | | | "
                         f"{r['wall']:.0f} | |")
            continue
        eq = same.get((r["method"], r["n"]), "") if r["backend"] == "ray" else ""
        lines.append(f"| {r['method']} | {r['n']} | {r['backend']} | {r['status']} | {r['rounds']} | "
                     f"{r['s_per_round']:.2f} | {r['mb_total']:.1f} | {r['mb_per_round']:.1f} | {r['mb_inference']:.1f} | "
                     f"{r['reached']}/{r['addressed']} | {r['labelled']:.3f} | {r['acc']:.3f} | "
                     f"{r['acc_labelled']:.3f} | {r['wall']:.0f} | {eq} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["kfed", "ccfc"], choices=sorted(METHODS))
    ap.add_argument("--clients", nargs="+", type=int, default=[100, 1000])
    ap.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    args = ap.parse_args(argv)
    rows, same = [], {}
    with tempfile.TemporaryDirectory(prefix="cross-device-") as tmp:
        for method in args.methods:
            for n in args.clients:
                outs = {}
                for backend in args.backends:
                    out = Path(tmp) / f"{method}-{n}-{backend}"
                    r = run_one(method, n, backend, out)
                    print(json.dumps(r), flush=True)
                    rows.append(r)
                    if "error" not in r:
                        outs[backend] = out / "labels.csv"
                if len(outs) == 2:
                    same[(method, n)] = "yes" if filecmp.cmp(outs["local"], outs["ray"], shallow=False) else "no"
    old = [json.loads(x) for x in RESULTS.read_text().splitlines() if x.strip()] if RESULTS.is_file() else []
    for r in rows:
        r["labels_same"] = same.get((r["method"], r["n"]), "") if r["backend"] == "ray" else ""
        r.pop("out", None)
    cases = {(r["method"], r["n"], r["backend"]): r for r in [*old, *rows]}
    RESULTS.write_text("".join(json.dumps(r) + "\n" for r in cases.values()))
    keep = sorted(cases.values(), key=lambda r: (r["method"], r["n"], r["backend"]))
    OUT_MD.write_text(table(keep, {(r["method"], r["n"]): r["labels_same"] for r in keep if r.get("labels_same")}))
    print(OUT_MD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
