"""A study's wall time on Ray against the same study in-process, with and without warm actors.

    python benchmarks/study_throughput.py             # the 8-run sweep
    python benchmarks/study_throughput.py --large     # + the 24-run sweep, embedded and on a 3-node cluster

The 8-run sweep is hw-cefmc and digits-kfed x dropout {0, 0.3} x seeds 0-1. Each sweep
is one ``raymvc sweep`` process (interpreter, imports, Ray's start and stop included),
timed from start to exit, in one loop:

* ``in-process``: ``--backend local --jobs 1``;
* ``Ray, fresh actors, one at a time``: ``--jobs 1 --fresh-actors`` (every run starts its
  own server and client actors, as every sweep on Ray did before warm actors);
* ``Ray, warm actors, one run at a time``: ``--jobs 1`` (one crew of actors, reset for
  every run of its kind);
* ``Ray, warm actors, runs side by side``: the default (``--jobs auto``: as many runs at
  once as the cluster's CPUs hold, each crew reused by later runs of its kind);
* ``Ray, cells as tasks``: ``--cells tasks`` (each run simulated in-process inside one
  Ray task, as many tasks at once as the cluster's CPUs hold).

The floor under the 8-run sweep on Ray is one more process in the same loop: Ray alone
(``raymvc.bench.floor``) starting as many actors as the default sweep started (the sum of
its runs' ``placement.actors_started``), each importing the libraries the two methods'
parties import whatever runs them (NumPy, SciPy, scikit-learn), then stopping. The
sweep's time above in-process, less that floor, is what raymvc adds on Ray.

The 24-run sweep adds hw-efimvc-missing and dropout {0, 0.1, 0.2, 0.3}; it runs on the
embedded instance and on a three-node ``ray.cluster_utils.Cluster`` on this machine
(nodes of ``--node-cpus`` logical CPUs each; the machine's cores are shared by all
three). Every Ray sweep's ``sweep.csv`` must give the in-process sweep's status, ACC,
NMI, ARI and MB for every run; the script says whether it does.

Output: stdout and ``benchmarks/study_throughput.md`` (command line, machine, date).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raymvc.bench.floor import ray_alone  # noqa: E402
from raymvc.bench.machine import cpu_model  # noqa: E402

OUT_MD = REPO / "benchmarks" / "study_throughput.md"
SC = REPO / "scenarios"
SMALL = {"scenarios": [SC / "hw-cefmc.yaml", SC / "digits-kfed.yaml"], "dropout": "[0, 0.3]"}
LARGE = {"scenarios": [SC / "hw-cefmc.yaml", SC / "digits-kfed.yaml", SC / "hw-efimvc-missing.yaml"],
         "dropout": "[0, 0.1, 0.2, 0.3]"}
SAME = ("scenario", "faults.dropout.rate", "seed", "status", "acc", "nmi", "ari", "mb")
TARGET_EXTRA_S = 8.0  # the 8-run sweep on Ray: at most this much more than in-process
TARGET_TASKS_S = 5.0  # the 8-run sweep as Ray tasks: at most this much more than in-process
FLOOR_IMPORTS = ("numpy", "scipy.linalg", "sklearn.cluster", "sklearn.metrics")  # CeFMC's and k-FED's parties


def actors_started(out: Path) -> int:
    """Actors a Ray sweep started, over all its runs (from each run's summary.json)."""
    from raymvc.results.folder import read_summary

    return sum(int(read_summary(f.parent).get("placement", {}).get("actors_started") or 0)
               for f in out.glob("*/summary.json"))


def sweep(study: dict, out: Path, *flags: str, env: dict | None = None) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "raymvc.cli", "sweep", *map(str, study["scenarios"]), "--grid",
           f"faults.dropout.rate={study['dropout']}", "--seeds", "0,1", "--out", str(out), "--quiet", *flags]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env or os.environ.copy())
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"study_throughput: {' '.join(cmd[3:])} exited {r.returncode}: {r.stderr[-1500:]}")
    with open(out / "sweep.csv", newline="") as fh:
        return wall, list(csv.DictReader(fh))


def same(a: list[dict], b: list[dict]) -> bool:
    return [[r[k] for k in SAME] for r in a] == [[r[k] for k in SAME] for r in b]


