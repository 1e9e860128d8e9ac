"""Secure aggregation of weighted sums: masking with dropout recovery (SecAgg, SecAgg+).

The server learns ``Σ w_i x_i`` and ``Σ w_i`` over the clients whose masked input
arrived, and nothing else about any single ``x_i``: each client adds to its
fixed-point input a self-mask and one pairwise mask per peer; pairwise masks cancel in
the sum, self-masks are removed with Shamir shares held by the peers, and the masks a
dropped client leaves behind are rebuilt from shares of its mask key.

Two state machines, :class:`SecAggServer` and :class:`SecAggClient`, hold the
cryptography. The engine drives them (``raymvc.runtime.secure``): no method runs them
itself. Their messages are ordinary :class:`~raymvc.messages.Message` objects of the
kinds in :data:`KINDS`, carried, encrypted and metered like any other.

Exchanges (S = server, C = client)
----------------------------------
Once, before the first round:

1. ``secagg.advertise`` S->C, reply ``secagg.keys``: the client's two X25519 public
   keys, ``c`` (share encryption) and ``s`` (pairwise masks).
2. ``secagg.roster`` S->C (the keys of the client's group, the threshold ``t``), reply
   ``secagg.shares``: Shamir ``t``-of-``g`` shares of the client's mask secret key
   ``s_SK``, one per group member, each AES-256-GCM encrypted under a key derived from
   ``X25519(c_i, c_j)`` -- a key the server cannot compute; it only relays ciphertexts.

A client's group is every client (SecAgg), or with ``neighbours = k`` the client and
its about ``k`` neighbours in a random ring (SecAgg+): masks and shares then stay
inside the group, so a client's work and traffic grow with ``k``, not with ``n``.

Per aggregation ``k`` (a round whose replies carry a declared sum):

3. ``secagg.input`` S->C with the fields of :meth:`SecAggServer.input_fields` (``k``,
   the active members of the receiver's group, updated mask keys); reply
   ``secagg.masked``: ``y_i = enc(w_i x_i, w_i) + PRG(b_i) + Σ_{j>i} PRG(s_ij) -
   Σ_{j<i} PRG(s_ij)`` in Z_{2^64} (or Z_{2^32}) over the group's active peers, plus
   encrypted shares of the fresh self-mask seed ``b_i`` of this aggregation.
4. ``secagg.unmask`` S->C to the survivors ``U`` (the clients whose ``y`` arrived),
   naming the survivors and the dropped members ``D`` of the receiver's group and
   relaying the share ciphertexts addressed to it; reply ``secagg.reveal``: its shares
   of ``b_j`` for ``j ∈ U`` and of ``s_j^SK`` for ``j ∈ D`` -- never both for one client.

With fewer than ``t`` survivors in the group of any client whose secret is needed, with
survivors that fall into parts no pairwise mask links (SecAgg+: each part's sum would
come out), or with fewer than ``t`` shares of any needed secret after step 4, the
aggregation fails (no partial unmasking): the method sees an empty sum. ``t`` is at
least 2 wherever a group has more than one member.

Keys across aggregations
------------------------
No mask secret is used in two aggregations: every aggregation is an instance of its
own. ``b_i`` is drawn anew for each, and so is the mask key pair: the reply that carries
client ``i``'s input (the method's reply, before the masked-input exchange) also carries
the public half of a fresh ``s`` pair and its secret's shares, encrypted to the group
(:meth:`SecAggClient.fresh_key`, :meth:`SecAggServer.take_keys`); the client masks with
that pair and never uses it again. That matters because an aggregation reveals to the
server ``b_i`` of every survivor and ``s_SK`` of every dropped client: had client ``i``
kept its ``s`` pair, its ``b_i`` from an aggregation it survived and its ``s_SK`` from a
later one it dropped out of would unmask its earlier input. With a fresh pair each time,
a revealed ``s_SK`` only removes masks of the one aggregation whose ``b_i`` stays secret,
and a client lost in one aggregation takes part in the next with its next key. The
pairwise seeds are derived per aggregation as well (HKDF over the X25519 secret with
``k`` in the info string). A dropped client's revealed key is marked *exposed*; a
client that sent no fresh key since is left out and asked to re-key (reply
``secagg.rekey`` instead of a masked input). Peers refuse to reveal ``b_j`` for a client
whose current mask key they have helped expose. A client that missed step 1 stays out
of secure aggregation for the run; one that never got the roster of step 2 is sent it
again (its shares join it for the next aggregation), one whose shares were lost joins
through a re-key.

Threat model: honest-but-curious server and clients (the server follows the protocol
but tries to learn inputs); up to ``t - 1`` members of a group colluding with the
server learn nothing beyond the sum. The clients' checks (consistent ``U``/``D``,
``|U| >= t``, one reveal per aggregation, never both shares for one client) bound what
a lying server gets, but without the signatures and consistency round of the
malicious-server variant. All secrets come from the operating system's generator,
never from the run seed; only the SecAgg+ ring (public) is drawn from the seed.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
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
from raymvc.fixedpoint import bound as fixed_bound
from raymvc.fixedpoint import check_ring, decode_fixed, encode_fixed, ring_dtype
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
_S, _B = 0, 1  # what a share is of: the mask secret key, or a self-mask seed


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
def _kdf(secret: bytes, info: bytes) -> bytes:
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
    return _kdf(secret, b"mask|%d|%d|%d" % (lo, hi, k))


def self_seed(b: int, k: int) -> bytes:
    return _kdf(b.to_bytes(SHARE_BYTES, "big"), b"self|%d" % k)


def _share_cipher(c_sk: X25519PrivateKey, peer_c_pk: bytes, src: int, dst: int) -> AESGCM:
    secret = c_sk.exchange(X25519PublicKey.from_public_bytes(peer_c_pk))
    return AESGCM(_kdf(secret, b"share|%d->%d" % (src, dst)))


def _share_ad(what: int, src: int, dst: int, ctr: int) -> tuple[bytes, bytes]:
    return struct.pack(">BxxxQ", what, ctr), b"secagg share|%d|%d->%d|%d" % (what, src, dst, ctr)


def seal_share(c_sk, peer_c_pk: bytes, src: int, dst: int, what: int, ctr: int, value: int) -> bytes:
    """Encrypt one share for ``dst``; ``ctr`` (epoch or aggregation) makes the nonce unique."""
    nonce, ad = _share_ad(what, src, dst, ctr)
    return _share_cipher(c_sk, peer_c_pk, src, dst).encrypt(nonce, value.to_bytes(SHARE_BYTES, "big"), ad)


def open_share(c_sk, peer_c_pk: bytes, src: int, dst: int, what: int, ctr: int, ct: bytes) -> int:
    nonce, ad = _share_ad(what, src, dst, ctr)
    return int.from_bytes(_share_cipher(c_sk, peer_c_pk, src, dst).decrypt(nonce, bytes(ct), ad), "big")


def _pk(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _sk_int(sk: X25519PrivateKey) -> int:
    return int.from_bytes(sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()), "big")


def _sk_from_int(v: int) -> X25519PrivateKey:
    if v >= 2**256:
        raise ValueError("reconstructed key out of range")
    return X25519PrivateKey.from_private_bytes(v.to_bytes(KEY_BYTES, "big"))


def _u8(b: bytes | int, n: int | None = None) -> np.ndarray:
    if isinstance(b, int):
        b = b.to_bytes(n or SHARE_BYTES, "big")
    return np.frombuffer(bytes(b), dtype=np.uint8).copy()


def _rows(items: list[bytes] | list[int], width: int) -> np.ndarray:
    return np.stack([_u8(x) for x in items]) if items else np.zeros((0, width), dtype=np.uint8)


def _ids(xs: Iterable[int]) -> np.ndarray:
    return np.asarray(sorted(int(x) for x in xs), dtype=np.int64)


def _sign_mask(me: int, peer: int) -> int:
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
def _int_scalar(v) -> int | None:
    """An integer scalar (a 0-d integer array or int, never a bool), else None."""
    a = np.asarray(v)
    if a.ndim != 0 or a.dtype.kind not in "iu":
        return None
    return int(a)


def _int_list(v) -> list[int] | None:
    """A 1-D array of non-negative integers as a list, else None."""
    a = np.asarray(v)
    if a.ndim != 1 or (a.size and (a.dtype.kind not in "iu" or int(a.min()) < 0)):
        return None
    return a.astype(np.int64).tolist()


def _rows_of(v, n: int, width: int) -> np.ndarray | None:
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


def _share_cts(m: Message) -> list[tuple[int, bytes]] | None:
    """A shares message's ``(recipient, ciphertext)`` pairs, else None."""
    to = _int_list(m.get("to"))
    ct = _rows_of(m.get("ct"), len(to), CT_BYTES) if to is not None else None
    if to is None or ct is None:
        return None
    return [(d, bytes(row)) for d, row in zip(to, ct)]


