"""The building blocks of secure aggregation (:mod:`raymvc.runtime.secagg`): its message
kinds and sizes, Shamir sharing over GF(P), key derivation and the masks' PRG, sealed
shares, the SecAgg+ ring, the checks the server applies to what one client sends, and the
server's bookkeeping (relayed ciphertexts, thresholds, the unmasked sum).

Every function here is a pure function of its arguments (secrets come from the caller);
the two state machines that use them are in :mod:`raymvc.runtime.secagg`.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from raymvc import streams
from raymvc.fixedpoint import ring_dtype
from raymvc.messages import Message
from raymvc.streams import stream

ADVERTISE, KEYS = "secagg.advertise", "secagg.keys"
ROSTER, SHARES = "secagg.roster", "secagg.shares"
MASKED, REKEY = "secagg.masked", "secagg.rekey"
UNMASK, REVEAL = "secagg.unmask", "secagg.reveal"
INPUT = "secagg.input"
KINDS = frozenset({ADVERTISE, KEYS, ROSTER, SHARES, MASKED, REKEY, UNMASK, REVEAL, INPUT})

# Shamir shares live in GF(P), P the smallest prime above 2^256: every 32-byte secret fits.
PRIME = 2**256 + 297
SHARE_BYTES = 33
KEY_BYTES = 32
CT_BYTES = SHARE_BYTES + 16  # AES-GCM adds a 16-byte tag
SHARE_OF_KEY, SHARE_OF_SEED = 0, 1  # what a share is of: the mask secret key, or a self-mask seed


# ---------------------------------------------------------------------------
# Shamir secret sharing over GF(PRIME)
def shamir_split(secret: int, t: int, xs: Iterable[int]) -> dict[int, int]:
    """Shares ``{x: f(x)}`` of ``secret`` for a random polynomial ``f`` of degree ``t - 1``.

    Any ``t`` shares rebuild ``secret``; ``t - 1`` say nothing about it.
    """
    xs = [int(x) for x in xs]
    if not 0 <= secret < PRIME:
        raise ValueError("secret must lie in [0, PRIME)")
    if t < 1 or t > len(xs):
        raise ValueError(f"threshold must be in [1, {len(xs)}], got {t}")
    if len(set(xs)) != len(xs) or any(x % PRIME == 0 for x in xs):
        raise ValueError("share points must be distinct and non-zero")
    coeffs = [secret] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    out = {}
    for x in xs:
        acc = 0
        for c in reversed(coeffs):  # Horner
            acc = (acc * x + c) % PRIME
        out[x] = acc
    return out


def shamir_interpolate(shares: Mapping[int, int]) -> int:
    """The value at 0 of the lowest-degree polynomial through ``shares`` (Lagrange)."""
    if not shares:
        raise ValueError("no shares")
    total = 0
    pts = list(shares.items())
    for i, (xi, yi) in enumerate(pts):
        num, den = 1, 1
        for j, (xj, _) in enumerate(pts):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


def shamir_reconstruct(shares: Mapping[int, int], t: int) -> int:
    """Rebuild a secret from at least ``t`` shares; fewer is an error, never a guess."""
    if len(shares) < t:
        raise ValueError(f"{len(shares)} shares, need {t}")
    return shamir_interpolate(dict(list(shares.items())[:t]))


# ---------------------------------------------------------------------------
# Key derivation, PRG, share encryption
def kdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=b"raymvc secagg v1|" + info).derive(secret)


def prg(seed: bytes, n: int, bits: int = 64) -> np.ndarray:
    """``n`` pseudorandom ring elements: AES-256-CTR keyed by ``seed`` over zeros."""
    dt = ring_dtype(bits)
    enc = Cipher(algorithms.AES(seed), modes.CTR(b"\x00" * 16)).encryptor()
    return np.frombuffer(enc.update(b"\x00" * (n * dt.itemsize)) + enc.finalize(), dtype=dt.newbyteorder("<")) \
        .astype(dt)


def pairwise_seed(sk: X25519PrivateKey, peer_pk: bytes, a: int, b: int, k: int) -> bytes:
    """Seed of the mask between clients ``a`` and ``b`` in aggregation ``k`` (same for both)."""
    lo, hi = sorted((a, b))
    secret = sk.exchange(X25519PublicKey.from_public_bytes(peer_pk))
    return kdf(secret, b"mask|%d|%d|%d" % (lo, hi, k))


def self_seed(b: int, k: int) -> bytes:
    return kdf(b.to_bytes(SHARE_BYTES, "big"), b"self|%d" % k)


def _share_cipher(c_sk: X25519PrivateKey, peer_c_pk: bytes, src: int, dst: int) -> AESGCM:
    secret = c_sk.exchange(X25519PublicKey.from_public_bytes(peer_c_pk))
    return AESGCM(kdf(secret, b"share|%d->%d" % (src, dst)))


def _share_ad(what: int, src: int, dst: int, ctr: int) -> tuple[bytes, bytes]:
    return struct.pack(">BxxxQ", what, ctr), b"secagg share|%d|%d->%d|%d" % (what, src, dst, ctr)


def seal_share(c_sk, peer_c_pk: bytes, src: int, dst: int, what: int, ctr: int, value: int) -> bytes:
    """Encrypt one share for ``dst``; ``ctr`` (epoch or aggregation) makes the nonce unique."""
    nonce, ad = _share_ad(what, src, dst, ctr)
    return _share_cipher(c_sk, peer_c_pk, src, dst).encrypt(nonce, value.to_bytes(SHARE_BYTES, "big"), ad)


def open_share(c_sk, peer_c_pk: bytes, src: int, dst: int, what: int, ctr: int, ct: bytes) -> int:
    nonce, ad = _share_ad(what, src, dst, ctr)
    return int.from_bytes(_share_cipher(c_sk, peer_c_pk, src, dst).decrypt(nonce, bytes(ct), ad), "big")


def public_bytes(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def secret_int(sk: X25519PrivateKey) -> int:
    return int.from_bytes(sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()), "big")


def secret_from_int(v: int) -> X25519PrivateKey:
    if v >= 2**256:
        raise ValueError("reconstructed key out of range")
    return X25519PrivateKey.from_private_bytes(v.to_bytes(KEY_BYTES, "big"))


def u8(b: bytes | int, n: int | None = None) -> np.ndarray:
    if isinstance(b, int):
        b = b.to_bytes(n or SHARE_BYTES, "big")
    return np.frombuffer(bytes(b), dtype=np.uint8).copy()


def byte_rows(items: list[bytes] | list[int], width: int) -> np.ndarray:
    return np.stack([u8(x) for x in items]) if items else np.zeros((0, width), dtype=np.uint8)


def id_array(xs: Iterable[int]) -> np.ndarray:
    return np.asarray(sorted(int(x) for x in xs), dtype=np.int64)


def mask_sign(me: int, peer: int) -> int:
    return 1 if peer > me else -1


def neighbourhoods(ids: Iterable[int], k: int, seed: int = 0) -> dict[int, list[int]]:
    """Each client's group, itself included: everyone (``k`` = 0 or ``k >= n - 1``), or for
    SecAgg+ the ``ceil(k/2)`` clients on either side of it in a ring drawn from ``seed``.

    The relation is symmetric (``j`` is in ``i``'s group exactly when ``i`` is in ``j``'s),
    which the pairwise masks need to cancel.
    """
    ids = sorted(int(c) for c in ids)
    n = len(ids)
    h = (int(k) + 1) // 2
    if k <= 0 or 2 * h >= n - 1:
        return {c: list(ids) for c in ids}
    order = [ids[i] for i in stream(seed, streams.SECAGG_GROUPS).permutation(n)]
    nb: dict[int, set[int]] = {c: {c} for c in ids}
    for i, c in enumerate(order):
        for d in range(1, h + 1):
            j = order[(i + d) % n]
            nb[c].add(j)
            nb[j].add(c)
    return {c: sorted(v) for c, v in nb.items()}


# ---------------------------------------------------------------------------
# what the server accepts from one client (anything else is that client's error)
def int_scalar(v) -> int | None:
    """An integer scalar (a 0-d integer array or int, never a bool), else None."""
    a = np.asarray(v)
    if a.ndim != 0 or a.dtype.kind not in "iu":
        return None
    return int(a)


def int_list(v) -> list[int] | None:
    """A 1-D array of non-negative integers as a list, else None."""
    a = np.asarray(v)
    if a.ndim != 1 or (a.size and (a.dtype.kind not in "iu" or int(a.min()) < 0)):
        return None
    return a.astype(np.int64).tolist()


def rows_of(v, n: int, width: int) -> np.ndarray | None:
    """``n`` rows of ``width`` bytes (a 2-D uint8 array), else None."""
    a = np.asarray(v)
    if a.dtype != np.uint8 or a.ndim != 2 or a.shape != (n, width):
        return None
    return a


def valid_public_key(v) -> bytes | None:
    """32 bytes of an X25519 public key of full order, else None (a low-order point, e.g.
    all zeros, would make every peer's key agreement fail)."""
    a = np.asarray(v)
    if a.dtype != np.uint8 or a.shape != (KEY_BYTES,):
        return None
    raw = a.tobytes()
    try:
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(raw))
    except ValueError:
        return None
    return raw