def three_nodes(node_cpus: int):
    """A head and two workers on this machine, without token authentication (as the tests start it)."""
    from ray.cluster_utils import Cluster

    os.environ["RAY_AUTH_MODE"] = "disabled"
    c = Cluster(initialize_head=True, connect=False,
                head_node_args={"num_cpus": node_cpus, "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=node_cpus)
    c.wait_for_nodes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    return c, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="also the 24-run sweep, embedded and on 3 nodes")
    ap.add_argument("--node-cpus", type=int, default=4, help="logical CPUs per node of the 3-node cluster")
    ap.add_argument("--md", type=Path, default=OUT_MD)
    args = ap.parse_args()
    systems = [("in-process", ["--backend", "local", "--jobs", "1"]),
               ("Ray, fresh actors, one run at a time", ["--backend", "ray", "--jobs", "1", "--fresh-actors"]),
               ("Ray, warm actors, one run at a time", ["--backend", "ray", "--jobs", "1"]),
               ("Ray, warm actors, runs side by side as the CPUs hold", ["--backend", "ray"]),
               ("Ray, cells as tasks (each run in-process inside one task)", ["--backend", "ray", "--cells", "tasks"])]
    default = systems[3][0]  # what `raymvc sweep` does on Ray without flags
    rows: list[tuple[str, str, float, bool]] = []
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        studies = [("8 runs", SMALL)] + ([("24 runs", LARGE)] if args.large else [])
        for name, study in studies:
            base = None
            for i, (label, flags) in enumerate(systems):
                wall, got = sweep(study, Path(tmp) / f"{name[:2]}-{i}", *flags)
                base = got if base is None else base
                rows.append((name, label, wall, same(got, base)))
                print(f"{name}, {label}: {wall:.1f} s", file=sys.stderr, flush=True)
                if name == "8 runs" and label == default:
                    n_actors = actors_started(Path(tmp) / f"{name[:2]}-{i}")
                    t = time.perf_counter()
                    # as the sweep's embedded instance: the machine's CPUs, or what its actors ask for
                    cpus = max(os.cpu_count() or 1, math.ceil(0.5 * n_actors))
                    ray_alone(n_actors, cpus, 0.5, 0.5, imports=FLOOR_IMPORTS)
                    floor = time.perf_counter() - t
                    rows.append((name, f"floor: Ray alone, {n_actors} actors importing NumPy, SciPy, scikit-learn",
                                 floor, True))
                    print(f"{name}, floor with {n_actors} actors: {floor:.1f} s", file=sys.stderr, flush=True)
        if args.large:
            c, env = three_nodes(args.node_cpus)
            try:
                for i, (label, flags) in enumerate([systems[1], systems[3], systems[4]]):
                    wall, got = sweep(LARGE, Path(tmp) / f"cl-{i}", "--address", c.address, *flags[2:], env=env)
                    rows.append(("24 runs, 3 nodes", label, wall, same(got, base)))  # base: the 24 runs in-process
                    print(f"24 runs on 3 nodes, {label}: {wall:.1f} s", file=sys.stderr, flush=True)
            finally:
                c.shutdown()
    here = {name: wall for name, label, wall, _ in rows if label == "in-process"}
    lines = ["# A study's wall time on Ray and in-process", "",
             f"- command: `python benchmarks/study_throughput.py{' --large' if args.large else ''}"
             f"{f' --node-cpus {args.node_cpus}' if args.large else ''}`",
             f"- machine: {os.cpu_count()} cores ({cpu_model()}); each sweep one `raymvc sweep` process, "
             "timed from start to exit, all in one loop",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             "| sweep | how | wall s | minus in-process s | same sweep.csv as in-process |", "|---|---|---|---|---|"]
    for name, label, wall, ok in rows:
        ref = here.get(name.split(",")[0])
        if label.startswith("floor"):
            lines.append(f"| {name} | {label} | {wall:.1f} | - | - |")
            continue
        lines.append(f"| {name} | {label} | {wall:.1f} | {wall - ref:+.1f} | {'yes' if ok else 'NO'} |")
    small = {label: wall for name, label, wall, _ in rows if name == "8 runs"}
    floor = next(wall for name, label, wall, _ in rows if name == "8 runs" and label.startswith("floor"))
    extra = small[default] - small["in-process"]
    lines += ["", f"8 runs, warm actors on Ray (the default): {extra:+.1f} s against in-process (target at most "
              f"+{TARGET_EXTRA_S:g} s: {'met' if extra <= TARGET_EXTRA_S else 'not met'}); one at a time "
              f"{small[systems[2][0]] - small['in-process']:+.1f} s; fresh actors one at a "
              f"time: {small[systems[1][0]] - small['in-process']:+.1f} s; warm / fresh = "
              f"{small[default] / small[systems[1][0]]:.2f}. The floor (Ray alone with the sweep's actors and "
              f"their libraries) takes {floor:.1f} s, so raymvc adds {extra - floor:+.1f} s on Ray above it.",
              "", f"8 runs as Ray tasks: {small[systems[4][0]] - small['in-process']:+.1f} s against in-process "
              f"(target at most +{TARGET_TASKS_S:g} s: "
              f"{'met' if small[systems[4][0]] - small['in-process'] <= TARGET_TASKS_S else 'not met'})."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.md.write_text(text)


if __name__ == "__main__":
    main()
