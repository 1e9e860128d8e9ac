"""Batched simplex-constrained QP: ``min_z z^T W z - 2 t^T z`` s.t. ``z >= 0, 1^T z = 1``.

One problem per column of ``T`` (``m x n``), solved for all columns at once with ``W``
shared (``m x m``) or one ``W`` per column group (``G x m x m``). The pieces:

* :func:`project_simplex_rows` -- exact sort-based Euclidean projection onto the simplex;
* :func:`_fista_steps` -- monotone FISTA with adaptive restart, step ``1 / (2 λmax)``
  with ``λmax`` on the plane ``1^T z = 0`` (:func:`_centred_lmax`);
* :func:`_polish` -- a batched primal active-set refinement (:func:`_active_set`, with
  face solves by :func:`_face_solve`) that makes columns exact;
* :func:`_freeze` -- the Frank-Wolfe gap test that retires converged columns.

EFIMVC (:mod:`raymvc.protocols.efimvc`) uses it for the clients' and the server's
anchor-graph updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def _fvals(Zr: np.ndarray, WZr: np.ndarray, Tr: np.ndarray) -> np.ndarray:
    """Per-row objective ``z^T W z - 2 t^T z`` from the rows ``z``, their products ``z W`` and ``t``."""
    return np.einsum("ij,ij->i", Zr, WZr - 2.0 * Tr)


def qp_objective(W: np.ndarray, T: np.ndarray, Z: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Per-column values ``z^T W z - 2 t^T z`` for columns of ``Z`` (m x n)."""
    Zr = Z.T
    return _fvals(Zr, _rows_times(W, groups if W.ndim == 3 else None, Zr), T.T)


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


@dataclass
class _Work:
    """The columns still iterating, as rows, with what FISTA and the polish keep for each."""

    rows: np.ndarray  # their indices in the output
    Tr: np.ndarray  # linear terms
    step: np.ndarray  # step sizes (r x 1)
    gsel: np.ndarray | None  # group of each row (grouped W only)
    X: np.ndarray  # iterates and their products X W and objective values
    WX: np.ndarray
    fX: np.ndarray
    Y: np.ndarray  # extrapolated points and their products
    WY: np.ndarray
    t: np.ndarray  # FISTA momentum
    S_prev: np.ndarray | None = None  # supports at the last check
    S_tried: np.ndarray | None = None  # supports already polished

    def keep(self, mask: np.ndarray) -> None:
        for name in ("rows", "Tr", "step", "gsel", "X", "WX", "fX", "Y", "WY", "t", "S_prev", "S_tried"):
            a = getattr(self, name)
            if a is not None:
                setattr(self, name, a[mask])


def _column_steps(W: np.ndarray, groups: np.ndarray | None, n: int) -> tuple[np.ndarray | None, np.ndarray]:
    """Each column's group (``None`` for a shared ``W``) and step ``1 / (2 λmax)`` (n x 1)."""
    if W.ndim != 3:
        return None, np.full((n, 1), 1.0 / (2.0 * _centred_lmax(W)))
    g_all = np.asarray(groups, dtype=np.intp)
    Lg = np.ones(W.shape[0])
    for g in np.unique(g_all):
        Lg[g] = 2.0 * _centred_lmax(W[g])
    return g_all, (1.0 / Lg[g_all])[:, None]


def _fista_steps(W: np.ndarray, w: _Work, count: int) -> None:
    """``count`` monotone FISTA steps on every working row (``w`` updated in place).

    The extrapolated point only proposes a step: a row moves only where its objective
    does not increase; momentum restarts where a proposal is rejected or the step goes
    against the momentum.
    """
    X, WX, fX, Y, WY, t = w.X, w.WX, w.fX, w.Y, w.WY, w.t
    for _ in range(count):
        G = WY - w.Tr
        G *= 2.0 * w.step
        Zc = project_simplex_rows(Y - G)
        WZc = _rows_times(W, w.gsel, Zc)
        fZ = _fvals(Zc, WZc, w.Tr)
        better = fZ <= fX
        if better.all():
            Xn, WXn, fX = Zc, WZc, fZ
        else:
            b = better[:, None]
            Xn = np.where(b, Zc, X)
            WXn = np.where(b, WZc, WX)
            fX = np.where(better, fZ, fX)
        tn = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
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
    w.X, w.WX, w.fX, w.Y, w.WY, w.t = X, WX, fX, Y, WY, t


