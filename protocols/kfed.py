"""k-FED: one-shot federated k-means (the reference row for horizontal splits).

Horizontal setting: client ``l`` holds ``n_l`` rows ``X_l`` (``n_l x d``) of one view;
``k`` clusters.

Exchange (two rounds)
---------------------
* round 0: the server asks every client for its local summary; each client runs
  k-means with ``k'`` clusters (``k_local``, default ``k``; at most ``n_l``) on its raw
  rows and sends the ``k' x d`` centroids and the ``k'`` cluster sizes.
* round 1: the server runs k-means (``k`` clusters) over the union of all received local
  centroids, weighted by their cluster sizes when ``weighted`` is set, and sends the
  ``k x d`` global centroids to every client. Each client keeps them and acknowledges
  with an empty message; the run then ends.

Final labels: each client labels its own rows by the nearest global centroid in its
``predict()``, which the engine calls on the evaluation path only. The server never
sees a label or a data row.

Missing replies
---------------
A client whose round-0 summary is missing (dropped, late, crashed) is left out of the
first global k-means, but not for good: with the global centroids of round 1 every
other client gets, it gets ``"summarise"`` again, carrying the current global
centroids (so it can label its rows even if its answer is lost). Whenever new summaries
arrive, the server reruns the global k-means over all summaries it holds (seeded for
that round), numbers the new centroids like the old ones (Hungarian matching on their
distances, so a client whose copy of the new ones is lost labels consistently with the
rest), sends them to every client that has summarised, and asks the
clients still lacking once more, up to ``retry_rounds`` times. The run ends in the
first round after round 0 that brings no new summary, so clients that never answer
(disconnected, crashed) cost a few small messages, never a round of their own. Without faults
nothing changes: two rounds. A client that never receives any centroids
(disconnected, or every message to it was dropped) cannot label its rows: its samples
stay unlabelled (``-1``) and count as wrong.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from pydantic import Field
from sklearn.metrics import pairwise_distances_argmin

from raymvc.messages import Done, Message
from raymvc.protocol import (
    Client,
    ClientContext,
    NoInput,
    Protocol,
    ProtocolConfig,
    RunFacts,
    Server,
    ServerContext,
    not_stated,
    project_option,
)

from ._common import kmeans_capped


class Config(ProtocolConfig):
    # k-FED's own paper (Dennis et al., ICML 2021) is not among this project's papers, so no
    # value below is marked as the paper's; the reasons say where each one comes from.
    k_local: int | None = Field(default=None, ge=1, description="k', local clusters per client (default k)",
                                **not_stated("k' = k, the most clusters a client can hold: a split does not tell a "
                                             "client how many classes it has (k-FED's abstract: heterogeneity helps "
                                             "when k' <= √k)"))
    weighted: bool = Field(default=True, description="weight local centroids by their cluster sizes on the server",
                           **not_stated("on: a centroid of many rows counts for them, as in k-means over the "
                                        "pooled rows (the method's spec: the server clusters all centroids)"))
    kmeans_init: int = Field(default=10, ge=1, description="k-means restarts (client and server)",
                             **not_stated("10 starts, scikit-learn's usual number"))
    max_iter: int = Field(default=300, ge=1, description="Lloyd iterations of each k-means restart, at most",
                          **not_stated("300, scikit-learn's cap on Lloyd iterations"))
    retry_rounds: int = Field(default=2, ge=0, description="rounds in which a client whose summary is missing is asked again",
                              **project_option("2 retries; without faults no retry happens"))
    patience: int = Field(default=1, ge=1, le=1000,
                          description="rounds in a row without a new summary before the run ends while a client "
                                      "still lacks its summary or the latest centroids; above 1 every such "
                                      "round asks the lacking clients again and resends the centroids to those "
                                      "not known to hold them (retry_rounds no longer caps it)",
                          **project_option("1: the run ends in the first round that brings nothing new; a "
                                           "remedy for on/off bursts (studies/robustness.md, Remedies)"))


def local_summary(X: np.ndarray, k_local: int, rng: np.random.Generator, n_init: int = 10,
                  max_iter: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """k-means on the rows of ``X`` -> (centroids ``k' x d``, cluster sizes ``k'``).

    ``k'`` is capped at the number of distinct rows; empty clusters are dropped.
    """
    if X.shape[0] == 0:
        return np.zeros((0, X.shape[1])), np.zeros(0, dtype=np.int64)
    C, labels = kmeans_capped(X, k_local, rng, n_init, max_iter, pad=False)
    counts = np.bincount(labels, minlength=len(C)).astype(np.int64)
    keep = counts > 0
    return C[keep], counts[keep]


def global_centroids(centroids: np.ndarray, counts: np.ndarray | None, k: int, rng: np.random.Generator,
                     n_init: int = 10, max_iter: int = 300) -> np.ndarray:
    """k-means over all local centroids (optionally weighted) -> ``k x d`` global centroids.

    With fewer than ``k`` distinct local centroids, the missing global centroids repeat
    existing ones (they then simply never win a sample).
    """
    w = None if counts is None else np.asarray(counts, dtype=np.float64)
    return kmeans_capped(centroids, k, rng, n_init, max_iter, sample_weight=w)[0]


def nearest(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Index of the nearest row of ``C`` (Euclidean) for every row of ``X``."""
    return pairwise_distances_argmin(X, C)


