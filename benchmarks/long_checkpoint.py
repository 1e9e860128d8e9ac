"""A long checkpointed run, killed and resumed: does it finish, and end as the uninterrupted run?

The FedAvg echo with 10 clients and 400 rounds, `runtime.checkpoint: true` (a checkpoint
after every round, the server's holding its whole ledger), in process: once straight
through, once killed with SIGKILL after round 300 and resumed with `raymvc run --resume`.
Prints the wall time of each and whether the two summaries, ledgers and labels agree.

    python benchmarks/long_checkpoint.py [--rounds 400 --kill-at 300] [--md benchmarks/long_checkpoint.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from gated_run import GatedRun  # noqa: E402  (the tests' gate: a run held after a given round)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--kill-at", type=int, default=300)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sc = {"name": "long", "method": "raymvc.bench.fedavg_echo", "params": {"rounds": args.rounds, "floats": 4},
              "data": {"dataset": "digits", "partition": "horizontal", "n_clients": args.clients},
              "runtime": {"backend": "local"}, "seed": 3}
        path = tmp / "long.yaml"
        path.write_text(yaml.safe_dump(sc))
        raymvc = [sys.executable, "-m", "raymvc.cli"]
        t = time.perf_counter()
        subprocess.run([*raymvc, "run", str(path), "--checkpoint", "--out", str(tmp / "full"), "--quiet"], check=True)
        full_s = time.perf_counter() - t
        out = tmp / "killed"
        t = time.perf_counter()
        with GatedRun(["run", str(path), "--checkpoint", "--out", str(out), "--quiet"], at_round=args.kill_at,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as gated:
            gated.wait_ready()
            gated.proc.kill()
            gated.proc.wait(timeout=60)
        logged = json.loads((out / "checkpoint.json").read_text())["rounds_logged"]
        subprocess.run([*raymvc, "run", "--resume", str(out), "--quiet"], check=True)
        killed_s = time.perf_counter() - t
        a, b = (json.loads((d / "summary.json").read_text()) for d in (out, tmp / "full"))
        same = {f: (out / f).read_bytes() == (tmp / "full" / f).read_bytes() for f in ("labels.csv",)}
        lines = [f"`python benchmarks/long_checkpoint.py --rounds {args.rounds} --kill-at {args.kill_at} "
                 f"--clients {args.clients}`", "",
                 "| run | status | rounds | MB | wall s | checkpointing s | protocol s |", "|---|---|---|---|---|---|---|",
                 f"| straight through | {b['status']} | {b['rounds']} | {b['communication']['mb_total']:.3f} | {full_s:.0f} "
                 f"| {b['timing'].get('checkpoint_s', 0):.1f} | {b['timing']['protocol_s']:.2f} |",
                 f"| SIGKILL after round {args.kill_at} ({logged} rounds checkpointed), then --resume | {a['status']} | "
                 f"{a['rounds']} | {a['communication']['mb_total']:.3f} | {killed_s:.0f} | (resumed part) "
                 f"{a['timing'].get('checkpoint_s', 0):.1f} | {a['timing']['protocol_s']:.2f} |", "",
                 "Checkpointing and protocol seconds are those of the run's own summary (the resumed "
                 "part alone for the second run).", "",
                 f"Same metrics: {a['metrics'] == b['metrics']}; same communication: "
                 f"{a['communication'] == b['communication']}; same labels.csv: {same['labels.csv']}."]
    print("\n".join(lines))
    if args.md:
        args.md.write_text("# A long checkpointed run, killed and resumed\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