def share_cts(m: Message) -> list[tuple[int, bytes]] | None:
    """A shares message's ``(recipient, ciphertext)`` pairs, else None."""
    to = int_list(m.get("to"))
    ct = rows_of(m.get("ct"), len(to), CT_BYTES) if to is not None else None
    if to is None or ct is None:
        return None
    return [(d, bytes(row)) for d, row in zip(to, ct)]


def parse_reveal(m: Message) -> tuple[int, list[list[tuple[int, np.ndarray]]], list[int]] | None:
    """A reveal's aggregation number, its (self-mask, mask-key) shares by client id and the
    senders whose shares did not decrypt; ``None`` if it is malformed."""
    k = int_scalar(m.get("k"))
    parts = []
    for ids, sh in (("b_ids", "b_sh"), ("s_ids", "s_sh")):
        got = int_list(m.get(ids))
        rows = rows_of(m.get(sh), len(got), SHARE_BYTES) if got is not None else None
        parts.append(None if rows is None else list(zip(got, rows)))
    bad = int_list(m.get("bad", np.zeros(0, dtype=np.int64)))
    return None if k is None or None in parts or bad is None else (k, parts, bad)


def linked_parts(group: Mapping[int, Iterable[int]], alive: set[int]) -> int:
    """How many parts ``alive`` forms when two clients are linked by a pairwise mask (same group)."""
    seen, parts = set(), 0
    for start in sorted(alive):
        if start in seen:
            continue
        parts += 1
        todo = [start]
        seen.add(start)
        while todo:
            c = todo.pop()
            for j in group.get(c, ()):
                if j in alive and j not in seen:
                    seen.add(j)
                    todo.append(j)
    return parts