def _reveal(m: Message) -> tuple[int, list[list[tuple[int, np.ndarray]]], list[int]] | None:
    """A reveal's aggregation number, its (self-mask, mask-key) shares by client id and the
    senders whose shares did not decrypt; ``None`` if it is malformed."""
    k = _int_scalar(m.get("k"))
    parts = []
    for ids, sh in (("b_ids", "b_sh"), ("s_ids", "s_sh")):
        got = _int_list(m.get(ids))
        rows = _rows_of(m.get(sh), len(got), SHARE_BYTES) if got is not None else None
        parts.append(None if rows is None else list(zip(got, rows)))
    bad = _int_list(m.get("bad", np.zeros(0, dtype=np.int64)))
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


def _common_length(lengths: list[int]) -> tuple[int | None, int]:
    """The vector length most masked inputs have and how many have it; ``(None, -1)`` on a tie."""
    counts = {n: lengths.count(n) for n in set(lengths)}
    best = max(counts.values(), default=0)
    if sum(v == best for v in counts.values()) > 1:
        return None, -1
    return next((n for n, v in counts.items() if v == best), None), best


def _masked_input(m: Message, ring_bits: int) -> tuple[int | None, np.ndarray | None, list | None]:
    """A masked input's aggregation number, vector and share ciphertexts; ``k`` is ``None`` if it is malformed."""
    k, y, cts = _int_scalar(m.get("k")), np.asarray(m.get("y")), _share_cts(m)
    if k is None or y.ndim != 1 or y.dtype != ring_dtype(ring_bits) or cts is None:
        return None, None, None
    return k, y, cts


