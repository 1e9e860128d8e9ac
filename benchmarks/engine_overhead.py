"""Ray's overhead against the in-process backend, and CeFMC's scaling in N.

    python benchmarks/engine_overhead.py            # quickstart x2 backends + N = 1e4, 1e5, 1e6
    python benchmarks/engine_overhead.py --max-n 100000

Part 1 runs the quickstart scenario (CeFMC on handwritten) on both backends in one
process and prints protocol time, MB and the Ray/in-process protocol-time ratio
(``protocol_s`` excludes Ray's start-up and actor creation, reported apart).
Part 2 runs CeFMC on the seeded synthetic generator (3 views x 20 features, k = 5)
at growing N with the in-process backend and prints the mean wall time of a label
round (rounds >= 1) and of the round-0 embedding exchange; per-round time divided by
N should stay flat if a round is linear in N.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raymvc.runtime import run_scenario  # noqa: E402
from raymvc.scenario import load_scenario  # noqa: E402

QUICK = REPO / "scenarios" / "hw-cefmc.yaml"


def _rounds(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]


def backends(tmp: Path, repeats: int) -> None:
    print("## Ray vs in-process (quickstart: CeFMC on handwritten, 6 clients)\n")
    print("| backend | protocol s (best of %d) | start-up s | rounds | MB | ACC | NMI |" % repeats)
    print("|---|---|---|---|---|---|---|")
    best = {}
    for backend in ("local", "ray"):
        runs = []
        for i in range(repeats):
            sc = load_scenario(QUICK, [f"runtime.backend={backend}"])
            runs.append(run_scenario(sc, tmp / f"{backend}{i}", progress=lambda line: None))
        s = min(runs, key=lambda r: r["timing"]["protocol_s"])
        best[backend] = s
        t = s["timing"]
        print(f"| {backend} | {t['protocol_s']:.3f} | {t.get('startup_s', 0) + t['ray_init_s']:.2f} | {s['rounds']} "
              f"| {s['communication']['mb_total']:.3f} | {s['metrics']['acc']:.4f} | {s['metrics']['nmi']:.4f} |")
    same = best["ray"]["metrics"] == best["local"]["metrics"] and \
        best["ray"]["communication"] == best["local"]["communication"]
    ratio = best["ray"]["timing"]["protocol_s"] / best["local"]["timing"]["protocol_s"]
    print(f"\nRay / in-process protocol-time ratio: {ratio:.2f}  (identical metrics and bytes: {same})\n")


def scaling(tmp: Path, sizes: list[int]) -> None:
    print("## CeFMC time per round vs N (synthetic, 3 views x 20 features, k = 5, in-process)\n")
    print("| N | round 0 s | label round s (mean) | us per sample per round | rounds | MB | ACC |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        over = ["runtime.backend=local", "data.dataset=synthetic", f"data.synthetic.n_samples={n}",
                "data.synthetic.n_views=3", "data.synthetic.dims=20", "data.synthetic.n_clusters=5",
                "data.synthetic.noise=3.0", "data.normalize=none", "params.kmeans_init=1", "params.max_rounds=10",
                "name=cefmc-synthetic"]
        sc = load_scenario(QUICK, over)
        s = run_scenario(sc, tmp / f"n{n}", progress=lambda line: None)
        rounds = _rounds(tmp / f"n{n}")
        label = [r["wall_s"] for r in rounds[1:]]
        per = sum(label) / max(len(label), 1)
        print(f"| {n:,} | {rounds[0]['wall_s']:.3f} | {per:.4f} | {per / n * 1e6:.3f} | {s['rounds']} "
              f"| {s['communication']['mb_total']:.1f} | {s['metrics']['acc']:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-n", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-backends", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.skip_backends:
            backends(tmp, args.repeats)
        scaling(tmp, [n for n in (10_000, 100_000, 1_000_000) if n <= args.max_n])


if __name__ == "__main__":
    main()
