"""CeFMC: communication-efficient federated multi-view clustering (and CeFMC-H).

Vertical setting: client ``v`` holds view ``X_v`` (``N x D_v``) of the same ``N``
samples; ``k`` clusters.

Exchange
--------
* round 0: the server asks for embeddings; each client sends ``H_v`` (``N x k``, the
  top-``k`` left singular vectors of ``X_v``) -- the only full representation that
  ever travels. The server runs k-means on ``H_c = [H_1 ... H_V]``, orthonormalises the
  centroids into ``C`` (``k x Vk``, ``C C^T = I``) and sends each client the consensus
  labels ``y`` and its ``k x k`` block ``C̄_v``. The client keeps that first block as its
  fixed ``C_v``.
* rounds t >= 1: each client repeats Alg. 1's ``H_v`` step (``M = X_v (X_v^T H_v) +
  λ C_v[y_v]``, ``H_v = U W^T`` from the thin SVD of ``M``; ``X_v X_v^T`` is never
  formed, so a step is ``O(N D_v k)``) until the objective of Eq. 25 changes by at most
  ``inner_tol`` (relative; the paper says "until convergent" and gives no number), at
  most ``inner_iters`` steps (a safety net), relabels its samples with
  ``argmax(λ H_v C_v^T + β (C̄_v C_v^T)[y])`` (the paper's Eq. 28 writes it without the
  weights, the same argmax when λ = β) and sends only ``y_v`` (``N`` small unsigned
  ints) and its objective. The server rebuilds ``H_c = [C_1[y_1] ... C_V[y_V]]`` by
  indexing, updates ``y = argmax(H_c C^T)`` and ``C`` from the SVD of ``H_c^T Y``, and
  stops when the relative change of the objective is at most ``tol`` (the paper's
  test) or after ``max_rounds``.

CeFMC-H (the paper's ablation) runs the same optimisation but clients upload the full
``H_v`` every round and the server uses ``H_c = [H_1 ... H_V]``.

What the equations do with λ = β
--------------------------------
If every client returns ``y_v = y``, the server's ``H_c`` is ``C[y]``, so its Y step
(``argmax H_c C^T = argmax I[y]``) returns ``y`` and its C step (the polar factor of
``C^T D``, ``D`` the cluster sizes) returns ``C``: the round-0 consensus is a fixed point.
Clients do relabel some samples, but the server weighs each view's vote by that view's
block of ``C``, and on HW the views that disagree carry too little of it: no consensus
label moves in any round (``benchmarks/cefmc_fixed_point.py`` prints both terms of the
label step per view; the CeFMC page shows the derivation and the runs). With β well
below λ the views' own terms win and labels move. The round log counts the consensus
labels that moved (``labels_moved``).

Departures and choices
----------------------
* ``h_step``: the paper's Alg. 1 (default) takes ``M = X_v X_v^T H_v + λ Y_v C_v``, which
  is the ascent step of ``½ tr(H^T K H) + λ tr(H^T Y_v C_v)``, not of Eq. 25, so the
  objective of Eq. 19 can fall by a little in a round; ``h_step: gradient`` doubles the
  first term (the gradient of Eq. 25), and then no step can lower it.
* ``kmeans_init``: the paper does not say how many k-means starts round 0 takes (10 here).
* ``inner_iters: 3, inner_tol: 0``: three fixed ``H_v`` steps a round, the earlier
  default, instead of Alg. 1 run to convergence.
* ``stop_on_cycle``: also stop when the objective's change over two rounds is at most
  ``tol``, so a 2-cycle of label flips (seen with CeFMC-H, whose continuous embeddings can
  alternate two assignments) ends the run; off by default, as the paper's test has no
  such rule.

Missing replies
---------------
A member whose reply is missing in a round (dropped, late, crashed, rejected) is
represented by its last ``y_v`` (CeFMC-H: last ``H_v``) and last objective; it is
reported as stale in the round log. A client that did not deliver its round-0
embedding is not lost: every later round the server sends it ``"embed"`` again
(instead of ``"consensus"``; the log lists it as ``left_out``). The server keeps the
members' round-0 embeddings, so when a late ``H_v`` arrives it restarts the consensus
exactly as in round 0, now with every view it holds: k-means on ``[H_1 ... H_V]``
(seeded for that round), ``C`` from the centroids, and every member fixes its new
block as ``C_v`` from the next ``"consensus"`` (which carries ``refix``; the log lists
the view under ``joined``). The run then goes on as if the view had been there from
the start; the objective history restarts, and a join round never counts as
converged. A client fixes ``C_v`` from the first consensus it handles; while the
server has no reply to a consensus from it (the message was dropped, or the reply
lost), the next consensus carries ``refix`` too and the client fixes ``C_v`` again
from it, so client and server always agree on ``C_v``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import Field

from raymvc.messages import Done, Message, labels_array
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
    paper,
    project_option,
    seed_from,
)

from ._common import Membership, polar, rel_change


class Config(ProtocolConfig):
    lam: float = Field(default=1.0, gt=0.0, alias="lambda", description="λ, weight of the label term on the client",
                       **not_stated("1, the middle of the grid 2^-10 .. 2^10 that the paper searches by accuracy "
                                    "(Sec. V-A); on HW all five grid points tie (cefmc-tuning)"))
    beta: float | None = Field(default=None, gt=0.0, description="β on the server; defaults to λ as the paper advises",
                               **paper("Sec. V-A and Sec. V-G (λ = β by default)"))
    max_rounds: int = Field(default=30, ge=1, description="rounds at most, a safety net: the run ends once converged "
                                                           "(tol)", **not_stated(
                                "30, a safety net only (the method's spec); Alg. 2 loops while not convergent"))
    tol: float = Field(default=1e-6, ge=0.0, description="converged when the objective's relative change "
                                                           "is at most this (the paper's test)",
                       **not_stated("1e-6 (the method's spec) for the δ of Alg. 2's test "
                                    "(obj^t - obj^(t-1)) / obj^t <= δ, whose value the paper does not give"))
    stop_on_cycle: bool = Field(default=False, description="also converged when the change over two rounds is at "
                                                           "most tol (a 2-cycle of label flips; not in the paper)",
                                **project_option())
    inner_iters: int = Field(default=100, ge=1, description="H_v steps per round on each client at most, a safety "
                                                            "net: Alg. 1 stops once converged (inner_tol); the "
                                                            "earlier default was 3 fixed steps (inner_tol: 0)",
                             **not_stated("100, a safety net only: Alg. 1 repeats until convergent; on HW a "
                                          "round takes at most 24 steps, on zero-filled HW some views reach the "
                                          "cap (studies/cefmc.md)"))
    inner_tol: float = Field(default=1e-6, ge=0.0, description="Alg. 1 stops when Eq. 25's objective changes by at "
                                                                "most this (relative); 0 runs all inner_iters steps",
                             **not_stated("1e-6, the outer test's tol; Alg. 1 says 'until convergent' with "
                                          "no test or number"))
    h_step: Literal["alg1", "gradient"] = Field(
        default="alg1", description="H_v step: 'alg1' M = X X^T H + λ Y_v C_v (the paper's Alg. 1 as printed); "
                                    "'gradient' M = 2 X X^T H + λ Y_v C_v (the gradient of Eq. 25, so no step "
                                    "can lower the objective)", **paper("Alg. 1, line 3"))
    kmeans_init: int = Field(default=10, ge=1, description="k-means restarts on the server at round 0",
                             **not_stated("10 starts, scikit-learn's usual number; the paper's k-means "
                                          "(Sec. IV-C) does not say how many"))


# ---------------------------------------------------------------------------
def _orthonormal_basis(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Top-k left singular vectors of X, completed to k orthonormal columns if rank < k."""
    U, s, _ = np.linalg.svd(X, full_matrices=False)
    r = int(np.sum(s > s[0] * 1e-10)) if s.size and s[0] > 0 else 0
    H = U[:, : min(k, r)]
    if H.shape[1] < k:
        extra = rng.standard_normal((X.shape[0], k - H.shape[1]))
        extra -= H @ (H.T @ extra)
        Q, _ = np.linalg.qr(extra)
        H = np.hstack([H, Q])
    return H


