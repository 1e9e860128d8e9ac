"""What secure aggregation costs: the FedAvg echo with the engine's layer off, SecAgg, SecAgg+.

For each number of clients the echo (``raymvc.bench.fedavg_echo``, a vector of
``--floats`` float64 entries down and back up, averaged by row count) runs on synthetic
rows (20 features) split horizontally, in-process by default (``--backend ray`` pools the
clients, 50 per actor), with:

* ``plain``: no secure aggregation;
* ``secagg``: every client masks with every other (skipped above ``--full-max`` clients:
  its set-up and masks grow with the square of the number of clients);
* ``secagg+ k``: each client masks with and shares among ``k`` neighbours
  (``channel.secagg_neighbours``).

It prints a Markdown table -- status, clients in each round's sum, failed aggregations,
MB in all, MB of the layer's own exchanges
(``communication_secagg``), wall time of the protocol -- and the largest difference
between each secure run's final vector and the plain run's. Every client echoes the
same vector, so that difference measures the masks cancelling and the fixed-point
error, nothing else. With ``--dropout`` clients drop out of every exchange at that rate
(the layer's recovery at work). Example::

    python benchmarks/secure_aggregation.py --clients 6 100 1000 --neighbours 10
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from raymvc.bench import fedavg_echo
from raymvc.driver import run_scenario
from raymvc.scenario import scenario_from_dict


def scenario(n: int, mode: str, k: int, args) -> dict:
    rows = max(20 * n, 2000)
    raw = {
        "name": f"echo-{mode.replace('+', '-plus')}-{n}", "method": "raymvc.bench.fedavg_echo",
        "params": {"rounds": args.rounds, "floats": args.floats},
        "data": {"dataset": "synthetic", "partition": "horizontal", "n_clients": n, "normalize": "none",
                 "synthetic": {"n_samples": rows, "n_views": 1, "dims": [20], "n_clusters": 5}},
        "channel": {"secure_aggregation": mode != "plain"},
        "faults": {"dropout": {"rate": args.dropout}},
        "runtime": {"backend": args.backend},
        "seed": 0,
    }
    if mode != "plain":
        raw["channel"].update({"secagg_neighbours": k if mode == "secagg+" else 0, "secagg_threshold": args.threshold})
    if args.backend == "ray":
        raw["runtime"].update({"clients_per_actor": min(50, n), "client_cpus": 0.1})
    return raw


def run(n: int, mode: str, k: int, args, tmp: Path) -> dict:
    finals: list[np.ndarray] = []
    real = fedavg_echo.EchoServer.step

    def step(self, round, replies, missing):  # the server's vector after the last average (in-process only)
        out = real(self, round, replies, missing)
        finals[:] = [self.w.copy()]
        return out

    fedavg_echo.EchoServer.step = step
    try:
        sc = scenario_from_dict(scenario(n, mode, k, args))
        t = time.perf_counter()
        s = run_scenario(sc, tmp / sc.name, progress=lambda line: None)
        wall = time.perf_counter() - t
    finally:
        fedavg_echo.EchoServer.step = real
    log = [json.loads(line) for line in (tmp / sc.name / "rounds.jsonl").read_text().splitlines()]
    summed = "/".join(str(len(r["info"].get("aggregated", []))) for r in log)
    failed = sum("aggregation_failed" in r["info"] for r in log)
    return {"n": n, "mode": mode if mode != "secagg+" else f"secagg+ k={k}", "status": s["status"],
            "mb": s["communication"]["mb_total"], "mb_secagg": s["communication_secagg"]["mb_total"],
            "protocol_s": s["timing"]["protocol_s"], "wall_s": wall, "final": finals[0] if finals else None,
            "summed": summed, "failed": failed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[6, 100, 1000])
    p.add_argument("--neighbours", type=int, default=10, help="k of SecAgg+")
    p.add_argument("--full-max", type=int, default=100, help="largest client count run with plain SecAgg")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--floats", type=int, default=2048)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--threshold", type=float, default=0.5, help="channel.secagg_threshold")
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rmvc-secagg-") as d:
        tmp = Path(d)
        for n in args.clients:
            plain = run(n, "plain", 0, args, tmp)
            rows.append(plain)
            modes = (["secagg"] if n <= args.full_max else []) + ["secagg+"]
            for mode in modes:
                r = run(n, mode, args.neighbours, args, tmp)
                if r["final"] is not None and plain["final"] is not None:
                    r["diff"] = float(np.max(np.abs(r["final"] - plain["final"])))
                rows.append(r)
                print(f"  {n} clients, {r['mode']}: {r['status']}, {r['protocol_s']:.1f} s", file=sys.stderr)
    print(f"FedAvg echo, {args.floats} float64 entries, {args.rounds} rounds, dropout {args.dropout} per exchange, "
          f"secagg_threshold {args.threshold}, backend {args.backend}\n")
    print("| clients | aggregation | status | clients summed per round | failed aggregations | MB in all "
          "| of which the layer's | protocol s | max diff to plain |")
    print("|---:|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        diff = f"{r['diff']:.1e}" if "diff" in r else "-"
        print(f"| {r['n']:,} | {r['mode']} | {r['status']} | {r['summed']} | {r['failed']} | {r['mb']:.2f} | "
              f"{r['mb_secagg']:.2f} | "
              f"{r['protocol_s']:.1f} | {diff} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
