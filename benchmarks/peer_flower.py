"""raymvc against Flower's simulation engine on a trivial FedAvg (issue 11).

    python benchmarks/peer_flower.py                    # R = 5 and 100, 3 repeats each
    python benchmarks/peer_flower.py --repeats 1 --rounds 5 20

The job: 6 clients, one 2048-float64 array (16 KB) down and the same array back up per
client and round, FedAvg on the server, R rounds.

* raymvc: ``method: raymvc.bench.fedavg_echo``, horizontal split of a small synthetic
  data set over 6 clients, Ray backend, run as ``python -m raymvc.cli run ... --json``.
* Flower 1.42: a ``ClientApp`` whose ``train`` returns the array unchanged, a
  ``ServerApp`` running ``flwr.serverapp.strategy.FedAvg`` (no federated evaluation)
  over ``ArrayRecord([w])``, started by ``flwr.simulation.run_simulation`` with 6
  supernodes and a Ray backend of 6 actors (``client_resources.num_cpus = 1`` on a Ray
  instance of 6 logical CPUs, so each client has its own actor, as in raymvc).

Every measurement is a whole fresh process (imports, Ray start, actors, rounds,
shutdown), the two systems alternating. From the medians of total wall time:
per-round = (T(R_hi) - T(R_lo)) / (R_hi - R_lo) and start-up = T(R_lo) - R_lo x per-round.

Flower 1.42 pins ``ray==2.55.1`` (raymvc's venv has a newer Ray), so Flower runs from its
own virtual environment: ``--flower-python`` (default ``.venv/flower-env/bin/python``,
created with ``python -m venv --system-site-packages .venv/flower-env &&
.venv/flower-env/bin/pip install "flwr[simulation]>=1.42,<1.43"``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_MD = REPO / "benchmarks" / "peer_flower.md"
N_CLIENTS = 6
FLOATS = 2048  # 16 KB of float64

ECHO_YAML = """\
name: fedavg-echo
method: raymvc.bench.fedavg_echo
params: {{rounds: {rounds}, floats: {floats}}}
data:
  dataset: synthetic
  synthetic: {{n_samples: 600, n_views: 1, dims: 8, n_clusters: 3}}
  normalize: none
  partition: horizontal
  n_clients: {n_clients}
channel: {{encryption: none, compression: none, float_dtype: float64}}
runtime: {{backend: ray, client_cpus: 0.5}}
seed: 0
"""


# --------------------------------------------------------------------------- Flower side
def flower_child(rounds: int, result_path: str) -> None:
    """Run the echo FedAvg in Flower's simulation engine (this process only)."""
    t0 = time.perf_counter()
    import numpy as np
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    t_import = time.perf_counter() - t0
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:  # echo: the array goes back unchanged
        content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 100})})
        return Message(content=content, reply_to=msg)

    server = ServerApp()
    out: dict = {}

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        w = np.random.default_rng(0).standard_normal(FLOATS)
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=N_CLIENTS,
                          min_available_nodes=N_CLIENTS)
        t = time.perf_counter()
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord([w]), num_rounds=rounds)
        out["rounds_s"] = time.perf_counter() - t
        final = result.arrays.to_numpy_ndarrays()[0]
        out["echo_ok"] = bool(final.shape == w.shape and np.allclose(final, w))

    run_simulation(server_app=server, client_app=client, num_supernodes=N_CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": N_CLIENTS}})
    out["import_s"] = t_import
    out["total_in_process_s"] = time.perf_counter() - t0
    Path(result_path).write_text(json.dumps(out))


# --------------------------------------------------------------------------- driver side
def run_raymvc(rounds: int, tmp: Path, tag: str) -> dict:
    yml = tmp / f"echo{rounds}.yaml"
    yml.write_text(ECHO_YAML.format(rounds=rounds, floats=FLOATS, n_clients=N_CLIENTS))
    cmd = [sys.executable, "-m", "raymvc.cli", "run", str(yml), "--out", str(tmp / f"raymvc-{tag}"),
           "--json", "--quiet"]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"raymvc failed ({p.returncode}):\n{p.stderr[-3000:]}")
    s = json.loads((tmp / f"raymvc-{tag}" / "summary.json").read_text())  # stdout may carry worker output too
    if s["status"] != "completed" or s["rounds"] != rounds:
        raise RuntimeError(f"raymvc run: status {s['status']}, {s['rounds']} rounds")
    return {"wall": wall, "timing": s["timing"], "messages": s["communication"]["messages"]}


