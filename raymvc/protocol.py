"""The protocol interface every federated clustering method implements.

A method is a module in ``protocols/`` (installed as ``raymvc.protocols``) that
defines three things and registers them as ``PROTOCOL``:

* ``Config`` -- a :class:`ProtocolConfig` (pydantic model, unknown keys rejected)
  holding the method's hyperparameters; the scenario's ``params`` fill it.
* ``Client(config, shard, ctx)`` -- holds one client's private :class:`~raymvc.data.Shard`
  and answers messages: ``handle(msg) -> Message | None``. ``None`` means "no reply".
  Optionally ``predict() -> labels`` for methods whose clients label their own samples
  (used only on the evaluation path).
* ``Server(config, ctx)`` -- ``start() -> {client_id: Message}`` and
  ``step(round, replies, missing) -> {client_id: Message} | Done``.

``replies`` maps client id -> the reply that arrived in time; ``missing`` is the set of
addressed clients whose reply did not (dropped, crashed, late, rejected). Each protocol
documents what it does with missing replies.

Weighted sums (FedAvg and the like) are declared, not computed by hand: a method lists
in ``Protocol.secure_sums`` which reply fields it only ever needs summed
(:class:`SecureSum`), and its server reads them with :func:`weighted_sum`. Without
``channel.secure_aggregation`` that sums the plain replies; with it the engine masks
the declared fields on the clients and hands the server the sum alone (see
``raymvc.runtime.secure``), and the method's code is the same either way. The server may put numbers for the round
log (objective values, stale clients...) into ``self.info``; the engine writes them to
``rounds.jsonl`` after every step and clears the dict.

The parties' side (``raymvc.runtime``, driven by ``raymvc.driver``) moves every message through the channel, so protocols
never see bytes, actors, keys or clocks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from . import streams
from .fixedpoint import decode_fixed, encode_input, split
from .messages import Done, Message
from .streams import stream


class ProtocolConfig(BaseModel):
    """Base for method hyperparameters: unknown keys and wrong types are errors.

    Every field says where its default comes from (:func:`paper`, :func:`not_stated`,
    :func:`departure`, :func:`project_option`); ``raymvc params METHOD`` shows it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# --------------------------------------------------------------------------- where a default comes from
SOURCE_KINDS = ("paper", "not stated", "departure", "project option")
_PLACE = re.compile(r"\b(Sec\.|Section|Table|Fig\.|Figure|Alg\.|Algorithm|Eqs?\.|Appendix|Abstract)\s*[\w(]")
_NO_VALUE = object()


def _source(kind: str, **parts) -> dict:
    return {"json_schema_extra": {"source": {"kind": kind, **{k: v for k, v in parts.items() if v is not _NO_VALUE}}}}


def paper(where: str, value: Any = _NO_VALUE) -> dict:
    """``Field(default=0.1, ..., **paper("Sec. 4.3", value=0.1))``: the method's paper states
    this value at ``where`` (a section, table, figure, algorithm or equation). ``value``,
    where given, is the paper's number: the default must equal it (a test holds them together)."""
    return _source("paper", where=where, value=value)


def not_stated(why: str) -> dict:
    """The paper leaves this value open; ``why`` says what the project takes and why
    (shown as "not stated; ours: <why>")."""
    return _source("not stated", why=why)


def departure(where: str, why: str, paper_value: Any = _NO_VALUE) -> dict:
    """The paper states another value (at ``where``, which says which); ``why`` says ours and
    why. ``paper_value``, where given, is the paper's number: the default must differ from it."""
    return _source("departure", where=where, why=why, paper_value=paper_value)


def project_option(note: str = "") -> dict:
    """A switch of the project that the paper does not have; its default leaves the paper's
    procedure as it is unless ``note`` says otherwise."""
    return _source("project option", note=note)


def param_source(field) -> dict | None:
    """The mark a field of a Config carries (``{"kind": ..., ...}``), or None."""
    extra = field.json_schema_extra
    return extra.get("source") if isinstance(extra, dict) else None