@dataclass(frozen=True)
class SecAggParams:
    """Encoding parameters, the same on every party.

    Inputs are multiplied by the client's weight and scaled by ``2^frac_bits``; the sum
    over all clients must stay inside the signed range of Z_{2^ring_bits}. With ``clip``
    set, inputs are clipped to ``[-clip, clip]`` and the ring is checked before masking;
    with ``clip=None`` each client takes the largest bound that keeps the sum of ``n``
    clients' inputs inside the ring, ``2^(ring_bits-2-frac_bits) / (max(|w|, 1) n)``, and
    an entry beyond it (or not finite) is an error rather than a silent clip.
    ``threshold`` is ``t``; ``None`` takes ``floor(fraction x g) + 1`` for groups of ``g``
    (the default fraction 0.5: a majority). ``neighbours`` is the
    SecAgg+ group size ``k`` (0: every client is in every group, plain SecAgg).
    """

    ring_bits: int = 64
    frac_bits: int = 24
    clip: float | None = 1.0e4
    threshold: int | None = None
    fraction: float = 0.5
    neighbours: int = 0


# ---------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one :meth:`SecAggServer.step` produced.

    ``send``: messages for another exchange (then call ``step`` again with the replies).
    Otherwise the phase ended: ``ended`` is true when an aggregation ended, with
    ``total`` (``Σ w_i x_i``) and ``weight`` (``Σ w_i``) over ``contributors`` if it
    succeeded, or ``failed`` saying why not. ``disclosed``: the clients whose sum a
    server that keeps every reply it ever receives may still decode although the
    aggregation failed -- the survivors, when it failed after the unmasking request went
    out (reveals that arrive late, or that the server holds back, complete the shares).
    """

    send: dict[int, Message] | None = None
    ended: bool = False
    total: np.ndarray | None = None
    weight: float | None = None
    contributors: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    failed: str | None = None
    disclosed: list[int] = field(default_factory=list)


class Mailbox:
    """The share ciphertexts the server relays, by recipient: ``(sender, what, counter) ->
    ciphertext``, each sealed for its recipient (the server cannot open one)."""

    def __init__(self):
        self.boxes: dict[int, dict[tuple[int, int, int], bytes]] = {}

    def post(self, src: int, what: int, ctr: int, cts: Iterable[tuple[int, bytes]], to: Container[int]) -> None:
        """Keep ``src``'s ciphertexts for the recipients in ``to`` (the others are dropped)."""
        for dst, ct in cts:
            if dst in to:
                self.boxes.setdefault(dst, {})[(src, what, ctr)] = ct

    def discard(self, which: Callable[[tuple[int, int, int]], bool], dsts: Iterable[int] | None = None) -> None:
        """Drop the ciphertexts whose key ``which`` picks, for ``dsts`` (default: every recipient)."""
        for dst in list(self.boxes) if dsts is None else dsts:
            box = self.boxes.get(dst, {})
            for key in [key for key in box if which(key)]:
                del box[key]

    def waiting(self, dst: int) -> dict[tuple[int, int, int], bytes]:
        return self.boxes.get(dst, {})


