"""The round workflow: sample -> exchange -> secure-aggregation layer -> the method's step -> record.

:class:`RoundWorkflow` drives the protocol's server through its rounds. It decides whom a
round addresses (``faults.sampling``), hands the exchange the messages, lets the secure
aggregation layer turn masked replies into sums (or, without it, applies the same overflow
rule to the declared sums), stands last replies in for missing clients
(``faults.stale_replies``), calls ``Server.step`` and writes the round's record. Under
``faults.asynchronous`` a round is one buffered step instead: the messages go to the
clients that are free, and the step takes the first updates to arrive. It also
runs the two exchanges after the last round: the inference round and the evaluation path.
How a message travels is the exchange's business (:mod:`raymvc.runtime.exchange`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from ..channel import codec
from ..fixedpoint import check_input
from ..messages import Done, Message
from ..protocol import NoInput, Replies, summed_fields
from ..scenario import AsyncCfg
from ..selection import Seen
from .exchange import SERVER, Exchange, RoundState
from .failures import TRACEBACK_LIMIT, cut_line, one_line, party_error
from .faults import FaultPlan, Injector
from .records import RoundRecord, ServerState
from .threads import pin_threads

if TYPE_CHECKING:
    from .secure import ServerLayer

EVAL_PREDICT = "eval.predict"  # engine-reserved kinds: the evaluation path
EVAL_LABELS = "eval.labels"


class RoundWorkflow:
    """One protocol server's rounds over one exchange; ``state`` is shared with the exchange."""

    def __init__(self, server, exchange: Exchange, *, secure: ServerLayer | None,
                 secure_sums: tuple, stale_max: int, client_ids: list[int], threads: int,
                 buffered: AsyncCfg | None = None, async_kinds: tuple[str, ...] = (), score_every: int = 0):
        self.server, self.exchange = server, exchange
        self.plan: FaultPlan = exchange.plan
        self.state: ServerState = exchange.state
        self.faults = Injector(self.plan)
        self.secure = secure
        # without secure aggregation, the declared sums' inputs pass the same overflow rule (see _check_sums)
        self.plain_sums = {s.kind: s for s in secure_sums or ()} if secure is None else {}
        self.stale_max = stale_max
        self.buffered, self.async_kinds = buffered, async_kinds  # faults.asynchronous
        self.client_ids = client_ids
        self.threads = threads
        self.score_every = score_every  # runtime.score_every
        self.sub = 0  # exchanges of the current round so far, after the first

    def begin(self) -> None:
        pin_threads(self.threads)
        if self.secure is not None:  # key set-up, like the handshake free of injected faults
            st = RoundState()
            self.secure.setup(lambda out: self._extra(self.state.round, out, Injector(None), st))
            self._blame_senders(self.state.round, st)
            self.state.counts.client_errors += len(st.errors)
            self.state.counts.rejected_messages += len(st.rejected)
        self.state.outgoing = self.server.start()

    def _extra(self, r: int, outgoing: dict[int, Message], faults: Injector, into: RoundState | None) -> RoundState:
        """An exchange besides the round's first (secure aggregation's); its faults count in ``into``."""
        st, self.state.clock = self.exchange.run(r, outgoing, "protocol", faults)
        if into is not None:
            into.absorb(st)
        return st

    def run_round(self) -> RoundRecord:
        """Exchange the pending messages, let the protocol step, report the round."""
        state = self.state
        r, t0, wall = state.round, state.clock, time.perf_counter()
        ledger_mark = len(self.exchange.ledger.rows)
        if self.buffered is not None and all(m.kind in self.async_kinds for m in state.outgoing.values()):
            st, addressed, waited_on, answered, buffered = self._buffered_exchange(r)
            not_sampled, sums, replied = [], None, sorted(st.replies)
            stale = {c: a for c, a in st.replies.ages.items() if a}
        else:
            # under faults.asynchronous a message of another kind (a final model) pre-empts the
            # work in flight: those updates are dropped, and the round is a synchronous one
            pre_empted = sorted(state.in_flight)
            state.in_flight.clear()
            addressed, not_sampled = self._sample(r, state.outgoing)
            st, state.clock = self.exchange.run(r, addressed, "protocol", self.faults, compute=True)
            answered = len(st.replies) + len(st.acked)  # to the round's request, whatever secure aggregation adds
            sums = self._aggregate(r, st)
            self._tally(r, addressed, st)
            replied = sorted(st.replies)  # this round's answers (old replies that stand in are not among them)
            stale = self._stand_in(r, st) if self.stale_max else None
            waited_on = len(addressed)
            buffered = None if self.buffered is None else {"sent": sorted(addressed), "in_flight": [],
                                                           "discarded": pre_empted}
        self._step(r, st, waited_on, answered, not_sampled)
        rows = self.exchange.ledger.rows[ledger_mark:]
        record = RoundRecord(
            round=r, replied=replied, missing=sorted(st.missing), dropped=st.dropped, late=st.late,
            rejected=st.rejected, crashed=st.crashed, client_errors=sorted(st.errors), messages=len(rows),
            wire_bytes=sum(x.wire_bytes for x in rows), payload_bytes=sum(x.payload_bytes for x in rows),
            partial_work=self._partial(r, addressed, st), not_sampled=not_sampled, stale=stale,
            virtual_start_s=t0, virtual_end_s=state.clock, buffered=buffered,
            client_s=dict(sorted(st.times.items())) if self.exchange.devices is not None else None,
            secure_sums=sums, kinds=self.plan.kind_records(r), wall_s=time.perf_counter() - wall,
            info=dict(self.server.info), done=state.ended(), error=state.error)
        self.server.info = {}
        if self.score_every and (r + 1) % self.score_every == 0 and not state.ended():
            record.probe = probe(self.server, self.exchange, r, self.threads)
        return record

    def _buffered_exchange(self, r: int) -> tuple[RoundState, dict[int, Message], int, int, dict[str, list[int]]]:
        """``faults.asynchronous``: send the round's messages to the clients with no update on
        its way, then take updates in order of virtual arrival until the buffer holds
        ``buffer`` of them (or nothing is left on its way), discarding any more than
        ``max_staleness`` steps old; the clock moves to the last one taken, and no deadline
        applies."""
        state, flying = self.state, self.state.in_flight
        t0, outgoing = state.clock, state.outgoing
        sent = {c: m for c, m in outgoing.items() if c not in flying}
        st, _ = self.exchange.run(r, sent, "protocol", self.faults.without_deadline(), compute=True)
        self._tally(r, sent, st)
        if self.plain_sums:  # an update the ring cannot hold is its sender's error, never buffered
            self._check_sums(r, st)
        for cid in [c for c, (arrive, _, _) in flying.items() if c in state.crashed and arrive > t0]:
            del flying[cid]  # crashed before its update left
        waiting = len(flying) + len(sent)
        for cid, msg in st.replies.items():
            flying[cid] = (st.arrivals[cid], r, msg)
        taken: dict[int, Message] = {}
        ages: dict[int, int] = {}
        discarded = []
        for cid, (arrive, sent_in, msg) in sorted(flying.items(), key=lambda kv: (kv[1][0], kv[0])):
            if len(taken) >= self.buffered.buffer:
                break
            state.clock = max(state.clock, arrive)
            del flying[cid]
            if r - sent_in > self.buffered.max_staleness:
                discarded.append(cid)
                continue
            taken[cid], ages[cid] = msg, r - sent_in
        st.replies = Replies(taken, ages=ages)
        info = {"sent": sorted(sent), "in_flight": sorted(flying), "discarded": sorted(discarded)}
        return st, sent, waiting, len(taken) + len(st.acked), info

    def _aggregate(self, r: int, st: RoundState) -> list[dict] | None:
        """Secure aggregation's extra exchanges and sums (what the round record says of them), or,
        without it, the overflow rule on the declared sums."""
        if self.secure is None:
            if self.plain_sums:
                self._check_sums(r, st)
            return None
        self.sub = 0

        def extra(out: dict[int, Message]) -> RoundState:
            self.sub += 1
            return self._extra(r, out, self.faults.at(self.sub), st)

        self.secure.aggregate(st, extra)
        if self.sub == 0:  # no secure sum this round: who would have left later leaves now
            leave_after_first(self.plan, r, st)
        self._blame_senders(r, st)
        return [{"kind": s.kind, "contributors": list(s.contributors), "failed": s.failed,
                 "disclosed": list(s.disclosed)} for s in getattr(st.replies, "sums", {}).values()]

    def _sample(self, r: int, outgoing: dict[int, Message]) -> tuple[dict[int, Message], list[int]]:
        """The messages sent in round ``r`` under ``faults.sampling``, and the clients left out."""
        chosen = select_clients(self.plan, self.state, self.exchange.devices, r, outgoing)
        if chosen is None:
            return outgoing, []
        return {c: m for c, m in outgoing.items() if c in chosen}, sorted(c for c in outgoing if c not in chosen)

    def _partial(self, r: int, addressed: dict[int, Message], st: RoundState) -> list[int]:
        """The clients that acted on the round's message with only part of their local work."""
        acted = set(addressed) - set(st.dropped) - set(st.crashed) - self.state.crashed - set(self.state.offline)
        return sorted(c for c in acted if self.plan.work(r, c) < 1.0)

    def _blame_senders(self, r: int, st: RoundState) -> None:
        """Malformed secure-aggregation messages: each is its sender's error (never the
        driver's or an honest peer's); the aggregation went on without them."""
        for cid, why in sorted(self.secure.blame().items()):
            st.errors[cid] = cut_line(why)
            self.state.client_errors.append({"round": r, "client": cid, "path": "secagg", "error": st.errors[cid]})

    def _check_sums(self, r: int, st: RoundState) -> None:
        """Without secure aggregation, the one overflow rule of declared sums
        (:func:`raymvc.fixedpoint.encode_input` over all the run's clients, as a masking client
        applies it): a reply whose input the ring cannot hold is its sender's error and is left
        out of the round, as secure aggregation leaves it out of the sum; the round goes on."""
        n = len(self.client_ids)
        for cid in sorted(st.replies):
            spec = self.plain_sums.get(st.replies[cid].kind)
            if spec is None:
                continue
            try:
                _names, x, w = summed_fields(st.replies[cid], spec)
                check_input(x, w, n)
            except ValueError as e:
                del st.replies[cid]
                st.missing.add(cid)
                st.errors[cid] = cut_line(f"sum {spec.kind!r}: {one_line(e)}")
                self.state.client_errors.append({"round": r, "client": cid, "path": "sum", "error": st.errors[cid]})

    def _stand_in(self, r: int, st: RoundState) -> dict[int, int]:
        """``faults.stale_replies``: keep this round's replies as each client's last, and hand
        ``step`` the last reply of every client that did not answer (missing, not asked, or
        crashed) while it is at most ``stale_max`` rounds old; ``replies.ages`` says how old."""
        last = self.state.last_replies
        for cid, msg in st.replies.items():
            last[cid] = (r, msg)
        ages = dict.fromkeys(st.replies, 0)
        stood_in = {}
        for cid, (when, msg) in sorted(last.items()):
            if cid not in st.replies and 0 < r - when <= self.stale_max:
                stood_in[cid] = msg
                ages[cid] = r - when
        st.replies = Replies({**st.replies, **stood_in}, ages=ages)
        return {c: ages[c] for c in stood_in}

    def _tally(self, r: int, addressed: dict[int, Message], st: RoundState) -> None:
        counts = self.state.counts
        counts.dropped_replies += len(st.dropped)
        counts.late_replies += len(st.late)
        counts.rejected_messages += len(st.rejected)
        counts.client_errors += len(st.errors)
        for cid in addressed:
            p = self.state.participation[cid]
            p.addressed += 1
            if cid in st.times:  # what its last answer took, late or not (client selection reads it)
                p.last_s = float(st.times[cid])
            if cid in st.replies or cid in st.acked:
                p.replied += 1
                p.last_replied = r
            else:
                p.missed += 1

    def _step(self, r: int, st: RoundState, addressed: int, answered: int,
              not_sampled: tuple[int, ...] | list[int] = ()) -> None:
        state = self.state
        if addressed and answered < min(self.plan.cfg.min_clients, addressed):
            state.status = "failed"
            state.error = (f"round {r}: {answered} of {addressed} clients replied, "
                           f"fewer than faults.min_clients = {self.plan.cfg.min_clients}")
            if st.timed_out:  # the usual cause of a long local step: say which setting it met
                state.error += (f"; {len(st.timed_out)} did not answer within runtime.reply_timeout_s = "
                                f"{self.exchange.transport.timeout_s:g} s of wall time (raise it for long local work)")
            return
        pin_threads(self.threads)
        try:
            result = self.server.step(r, st.replies, set(st.missing) | set(not_sampled))
        except NoInput as e:  # the injected faults left the method nothing to work with: a failure
            state.status, state.error = "failed", f"round {r}: {one_line(e)}"
            return
        except (Exception, SystemExit) as e:  # sys.exit in the method's code is its error, too
            state.status = "error"
            state.errors.append(party_error(SERVER, "step", r, e))
            state.error = f"server step {r} raised {one_line(e)}"
            return
        if isinstance(result, Done):
            state.done, state.status = result, "finished"
        else:
            state.outgoing = result
            state.round += 1

    # -- after the last round ------------------------------------------------
    def inference_round(self, r: int, final: Message) -> dict:
        """``faults.inference_round``: the server's final model to every client available in
        round ``r`` (the one after the last), metered with the protocol's traffic and subject
        to the scenario's faults; replies are not read. Returns what the summary says of it."""
        out = {c: final for c in self.exchange.live()}  # encoded once (same content)
        # one exchange and no secure sum: the round's whole dropout rate, as without the layer
        st, self.state.clock = self.exchange.run(r, out, "protocol", self.faults.single())
        self.state.crashed.update(st.crashed)
        self._tally(r, out, st)
        return {"round": r, "addressed": len(out), "reached": len(set(st.replies) | st.acked),
                "missing": sorted(st.missing), "crashed": sorted(st.crashed)}

    def collect_predictions(self) -> dict[int, np.ndarray]:
        """The evaluation path: ask every live client for its own labels (metered apart, no
        faults, the virtual clock left where the run ended)."""
        alive = self.exchange.live()
        st, _ = self.exchange.run(self.state.round, {c: Message(EVAL_PREDICT) for c in alive}, "eval", Injector(None))
        self.state.crashed.update(st.crashed)
        return {c: np.asarray(m["y"]) for c, m in st.replies.items() if "y" in m.fields}