def source_text(field) -> str:
    """A field's mark as one line: "paper: Sec. 4.3", "not stated; ours: ...", "departure;
    paper: ...; ours: ...", "project option[; note]"; "" for an unmarked field."""
    s = param_source(field)
    if not isinstance(s, dict):
        return ""
    kind = s.get("kind")
    if kind == "paper":
        return f"paper: {s.get('where', '')}"
    if kind == "not stated":
        return f"not stated; ours: {s.get('why', '')}"
    if kind == "departure":
        return f"departure; paper: {s.get('where', '')}; ours: {s.get('why', '')}"
    return f"{kind}; {s['note']}" if s.get("note") else str(kind)


def _same(a, b) -> bool:
    norm = (lambda v: tuple(v) if isinstance(v, (list, tuple)) else v)
    return norm(a) == norm(b)


def source_problems(config: type[BaseModel]) -> list[str]:
    """One line per field of ``config`` whose mark is missing or malformed: an unknown kind,
    a paper place that names no section/table/figure/algorithm/equation, a reason of
    fewer than three words, a paper value the default does not (or, for a departure,
    does) equal."""
    out = []
    for name, f in config.model_fields.items():
        s = param_source(f)
        if s is None:
            out.append(f"{name}: unmarked (paper(...), not_stated(...), departure(...) or project_option())")
            continue
        kind = s.get("kind") if isinstance(s, dict) else None
        if kind not in SOURCE_KINDS:
            out.append(f"{name}: unknown kind {kind!r} (one of {', '.join(SOURCE_KINDS)})")
            continue
        if kind in ("paper", "departure") and not _PLACE.search(str(s.get("where", ""))):
            out.append(f"{name}: {kind} names no place in the paper: {s.get('where')!r}")
        if kind in ("not stated", "departure") and len(str(s.get("why", "")).split()) < 3:
            out.append(f"{name}: {kind} gives no reason for ours: {s.get('why')!r}")
        if "value" in s and not _same(f.default, s["value"]):
            out.append(f"{name}: default {f.default!r} is not the paper's {s['value']!r}")
        if "paper_value" in s and _same(f.default, s["paper_value"]):
            out.append(f"{name}: a departure whose default {f.default!r} is the paper's value")
    return out


def remark(config: type[BaseModel], name: str, source: dict):
    """The field ``name`` of ``config`` with another mark, for a subclass whose paper says
    otherwise about an inherited parameter: ``gamma: float = remark(Base, "gamma", paper("Sec. 4"))``.
    Default, bounds and description stay the base's."""
    from pydantic.fields import FieldInfo

    return FieldInfo.merge_field_infos(config.model_fields[name], **source)


def derive_rng(seed: int, *tags: int | str) -> np.random.Generator:
    """A generator seeded by ``(seed, *tags)``; string tags enter as their CRC-32.

    Two calls with the same arguments give the same stream, whatever was drawn
    elsewhere before. The run's own streams (:mod:`raymvc.streams`, one table of tags)
    are this with a tag of that table first; a method gets per-round streams from
    ``ctx.rng_for``."""
    return stream(seed, *tags)


def seed_from(rng: np.random.Generator) -> int:
    """One integer seed (for scikit-learn's ``random_state`` or torch) drawn from ``rng``."""
    return int(rng.integers(2**31 - 1))


T = TypeVar("T")


def work_steps(work: float, total: int) -> int:
    """How many of ``total`` local steps a client doing the share ``work`` takes:
    ``total`` when ``work >= 1``, else ``ceil(work x total)``, at least 1 (0 if ``total`` is 0)."""
    if work >= 1.0 or total <= 0:
        return max(int(total), 0)
    return max(1, math.ceil(work * total - 1e-9))


