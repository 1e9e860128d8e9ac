"""The numerical kernels under the deep methods, one by one: which give other bits on another CPU.

``benchmarks/cross_cpu.py`` tells whether a whole cell gives the same labels on an Intel and an
AMD machine; when it does not, this script says which kernel moved. Each operation below runs
on fixed inputs (drawn from one seed) in a fresh process with pinned arithmetic
(``raymvc.arithmetic``, one thread), and the SHA-256 of its output's bytes is appended to
``benchmarks/cross_cpu_ops.jsonl`` with the CPU's model; ``benchmarks/cross_cpu_ops.md`` is then
rewritten from every line: per operation, the hash each kind of CPU gave and whether they agree.

    python benchmarks/cross_cpu_ops.py            # run every operation here, append, rewrite the page
    python benchmarks/cross_cpu_ops.py --knobs    # also: which operations each switch moves here
    python benchmarks/cross_cpu_ops.py --render   # rewrite the page from the file alone

``--knobs`` reruns the probe once unchanged (an operation that moves from run to run would
read as moved by every switch: refused) and once per alternative value of one switch, set
after raymvc pins and before numpy or torch loads, and records which operations moved: it shows that
each pinned switch governs the operations it is meant to on this CPU, and which switch an
operation that differs between CPUs answers to.

The operations are those the deep methods' training and clustering steps consist of: torch's
linear layers (MKL's sgemm), convolutions and their gradients (oneDNN), batch norm, softmax,
element-wise maths and reductions (ATen), an Adam step and a few steps of a small autoencoder
(everything together); numpy's and scipy's BLAS and LAPACK (OpenBLAS), numpy's ufuncs,
scikit-learn's k-means; and the products raymvc's torch methods compute with under pinned
arithmetic (OpenBLAS, ``protocols/_torch.py``), CCFC's encoder and its augmentation grid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSONL = ROOT / "benchmarks" / "cross_cpu_ops.jsonl"
MD = ROOT / "benchmarks" / "cross_cpu_ops.md"

# Run in a fresh interpreter: raymvc first (it pins the libraries before numpy or torch loads).
PROBE = r'''
import hashlib, json, os
import raymvc
knob = os.environ.get("RAYMVC_PROBE_KNOB")  # --knobs: one switch moved after the pin, before any library loads
if knob:
    var, _, value = knob.partition("=")
    os.environ[var] = value
    if var == "ONEDNN_MAX_CPU_ISA":
        os.environ["DNNL_MAX_CPU_ISA"] = value
from raymvc import arithmetic
from raymvc.results.provenance import platform_info
import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
rng = np.random.default_rng(0)
out = {}


def h(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().numpy()
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]


def t(*shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


x, w, b = t(512, 240), t(500, 240), t(500)
out["torch linear 512x240 -> 500 (sgemm)"] = h(F.linear(x, w, b))
x2, w2 = t(1000, 784), t(500, 784)
out["torch linear 1000x784 -> 500 (sgemm)"] = h(F.linear(x2, w2))
img, k1, k2 = t(16, 1, 28, 28), t(32, 1, 3, 3), t(64, 32, 3, 3)
c1 = F.conv2d(img, k1, stride=2, padding=1)
out["torch conv2d 1 -> 32 channels (oneDNN)"] = h(c1)
out["torch conv2d 32 -> 64 channels (oneDNN)"] = h(F.conv2d(c1, k2, stride=2, padding=1))
k2g = k2.clone().requires_grad_(True)
F.conv2d(c1, k2g, stride=2, padding=1).square().sum().backward()
out["torch conv2d weight gradient"] = h(k2g.grad)
out["torch batch_norm (training)"] = h(F.batch_norm(c1, None, None, training=True))
logits = t(512, 10)
out["torch softmax, log_softmax"] = h(torch.cat([F.softmax(logits, 1), F.log_softmax(logits, 1)]))
v = t(100000)
out["torch exp, log, tanh, sigmoid"] = h(torch.stack([v.exp(), v.abs().add(1).log(), v.tanh(), v.sigmoid()]))
m = t(512, 500)
out["torch sum, mean, var reductions"] = h(torch.cat([v.sum().reshape(1), m.sum(0), m.mean(1), m.var(0)]))
out["torch cdist 512x10 to 10x10"] = h(torch.cdist(t(512, 10), t(10, 10)))
odd = t(333, 77)
out["torch matmul 333x77 @ 77x129, a strided slice (sgemm)"] = h(odd[1:, 3:] @ t(74, 129))
g = t(64, 64)
spd = g @ g.T + 64 * torch.eye(64)
out["torch linalg solve, eigh (MKL LAPACK)"] = h(torch.cat([torch.linalg.solve(spd, t(64, 8)).ravel(),
                                                          torch.linalg.eigvalsh(spd)]))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(240, 500), torch.nn.ReLU(), torch.nn.Linear(500, 10),
                          torch.nn.Linear(10, 500), torch.nn.ReLU(), torch.nn.Linear(500, 240))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for step in range(20):
    opt.zero_grad()
    loss = F.mse_loss(net(x), x)
    loss.backward()
    opt.step()
    if step == 0:
        out["torch Adam, one step of an autoencoder"] = h(torch.cat([p.detach().ravel() for p in net.parameters()]))
out["torch autoencoder, 20 Adam steps"] = h(torch.cat([p.detach().ravel() for p in net.parameters()]))
a, bm = rng.standard_normal((1000, 240)), rng.standard_normal((240, 500))
out["numpy matmul float64 (dgemm)"] = h(a @ bm)
out["numpy matmul float32 (sgemm)"] = h(a.astype(np.float32) @ bm.astype(np.float32))
u = rng.standard_normal(100000)
out["numpy exp, log, tanh"] = h(np.stack([np.exp(u), np.log1p(np.abs(u)), np.tanh(u)]))
gram = a.T @ a + 0.5 * np.eye(240)
out["numpy linalg solve (LAPACK)"] = h(np.linalg.solve(gram, rng.standard_normal((240, 10))))
out["numpy sum, mean over 1e6"] = h(np.array([rng.standard_normal(1000000).sum(), a.mean()]))
import scipy.linalg
s = rng.standard_normal((300, 200))
out["scipy svd 300x200 (LAPACK)"] = h(scipy.linalg.svd(s, compute_uv=False))
out["scipy eigh 200x200 (LAPACK)"] = h(scipy.linalg.eigh(s.T @ s, eigvals_only=True))
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits
with threadpool_limits(1):
    km = KMeans(10, n_init=1, random_state=0).fit(rng.standard_normal((2000, 76)))
out["scikit-learn KMeans 2000x76, k = 10"] = h(np.concatenate([km.cluster_centers_.ravel(), km.labels_]))
# the products raymvc's torch methods compute with (OpenBLAS under pinned arithmetic), on inputs of their own
from raymvc.protocols import _torch as rt
from raymvc.protocols import ccfc
rng = np.random.default_rng(1)
out["raymvc sqdist 512x10 to 10x10 (OpenBLAS)"] = h(rt.sqdist(t(512, 10), t(10, 10)))
torch.manual_seed(0)
net = torch.nn.Sequential(rt.Linear(240, 500), torch.nn.ReLU(), rt.Linear(500, 10),
                          rt.Linear(10, 500), torch.nn.ReLU(), rt.Linear(500, 240))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
x = t(512, 240)
for step in range(20):
    opt.zero_grad()
    F.mse_loss(net(x), x).backward()
    opt.step()
out["raymvc autoencoder, 20 Adam steps (OpenBLAS products)"] = h(torch.cat([p.detach().ravel() for p in net.parameters()]))
torch.manual_seed(0)
enc = ccfc.Encoder(ccfc.Config(), (28, 28))
opt = torch.optim.Adam(enc.parameters(), lr=1e-3)
imgs = t(64, 1, 28, 28)
for step in range(3):
    opt.zero_grad()
    enc(imgs).square().mean().backward()
    opt.step()
out["raymvc CCFC encoder on 28x28, 3 Adam steps (oneDNN convs)"] = h(torch.cat([p.detach().ravel() for p in enc.parameters()]))
out["raymvc affine grid 64x28x28 (element-wise)"] = h(rt.affine_grid(t(64, 2, 3), 28, 28))
print(json.dumps({"ops": out, "arithmetic": arithmetic.describe(), "platform": platform_info()}))
'''


# one switch at a time, away from its pinned value
KNOBS = (("MKL_CBWR", "AUTO"), ("MKL_CBWR", "AVX2"), ("MKL_CBWR", "AVX512"), ("ONEDNN_MAX_CPU_ISA", "ALL"),
         ("OPENBLAS_CORETYPE", "SkylakeX"),
         ("OPENBLAS_CORETYPE", "Zen"), ("ATEN_CPU_CAPABILITY", "avx512"), ("NPY_DISABLE_CPU_FEATURES", ""))


def probe(env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the probe failed: {done.stderr.strip().splitlines()[-1:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {"cpu": got["platform"].get("cpu") or "?", "date": time.strftime("%Y-%m-%d", time.gmtime()), **got}


def knobs(pinned_ops: dict) -> dict[str, list[str]]:
    """For each alternative setting of one switch: the operations whose bits it moves here."""
    from raymvc.arithmetic import cpu_flags

    if probe()["ops"] != pinned_ops:
        raise SystemExit("a second pinned probe gave other bits: an operation moves from run to run, --knobs cannot tell")
    moved = {}
    for var, alt in KNOBS:  # raymvc pins, then the probe moves the one switch before numpy or torch loads
        if alt.lower() in ("avx512", "skylakex") and "avx512f" not in (cpu_flags() or ()):
            continue  # kernels this CPU cannot run
        got = probe({**os.environ, "RAYMVC_PROBE_KNOB": f"{var}={alt}"})["ops"]
        moved[f"{var}={alt}"] = [op for op in got if got[op] != pinned_ops.get(op)]
    return moved


def kind(cpu: str) -> str:
    from raymvc.results.provenance import cpu_kind

    return cpu_kind(cpu) or cpu


def _libs(platform: dict) -> str:
    return ", ".join(f"{k} {platform[k]}" for k in ("numpy", "scipy", "scikit-learn", "torch") if k in platform)


def render() -> str:
    rows = [json.loads(line) for line in JSONL.read_text().splitlines() if line.strip()] if JSONL.is_file() else []
    pinned = [r for r in rows if r["arithmetic"].get("pinned")]
    kinds = sorted({kind(r["cpu"]) for r in pinned})
    per: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for r in pinned:
        for op, digest in r["ops"].items():
            per[op][kind(r["cpu"])].add(digest)
    lines = ["# Which kernel gives other bits on another CPU", "",
             "Written by `python benchmarks/cross_cpu_ops.py` from `benchmarks/cross_cpu_ops.jsonl` (one line per "
             "probe, pinned arithmetic, one thread). Each operation runs on the same inputs everywhere; a cell "
             "whose labels differ between CPUs (`benchmarks/cross_cpu.md`) differs in at least one of these.", "",
             "Probes: " + "; ".join(f"{r['cpu']}, {r['date']}, {_libs(r['platform'])}" for r in pinned) + ".", "",
             "| operation | " + " | ".join(kinds) + " | verdict |", "|---|" + "---|" * len(kinds) + "---|"]
    for op, by_kind in per.items():
        hashes = {d for ds in by_kind.values() for d in ds}
        cells = [", ".join(sorted(by_kind.get(k, ()))) or "-" for k in kinds]
        verdict = ("one CPU kind so far" if len(by_kind) < 2 else "same" if len(hashes) == 1
                   else "**differs**")
        if any(len(ds) > 1 for ds in by_kind.values()):
            verdict += "; moves between probes on one CPU kind"
        lines.append(f"| {op} | " + " | ".join(cells) + f" | {verdict} |")
    for r in [r for r in pinned if r.get("knobs")][-2:]:
        lines += ["", f"What each switch governs on {r['cpu']} ({r['date']}): the operations whose bits move when "
                  "that one switch leaves its pinned value (`--knobs`).", "", "| setting | operations it moves |",
                  "|---|---|"]
        lines += [f"| `{k}` | {', '.join(v) or 'none'} |" for k, v in r["knobs"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", action="store_true", help="only rewrite the page from the jsonl file")
    ap.add_argument("--knobs", action="store_true", help="also record which operations each switch moves here")
    args = ap.parse_args(argv)
    if not args.render:
        r = probe()
        if not r["arithmetic"].get("pinned"):
            raise SystemExit("the probe did not run pinned (RAYMVC_ARITHMETIC?): nothing recorded")
        if args.knobs:
            r["knobs"] = knobs(r["ops"])
        with JSONL.open("a") as f:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    MD.write_text(render())
    print(MD.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
