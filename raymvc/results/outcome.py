"""What a run's end becomes: its labels assembled from the parties' predictions, how it
ended (the status), its errors log and its summary (scores, traffic, faults, participation,
timing). Scope: the driver's results logic after the last round; the engine hands it the
run's end (:class:`raymvc.runtime.records.RunEnd`, read by attribute) and writes the files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

import numpy as np

from ..channel import Ledger
from ..metrics import clustering_scores, label_free_scores
from ..scenario import one_line as one_line_text
from .provenance import code_version, fingerprint, platform_info
from .status import Status

if TYPE_CHECKING:
    from ..runtime.records import RunEnd


def labels_problem(y, n: int, unlabelled: bool = False) -> str | None:
    """Why ``y`` cannot be ``n`` cluster labels (None if it can). With ``unlabelled`` (a
    server's ``Done``) -1 marks a sample the server has no label for (no client holding it
    answered); any other negative value is a problem."""
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        return f"{y.size if y.ndim != 1 else len(y)} labels (shape {y.shape}) for {n} samples"
    if y.dtype.kind not in "iu":
        return f"labels of type {y.dtype}, not integers"
    if n and y.min() < (-1 if unlabelled else 0):
        return f"negative label {y.min()}"
    return None


def assemble_labels(part, end: RunEnd) -> np.ndarray | None:
    """The final labels, checked: a server's ``Done`` labels of the wrong length or kind are
    the server's error (no labels), a client's wrong predictions that client's error (its
    rows stay -1)."""
    if end.labels is not None:
        problem = labels_problem(end.labels, part.n_samples, unlabelled=True)
        if problem is None:
            return np.asarray(end.labels).astype(np.int64)
        end.errors.append({"party": "server", "phase": "eval", "round": end.rounds,
                           "error": f"Done(labels=...): {problem}", "traceback": ""})
        return None
    if not end.predictions:
        return None
    return place(part, end.predictions, lambda c, problem: end.client_errors.append(
        {"round": end.rounds, "client": c, "path": "eval", "error": f"predict(): {problem}"}))


def place(part, preds: dict[int, np.ndarray | None], bad: Callable[[int, str], None] | None = None) -> np.ndarray:
    """Every client's labels at its rows, -1 where none: a client with no labels, or with
    labels that cannot be its rows' (``bad`` is told why), leaves its rows at -1."""
    y = np.full(part.n_samples, -1, dtype=np.int64)
    for c, p in sorted(preds.items()):
        if p is None:
            continue
        problem = labels_problem(p, len(part.rows[c]))
        if problem is None:
            y[part.rows[c]] = np.asarray(p, dtype=np.int64)
        elif bad is not None:
            bad(c, problem)
    return y


def code_errors(end: RunEnd) -> int:
    """How many times some party's code raised (server, driver, clients in any phase)."""
    return len(end.errors) + sum(not e.get("unreachable") for e in end.client_errors)


def final_status(end: RunEnd, labels: np.ndarray | None) -> str:
    """``interrupted`` (stopped by a signal), ``error`` (some party's code raised, in any
    phase), ``failed`` (the run could not finish), ``degraded`` (injected faults only) or
    ``completed``."""
    if end.status == Status.INTERRUPTED:
        return Status.INTERRUPTED.value
    if end.status == Status.ERROR or code_errors(end):
        return Status.ERROR.value
    if end.status == Status.FAILED or labels is None:
        return Status.FAILED.value
    troubled = end.crashed or end.disconnected or end.counts.any()
    return (Status.DEGRADED if troubled else Status.COMPLETED).value


def errors_log(end: RunEnd) -> str:
    """``errors.log``: every error of every party in full, in the order they happened."""
    parts = []
    for e in end.errors:
        head = f"== {e['party']}, {e['phase']}, round {e['round']}: {e['error']}"
        parts.append(head + ("\n" + e["traceback"].rstrip() if e.get("traceback") else ""))
    for e in end.client_errors:
        head = f"== client {e['client']}, {e['path']}, round {e['round']}: {first_line(e['error'] or '', 10**4)}"
        body = e.get("traceback") or (e["error"] if "\n" in (e["error"] or "") else "")
        parts.append(head + ("\n" + body.rstrip() if body else ""))
    return "\n\n".join(parts) + "\n" if parts else ""


def error_lines(end: RunEnd) -> list[str]:
    """One bounded line per error, for ``summary.json``."""
    lines = [f"{e['party']} {e['phase']} round {e['round']}: {e['error']}" for e in end.errors]
    lines += [f"client {e['client']} {e['path']} round {e['round']}: {first_line(e['error'] or '')}"
              for e in end.client_errors if not e.get("unreachable")]
    return [first_line(x) for x in lines]