@dataclass
class ClientContext:
    """What a client may know besides its shard.

    ``round`` is the round of the message being handled; the engine sets it before
    every ``handle``. Randomness comes from :meth:`rng_for`, a stream keyed by
    ``(seed, client, round, tag)``: a round the client missed shifts no later draw.

    ``work`` is the share of its local work the client gets to do in this round (1: all;
    less under ``faults.partial_work``), also set by the engine before every ``handle``.
    A method with local epochs or steps honours it by iterating :meth:`local_batches`
    (and declares ``"partial_work"`` in ``Protocol.supports``); a closed-form method ignores it.
    """

    client_id: int
    n_clients: int
    n_clusters: int
    seed: int
    float_dtype: str = "float64"
    round: int = 0
    work: float = 1.0

    def local_batches(self, epochs: int, one_pass: Callable[[], Sequence[T]]) -> Iterator[T]:
        """The batches of ``epochs`` passes, ``one_pass()`` giving one pass's batches, cut to
        the share ``work`` of all of them (:func:`work_steps`: at least one).

        ``one_pass`` is called lazily at the start of each pass, as a loop
        ``for _ in range(epochs): for b in one_pass()`` would, so with ``work == 1`` the
        batches and every random draw are those of that loop.
        """
        budget, done = None, 0
        for _ in range(epochs):
            batches = one_pass()
            if budget is None:
                budget = work_steps(self.work, epochs * len(batches))
            for b in batches:
                if done >= budget:
                    return
                done += 1
                yield b

    def rng_for(self, tag: str, round: int | None = None) -> np.random.Generator:
        """A fresh generator for ``tag`` in ``round`` (default: the current round)."""
        r = self.round if round is None else round
        return stream(self.seed, streams.CLIENT, self.client_id, r, tag)


@dataclass
class ServerContext:
    """What the server may know: public facts about the federation, never data.

    ``client_sizes`` holds each client's number of samples (public, as in FedAvg);
    ``n_samples`` is set for vertical splits (samples shared by all clients).
    """

    client_ids: list[int]
    n_clusters: int
    seed: int
    n_samples: int | None = None
    client_sizes: dict[int, int] = field(default_factory=dict)
    float_dtype: str = "float64"
    # faults.asynchronous: the oldest update a step may get, in steps (None: synchronous rounds)
    max_staleness: int | None = None

    def rng_for(self, tag: str, round: int) -> np.random.Generator:
        """A fresh generator for ``tag`` in ``round``, independent of all other draws."""
        return stream(self.seed, streams.SERVER, round, tag)


class NoInput(RuntimeError):
    """Raised by a server whose clients' replies left it nothing to go on (none delivered
    what the method needs): the injected faults stopped the run, so it ends ``failed``,
    not ``error`` -- a protocol's own bug still raises anything else."""


class Client:
    """Base class for a protocol's client side."""

    def __init__(self, config: ProtocolConfig, shard: Any, ctx: ClientContext):
        self.config = config
        self.shard = shard
        self.ctx = ctx

    def handle(self, msg: Message) -> Message | None:  # pragma: no cover - interface
        raise NotImplementedError

    def predict(self) -> np.ndarray | None:  # pragma: no cover - interface
        """One whole non-negative label per row this client holds, or ``None`` when it has
        nothing to label them with (it missed the model, say): its rows stay -1. Raising,
        or labels of the wrong length or kind, is this client's error."""
        raise NotImplementedError(f"{type(self).__name__} does not label its own samples")


class Server:
    """Base class for a protocol's server side."""

    def __init__(self, config: ProtocolConfig, ctx: ServerContext):
        self.config = config
        self.ctx = ctx
        self.info: dict[str, Any] = {}

    def start(self) -> dict[int, Message]:  # pragma: no cover - interface
        raise NotImplementedError

    def step(
        self, round: int, replies: Mapping[int, Message], missing: set[int]
    ) -> dict[int, Message] | Done:  # pragma: no cover - interface
        raise NotImplementedError

    def result(self) -> Done | None:
        """Best labels so far, or ``None`` if there are none yet; called when a run must stop
        early (too few clients, a signal). Raising here is the server's error, like raising
        in ``step``; the default says the method cannot report early results."""
        raise NotImplementedError(f"{type(self).__name__} cannot report early results")

    def current_model(self) -> Message | None:
        """The message that would hand the model as it stands to a client, so that the
        client's ``predict`` labels its rows with it (for a method that ends with a final
        model: that message), or ``None`` while there is none yet. ``runtime.score_every``
        scores a run along its rounds with it, off the record: a copy of each client gets it
        and labels the client's rows, nothing is metered, timed or faulted, and the run goes
        on as without it. It is called on the live server, so it must not change the
        server's state. A method that does not override this cannot be scored mid-run."""
        return None


def scores_mid_run(proto: Protocol) -> bool:
    """Whether a method's server offers its model as it stands (``Server.current_model``)."""
    return proto.server.current_model is not Server.current_model


