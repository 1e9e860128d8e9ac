"""Secure aggregation as a layer of the engine, for any method that declares a sum.

A method declares in ``Protocol.secure_sums`` which fields of which reply kind its
server only needs summed (:class:`~raymvc.protocol.SecureSum`). With
``channel.secure_aggregation: true`` the two nodes wrap the method's parties:

* :class:`ClientLayer` (in the client node): when the method's client returns a reply
  of a declared kind, the declared fields are taken out and kept on the client; the
  rest of the reply goes to the server as usual. The layer answers the engine's own
  ``secagg.*`` messages (:data:`~raymvc.runtime.secagg.KINDS`), and masks the kept
  fields when the server asks for them.
* :class:`ServerLayer` (in the server node): key set-up once before the first round;
  then, in every round whose replies include a declared kind, two more exchanges
  (masked input, unmasking) among the clients that sent one, before the method's
  ``step`` runs. ``step`` then gets the replies without the declared fields, only from
  the clients whose input is in the sum (the others are ``missing``), and the sum in
  ``replies.sums`` -- read with :func:`~raymvc.protocol.weighted_sum`, which without
  the layer sums the plain replies instead.

The extra exchanges travel like any message (sealed, encrypted, metered, faults
injected: a client may drop out of each exchange with the round's dropout rate, drawn
from its own stream) and count in ``communication``; the summary's
``communication_secagg`` gives their share. The cryptography and what it hides are in
:mod:`raymvc.runtime.secagg` and ``docs/threat-model.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from ..fixedpoint import FRAC_BITS, RING_BITS, split
from ..messages import Message
from ..protocol import Replies, SecureSum, WeightedSum, summed_fields
from .secagg import INPUT, KINDS, MASKED, REKEY, SecAggClient, SecAggParams, SecAggServer

NAMES, SHAPES = "names", "shapes"  # the summed fields' names and shapes, beside a masked input
KEY = ("secagg.pk", "secagg.epoch", "secagg.to", "secagg.ct")  # a fresh mask key, beside a stripped reply
_KEY_AS = ("s_pk", "epoch", "to", "ct")  # the same as the fields of a secagg.rekey message


def _shapes(shapes: list[tuple[int, ...]]) -> np.ndarray:
    """``[(2, 3), ()]`` -> ``[2, 2, 3, 0]``: each shape's length, then its sizes."""
    out: list[int] = []
    for s in shapes:
        out += [len(s), *s]
    return np.asarray(out, dtype=np.int64)


def _unshapes(flat: np.ndarray, n: int) -> list[tuple[int, ...]]:
    flat, out, at = np.asarray(flat).tolist(), [], 0
    for _ in range(n):
        d = int(flat[at])
        out.append(tuple(int(v) for v in flat[at + 1:at + 1 + d]))
        at += 1 + d
    if at != len(flat):
        raise ValueError("shapes do not match the names")
    return out


def params(neighbours: int = 0, fraction: float = 0.5) -> SecAggParams:
    """The layer's encoding, that of every declared sum (:mod:`raymvc.fixedpoint`); each
    client's bound set by its weight."""
    return SecAggParams(ring_bits=RING_BITS, frac_bits=FRAC_BITS, clip=None, neighbours=int(neighbours),
                        fraction=float(fraction))


class ClientLayer:
    """A client's side: keeps the declared fields of a reply and masks them on request."""

    def __init__(self, cid: int, specs: Iterable[SecureSum], n_clients: int, neighbours: int = 0):
        self.specs = {s.kind: s for s in specs}
        self.sa = SecAggClient(cid, params(neighbours), n_clients)
        self.kept: dict[int, tuple[list[str], list[tuple[int, ...]], np.ndarray, float]] = {}  # round -> input

    @staticmethod
    def owns(msg: Message) -> bool:
        return msg.kind in KINDS

    def strip(self, reply: Message, round: int) -> Message:
        """``reply`` without its declared fields, which are kept for this round's masked input."""
        spec = self.specs.get(reply.kind)
        if spec is None:
            return reply
        names, x, w = summed_fields(reply, spec)
        shapes = [np.shape(reply[k]) for k in names]
        self.kept = {round: (names, shapes, x, w)}  # an input not asked for by the next round is dropped
        out = {k: v for k, v in reply.fields.items() if k not in names}
        key = self.sa.fresh_key()  # the mask key of this aggregation, used for it alone
        if key is not None:
            out.update({name: key[field] for name, field in zip(KEY, _KEY_AS)})
        return Message(reply.kind, out)

    def handle(self, msg: Message, round: int) -> Message | None:
        if msg.kind != INPUT:
            return self.sa.handle(msg)
        kept = self.kept.pop(round, None)
        if kept is None:
            return None  # nothing of this round to sum
        names, shapes, x, w = kept
        rep = self.sa.masked(msg, x, weight=w)
        if rep is None or rep.kind != MASKED:
            return rep  # outside this aggregation, or re-keying
        return Message(MASKED, {**rep.fields, NAMES: "\n".join(names), SHAPES: _shapes(shapes)})