def _unmask_request(k: int, grp: list[int], alive: set[int], lost: set[int], box: dict) -> Message:
    """The unmask request of aggregation ``k`` to one survivor: who of its group survived and who
    dropped, and the share ciphertexts that wait for it."""
    rel = sorted(box.items())
    return Message(UNMASK, k=k, U=_ids(j for j in grp if j in alive), D=_ids(j for j in grp if j in lost),
                   src=np.asarray([r[0][0] for r in rel], dtype=np.int64),
                   what=np.asarray([r[0][1] for r in rel], dtype=np.uint8),
                   ctr=np.asarray([r[0][2] for r in rel], dtype=np.int64), ct=_rows([r[1] for r in rel], CT_BYTES))


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
            if _sign_mask(i, j) > 0:
                acc -= mask
            else:
                acc += mask
    return acc


def _roster(ids: list[int], c_pk: Mapping[int, bytes], s_pk: Mapping[int, bytes], epoch: Mapping[int, int],
            t: int) -> Message:
    """The roster message of one group: its members' two public keys and key epochs, and the threshold."""
    return Message(ROSTER, ids=_ids(ids), c_pk=_rows([c_pk[c] for c in ids], 32), s_pk=_rows([s_pk[c] for c in ids], 32),
                   epoch=np.asarray([epoch[c] for c in ids], dtype=np.int64), t=t)


