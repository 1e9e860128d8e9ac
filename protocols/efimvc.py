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
  same count) and ``t_j = Σ_{v ∋ j} P_v^T Z_v[:, j]``. It stops when ``J`` changed by
  less than ``tol`` (relative) or after ``max_rounds`` rounds, and returns the labels.
* labels: k-means (``final_kmeans_init`` restarts) on the rows, L2-normalised, of the
  top-``k`` left singular vectors of ``Z^T``. By default (``embedding: centered``) the
  mean column of ``Z`` is removed first. The anchor-similarity term pulls every column
  of ``Z`` towards a common one, so ``Z`` is a common column plus small sample-specific
  deviations. The plain first singular vector is then that common column, and row
  normalisation lets it swamp the other ``k - 1`` directions. Centring uses ``k``
  informative directions instead (on HW with 50% of samples missing views, ACC 0.85 vs
  0.72; ProteinFold unchanged; see the table). ``embedding: plain`` is the paper's
  recipe.

Why ``J`` never increases
-------------------------
The client loop is block descent on ``J_v``: the ``A`` step is a least-squares
minimiser, and every ``Z_v`` step starts from the previous ``Z_v`` and never raises the
objective. With ``Z`` and ``P`` fixed, ``J`` changes by exactly ``ΔJ_v / λ``. The server
loop is block descent on ``J_s``: the power iteration never lowers the (convex)
function it maximises, and the ``Z`` solve is warm-started and monotone. With the
clients' variables fixed, ``J`` changes by ``ΔJ_s``. One term escapes both arguments: a
client's new anchors change ``S_v``, and with it the regulariser. So the server adopts a
new ``S_v`` only when that view's share of ``J`` with it is no larger than the share at
the end of the previous round (``s_refreshed`` in the log counts adoptions); otherwise
it keeps the old ``S_v``. This covers fault-free runs; for faults see below.

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
:func:`simplex_qp` solves ``min z^T W z - 2 t^T z`` on the simplex for all columns at
once (``W`` shared, or one ``W`` per column group). It runs monotone FISTA with adaptive
restart, the exact sort-based simplex projection, and a step set by the curvature on
``1^T z = 0``. Every ``check_every`` iterations a batched primal active-set refinement
makes columns exact: KKT systems on each column's support, ratio-test drops,
most-violating adds. Columns whose Frank-Wolfe gap (a bound on the distance to the
optimal value) is below ``qp_tol (1 + |f|)`` leave the working set. With ``λ = 1e-3``
and ``m > d_v`` the client problems are badly conditioned (κ ≈ 1e4 on the simplex
plane): FISTA alone needs ~1300 iterations, while with the refinement every column is
exact after 10-40. :func:`gpi` is the generalized power iteration for ``P_v``.

Missing replies
---------------
A client whose reply is missing in a round keeps its last ``Z_v``, ``S_v`` and
reconstruction error on the server, and is listed in ``stale_clients``; it still gets
``Z`` and ``P_v`` the next round. The server's ``Z`` solve updates only the columns of
samples with at least one fresh view: a sample with no fresh view keeps its previous
``Z`` column. A client that never delivered its round-0 graph is left out for the whole
run (``left_out``). Under faults ``J`` can rise: a client whose reply was lost has
moved on from the state the server holds.

Hyperparameters
---------------
One default for every data set, chosen offline and never with labels at run time:
``m = 2k`` anchors, ``λ = 1e-3``, ``β = 0.1``, plus ``σ`` and ``embedding`` as above.
Evidence, measured with this implementation. ProteinFold: mean over Per0.1/0.3/0.5/
0.7/0.9 and seeds 0-2 ("s0": seed 0 only). HW: handwritten with 50% of samples missing
views (point pattern), ACC for seeds 0/1/2. "plain": uncentred embedding.

=====================  ==============  ====================  =====
m, λ, β                ProteinFold     HW ACC                s/run
                       ACC/NMI/purity  seed 0 / 1 / 2        PF
