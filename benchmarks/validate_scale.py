"""How long ``raymvc validate`` takes, and how much memory, on the largest inputs a scenario may declare.

    python benchmarks/validate_scale.py            # every case once
    python benchmarks/validate_scale.py --repeats 3

Cases (each written into a temporary folder, validated by a fresh ``raymvc validate``
process, so the figures include the interpreter and the imports a user pays):

- ``clients``: 10^6 clients over 10^6 synthetic samples, horizontal split (k-FED);
- ``views``: 10^4 synthetic views (the cap) of 10^4 samples, 10^8 values in all;
- ``trace``: an availability trace just under its 50 MB cap (about 2 million intervals of
  100 clients).

Peak memory is the process's maximum resident set size (``getrusage`` of the child).
Output: stdout and ``benchmarks/validate_scale.md`` (command line, machine, date).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CASES = {
    "clients": """name: clients
method: kfed
data:
  dataset: synthetic
  partition: horizontal
  n_clients: 1000000
  synthetic: {n_samples: 1000000, n_views: 1, dims: 2, n_clusters: 5}
runtime: {backend: local}
""",
    "views": """name: views
method: efimvc
data:
  dataset: synthetic
  partition: vertical
  synthetic: {n_samples: 10000, n_views: 10000, dims: 1, n_clusters: 2}
runtime: {backend: local}
""",
    "trace": """name: trace
method: raymvc.bench.fedavg_echo
params: {rounds: 100, floats: 4}
data: {dataset: digits, partition: horizontal, n_clients: 100}
faults:
  availability: {model: trace, path: trace.csv}
runtime: {backend: local}
""",
}


def write_trace(path: Path, limit: int = 49_900_000) -> None:
    rng = np.random.default_rng(0)
    n = 2_000_000
    c = rng.integers(0, 100, n)
    start = np.round(rng.uniform(0, 1e7, n), 3)
    end = np.round(start + rng.uniform(1, 100, n), 3)
    text = "client,start_s,end_s\n" + "".join(f"{a},{b},{e}\n" for a, b, e in zip(c.tolist(), start.tolist(),
                                                                                 end.tolist()))
    text = text[:limit]
    path.write_text(text[:text.rfind("\n") + 1])


PROBE = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.run([sys.executable, '-m', 'raymvc.cli', 'validate', sys.argv[1]], capture_output=True, "
    "text=True, timeout=600)\n"
    "wall = time.perf_counter() - t\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "out = (p.stdout + p.stderr).strip().splitlines()\n"
    "print(wall, peak, p.returncode, out[0] if out else '', sep='\\t')\n"
)


def one(path: Path) -> tuple[float, float, int, str]:
    """(wall s, peak MB, exit code, first line of output) of ``raymvc validate path``, run
    from a fresh intermediate process so that its peak is this case's alone."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=700)
    wall, peak, rc, line = out.stdout.rstrip("\n").split("\t", 3)
    return float(wall), int(peak) / 1024, int(rc), line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "validate_scale.md"))
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="raymvc-validate-") as tmp:
        tmp = Path(tmp)
        write_trace(tmp / "trace.csv")
        for name in ("clients", "views", "trace"):
            path = tmp / f"{name}.yaml"
            path.write_text(CASES[name])
            for _ in range(args.repeats):
                wall, peak, rc, line = one(path)
                rows.append((name, wall, peak, rc, line.replace(str(tmp) + "/", "")))
                print(f"{name}: {wall:.1f} s, peak {peak:.0f} MB, exit {rc}: {line}", flush=True)
    lines = [
        "# `raymvc validate` on the largest declared inputs",
        "",
        f"- command: `python benchmarks/validate_scale.py{' --repeats ' + str(args.repeats) if args.repeats > 1 else ''}`",
        f"- machine: {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "- each case a fresh `raymvc validate` process (interpreter and imports included); peak = the "
        "process's maximum resident set size. Goal: an answer (accept or refuse) in under 10 s and 2 GB.",
        "",
        "| case | wall s | peak MB | exit | answer |",
        "|---|---|---|---|---|",
        *(f"| {n} | {w:.1f} | {p:.0f} | {rc} | {ln[:140]} |" for n, w, p, rc, ln in rows),
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
