"""FFCM: one-shot federated fuzzy c-means, as the CCFC paper describes it (its baseline
beside k-FED in Tables 1 and 2).

The CCFC paper's account (Section 1 and 2): "in methods k-FED and FFCM, each client first
employs KM or FCM to extract local cluster centroids from their local data and then
transmit these centroids to the server, where these local centroids are merged into k
global cluster centroids through KM", and each client labels its data by the nearest
global centroid. FFCM's own paper (Stallmann and Wilbik, 2022) is not among this project's
papers; this module follows the account above, so it is the fuzzy counterpart of
:mod:`raymvc.protocols.kfed` and shares its exchange and its missing-reply policy.

Horizontal setting: client ``l`` holds ``n_l`` rows ``X_l`` of one view; ``k`` clusters.

Exchange (two rounds, as k-FED)
-------------------------------
* round 0: each client runs fuzzy c-means (Bezdek's FCM, scikit-fuzzy's ``cmeans``) with
  ``k'`` clusters (``k_local``, default ``k``; at most ``n_l``) and fuzzifier ``m`` on its
  rows, from a membership matrix drawn from its own stream, and sends the ``k' x d``
  centroids and each cluster's fuzzy size (the sum of its memberships).
* round 1: the server runs k-means (``k`` clusters) over all local centroids, weighted by
  their fuzzy sizes when ``weighted`` is set, and sends the ``k x d`` global centroids to
  every client, which labels its rows by the nearest one.

Missing replies: as k-FED (a client whose summary is missing is asked again with the
current global centroids, up to ``retry_rounds`` times).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from raymvc.messages import Message
from raymvc.protocol import ClientContext, Protocol, RunFacts, not_stated

from .kfed import Config as KFedConfig
from .kfed import KFedClient, KFedServer


class Config(KFedConfig):
    # the CCFC paper gives no FCM setting for its FFCM baseline; FFCM's own paper is not
    # among this project's papers, so no value below is marked as a paper's
    m: float = Field(default=1.1, gt=1.0, le=10.0, description="FCM's fuzzifier m (1: hard k-means; larger: fuzzier)",
                     **not_stated("m = 1.1, chosen on tuning seeds 100-104 over 1.1-2 on MNIST-10k and digits "
                                  "(studies/ffcm-tuning*.yaml: the smallest summed ACC gap to each data set's "
                                  "best); the textbook m = 2 pulls every centroid to the mean in these dimensions"))
    fcm_tol: float = Field(default=1e-5, gt=0.0, le=1.0, description="FCM stops when no membership moves more "
                                                                     "than this",
                           **not_stated("1e-5: memberships settled to five digits"))
    fcm_max_iter: int = Field(default=300, ge=1, le=100_000, description="FCM iterations at most",
                              **not_stated("300, as the k-means cap (k-FED's max_iter)"))


def fuzzy_summary(X: np.ndarray, k_local: int, m: float, rng: np.random.Generator, tol: float = 1e-5,
                  max_iter: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Fuzzy c-means on the rows of ``X`` -> (centroids ``k' x d``, fuzzy sizes ``k'``).

    ``k'`` is capped at the number of distinct rows; the initial memberships are drawn
    from ``rng`` (no global random state is touched)."""
    from skfuzzy.cluster import cmeans

    n = X.shape[0]
    k = min(int(k_local), len(np.unique(X, axis=0))) if n else 0
    if k == 0:
        return np.zeros((0, X.shape[1])), np.zeros(0)
    if k == 1:
        return X.mean(axis=0, keepdims=True), np.array([float(n)])
    u0 = rng.random((k, n))
    u0 /= u0.sum(axis=0, keepdims=True)
    centroids, u, *_ = cmeans(X.T, k, m, error=tol, maxiter=max_iter, init=u0)
    return np.asarray(centroids, dtype=np.float64), np.asarray(u, dtype=np.float64).sum(axis=1)


class FFCMClient(KFedClient):
    def __init__(self, config: Config, shard, ctx: ClientContext):
        super().__init__(config, shard, ctx)

    def handle(self, msg: Message) -> Message | None:
        if msg.kind == "summarise":
            cfg = self.config
            if "C" in msg:  # asked again: the current global centroids come along
                self.C = np.asarray(msg["C"], dtype=np.float64)
            C, sizes = fuzzy_summary(self.X, self.k_local, cfg.m, self.ctx.rng_for("summary"), cfg.fcm_tol,
                                     cfg.fcm_max_iter)
            return Message("local_centroids", C=C, counts=sizes)
        return super().handle(msg)


def analytic_bytes(config: Config, facts: RunFacts) -> int:
    """Protocol data bytes of a fault-free run: per client ``k' x d`` centroids and ``k'``
    fuzzy sizes (float64) up, ``k x d`` global centroids down."""
    total = 0
    for c in facts.client_ids:
        d = facts.client_dims[c]
        kl = min(config.k_local or facts.n_clusters, facts.client_sizes[c])
        total += kl * d * facts.float_bytes + kl * 8 + facts.n_clusters * d * facts.float_bytes
    return total


PROTOCOL = Protocol(
    name="ffcm",
    config=Config,
    client=FFCMClient,
    server=KFedServer,
    partition="horizontal",
    summary="one-shot federated fuzzy c-means: local FCM centroids up, k global centroids (k-means) down",
    paper="FFCM as described in the CCFC paper (M. Stallmann, A. Wilbik: Towards federated clustering: a federated "
          "fuzzy c-means algorithm (FFCM), AAAI 2022 workshop)",
    quick_params={"kmeans_init": 2, "fcm_max_iter": 50},
    analytic_bytes=analytic_bytes,
    final_model=True,  # Done.final: the k global centroids (faults.inference_round)
)


PROTOCOL_FCM = Protocol(
    name="fcm",
    config=Config,
    client=FFCMClient,
    server=KFedServer,
    partition="horizontal",
    summary="centralised reference: fuzzy c-means on the pooled rows at one party (FFCM with one client), no faults",
    paper="J. C. Bezdek, R. Ehrlich, W. Full: FCM: the fuzzy c-means clustering algorithm (1984); the CCFC paper's "
          "FCM column",
    quick_params={"kmeans_init": 2, "fcm_max_iter": 50},
    analytic_bytes=analytic_bytes,
    final_model=True,
    pooled=True,
)

PROTOCOLS = {p.name: p for p in (PROTOCOL, PROTOCOL_FCM)}
