"""EFIMVC: efficient federated incomplete multi-view clustering.

Vertical, incomplete setting: client ``v`` holds view ``v`` (``d_v`` features) of the
samples it has (index set ``I_v``, ``n_v = |I_v|``); every sample has at least one view;
``k`` clusters, ``m`` anchors per view. Columns are samples, as in the paper: ``X_v`` is
``d_v x n_v``, the client's anchor graph ``Z_v`` is ``m x n_v`` (present samples only),
the server's fused graph ``Z`` is ``m x n``; every graph column lies on the simplex
(``z >= 0``, ``1^T z = 1``). Each side optimises its own objective to convergence
before it talks, and anchor graphs -- not embeddings -- travel.

Objectives
----------
* client ``v`` (``Z``, ``P_v`` from the server fixed):
  ``J_v(A_v, Z_v) = ||X_v - A_v Z_v||^2 + λ ||P_v Z[:, I_v] - Z_v||^2``;
* server (the clients' ``Z_v``, ``S_v`` fixed; ``P_v`` orthogonal; ``L_v`` the Laplacian
  of the anchor similarity ``S_v``):
  ``J_s(Z, P) = Σ_v ||P_v Z[:, I_v] - Z_v||^2 + 2β tr(Z^T P_v^T L_v P_v Z)``
  (the paper's ``β Σ_ij S_ij ||(P_v Z)_i - (P_v Z)_j||^2``);
* overall: ``J = J_s + (1/λ) Σ_v ||X_v - A_v Z_v||^2``.

Every round's log holds ``client_objective`` (Σ_v J_v), ``server_objective`` (J_s),
``objective`` (J) and ``objective_after_clients`` (J after the clients' updates, before
the server's loop).

Exchange
--------
* round 0, ``init``: each client preprocesses its own data (absent rows dropped, each
  present sample scaled to unit L2 norm, so every ``data.normalize`` setting gives the
  same result), takes ``A_v`` = k-means centres of its samples (``m`` of them), solves
  ``Z_v`` column by column with ``W = A^T A + λI``, ``t = A^T x``, and sends ``Z_v``,
  ``S_v``, the indices of its samples (once) and ``||X_v - A_v Z_v||^2`` (one float).
  The server sets ``Z`` = mean of the ``Z_v`` over each sample's views (a uniform column
  for a sample that no member has) and ``P_v = I``, and sends each client ``Z[:, I_v]``
  (``m x n_v``) and ``P_v``.
* rounds ``r >= 1``, ``guide``: the client runs its local loop on ``J_v`` until the
  relative change is below ``client_tol`` (at most ``client_iters``): ``A_v = D C^{-1}``
  (``C = Z_v Z_v^T``, ``D = X_v Z_v^T``; pseudo-inverse when ``cond(C) > 1e12``), then a
  ``Z_v`` update (``W = A^T A + λI``, ``t = A^T x + λ (P_v Z)_j``) of ``inner_qp_iters``
  monotone FISTA steps from the previous ``Z_v``. After the loop ``Z_v`` is solved
  exactly for the final anchors. Only then does the client send ``Z_v``, ``S_v`` and its
  reconstruction error. The server runs its loop on ``J_s`` until the relative change
  is below ``server_tol`` (at most ``server_iters``): each ``P_v`` by the generalized
  power iteration, then ``Z`` column by column with ``W_j = c_j I + 2β Σ_v P_v^T L_v P_v``
  (``c_j`` = number of views of sample ``j``; one matrix per group of columns with the
  same count) and ``t_j = Σ_{v ∋ j} P_v^T Z_v[:, j]``. As Alg. 1's outer loop, the run
  goes on until ``J`` changes by less than ``tol`` (relative; 1e-3, the method spec's: the
  paper gives no number), and returns the labels. ``max_rounds`` (100) is only a safety
  net; ``max_rounds: 6``, the earlier default (the spec says the authors' code stops
  there), is the project's option, its effect on the EFIMVC page's departures table.
* labels: k-means on the rows, L2-normalised, of the top-``k`` left singular vectors
  of ``Z^T`` (the paper's Alg. 1, last step). The paper says it repeats k-means 20 times
  and averages "for methods that obtain final results through k-means" where it describes
  its baselines (Sec. 4.1), not whether its own numbers are such means; a run here is one
  k-means run (``final_kmeans_init: 1``), and the seeds of a study play the repeats.

Departures and options (each option off by default)
---------------------------------------------------
* ``embedding: centered`` removes the mean column of ``Z`` before the SVD. The anchor
  similarity term pulls every column of ``Z`` towards a common one, so ``Z`` is a common
  column plus small sample-specific deviations; the plain first singular vector is then
  that common column, and row normalisation lets it swamp the other ``k - 1``
  directions. Centring uses ``k`` informative directions instead.
* ``s_refresh: if_not_worse``: the server adopts a client's new anchor similarity only
  where it does not raise the objective (see below); the paper takes it every round.
* ``final_kmeans_init: 200``: the lowest-objective labelling of 200 k-means starts
  instead of one run.
* ``max_rounds: 6``: six outer rounds at most instead of running to convergence.
Two departures are defaults: a client's loop and the server's loop stop at 30 iterations
(``client_iters``, ``server_iters``) even when not converged (in early rounds some views
reach that cap), and inside the client loop each ``Z_v`` update is ``inner_qp_iters``
FISTA steps rather than the exact QP solve of Eq. 10.
Their measured effects are on the EFIMVC page (departures table).

Why ``J`` never increases
-------------------------
The client loop is block descent on ``J_v``: the ``A`` step is a least-squares
minimiser, and every ``Z_v`` step starts from the previous ``Z_v`` and never raises the
objective. With ``Z`` and ``P`` fixed, ``J`` changes by exactly ``ΔJ_v / λ``. The server
loop is block descent on ``J_s``: the power iteration never lowers the (convex)
function it maximises, and the ``Z`` solve is warm-started and monotone. With the
clients' variables fixed, ``J`` changes by ``ΔJ_s``. One term escapes both arguments: a
client's new anchors change ``S_v``, and with it the regulariser, so with the paper's
``s_refresh: always`` ``J`` can rise in a round. With ``s_refresh: if_not_worse`` the
server adopts a new ``S_v`` only when that view's share of ``J`` with it is no larger than
the share at the end of the previous round (``s_refreshed`` in the log counts
adoptions; otherwise it keeps the old ``S_v``), and then ``J`` never rises in a
fault-free run. Under faults see below.

Anchor similarity
-----------------
``S_v(i, j) = exp(-||a_i - a_j||^2 / (2σ^2))`` (the paper's Eq. 3, squared distance) with
``σ`` = ``sigma_scale`` x the median distance between distinct anchors (or a fixed
``sigma``). The authors' code uses the non-squared distance with
``σ = 0.3((m - 1)/2 - 1) + 0.8``. On ProteinFold (``m = 2k = 54``, learned anchors up to
~11 apart) that puts every entry above 0.92, so the term mostly shrinks ``Z`` towards
a uniform column. The median width spreads the entries over roughly 0.1-1 (median
0.6), so near and far anchors are told apart.

Solvers
-------
:func:`simplex_qp` (in :mod:`raymvc.protocols._simplex_qp`) solves ``min z^T W z - 2 t^T z`` on the simplex for all columns at
once (``W`` shared, or one ``W`` per column group). It runs monotone FISTA with adaptive
restart, the exact sort-based simplex projection, and a step set by the curvature on
``1^T z = 0``. Every ``check_every`` iterations a batched primal active-set refinement
makes columns exact: KKT systems on each column's support, ratio-test drops,
most-violating adds. Columns whose Frank-Wolfe gap (a bound on the distance to the
optimal value) is below ``qp_tol (1 + |f|)`` leave the working set. With ``λ = 1e-3``
and ``m > d_v`` the client problems are badly conditioned (κ ≈ 1e4 on the simplex
plane): FISTA alone needs ~1300 iterations, while with the refinement every column is
exact after 10-40 (a larger λ conditions them better). :func:`gpi` is the
generalized power iteration for ``P_v``.

Missing replies
---------------
A client whose reply is missing in a round keeps its last ``Z_v``, ``S_v`` and
reconstruction error on the server, and is listed in ``stale_clients``; it still gets
``Z`` and ``P_v`` the next round. The server's ``Z`` solve updates only the columns of
samples with at least one fresh view: a sample with no fresh view keeps its previous
``Z`` column. A client that did not deliver its round-0 graph is asked again: every
later round the server sends it ``"init"`` (the log lists it as ``left_out``), and its
graph joins when it arrives (``joined``): its ``Z_v``, ``S_v``, indices and ``P_v = I``
are added as in round 0, a sample that had no view takes the new ``Z_v`` column, and
the server's loop of that round runs with the new view; from the next round the client
gets ``"guide"`` like every member. A round in which a view joins never counts as
converged. Under faults ``J`` can rise: a client whose reply was lost has moved on from
the state the server holds, and a joining view adds its terms to ``J``.

Absent clients (a remedy, off by default)
-----------------------------------------
After a crash, a client's graph stays as it was in its last reply; the server's loop
goes on with it, but the samples that only absent clients hold keep the ``Z`` column of
their last update (round 0's, sparse) while every other column moves on (dense, close to
a common column). Those few columns then take over the top singular vectors of ``Z^T``
and k-means puts most samples in one cluster (the robustness page has the numbers).
``absent: project`` fits the
embedding and k-means on the samples a client that still answers holds (it answered in
one of the last ``absent_after`` rounds) and projects the others' columns onto the same
singular directions, each taking the nearest centre. Without absent clients nothing
changes (same labels). Its measured effect is on the robustness page (the remedies).

Hyperparameters
---------------
The paper grid-searches λ and β over {1e-3, 0.1, 1, 100} per data set (by accuracy,
which a clustering run cannot read) and reports λ = 1e-3 best on ProteinFold, 0.1 on
WebKB, with β of little effect. A run needs one value without labels: the method's
default is ``m = 2k`` anchors, ``λ = 1e-3``, ``β = 1``, chosen among the paper's grid
values on tuning seeds (``efimvc-tuning`` on HW, ``efimvc-tuning-proteinfold``; the rule
and the table are on the method's page); the ProteinFold scenario keeps ``β = 1e-3``.
``σ`` of the anchor similarity is not given in the paper (see above).

Cost
----
Per round, client ``v``: ``client_iters`` x (an ``m x m`` solve, ``O(d_v m n_v)``
products, ``inner_qp_iters`` FISTA steps of ``O(m^2 n_v)``), plus one exact solve.
Server: ``server_iters`` x (``V`` power iterations on ``m x m`` matrices, one batched QP
over ``n`` columns). Traffic per round and client: up ``m n_v + m^2`` floats and a few
scalars, down ``m n_v + m^2`` floats (plus ``n_v`` indices once). A ProteinFold run (694
samples, 12 clients) converges in 45-49 rounds (seeds 120-124), about seven times the time
and traffic of six rounds (18-29 s in process on one core); HW with half the samples
missing views converges in 6-7; the EFIMVC page has the counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import Field
from scipy.sparse import csgraph
from sklearn.cluster import KMeans

from raymvc.messages import Done, Message, labels_array
from raymvc.protocol import (
    Client,
    ClientContext,
    NoInput,
    Protocol,
    ProtocolConfig,
    Server,
    ServerContext,
    departure,
    not_stated,
    paper,
    project_option,
    seed_from,
)

from ._common import Membership, normalise_rows, polar, rel_change
from ._simplex_qp import simplex_qp


# ---------------------------------------------------------------------------
# configuration
class Config(ProtocolConfig):
    anchors: int = Field(default=2, ge=1, description="m = anchors * k anchors per view (ignored when m is set)",
                         **not_stated("m = 2k, the middle of the method spec's {k, 2k, 3k}; chosen on seed 0 "
                                      "(benchmarks/efimvc_tuning.md); Alg. 1 takes m as an input"))
    m: int | None = Field(default=None, ge=2, description="number of anchors; overrides anchors * k",
                          **project_option("sets m directly instead of anchors * k"))
    lam: float = Field(default=1e-3, gt=0.0, alias="lambda", description="λ, client weight of the guidance term",
                       **not_stated("1e-3, chosen among the paper's grid {1e-3, 0.1, 1, 100} (Sec. 4.5) on tuning "
                                    "seeds (efimvc-tuning, efimvc-tuning-proteinfold); the paper's best on "
                                    "ProteinFold, but it tunes per data set by accuracy"))
    beta: float = Field(default=1.0, ge=0.0, description="β, server weight of the anchor-graph regulariser",
                        **not_stated("1, chosen among the paper's grid (Sec. 4.5) on the same tuning seeds; the "
                                     "paper finds β of little effect"))
    sigma: float | None = Field(default=None, gt=0.0,
                                description="kernel width of S_v; None = median anchor distance times sigma_scale",
                                **not_stated("the median distance between anchors (times sigma_scale): Eq. 3 gives "
                                             "σ no value, and the authors' fixed formula puts every entry of S_v "
                                             "near 1 on ProteinFold"))
    sigma_scale: float = Field(default=1.0, gt=0.0, description="σ as this times the median anchor distance "
                                                                  "(when sigma is None)",
                               **not_stated("1, σ the median anchor distance itself, so S_v spreads over about "
                                            "0.1-1"))
    max_rounds: int = Field(default=100, ge=1, description="outer rounds after the initial exchange, at most: a safety "
                                                            "net, the run ends once converged (tol); 6 was the "
                                                            "earlier default",
                            **not_stated("100, a safety net only: Alg. 1's outer loop runs while not converged "
                                         "(Sec. 4.4, Fig. 3: the objectives settle within 30 iterations)"))
    tol: float = Field(default=1e-3, ge=0.0, description="stop when the overall objective changes by less (relative)",
                       **not_stated("1e-3 relative change of the overall objective (App. A.2, Eq. 25), the method "
                                    "spec's; Alg. 1 says 'while not converged' with no number"))
    client_iters: int = Field(default=30, ge=1, description="iterations of a client's local loop per round, at most",
                              **not_stated("30, a cap on the client loop Alg. 1 runs while not converged, after "
                                           "Sec. 4.4's 'within 30 iterations'; in early rounds some views reach it"))
    client_tol: float = Field(default=1e-3, ge=0.0, description="a client's loop stops when its objective changes "
                                                                  "by less (relative)",
                              **not_stated("1e-3 relative change of Eq. 19 (the method spec's); the paper gives no "
                                           "number"))
    server_iters: int = Field(default=30, ge=1, description="iterations of the server's loop per round, at most",
                              **not_stated("30, a cap on the server loop Alg. 1 runs while not converged, after "
                                           "Sec. 4.4's 'within 30 iterations'"))
    server_tol: float = Field(default=1e-3, ge=0.0, description="the server's loop stops when its objective changes "
                                                                  "by less (relative)",
                              **not_stated("1e-3 relative change of Eq. 23 (the method spec's); the paper gives no "
                                           "number"))
    gpi_iters: int = Field(default=50, ge=1, description="generalized power iterations per P_v update, at most",
                           **not_stated("50, a cap: App. A.1 iterates Eq. 18 'until converge'; gpi_tol ends it "
                                        "sooner"))
    gpi_tol: float = Field(default=1e-6, ge=0.0, description="a P_v update stops when its objective changes by less",
                           **not_stated("1e-6 relative change of Eq. 15; App. A.1 gives no number"))
    qp_iters: int = Field(default=300, ge=1, description="iteration cap of an exact column-QP solve",
                          **not_stated("300, a cap of the project's solver: the paper solves Eqs. 10 and 14 with "
                                       "'existing software packages' (Sec. 3.4)"))
    inner_qp_iters: int = Field(default=5, ge=1, description="FISTA steps per Z update inside the client loop",
                                **departure("Sec. 3.4.1, Eq. 10: each Z^(v) update is an exact QP solve",
                                            "5 warm-started FISTA steps per update inside the client loop, each "
                                            "lowering J_v, then one exact solve after the loop: far cheaper"))
    qp_tol: float = Field(default=1e-6, ge=0.0, description="tolerance of the column-QP solver (relative gap)",
                          **not_stated("1e-6 relative Frank-Wolfe gap, the project's solver; the paper's QP package "
                                       "is not named"))
    kmeans_init: int = Field(default=10, ge=1, description="k-means restarts for the anchors on each client",
                             **not_stated("10 starts, scikit-learn's usual number; Alg. 1 says only 'initialize "
                                          "A^(v)' (k-means centres, the method spec's)"))
    final_kmeans_init: int = Field(default=1, ge=1, description="k-means starts on the server's spectral embedding "
                                                                 "(1: one k-means run, the seeds of a study play "
                                                                 "the repeats; the project's variant: the best of 200)",
                                   **not_stated("one k-means run: Alg. 1's last step does not say how many starts"))
    embedding: Literal["centered", "plain"] = Field(
        default="plain", description="spectral embedding of Z: plain (the paper) or centred (mean column removed)",
        **paper("Alg. 1, last step (k-means on the left singular vectors of Z)"))
    align_anchors: bool = Field(default=True, description="learn each view's anchor permutation P_v (false: P_v = I, "
                                                          "the paper's Table 3 ablation)",
                                **paper("Sec. 3.3, Eqs. 4-5 (P = I only in Table 3's ablation)"))
    absent: Literal["keep", "project"] = Field(
        default="keep", description="samples that only clients silent for `absent_after` rounds in a row hold: kept in "
                                    "the final embedding as they stand (the paper), or projected onto the embedding "
                                    "fitted on the other samples and given the nearest centre (a remedy for crashes)",
        **project_option("keep: the paper's Alg. 1 has no absent clients"))
    absent_after: int = Field(default=1, ge=1, description="rounds in a row without a reply after which a client "
                                                           "counts as absent (absent: project)",
                              **project_option())
    s_refresh: Literal["always", "if_not_worse"] = Field(
        default="always", description="take each client's new anchor similarity S_v every round (the paper), or "
                                      "only where it does not raise that view's share of the objective",
        **paper("Alg. 1 (S^(v) computed and sent every round)"))

    def n_anchors(self, k: int) -> int:
        return int(self.m) if self.m is not None else max(2, int(self.anchors) * int(k))


# ---------------------------------------------------------------------------
# helpers
def anchor_similarity(A: np.ndarray, sigma: float | None, sigma_scale: float = 1.0) -> np.ndarray:
    """``S_ij = exp(-||a_i - a_j||^2 / (2 σ^2))`` over the anchors (columns of ``A``).

    ``σ`` defaults to ``sigma_scale`` times the median distance between distinct anchors.
    """
    sq = np.sum(A * A, axis=0)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (A.T @ A), 0.0)
    np.fill_diagonal(D2, 0.0)
    if sigma is None:
        iu = np.triu_indices(A.shape[1], 1)
        d = np.sqrt(D2[iu])
        d = d[d > 0]
        sigma = sigma_scale * (float(np.median(d)) if d.size else 1.0)
    S = np.exp(-D2 / (2.0 * sigma * sigma))
    return 0.5 * (S + S.T)


def laplacian(S: np.ndarray) -> np.ndarray:
    """``D - S`` for the symmetrised similarity ``S`` (``D`` its degrees; self-loops cancel)."""
    return csgraph.laplacian(0.5 * (S + S.T))


def gpi(P: np.ndarray, Lt: np.ndarray, ZZ: np.ndarray, K: np.ndarray, beta: float,
        iters: int = 50, tol: float = 1e-6) -> tuple[np.ndarray, int]:
    """Generalized power iteration on the Stiefel manifold.

    Maximises ``f(P) = β tr(P^T Lt P ZZ) + tr(P^T K)`` over orthogonal ``P`` (``Lt`` and
    ``ZZ`` positive semi-definite, so ``f`` is convex): ``P <- polar(2β Lt P ZZ + K)``.
    Each step maximises the linearisation of ``f``, so ``f`` never decreases.
    """
    def f(P):
        return beta * float(np.sum((Lt @ P @ ZZ) * P)) + float(np.sum(P * K))

    fP = f(P)
    it = 0
    for it in range(1, iters + 1):
        Pn = polar(2.0 * beta * (Lt @ P @ ZZ) + K)
        fn = f(Pn)
        if fn < fP:  # only by rounding; keep the better point
            break
        done = rel_change(fP, fn) <= tol
        P, fP = Pn, fn
        if done:
            break
    return P, it


# ---------------------------------------------------------------------------
class EFIMVCClient(Client):
    """Client v: anchors A_v (d x m) and anchor graph Z_v (m x n_v) of its present samples."""

    def __init__(self, config: Config, shard, ctx: ClientContext):
        super().__init__(config, shard, ctx)
        X = np.asarray(shard.views[0], dtype=np.float64)
        present = shard.present[0] if shard.present else None
        self.idx = np.arange(X.shape[0]) if present is None else np.flatnonzero(np.asarray(present, dtype=bool))
        # the client's own preprocessing: absent -> dropped, present samples unit L2 norm
        self.X = normalise_rows(X[self.idx])  # n_v x d (rows are samples)
        self.xx = float(np.sum(self.X * self.X))
        self.m = config.n_anchors(ctx.n_clusters)
        self.A: np.ndarray | None = None  # d x m
        self.Z: np.ndarray | None = None  # m x n_v

    # -- pieces ------------------------------------------------------------
    def _init_anchors(self) -> np.ndarray:
        m, X = self.m, self.X
        nv = X.shape[0]
        seed = seed_from(self.ctx.rng_for("anchors"))
        if nv >= m:
            km = KMeans(n_clusters=m, n_init=self.config.kmeans_init, random_state=seed).fit(X)
            return km.cluster_centers_.T.copy()
        # fewer samples than anchors: the samples plus random convex mixtures of them
        rng = np.random.default_rng(seed)
        extra = rng.dirichlet(np.ones(max(nv, 1)), size=m - nv) @ X if nv else rng.standard_normal((m, X.shape[1]))
        return np.vstack([X, extra]).T.copy()

    def _recon(self, A: np.ndarray, Z: np.ndarray) -> float:
        """||X_v G - A Z G||_F^2 without forming the residual."""
        D = self.X.T @ Z.T
        C = Z @ Z.T
        return max(self.xx - 2.0 * float(np.sum(A * D)) + float(np.sum((A.T @ A) * C)), 0.0)

    def _update_A(self, Z: np.ndarray) -> np.ndarray:
        C = Z @ Z.T
        D = self.X.T @ Z.T  # d x m
        if np.linalg.cond(C) > 1e12:
            return D @ np.linalg.pinv(C, hermitian=True)
        return np.linalg.solve(C, D.T).T

    def _update_Z(self, A: np.ndarray, Y: np.ndarray | None, Z0: np.ndarray | None, exact: bool = True) -> np.ndarray:
        """Column QPs: exact (FISTA + active-set polish) or a few monotone FISTA steps."""
        cfg = self.config
        lam = cfg.lam
        W = A.T @ A + lam * np.eye(self.m)
        T = A.T @ self.X.T
        if Y is not None:
            T = T + lam * Y
        if exact:
            Z, info = simplex_qp(W, T, Z0, max_iter=cfg.qp_iters, tol=cfg.qp_tol)
            self.qp_residual = max(self.qp_residual, info["residual"])
        else:
            Z, info = simplex_qp(W, T, Z0, max_iter=cfg.inner_qp_iters, tol=cfg.qp_tol, polish=False)
        self.qp_iters += info["iters"]
        return Z

    def _similarity(self) -> np.ndarray:
        return anchor_similarity(self.A, self.config.sigma, self.config.sigma_scale)

    # -- protocol ----------------------------------------------------------
    def handle(self, msg: Message) -> Message | None:
        self.qp_iters = 0
        self.qp_residual = 0.0
        if msg.kind == "init":
            self.A = self._init_anchors()
            self.Z = self._update_Z(self.A, None, None)
            recon = self._recon(self.A, self.Z)
            return Message("graph", Z=self.Z, S=self._similarity(), idx=self.idx.astype(np.uint32),
                           recon=recon, obj=recon + self.config.lam * float(np.sum(self.Z * self.Z)),
                           iters=0, qp_iters=self.qp_iters)
        if msg.kind == "guide":
            if self.A is None:
                raise RuntimeError("efimvc client: guidance before initialisation")
            Y = np.asarray(msg["P"], dtype=np.float64) @ np.asarray(msg["Z"], dtype=np.float64)
            return self._local_loop(Y)
        raise ValueError(f"efimvc client: unexpected message {msg.kind!r}")

    def _objective(self, A, Z, Y) -> tuple[float, float]:
        recon = self._recon(A, Z)
        R = Y - Z
        return recon + self.config.lam * float(np.sum(R * R)), recon

    def _local_loop(self, Y: np.ndarray) -> Message:
        """Block descent on J_v with the guidance ``Y = P_v Z[:, I_v]``, then the upload.

        ``self.trace`` keeps J_v after every step (for tests and inspection).
        """
        cfg = self.config
        A, Z = self.A, self.Z
        prev, recon = self._objective(A, Z, Y)
        it = 0
        trace = [prev]
        for it in range(1, cfg.client_iters + 1):
            A_new = self._update_A(Z)
            if self._recon(A_new, Z) <= self._recon(A, Z):  # exact minimiser; the check guards rounding
                A = A_new
            Z = self._update_Z(A, Y, Z, exact=False)
            obj, recon = self._objective(A, Z, Y)
            trace.append(obj)
            change = rel_change(obj, prev)
            prev = obj
            if change < cfg.client_tol:
                break
        # the graph that leaves the client is the exact minimiser for the final anchors
        Z = self._update_Z(A, Y, Z, exact=True)
        prev, recon = self._objective(A, Z, Y)
        self.trace = trace + [prev]
        self.A, self.Z = A, Z
        return Message("graph", Z=Z, S=self._similarity(), recon=recon, obj=prev,
                       iters=it, qp_iters=self.qp_iters)


# ---------------------------------------------------------------------------
def anchor_svd(Z: np.ndarray, embedding: str, fit: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(Z, U, s, Vt)``: the SVD of ``Z^T`` over the columns ``fit`` (a mask; all by default),
    ``Z`` first centred on those columns' mean with ``embedding: centered``."""
    cols = slice(None) if fit is None else fit
    if embedding == "centered":
        Z = Z - Z[:, cols].mean(axis=1, keepdims=True)
    U, s, Vt = np.linalg.svd(Z[:, cols].T, full_matrices=False)
    return Z, U, s, Vt