def _polish(W: np.ndarray, w: _Work, passes: int) -> None:
    """Active-set refinement of the rows whose support held since the last check and was
    not tried yet; a refined row replaces the iterate where it is not worse."""
    Sx = w.X > 0.0
    if w.S_prev is None:
        cand = np.ones(len(w.X), dtype=bool)
        w.S_tried = np.zeros_like(Sx)
    else:
        cand = (Sx == w.S_prev).all(axis=1) & (Sx != w.S_tried).any(axis=1)
    w.S_prev = Sx
    if not cand.any():
        return
    ci = np.flatnonzero(cand)
    gs = None if w.gsel is None else w.gsel[ci]
    w.S_tried[ci] = Sx[ci]
    try:
        Xp, _ = _active_set(W, gs, w.Tr[ci], w.X[ci], passes=passes)
    except np.linalg.LinAlgError:
        return
    WXp = _rows_times(W, gs, Xp)
    fp = _fvals(Xp, WXp, w.Tr[ci])
    ok = fp <= w.fX[ci]
    if not ok.any():
        return
    rows = ci[ok]
    # copies: Y and WY may still share memory with X and WX
    w.X, w.WX, w.Y, w.WY, w.fX, w.t = w.X.copy(), w.WX.copy(), w.Y.copy(), w.WY.copy(), w.fX.copy(), w.t.copy()
    w.X[rows] = w.Y[rows] = Xp[ok]
    w.WX[rows] = w.WY[rows] = WXp[ok]
    w.fX[rows] = fp[ok]
    w.t[rows] = 1.0


def _freeze(w: _Work, out: np.ndarray, res_all: np.ndarray, tol: float, final: bool) -> int:
    """Retire the rows whose Frank-Wolfe gap is at most ``tol (1 + |f|)`` into ``out``.

    The gap ``z^T ∇f - min_i ∇f_i`` bounds ``f(z) - f*``. With ``final`` every row is
    retired; returns how many of them had not converged (0 otherwise).
    """
    GX = 2.0 * (w.WX - w.Tr)
    res = np.einsum("ij,ij->i", w.X, GX) - GX.min(axis=1)
    conv = res <= tol * (1.0 + np.abs(w.fX))
    n_unconv = 0
    if final:
        n_unconv = int(np.sum(~conv))
        conv[:] = True
    if conv.any():
        done = w.rows[conv]
        out[done] = w.X[conv]
        res_all[done] = res[conv]
        w.keep(~conv)
    return n_unconv


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

    Vectorised over columns: blocks of ``check_every`` monotone FISTA steps
    (:func:`_fista_steps`); after each block (with ``polish``) the active-set refinement
    of the columns whose support held since the last check (:func:`_polish`; it ends at
    the exact minimiser within ``polish_passes`` passes, default ``2m``, for almost every
    column); then the columns whose Frank-Wolfe gap is at most ``tol (1 + |f(z)|)`` leave
    the working set (:func:`_freeze`).

    The result never has a larger objective than the (projected) warm start. Returns
    ``(Z, info)`` with ``info = {"iters": iterations of the slowest column,
    "residual": largest Frank-Wolfe gap, "unconverged": columns not frozen}``.
    """
    T = np.asarray(T, dtype=np.float64)
    m, n = T.shape
    W = np.asarray(W, dtype=np.float64)
    if n == 0:
        return np.zeros((m, 0)), {"iters": 0, "residual": 0.0, "unconverged": 0}
    gsel, step = _column_steps(W, groups, n)
    out = project_simplex_rows(np.full((n, m), 1.0 / m) if Z0 is None else np.asarray(Z0, dtype=np.float64).T.copy())
    res_all = np.zeros(n)
    Tr = T.T.copy()
    X = out.copy()
    WX = _rows_times(W, gsel, X)
    w = _Work(rows=np.arange(n), Tr=Tr, step=step, gsel=gsel, X=X, WX=WX, fX=_fvals(X, WX, Tr), Y=X, WY=WX,
              t=np.ones(n))
    passes = 2 * m if polish_passes is None else polish_passes
    it = n_unconv = 0
    while it < max_iter and w.rows.size:
        count = min(check_every, max_iter - it)
        _fista_steps(W, w, count)
        it += count
        if polish:
            _polish(W, w, passes)
        n_unconv = _freeze(w, out, res_all, tol, final=it >= max_iter)
    return out.T.copy(), {"iters": it, "residual": float(res_all.max()), "unconverged": n_unconv}