def communication(n: int, k: int, rounds: int, label_bytes: int = 1, float_bytes: int = 8, h_variant: bool = False) -> dict:
    """Data bytes one client exchanges (paper IV-E), excluding message headers.

    Init: ``kN`` floats up; ``N`` labels + ``k^2`` floats down. Each of ``rounds``
    rounds: ``N`` labels + 1 float up (CeFMC-H: ``kN`` + 1 floats), ``N`` labels +
    ``k^2`` floats down.
    """
    up_round = (n * k * float_bytes if h_variant else n * label_bytes) + float_bytes
    down_round = n * label_bytes + k * k * float_bytes
    up = n * k * float_bytes + rounds * up_round
    down = (n * label_bytes + k * k * float_bytes) + rounds * down_round
    return {"up": up, "down": down, "total": up + down}


# ---------------------------------------------------------------------------
class CeFMCClient(Client):
    h_variant = False

    def __init__(self, config: Config, shard, ctx: ClientContext):
        super().__init__(config, shard, ctx)
        self.X = np.asarray(shard.X, dtype=np.float64)
        self.k = ctx.n_clusters
        self.H: np.ndarray | None = None
        self.C: np.ndarray | None = None  # fixed after the first consensus
        self.y: np.ndarray | None = None

    def handle(self, msg: Message) -> Message | None:
        if msg.kind == "embed":
            self.H = _orthonormal_basis(self.X, self.k, self.ctx.rng_for("embed"))
            return Message("embedding", H=self.H)
        if msg.kind == "consensus":
            y = np.asarray(msg["y"], dtype=np.intp)
            Cbar = np.asarray(msg["C"], dtype=np.float64)
            if self.C is None or bool(msg.get("refix", False)):
                self.C, self.y = Cbar.copy(), y.copy()
            return self._round(y, Cbar)
        raise ValueError(f"cefmc client: unexpected message {msg.kind!r}")

    def h_step(self) -> np.ndarray:
        """Alg. 1 on ``H_v`` (with ``Y_v``, ``C_v`` fixed), repeated until Eq. 25's objective
        ``||X_v^T H_v||^2 + λ tr(H_v^T Y_v C_v)`` changes by at most ``inner_tol`` (relative)
        or for ``inner_iters`` steps; ``self.h_iters`` counts the steps taken."""
        cfg = self.config
        grad = 2.0 if cfg.h_step == "gradient" else 1.0
        X, H, target = self.X, self.H, cfg.lam * self.C[self.y]
        XtH = X.T @ H
        obj = float(np.sum(XtH * XtH) + np.sum(H * target))
        self.h_iters = 0
        while self.h_iters < cfg.inner_iters:
            H = polar(grad * (X @ XtH) + target)
            XtH = X.T @ H
            new = float(np.sum(XtH * XtH) + np.sum(H * target))
            self.h_iters += 1
            done = rel_change(new, obj) <= cfg.inner_tol
            obj = new
            if done:
                break
        return H

    def label_terms(self, y: np.ndarray, Cbar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The Y_v step's two terms (Eq. 19): the view's own ``λ H_v C_v^T`` and the
        consensus prior ``β Y C̄_v C_v^T`` (the paper's Eq. 28 drops both weights, the
        same argmax when λ = β)."""
        cfg = self.config
        beta = cfg.beta if cfg.beta is not None else cfg.lam
        return cfg.lam * (self.H @ self.C.T), beta * (Cbar @ self.C.T)[y]

    def _round(self, y: np.ndarray, Cbar: np.ndarray) -> Message:
        lam, X, C = self.config.lam, self.X, self.C
        self.H = H = self.h_step()
        own, prior = self.label_terms(y, Cbar)
        self.y = np.argmax(own + prior, axis=1)
        XtH = X.T @ H
        obj = float(np.sum(XtH * XtH) + lam * np.sum(H * C[self.y]))
        if self.h_variant:
            return Message("embedding", H=H, obj=obj)
        return Message("labels", y=labels_array(self.y), obj=obj)


class CeFMCHClient(CeFMCClient):
    h_variant = True


class CeFMCServer(Server):
    h_variant = False

    def __init__(self, config: Config, ctx: ServerContext):
        super().__init__(config, ctx)
        import sklearn.cluster  # noqa: F401  (loaded while the parties start, not inside round 0)
        self.k = ctx.n_clusters
        self.beta = config.beta if config.beta is not None else config.lam
        self.membership = Membership(ctx.client_ids)  # clients in the consensus, in view order
        self.Cfix: dict[int, np.ndarray] = {}
        self.H0: dict[int, np.ndarray] = {}  # the members' round-0 embeddings
        self.awaiting: dict[int, np.ndarray | None] = {}  # members with no consensus answered yet: last block sent
        self.last: dict[int, np.ndarray] = {}  # last y_v (or H_v for the H variant)
        self.obj_v: dict[int, float] = {}
        self.C: np.ndarray | None = None
        self.y: np.ndarray | None = None
        self.prev_obj: float | None = None
        self.history: list[float] = []

    @property
    def members(self) -> list[int]:
        return self.membership.members

    def start(self) -> dict[int, Message]:
        return {c: Message("embed") for c in self.ctx.client_ids}

    def _block(self, j: int) -> np.ndarray:
        k = self.k
        return self.C[:, j * k:(j + 1) * k].copy()

    def _outgoing(self) -> dict[int, Message]:
        y = labels_array(self.y)
        out = {c: Message("embed") for c in self.membership.left_out()}
        for j, c in enumerate(self.members):
            fields = {"y": y, "C": self._block(j)}
            if c in self.awaiting:
                if self.awaiting[c] is not None:  # an earlier consensus may have been fixed: fix this one
                    fields["refix"] = True
                self.awaiting[c] = fields["C"]
            out[c] = Message("consensus", fields)
        return out

    def _consensus(self, round: int) -> None:
        """Round-0 consensus over the embeddings of all members: labels ``y``, ``C``, fixed blocks."""
        Hc = np.hstack([self.H0[c] for c in self.members])
        from sklearn.cluster import KMeans  # the server's only; client actors start without it

        km = KMeans(n_clusters=self.k, n_init=self.config.kmeans_init,
                    random_state=seed_from(self.ctx.rng_for("kmeans", round)))
        self.y = km.fit_predict(Hc)
        self.C = polar(km.cluster_centers_)  # k x Vk with orthonormal rows
        for j, c in enumerate(self.members):
            self.Cfix[c] = self._block(j)  # provisional until the client answers this consensus
            if not self.h_variant or c not in self.last:
                self.last[c] = self.H0[c] if self.h_variant else self.y.copy()
            self.obj_v.setdefault(c, 0.0)
            self.awaiting[c] = None if round == 0 else self.Cfix[c]  # after round 0: members must refix

    def _stacked(self) -> np.ndarray:
        if self.h_variant:
            return np.hstack([np.asarray(self.last[c], dtype=np.float64) for c in self.members])
        return np.hstack([self.Cfix[c][self.last[c].astype(np.intp)] for c in self.members])

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        if round == 0:
            return self._init(replies)
        k = self.k
        stale = self.membership.stale(replies)
        for c in self.membership.fresh(replies):
            r = replies[c]
            if c in self.awaiting:  # its first answer: it fixed the block it was sent last
                self.Cfix[c] = self.awaiting.pop(c)
            self.last[c] = np.asarray(r["H"] if self.h_variant else r["y"])
            self.obj_v[c] = float(r["obj"])
        joining = self.membership.join(c for c in self.membership.left_out()
                                       if c in replies and replies[c].kind == "embedding")
        if joining:  # restart the consensus with the new views
            for c in joining:
                self.H0[c] = np.asarray(replies[c]["H"], dtype=np.float64)
            self._consensus(round)
            self.history = []
        Hc = self._stacked()
        before = self.y
        if not joining:
            self.y = np.argmax(Hc @ self.C.T, axis=1)
        moved = int(np.count_nonzero(self.y != before)) if not joining else None
        # P = Hc^T Y: column j sums the rows labelled j (bincount per column, O(N Vk))
        P = np.stack([np.bincount(self.y, weights=Hc[:, i], minlength=k) for i in range(Hc.shape[1])])
        if not joining:
            self.C = polar(P).T
        obj = float(self.beta * np.sum(P * self.C.T) + sum(self.obj_v.values()))
        change = rel_change(self.history[-1], obj) if self.history else None
        # with stop_on_cycle, a 2-cycle (labels flipping between two assignments) counts as converged too
        cycle = rel_change(self.history[-2], obj) if len(self.history) >= 2 and self.config.stop_on_cycle else None
        self.history.append(obj)
        self.prev_obj = obj
        self.info = {"objective": obj, "rel_change": change, "labels_moved": moved, "stale_clients": stale,
                     "joined": joining, "left_out": self.membership.left_out()}
        converged = any(c is not None and c <= self.config.tol for c in (change, cycle))
        if converged or round >= self.config.max_rounds:
            return Done(labels=self.y.copy(), info={"objective": obj, "converged": converged})
        return self._outgoing()

    def _init(self, replies: Mapping[int, Message]) -> dict[int, Message]:
        if not replies:
            raise NoInput("cefmc: no client delivered its embedding")
        for c in self.membership.join(replies):
            self.H0[c] = np.asarray(replies[c]["H"], dtype=np.float64)
        self._consensus(0)
        self.info = {"members": list(self.members), "left_out": self.membership.left_out()}
        return self._outgoing()

    def result(self) -> Done | None:
        if self.y is None:
            return None  # no consensus labels yet
        return Done(labels=self.y.copy(), info={"objective": self.prev_obj, "converged": False})


class CeFMCHServer(CeFMCServer):
    h_variant = True


def _label_bytes(k: int) -> int:
    return 1 if k <= 256 else 2 if k <= 65536 else 4


def analytic_bytes(config: Config, facts: RunFacts, h_variant: bool = False) -> int:
    """Protocol data bytes of a fault-free run of ``facts.rounds`` exchanges (round 0 included).

    Per client: round 0 sends an empty request down and ``H_v`` up; each later round
    the consensus (``N`` labels + ``k x k`` block) down and ``N`` labels + the objective
    up (CeFMC-H: ``H_v`` + the objective).
    """
    n, k, fb = facts.n_samples, facts.n_clusters, facts.float_bytes
    lb = _label_bytes(k)
    later = facts.rounds - 1
    up = n * k * fb + later * ((n * k * fb if h_variant else n * lb) + 8)
    down = later * (n * lb + k * k * fb)
    return len(facts.client_ids) * (up + down)


PROTOCOL = Protocol(
    name="cefmc",
    config=Config,
    client=CeFMCClient,
    server=CeFMCServer,
    partition="vertical",
    summary="labels + k x k centroid blocks per round; O(N) per round",
    paper="J. Liu, X. Liu, S. Wang, X. Wan, D. Li, K. Lu, K. He: Communication-Efficient Federated Multi-view "
          "Clustering (journal article, 2025)",
    quick_params={"max_rounds": 5, "kmeans_init": 2},
    analytic_bytes=analytic_bytes,
)
PROTOCOL_H = Protocol(
    name="cefmc-h",
    config=Config,
    client=CeFMCHClient,
    server=CeFMCHServer,
    partition="vertical",
    summary="CeFMC ablation: full N x k embeddings every round",
    paper=PROTOCOL.paper,
    quick_params=PROTOCOL.quick_params,
    analytic_bytes=lambda config, facts: analytic_bytes(config, facts, h_variant=True),
)
PROTOCOLS = {p.name: p for p in (PROTOCOL, PROTOCOL_H)}
