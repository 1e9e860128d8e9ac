"""The quickstart as a user meets it: ``raymvc run scenarios/hw-cefmc.yaml`` as a whole process.

    python benchmarks/quickstart_process.py              # 5 runs on Ray, 5 in-process, alternating
    python benchmarks/quickstart_process.py --repeats 3 --scenario scenarios/hw-cefmc.yaml
    python benchmarks/quickstart_process.py --compare ../other-checkout   # + that checkout on Ray, alternating
    python benchmarks/quickstart_process.py --pooled 3 --ray-alone   # + pooled clients, + Ray with empty actors
    python benchmarks/quickstart_process.py --ray-alone --floor-imports numpy,scipy.linalg,pydantic   # + a floor with libraries
    python benchmarks/quickstart_process.py --ray-alone --fair-floor   # + the fair floor (below)

Each run is a fresh process (``raymvc run ... --json --out TMP``), so it pays what a
user pays: the interpreter and imports, the data, Ray's start, the actors, the
protocol, the results on disk and the process's exit (for Ray, stopping the embedded
instance). The split of the whole comes from the run's own ``summary.json``
(``ray_init_s``, ``startup_s``, ``protocol_s``, ``wall_s``) and from the moment the
summary reached stdout: ``outside`` = the time to the summary that ``wall_s`` does not
cover (interpreter and imports, loading the data, scoring the labels, writing the
summary), ``exit`` = summary to the end of the process. ``--ray-alone`` times the floor
under all of it (``raymvc.bench.floor``): a process that starts Ray as raymvc does and
as many empty actors as the run has (same CPU requests), calls each once and exits as
the ``raymvc`` command does; its ``outside`` is the interpreter's start and ``import ray``.

With ``--ray-alone`` it also times the imports raymvc adds to each process over
``import ray`` (CPU seconds in a fresh interpreter, median of three): a client actor's
(the node module and the method's module), the server's (the same) and the driver's
(the command line, the engine and the metrics). The actors' imports over the run's
cores are a floor under the gap between the run and Ray alone that no scheduling
removes. ``--floor-imports`` adds a floor whose actors import the libraries the method's
parties need whatever runs them (numpy, ...): the run's time above it is what raymvc's own
code and structure cost. ``--fair-floor`` is the floor any run of the method must pay: the
clients import what a client needs (``--floor-imports``, default numpy and scipy.linalg),
the server what the server needs (``--floor-server-imports``, default sklearn.cluster),
and the driver loads the scenario's data file, scales it and hands each client its view;
the run above it pays its protocol (any run of the method must run it, so it belongs to
what the floor stands for, though the floor cannot run it) and what raymvc's structure adds; the target is that share,
the gap less the protocol's seconds, within 1.5 s on a quiet machine (the page gives the
gap with the protocol too).

The columns add up to the process time: ``outside`` (interpreter, every import with
``import ray`` among them, the data, scoring, writing the summary), Ray's start, start-up
(actors up), the protocol, ``rest`` (the rest of the run's ``wall_s``: building the
parties' spec, stopping the actors, the results on disk) and ``exit``.

Output: stdout and ``benchmarks/quickstart_process.md`` (command line, machine, date).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raymvc.bench.floor import ray_alone  # noqa: E402
from raymvc.bench.machine import cpu_model  # noqa: E402
from raymvc.bench.timed import run_timed  # noqa: E402

OUT_MD = REPO / "benchmarks" / "quickstart_process.md"
TARGET_S = 6.0  # the quickstart as a process on Ray, idle 2-core machine
TARGET_GAP_S = 0.75  # the quickstart on Ray minus Ray alone with as many empty actors
TARGET_FAIR_GAP_S = 1.5  # the quickstart on Ray minus the fair floor (--fair-floor), less the protocol's seconds
PAUSE_S = 2.0  # between runs


def one_run(scenario: Path, backend: str, out: Path, repo: Path = REPO, sets: list[str] = ()) -> dict:
    """One ``raymvc run`` process of the checkout ``repo`` (its own code first on the path)."""
    cmd = [sys.executable, "-m", "raymvc.cli", "run", str(scenario), "--json", "--out", str(out),
           "--set", f"runtime.backend={backend}", *(x for s in sets for x in ("--set", s))]
    try:  # the summary (indented JSON) is printed once the results are on disk; it ends with "}" alone
        run = run_timed(cmd, last_line=lambda line: line.rstrip("\n") == "}", cwd=repo,
                        env=dict(os.environ, PYTHONPATH=str(repo)))
    except RuntimeError as e:
        raise SystemExit(f"quickstart_process: {e}") from None
    summary = json.loads(run.answer)
    t = summary["timing"]
    return {"process_s": run.process_s, "exit_s": run.exit_s, "outside_s": run.answer_s - t["wall_s"],
            "ray_init_s": t["ray_init_s"], "startup_s": t["startup_s"], "protocol_s": t["protocol_s"],
            "rest_s": t["wall_s"] - t["ray_init_s"] - t["startup_s"] - t["protocol_s"], "wall_s": t["wall_s"],
            "status": summary["status"], "nmi": summary["metrics"]["nmi"], "mb": summary["communication"]["mb_total"]}


COLS = ("process_s", "outside_s", "ray_init_s", "startup_s", "protocol_s", "rest_s", "exit_s")

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "hw-cefmc.yaml")
    ap.add_argument("--md", type=Path, default=OUT_MD)
    ap.add_argument("--compare", type=Path, default=None,
                    help="another checkout (e.g. an earlier commit) run on Ray in the same loop, alternating")
    ap.add_argument("--label", default=None, help="its name in the table (default: the path)")
    ap.add_argument("--pooled", type=int, default=0,
                    help="also run on Ray with this many clients per actor (runtime.clients_per_actor)")
    ap.add_argument("--ray-alone", action="store_true",
                    help="also time Ray alone: the same number of empty actors, started and stopped")
    ap.add_argument("--floor-imports", default="",
                    help="with --ray-alone: also time Ray alone with actors that import these modules as they start "
                         "(comma-separated, e.g. numpy,scipy.linalg,pydantic: the libraries the method's parties "
                         "need whatever runs them)")
    ap.add_argument("--fair-floor", action="store_true",
                    help="with --ray-alone: also time the fair floor (clients import --floor-imports, the server "
                         "--floor-server-imports, the driver loads the data and hands out the views)")
    ap.add_argument("--floor-server-imports", default="sklearn.cluster",
                    help="with --fair-floor: what the server imports (default sklearn.cluster)")
    args = ap.parse_args()
    if (args.floor_imports or args.fair_floor) and not args.ray_alone:
        ap.error("--floor-imports and --fair-floor need --ray-alone")
    fair_clients = tuple(m for m in (args.floor_imports or "numpy,scipy.linalg").split(",") if m)
    fair_server = tuple(m for m in args.floor_server_imports.split(",") if m)
    label = args.label or str(args.compare)
    systems = [("ray", "ray", REPO, []), ("local", "local", REPO, [])]
    if args.pooled:
        systems.append((f"ray, {args.pooled} clients per actor", "ray", REPO,
                        [f"runtime.clients_per_actor={args.pooled}"]))
    if args.compare:
        systems.append(("ray, " + label, "ray", args.compare.resolve(), []))
    if args.ray_alone:
        from raymvc.driver.cluster import actors_needed, cpus_needed
        from raymvc.driver.engine import prepare
        from raymvc.scenario import load_scenario

        sc = load_scenario(args.scenario)
        n_clients = prepare(sc)[1].n_clients
        n_actors = actors_needed(sc, n_clients) + 1
        alone = (n_actors, math.ceil(cpus_needed(sc, n_clients)), sc.runtime.client_cpus, sc.runtime.server_cpus)
        systems.append((f"Ray alone, {n_actors} empty actors", "alone", None, []))
        libs = tuple(m for m in args.floor_imports.split(",") if m)
        if libs and not args.fair_floor:
            systems.append((f"Ray alone, {n_actors} actors importing {', '.join(libs)}", "alone", None, list(libs)))
        if args.fair_floor:
            fair = f"fair floor: clients import {', '.join(fair_clients)}, the server {', '.join(fair_server)}; data loaded"
            systems.append((fair, "fair", None, []))
            data_file = data_path(sc)
    runs: dict[str, list[dict]] = {s[0]: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        for i in range(args.repeats):
            k = i % len(systems)  # the order rotates, so no system always follows the same one
            for j, (name, backend, repo, sets) in [*enumerate(systems)][k:] + [*enumerate(systems)][:k]:
                time.sleep(PAUSE_S)  # the previous process's Ray workers finish exiting
                if backend == "alone":
                    r = {**ray_alone(*alone, imports=tuple(sets)), "protocol_s": 0.0, "rest_s": 0.0, "nmi": None,
                         "mb": None}
                elif backend == "fair":
                    r = {**ray_alone(*alone, imports=fair_clients, server_imports=fair_server, data=data_file),
                         "protocol_s": 0.0, "rest_s": 0.0, "nmi": None, "mb": None}
                else:
                    r = one_run(args.scenario.resolve(), backend, Path(tmp) / f"{j}-{i}", repo, sets)
                runs[name].append(r)
                print(f"{name} #{i}: " + "  ".join(f"{k} {r[k]:.2f}" for k in COLS), file=sys.stderr, flush=True)
    lines = [f"# The quickstart as a process ({args.scenario.name})", "",
             f"- command: `python benchmarks/quickstart_process.py --repeats {args.repeats}"
             + (f" --pooled {args.pooled}" if args.pooled else "") + (" --ray-alone" if args.ray_alone else "")
             + (f" --floor-imports {args.floor_imports}" if args.floor_imports else "")
             + (" --fair-floor" if args.fair_floor else "")
             + (f" --floor-server-imports {args.floor_server_imports}"
                if args.fair_floor and args.floor_server_imports != "sklearn.cluster" else "")
             + (f" --compare {'<' + label + '>' if args.label else args.compare}`" if args.compare else "`"),
             f"- machine: {os.cpu_count()} cores ({cpu_model()}); medians over fresh processes, the order of the "
             f"rows rotating from one repeat to the next, {PAUSE_S:g} s between runs",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             "| backend | process s | outside wall s | Ray start s | start-up s | protocol s | rest s | exit s "
             "| NMI | MB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for backend, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in COLS}
        scores = " | - | - |" if rs[0]["nmi"] is None else f" | {rs[0]['nmi']:.4f} | {rs[0]['mb']:.3f} |"
        lines.append(f"| {backend} | " + " | ".join(f"{med[k]:.2f}" for k in COLS) + scores)
    ray_med = statistics.median(r["process_s"] for r in runs["ray"])
    same = {(r["nmi"], r["mb"]) for rs in runs.values() for r in rs if r["nmi"] is not None}
    inits = sorted(r["ray_init_s"] for rs in runs.values() for r in rs if r["ray_init_s"] > 0)

    def less_init(name: str) -> float:
        return statistics.median(r["process_s"] - r["ray_init_s"] for r in runs[name])

    for name, backend, repo, sets in systems[2:]:
        other = statistics.median(r["process_s"] for r in runs[name])
        lines += ["", f"ray / {name}, process time: {ray_med:.2f} / {other:.2f} s = {ray_med / other:.2f} (same loop); "
                  f"less Ray's start (its noisiest part, {inits[0]:.1f} to {inits[-1]:.1f} s in this loop): "
                  f"{less_init('ray'):.2f} / "
                  f"{less_init(name):.2f} s = {less_init('ray') / less_init(name):.2f}."]
    if args.ray_alone:
        from protocols import _REGISTRY

        method = f"protocols.{_REGISTRY[sc.method]}"
        actor = import_cpu(["raymvc.runtime.nodes", method])
        driver = import_cpu(["raymvc.cli", "raymvc.driver.engine", "raymvc.metrics", method])
        gap = ray_med - statistics.median(r["process_s"] for r in runs[f"Ray alone, {n_actors} empty actors"])
        floor = actor * n_actors / (os.cpu_count() or 1)
        lines += ["", f"Imports over `import ray` (CPU s, median of 3 fresh interpreters): a client or server "
                  f"actor {actor:.2f} ({', '.join(['raymvc.runtime.nodes', method])}), the driver {driver:.2f}. "
                  f"The run's {n_actors} actors import {actor * n_actors:.2f} CPU s, at least {floor:.2f} s of wall "
                  f"time on {os.cpu_count()} cores. Ray vs Ray alone: {gap:+.2f} s (target +{TARGET_GAP_S:g} s: "
                  f"{'met' if gap <= TARGET_GAP_S else 'not met'})."]
        for name, _, _, libs in [s for s in systems if s[1] == "alone" and s[3]]:
            lib_gap = ray_med - statistics.median(r["process_s"] for r in runs[name])
            libs_cpu = import_cpu(libs)
            lines += ["", f"Against {name} (they import {libs_cpu:.2f} CPU s each over `import ray`, "
                      f"{libs_cpu * n_actors / (os.cpu_count() or 1):.2f} s of wall time at least for the "
                      f"{n_actors}): Ray vs that floor {lib_gap:+.2f} s, what raymvc itself adds."]
    for name in [s[0] for s in systems if s[1] == "fair"]:
        fair_gap = ray_med - statistics.median(r["process_s"] for r in runs[name])
        proto = statistics.median(r["protocol_s"] for r in runs["ray"])
        structure = fair_gap - proto  # the floor runs no protocol: what any run must do besides it
        lines += ["", f"Against the fair floor ({name}): Ray vs it {fair_gap:+.2f} s, of which the protocol "
                  f"{proto:.2f} s, which the floor does not run and any run must; the rest, what raymvc's "
                  f"structure adds, {structure:+.2f} s (target within +{TARGET_FAIR_GAP_S:g} s: "
                  f"{'met' if structure <= TARGET_FAIR_GAP_S else 'not met'}; with the protocol counted against "
                  f"it, {'met' if fair_gap <= TARGET_FAIR_GAP_S else 'not met'})."]
    lines += ["", f"Process on Ray, median {ray_med:.2f} s (best {min(r['process_s'] for r in runs['ray']):.2f} s); "
              f"target <= {TARGET_S:.0f} s: {'met' if ray_med <= TARGET_S else 'not met'}. "
              f"Same NMI and MB in every run: {len(same) == 1}.", "",
              "All runs (process s): " + "; ".join(f"{b} " + ", ".join(f"{r['process_s']:.2f}" for r in rs)
                                                    for b, rs in runs.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    args.md.write_text(text)


def data_path(sc) -> Path | None:
    """The ``.npz`` the scenario's data come from (a built-in data set's or the user's), else None
    (the fair floor then loads nothing)."""
    from raymvc.data.datasets import BUILTIN_DIR

    own = getattr(sc.data, "path", None)
    f = Path(own) if isinstance(own, (str, Path)) else BUILTIN_DIR / f"{sc.data.dataset}.npz"
    return f if f.suffix == ".npz" and f.is_file() else None


def import_cpu(modules: list[str], repeats: int = 3) -> float:
    """CPU seconds that importing ``modules`` takes after ``import ray``, in a fresh interpreter."""
    code = ("import time, ray; t = time.process_time(); "
            + "; ".join(f"import {m}" for m in modules) + "; print(time.process_time() - t)")
    got = [float(subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split()[-1]) for _ in range(repeats)]
    return statistics.median(got)


if __name__ == "__main__":
    main()
