"""Data sets, normalisation and client partitions for the simulator."""

from .datasets import DataError, list_builtin, load_dataset, normalize
from .partition import horizontal, missing_mask, unalign, vertical
from .types import MultiViewDataset, Partition, Shard

__all__ = [
    "DataError",
    "MultiViewDataset",
    "Partition",
    "Shard",
    "horizontal",
    "list_builtin",
    "load_dataset",
    "missing_mask",
    "normalize",
    "unalign",
    "vertical",
]