@dataclass(frozen=True)
class RunFacts:
    """Public facts of a run, for a protocol's analytic traffic count."""

    n_samples: int  # vertical: samples shared by all clients; horizontal: all rows
    n_clusters: int
    client_ids: list[int]
    client_sizes: dict[int, int]  # rows each client holds
    client_dims: dict[int, int]  # feature dimension of each client's (first) view
    rounds: int  # protocol rounds run, as in summary.json
    float_bytes: int = 8  # 8, or 4 with channel.float_dtype: float32


@dataclass(frozen=True)
class SecureSum:
    """A declaration: replies of kind ``kind`` carry ``fields`` that the server only needs
    as a weighted sum ``Σ w_i x_i`` over the clients (and ``Σ w_i``).

    ``fields`` are names, or prefixes ending in ``*`` (``"w.*"``: every field whose name
    starts with ``w.``); each is an array or a number. ``weight`` names a scalar field
    holding ``w_i`` (``None``: every client weighs 1); the weight itself travels in the
    clear. With ``channel.secure_aggregation`` the engine strips the declared fields from
    the reply, masks them, and the server sees only their sum (:func:`weighted_sum`).
    ``weight_is_rows``: ``w_i`` counts client ``i``'s rows, so the summed weight must lie in
    (0, the contributors' rows]; a sum outside is refused as failed (one client lied about
    its weight: the sum cannot say which).
    """

    kind: str
    fields: tuple[str, ...]
    weight: str | None = None
    # the weight is the client's number of rows: the server refuses a sum whose total weight
    # is not in (0, rows the contributors hold] (a client that sent another weight)
    weight_is_rows: bool = False

    def covers(self, name: str) -> bool:
        """Whether field ``name`` is one of the summed fields."""
        return any(name == f or (f.endswith("*") and name.startswith(f[:-1])) for f in self.fields)


@dataclass
class WeightedSum:
    """What :func:`weighted_sum` returns: per field ``Σ w_i x_i`` (float64, the field's
    shape), ``Σ w_i`` and the clients in the sum. ``secure`` says the engine computed it
    under masks; ``failed`` says why a secure aggregation produced no sum (too few
    survivors), in which case ``contributors`` is empty and ``disclosed`` lists the
    clients whose sum the server could still learn (it failed after their self-mask
    shares were asked for: late reveals would complete them)."""

    kind: str
    totals: dict[str, np.ndarray]
    weight: float
    contributors: list[int]
    secure: bool = False
    failed: str | None = None
    disclosed: list[int] = field(default_factory=list)

    def mean(self) -> dict[str, np.ndarray] | None:
        """``Σ w_i x_i / Σ w_i`` per field, or ``None`` when nothing (or zero weight) was summed."""
        if not self.contributors or not self.weight:
            return None
        return {k: v / self.weight for k, v in self.totals.items()}


class Replies(dict):
    """The ``replies`` a server's ``step`` gets when the engine aggregated securely or handed
    it old replies: a plain mapping of the replies (declared fields removed) plus ``sums``,
    kind -> :class:`WeightedSum`, and ``ages``, client -> the age in rounds of its reply (0:
    this round's; more: a missing client's last reply, under ``faults.stale_replies``)."""

    def __init__(self, *args, sums: dict[str, WeightedSum] | None = None, ages: dict[int, int] | None = None,
                 **kw):
        super().__init__(*args, **kw)
        self.sums: dict[str, WeightedSum] = dict(sums or {})
        self.ages: dict[int, int] = dict(ages) if ages is not None else dict.fromkeys(self, 0)


def summed_fields(msg: Message, spec: SecureSum) -> tuple[list[str], np.ndarray, float]:
    """The names (in message order) and float64 entries of ``spec``'s fields in ``msg``, and its weight."""
    names = [k for k in msg.fields if spec.covers(k)]
    parts = []
    for k in names:
        v = msg[k]
        if isinstance(v, (str, bool)) or v is None or (isinstance(v, np.ndarray) and v.dtype.kind not in "iuf"):
            raise ValueError(f"sum {msg.kind!r}: field {k!r} is not a number or numeric array")
        parts.append(np.asarray(v, dtype=np.float64).ravel())
    w = 1.0
    if spec.weight is not None:
        v = msg.get(spec.weight)
        if v is None or isinstance(v, (str, bool, np.ndarray)):
            raise ValueError(f"sum {msg.kind!r}: weight field {spec.weight!r} missing or not a number")
        w = float(v)
    return names, (np.concatenate(parts) if parts else np.zeros(0)), w