# ---------------------------------------------------------------------------
class KFedClient(Client):
    def __init__(self, config: Config, shard, ctx: ClientContext):
        super().__init__(config, shard, ctx)
        self.X = np.asarray(shard.X, dtype=np.float64)
        self.k_local = config.k_local or ctx.n_clusters
        self.C: np.ndarray | None = None

    def handle(self, msg: Message) -> Message | None:
        if msg.kind == "summarise":
            cfg = self.config
            if "C" in msg:  # asked again: the current global centroids come along
                self.C = np.asarray(msg["C"], dtype=np.float64)
            C, counts = local_summary(self.X, self.k_local, self.ctx.rng_for("summary"), cfg.kmeans_init, cfg.max_iter)
            return Message("local_centroids", C=C, counts=counts)
        if msg.kind == "global_centroids":
            self.C = np.asarray(msg["C"], dtype=np.float64)
            return Message("ack")
        raise ValueError(f"kfed client: unexpected message {msg.kind!r}")

    def predict(self) -> np.ndarray | None:
        if self.C is None:
            return None  # no global centroids received: its rows stay unlabelled
        return nearest(self.X, self.C)


class KFedServer(Server):
    def __init__(self, config: Config, ctx: ServerContext):
        super().__init__(config, ctx)
        self.C: np.ndarray | None = None
        self.summaries: dict[int, Message] = {}
        self.version = 0  # how often the global centroids changed
        self.sent: dict[int, int] = {}  # the centroids' version in the last message to each client (patience)
        self.holds: dict[int, int] = {}  # the version each client answered, i.e. holds
        self.quiet = 0  # rounds in a row without a new summary (patience)

    def start(self) -> dict[int, Message]:
        return {c: Message("summarise") for c in self.ctx.client_ids}

    def _global(self, round: int) -> None:
        """Global k-means over every summary held, in client order."""
        senders = sorted(self.summaries)
        cents = np.vstack([np.asarray(self.summaries[c]["C"], dtype=np.float64) for c in senders])
        counts = np.concatenate([np.asarray(self.summaries[c]["counts"], dtype=np.float64) for c in senders])
        cfg = self.config
        C = global_centroids(cents, counts if cfg.weighted else None, self.ctx.n_clusters,
                             self.ctx.rng_for("global_kmeans", round), cfg.kmeans_init, cfg.max_iter)
        if self.C is not None:  # keep cluster numbers: a client still holding the old centroids stays consistent
            from scipy.optimize import linear_sum_assignment

            cost = ((self.C[:, None, :] - C[None, :, :]) ** 2).sum(-1)
            _, order = linear_sum_assignment(cost)
            C = C[order]
        self.C = C
        self.version += 1

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        # a client without rows summarises to nothing: it counts as answered, adds no centroid
        new = sorted(c for c, m in replies.items() if m.kind == "local_centroids" and c not in self.summaries)
        self.summaries.update({c: replies[c] for c in new})
        useful = [c for c in new if len(replies[c]["C"])]
        if self.C is None and not useful:
            raise NoInput("kfed: no client delivered local centroids")
        if useful:
            self._global(round)
        for c in replies:  # an answer shows the last message arrived, with its centroids
            if c in self.sent:
                self.holds[c] = self.sent[c]
        lacking = [c for c in self.ctx.client_ids if c not in self.summaries]
        waiting = self.config.patience > 1
        ask = lacking if round < self.config.retry_rounds or waiting else []
        if round == 0:
            cents = sum(len(m["C"]) for m in self.summaries.values())
            self.info = {"senders": useful, "missing": sorted(missing), "local_centroids": int(cents), "asked_again": ask}
        else:
            self.info = {"acknowledged": sorted(c for c, m in replies.items() if m.kind == "ack"),
                         "joined": useful, "missing": sorted(missing), "asked_again": ask}
        if not useful:  # nothing new (round >= 1)
            return self._wait() if waiting else self._done()
        self.quiet = 0
        # new centroids for everyone who has summarised (round 0: for everyone not asked again)
        out = {c: Message("global_centroids", C=self.C) for c in self.ctx.client_ids
               if c in self.summaries or (round == 0 and c not in ask)}
        out.update({c: Message("summarise", C=self.C) for c in ask})
        return self._sending(out)

    def _sending(self, out: dict[int, Message]) -> dict[int, Message]:
        self.sent.update({c: self.version for c in out})
        return out

    def _wait(self) -> dict[int, Message] | Done:
        """``patience`` > 1 and a round without a new summary: end after ``patience`` such rounds
        in a row, or at once when every client has summarised and holds the latest centroids;
        else ask the lacking clients again and resend the centroids to those not known to
        hold them."""
        self.quiet += 1
        lacking = [c for c in self.ctx.client_ids if c not in self.summaries]
        behind = [c for c in sorted(self.summaries) if self.holds.get(c, -1) < self.version]
        if self.quiet >= self.config.patience or not (lacking or behind):
            return self._done()
        out = {c: Message("global_centroids", C=self.C) for c in behind}
        out.update({c: Message("summarise", C=self.C) for c in lacking})
        self.info["waiting"] = self.quiet
        return self._sending(out)

    def _done(self) -> Done:
        """The end; the global centroids are the final model (``faults.inference_round``)."""
        return Done(labels=None, info={"global_centroids": int(len(self.C))},
                    final=Message("global_centroids", C=self.C))

    def result(self) -> Done | None:
        if self.C is None:
            return None  # no global centroids yet
        return self._done()


