"""The quickstart as a user meets it: ``raymvc run scenarios/hw-cefmc.yaml`` as a whole process.

    python benchmarks/quickstart_process.py              # 5 runs on Ray, 5 in-process, alternating
    python benchmarks/quickstart_process.py --repeats 3 --scenario scenarios/hw-cefmc.yaml
    python benchmarks/quickstart_process.py --compare ../other-checkout   # + that checkout on Ray, alternating

Each run is a fresh process (``raymvc run ... --json --out TMP``), so it pays what a
user pays: the interpreter and imports, the data, Ray's start, the actors, the
protocol, the results on disk and the process's exit (for Ray, stopping the embedded
instance). The split of the whole comes from the run's own ``summary.json``
(``ray_init_s``, ``startup_s``, ``protocol_s``, ``wall_s``) and from the moment the
summary reached stdout: ``outside`` = the time to the summary that ``wall_s`` does not
cover (interpreter and imports, loading the data, scoring the labels, writing the
summary), ``exit`` = summary to the end of the process.

Output: stdout and ``benchmarks/quickstart_process.md`` (command line, machine, date).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raymvc.bench.machine import cpu_model  # noqa: E402

OUT_MD = REPO / "benchmarks" / "quickstart_process.md"
TARGET_S = 6.0  # the quickstart as a process on Ray, idle 2-core machine


def one_run(scenario: Path, backend: str, out: Path, repo: Path = REPO) -> dict:
    """One ``raymvc run`` process of the checkout ``repo`` (its own code first on the path)."""
    cmd = [sys.executable, "-m", "raymvc.cli", "run", str(scenario), "--json", "--out", str(out),
           "--set", f"runtime.backend={backend}"]
    with tempfile.TemporaryFile(mode="w+") as err:  # the CLI's errors go to stderr
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)), stdout=subprocess.PIPE,
                                stderr=err, text=True)
        line = ""  # the summary (indented JSON), printed once the results are on disk; it ends with "}" alone
        for part in proc.stdout:
            line += part
            if part.rstrip("\n") == "}":
                break
        t_summary = time.perf_counter()
        proc.stdout.read()  # whatever follows (nothing, normally) until the process ends
        rc = proc.wait()
        t_end = time.perf_counter()
        if rc != 0 or not line.strip():
            err.seek(0)
            raise SystemExit(f"quickstart_process: {' '.join(cmd)} ended with {rc}: {err.read()[-600:]}")
    summary = json.loads(line)
    t = summary["timing"]
    return {"process_s": t_end - t0, "exit_s": t_end - t_summary, "outside_s": (t_summary - t0) - t["wall_s"],
            "ray_init_s": t["ray_init_s"], "startup_s": t["startup_s"], "protocol_s": t["protocol_s"],
            "wall_s": t["wall_s"], "status": summary["status"], "nmi": summary["metrics"]["nmi"],
            "mb": summary["communication"]["mb_total"]}


COLS = ("process_s", "outside_s", "ray_init_s", "startup_s", "protocol_s", "exit_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "hw-cefmc.yaml")
    ap.add_argument("--md", type=Path, default=OUT_MD)
    ap.add_argument("--compare", type=Path, default=None,
                    help="another checkout (e.g. an earlier commit) run on Ray in the same loop, alternating")
    ap.add_argument("--label", default=None, help="its name in the table (default: the path)")
    args = ap.parse_args()
    label = args.label or str(args.compare)
    systems = [("ray", "ray", REPO), ("local", "local", REPO)]
    if args.compare:
        systems.append(("ray, " + label, "ray", args.compare.resolve()))
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in systems}
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        for i in range(args.repeats):
            for j, (name, backend, repo) in enumerate(systems):
                r = one_run(args.scenario.resolve(), backend, Path(tmp) / f"{j}-{i}", repo)
                runs[name].append(r)
                print(f"{name} #{i}: " + "  ".join(f"{k} {r[k]:.2f}" for k in COLS), file=sys.stderr, flush=True)
    lines = [f"# The quickstart as a process ({args.scenario.name})", "",
             f"- command: `python benchmarks/quickstart_process.py --repeats {args.repeats}"
             + (f" --compare {'<' + label + '>' if args.label else args.compare}`" if args.compare else "`"),
             f"- machine: {os.cpu_count()} cores ({cpu_model()}); medians over fresh processes, backends alternating",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             "| backend | process s | outside wall s | Ray start s | start-up s | protocol s | exit s | NMI | MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for backend, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in COLS}
        lines.append(f"| {backend} | " + " | ".join(f"{med[k]:.2f}" for k in COLS)
                     + f" | {rs[0]['nmi']:.4f} | {rs[0]['mb']:.3f} |")
    ray_med = statistics.median(r["process_s"] for r in runs["ray"])
    same = {(r["nmi"], r["mb"]) for rs in runs.values() for r in rs}
    if args.compare:
        other = statistics.median(r["process_s"] for r in runs[systems[2][0]])
        lines += ["", f"This checkout / {label} on Ray, process time: {ray_med:.2f} / {other:.2f} s "
                  f"= {ray_med / other:.2f} (same loop)."]
    lines += ["", f"Process on Ray, median {ray_med:.2f} s (best {min(r['process_s'] for r in runs['ray']):.2f} s); "
              f"target <= {TARGET_S:.0f} s: {'met' if ray_med <= TARGET_S else 'not met'}. "
              f"Same NMI and MB in every run: {len(same) == 1}.", "",
              "All runs (process s): " + "; ".join(f"{b} " + ", ".join(f"{r['process_s']:.2f}" for r in rs)
                                                    for b, rs in runs.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    args.md.write_text(text)


if __name__ == "__main__":
    main()