def weighted_sum(replies: Mapping[int, Message], spec: SecureSum) -> WeightedSum:
    """The weighted sum of ``spec``'s fields over the replies of kind ``spec.kind``.

    With secure aggregation on, the engine's sum (the replies hold no summed field);
    otherwise computed here from the plain replies. Either way in the same fixed-point
    code (:mod:`raymvc.fixedpoint`), so both give the same numbers, bit for bit.
    """
    sums = getattr(replies, "sums", None)
    if sums and spec.kind in sums:
        return sums[spec.kind]
    ids = sorted(c for c, m in replies.items() if m.kind == spec.kind)
    if not ids:
        return WeightedSum(spec.kind, {}, 0.0, [])
    acc = None
    for c in ids:
        try:
            names, x, w = summed_fields(replies[c], spec)
            code = encode_input(x, w, len(ids))
        except ValueError as e:
            raise ValueError(f"weighted_sum: client {c}'s {spec.kind!r} reply: {e}") from None
        if acc is None:
            first, shapes, acc = names, [np.shape(replies[c][k]) for k in names], code
            continue
        if names != first or [np.shape(replies[c][k]) for k in names] != shapes:
            raise ValueError(f"weighted_sum: the {spec.kind!r} replies of clients {ids[0]} and {c} "
                             "carry different summed fields")
        acc += code  # wraps around modulo 2^64, as the masked sum does
    vals = decode_fixed(acc)
    return WeightedSum(spec.kind, split(vals[:-1], first, shapes), float(vals[-1]), ids)


@dataclass(frozen=True)
class Protocol:
    """Registration record of one method.

    ``quick_params`` make a run on a tiny synthetic split finish in seconds (the
    conformance suite uses them). ``analytic_bytes(config, facts)``, where a method
    can state it, is the protocol traffic of a fault-free run in data bytes (array
    buffers and scalars, no framing: :func:`raymvc.channel.codec.data_bytes`); the
    conformance suite checks it against the ledger.
    """

    name: str
    config: type[ProtocolConfig]
    client: type[Client]
    server: type[Server]
    partition: str  # "vertical" or "horizontal": the split the method expects
    summary: str = ""
    paper: str = ""
    quick_params: dict[str, Any] = field(default_factory=dict)
    analytic_bytes: Callable[[Any, RunFacts], int] | None = None
    secure_sums: tuple[SecureSum, ...] = ()  # reply fields the server only needs summed (secure aggregation)
    # what it takes part in beyond plain rounds, by name (a fault kind's ``requires`` is checked
    # against it): "partial_work" -- its clients scale their local work by ctx.work
    # (faults.partial_work, a kind's work share); closed-form methods do not; "stale_replies" --
    # its server's step can use a missing client's last reply (faults.stale_replies), with
    # ``replies.ages[c]`` the age in rounds of client c's reply (0: this round's)
    supports: frozenset[str] = frozenset()
    # the kinds of server message it can send under faults.asynchronous (buffered rounds): such
    # a message goes only to clients with no update in flight, and ``step`` gets a buffer of
    # updates with ``replies.ages[c]`` = how many steps older than the current model the model
    # behind c's update is; a message of any other kind pre-empts the work in flight (those
    # updates are discarded) and goes to everyone at once. Empty: synchronous rounds only.
    async_kinds: tuple[str, ...] = ()
    # whether its server ends with a final model (``Done.final``) that faults.inference_round can
    # hand to every client; a scenario asking for that round of a method without one is refused
    final_model: bool = False
    # a centralised reference (method: kmeans, fcm): its data are always pooled at one party,
    # with no faults, as any horizontal method's under ``central: true``
    pooled: bool = False
    # whether ``central: true`` has a meaning for it: a horizontal method's rows, or a vertical
    # method's views side by side, pooled at one party that runs the method alone
    central_form: bool = True
