"""Data containers shared by loaders, partitioners, the engine and protocols."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class MultiViewDataset:
    """A multi-view data set held by the simulation driver.

    ``views[v]`` is an ``(n, d_v)`` float64 array. ``present`` is an ``(n, V)`` bool
    mask (``None`` = every view present for every sample); absent rows are filled
    with zeros so arrays stay dense. ``labels`` are ground truth, used only to score
    and to build label-skewed horizontal splits -- never by a method; ``-1`` everywhere
    when the data has none. ``k`` fixes the number of clusters (``data.n_clusters``);
    without it the number of distinct labels counts.
    """

    name: str
    views: list[np.ndarray]
    labels: np.ndarray
    present: np.ndarray | None = None
    view_names: list[str] = field(default_factory=list)
    image_shapes: dict[int, tuple[int, int]] = field(default_factory=dict)
    source: str = ""
    k: int | None = None

    def __post_init__(self) -> None:
        n = len(self.labels)
        for v, X in enumerate(self.views):
            if X.ndim != 2 or X.shape[0] != n:
                raise ValueError(f"{self.name}: view {v} has shape {X.shape}, expected ({n}, d)")
        if self.present is not None and self.present.shape != (n, len(self.views)):
            raise ValueError(f"{self.name}: present mask shape {self.present.shape} != ({n}, {len(self.views)})")
        if not self.view_names:
            self.view_names = [f"view{v}" for v in range(len(self.views))]

    @property
    def n_samples(self) -> int:
        return int(len(self.labels))

    @property
    def n_views(self) -> int:
        return len(self.views)

    @property
    def n_clusters(self) -> int:
        if self.k is not None:
            return int(self.k)
        return int(len(np.unique(self.labels[self.labels >= 0])))

    @property
    def has_labels(self) -> bool:
        """Whether ground truth exists (unlabelled data is scored without it)."""
        return bool(len(self.labels)) and bool(np.all(self.labels >= 0))

    @property
    def dims(self) -> list[int]:
        return [int(X.shape[1]) for X in self.views]

    def present_mask(self) -> np.ndarray:
        if self.present is None:
            return np.ones((self.n_samples, self.n_views), dtype=bool)
        return self.present


@dataclass
class Shard:
    """One client's private data.

    ``views`` holds the views this client owns (one for vertical splits, one for
    horizontal splits of a single-view data set), each ``(n_local, d)``.
    ``present[v]`` is a bool mask over the local rows (``None`` = all present).
    ``meta`` carries public facts such as ``image_shape`` or ``view_index``.
    """

    views: list[np.ndarray]
    present: list[np.ndarray | None] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.present:
            self.present = [None] * len(self.views)

    @property
    def n_local(self) -> int:
        return int(self.views[0].shape[0]) if self.views else 0

    @property
    def rows_held(self) -> int:
        """Rows this client really holds: its present rows where a vertical split has missing views."""
        present = self.present[0] if self.present else None
        return int(np.sum(present)) if present is not None else self.n_local

    @property
    def X(self) -> np.ndarray:
        """The first (usually only) view."""
        return self.views[0]


@dataclass
class Partition:
    """Shards for every client plus the driver-side bookkeeping to score them.

    ``rows[c]`` maps client ``c``'s local row order to global sample indices; it stays
    on the driver (used only to put clients' predictions back in order for scoring).
    ``kind`` is ``"vertical"`` or ``"horizontal"``.
    """

    kind: str
    shards: list[Shard]
    rows: list[np.ndarray]
    n_samples: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_clients(self) -> int:
        return len(self.shards)
