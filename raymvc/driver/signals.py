"""Stop requests by signal, the same way for a run and for a sweep."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """Route SIGINT and SIGTERM to ``handler`` while the block runs, then restore the previous
    handlers. A previous handler marked ``raymvc_outer`` (a sweep's, around the run it runs)
    is called first, so it hears every signal. Outside the main thread (where Python allows
    no handler) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = signal.getsignal(signal.SIGINT)
    if getattr(outer, "raymvc_outer", False):  # a sweep's handler: it hears the run's signals too

        def both(signum, frame):
            outer(signum, frame)
            handler(signum, frame)

        installed = both
    else:
        installed = handler
    old = {s: signal.signal(s, installed) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
