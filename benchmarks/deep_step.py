"""Where a FedDMVC run on HW spends its time: one training step, measured, against its arithmetic.

    python benchmarks/deep_step.py              # 1 thread, the shipped scenario's budget
    python benchmarks/deep_step.py --budget paper --md /tmp/paper.md   # the method's defaults (the authors')
    python benchmarks/deep_step.py --threads 2
    python benchmarks/deep_step.py --runs      # + where whole FedDMVC and FCUIF runs spend their time

For each HW view (as a client holds it: 2,000 rows, min-max scaled) the script builds
FedDMVC's autoencoder at a budget: ``shipped`` is ``scenarios/hw-feddmvc.yaml``'s (``hidden``
256-256-1024, 30 + 3 x 10 epochs, batch 128), ``paper`` the method's defaults (the authors':
500-500-2000, 500 + 3 x 300 epochs, batch 256); it
times training steps of ``batch_size`` rows (forward, loss, backward, Adam step; with
and without the KL term), counts the multiply-adds of the step's matrix products and
gives the achieved GFLOP/s. ``steps x time per step`` over the run's epochs is the
training time a run cannot go below at these settings on this CPU; the rest of a run
(k-means, messages, start-up) is compared with it. It also times the same step with
deterministic algorithms off, and the step's Python (the same loop on a batch of 2 rows).

With ``--runs`` it also profiles one whole in-process run (seed 0, 1 thread) of
``hw-feddmvc-partial.yaml`` and ``hw-fcuif-missing.yaml`` with :mod:`cProfile` and splits
its time: the clients' training (of it: the forward pass's matrix products, the backward
pass, Adam's update), the server's step, and everything else (data, k-means on the
clients, messages, results).

Output: stdout and ``benchmarks/deep_step.md``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from protocols._torch import torch_mode  # noqa: E402
from protocols.feddmvc import AutoEncoder, Config  # noqa: E402
from raymvc.bench.machine import cpu_model  # noqa: E402
from raymvc.data import load_dataset  # noqa: E402
from raymvc.scenario import load_scenario  # noqa: E402

OUT_MD = REPO / "benchmarks" / "deep_step.md"


def step_time(x: torch.Tensor, cfg: Config, k: int, batch: int, kl: bool, deterministic: bool,
              repeats: int, fused: bool = False) -> float:
    torch.manual_seed(0)
    model = AutoEncoder(x.shape[1], tuple(cfg.hidden), cfg.latent_dim, k)
    opt = torch.optim.Adam(list(model.parameters()), lr=cfg.lr, **({"fused": True} if fused else {}))
    P = torch.full((len(x), k), 1.0 / k)
    g = torch.Generator().manual_seed(0)

    def one() -> None:
        b = torch.randint(0, len(x), (batch,), generator=g)
        xb = x[b]
        z, xr = model(xb)
        loss = ((xr - xb) ** 2).mean()
        if kl:
            q = model.soft_assign(z)
            pb = P[b]
            loss = loss + cfg.gamma * (pb * (torch.log(pb) - torch.log(q.clamp_min(1e-12)))).sum(1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss.detach())

    with torch_mode(deterministic):
        for _ in range(5):
            one()
        t = time.perf_counter()
        for _ in range(repeats):
            one()
        return (time.perf_counter() - t) / repeats


def flops(n_in: int, cfg: Config, batch: int) -> float:
    dims = [n_in, *cfg.hidden, cfg.latent_dim]
    macs = sum(a * b for a, b in zip(dims[:-1], dims[1:])) * 2  # encoder and its mirror
    return 2 * macs * batch * 3  # forward, and backward (about twice the forward)


RUNS = ("hw-feddmvc-partial.yaml", "hw-fcuif-missing.yaml")


def profile_run(scenario: Path) -> dict[str, float]:
    """Seconds of one in-process run, split by where cProfile saw them spent."""
    import cProfile
    import pstats
    import tempfile

    import raymvc

    with tempfile.TemporaryDirectory(prefix="deep-run-") as tmp:
        prof = cProfile.Profile()
        prof.enable()
        raymvc.run(scenario, overrides=["runtime.backend=local", "runtime.threads=1"], out=Path(tmp) / "run",
                   progress=False)
        prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own s, cumulative s, callers)

    def cum(file_end: str, name: str) -> float:
        return sum(v[3] for (f, _, n), v in stats.items() if f.endswith(file_end) and n == name)

    def own(name: str) -> float:
        return sum(v[2] for (_, _, n), v in stats.items() if n == name)

    total = cum("raymvc/api.py", "run")
    train = cum("protocols/feddmvc.py", "_train")
    server = cum("protocols/feddmvc.py", "global_step")
    return {"total": total, "train": train, "linear": own("<built-in method torch._C._nn.linear>"),
            "backward": own("<method 'run_backward' of 'torch._C._EngineBase' objects>"),
            "adam": cum("torch/optim/adam.py", "_single_tensor_adam"), "server": server,
            "other": total - train - server}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--md", type=Path, default=OUT_MD)
    ap.add_argument("--runs", action="store_true", help="also profile whole FedDMVC and FCUIF runs")
    ap.add_argument("--budget", choices=("shipped", "paper"), default="shipped",
                    help="shipped: scenarios/hw-feddmvc.yaml's params; paper: the method's defaults")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = Config() if args.budget == "paper" else Config(**load_scenario(REPO / "scenarios" / "hw-feddmvc.yaml").params)
    ds = load_dataset("handwritten")
    k = ds.n_clusters
    n = ds.n_samples
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    epochs = cfg.pretrain_epochs + cfg.rounds * cfg.finetune_epochs
    lines = ["# FedDMVC on HW: one training step against its arithmetic", "",
             f"- command: `python benchmarks/deep_step.py --threads {args.threads} --budget {args.budget}"
             f"{' --runs' if args.runs else ''}`",
             f"- machine: {os.cpu_count()} cores ({cpu_model()}), torch {torch.__version__}, "
             f"{args.threads} thread(s), {args.repeats} steps timed after 5 warm-up steps",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- FedDMVC, {args.budget} budget: hidden {tuple(cfg.hidden)}, latent {cfg.latent_dim}, batch {cfg.batch_size}, "
             f"{cfg.pretrain_epochs} + {cfg.rounds} x {cfg.finetune_epochs} epochs = {epochs} epochs of "
             f"{steps_per_epoch} steps per client", "",
             "| view | D | ms per step (L_r) | ms per step (L_r + KL) | same, deterministic off | "
             "same, fused Adam | ms per step, 2 rows | GFLOP per step | GFLOP/s | training s per client |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    total = 0.0
    for v, X in enumerate(ds.views):
        X = np.asarray(X, dtype=np.float64)
        lo, span = X.min(0), X.max(0) - X.min(0)
        x = torch.from_numpy(((X - lo) / np.where(span > 0, span, 1.0)).astype(np.float32))
        rec = step_time(x, cfg, k, cfg.batch_size, False, True, args.repeats)
        both = step_time(x, cfg, k, cfg.batch_size, True, True, args.repeats)
        nondet = step_time(x, cfg, k, cfg.batch_size, True, False, args.repeats)
        fused = step_time(x, cfg, k, cfg.batch_size, True, True, args.repeats, fused=True)
        tiny = step_time(x, cfg, k, 2, True, True, args.repeats)
        f = flops(x.shape[1], cfg, cfg.batch_size) / 1e9
        per_client = steps_per_epoch * (cfg.pretrain_epochs * rec + cfg.rounds * cfg.finetune_epochs * both)
        total += per_client
        lines.append(f"| {v} | {x.shape[1]} | {rec * 1e3:.2f} | {both * 1e3:.2f} | {nondet * 1e3:.2f} | "
                     f"{fused * 1e3:.2f} | {tiny * 1e3:.2f} | {f:.3f} | {f / both:.1f} | {per_client:.1f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"Training alone, all {len(ds.views)} clients: {total:.1f} s of one core at {args.threads} "
              f"thread(s) ({total / 2:.1f} s of wall time on two cores, if the clients shared them perfectly)."]
    if args.runs:
        lines += ["", "## Whole runs, in-process, seed 0, 1 thread (cProfile; its own overhead included)", "",
                  "| scenario | run s | clients' training s | of it: forward products | backward | Adam update | "
                  "server step s | everything else s |", "|---|---|---|---|---|---|---|---|"]
        for name in RUNS:
            r = profile_run(REPO / "scenarios" / name)
            pct = {k: 100 * r[k] / r["total"] for k in r}
            lines.append(f"| {name} | {r['total']:.1f} | {r['train']:.1f} ({pct['train']:.0f}%) | "
                         f"{r['linear']:.1f} ({pct['linear']:.0f}%) | {r['backward']:.1f} ({pct['backward']:.0f}%) | "
                         f"{r['adam']:.1f} ({pct['adam']:.0f}%) | {r['server']:.1f} ({pct['server']:.0f}%) | "
                         f"{r['other']:.1f} ({pct['other']:.0f}%) |")
            print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    args.md.write_text(text)


if __name__ == "__main__":
    main()