def select_clients(plan: FaultPlan, state: ServerState, devices, r: int, outgoing: dict) -> set[int] | None:
    """Who is asked in round ``r`` under ``faults.sampling`` (None: everyone), as its rule
    (:mod:`raymvc.selection`) chooses from what the server saw: each client's participation
    so far and, with device profiles, the speed each device reported."""
    if plan.cfg.sampling is None:
        return None
    candidates = [c for c in outgoing if c not in state.offline and c not in state.crashed]
    seen = {c: Seen(asked=p.addressed, answered=p.replied, missed=p.missed, last_answered=p.last_replied,
                    last_s=p.last_s) for c, p in state.participation.items() if p.addressed}
    speed = {c: devices.compute_s(c) for c in candidates} if devices is not None else None
    return plan.sampled(r, candidates, seen, speed)


def leave_after_first(plan: FaultPlan, r: int, st: RoundState) -> None:
    """A round without a secure sum has one exchange: a client drawn to leave in a later
    one goes before its answer arrives, so the round loses it at the whole rate."""
    for cid in sorted(set(st.replies) | st.acked):
        if plan.leaves_at(r, cid) not in (None, 0):
            st.replies.pop(cid, None)
            st.acked.discard(cid)
            st.dropped.append(cid)
            st.missing.add(cid)


