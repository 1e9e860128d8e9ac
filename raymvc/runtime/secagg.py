"""Secure aggregation of weighted sums: masking with dropout recovery (SecAgg, SecAgg+).

The server learns ``Σ w_i x_i`` and ``Σ w_i`` over the clients whose masked input
arrived, and nothing else about any single ``x_i``: each client adds to its
fixed-point input a self-mask and one pairwise mask per peer; pairwise masks cancel in
the sum, self-masks are removed with Shamir shares held by the peers, and the masks a
dropped client leaves behind are rebuilt from shares of its mask key.

Two state machines, :class:`SecAggServer` and :class:`SecAggClient`, hold the
cryptography. The engine drives them (``raymvc.runtime.secure``): no method runs them
itself. Their messages are ordinary :class:`~raymvc.messages.Message` objects of the
kinds in :data:`KINDS`, carried, encrypted and metered like any other. The pieces they
are built from (Shamir sharing, the PRG, sealed shares, the SecAgg+ ring, the checks on
what a client sends) are in :mod:`raymvc.runtime.secagg_parts`.

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
from collections.abc import Iterable, Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from raymvc.fixedpoint import bound as fixed_bound
from raymvc.fixedpoint import check_ring, decode_fixed, encode_fixed, ring_dtype
from raymvc.messages import Message

from .secagg_parts import (
    ADVERTISE,
    CT_BYTES,
    INPUT,
    KEYS,
    KINDS,
    MASKED,
    PRIME,
    REKEY,
    REVEAL,
    ROSTER,
    SHARE_BYTES,
    SHARE_OF_KEY,
    SHARE_OF_SEED,
    SHARES,
    UNMASK,
    Mailbox,
    Outcome,
    SecAggParams,
    byte_rows,
    common_length,
    id_array,
    int_scalar,
    linked_parts,
    mask_sign,
    neighbourhoods,
    open_share,
    pairwise_seed,
    parse_masked_input,
    parse_reveal,
    prg,
    public_bytes,
    roster_message,
    seal_share,
    secret_from_int,
    secret_int,
    self_seed,
    shamir_interpolate,
    shamir_reconstruct,
    shamir_split,
    share_cts,
    threshold,
    u8,
    unmask_request,
    unmask_sum,
    valid_public_key,
)


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
        return {"secagg_k": self.k, "secagg_active": id_array(c for c in group if c in self.active_pk),
                "secagg_rekey": cid in self.exposed,
                "secagg_pk_ids": id_array(changed), "secagg_pk": byte_rows([self.s_pk[c] for c in sorted(changed)], 32),
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
        msg = roster_message(self.group[cid], self.c_pk, self.s_pk, self.epoch, self.t)
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
            cts = share_cts(m)
            if cts is None:
                self._blame(c, f"its {m.kind} message does not hold one {CT_BYTES}-byte ciphertext per recipient")
                self.exposed.add(c)  # its peers may not hold its key's shares: it re-keys before taking part
                continue
            if m.kind == REKEY:
                epoch, s_pk = int_scalar(m.get("epoch")), valid_public_key(m.get("s_pk"))
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
                self.pending.discard(lambda key, c=c: key[0] == c and key[1] == SHARE_OF_KEY, self.group.get(c))
            self.pending.post(c, SHARE_OF_KEY, self.epoch[c], cts, self.c_pk)
            self.members.add(c)
            self.exposed.discard(c)

    def _on_masked(self, replies: Mapping[int, Message]) -> Outcome:
        self._on_shares({c: m for c, m in replies.items() if m.kind in (SHARES, REKEY)})  # joined: active next time
        inputs: dict[int, tuple[np.ndarray, list[tuple[int, bytes]]]] = {}
        for c, m in sorted(replies.items()):
            if m.kind != MASKED or c not in self.active_pk:
                continue
            k, y, cts = parse_masked_input(m, self.params.ring_bits)
            if k is None:
                self._blame(c, f"its masked input is not a 1-D vector of the ring with integer k and "
                               f"{CT_BYTES}-byte share ciphertexts; left out of aggregation {self.k}")
                continue
            if k == self.k:
                inputs[c] = (y, cts)
        L, best = common_length([len(y) for y, _ in inputs.values()])
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
            self.pending.post(c, SHARE_OF_SEED, self.k, cts, self.active_pk)
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
        return Outcome(send={c: unmask_request(self.k, self.group[c], alive, lost, self.pending.waiting(c))
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
        return key[1] == SHARE_OF_SEED and key[2] <= self.k

    def _on_reveal(self, replies: Mapping[int, Message]) -> Outcome:
        b_sh: dict[int, dict[int, int]] = {j: {} for j in self.survivors}
        s_sh: dict[int, dict[int, int]] = {j: {} for j in self.dropped}
        for c, m in sorted(replies.items()):
            if m.kind != REVEAL or c not in self.survivors:
                continue
            parsed = parse_reveal(m)
            if parsed is None:
                self._blame(c, f"its reveal is not an integer k with {SHARE_BYTES}-byte shares by client id")
                continue
            k, parts, bad = parsed
            if k != self.k:
                continue
            for src in bad:  # its share ciphertexts to c did not open: the sender's fault, not c's
                if src in self.c_pk and src != c:
                    self._blame(src, f"its encrypted shares for client {c} did not decrypt")
            self.pending.discard(lambda key: key[1] == SHARE_OF_KEY, [c])  # delivered: the client keeps them
            for pairs, into in zip(parts, (b_sh, s_sh)):
                for j, row in pairs:
                    if j in into:
                        into[j][c + 1] = int.from_bytes(bytes(row), "big")
        short = [j for j, sh in {**b_sh, **s_sh}.items() if len(sh) < self.t]
        if short:
            return self._fail(f"fewer than {self.t} shares for clients {sorted(short)}")
        acc = unmask_sum(self.y, self.k, self.params.ring_bits, self.group, self.active_pk,
                         {c: shamir_reconstruct(b_sh[c], self.t) for c in self.survivors},
                         {j: secret_from_int(shamir_reconstruct(s_sh[j], self.t)) for j in self.dropped})
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
            return Message(KEYS, c_pk=u8(public_bytes(self.c_sk)), s_pk=u8(public_bytes(self.s_sk)))
        if msg.kind == ROSTER:
            return self._on_roster(msg)
        if msg.kind == UNMASK:
            return self._on_unmask(msg)
        raise ValueError(f"secagg client: unexpected message {msg.kind!r}")

    def _share_out(self, kind: str, **extra) -> Message:
        """Shares of my current s_SK for every roster member, each encrypted to its owner."""
        sh = shamir_split(secret_int(self.s_sk), self.t, [c + 1 for c in self.roster])
        self.held[(self.id, SHARE_OF_KEY, self.epoch)] = sh[self.id + 1]
        to = [c for c in self.roster if c != self.id]
        cts = [seal_share(self.c_sk, self.c_pk[c], self.id, c, SHARE_OF_KEY, self.epoch, sh[c + 1]) for c in to]
        self.joined = True
        return Message(kind, to=id_array(to), ct=byte_rows(cts, CT_BYTES), **extra)

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
        if self.c_pk[self.id] != public_bytes(self.c_sk) or self.s_pk[self.id] != public_bytes(self.s_sk):
            raise ValueError("secagg client: the roster carries someone else's keys for me")
        self.t = int(msg["t"])
        if not 1 <= self.t <= len(ids):
            raise ValueError(f"secagg client: threshold {self.t} out of range")
        return self._share_out(SHARES)

    def _rekey(self) -> Message:
        """A fresh mask key pair, shared anew: the old one is exposed or its shares were lost."""
        self.s_sk = X25519PrivateKey.generate()
        self.epoch += 1
        return self._share_out(REKEY, s_pk=u8(public_bytes(self.s_sk)), epoch=self.epoch)

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
            y = y + mask if mask_sign(self.id, c) > 0 else y - mask
        sh = shamir_split(b, self.t, [c + 1 for c in active])
        for key in [key for key in self.held if key[1] == SHARE_OF_SEED]:  # self-mask shares of past aggregations
            del self.held[key]
        self.masked_with.clear()
        self.held[(self.id, SHARE_OF_SEED, k)] = sh[self.id + 1]
        cts = [seal_share(self.c_sk, self.c_pk[c], self.id, c, SHARE_OF_SEED, k, sh[c + 1]) for c in peers]
        self.last_k = k
        self.masked_with[k] = {c: (self.s_pk[c], self.peer_epoch[c]) for c in peers}
        return Message(MASKED, k=k, y=y, to=id_array(peers), ct=byte_rows(cts, CT_BYTES))

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
        if any((j, SHARE_OF_SEED, k) in self.held for j in D):
            raise ValueError("secagg client: a client named dropped sent its input; refusing to unmask")
        self.revealed.add(k)
        b_ids, b_sh, s_ids, s_sh = [], [], [], []
        for j in U:
            pk = public_bytes(self.s_sk) if j == self.id else self.masked_with[k][j][0]
            if (j, SHARE_OF_SEED, k) in self.held and pk not in self.exposed_pks:
                b_ids.append(j)
                b_sh.append(self.held[(j, SHARE_OF_SEED, k)])
        for j in D:
            pk, ep = self.masked_with[k][j]
            if (j, SHARE_OF_KEY, ep) in self.held:
                s_ids.append(j)
                s_sh.append(self.held[(j, SHARE_OF_KEY, ep)])
                self.exposed_pks.add(pk)
        return Message(REVEAL, k=k, b_ids=np.asarray(b_ids, dtype=np.int64), b_sh=byte_rows(b_sh, SHARE_BYTES),
                       s_ids=np.asarray(s_ids, dtype=np.int64), s_sh=byte_rows(s_sh, SHARE_BYTES), bad=id_array(bad))


__all__ = [
    "ADVERTISE", "KEYS", "ROSTER", "SHARES", "INPUT", "MASKED", "REKEY", "UNMASK", "REVEAL",
    "KINDS", "PRIME", "neighbourhoods", "ring_dtype", "SecAggParams", "SecAggServer", "SecAggClient", "Outcome", "shamir_split",
    "shamir_interpolate", "shamir_reconstruct", "encode_fixed", "decode_fixed", "prg",
]