=====================  ==============  ====================  =====
2k, 1e-3, 0.1 default  .315/.396/.371  .852 / .863 / .848     23
same, plain embedding  .315/.395/.370  .718 / .728 / .728     23
2k, 1e-3, 0            .310/.394/.371  .881 / .886 / .855     20
2k, 1e-3, 0.01         .310/.397/.374  .863 / .875 / .845     20
2k, 1e-3, 1            .310/.396/.370  .838 / .749 / .840     22
2k, 1e-2, 0.1          .316/.397/.371  .845 / .848 / .839     31
2k, 1e-2, 1            .312/.394/.372  .797 / .820 / .829     28
2k, 0.1, 1             .296/.378/.353  .794 / .720 / .733     22
2k, 1, 0.1             .298/.381/.355  .748 / .807 / .724     14
k, 1e-3, 0.1 (s0)      .269/.344/.321  .797                    4
3k, 1e-3, 0.1 (s0)     .309/.399/.378  .856                   50
=====================  ==============  ====================  =====

The study ran the final k-means (200 restarts) with a fixed random state; seconds are
wall time on a shared 2-core machine. Small ``λ`` wins on ProteinFold, as in the
paper's sensitivity study: there ``m > d_v``, so the reconstruction error nearly
vanishes and even ``λ = 1e-3`` balances it. Once the embedding is centred, small ``λ``
costs nothing on HW; ``λ = 1`` loses on both. ``m = k`` is clearly worse; ``m = 3k`` is
no better and takes ~50 s per ProteinFold run. ``β`` matters little, as in the paper's
ablation: ``β = 0`` (no anchor-structure term) is a little better on HW and a little
worse on ProteinFold.

The default as run by ``python benchmarks/efimvc_proteinfold.py`` (seed 0; ACC / NMI /
purity, 7 rounds each): Per0.1 .308/.384/.370, Per0.3 .293/.388/.363, Per0.5
.337/.401/.388, Per0.7 .303/.398/.366, Per0.9 .366/.441/.427; mean .321/.402/.383, with
30-48 MB and 18-29 s per file. The paper's figures are ACC .317, NMI .403, purity .380,
taking each file and metric at the best point of a 48-point grid. ``scenarios/hw-efimvc-missing.yaml``:
ACC .852, NMI .741 in 6 rounds (16 MB). CeFMC on the same split with zero-filled views
(``scenarios/hw-cefmc-missing.yaml``): ACC .733, NMI .643 in 16 rounds (1.4 MB). The
anchor graphs beat zero-filling by 12 points of ACC and use 11 times the traffic.

Cost
----
Per round, client ``v``: ``client_iters`` x (an ``m x m`` solve, ``O(d_v m n_v)``
products, ``inner_qp_iters`` FISTA steps of ``O(m^2 n_v)``), plus one exact solve.
Server: ``server_iters`` x (``V`` power iterations on ``m x m`` matrices, one batched QP
over ``n`` columns). Traffic per round and client: up ``m n_v + m^2`` floats and a few
scalars, down ``m n_v + m^2`` floats (plus ``n_v`` indices once). A ProteinFold run (694
samples, 12 clients, 7 rounds) takes 18-29 s in process on one core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import Field
from sklearn.cluster import KMeans

from raymvc.messages import Done, Message, labels_array
from raymvc.protocol import (
    Client,
    ClientContext,
    Protocol,
    ProtocolConfig,
    Server,
    ServerContext,
    seed_from,
)

# ---------------------------------------------------------------------------
# batched simplex-constrained QP
_COUNTS: dict[int, np.ndarray] = {}


def _one_to(m: int) -> np.ndarray:
    """``[1, 2, ..., m]`` as floats (cached)."""
    a = _COUNTS.get(m)
    if a is None:
        a = _COUNTS[m] = np.arange(1, m + 1, dtype=np.float64)
    return a