def probe(server, exchange: Exchange, r: int, threads: int) -> dict[int, np.ndarray | None] | None:
    """``runtime.score_every``: each live client's labels with ``server.current_model()``,
    worked out on a copy of the client (off the record: no ledger row, no virtual time, no
    fault). ``None`` while the method has no model yet; a client or server that raises here,
    or labels of the wrong length, is an error of that party like any other."""
    state = exchange.state
    pin_threads(threads)
    try:
        model = server.current_model()
    except (Exception, SystemExit) as e:
        state.errors.append(party_error(SERVER, "current_model", r, e))
        return None
    if model is None:
        return None
    if not isinstance(model, Message):
        e = TypeError(f"current_model() returned {type(model).__name__}, not a Message (or None)")
        state.errors.append(party_error(SERVER, "current_model", r, e))
        return None
    out = exchange.transport.probe(exchange.live(), codec.encode(model, exchange.channel.float_dtype))
    sizes = server.ctx.client_sizes or {}
    labels = {}
    for cid, (status, value, trace) in sorted(out.items()):
        if status == "ok" and value is not None and cid in sizes and len(value) != sizes[cid]:
            status, value, trace = "error", f"predict(): {len(value)} labels for {sizes[cid]} rows", None
        if status == "ok":
            labels[cid] = value
            continue
        error = {"round": r, "client": cid, "path": "probe", "error": cut_line(value)}
        if trace:
            error["traceback"] = trace[:TRACEBACK_LIMIT]
        state.client_errors.append(error)
    return labels
