"""Federated Lloyd k-means: a complete method outside the package, in one file.

Run it (from this folder, so that ``fedlloyd`` is importable)::

    raymvc run fedlloyd.yaml --backend local

Horizontal split: client ``l`` holds rows ``X_l``; ``k`` clusters.

* round 0: every client runs k-means on its own rows and sends the ``k`` local
  centroids (means of its rows, never the rows themselves -- though a local cluster of
  one row has that row as its mean) with their counts; the server keeps ``k`` of the
  pooled candidates by farthest-point selection, starting from the most populous.
* round r >= 1: the server sends the centroids ``C``; each client assigns its rows to
  the nearest centroid and answers with the per-cluster sums and counts; the server
  sets ``C = sums / counts`` (an empty cluster keeps its centroid) and stops when no
  centroid moves by more than ``tol`` or after ``max_rounds``.

Missing replies: the update uses the clients whose reply arrived; a round with no
reply keeps ``C``. Each client labels its rows by the last ``C`` it received.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from pydantic import Field

from raymvc.messages import Done, Message
from raymvc.protocol import Client, Protocol, ProtocolConfig, Server, seed_from


class Config(ProtocolConfig):
    max_rounds: int = Field(default=20, ge=1, description="Lloyd rounds after the start")
    tol: float = Field(default=1e-4, ge=0.0, description="stop when no centroid moves more than this")


def nearest(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    d = (X * X).sum(1)[:, None] - 2.0 * X @ C.T + (C * C).sum(1)[None, :]
    return np.argmin(d, axis=1)


class LloydClient(Client):
    def __init__(self, config, shard, ctx):
        super().__init__(config, shard, ctx)
        self.X = np.asarray(shard.X, dtype=np.float64)
        self.C: np.ndarray | None = None

    def handle(self, msg: Message) -> Message | None:
        k = self.ctx.n_clusters
        if msg.kind == "candidates":
            from sklearn.cluster import KMeans

            km = KMeans(min(k, len(self.X)), n_init=1, random_state=seed_from(self.ctx.rng_for("candidates")))
            y = km.fit_predict(self.X)
            return Message("candidates", C=km.cluster_centers_, counts=np.bincount(y, minlength=km.n_clusters))
        if msg.kind == "centroids":
            self.C = np.asarray(msg["C"], dtype=np.float64)
            y = nearest(self.X, self.C)
            sums = np.zeros_like(self.C)
            np.add.at(sums, y, self.X)
            return Message("stats", sums=sums, counts=np.bincount(y, minlength=k).astype(np.int64))
        raise ValueError(f"fedlloyd client: unexpected message {msg.kind!r}")

    def predict(self) -> np.ndarray | None:
        if self.C is None:
            return None  # no centroids received: its rows stay unlabelled
        return nearest(self.X, self.C)


class LloydServer(Server):
    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.C: np.ndarray | None = None

    def start(self) -> dict[int, Message]:
        return {c: Message("candidates") for c in self.ctx.client_ids}

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        k = self.ctx.n_clusters
        if round == 0:
            pool = np.vstack([np.asarray(replies[c]["C"]) for c in sorted(replies)])
            counts = np.concatenate([np.asarray(replies[c]["counts"]) for c in sorted(replies)])
            picked = [int(np.argmax(counts))]
            for _ in range(1, k):  # farthest-point selection over the candidates
                d = np.min(((pool[:, None, :] - pool[picked][None, :, :]) ** 2).sum(-1), axis=1)
                picked.append(int(np.argmax(d)))
            self.C = pool[picked]
        else:
            if replies:
                sums = sum(np.asarray(m["sums"]) for m in replies.values())
                counts = sum(np.asarray(m["counts"]) for m in replies.values())
                new = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], self.C)
                shift = float(np.abs(new - self.C).max())
                self.C = new
                self.info = {"shift": shift, "missing": sorted(missing)}
                if shift <= self.config.tol or round >= self.config.max_rounds:
                    return Done(labels=None)
        return {c: Message("centroids", C=self.C) for c in self.ctx.client_ids}

    def result(self) -> Done:
        return Done(labels=None)


PROTOCOL = Protocol(
    name="fedlloyd",
    config=Config,
    client=LloydClient,
    server=LloydServer,
    partition="horizontal",
    summary="federated Lloyd k-means: per-cluster sums and counts up, centroids down every round",
)
