"""One BLAS/OpenMP/torch thread count per process, set once rather than per call.

Both backends must compute with the same number of threads for their floating point
to agree bit for bit. Entering ``threadpoolctl.threadpool_limits`` around every client
call cost about 2 ms a message; :func:`pin_threads` instead applies the limit once per
process and again only when new modules were imported since (a protocol that imports
torch or scikit-learn late loads new thread pools), so a call costs a dict lookup.
"""

from __future__ import annotations

import os
import sys

from threadpoolctl import threadpool_limits

_state: dict = {"n": None, "modules": -1, "first": None, "env": None}
# read by OpenMP, OpenBLAS and MKL when they load: covers libraries a protocol imports later
# (scikit-learn's OpenMP runtime arrives with its first KMeans, after the limits were set)
_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pin_threads(n: int) -> None:
    """Limit this process's native thread pools (and torch, if loaded) to ``n`` threads."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    loaded = len(sys.modules)
    if _state["n"] == n and _state["modules"] == loaded:
        return
    if _state["env"] is None:
        _state["env"] = {k: os.environ.get(k) for k in _ENV}
    for k in _ENV:
        os.environ[k] = str(n)
    limiter = threadpool_limits(limits=n)  # stays in force: not used as a context manager
    if _state["first"] is None:
        _state["first"] = limiter
    _state["n"], _state["modules"] = n, loaded


def release_threads() -> None:
    """Give the process back the thread limits it had before the first :func:`pin_threads`."""
    first = _state["first"]
    if first is not None:
        first.restore_original_limits()
    for k, v in (_state["env"] or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _state.update(n=None, modules=-1, first=None, env=None)