class SecAggServer:
    """The server's side: relays ciphertexts, unmasks the sum, never sees one input."""

    def __init__(self, client_ids: Iterable[int], params: SecAggParams | None = None, seed: int = 0):
        self.params = params or SecAggParams()
        ring_dtype(self.params.ring_bits)
        self.client_ids = sorted(int(c) for c in client_ids)
        self.seed = int(seed)  # draws the SecAgg+ ring (public), nothing secret
        self.group: dict[int, list[int]] = {}  # roster member -> its group (itself included), sorted
        self._roster_cache: Message | None = None
        self.phase = "new"  # new -> advertise -> share -> idle -> masked -> unmask -> idle ...
        self.c_pk: dict[int, bytes] = {}
        self.s_pk: dict[int, bytes] = {}
        self.epoch: dict[int, int] = {}
        self.roster: list[int] = []
        self.members: set[int] = set()  # roster members whose current s_SK is shared and unexposed
        self.exposed: set[int] = set()  # roster members that must re-key before taking part again
        self.t = 0
        self.k = 0
        self.pending = Mailbox()
        self.active: list[int] = []
        self.active_pk: dict[int, bytes] = {}
        self.survivors: list[int] = []
        self.dropped: list[int] = []
        self.y: dict[int, np.ndarray] = {}
        self.blamed: dict[int, str] = {}  # client -> what it sent that the server could not use

    def take_blame(self) -> dict[int, str]:
        """The clients whose messages were malformed since the last call, and why (their
        errors: the message was left out, nobody else's input was)."""
        out, self.blamed = self.blamed, {}
        return out

    def _blame(self, c: int, why: str) -> None:
        self.blamed.setdefault(int(c), f"secagg: {why}")

    @property
    def ready(self) -> bool:
        """Setup is over and no aggregation is under way: the protocol may ask for inputs."""
        return self.phase == "idle"

    def start(self) -> dict[int, Message]:
        """Key advertisement: the first exchange of a run."""
        self.phase = "advertise"
        return {c: Message(ADVERTISE) for c in self.client_ids}

    # -- the protocol's masked-input request ---------------------------------
    def input_fields(self, cid: int) -> dict:
        """Fields of the masked-input request of aggregation ``k`` for client ``cid``: the
        active members of its group and the mask keys of its group that changed."""
        if self.phase != "masked":
            self.begin()
        group = self.group.get(cid, (cid,))  # O(group), not O(clients), per request
        changed = [c for c in group if c in self.members and self.epoch[c] > 0]
        return {"secagg_k": self.k, "secagg_active": _ids(c for c in group if c in self.active_pk),
                "secagg_rekey": cid in self.exposed,
                "secagg_pk_ids": _ids(changed), "secagg_pk": _rows([self.s_pk[c] for c in sorted(changed)], 32),
                "secagg_epochs": np.asarray([self.epoch[c] for c in sorted(changed)], dtype=np.int64)}

    def input_requests(self, kind: str, fields: dict, to: Iterable[int]) -> dict[int, Message]:
        """The protocol's request ``kind`` with ``fields`` for every client in ``to``, plus the SecAgg fields.

        A roster member whose shares never arrived gets the roster again instead (it
        answers with shares and takes part from the next aggregation).
        """
        out = {}
        for c in to:
            fresh = c in self.c_pk and c not in self.members and c not in self.exposed
            out[c] = self._roster_msg(c) if fresh else Message(kind, {**fields, **self.input_fields(c)})
        return out

    def _roster_msg(self, cid: int) -> Message:
        """The keys of ``cid``'s group; one message object for all when every group is everyone."""
        whole = len(self.group.get(cid, ())) == len(self.roster)
        if whole and self._roster_cache is not None:
            return self._roster_cache
        msg = _roster(self.group[cid], self.c_pk, self.s_pk, self.epoch, self.t)
        if whole:
            self._roster_cache = msg
        return msg

    def begin(self, among: Iterable[int] | None = None) -> None:
        """Open aggregation ``k + 1`` over the members (unexposed, shares delivered) in ``among``."""
        if self.phase != "idle":
            raise RuntimeError(f"secagg: cannot start an aggregation in phase {self.phase!r}")
        self.k += 1
        self.phase = "masked"
        pool = self.members - self.exposed
        self.active = sorted(pool if among is None else pool & {int(c) for c in among})
        self.active_pk = {c: self.s_pk[c] for c in self.active}
        self.y = {}
        self._roster_cache = None  # epochs may have changed since

    # -- replies -------------------------------------------------------------
    def step(self, replies: Mapping[int, Message], missing: set[int]) -> Outcome:
        if self.phase == "advertise":
            return self._on_keys(replies)
        if self.phase == "share":
            self._on_shares(replies)
            self.phase = "idle"
            return Outcome()
        if self.phase == "masked":
            return self._on_masked(replies)
        if self.phase == "unmask":
            return self._on_reveal(replies)
        raise RuntimeError(f"secagg: no replies expected in phase {self.phase!r}")

    def _on_keys(self, replies: Mapping[int, Message]) -> Outcome:
        for c, m in sorted(replies.items()):
            if m.kind == KEYS and c in self.client_ids:
                c_pk, s_pk = valid_public_key(m.get("c_pk")), valid_public_key(m.get("s_pk"))
                if c_pk is None or s_pk is None:
                    self._blame(c, "its public keys are not 32-byte X25519 keys of full order; left out of the roster")
                    continue
                self.c_pk[c], self.s_pk[c], self.epoch[c] = c_pk, s_pk, 0
        self.roster = sorted(self.c_pk)
        self.group = neighbourhoods(self.roster, self.params.neighbours, self.seed)
        self.t = threshold(self.params, min((len(v) for v in self.group.values()), default=0))
        self.phase = "share"
        return Outcome(send={c: self._roster_msg(c) for c in self.roster})

    def take_keys(self, keys: Mapping[int, Message]) -> None:
        """Fresh mask keys (:meth:`SecAggClient.fresh_key`) that came with the clients' replies;
        call before :meth:`begin`, so the aggregation masks with them."""
        self._on_shares({c: m for c, m in keys.items() if m is not None and m.kind == REKEY})

    def _on_shares(self, replies: Mapping[int, Message]) -> None:
        for c, m in replies.items():
            if c not in self.c_pk or m.kind not in (SHARES, REKEY):
                continue
            cts = _share_cts(m)
            if cts is None:
                self._blame(c, f"its {m.kind} message does not hold one {CT_BYTES}-byte ciphertext per recipient")
                self.exposed.add(c)  # its peers may not hold its key's shares: it re-keys before taking part
                continue
            if m.kind == REKEY:
                epoch, s_pk = _int_scalar(m.get("epoch")), valid_public_key(m.get("s_pk"))
                if epoch is None or s_pk is None:
                    self._blame(c, "its new mask key is not an integer epoch with a 32-byte X25519 key of full order")
                    self.exposed.add(c)  # it would mask with a key the server never took: it re-keys first
                    continue
                if epoch <= self.epoch[c]:  # stale or replayed: taking half of it would unmask a wrong sum
                    self._blame(c, f"its new mask key carries epoch {epoch}, not after its last ({self.epoch[c]})")
                    self.exposed.add(c)  # its peers may hold shares of another key: it re-keys before taking part
                    continue
                self.s_pk[c] = s_pk
                self.epoch[c] = epoch
                # shares of the old key: of no use now
                self.pending.discard(lambda key, c=c: key[0] == c and key[1] == _S, self.group.get(c))
            self.pending.post(c, _S, self.epoch[c], cts, self.c_pk)
            self.members.add(c)
            self.exposed.discard(c)

    def _on_masked(self, replies: Mapping[int, Message]) -> Outcome:
        self._on_shares({c: m for c, m in replies.items() if m.kind in (SHARES, REKEY)})  # joined: active next time
        inputs: dict[int, tuple[np.ndarray, list[tuple[int, bytes]]]] = {}
        for c, m in sorted(replies.items()):
            if m.kind != MASKED or c not in self.active_pk:
                continue
            k, y, cts = _masked_input(m, self.params.ring_bits)
            if k is None:
                self._blame(c, f"its masked input is not a 1-D vector of the ring with integer k and "
                               f"{CT_BYTES}-byte share ciphertexts; left out of aggregation {self.k}")
                continue
            if k == self.k:
                inputs[c] = (y, cts)
        L, best = _common_length([len(y) for y, _ in inputs.values()])
        if best < 0:  # no length most clients agree on
            self.dropped = sorted(set(self.active) - set(inputs))
            return self._fail(f"masked inputs of {sorted({len(y) for y, _ in inputs.values()})} entries, "
                              f"no length most of them share")
        for c, (y, cts) in inputs.items():
            if len(y) != L:
                self._blame(c, f"its masked input has {len(y)} entries where {best} of {len(inputs)} clients sent {L}; "
                               f"left out of aggregation {self.k}")
                continue
            self.y[c] = y
            self.pending.post(c, _B, self.k, cts, self.active_pk)
        self.survivors = sorted(self.y)
        self.dropped = sorted(set(self.active) - set(self.y))
        if len(self.survivors) < self.t:
            return self._fail(f"{len(self.survivors)} masked inputs, threshold {self.t}")
        alive = set(self.survivors)
        short = [j for j in self.survivors + self.dropped if len(alive.intersection(self.group[j])) < self.t]
        if short:  # some needed secret cannot be rebuilt: ask for no share at all
            return self._fail(f"fewer than {self.t} survivors in the groups of clients {sorted(short)}")
        parts = linked_parts(self.group, alive)
        if parts > 1:  # unmasked, each part's own sum would come out: refuse (SecAgg+ only)
            return self._fail(f"the survivors fall into {parts} groups without masks between them")
        self.phase = "unmask"
        self.exposed |= set(self.dropped)  # their mask keys are about to be rebuilt
        lost = set(self.dropped)
        return Outcome(send={c: _unmask_request(self.k, self.group[c], alive, lost, self.pending.waiting(c))
                             for c in self.survivors})

    def reset(self) -> None:
        """End an aggregation left half-way (its party raised): the next one starts afresh."""
        if self.phase in ("masked", "unmask"):
            self._fail("interrupted")

    def _fail(self, why: str) -> Outcome:
        # once reveals were asked for, shares of the survivors' self-masks (and of the lost
        # clients' mask keys) are on their way: late ones would still unmask the survivors' sum
        disclosed = list(self.survivors) if self.phase == "unmask" else []
        self.phase = "idle"
        self.pending.discard(self._ended_self_share)
        return Outcome(ended=True, failed=why, contributors=[], dropped=list(self.dropped), disclosed=disclosed)

    def _ended_self_share(self, key: tuple[int, int, int]) -> bool:
        """A self-mask share of an ended aggregation: of no use any more."""
        return key[1] == _B and key[2] <= self.k

    def _on_reveal(self, replies: Mapping[int, Message]) -> Outcome:
        b_sh: dict[int, dict[int, int]] = {j: {} for j in self.survivors}
        s_sh: dict[int, dict[int, int]] = {j: {} for j in self.dropped}
        for c, m in sorted(replies.items()):
            if m.kind != REVEAL or c not in self.survivors:
                continue
            parsed = _reveal(m)
            if parsed is None:
                self._blame(c, f"its reveal is not an integer k with {SHARE_BYTES}-byte shares by client id")
                continue
            k, parts, bad = parsed
            if k != self.k:
                continue
            for src in bad:  # its share ciphertexts to c did not open: the sender's fault, not c's
                if src in self.c_pk and src != c:
                    self._blame(src, f"its encrypted shares for client {c} did not decrypt")
            self.pending.discard(lambda key: key[1] == _S, [c])  # delivered: the client keeps them
            for pairs, into in zip(parts, (b_sh, s_sh)):
                for j, row in pairs:
                    if j in into:
                        into[j][c + 1] = int.from_bytes(bytes(row), "big")
        short = [j for j, sh in {**b_sh, **s_sh}.items() if len(sh) < self.t]
        if short:
            return self._fail(f"fewer than {self.t} shares for clients {sorted(short)}")
        acc = unmask_sum(self.y, self.k, self.params.ring_bits, self.group, self.active_pk,
                         {c: shamir_reconstruct(b_sh[c], self.t) for c in self.survivors},
                         {j: _sk_from_int(shamir_reconstruct(s_sh[j], self.t)) for j in self.dropped})
        self.phase = "idle"
        self.pending.discard(self._ended_self_share)
        vals = decode_fixed(acc, self.params.frac_bits, self.params.ring_bits)
        return Outcome(ended=True, total=vals[:-1], weight=float(vals[-1]), contributors=list(self.survivors),
                       dropped=list(self.dropped))