def project_simplex_rows(V: np.ndarray) -> np.ndarray:
    """Euclidean projection of every row of ``V`` onto the probability simplex.

    Exact, sort-based (Held/Michelot threshold): for each row the threshold ``θ`` is
    found from the sorted values and the result is ``max(v - θ, 0)``. Vectorised over
    rows.
    """
    n, m = V.shape
    U = np.sort(V, axis=1)[:, ::-1]
    css = np.cumsum(U, axis=1)
    css -= 1.0
    # u_k k > css_k holds exactly for k = 1..rho (sorted descending), so count it
    rho = np.count_nonzero(U * _one_to(m) > css, axis=1)
    theta = css[np.arange(n), rho - 1] / rho
    out = V - theta[:, None]
    np.maximum(out, 0.0, out=out)
    return out


def _centred_lmax(W: np.ndarray) -> float:
    """Largest eigenvalue of ``W`` restricted to the plane ``1^T z = 0``.

    On the simplex ``z^T 11^T z`` is constant, so only this part of the curvature
    matters; it is often far smaller than ``λmax(W)`` (anchor Gram matrices have a big
    common-mode eigenvalue), which gives a longer safe step.
    """
    m = W.shape[0]
    Q = np.eye(m) - 1.0 / m
    return float(max(np.linalg.eigvalsh(Q @ W @ Q)[-1], 1e-12))


