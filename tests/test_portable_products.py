"""The products of the torch methods (``protocols/_torch.py``: ``mm``, ``Linear``, ``sqdist``).

MKL's pinned branch gives other bits on an Intel and an AMD CPU for some product shapes
(benchmarks/cross_cpu_ops.md), so under pinned arithmetic the torch methods take their
products from OpenBLAS. Another CPU vendor cannot be had in a test; another MKL branch can:
it is what an MKL on the other vendor takes. The products must not move with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from raymvc import arithmetic
from raymvc.protocols import _torch as rt

# after raymvc pins, MKL is sent to another branch before torch loads (what an MKL does on another CPU)
MOVED_MKL = """
import hashlib, json, os, sys
import raymvc
os.environ["MKL_CBWR"] = sys.argv[1]
import numpy as np, torch
import torch.nn.functional as F
from raymvc.protocols import _torch as rt
torch.set_num_threads(1)


def digest(which):
    torch.manual_seed(0)
    lin = rt.Linear if which == "raymvc" else torch.nn.Linear
    net = torch.nn.Sequential(lin(64, 120), torch.nn.ReLU(), lin(120, 10), lin(10, 120), torch.nn.ReLU(), lin(120, 64))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32))
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(net(x), x).backward()
        opt.step()
    z = net[:3](x).detach()
    d = rt.sqdist(z, z[:7]) if which == "raymvc" else torch.cdist(z, z[:7]).square()
    parts = [p.detach().numpy().tobytes() for p in net.parameters()] + [d.numpy().tobytes()]
    return hashlib.sha256(b"".join(parts)).hexdigest()


print(json.dumps({"raymvc": digest("raymvc"), "torch": digest("torch")}))
"""


def _moved(branch: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (*arithmetic.PINNED, *arithmetic.CLEARED, arithmetic.MODE_VAR)}
    done = subprocess.run([sys.executable, "-c", MOVED_MKL, branch], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_another_mkl_branch_moves_torchs_products_but_not_the_methods(tmp_path):
    pinned, other = _moved("COMPATIBLE", tmp_path), _moved("AVX2", tmp_path)
    if pinned["torch"] == other["torch"]:
        pytest.skip("MKL's AVX2 branch gives the COMPATIBLE bits on this CPU: nothing to compare")
    assert pinned["raymvc"] == other["raymvc"]


def test_the_products_match_torchs_and_their_gradients_are_right():
    assert arithmetic.mode() == "pinned"
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(37, 12, generator=g), torch.randn(12, 9, generator=g)
    assert torch.allclose(rt.mm(a, b), a @ b, atol=1e-5)
    assert torch.allclose(rt.mm(a, b), torch.from_numpy(a.numpy() @ b.numpy()), atol=0, rtol=0)  # OpenBLAS's bits
    assert torch.allclose(rt.sqdist(a, b.T), torch.cdist(a, b.T).square(), atol=1e-4)
    assert float(rt.sqdist(a, a).diagonal().min()) >= 0.0
    lin = rt.Linear(12, 5)
    x = torch.randn(2, 4, 12, generator=g)
    assert torch.allclose(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), atol=1e-5)
    a64 = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=True)
    b64 = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(rt.mm, (a64, b64))
    c64 = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(rt.sqdist, (a64, c64))
    with pytest.raises(ValueError, match="two matrices"):
        rt.mm(a[None], b)


def test_the_products_leave_a_linear_layers_state_and_initialisation_as_torchs():
    ours = rt.seeded(lambda: rt.Linear(8, 3), 5)
    theirs = rt.seeded(lambda: torch.nn.Linear(8, 3), 5)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(torch.equal(p, q) for p, q in zip(ours.state_dict().values(), theirs.state_dict().values()))
    assert isinstance(ours, torch.nn.Linear)


def test_native_mode_uses_torchs_own_product(monkeypatch):
    monkeypatch.setattr(arithmetic, "mode", lambda: "native")
    calls = []
    monkeypatch.setattr(rt, "_np_mm", lambda a, b: calls.append(1) or a @ b)
    a, b = torch.ones(3, 2), torch.ones(2, 4)
    assert torch.equal(rt.mm(a, b), a @ b) and calls == []
    monkeypatch.setattr(arithmetic, "mode", lambda: "pinned")
    rt.mm(a, b)
    assert calls == [1]
    assert np.array_equal(rt.linear(torch.ones(2, 2), torch.eye(2)).numpy(), np.ones((2, 2)))


NO_MKL = """
import raymvc
import numpy as np, torch
from raymvc.protocols import ccfc, feddmvc, fcuif
from raymvc.protocols import _torch as rt
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
cfg = ccfc.Config(rotate_deg=10, crop_scale=0.7, scale=0.1)
model, glob = ccfc.build_model(cfg, 0, (28, 28)), ccfc.build_model(cfg, 1, (28, 28))
x = torch.rand(16, 1, 28, 28, generator=g)
y = torch.randint(0, 3, (16,), generator=g)
loss = ccfc.ccfc_loss(model, glob, x, y, cfg, g)
loss = loss[0] if isinstance(loss, tuple) else loss
loss.backward()
z = ccfc.embed(model, x[:1]), ccfc.embed(model, torch.rand(5, 1, 28, 28, generator=g), chunk=4)
ccfc.assign(z[1], np.ones((3, z[1].shape[1])))
ae = feddmvc.AutoEncoder(30, (20, 20), 5, 3)
zz, rec = ae(torch.rand(8, 30, generator=g))
(rec.square().mean() + ae.soft_assign(zz).sum()).backward()
A, B = torch.rand(6, 4, generator=g, requires_grad=True), torch.rand(6, 4, generator=g)
fcuif.alignment_loss(A, B, torch.randperm(6, generator=g), 0.1).backward()
print("done")
"""


def test_the_torch_methods_call_no_mkl_product_under_pinned_arithmetic(tmp_path):
    """MKL says each product it computes (MKL_VERBOSE): a training step of each torch method's
    model and loss (CCFC with rotation, zoom and crops on 28 x 28 images, embedding one image
    and uneven chunks; FedDMVC's autoencoder and Student-t kernel; FCUIF's alignment loss)
    asks MKL for none."""
    env = {k: v for k, v in os.environ.items() if k not in (*arithmetic.PINNED, *arithmetic.CLEARED, arithmetic.MODE_VAR)}
    done = subprocess.run([sys.executable, "-c", NO_MKL], env={**env, "MKL_VERBOSE": "1"}, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-2000:]
    calls = [line for line in done.stdout.splitlines() if line.startswith("MKL_VERBOSE") and "GEMM" in line]
    assert calls == []


def test_the_affine_grid_is_torchs():
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(4, 2, 3, generator=g)
    for h, w in ((28, 28), (7, 9)):
        want = torch.nn.functional.affine_grid(theta, [4, 1, h, w], align_corners=False)
        assert torch.allclose(rt.affine_grid(theta, h, w), want, atol=1e-6)