def _rows_held(n: int, idx: Mapping[int, np.ndarray], clients) -> np.ndarray:
    """Which of the ``n`` samples any of ``clients`` holds."""
    out = np.zeros(n, dtype=bool)
    for c in clients:
        out[idx[c]] = True
    return out


class EFIMVCServer(Server):
    """Fuses the clients' anchor graphs into Z (m x n) with alignments P_v (m x m)."""

    def __init__(self, config: Config, ctx: ServerContext):
        super().__init__(config, ctx)
        self.k = ctx.n_clusters
        self.m = config.n_anchors(ctx.n_clusters)
        self.n = ctx.n_samples
        self.membership = Membership(ctx.client_ids)
        self.idx: dict[int, np.ndarray] = {}
        self.Zv: dict[int, np.ndarray] = {}
        self.S: dict[int, np.ndarray] = {}
        self.L: dict[int, np.ndarray] = {}
        self.Lt: dict[int, np.ndarray] = {}
        self.recon: dict[int, float] = {}
        self.cobj: dict[int, float] = {}
        self.P: dict[int, np.ndarray] = {}
        self.term: dict[int, float] = {}  # each view's share of the overall objective
        self.Z: np.ndarray | None = None
        self.count: np.ndarray | None = None
        self.obj: float | None = None
        self.history: list[float] = []
        self.silent: dict[int, int] = {}  # member -> rounds in a row without a reply

    @property
    def members(self) -> list[int]:
        return self.membership.members

    def start(self) -> dict[int, Message]:
        return {c: Message("init") for c in self.ctx.client_ids}

    # -- objective pieces ---------------------------------------------------
    def _set_S(self, c: int, S: np.ndarray) -> None:
        S = 0.5 * (S + S.T)
        L = laplacian(S)
        self.S[c], self.L[c] = S, L
        gamma = float(np.linalg.eigvalsh(L)[-1])
        self.Lt[c] = gamma * np.eye(self.m) - L

    def _align(self, c: int, Z: np.ndarray) -> float:
        R = self.P[c] @ Z[:, self.idx[c]] - self.Zv[c]
        return float(np.sum(R * R))

    def _reg(self, c: int, ZZ: np.ndarray, L: np.ndarray | None = None) -> float:
        P = self.P[c]
        L = self.L[c] if L is None else L
        return 2.0 * self.config.beta * float(np.sum((L @ P) * (P @ ZZ)))

    def _terms(self, Z: np.ndarray) -> dict[int, tuple[float, float]]:
        ZZ = Z @ Z.T
        return {c: (self._align(c, Z), self._reg(c, ZZ)) for c in self.members}

    def _overall(self, terms) -> tuple[float, float]:
        js = sum(a + r for a, r in terms.values())
        jo = js + sum(self.recon[c] for c in self.members) / self.config.lam
        return jo, js

    # -- steps ---------------------------------------------------------------
    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        if round == 0:
            return self._init(replies)
        cfg = self.config
        stale = self.membership.stale(replies)
        updated = self.membership.fresh(replies)
        for c in self.members:
            self.silent[c] = self.silent.get(c, 0) + 1 if c in stale else 0
        joined = self.membership.join(c for c in self.membership.left_out() if c in replies and "idx" in replies[c])
        for c in joined:
            self._add_view(c, replies[c])
            new = self.count[self.idx[c]] == 0
            self.count[self.idx[c]] += 1
            self.Z[:, self.idx[c][new]] = self.Zv[c][:, new]  # a sample's first view: its graph column
        for c in updated:
            r = replies[c]
            self.Zv[c] = np.asarray(r["Z"], dtype=np.float64)
            self.recon[c] = float(r["recon"])
            self.cobj[c] = float(r["obj"])
        refreshed = self._refresh_similarities(updated, replies)
        upd = np.zeros(self.n, dtype=bool)
        for c in updated + joined:
            upd[self.idx[c]] = True
        start_obj = self._overall(self._terms(self.Z))[0]
        js, it, qp = self._server_loop(upd)
        jo = self._finish_round()
        change = rel_change(jo, self.obj)
        self.obj = jo
        self.history.append(jo)
        self.info = {
            "objective": jo,
            "objective_after_clients": start_obj,
            "server_objective": js,
            "client_objective": float(sum(self.cobj[c] for c in self.members)),
            "rel_change": change,
            "server_iters": it,
            "server_qp_iters": qp,
            "client_iters": [int(replies[c]["iters"]) for c in updated],
            "s_refreshed": refreshed,
            "stale_clients": stale,
            "joined": joined,
            "left_out": self.membership.left_out(),
        }
        converged = change < cfg.tol and not joined
        if converged or round >= cfg.max_rounds:
            return self._done(converged=converged)
        return self._outgoing()

    def _refresh_similarities(self, fresh: list[int], replies: Mapping[int, Message]) -> int:
        """Adopt each client's new anchor similarity (``s_refresh: always``, the paper), or only
        where it does not raise that view's share of the overall objective (its graph update
        alone never does); returns the count."""
        cfg = self.config
        ZZ = self.Z @ self.Z.T
        refreshed = 0
        for c in fresh:
            if "S" not in replies[c]:
                continue
            S_new = np.asarray(replies[c]["S"], dtype=np.float64)
            base = self._align(c, self.Z) + self.recon[c] / cfg.lam
            if cfg.s_refresh == "always" or base + self._reg(c, ZZ, laplacian(S_new)) <= self.term[c]:
                self._set_S(c, S_new)
                refreshed += 1
        return refreshed

    def _add_view(self, c: int, r: Message) -> None:
        """A member's first graph: its samples, ``Z_v``, errors, ``P_v = I`` and ``S_v``."""
        self.idx[c] = np.asarray(r["idx"], dtype=np.intp)
        self.Zv[c] = np.asarray(r["Z"], dtype=np.float64)
        self.recon[c] = float(r["recon"])
        self.cobj[c] = float(r["obj"])
        self.P[c] = np.eye(self.m)
        self._set_S(c, np.asarray(r["S"], dtype=np.float64))

    def _init(self, replies: Mapping[int, Message]) -> dict[int, Message]:
        if not replies:
            raise NoInput("efimvc: no client delivered its anchor graph")
        m, n = self.m, self.n
        total = np.zeros((m, n))
        count = np.zeros(n, dtype=np.int64)
        for c in self.membership.join(replies):
            self._add_view(c, replies[c])
            total[:, self.idx[c]] += self.Zv[c]
            count[self.idx[c]] += 1
        self.count = count
        self.Z = np.where(count > 0, total / np.maximum(count, 1), 1.0 / m)
        self.obj = self._finish_round()
        self.history.append(self.obj)
        self.info = {"objective": self.obj, "members": list(self.members), "left_out": self.membership.left_out(),
                     "samples_without_views": int(np.sum(count == 0))}
        return self._outgoing()

    def _finish_round(self) -> float:
        terms = self._terms(self.Z)
        cfg = self.config
        for c, (a, r) in terms.items():
            self.term[c] = a + r + self.recon[c] / cfg.lam
        return self._overall(terms)[0]

    def _server_loop(self, upd: np.ndarray) -> tuple[float, int, int]:
        cfg = self.config
        m = self.m
        Z = self.Z
        prev = self._overall(self._terms(Z))[1]
        self.server_trace = [prev]
        groups = self.count
        cols = np.flatnonzero(upd & (groups > 0))
        qp_total = 0
        it = 0
        for it in range(1, cfg.server_iters + 1):
            ZZ = Z @ Z.T
            for c in self.members if cfg.align_anchors else ():
                K = self.Zv[c] @ Z[:, self.idx[c]].T
                self.P[c], _ = gpi(self.P[c], self.Lt[c], ZZ, K, cfg.beta, cfg.gpi_iters, cfg.gpi_tol)
            R = np.zeros((m, m))
            T = np.zeros((m, self.n))
            for c in self.members:
                P = self.P[c]
                R += P.T @ self.L[c] @ P
                T[:, self.idx[c]] += P.T @ self.Zv[c]
            R = 2.0 * cfg.beta * 0.5 * (R + R.T)
            Wg = np.stack([g * np.eye(m) + R for g in range(int(groups.max()) + 1)])
            Zc, info = simplex_qp(Wg, T[:, cols], Z[:, cols], groups=groups[cols],
                                  max_iter=cfg.qp_iters, tol=cfg.qp_tol)
            qp_total += info["iters"]
            Z = Z.copy()
            Z[:, cols] = Zc
            js = self._overall(self._terms(Z))[1]
            self.server_trace.append(js)
            change = rel_change(js, prev)
            prev = js
            if change < cfg.server_tol:
                break
        self.Z = Z
        return prev, it, qp_total

    def _outgoing(self) -> dict[int, Message]:
        out = {c: Message("init") for c in self.membership.left_out()}
        out.update({c: Message("guide", Z=self.Z[:, self.idx[c]].copy(), P=self.P[c].copy()) for c in self.members})
        return out

    def embedding(self) -> np.ndarray:
        """Top-k left singular vectors of ``Z^T`` (``n x k``), rows L2-normalised.

        With ``embedding: centered`` the mean column is removed from ``Z`` first, so the
        k directions are the principal directions of the samples' anchor distributions
        rather than one direction spent on their common mean.
        """
        return normalise_rows(anchor_svd(self.Z, self.config.embedding)[1][:, : self.k])

    def orphans(self) -> np.ndarray:
        """Samples that only absent clients hold (``absent: project``; none with ``keep``)."""
        if self.config.absent == "keep":
            return np.zeros(self.n, dtype=bool)
        answering = [c for c in self.members if self.silent.get(c, 0) < self.config.absent_after]
        return _rows_held(self.n, self.idx, self.members) & ~_rows_held(self.n, self.idx, answering)

    def labels(self) -> np.ndarray:
        """k-means (``final_kmeans_init`` restarts) on :meth:`embedding`.

        With ``absent: project``, samples that only absent clients hold keep the ``Z``
        column of their last update, unlike every other column (after a crash, the
        column of round 0): left in, they bend the singular vectors away from the
        clusters. The embedding and k-means are then fitted on the other samples, and
        each orphan's column is projected onto the same singular directions
        (``z^T V_k S_k^-1``, row-normalised) and takes the nearest centre."""
        orphans = self.orphans()
        km = KMeans(n_clusters=self.k, n_init=self.config.final_kmeans_init,
                    random_state=seed_from(self.ctx.rng_for("final_kmeans", 0)))
        if not orphans.any() or orphans.all():
            return km.fit_predict(self.embedding())
        Z, U, s, Vt = anchor_svd(self.Z, self.config.embedding, ~orphans)
        out = np.empty(self.n, dtype=np.int64)
        out[~orphans] = km.fit_predict(normalise_rows(U[:, : self.k]))
        proj = Z[:, orphans].T @ Vt[: self.k].T / np.maximum(s[: self.k], 1e-300)
        out[orphans] = km.predict(normalise_rows(proj))
        return out

    def _done(self, converged: bool) -> Done:
        return Done(labels=labels_array(self.labels()), info={"objective": self.obj, "converged": converged,
                                                              "objective_history": list(self.history)})

    def result(self) -> Done | None:
        if self.Z is None:
            return None  # no anchor graphs yet
        return self._done(converged=False)


PROTOCOL = Protocol(
    name="efimvc",
    config=Config,
    client=EFIMVCClient,
    server=EFIMVCServer,
    partition="vertical",
    summary="anchor graphs (m x n_v) up, fused graph + m x m alignments down; local loops to convergence",
    paper="S. Liu, H. Yu, H. Tan, K. Liang, S. Wang, S. Yu, E. Zhu, X. Liu: Efficient Federated Incomplete "
          "Multi-View Clustering (ICML 2025)",
    quick_params={"max_rounds": 3, "client_iters": 5, "server_iters": 5, "kmeans_init": 1, "final_kmeans_init": 2},
)