def run_flower(python: str, rounds: int, tmp: Path, tag: str) -> dict:
    res = tmp / f"flower-{tag}.json"
    cmd = [python, str(Path(__file__).resolve()), "--flower-child", str(rounds), "--result", str(res)]
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0")
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env)
    wall = time.perf_counter() - t
    if p.returncode != 0 or not res.exists():
        raise RuntimeError(f"Flower failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    inner = json.loads(res.read_text())
    if not inner.get("echo_ok"):
        raise RuntimeError("Flower run did not echo the array")
    return {"wall": wall, "inner": inner}


def _version(python: str, code: str) -> str:
    try:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"? ({type(e).__name__})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, nargs=2, default=[5, 100], metavar=("R_LO", "R_HI"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flower-python", default=str(REPO / ".venv" / "flower-env" / "bin" / "python"))
    ap.add_argument("--flower-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/peer_flower.md")
    ap.add_argument("--ray-alone", action="store_true",
                    help="also time the floor: Ray started as raymvc does with as many empty actors (raymvc.bench.floor)")
    args = ap.parse_args()
    if args.flower_child is not None:
        flower_child(args.flower_child, args.result)
        return
    from raymvc.bench.machine import cpu_model  # here: Flower's own venv, which runs the child, has no raymvc
    fpy = args.flower_python if Path(args.flower_python).exists() else sys.executable
    lo, hi = args.rounds
    runs: dict[tuple[str, int], list[dict]] = {}
    floor: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(args.repeats):
            for r in (lo, hi):
                for system in ("raymvc", "flower"):  # alternate the two systems
                    tag = f"{r}-{rep}"
                    res = run_raymvc(r, tmp, tag) if system == "raymvc" else run_flower(fpy, r, tmp, tag)
                    runs.setdefault((system, r), []).append(res)
                    print(f"  {system:7s} R={r:4d} rep {rep}: {res['wall']:.2f} s", file=sys.stderr, flush=True)
            if args.ray_alone:
                from raymvc.bench.floor import ray_alone

                floor.append(ray_alone(N_CLIENTS + 1, math.ceil(N_CLIENTS * 0.5 + 0.5), 0.5, 0.5)["process_s"])
                print(f"  Ray alone, {N_CLIENTS + 1} empty actors, rep {rep}: {floor[-1]:.2f} s", file=sys.stderr,
                      flush=True)

    med = {k: statistics.median(x["wall"] for x in v) for k, v in runs.items()}
    derived = {}
    for system in ("raymvc", "flower"):
        per = (med[(system, hi)] - med[(system, lo)]) / (hi - lo)
        derived[system] = {"per_round": per, "startup": med[(system, lo)] - lo * per}
    r_per = derived["raymvc"]["per_round"] / derived["flower"]["per_round"]
    r_start = derived["raymvc"]["startup"] / derived["flower"]["startup"]

    def tmed(r: int, key: str) -> float:
        return statistics.median(x["timing"][key] for x in runs[("raymvc", r)])

    def fmed(r: int, key: str) -> float:
        return statistics.median(x["inner"][key] for x in runs[("flower", r)])

    valid = all(v["per_round"] > 0 for v in derived.values())
    verdict = ("yes" if r_per <= 0.1 else "no") if valid else "n/a: a per-round time came out <= 0 (noise; more repeats)"
    f_per = (fmed(hi, "rounds_s") - fmed(lo, "rounds_s")) / (hi - lo)
    r_inner = (tmed(hi, "protocol_s") / hi) / f_per
    # start-up from every run (both R), each less R x that system's own per-round time: twice the samples
    own_per = {"raymvc": tmed(hi, "protocol_s") / hi, "flower": f_per}
    own_start = {sy: statistics.median(x["wall"] - r * own_per[sy] for r in (lo, hi) for x in runs[(sy, r)])
                 for sy in ("raymvc", "flower")}
    r_own_start = own_start["raymvc"] / own_start["flower"]
    cmd = "python " + " ".join([os.path.relpath(__file__, REPO), *sys.argv[1:]])
    lines = [
        "# raymvc vs Flower: trivial FedAvg (6 clients, 16 KB float64 array each way)",
        "",
        f"- command: `{cmd}`",
        f"- machine: {os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}; "
        "shared with other work, so read ratios, not absolute seconds",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- raymvc: Ray {_version(sys.executable, 'import ray; print(ray.__version__)')}; "
        f"Flower: flwr {_version(fpy, 'import flwr; print(flwr.__version__)')} with Ray "
        f"{_version(fpy, 'import ray; print(ray.__version__)')} (its pinned Ray, own venv)",
        f"- each measurement is a fresh process; {args.repeats} repeats per cell, systems alternating; medians",
        "",
        "| system | T(R=%d) s | T(R=%d) s | start-up s | per-round ms |" % (lo, hi),
        "|---|---|---|---|---|",
    ]
    for system in ("raymvc", "flower"):
        dd = derived[system]
        lines.append(f"| {system} | {med[(system, lo)]:.2f} | {med[(system, hi)]:.2f} | {dd['startup']:.2f} "
                     f"| {dd['per_round'] * 1e3:.2f} |")
    lines += [
        "",
        f"start-up = T(R={lo}) - {lo} x per-round; per-round = (T(R={hi}) - T(R={lo})) / {hi - lo}.",
        "",
        "| ratio raymvc / Flower | measured | issue target | met |",
        "|---|---|---|---|",
        f"| per-round | {r_per:.3f} | <= 0.1 | {verdict} |",
        f"| start-up | {r_start:.3f} | <= 0.5 | {'yes' if r_start <= 0.5 else 'no'} |",
        "",
        "The same per-round ratio from each system's own round timer (less noisy than differences of "
        "whole-process times): raymvc `protocol_s` / R at R = %d is %.2f ms; Flower's "
        "(`strategy.start`(R=%d) - `strategy.start`(R=%d)) / %d is %.2f ms; ratio %.3f (target <= 0.1: %s)."
        % (hi, tmed(hi, "protocol_s") / hi * 1e3, hi, lo, hi - lo, f_per * 1e3, r_inner,
           "yes" if r_inner <= 0.1 else "no"),
        "",
        "Start-up the same way: each run's wall time less R x that system's own per-round time, median "
        "over all %d runs of each system: raymvc %.2f s, Flower %.2f s; ratio %.3f (target <= 0.5: %s)."
        % (2 * args.repeats, own_start["raymvc"], own_start["flower"], r_own_start,
           "yes" if r_own_start <= 0.5 else "no"),
        "",
        *([] if not floor else [
            "The floor: Ray alone, started as raymvc starts it, with %d empty actors (the same CPU requests), "
            "one call each, stopped as raymvc stops it (`raymvc.bench.floor`), a whole process: median %.2f s "
            "(%s) = %.3f of Flower's start-up (%.2f s); raymvc's start-up is %.2f s above it."
            % (N_CLIENTS + 1, statistics.median(floor), ", ".join(f"{x:.2f}" for x in floor),
               statistics.median(floor) / own_start["flower"], own_start["flower"],
               own_start["raymvc"] - statistics.median(floor)),
            ""]),
        "raymvc's own `timing` (summary.json, medians):",
        "",
        "| R | ray_init_s | startup_s (actors up + key agreement) | protocol_s | protocol ms per round "
        "| total wall s |",
        "|---|---|---|---|---|---|",
    ]
    for r in (lo, hi):
        lines.append(f"| {r} | {tmed(r, 'ray_init_s'):.2f} | {tmed(r, 'startup_s'):.2f} | {tmed(r, 'protocol_s'):.3f} "
                     f"| {tmed(r, 'protocol_s') / r * 1e3:.2f} | {med[('raymvc', r)]:.2f} |")
    lines += [
        "",
        "Flower's own view (inside the child process, medians): `strategy.start` time for all rounds.",
        "",
        "| R | import s | strategy.start s | ms per round | total wall s |",
        "|---|---|---|---|---|",
    ]
    for r in (lo, hi):
        lines.append(f"| {r} | {fmed(r, 'import_s'):.2f} | {fmed(r, 'rounds_s'):.2f} "
                     f"| {fmed(r, 'rounds_s') / r * 1e3:.1f} | {med[('flower', r)]:.2f} |")
    lines += ["", "All runs (total wall s):", ""]
    for (system, r), v in sorted(runs.items()):
        lines.append(f"- {system} R={r}: " + ", ".join(f"{x['wall']:.2f}" for x in v))
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        OUT_MD.write_text(text)


if __name__ == "__main__":
    main()
