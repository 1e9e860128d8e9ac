"""Torch plumbing shared by the torch methods (CCFC, FedDMVC).

* model weights <-> message fields: a state dict travels as ``"w.<name>"`` arrays
  (floats as float32, integer buffers as int64), read back with a strict name/shape check;
* FedAvg of such arrays, weighted by sample counts;
* seeded model construction that leaves torch's global generator untouched;
* a context manager that switches deterministic algorithms on for one call;
* random mini-batches from a ``torch.Generator``;
* matrix products that give the same bits on every x86-64 CPU under pinned arithmetic
  (:func:`mm`, :class:`Linear`, :func:`sqdist`, :func:`affine_grid`).

Only protocol modules import this (the engine never imports torch).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from raymvc.messages import Message

W_PREFIX = "w."

M = TypeVar("M", bound=nn.Module)


def seeded(factory: Callable[[], M], seed: int) -> M:
    """``factory()`` with torch seeded by ``seed``; the global torch RNG state is restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return factory()


def generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by ``seed`` (shuffling, noise)."""
    return torch.Generator().manual_seed(int(seed))


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` (an error where there is none) or ``auto``.

    ``auto`` is CUDA where torch sees a device, except in a Ray actor that Ray gave no
    GPU (``runtime.client_gpus`` / ``runtime.server_gpus`` of 0): it trains on the CPU
    there, so actors share a GPU only as the scenario reserved it. Models are built and
    seeded on the CPU and then moved, shuffling and augmentation draw from CPU
    generators, so a run's randomness does not depend on the device; the arithmetic does
    (CUDA kernels round differently), so labels can differ between devices.
    """
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        given = ray_gpu_ids()
        return torch.device("cuda" if given is None or given else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("params.device: cuda was asked for, but torch sees no CUDA device here")
    return torch.device(name)


def ray_gpu_ids() -> list | None:
    """The GPU ids Ray gave the actor this code runs in; ``None`` outside a Ray actor."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        if ray.get_runtime_context().get_actor_id() is None:
            return None  # the driver (in-process backend) or a plain task
        return list(ray.get_gpu_ids())
    except Exception:  # an older Ray or a context without a worker: treat as outside Ray
        return None


@contextlib.contextmanager
def torch_mode(deterministic: bool) -> Iterator[None]:
    """Deterministic algorithms on during a call, the previous setting restored after."""
    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)


def batches(n: int, batch_size: int, g: torch.Generator, min_size: int = 2) -> list[torch.Tensor]:
    """A random split of ``0..n-1`` into ``ceil(n / batch_size)`` nearly equal batches.

    Batches shorter than ``min_size`` are dropped (only possible when ``n`` is tiny).
    """
    nb = max(1, math.ceil(n / batch_size))
    return [b for b in torch.randperm(n, generator=g).tensor_split(nb) if len(b) >= min_size]


# ---------------------------------------------------------------------------
# matrix products: the same bits on Intel and AMD CPUs
#
# torch's float32 products run on MKL, whose COMPATIBLE branch (pinned arithmetic) gives
# other bits on an Intel Xeon and an AMD EPYC for some shapes (a 512x12 by 12x10 product, an
# autoencoder's gradients: benchmarks/cross_cpu_ops.md), although MKL documents the branch as
# identical. Under pinned arithmetic the torch methods therefore compute every product of
# their models and losses with OpenBLAS (through numpy), whose kernels are fixed to one core
# type on every CPU (raymvc.arithmetic), forward and backward. In native mode, and on a GPU,
# torch's own product is used.


def _portable(*ts: torch.Tensor) -> bool:
    from raymvc import arithmetic

    return arithmetic.mode() == "pinned" and len({t.dtype for t in ts}) == 1 and all(
        t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) for t in ts)


def _np_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # numpy passes a transposed view to BLAS as a transpose flag; other strides are copied
    return torch.from_numpy(np.matmul(a.detach().resolve_neg().numpy(), b.detach().resolve_neg().numpy()))


class _OpenBLASMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return _np_mm(a, b)

    @staticmethod
    @torch.autograd.function.once_differentiable  # no second derivatives (nothing here takes them)
    def backward(ctx, g: torch.Tensor):
        a, b = ctx.saved_tensors
        ga = _np_mm(g, b.mT) if ctx.needs_input_grad[0] else None
        gb = _np_mm(a.mT, g) if ctx.needs_input_grad[1] else None
        return ga, gb


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D ``a`` (``n x k``) and ``b`` (``k x m``), differentiable in both."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"mm: two matrices expected, got {a.dim()}-D and {b.dim()}-D tensors")
    return _OpenBLASMatmul.apply(a, b) if _portable(a, b) else a @ b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` over the last axis of ``x`` (as ``torch.nn.functional.linear``)."""
    if not _portable(x, weight):
        return torch.nn.functional.linear(x, weight, bias)
    lead = x.shape[:-1]
    out = mm(x.reshape(-1, x.shape[-1]), weight.T)
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


class Linear(nn.Linear):
    """``torch.nn.Linear`` (same parameters, names and initialisation) computing with :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def sqdist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances between the rows of ``a`` and of ``b`` (``n x m``), at least 0
    (``torch.cdist(a, b) ** 2`` in native mode and on a GPU)."""
    if not _portable(a, b):
        return torch.cdist(a, b).pow(2)
    return ((a * a).sum(1, keepdim=True) - 2.0 * mm(a, b.T) + (b * b).sum(1)[None, :]).clamp_min(0.0)


def affine_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``torch.nn.functional.affine_grid(theta, (B, C, height, width), align_corners=False)``
    (``B x height x width x 2``), computed element-wise: torch's own takes a batched product
    from MKL."""
    if not _portable(theta):
        return F.affine_grid(theta, [theta.shape[0], 1, height, width], align_corners=False)
    xs = (torch.arange(width, dtype=theta.dtype) * 2 + 1) / width - 1  # pixel centres in [-1, 1]
    ys = (torch.arange(height, dtype=theta.dtype) * 2 + 1) / height - 1
    x, y = xs[None, None, :], ys[None, :, None]
    t = theta[:, :, :, None, None]  # B x 2 x 3 x 1 x 1
    gx = t[:, 0, 0] * x + t[:, 0, 1] * y + t[:, 0, 2]
    gy = t[:, 1, 0] * x + t[:, 1, 1] * y + t[:, 1, 2]
    return torch.stack([gx, gy], dim=-1)


# ---------------------------------------------------------------------------
# weights <-> message fields
def state_to_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """State dict -> ``{"w.<name>": array}``: floats as float32, integer buffers as int64."""
    out = {}
    for name, t in model.state_dict().items():
        a = t.detach().cpu().numpy()
        a = a.astype(np.float32) if a.dtype.kind == "f" else a.astype(np.int64)
        out[W_PREFIX + name] = np.array(a, order="C")  # keeps 0-d shapes
    return out


def arrays_from_message(msg: Message) -> dict[str, np.ndarray]:
    """The ``"w.*"`` arrays of ``msg`` with the prefix removed."""
    return {k[len(W_PREFIX):]: v for k, v in msg.arrays().items() if k.startswith(W_PREFIX)}


def load_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray], who: str = "model") -> None:
    """Copy received arrays into ``model``; names and shapes must match the model exactly."""
    state = model.state_dict()
    if set(arrays) != set(state):
        extra, lacking = sorted(set(arrays) - set(state)), sorted(set(state) - set(arrays))
        raise ValueError(f"{who}: weights do not match the model (unexpected {extra[:3]}, missing {lacking[:3]})")
    new = {}
    for name, ref in state.items():
        a = np.asarray(arrays[name])
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError(f"{who}: weight {name!r} has shape {a.shape}, expected {tuple(ref.shape)}")
        new[name] = torch.from_numpy(np.array(a, copy=True)).to(ref.dtype)
    model.load_state_dict(new)


def fedavg(states: Mapping[int, Mapping[str, np.ndarray]], sizes: Mapping[int, float]) -> dict[str, np.ndarray]:
    """Σ_l (n_l / Σ n) w_l over the given clients (weights renormalised over them).

    Float arrays are averaged in float64 and returned as float32; integer arrays
    (``num_batches_tracked``) are averaged and rounded.
    """
    ids = sorted(states)
    if not ids:
        raise ValueError("fedavg: no client states")
    total = float(sum(float(sizes[c]) for c in ids))
    if total <= 0:
        raise ValueError("fedavg: the clients' sample counts sum to zero")
    weights = {c: float(sizes[c]) / total for c in ids}
    out = {}
    for name in states[ids[0]]:
        ref = np.asarray(states[ids[0]][name])
        acc = np.zeros(ref.shape, dtype=np.float64)
        for c in ids:
            acc += weights[c] * np.asarray(states[c][name], dtype=np.float64)
        # np.asarray: ufuncs turn 0-d arrays into numpy scalars, which would travel as scalars
        out[name] = np.asarray(acc.astype(np.float32) if ref.dtype.kind == "f" else np.rint(acc).astype(ref.dtype))
    return out


def payload_bytes(model: nn.Module) -> int:
    """Bytes of the ``"w.*"`` fields that carry ``model`` (float32 entries x 4 + int64 x 8)."""
    return sum(int(a.nbytes) for a in state_to_arrays(model).values())