def first_line(text: str, limit: int = 300) -> str:
    lines = str(text).strip().splitlines()
    return one_line_text(lines[0] if lines else "", limit)


def participation(end: RunEnd) -> dict[int, dict]:
    """Each client's rounds addressed, answered, missed and its last answered round (what the
    server keeps for client selection besides, ``last_s``, stays out of the summary)."""
    return {c: {k: v for k, v in asdict(p).items() if k != "last_s"} for c, p in sorted(end.participation.items())}


def secagg_totals(ledger: Ledger, kinds) -> dict:
    """Totals of the secure-aggregation layer's own messages, part of ``communication``."""
    sub = Ledger()
    sub.extend(r for r in ledger.rows if r.kind in kinds)
    return sub.totals("protocol")


def final_scores(sc, ds, proto, labels) -> tuple[dict | None, dict | None]:
    """The scores of ``labels`` over all rows, and over the labelled ones where some are not."""
    metrics = metrics_labelled = None
    kappa = proto.partition == "horizontal"
    if labels is not None and not ds.has_labels:  # unlabelled data: label-free scores only
        metrics = label_free_scores(ds, labels, seed=sc.seed)
    elif labels is not None:
        metrics = clustering_scores(ds.labels, labels, kappa=kappa)
        has = labels >= 0
        if 0 < has.sum() < len(labels):  # some clients could not label: score the rest apart
            metrics_labelled = clustering_scores(ds.labels[has], labels[has], kappa=kappa)
    return metrics, metrics_labelled


def probe_scores(sc, ds, part, proto, probe: dict[int, np.ndarray | None]) -> dict:
    """``runtime.score_every``: a round's probe labels scored as a run's final labels are
    (over all rows, -1 where a client had no label), with the labelled share."""
    y = place(part, probe)  # wrong labels were that client's error in the round already
    metrics, _ = final_scores(sc, ds, proto, y)
    return {**metrics, "labelled": float(np.mean(y >= 0)) if len(y) else 0.0}


def summarise(sc, ds, part, proto, end: RunEnd, labels, ray_init_s, protocol_s, wall_s, out, *, central: bool,
              secagg_kinds) -> dict:
    """``summary.json`` of a run (``central``: a centralised reference; ``secagg_kinds``: the
    message kinds of the secure-aggregation layer, counted apart)."""
    metrics, metrics_labelled = final_scores(sc, ds, proto, labels)
    ledger = end.ledger if end.ledger is not None else Ledger()
    return {
        "name": sc.name,
        "method": sc.method,
        "dataset": ds.name,
        "partition": part.kind,
        "n_samples": part.n_samples,
        "n_clients": part.n_clients,
        "n_clusters": ds.n_clusters,
        "seed": sc.seed,
        "backend": sc.runtime.backend,
        "status": final_status(end, labels),
        "error": end.error or (error_lines(end)[0] if code_errors(end) else None),
        "errors": error_lines(end),
        "fingerprint": fingerprint(sc, ds.source),
        "code_version": code_version(sc.method),
        "platform": platform_info(),
        "rounds": end.rounds,
        "metrics": metrics,
        "unlabelled_samples": int(np.sum(labels < 0)) if labels is not None else part.n_samples,
        "metrics_labelled": metrics_labelled,
        "communication": ledger.totals("protocol"),
        "communication_eval": ledger.totals("eval"),
        "communication_setup": ledger.totals("setup"),
        "communication_secagg": secagg_totals(ledger, secagg_kinds),
        "per_client_bytes": ledger.per_client("protocol"),
        "participation": participation(end),
        "faults": {
            "dropped_replies": end.counts.dropped_replies,
            "late_replies": end.counts.late_replies,
            "crashed_clients": list(end.crashed),
            "rejected_messages": end.counts.rejected_messages,
            "disconnected_clients": list(end.disconnected),
            "evicted_clients": list(end.evicted),
            "client_errors": [{k: v for k, v in e.items() if k != "traceback"} for e in end.client_errors],
        },
        "timing": {
            "wall_s": wall_s,
            "ray_init_s": ray_init_s,
            "protocol_s": protocol_s,
            "virtual_s": end.virtual_s,
            "client_compute_s": end.compute_s,
        },
        "protocol_info": end.info,
        "data_info": part.info,
        "out_dir": str(out),
        **({"central": True} if central else {}),  # the centralised reference: pooled, no faults
    }