Exchange = Callable[[dict[int, Message]], "object"]  # outgoing -> a RoundState (replies, missing)


class ServerLayer:
    """The server's side: set-up, then one masked aggregation per declared kind and round."""

    def __init__(self, specs: Iterable[SecureSum], client_ids: Iterable[int], seed: int, neighbours: int = 0,
                 fraction: float = 0.5, client_sizes: dict[int, int] | None = None):
        self.specs = {s.kind: s for s in specs}
        self.sa = SecAggServer(client_ids, params(neighbours, fraction), seed=seed)
        self.client_sizes = dict(client_sizes or {})  # rows each client holds (a weight_is_rows sum's bound)

    def blame(self) -> dict[int, str]:
        """Clients whose secure-aggregation messages were malformed since the last call, and
        why: each is that client's error; the aggregation went on without its message."""
        return self.sa.take_blame()

    def setup(self, exchange: Exchange) -> None:
        """Key advertisement and the shares of every client's first mask key."""
        st = exchange(self.sa.start())
        out = self.sa.step(st.replies, st.missing)
        st = exchange(out.send or {})
        self.sa.step(st.replies, st.missing)

    def aggregate(self, st, exchange: Exchange) -> None:
        """Replace the declared fields of ``st.replies`` by their secure sums (in place)."""
        kinds = sorted({m.kind for m in st.replies.values() if m.kind in self.specs})
        if not kinds:
            return
        keys = {}
        for c, m in list(st.replies.items()):  # fresh mask keys travel beside the stripped replies
            if m.kind in self.specs and KEY[0] in m:
                keys[c] = Message(REKEY, {field: m[name] for name, field in zip(KEY, _KEY_AS)})
                st.replies[c] = Message(m.kind, {k: v for k, v in m.fields.items() if k not in KEY})
        self.sa.take_keys(keys)
        sums = {}
        for kind in kinds:
            senders = sorted(c for c, m in st.replies.items() if m.kind == kind)
            s = sums[kind] = self._one(kind, senders, exchange)
            for c in set(senders) - set(s.contributors):  # its input is not in the sum
                del st.replies[c]
                st.missing.add(c)
        st.replies = Replies(st.replies, sums=sums)

    def _one(self, kind: str, senders: list[int], exchange: Exchange) -> WeightedSum:
        try:
            return self._aggregate(kind, senders, exchange)
        finally:
            self.sa.reset()  # whatever happened, the next aggregation starts afresh

    def _aggregate(self, kind: str, senders: list[int], exchange: Exchange) -> WeightedSum:
        sa = self.sa
        sa.begin(among=senders)
        st = exchange(sa.input_requests(INPUT, {}, senders))
        masked = {c: m for c, m in st.replies.items() if m.kind == MASKED}
        out = sa.step(st.replies, st.missing)
        if out.send is not None:
            st = exchange(out.send)
            out = sa.step(st.replies, st.missing)
        if out.failed is not None or out.total is None:
            return WeightedSum(kind, {}, 0.0, [], secure=True, failed=out.failed or "no masked input",
                               disclosed=list(out.disclosed))
        try:
            totals = self._unflatten(out.total, [masked[c] for c in out.contributors])
        except (KeyError, ValueError) as e:  # unmasked, then found unusable: the server saw the sum
            return WeightedSum(kind, {}, 0.0, [], secure=True, failed=f"inconsistent masked inputs: {e}",
                               disclosed=list(out.contributors))
        spec, weight = self.specs.get(kind), float(out.weight)
        if spec is not None and spec.weight_is_rows and self.client_sizes:
            rows = sum(self.client_sizes.get(c, 0) for c in out.contributors)
            if not (0 < weight <= rows if rows > 0 else weight == 0):
                return WeightedSum(kind, {}, 0.0, [], secure=True, failed=f"summed weight {weight:.6g} is not in "
                                   f"(0, {rows}], the rows its {len(out.contributors)} contributors hold: a client "
                                   "sent a weight other than its row count", disclosed=list(out.contributors))
        return WeightedSum(kind, totals, weight, list(out.contributors), secure=True)

    @staticmethod
    def _unflatten(v: np.ndarray, inputs: list[Message]) -> dict[str, np.ndarray]:
        first = inputs[0]
        for m in inputs[1:]:
            if m[NAMES] != first[NAMES] or not np.array_equal(np.asarray(m[SHAPES]), np.asarray(first[SHAPES])):
                raise ValueError("clients summed different fields")
        names = str(first[NAMES]).split("\n") if first[NAMES] else []
        return split(v, names, _unshapes(first[SHAPES], len(names)))
