"""Split a data set over clients: missing views, vertical and horizontal splits, unaligned rows.

Every function takes a ``numpy.random.Generator`` (derived from the scenario seed) and is
deterministic given it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .types import MultiViewDataset, Partition, Shard

MISSING_PATTERNS = ("point", "block", "imbalanced")
MIN_BLOCK = 6  # shortest run of consecutive incomplete samples in the block pattern


def missing_mask(
    n: int,
    n_views: int,
    rate: float,
    pattern: str,
    rng: np.random.Generator,
    base: np.ndarray | None = None,
    imbalance_alpha: float | None = None,
) -> np.ndarray:
    """An ``(n, n_views)`` bool mask, True where a sample has a view.

    ``rate`` is the fraction of samples with at least one view missing; exactly
    ``round(rate * n)`` samples are made incomplete, and each keeps at least one view.

    - ``"point"``: incomplete samples are scattered at random; each keeps a random
      non-empty proper subset of the views (1..V-1 views).
    - ``"block"``: incomplete samples come in runs of at least 6 consecutive samples
      (fewer only when ``round(rate * n) < 6``); a run drops one common subset of views.
    - ``"imbalanced"``: views lose samples unevenly; per-view shares drawn from a
      Dirichlet(1) decide which one view each incomplete sample drops.

    With ``imbalance_alpha`` (sample-size imbalance across the clients of a vertical
    split), views lose samples unevenly: shares ``π ~ Dirichlet(alpha)`` over the views
    are drawn once, and each incomplete sample drops its views (as many as the pattern
    says) with probabilities ``π``, without replacement. A small ``alpha`` (1e-2) makes a
    few views lose most of the incomplete samples, so client sizes differ widely; a large
    one (1e2) drops views about evenly. The ``imbalanced`` pattern uses ``alpha`` in
    place of its Dirichlet(1). Every sample still keeps at least one view.

    With ``base`` (a mask already in the data), the result is intersected with it; a
    sample that would then have no view keeps its ``base`` views.
    """
    if pattern not in MISSING_PATTERNS:
        raise ValueError(f"unknown missing pattern {pattern!r}; choose one of {', '.join(MISSING_PATTERNS)}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"missing rate must be in [0, 1], got {rate}")
    if n_views < 1:
        raise ValueError(f"n_views must be >= 1, got {n_views}")
    if n_views == 1 and rate > 0:
        raise ValueError("a single-view data set cannot have missing views (rate must be 0)")
    if imbalance_alpha is not None and not imbalance_alpha > 0:
        raise ValueError(f"imbalance_alpha must be > 0, got {imbalance_alpha}")
    mask = np.ones((n, n_views), dtype=bool)
    m = int(round(rate * n))
    shares = None
    if m > 0 and imbalance_alpha is not None:
        shares = rng.dirichlet(np.full(n_views, float(imbalance_alpha)))
    if m > 0:
        if pattern == "point":
            rows = rng.choice(n, size=m, replace=False)
            mask[rows] = _random_keep(rng, m, n_views, shares)
        elif pattern == "block":
            for start, length in _block_runs(n, m, rng):
                mask[start : start + length] = _random_keep(rng, 1, n_views, shares)
        else:
            rows = rng.choice(n, size=m, replace=False)
            if shares is None:
                shares = rng.dirichlet(np.ones(n_views))
            mask[rows, rng.choice(n_views, size=m, p=shares)] = False
    if base is not None:
        base = np.asarray(base, dtype=bool)
        if base.shape != mask.shape:
            raise ValueError(f"base mask has shape {base.shape}, expected {mask.shape}")
        merged = mask & base
        empty = ~merged.any(axis=1)
        merged[empty] = base[empty]
        mask = merged
    return mask


def _random_keep(rng: np.random.Generator, count: int, n_views: int, shares: np.ndarray | None = None) -> np.ndarray:
    """``count`` rows, each keeping a random non-empty proper subset of the views.

    With ``shares`` (a probability per view), the views a row drops are drawn with those
    probabilities, without replacement (Gumbel top-k), so views with large shares lose
    more samples; without, every subset of a given size is equally likely.
    """
    n_keep = rng.integers(1, n_views, size=count)[:, None]
    if shares is None:
        ranks = np.argsort(rng.random((count, n_views)), axis=1).argsort(axis=1)
        return ranks < n_keep
    # rank views by log(share) + Gumbel noise, highest first: the top (V - n_keep) are dropped
    keys = np.log(np.maximum(shares, 1e-300))[None, :] - np.log(-np.log(rng.random((count, n_views))))
    ranks = np.argsort(-keys, axis=1).argsort(axis=1)
    return ranks >= n_views - n_keep


def _block_runs(n: int, m: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Non-overlapping ``(start, length)`` runs in sample order, lengths >= 6, summing to m."""
    max_runs = max(1, m // MIN_BLOCK)
    min_runs = min(max_runs, max(1, math.ceil(m / (5 * MIN_BLOCK))))
    r = int(rng.integers(min_runs, max_runs + 1))
    base_len = min(MIN_BLOCK, m // r)
    lengths = base_len + rng.multinomial(m - base_len * r, np.full(r, 1.0 / r))
    gaps = rng.multinomial(n - m, np.full(r + 1, 1.0 / (r + 1)))
    runs, pos = [], 0
    for length, gap in zip(lengths, gaps):
        pos += int(gap)
        runs.append((pos, int(length)))
        pos += int(length)
    return runs


def vertical(
    ds: MultiViewDataset,
    rng: np.random.Generator,
    missing: Mapping[str, Any] | np.ndarray | None = None,
) -> Partition:
    """One client per view; client ``v`` holds view ``v`` for all ``n`` samples.

    ``missing`` is ``None`` (keep the data set's own mask), a mapping with ``rate``,
    ``pattern`` and optionally ``imbalance_alpha`` (a mask drawn by :func:`missing_mask`,
    intersected with the data set's mask), or an explicit ``(n, V)`` bool mask. Absent
    rows are zero-filled. ``info["client_sizes"]`` holds each client's present rows.
    """
    n, V = ds.n_samples, ds.n_views
    if missing is None:
        mask = ds.present_mask()
    elif isinstance(missing, Mapping):
        alpha = missing.get("imbalance_alpha")
        mask = missing_mask(
            n, V, float(missing.get("rate", 0.0)), str(missing.get("pattern", "point")), rng, base=ds.present,
            imbalance_alpha=None if alpha is None else float(alpha),
        )
    else:
        mask = np.asarray(missing, dtype=bool)
        if mask.shape != (n, V):
            raise ValueError(f"missing mask has shape {mask.shape}, expected ({n}, {V})")
    shards, rows = [], []
    every = np.arange(n)  # every client's rows, in the data set's order: one read-only array for all
    every.flags.writeable = False
    for v, X in enumerate(ds.views):
        Xv = np.array(X, dtype=np.float64)
        Xv[~mask[:, v]] = 0.0
        meta: dict[str, Any] = {"view_index": v, "view_name": ds.view_names[v]}
        if v in ds.image_shapes:
            meta["image_shape"] = tuple(ds.image_shapes[v])
        present = None if mask[:, v].all() else mask[:, v].copy()
        shards.append(Shard(views=[Xv], present=[present], meta=meta))
        rows.append(every)
    info = {"missing_rate": float((~mask.all(axis=1)).mean()) if n else 0.0,
            "client_sizes": [int(c) for c in mask.sum(axis=0)]}
    return Partition(kind="vertical", shards=shards, rows=rows, n_samples=n, info=info)


def pooled_views(ds: MultiViewDataset) -> Partition:
    """The centralised reference of a vertical split: one party holds every view of every
    sample, side by side in one matrix (views in the data set's order). Needs every view of
    every sample (a missing view has nothing to pool)."""
    mask = ds.present_mask()
    if not mask.all():
        raise ValueError("the data set misses views of some samples: pooled views need every view of every sample")
    X = np.hstack([np.asarray(v, dtype=np.float64).reshape(ds.n_samples, -1) for v in ds.views])
    every = np.arange(ds.n_samples)
    every.flags.writeable = False
    meta: dict[str, Any] = {"view_index": 0, "view_name": "+".join(ds.view_names), "pooled_views": ds.n_views}
    return Partition(kind="vertical", shards=[Shard(views=[X], meta=meta)], rows=[every], n_samples=ds.n_samples,
                     info={"missing_rate": 0.0, "client_sizes": [ds.n_samples]})


SEQUENTIAL_DRAWS = 50_000_000  # samples x clients below which clients draw one after another


def _own_share(by_class: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Phase 1: client ``l`` takes the next ``counts[l]`` of its class's (shuffled) order."""
    k, used, own = len(by_class), [0] * len(by_class), []
    for l, count in enumerate(counts.tolist()):
        c = l % k
        # a copy: a slice would keep the whole class's candidates alive for every client
        take = by_class[c][used[c]:used[c] + count].copy() if count else np.empty(0, dtype=np.int64)
        used[c] += len(take)
        own.append(take)
    return own


def _fill_in_turn(by_class, counts, sizes, available, rng) -> list[np.ndarray]:
    """Phase 2, client after client: each fills up with a uniform draw from what remains,
    then its rows are shuffled (the draws of every run so far)."""
    own = _own_share(by_class, counts)
    for take in own:
        available[take] = False
    rows = []
    for l, size in enumerate(sizes):
        rest = rng.choice(np.flatnonzero(available), size=int(size) - len(own[l]), replace=False)
        available[rest] = False
        rows.append(rng.permutation(np.concatenate([own[l], rest]).astype(np.int64)))
    return rows


def _fill_at_once(by_class, counts, sizes, available, rng) -> list[np.ndarray]:
    """Phase 2 for many clients, in time linear in the samples: the remaining pool is
    shuffled once and cut in turn, and every client's rows are shuffled by one sort on
    random keys -- the same distribution as :func:`_fill_in_turn`."""
    k, m = len(by_class), len(sizes)
    cls = np.arange(m) % k
    own_parts, own_owner = [], []
    for c in range(k):  # the clients of class c take consecutive runs of its order
        mine = np.flatnonzero(cls == c)
        ends = np.minimum(np.cumsum(counts[mine]), len(by_class[c]))
        got = np.diff(np.concatenate([[0], ends]))
        own_parts.append(by_class[c][:int(ends[-1]) if len(ends) else 0])
        own_owner.append(np.repeat(mine, got))
    own = np.concatenate(own_parts).astype(np.int64) if own_parts else np.zeros(0, dtype=np.int64)
    owner = np.concatenate(own_owner).astype(np.int64) if own_owner else np.zeros(0, dtype=np.int64)
    available[own] = False
    have = np.bincount(owner, minlength=m)
    need = np.asarray(sizes, dtype=np.int64) - have
    pool = rng.permutation(np.flatnonzero(available))
    rest_owner = np.repeat(np.arange(m), need)
    idx = np.concatenate([own, pool[:len(rest_owner)]])
    who = np.concatenate([owner, rest_owner])
    order = np.lexsort((rng.random(len(idx)), who))  # by client, shuffled within each
    return Cuts(idx[order], np.concatenate([[0], np.cumsum(sizes)]))


class Cuts(Sequence):
    """``data[offsets[i]:offsets[i + 1]]`` for every ``i``, each made when it is asked for:
    a million clients' rows cost two arrays, not a million objects."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices, and IndexError past the end
        return self.data[self.offsets[i]:self.offsets[i + 1]]


class RowShards(Sequence):
    """The shards of a horizontal split, each built when it is asked for from the view and
    the client's rows (a run with many clients builds each client's once, as it starts)."""

    def __init__(self, X: np.ndarray, rows: Sequence, meta: dict):
        self.X, self.rows, self.meta = X, rows, meta

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Shard(views=[np.array(self.X[self.rows[i]], dtype=np.float64)], present=[None], meta=dict(self.meta))


def horizontal(
    ds: MultiViewDataset,
    n_clients: int | None,
    rng: np.random.Generator,
    heterogeneity: float = 0.0,
    dirichlet_alpha: float | None = None,
    view: int = 0,
) -> Partition:
    """Split the rows of one view over ``n_clients`` clients (default: number of classes).

    Label skew as in the CCFC paper: client ``l`` is tied to class ``l mod k``; it takes a
    fraction ``heterogeneity`` (p) of its samples from that class; once every client has
    its class share, the rest of each client is drawn uniformly at random from what
    remains (which also covers a class running out). p = 0 is IID, p = 1 gives each
    client one class. Client sizes are equal (n / m) or, with
    ``dirichlet_alpha``, follow a Dirichlet(alpha) quantity skew with at least 2 samples
    per client. Labels are read here only to simulate non-IID data; they are not put in
    any shard. Samples lacking ``view`` are left out of every client.
    """
    if not 0.0 <= heterogeneity <= 1.0:
        raise ValueError(f"heterogeneity must be in [0, 1], got {heterogeneity}")
    if not 0 <= view < ds.n_views:
        raise ValueError(f"view {view} out of range 0..{ds.n_views - 1}")
    classes, y = np.unique(ds.labels, return_inverse=True)
    k = len(classes)
    m = k if n_clients is None else int(n_clients)
    eligible = ds.present_mask()[:, view]
    n = int(eligible.sum())
    if dirichlet_alpha is not None:
        if dirichlet_alpha <= 0:
            raise ValueError(f"dirichlet_alpha must be > 0, got {dirichlet_alpha}")
        if m < 1 or n < 2 * m:
            raise ValueError(f"cannot give {m} clients at least 2 samples each from {n} samples")
        sizes = 2 + rng.multinomial(n - 2 * m, rng.dirichlet(np.full(m, float(dirichlet_alpha))))
    else:
        if m < 1 or n < m:
            raise ValueError(f"cannot split {n} samples over {m} clients")
        sizes = np.full(m, n // m) + (np.arange(m) < n % m)

    available = eligible.copy()
    by_class = [rng.permutation(np.flatnonzero((y == c) & eligible)) for c in range(k)]
    counts = np.minimum(np.rint(heterogeneity * sizes).astype(np.int64), sizes)
    meta: dict[str, Any] = {"view_index": view, "view_name": ds.view_names[view]}
    if view in ds.image_shapes:
        meta["image_shape"] = tuple(ds.image_shapes[view])
    if n * m <= SEQUENTIAL_DRAWS:
        rows = _fill_in_turn(by_class, counts, sizes, available, rng)
    else:
        rows = _fill_at_once(by_class, counts, sizes, available, rng)
    X = ds.views[view]
    if isinstance(rows, Cuts):  # many clients: their shards are built as they are used
        shards = RowShards(X, rows, meta)
    else:
        shards = [Shard(views=[np.array(X[idx], dtype=np.float64)], present=[None], meta=dict(meta)) for idx in rows]
    info = {
        "heterogeneity": float(heterogeneity),
        "client_sizes": [int(s) for s in sizes],
        "dirichlet_alpha": dirichlet_alpha,
        "excluded": int(ds.n_samples - n),
    }
    return Partition(kind="horizontal", shards=shards, rows=rows, n_samples=ds.n_samples, info=info)


def unalign(partition: Partition, rate: float, rng: np.random.Generator) -> Partition:
    """Shuffle a fraction ``rate`` of the complete samples' rows in every client but client 0.

    One set U of ``round(rate * n_complete)`` complete samples is drawn; each client
    ``c >= 1`` permutes its rows of U among themselves (``rows[c]`` follows), so those
    rows no longer line up across clients. Every shard gets ``meta["aligned"]``, a bool
    mask over its local rows, False on U (the same positions in every client).
    """
    if partition.kind != "vertical":
        raise ValueError("unalign applies to vertical partitions only")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"unaligned rate must be in [0, 1], got {rate}")
    n = partition.n_samples
    complete = np.ones(n, dtype=bool)
    for shard, r in zip(partition.shards, partition.rows):
        has = np.zeros(n, dtype=bool)
        local = np.ones(len(r), dtype=bool) if shard.present[0] is None else shard.present[0]
        has[r[local]] = True
        complete &= has
    candidates = np.flatnonzero(complete)
    chosen = rng.choice(candidates, size=int(round(rate * len(candidates))), replace=False)

    shards, rows = [], []
    for c, (shard, r) in enumerate(zip(partition.shards, partition.rows)):
        where = np.empty(n, dtype=np.int64)
        where[r] = np.arange(len(r))
        pos = np.sort(where[chosen])
        order = np.arange(len(r))
        if c > 0:
            order[pos] = pos[rng.permutation(len(pos))]
        aligned = np.ones(len(r), dtype=bool)
        aligned[pos] = False
        views = [X[order] for X in shard.views]
        present = [None if p is None else p[order] for p in shard.present]
        shards.append(Shard(views=views, present=present, meta={**shard.meta, "aligned": aligned}))
        rows.append(r[order])
    info = {**partition.info, "unaligned_rate": float(rate), "n_unaligned": int(len(chosen))}
    return Partition(kind=partition.kind, shards=shards, rows=rows, n_samples=n, info=info)
