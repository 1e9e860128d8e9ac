"""The deep methods with GPU client actors on Ray against CPU client actors, on one machine.

    python benchmarks/gpu.py [--seeds 0] [--runs feddmvc,fcuif,ccfc] [--out benchmarks/gpu.md] [--set KEY=VALUE ...]

Runs FedDMVC (HW, δ = 0.5), FCUIF (HW, setting (b)) and CCFC (digits) on the Ray backend
twice per seed, one run at a time on an embedded Ray instance:

* ``cpu``: ``params.device: cpu``, client actors with no GPU;
* ``gpu``: ``params.device: auto`` and ``runtime.client_gpus`` = 1 / (clients), rounded
  down to 0.01, so every client actor of a run shares the one GPU.

It reports ACC, NMI, MB, wall and protocol time, the GPU ids Ray gave the client actors
(from ``summary.json``), the GPU run's speed-up and how many samples got the same
cluster in both runs (after matching cluster numbers). Models are seeded on the CPU and
moved, and randomness comes from CPU generators, so both runs start alike; CUDA kernels
round differently, so labels can drift apart. Needs torch with CUDA and a GPU Ray can
see; nothing in the test suite uses it. ``--set`` shortens the runs for a dry run
(e.g. ``--set params.epochs=1``); the table says which settings were changed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from raymvc.driver import run_scenario
from raymvc.metrics import acc as matched_accuracy
from raymvc.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
RUNS = {  # id: (label, scenario, overrides)
    "feddmvc": ("FedDMVC δ = 0.5 (HW)", REPO / "scenarios" / "hw-feddmvc.yaml", ["data.missing.rate=0.5"]),
    "fcuif": ("FCUIF (b) (HW)", REPO / "scenarios" / "hw-fcuif-missing.yaml", []),
    "ccfc": ("CCFC (digits)", REPO / "scenarios" / "digits-ccfc.yaml", []),
}


def _labels(out: Path) -> np.ndarray:
    lines = (out / "labels.csv").read_text().splitlines()[1:]
    return np.array([int(x.split(",")[1]) for x in lines])


def arm_settings(arm: str, n_clients: int) -> list[str]:
    """The overrides of one arm: CPU actors, or GPU actors sharing one GPU."""
    if arm == "cpu":
        return ["params.device=cpu", "runtime.client_gpus=0"]
    share = math.floor(100 / n_clients) / 100
    return ["params.device=auto", f"runtime.client_gpus={share}"]


def _gpus(s: dict) -> str:
    ids = (s.get("placement") or {}).get("gpu_ids") or {}
    clients = ids.get("clients") or {}
    given = sorted({g for v in clients.values() for g in v})
    with_gpu = sum(1 for v in clients.values() if v)
    return f"{with_gpu}/{len(clients)} on GPU {','.join(given)}" if with_gpu else f"0/{len(clients)}"


def main(argv=None) -> int:
    import ray
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "gpu.md"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra override for every run")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {', '.join(RUNS)} (default: all)")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        ap.error(f"--runs: no run {sorted(unknown)[0]!r} (runs: {', '.join(RUNS)})")
    runs = {k: v for k, v in RUNS.items() if k in args.runs.split(",")}
    if not torch.cuda.is_available() and "RAY_OVERRIDE_RESOURCES" not in os.environ:
        ap.error("torch sees no CUDA device here (a dry run of the plumbing without one: set "
                 "RAY_OVERRIDE_RESOURCES='{\"GPU\": 1}', which gives actors GPU ids with nothing behind them)")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    rows, raw = [], []
    with tempfile.TemporaryDirectory() as d:
        for name, path, sets in runs.values():
            for seed in seeds:
                labels, res = {}, {}
                for arm in ("cpu", "gpu"):  # the CPU run first: it tells how many clients share the GPU
                    n = res["cpu"]["n_clients"] if res else 1
                    sc = load_scenario(path, ["runtime.backend=ray", f"seed={seed}", *sets, *args.set,
                                              *arm_settings(arm, n)])
                    out = Path(d) / f"{path.stem}-{seed}-{arm}"
                    s = run_scenario(sc, out, progress=lambda line: None)
                    res[arm] = s
                    labels[arm] = _labels(out) if (out / "labels.csv").is_file() else None
                    m = s["metrics"] or {}
                    rows.append(f"| {name} | {seed} | {arm} | {_gpus(s)} | {s['status']} | "
                                f"{m.get('acc', float('nan')):.4f} | {m.get('nmi', float('nan')):.4f} | "
                                f"{s['communication']['mb_total']:.2f} | {s['timing']['wall_s']:.1f} | "
                                f"{s['timing']['protocol_s']:.1f} |")
                    raw.append({"run": name, "seed": seed, "arm": arm, "status": s["status"], "metrics": m,
                                "mb": s["communication"]["mb_total"], "timing": s["timing"],
                                "gpu_ids": (s.get("placement") or {}).get("gpu_ids")})
                    print(rows[-1], flush=True)
                same = (matched_accuracy(labels["cpu"], labels["gpu"])
                        if labels["cpu"] is not None and labels["gpu"] is not None else float("nan"))
                speed = res["cpu"]["timing"]["protocol_s"] / max(res["gpu"]["timing"]["protocol_s"], 1e-9)
                rows.append(f"| {name} | {seed} | same cluster in both: {same:.4f} | | | | | | "
                            f"GPU {speed:.2f}x faster (protocol) | |")
                print(rows[-1], flush=True)
    text = "\n".join([
        "# The deep methods with GPU actors on Ray, against CPU actors",
        "",
        f"- command: `python benchmarks/gpu.py --seeds {args.seeds} --runs {args.runs}"
        + "".join(f" --set {x}" for x in args.set) + "`",
        f"- machine: {gpu}, {os.cpu_count()} CPU cores; torch {torch.__version__}, Ray {ray.__version__}",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        "- Ray backend, embedded instance, one run at a time, one torch thread per party; the "
        "`gpu` arm's client actors share the GPU (`runtime.client_gpus` = 1 / clients, "
        "`params.device: auto`), the `cpu` arm's get none (`params.device: cpu`)",
        "",
        "| run | seed | arm | client actors given a GPU | status | ACC | NMI | MB | wall s | protocol s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