# ---------------------------------------------------------------------------
class SecAggClient:
    """One client's side: its key pairs, the shares it holds, and its refusals."""

    _rotate = True  # a fresh mask key pair for every aggregation; off only to show the attack it prevents

    def __init__(self, client_id: int, params: SecAggParams | None = None, n_clients: int = 1):
        self.id = int(client_id)
        self.params = params or SecAggParams()
        self.n_clients = max(1, int(n_clients))  # for the automatic bound (params.clip None)
        self.c_sk = X25519PrivateKey.generate()
        self.s_sk = X25519PrivateKey.generate()
        self.epoch = 0
        self.c_pk: dict[int, bytes] = {}
        self.s_pk: dict[int, bytes] = {}
        self.peer_epoch: dict[int, int] = {}
        self.roster: list[int] = []
        self.t = 0
        self.held: dict[tuple[int, int, int], int] = {}  # (src, what, ctr) -> my share
        self.last_k = 0
        self.masked_with: dict[int, dict[int, tuple[bytes, int]]] = {}  # k -> peer -> (s_pk, epoch)
        self.revealed: set[int] = set()
        self.exposed_pks: set[bytes] = set()  # peers' mask keys whose shares this client revealed
        self.joined = False  # this client's current s_SK has been shared

    @staticmethod
    def owns(msg: Message) -> bool:
        """Whether ``msg`` is a SecAgg message that :meth:`handle` answers."""
        return msg.kind in KINDS

    def handle(self, msg: Message) -> Message | None:
        if msg.kind == ADVERTISE:
            return Message(KEYS, c_pk=_u8(_pk(self.c_sk)), s_pk=_u8(_pk(self.s_sk)))
        if msg.kind == ROSTER:
            return self._on_roster(msg)
        if msg.kind == UNMASK:
            return self._on_unmask(msg)
        raise ValueError(f"secagg client: unexpected message {msg.kind!r}")

    def _share_out(self, kind: str, **extra) -> Message:
        """Shares of my current s_SK for every roster member, each encrypted to its owner."""
        sh = shamir_split(_sk_int(self.s_sk), self.t, [c + 1 for c in self.roster])
        self.held[(self.id, _S, self.epoch)] = sh[self.id + 1]
        to = [c for c in self.roster if c != self.id]
        cts = [seal_share(self.c_sk, self.c_pk[c], self.id, c, _S, self.epoch, sh[c + 1]) for c in to]
        self.joined = True
        return Message(kind, to=_ids(to), ct=_rows(cts, CT_BYTES), **extra)

    def _on_roster(self, msg: Message) -> Message:
        ids = np.asarray(msg["ids"]).tolist()
        if self.id not in ids or len(set(ids)) != len(ids):
            raise ValueError("secagg client: roster without me or with repeated ids")
        if self.roster:  # sent again: my shares got lost on the way; share a fresh key
            return self._rekey()
        self.roster = sorted(ids)
        for c, cpk, spk, ep in zip(ids, np.asarray(msg["c_pk"]), np.asarray(msg["s_pk"]),
                                   np.asarray(msg["epoch"]).tolist()):
            self.c_pk[c], self.s_pk[c], self.peer_epoch[c] = bytes(cpk), bytes(spk), int(ep)
        if self.c_pk[self.id] != _pk(self.c_sk) or self.s_pk[self.id] != _pk(self.s_sk):
            raise ValueError("secagg client: the roster carries someone else's keys for me")
        self.t = int(msg["t"])
        if not 1 <= self.t <= len(ids):
            raise ValueError(f"secagg client: threshold {self.t} out of range")
        return self._share_out(SHARES)

    def _rekey(self) -> Message:
        """A fresh mask key pair, shared anew: the old one is exposed or its shares were lost."""
        self.s_sk = X25519PrivateKey.generate()
        self.epoch += 1
        return self._share_out(REKEY, s_pk=_u8(_pk(self.s_sk)), epoch=self.epoch)

    # -- masked input -----------------------------------------------------------
    def masked(self, msg: Message, x: np.ndarray, weight: float = 1.0) -> Message | None:
        """The reply to a masked-input request: ``secagg.masked`` (or ``secagg.rekey``, or nothing)."""
        if not self.roster:
            return None  # missed key advertisement: not part of secure aggregation
        for c, pk, ep in zip(np.asarray(msg["secagg_pk_ids"]).tolist(), np.asarray(msg["secagg_pk"]),
                             np.asarray(msg["secagg_epochs"]).tolist()):
            if c != self.id and c in self.roster and ep > self.peer_epoch.get(c, 0):
                self.s_pk[c], self.peer_epoch[c] = bytes(pk), ep
        if bool(msg["secagg_rekey"]) or not self.joined:
            return self._rekey()
        k = int(msg["secagg_k"])
        active = np.asarray(msg["secagg_active"]).tolist()
        if self.id not in active:
            return None
        if k <= self.last_k:
            raise ValueError(f"secagg client: aggregation {k} is not new (last {self.last_k}); refusing to mask twice")
        peers = [c for c in active if c != self.id]
        if any(c not in self.roster for c in peers) or any(self.s_pk[c] in self.exposed_pks for c in peers):
            raise ValueError("secagg client: active set names unknown peers or exposed mask keys")
        if len(active) < self.t:
            return None  # the aggregation cannot reach its threshold: send nothing
        p = self.params
        x = np.asarray(x, dtype=np.float64).ravel()
        w = float(weight)
        if not (np.isfinite(x).all() and np.isfinite(w)):
            raise ValueError("secagg client: an input entry or the weight is not finite")
        if p.clip is None:
            clip = self.bound(w, len(active))
            if x.size and float(np.abs(x).max()) > clip:
                raise ValueError(f"secagg client: an input entry exceeds {clip:.3g}, the largest the ring holds "
                                 f"for weight {w:g} over {max(self.n_clients, len(active))} clients")
        else:
            clip = p.clip
            x = np.clip(x, -clip, clip)
        try:
            check_ring(w, clip, len(active), p.frac_bits, p.ring_bits)
        except ValueError as e:
            raise ValueError(f"secagg client: {e}; lower clip or frac_bits") from None
        y = encode_fixed(np.append(w * x, w), p.frac_bits, p.ring_bits)
        L = len(y)
        b = secrets.randbelow(2**256)
        y = y + prg(self_seed(b, k), L, p.ring_bits)
        for c in peers:
            mask = prg(pairwise_seed(self.s_sk, self.s_pk[c], self.id, c, k), L, p.ring_bits)
            y = y + mask if _sign_mask(self.id, c) > 0 else y - mask
        sh = shamir_split(b, self.t, [c + 1 for c in active])
        for key in [key for key in self.held if key[1] == _B]:  # self-mask shares of past aggregations
            del self.held[key]
        self.masked_with.clear()
        self.held[(self.id, _B, k)] = sh[self.id + 1]
        cts = [seal_share(self.c_sk, self.c_pk[c], self.id, c, _B, k, sh[c + 1]) for c in peers]
        self.last_k = k
        self.masked_with[k] = {c: (self.s_pk[c], self.peer_epoch[c]) for c in peers}
        return Message(MASKED, k=k, y=y, to=_ids(peers), ct=_rows(cts, CT_BYTES))

    def fresh_key(self) -> Message | None:
        """A fresh mask key pair for the next aggregation: its public half and encrypted shares
        of its secret (a ``secagg.rekey`` message, for :meth:`SecAggServer.take_keys`), sent
        with the reply that carries this client's input. ``None`` outside secure aggregation."""
        if not self.roster or (not self._rotate and self.joined):
            return None
        return self._rekey()

    def bound(self, weight: float, active: int = 0) -> float:
        """The automatic input bound for ``weight``: ``n`` clients at it sum below ``2^(ring_bits-2)``."""
        p = self.params
        return fixed_bound(weight, max(self.n_clients, int(active)), p.frac_bits, p.ring_bits)

    # -- unmasking ------------------------------------------------------------
    def _on_unmask(self, msg: Message) -> Message:
        k = int(msg["k"])
        U, D = np.asarray(msg["U"]).tolist(), np.asarray(msg["D"]).tolist()
        if k != self.last_k or k in self.revealed or k not in self.masked_with:
            raise ValueError(f"secagg client: unmasking for aggregation {k} refused (not mine, or done)")
        mine = set(self.masked_with[k]) | {self.id}
        if set(U) & set(D) or not set(U) | set(D) <= mine or self.id not in U or len(U) < self.t:
            raise ValueError("secagg client: inconsistent survivor/dropped sets; refusing to unmask")
        bad = set()
        for src, what, ctr, ct in zip(np.asarray(msg["src"]).tolist(), np.asarray(msg["what"]).tolist(),
                                      np.asarray(msg["ctr"]).tolist(), np.asarray(msg["ct"])):
            if src in self.c_pk and src != self.id:
                try:
                    self.held[(src, what, ctr)] = open_share(self.c_sk, self.c_pk[src], src, self.id, what, ctr, ct)
                except (InvalidTag, ValueError):  # its sender's fault: that share is missing, the reveal goes on
                    bad.add(src)
        if any((j, _B, k) in self.held for j in D):
            raise ValueError("secagg client: a client named dropped sent its input; refusing to unmask")
        self.revealed.add(k)
        b_ids, b_sh, s_ids, s_sh = [], [], [], []
        for j in U:
            pk = _pk(self.s_sk) if j == self.id else self.masked_with[k][j][0]
            if (j, _B, k) in self.held and pk not in self.exposed_pks:
                b_ids.append(j)
                b_sh.append(self.held[(j, _B, k)])
        for j in D:
            pk, ep = self.masked_with[k][j]
            if (j, _S, ep) in self.held:
                s_ids.append(j)
                s_sh.append(self.held[(j, _S, ep)])
                self.exposed_pks.add(pk)
        return Message(REVEAL, k=k, b_ids=np.asarray(b_ids, dtype=np.int64), b_sh=_rows(b_sh, SHARE_BYTES),
                       s_ids=np.asarray(s_ids, dtype=np.int64), s_sh=_rows(s_sh, SHARE_BYTES), bad=_ids(bad))


__all__ = [
    "KINDS", "PRIME", "neighbourhoods", "ring_dtype", "SecAggParams", "SecAggServer", "SecAggClient", "Outcome", "shamir_split",
    "shamir_interpolate", "shamir_reconstruct", "encode_fixed", "decode_fixed", "prg",
]