def threshold(params: SecAggParams, g: int) -> int:
    """Shares needed to rebuild a secret, for groups of at least ``g`` clients: the parameter's
    (or a fraction of ``g``, plus one), never 1 where a group has company (a lone survivor's
    self-mask seed and its peers' revealed keys would otherwise unmask its input)."""
    if not g:
        return 1
    t = params.threshold or int(params.fraction * g) + 1
    return max(min(2, g), min(t, g))


def common_length(lengths: list[int]) -> tuple[int | None, int]:
    """The vector length most masked inputs have and how many have it; ``(None, -1)`` on a tie."""
    counts = {n: lengths.count(n) for n in set(lengths)}
    best = max(counts.values(), default=0)
    if sum(v == best for v in counts.values()) > 1:
        return None, -1
    return next((n for n, v in counts.items() if v == best), None), best


def parse_masked_input(m: Message, ring_bits: int) -> tuple[int | None, np.ndarray | None, list | None]:
    """A masked input's aggregation number, vector and share ciphertexts; ``k`` is ``None`` if it is malformed."""
    k, y, cts = int_scalar(m.get("k")), np.asarray(m.get("y")), share_cts(m)
    if k is None or y.ndim != 1 or y.dtype != ring_dtype(ring_bits) or cts is None:
        return None, None, None
    return k, y, cts


def unmask_request(k: int, grp: list[int], alive: set[int], lost: set[int], box: dict) -> Message:
    """The unmask request of aggregation ``k`` to one survivor: who of its group survived and who
    dropped, and the share ciphertexts that wait for it."""
    rel = sorted(box.items())
    return Message(UNMASK, k=k, U=id_array(j for j in grp if j in alive), D=id_array(j for j in grp if j in lost),
                   src=np.asarray([r[0][0] for r in rel], dtype=np.int64),
                   what=np.asarray([r[0][1] for r in rel], dtype=np.uint8),
                   ctr=np.asarray([r[0][2] for r in rel], dtype=np.int64), ct=byte_rows([r[1] for r in rel], CT_BYTES))


def unmask_sum(y: Mapping[int, np.ndarray], k: int, bits: int, group: Mapping[int, list[int]],
               active_pk: Mapping[int, bytes], b: Mapping[int, int], s_sk: Mapping[int, X25519PrivateKey]) -> np.ndarray:
    """Aggregation ``k``'s sum in the ring: the survivors' masked inputs ``y`` summed, less each
    survivor's self-mask (from its rebuilt seed ``b``) and the pairwise masks it shares with each
    dropped client of its group (from that client's rebuilt mask key ``s_sk``)."""
    L = len(next(iter(y.values())))
    acc = np.zeros(L, dtype=ring_dtype(bits))
    for c in b:
        acc += y[c]
        acc -= prg(self_seed(b[c], k), L, bits)
    for j, sk in s_sk.items():
        for i in (i for i in b if i in group[j]):  # y_i holds sign(i, j) PRG(s_ij)
            mask = prg(pairwise_seed(sk, active_pk[i], i, j, k), L, bits)
            if mask_sign(i, j) > 0:
                acc -= mask
            else:
                acc += mask
    return acc


def roster_message(ids: list[int], c_pk: Mapping[int, bytes], s_pk: Mapping[int, bytes], epoch: Mapping[int, int],
            t: int) -> Message:
    """The roster message of one group: its members' two public keys and key epochs, and the threshold."""
    return Message(ROSTER, ids=id_array(ids), c_pk=byte_rows([c_pk[c] for c in ids], 32),
                   s_pk=byte_rows([s_pk[c] for c in ids], 32),
                   epoch=np.asarray([epoch[c] for c in ids], dtype=np.int64), t=t)
