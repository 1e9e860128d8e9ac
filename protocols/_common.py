"""Small pieces shared by several protocols (not a method: nothing here is registered).

* :func:`kmeans_capped` -- k-means with ``k`` capped at the number of distinct rows,
  optionally padded back to ``k`` centres by repetition;
* :func:`polar` -- the orthonormal polar factor ``U W^T`` of a thin SVD ``M = U S W^T``;
* :func:`rel_change` -- the relative change used by every stopping test;
* :func:`normalise_rows` -- rows scaled to unit L2 norm (zero rows stay zero);
* :class:`Membership` -- which clients a server's model holds, who is stale in a round
  and who still has to join.

Seeds for scikit-learn or torch come from :func:`raymvc.protocol.seed_from`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import scipy.linalg

from raymvc.data.datasets import normalise_rows
from raymvc.protocol import seed_from

__all__ = ["Membership", "kmeans_capped", "normalise_rows", "pad_rows", "polar", "rel_change"]


def pad_rows(C: np.ndarray, k: int) -> np.ndarray:
    """``C`` with rows repeated cyclically until it has ``k`` rows (unchanged if it has ``k`` or more)."""
    kk = len(C)
    if kk >= k:
        return C
    return np.vstack([C, C[np.arange(k - kk) % kk]])


def kmeans_capped(X: np.ndarray, k: int, rng: np.random.Generator, n_init: int = 10, max_iter: int = 300,
                  sample_weight: np.ndarray | None = None, pad: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """k-means on the rows of ``X`` with ``min(k, distinct rows)`` clusters (at least one).

    Returns ``(centres, labels)``. With ``pad`` the centres are padded to ``k`` rows by
    repeating existing ones (a repeated centre never wins a sample); ``labels`` always
    index the unpadded centres. The seed is one draw from ``rng``.
    """
    kk = max(1, min(k, len(np.unique(X, axis=0))))
    from sklearn.cluster import KMeans  # here, not at import: a client that never clusters skips it

    km = KMeans(n_clusters=kk, n_init=n_init, max_iter=max_iter, random_state=seed_from(rng))
    km.fit(X, sample_weight=sample_weight)
    C = km.cluster_centers_
    return (pad_rows(C, k) if pad else C), km.labels_


def polar(M: np.ndarray) -> np.ndarray:
    """The matrix with orthonormal columns (tall ``M``) or rows (wide ``M``) closest to ``M``.

    ``U W^T`` from the thin SVD ``M = U S W^T``; :func:`scipy.linalg.polar` wants a square
    or tall input, so a wide ``M`` is transposed there and back.
    """
    if M.shape[0] < M.shape[1]:
        return scipy.linalg.polar(M.T)[0].T
    return scipy.linalg.polar(M)[0]


def rel_change(new: float, ref: float) -> float:
    """``|new - ref| / |ref|`` (``ref`` floored at the smallest normal float)."""
    return abs(new - ref) / max(abs(ref), 1e-300)


class Membership:
    """The clients whose data a server's model holds, in the order they joined.

    A client joins with its first useful reply (round 0, or later if it missed round 0);
    until then it is ``left_out`` and the server keeps asking it to join. A member with
    no reply in a round is ``stale``: the server uses its last state.
    """

    def __init__(self, client_ids: Iterable[int]):
        self.client_ids = list(client_ids)
        self.members: list[int] = []

    def join(self, ids: Iterable[int]) -> list[int]:
        """Add the given clients that are not members yet (sorted); returns them."""
        new = sorted(set(ids) - set(self.members))
        self.members.extend(new)
        return new

    def stale(self, replies: Mapping[int, object]) -> list[int]:
        """Members without a reply in ``replies``."""
        return [c for c in self.members if c not in replies]

    def fresh(self, replies: Mapping[int, object]) -> list[int]:
        """Members with a reply in ``replies``."""
        return [c for c in self.members if c in replies]

    def left_out(self) -> list[int]:
        """Clients that have not joined (yet)."""
        return sorted(set(self.client_ids) - set(self.members))

    def index(self, c: int) -> int:
        return self.members.index(c)

    def __contains__(self, c: object) -> bool:
        return c in self.members

    def __iter__(self) -> Iterator[int]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)
