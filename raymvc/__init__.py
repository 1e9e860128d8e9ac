"""raymvc: a Ray-based simulator for federated multi-view clustering."""

__version__ = "0.1.0"
