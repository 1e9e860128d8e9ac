"""The fixed-point code of weighted sums: ``round(v x 2^FRAC_BITS)`` in Z_{2^RING_BITS}.

A declared sum (:class:`raymvc.protocol.SecureSum`) is always taken in this code, with
or without secure aggregation: each client's ``w_i x_i`` and ``w_i`` are encoded, the
codes are added modulo ``2^RING_BITS`` (masks cancel exactly there), and the total is
decoded. A run therefore gives the same sums, bit for bit, whether the server adds the
plain codes itself or only ever sees them masked. With 24 fractional bits the mean
``Σ w_i x_i / Σ w_i`` is within ``2^-25 / Σ w_i`` per client of the exact one, below
float32's resolution for the values a model holds; integer counters stay exact.
"""

from __future__ import annotations

import numpy as np

FRAC_BITS = 24
RING_BITS = 64


def ring_dtype(bits: int) -> np.dtype:
    if bits not in (32, 64):
        raise ValueError(f"ring_bits must be 32 or 64, got {bits}")
    return np.dtype(np.uint64 if bits == 64 else np.uint32)


def encode_fixed(v: np.ndarray, frac_bits: int = FRAC_BITS, bits: int = RING_BITS) -> np.ndarray:
    """``round(v * 2^frac_bits)`` as two's complement in Z_{2^bits}."""
    signed = np.int64 if bits == 64 else np.int32
    q = np.rint(np.asarray(v, dtype=np.float64) * float(2**frac_bits))
    lim = float(2 ** (bits - 1))
    if q.size and (q.min() < -lim or q.max() >= lim):
        raise ValueError("value out of the fixed-point range")
    return q.astype(signed).view(ring_dtype(bits))


def decode_fixed(u: np.ndarray, frac_bits: int = FRAC_BITS, bits: int = RING_BITS) -> np.ndarray:
    signed = np.int64 if bits == 64 else np.int32
    return np.asarray(u, dtype=ring_dtype(bits)).view(signed).astype(np.float64) / float(2**frac_bits)


def bound(weight: float, n: int, frac_bits: int = FRAC_BITS, bits: int = RING_BITS) -> float:
    """The largest ``|x|`` a client of weight ``weight`` may add when ``n`` clients do: at it
    the sum of all ``w_i x_i`` codes stays below ``2^(bits-2)``, so it never wraps around."""
    return float(2.0 ** (bits - 2 - frac_bits) / (max(abs(float(weight)), 1.0) * max(int(n), 1)))


def check_ring(weight: float, clip: float, n: int, frac_bits: int = FRAC_BITS, bits: int = RING_BITS) -> None:
    """The one overflow rule of a declared sum, with or without secure aggregation: ``n``
    clients of weight up to ``|weight|`` adding entries up to ``clip`` (at least 1, for the
    weight entry itself) must stay inside the ring; else a ValueError."""
    if not abs(float(weight)) * max(float(clip), 1.0) * 2.0 ** frac_bits * max(int(n), 1) < 2.0 ** (bits - 1):
        raise ValueError(f"weight {float(weight):g} x entries up to {max(float(clip), 1.0):.3g} x 2^{frac_bits} x "
                         f"{n} clients overflows the {bits}-bit ring")


def split(v: np.ndarray, names: list[str], shapes: list[tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The flat ``v`` cut back into the named fields it was concatenated from, in order."""
    out, at = {}, 0
    for name, shape in zip(names, shapes):
        size = int(np.prod(shape)) if shape else 1
        out[name] = v[at:at + size].reshape(shape)
        at += size
    if at != len(v):
        raise ValueError(f"{len(v)} summed entries, the fields hold {at}")
    return out


def check_input(x: np.ndarray, weight: float, n: int) -> tuple[np.ndarray, float]:
    """One client's ``(x, w)`` as float64, if the sum of ``n`` clients can hold it: an entry
    that is not finite or beyond :func:`bound` is a ValueError (nothing is encoded)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    w = float(weight)
    if not (np.isfinite(x).all() and np.isfinite(w)):
        raise ValueError("an input entry or the weight is not finite")
    b = bound(w, n)
    if x.size and float(np.abs(x).max()) > b:
        raise ValueError(f"an input entry exceeds {b:.3g}, the largest the sum holds for weight {w:g} over {n} clients")
    check_ring(w, b, n)
    return x, w


def encode_input(x: np.ndarray, weight: float, n: int) -> np.ndarray:
    """The code of one client's ``(w x, w)`` (:func:`check_input` first)."""
    x, w = check_input(x, weight, n)
    return encode_fixed(np.append(w * x, w))