def analytic_bytes(config: Config, facts: RunFacts) -> int:
    """Protocol data bytes of a fault-free run: per client ``k' x d`` centroids and ``k'``
    int64 sizes up, ``k x d`` global centroids down (requests and acknowledgements are empty).

    Assumes every client finds ``k'`` non-empty clusters (``k'`` is capped at its rows).
    """
    total = 0
    for c in facts.client_ids:
        d = facts.client_dims[c]
        kl = min(config.k_local or facts.n_clusters, facts.client_sizes[c])
        total += kl * d * facts.float_bytes + kl * 8 + facts.n_clusters * d * facts.float_bytes
    return total


PROTOCOL = Protocol(
    name="kfed",
    config=Config,
    client=KFedClient,
    server=KFedServer,
    partition="horizontal",
    summary="one-shot federated k-means: local centroids up, k global centroids down",
    paper="D. K. Dennis, T. Li, V. Smith: Heterogeneity for the Win: One-Shot Federated Clustering (ICML 2021)",
    quick_params={"kmeans_init": 2},
    analytic_bytes=analytic_bytes,
    final_model=True,  # Done.final: the k global centroids (faults.inference_round)
)


PROTOCOL_KMEANS = Protocol(
    name="kmeans",
    config=Config,
    client=KFedClient,
    server=KFedServer,
    partition="horizontal",
    summary="centralised reference: k-means on the pooled rows at one party (k-FED with one client), no faults",
    paper="S. Lloyd: Least squares quantization in PCM (1982); the CCFC paper's KM column",
    quick_params={"kmeans_init": 2},
    analytic_bytes=analytic_bytes,
    final_model=True,
    pooled=True,
)

PROTOCOLS = {p.name: p for p in (PROTOCOL, PROTOCOL_KMEANS)}
