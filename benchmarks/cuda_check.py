"""The torch methods on a CUDA device against the CPU, on one machine (an optional check).

    python benchmarks/cuda_check.py [--out benchmarks/cuda_check.md]

Runs FedDMVC (``scenarios/hw-feddmvc.yaml``, defaults) and a shortened CCFC
(``scenarios/digits-ccfc.yaml`` with 10 + 10 rounds) in-process, once with
``params.device: cpu`` and once with ``params.device: cuda``, and reports ACC, NMI, MB,
wall and protocol time and how many samples got the same cluster on both devices
(after matching cluster numbers). Models are seeded on the CPU and randomness comes
from CPU generators, so the two runs start alike; CUDA kernels round differently, so
labels may drift apart a little. Needs torch with CUDA; nothing in the test suite uses
it.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
from pathlib import Path

import numpy as np

from raymvc.metrics import acc as matched_accuracy
from raymvc.runtime import run_scenario
from raymvc.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
RUNS = {
    "hw-feddmvc": (REPO / "scenarios" / "hw-feddmvc.yaml", []),
    "digits-ccfc (10 + 10 rounds)": (REPO / "scenarios" / "digits-ccfc.yaml",
                                     ["params.warmup_rounds=10", "params.cluster_rounds=10"]),
}


def _labels(out: Path) -> np.ndarray:
    lines = (out / "labels.csv").read_text().splitlines()[1:]
    return np.array([int(x.split(",")[1]) for x in lines])


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "cuda_check.md"))
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, (path, sets) in RUNS.items():
            labels = {}
            for device in ("cpu", "cuda"):
                sc = load_scenario(path, ["runtime.backend=local", f"params.device={device}", *sets])
                out = Path(d) / f"{path.stem}-{device}"
                s = run_scenario(sc, out, progress=lambda line: None)
                labels[device] = _labels(out)
                m = s["metrics"] or {}
                rows.append(f"| {name} | {device} | {s['status']} | {m.get('acc', float('nan')):.4f} | "
                            f"{m.get('nmi', float('nan')):.4f} | {s['communication']['mb_total']:.2f} | "
                            f"{s['timing']['wall_s']:.1f} | {s['timing']['protocol_s']:.1f} |")
                print(rows[-1], flush=True)
            agree = matched_accuracy(labels["cpu"], labels["cuda"])
            rows.append(f"| {name} | same cluster on both devices | | {agree:.4f} | | | | |")
            print(rows[-1], flush=True)
    text = "\n".join([
        "# The torch methods on CUDA and on the CPU",
        "",
        f"- command: `python benchmarks/cuda_check.py`; {gpu}, torch {torch.__version__}",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        "- in-process backend, one torch thread per party on the CPU",
        "",
        "| run | device | status | ACC | NMI | MB | wall s | protocol s |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
