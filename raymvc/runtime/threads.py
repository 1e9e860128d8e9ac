"""One BLAS/OpenMP/torch thread count per process, set once rather than per call.

Both backends must compute with the same number of threads for their floating point
to agree bit for bit. Entering ``threadpoolctl.threadpool_limits`` around every client
call cost about 2 ms a message; :func:`pin_threads` instead applies the limit once per
process and again only when new modules were imported since (a protocol that imports
torch or scikit-learn late loads new thread pools), so a call costs a dict lookup.
"""

from __future__ import annotations

import sys

from threadpoolctl import threadpool_limits

_state: dict = {"n": None, "modules": -1, "first": None}


def pin_threads(n: int) -> None:
    """Limit this process's native thread pools (and torch, if loaded) to ``n`` threads."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    loaded = len(sys.modules)
    if _state["n"] == n and _state["modules"] == loaded:
        return
    limiter = threadpool_limits(limits=n)  # stays in force: not used as a context manager
    if _state["first"] is None:
        _state["first"] = limiter
    _state["n"], _state["modules"] = n, loaded


def release_threads() -> None:
    """Give the process back the thread limits it had before the first :func:`pin_threads`."""
    first = _state["first"]
    if first is not None:
        first.restore_original_limits()
    _state.update(n=None, modules=-1, first=None)