def qp_objective(W: np.ndarray, T: np.ndarray, Z: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Per-column values ``z^T W z - 2 t^T z`` for columns of ``Z`` (m x n)."""
    Zr, Tr = Z.T, T.T
    WZ = _rows_times(W, groups if W.ndim == 3 else None, Zr)
    return np.einsum("ij,ij->i", Zr, WZ) - 2.0 * np.einsum("ij,ij->i", Tr, Zr)


def _face_solve(Wg: np.ndarray, gsel: np.ndarray | None, Tr: np.ndarray, S: np.ndarray) -> np.ndarray:
    """Minimiser of each row's QP on the affine hull of its face ``S`` (bool, r x m).

    With ``W_SS a = t_S`` and ``W_SS b = 1`` the minimiser is ``a + b (1 - 1^T a) / 1^T b``
    (the multiplier of ``1^T z = 1`` eliminated). Rows are padded to a common support
    size with identity rows; rows are processed in buckets of similar support size so
    little work is spent on padding.
    """
    r, m = S.shape
    out = np.zeros((r, m))
    s = S.sum(axis=1)
    order = np.argsort(s, kind="stable")
    ss = s[order]
    cuts = sorted({int(np.searchsorted(ss, ss[int(q * (r - 1))], side="right")) for q in (0.5, 0.85)})
    for rows in np.split(order, [c for c in cuts if 0 < c < r]):
        if rows.size == 0:
            continue
        Sr = S[rows]
        sr = s[rows]
        smax = int(sr.max())
        idx = np.argsort(~Sr, axis=1, kind="stable")[:, :smax]  # support first
        valid = np.arange(smax)[None, :] < sr[:, None]
        if gsel is None:
            Wss = Wg[idx[:, :, None], idx[:, None, :]]
        else:
            Wss = Wg[gsel[rows][:, None, None], idx[:, :, None], idx[:, None, :]]
        Wss *= valid[:, :, None] & valid[:, None, :]
        diag = np.arange(smax)
        Wss[:, diag, diag] += ~valid
        rhs = np.empty((rows.size, smax, 2))
        rhs[:, :, 0] = np.take_along_axis(Tr[rows], idx, axis=1) * valid
        rhs[:, :, 1] = valid
        sol = np.linalg.solve(Wss, rhs)
        a, b = sol[:, :, 0], sol[:, :, 1]
        z = a + ((1.0 - a.sum(axis=1)) / b.sum(axis=1))[:, None] * b
        z *= valid
        zr = np.zeros((rows.size, m))
        np.put_along_axis(zr, idx, z, axis=1)
        out[rows] = zr
    return out


def _active_set(Wg: np.ndarray, gsel: np.ndarray | None, Tr: np.ndarray, X: np.ndarray,
                passes: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Primal active-set refinement of feasible rows ``X``, batched over rows.

    The working set starts as each row's support. A pass solves every row's KKT system
    on its working set ``S`` (``[2 W_SS 1; 1^T 0] [z_S; μ] = [2 t_S; 1]``, padded to a
    common size). If the solution is feasible the row moves there and, if some gradient
    entry outside ``S`` lies below the multiplier, the most violating index joins ``S``;
    if none does, the row is optimal. If the solution is infeasible the row moves towards
    it until the first coordinate reaches zero (ratio test), and that coordinate leaves
    ``S``. Every move lowers (or keeps) the row's objective and keeps it on the simplex.
    Returns ``(X, optimal)``; raises ``LinAlgError`` on a singular system.
    """
    X = X.copy()
    S = X > 0.0
    optimal = np.zeros(len(X), dtype=bool)
    work = np.arange(len(X))
    for _ in range(passes):
        if work.size == 0:
            break
        gs = None if gsel is None else gsel[work]
        Xw, Sw, Tw = X[work], S[work], Tr[work]
        Zs = _face_solve(Wg, gs, Tw, Sw)
        neg = Sw & (Zs < 0.0)
        infeas = neg.any(axis=1)
        # infeasible rows: step towards Zs until the first coordinate hits zero
        if infeas.any():
            r = np.flatnonzero(infeas)
            xr, zr = Xw[r], Zs[r]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(neg[r], xr / (xr - zr), np.inf)
            alpha = np.clip(ratio.min(axis=1), 0.0, 1.0)
            xn = xr + alpha[:, None] * (zr - xr)
            block = ratio <= alpha[:, None] * (1.0 + 1e-12) + 1e-300
            xn[block | ~Sw[r]] = 0.0
            xn = np.maximum(xn, 0.0)
            xn /= xn.sum(axis=1, keepdims=True)
            Xw[r] = xn
            Sw[r] = Sw[r] & ~block
        # feasible rows: move to the face minimiser, then price the outside indices
        f = np.flatnonzero(~infeas)
        done_rows = np.zeros(len(work), dtype=bool)
        if f.size:
            zf = np.where(Sw[f], Zs[f], 0.0)
            Xw[f] = zf
            G = _rows_times(Wg, None if gs is None else gs[f], zf) - Tw[f]
            Sf = Sw[f]
            mu = np.sum(G * Sf, axis=1) / np.maximum(Sf.sum(axis=1), 1)
            gap = np.where(Sf, np.inf, G - mu[:, None])
            j = np.argmin(gap, axis=1)
            viol = gap[np.arange(f.size), j] < -1e-11 * (1.0 + np.abs(mu) + np.abs(G).max(axis=1))
            Sw[f[viol], j[viol]] = True
            done_rows[f[~viol]] = True
        X[work], S[work] = Xw, Sw
        optimal[work[done_rows]] = True
        work = work[~done_rows]
    return X, optimal


def _rows_times(Wg: np.ndarray, gsel: np.ndarray | None, Z: np.ndarray) -> np.ndarray:
    """Row-wise ``z W`` with a shared ``W`` or a per-row group matrix ``W[gsel]``."""
    if gsel is None:
        return Z @ Wg
    out = np.empty_like(Z)
    for g in np.unique(gsel):
        sl = gsel == g
        out[sl] = Z[sl] @ Wg[g]
    return out


def simplex_qp(
    W: np.ndarray,
    T: np.ndarray,
    Z0: np.ndarray | None = None,
    groups: np.ndarray | None = None,
    max_iter: int = 500,
    tol: float = 1e-7,
    check_every: int = 10,
    polish: bool = True,
    polish_passes: int | None = None,
) -> tuple[np.ndarray, dict]:
    """Solve ``min_z z^T W z - 2 t^T z`` s.t. ``z >= 0, 1^T z = 1`` for every column.

    ``T`` is ``m x n`` (one linear term per column). ``W`` is ``m x m`` (shared by all
    columns) or ``G x m x m`` with ``groups[j]`` in ``0..G-1`` naming column ``j``'s
    matrix. ``W`` must be symmetric positive semi-definite (positive definite on every
    face for the refinement, which is skipped if a face system is singular). ``Z0``
    (``m x n``) is a warm start, projected onto the simplex first.

    Method, vectorised over columns:

    * monotone FISTA -- the extrapolated point only proposes a step; a column moves only
      when its objective does not increase -- with gradient-based adaptive restart, the
      exact sort-based simplex projection, and a per-column step ``1 / (2 λmax)`` with
      ``λmax`` taken on the plane ``1^T z = 0`` (the only directions that matter on the
      simplex);
    * every ``check_every`` iterations (``polish``) a batched primal active-set
      refinement (:func:`_active_set`) of the columns whose support held since the last
      check; it ends at the exact minimiser within ``polish_passes`` passes (default
      ``2m``) for almost every column, and replaces the iterate where it is not worse;
    * a column whose Frank-Wolfe gap ``z^T ∇f - min_i ∇f_i`` (an upper bound on its
      distance to the optimal value) is at most ``tol * (1 + |f(z)|)`` is frozen and
      leaves the working set.

    The result never has a larger objective than the (projected) warm start. Returns
    ``(Z, info)`` with ``info = {"iters": iterations of the slowest column,
    "residual": largest Frank-Wolfe gap, "unconverged": columns not frozen}``.
    """
    T = np.asarray(T, dtype=np.float64)
    m, n = T.shape
    W = np.asarray(W, dtype=np.float64)
    if n == 0:
        return np.zeros((m, 0)), {"iters": 0, "residual": 0.0, "unconverged": 0}
    grouped = W.ndim == 3
    if grouped:
        g_all = np.asarray(groups, dtype=np.intp)
        Lg = np.ones(W.shape[0])
        for g in np.unique(g_all):
            Lg[g] = 2.0 * _centred_lmax(W[g])
        step_all = (1.0 / Lg[g_all])[:, None]
    else:
        g_all = None
        step_all = np.full((n, 1), 1.0 / (2.0 * _centred_lmax(W)))

    out = project_simplex_rows(np.full((n, m), 1.0 / m) if Z0 is None else np.asarray(Z0, dtype=np.float64).T.copy())
    res_all = np.zeros(n)
    active = np.arange(n)
    Tr = T.T.copy()
    gsel = g_all
    step = step_all

    def WZ(Zr: np.ndarray) -> np.ndarray:
        return _rows_times(W, gsel if grouped else None, Zr)

    def fval(Zr: np.ndarray, WZr: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", Zr, WZr - 2.0 * Tr)

    def fval_rows(Zr: np.ndarray, WZr: np.ndarray, Tsub: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", Zr, WZr - 2.0 * Tsub)

    n_unconv = 0
    S_prev = S_tried = None
    if polish_passes is None:
        polish_passes = 2 * m
    X = out.copy()
    WX = WZ(X)
    fX = fval(X, WX)
    Y, WY = X, WX
    t = np.ones(n)
    it = 0
    while it < max_iter and active.size:
        for _ in range(min(check_every, max_iter - it)):
            it += 1
            G = WY - Tr
            G *= 2.0 * step
            Zc = project_simplex_rows(Y - G)
            WZc = WZ(Zc)
            fZ = fval(Zc, WZc)
            better = fZ <= fX
            if better.all():
                Xn, WXn, fX = Zc, WZc, fZ
            else:
                b = better[:, None]
                Xn = np.where(b, Zc, X)
                WXn = np.where(b, WZc, WX)
                fX = np.where(better, fZ, fX)
            tn = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
            # restart where the proposal was rejected or the step went against the momentum
            restart = ~better | (np.einsum("ij,ij->i", Y - Zc, Zc - X) > 0)
            a1 = (t / tn)[:, None]
            a2 = ((t - 1.0) / tn)[:, None]
            if restart.any():
                a1[restart] = 0.0
                a2[restart] = 0.0
                tn[restart] = 1.0
            # W is linear, so W y for the next point is combined from known products
            Y = Xn + a1 * (Zc - Xn) + a2 * (Xn - X)
            WY = WXn + a1 * (WZc - WXn) + a2 * (WXn - WX)
            t = tn
            X, WX = Xn, WXn
        if polish:
            # polish rows whose support held since the last check and was not tried yet
            Sx = X > 0.0
            if S_prev is None:
                cand = np.ones(len(X), dtype=bool)
                S_tried = np.zeros_like(Sx)
            else:
                cand = (Sx == S_prev).all(axis=1) & (Sx != S_tried).any(axis=1)
            S_prev = Sx
            if cand.any():
                ci = np.flatnonzero(cand)
                gs = gsel[ci] if grouped else None
                S_tried[ci] = Sx[ci]
                try:
                    Xp, _ = _active_set(W, gs, Tr[ci], X[ci], passes=polish_passes)
                except np.linalg.LinAlgError:
                    Xp = None
                if Xp is not None:
                    WXp = _rows_times(W, gs, Xp)
                    fp = fval_rows(Xp, WXp, Tr[ci])
                    ok = fp <= fX[ci]
                    if ok.any():
                        rows = ci[ok]
                        X, WX, Y, WY, fX, t = X.copy(), WX.copy(), Y.copy(), WY.copy(), fX.copy(), t.copy()
                        X[rows] = Y[rows] = Xp[ok]
                        WX[rows] = WY[rows] = WXp[ok]
                        fX[rows] = fp[ok]
                        t[rows] = 1.0
        GX = 2.0 * (WX - Tr)
        # Frank-Wolfe gap: z^T ∇f - min_i ∇f_i >= f(z) - f*, a certified bound per column
        res = np.einsum("ij,ij->i", X, GX) - GX.min(axis=1)
        conv = res <= tol * (1.0 + np.abs(fX))
        if it >= max_iter:
            n_unconv = int(np.sum(~conv))
            conv[:] = True
        if conv.any():
            done = active[conv]
            out[done] = X[conv]
            res_all[done] = res[conv]
            keep = ~conv
            active = active[keep]
            X, WX, fX, Y, WY, t = X[keep], WX[keep], fX[keep], Y[keep], WY[keep], t[keep]
            if S_prev is not None:
                S_prev, S_tried = S_prev[keep], S_tried[keep]
            Tr, step = Tr[keep], step[keep]
            if grouped:
                gsel = gsel[keep]
    return out.T.copy(), {"iters": it, "residual": float(res_all.max()), "unconverged": n_unconv}


# ---------------------------------------------------------------------------
# configuration
class Config(ProtocolConfig):
    anchors: int = Field(default=2, ge=1, description="m = anchors * k anchors per view (ignored when m is set)")
    m: int | None = Field(default=None, ge=2, description="number of anchors; overrides anchors * k")
    lam: float = Field(default=1e-3, gt=0.0, alias="lambda", description="λ, client weight of the guidance term")
    beta: float = Field(default=0.1, ge=0.0, description="β, server weight of the anchor-graph regulariser")
    sigma: float | None = Field(default=None, gt=0.0,
                                description="kernel width of S_v; None = median anchor distance times sigma_scale")
    sigma_scale: float = Field(default=1.0, gt=0.0)
    max_rounds: int = Field(default=6, ge=1, description="outer rounds after the initial exchange")
    tol: float = Field(default=1e-3, ge=0.0, description="stop when the overall objective changes by less (relative)")
    client_iters: int = Field(default=30, ge=1)
    client_tol: float = Field(default=1e-3, ge=0.0)
    server_iters: int = Field(default=30, ge=1)
    server_tol: float = Field(default=1e-3, ge=0.0)
    gpi_iters: int = Field(default=50, ge=1)
    gpi_tol: float = Field(default=1e-6, ge=0.0)
    qp_iters: int = Field(default=300, ge=1, description="iteration cap of an exact column-QP solve")
    inner_qp_iters: int = Field(default=5, ge=1, description="FISTA steps per Z update inside the client loop")
    qp_tol: float = Field(default=1e-6, ge=0.0)
    kmeans_init: int = Field(default=10, ge=1, description="k-means restarts for the anchors on each client")
    final_kmeans_init: int = Field(default=200, ge=1, description="k-means restarts on the server's spectral embedding")
    embedding: Literal["centered", "plain"] = Field(
        default="centered", description="spectral embedding of Z: centred (mean column removed) or plain")

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
    S = 0.5 * (S + S.T)
    return np.diag(S.sum(axis=1)) - S


def _polar(M: np.ndarray) -> np.ndarray:
    U, _, Vt = np.linalg.svd(M, full_matrices=False)
    return U @ Vt


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
        Pn = _polar(2.0 * beta * (Lt @ P @ ZZ) + K)
        fn = f(Pn)
        if fn < fP:  # only by rounding; keep the better point
            break
        done = fn - fP <= tol * max(abs(fn), 1e-300)
        P, fP = Pn, fn
        if done:
            break
    return P, it


def _normalise_rows(X: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


# ---------------------------------------------------------------------------
class EFIMVCClient(Client):
    """Client v: anchors A_v (d x m) and anchor graph Z_v (m x n_v) of its present samples."""

    def __init__(self, config: Config, shard, ctx: ClientContext):
        super().__init__(config, shard, ctx)
        X = np.asarray(shard.views[0], dtype=np.float64)
        present = shard.present[0] if shard.present else None
        self.idx = np.arange(X.shape[0]) if present is None else np.flatnonzero(np.asarray(present, dtype=bool))
        # the client's own preprocessing: absent -> dropped, present samples unit L2 norm
        self.X = _normalise_rows(X[self.idx])  # n_v x d (rows are samples)
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
            change = abs(prev - obj) / max(abs(prev), 1e-300)
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
class EFIMVCServer(Server):
    """Fuses the clients' anchor graphs into Z (m x n) with alignments P_v (m x m)."""

    def __init__(self, config: Config, ctx: ServerContext):
        super().__init__(config, ctx)
        self.k = ctx.n_clusters
        self.m = config.n_anchors(ctx.n_clusters)
        self.n = ctx.n_samples
        self.members: list[int] = []
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
        fresh = [c for c in self.members if c in replies]
        stale = [c for c in self.members if c not in replies]
        refreshed = 0
        for c in fresh:
            r = replies[c]
            self.Zv[c] = np.asarray(r["Z"], dtype=np.float64)
            self.recon[c] = float(r["recon"])
            self.cobj[c] = float(r["obj"])
        # adopt a client's new anchor similarity only where it does not raise that view's
        # share of the overall objective (its graph update alone never does)
        ZZ = self.Z @ self.Z.T
        for c in fresh:
            if "S" not in replies[c]:
                continue
            S_new = np.asarray(replies[c]["S"], dtype=np.float64)
            base = self._align(c, self.Z) + self.recon[c] / cfg.lam
            if base + self._reg(c, ZZ, laplacian(S_new)) <= self.term[c]:
                self._set_S(c, S_new)
                refreshed += 1
        upd = np.zeros(self.n, dtype=bool)
        for c in fresh:
            upd[self.idx[c]] = True
        start_obj = self._overall(self._terms(self.Z))[0]
        js, it, qp = self._server_loop(upd)
        jo = self._finish_round()
        change = abs(self.obj - jo) / max(abs(self.obj), 1e-300)
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
            "client_iters": [int(replies[c]["iters"]) for c in fresh],
            "s_refreshed": refreshed,
            "stale_clients": stale,
        }
        if change < cfg.tol or round >= cfg.max_rounds:
            return self._done(converged=change < cfg.tol)
        return self._outgoing()

    def _init(self, replies: Mapping[int, Message]) -> dict[int, Message]:
        self.members = sorted(replies)
        if not self.members:
            raise RuntimeError("efimvc: no client delivered its anchor graph")
        m, n = self.m, self.n
        total = np.zeros((m, n))
        count = np.zeros(n, dtype=np.int64)
        for c in self.members:
            r = replies[c]
            self.idx[c] = np.asarray(r["idx"], dtype=np.intp)
            self.Zv[c] = np.asarray(r["Z"], dtype=np.float64)
            self.recon[c] = float(r["recon"])
            self.cobj[c] = float(r["obj"])
            self.P[c] = np.eye(m)
            self._set_S(c, np.asarray(r["S"], dtype=np.float64))
            total[:, self.idx[c]] += self.Zv[c]
            count[self.idx[c]] += 1
        self.count = count
        self.Z = np.where(count > 0, total / np.maximum(count, 1), 1.0 / m)
        self.obj = self._finish_round()
        self.history.append(self.obj)
        self.info = {"objective": self.obj, "members": self.members,
                     "left_out": sorted(set(self.ctx.client_ids) - set(self.members)),
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
            for c in self.members:
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
            change = abs(prev - js) / max(abs(prev), 1e-300)
            prev = js
            if change < cfg.server_tol:
                break
        self.Z = Z
        return prev, it, qp_total

    def _outgoing(self) -> dict[int, Message]:
        return {c: Message("guide", Z=self.Z[:, self.idx[c]].copy(), P=self.P[c].copy()) for c in self.members}

    def embedding(self) -> np.ndarray:
        """Top-k left singular vectors of ``Z^T`` (``n x k``), rows L2-normalised.

        With ``embedding: centered`` the mean column is removed from ``Z`` first, so the
        k directions are the principal directions of the samples' anchor distributions
        rather than one direction spent on their common mean.
        """
        Z = self.Z
        if self.config.embedding == "centered":
            Z = Z - Z.mean(axis=1, keepdims=True)
        U, _, _ = np.linalg.svd(Z.T, full_matrices=False)
        return _normalise_rows(U[:, : self.k])

    def labels(self) -> np.ndarray:
        """k-means (``final_kmeans_init`` restarts) on :meth:`embedding`."""
        F = self.embedding()
        km = KMeans(n_clusters=self.k, n_init=self.config.final_kmeans_init,
                    random_state=seed_from(self.ctx.rng_for("final_kmeans", 0)))
        return km.fit_predict(F)

    def _done(self, converged: bool) -> Done:
        return Done(labels=labels_array(self.labels()), info={"objective": self.obj, "converged": converged,
                                                              "objective_history": list(self.history)})

    def result(self) -> Done:
        if self.Z is None:
            raise RuntimeError("efimvc: no anchor graphs yet")
        return self._done(converged=False)


PROTOCOL = Protocol(
    name="efimvc",
    config=Config,
    client=EFIMVCClient,
    server=EFIMVCServer,
    partition="vertical",
    summary="anchor graphs (m x n_v) up, fused graph + m x m alignments down; local loops to convergence",
    paper="Liu et al., efficient federated incomplete multi-view clustering (ICML 2025)",
    quick_params={"max_rounds": 3, "client_iters": 5, "server_iters": 5, "kmeans_init": 1, "final_kmeans_init": 2},
)
