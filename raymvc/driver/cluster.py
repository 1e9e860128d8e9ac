"""Starting an embedded Ray instance, or joining a running Ray cluster.

Token authentication (Ray 2.59+): an embedded instance gets a fresh token for this
process through ``RAY_AUTH_TOKEN`` (nothing is written to ``~/.ray``). When joining a
cluster, the driver uses token mode if the user set ``RAY_AUTH_MODE``,
``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``, or else if ``~/.ray/auth_token`` exists
(where ``ray start --head`` writes it). Because that file may be stale -- left by
another cluster -- the join is checked with a probe task: a driver whose authentication
the cluster does not accept gets one line naming ``runtime.address`` and what to set.
"""

from __future__ import annotations

import atexit
import math
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from .. import arithmetic
from ..scenario import Scenario

TOKEN_FILE = Path("~/.ray/auth_token")


class ClusterError(RuntimeError):
    """Joining an existing Ray cluster failed (one line, names runtime.address)."""


def _token_source() -> str | None:
    """Where the driver's token would come from, or None when the driver uses no token."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return f"RAY_AUTH_MODE={mode}" if mode == "token" else None
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        if os.environ.get(var):
            os.environ["RAY_AUTH_MODE"] = "token"
            return var
    if TOKEN_FILE.expanduser().is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
        return str(TOKEN_FILE)
    return None


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when nothing listens at host:port (Ray itself retries for minutes)."""
    if "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as e:
        raise ClusterError(f"runtime.address: cannot join the Ray cluster at {address}: "
                           f"nothing answers there ({e.__class__.__name__})") from None


class _Probe:
    def ping(self) -> bool:
        return True


def _probe(ray, address: str, token: str | None, timeout_s: float = 60.0) -> None:
    """Start one tiny actor; a cluster that rejects this driver's authentication never runs it."""
    try:
        actor = ray.remote(num_cpus=0)(_Probe).remote()
        ray.get(actor.ping.remote(), timeout=timeout_s)
        ray.kill(actor)
    except Exception as e:
        ray.shutdown()
        hint = (f"this driver used a token from {token}; if the cluster runs without token authentication set "
                "RAY_AUTH_MODE=disabled" if token else
                "if the cluster uses token authentication, set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to its token")
        raise ClusterError(f"runtime.address: the Ray cluster at {address} does not run this driver's tasks "
                           f"({type(e).__name__}); {hint}") from None


def _join(ray, address: str, kwargs: dict) -> None:
    token = _token_source()  # before Ray reads its configuration
    _check_reachable(address)
    try:
        ray.init(address=address, **kwargs)
    except Exception as e:  # ConnectionError, AuthenticationError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ClusterError(
            f"runtime.address: cannot join the Ray cluster at {address}: {first}. With token "
            "authentication, give this driver the cluster's token (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
        ) from None
    _probe(ray, address, token)


_started: dict = {"embedded": False, "exit_hook": False, "node": None}
# whether Ray copies the workers' output to this process; `raymvc run --json` turns it off,
# so stdout carries the summary alone even when Ray prints late (at shutdown)
LOG_TO_DRIVER = {"on": True}


AUTO_FLOOR, AUTO_CAP = 0.05, 1.0  # runtime.client_cpus: auto shares the free CPUs within these bounds


def actors_needed(sc: Scenario, n_clients: int) -> int:
    """Client actors (pools) a run of ``n_clients`` clients uses."""
    return math.ceil(n_clients / sc.runtime.clients_per_actor)


def cpus_needed(sc: Scenario, n_clients: int) -> float:
    """CPUs the run cannot do without (with ``client_cpus: auto``, the floor per actor)."""
    rt = sc.runtime
    per = AUTO_FLOOR if rt.client_cpus == "auto" else rt.client_cpus
    return actors_needed(sc, n_clients) * per + rt.server_cpus


def _enough(ray, sc: Scenario, n_clients: int) -> bool:
    return ray.cluster_resources().get("CPU", 0.0) + 1e-9 >= cpus_needed(sc, n_clients)


_INIT_LOCK = threading.Lock()  # runs of a sweep on several threads start Ray once


def init_ray(sc: Scenario, n_clients: int) -> float:
    """Start (or join) Ray; returns the seconds it took (0 if already running); see :func:`_init_ray`."""
    with _INIT_LOCK:
        return _init_ray(sc, n_clients)


def _init_ray(sc: Scenario, n_clients: int) -> float:
    """Start (or join) Ray; returns the seconds it took (0 if already running).

    An instance this module started that is too small for the run (a sweep's later,
    larger scenario) is restarted with enough CPUs, and stopped when a run names
    ``runtime.address``; any other running instance that is too small is a one-line
    error, never a run that waits forever for its actors.
    """
    import ray

    if ray.is_initialized():
        ours = _ours(ray)
        if not (ours and sc.runtime.address):  # a run that names a cluster leaves the embedded instance for it
            if _enough(ray, sc, n_clients):
                return 0.0
            if not ours:
                have = ray.cluster_resources().get("CPU", 0)
                raise ClusterError(f"runtime: the running Ray instance has {have:g} CPUs, the run needs "
                                   f"{cpus_needed(sc, n_clients):g} (actors x runtime.client_cpus + "
                                   "runtime.server_cpus); lower runtime.client_cpus (or set it to "
                                   "auto) or pool clients (runtime.clients_per_actor)")
        stop_embedded()
    t = time.perf_counter()
    rt = sc.runtime
    kwargs = dict(include_dashboard=False, log_to_driver=LOG_TO_DRIVER["on"], configure_logging=False)
    if rt.address:
        # every worker of the job computes in this driver's arithmetic mode (raymvc.arithmetic):
        # a cluster's workers were started from their own nodes' environments
        _join(ray, rt.address, dict(kwargs, runtime_env=arithmetic.ray_runtime_env()))
        if not _enough(ray, sc, n_clients):
            have = ray.cluster_resources().get("CPU", 0)
            ray.shutdown()
            raise ClusterError(f"runtime.address: the cluster at {rt.address} has {have:g} CPUs, the run needs "
                               f"{cpus_needed(sc, n_clients):g}; lower runtime.client_cpus (or set it to auto) "
                               "or pool clients (runtime.clients_per_actor)")
    else:
        if os.environ.get("RAY_AUTH_MODE") != "disabled" and not (
                os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # this process's own; nothing on disk
        need = math.ceil(cpus_needed(sc, n_clients))
        # address="local": always a fresh embedded instance, even if `ray start` runs here.
        # Token mode stays on (Ray's default); only Ray's notice about it is not shown.
        import logging

        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        # The embedded instance's processes inherit this driver's environment, which already
        # holds its arithmetic mode (raymvc.arithmetic.apply ran on import): no job-level
        # runtime_env, which would keep Ray from handing the run its prestarted workers.
        ray.init(address="local", num_cpus=max(rt.num_cpus or os.cpu_count() or 1, need), **kwargs)
        if not _started["exit_hook"]:
            atexit.register(stop_embedded)  # runs before Ray's own exit hook (registered at import)
            _started["exit_hook"] = True
        _started["embedded"], _started["node"] = True, _node(ray)
    return time.perf_counter() - t


def _node(ray):
    """Ray's handle on the processes this driver started (private; None if Ray has no such attribute)."""
    return getattr(getattr(ray, "_private", None) and ray._private.worker, "_global_node", None)


def current_node():
    """The running Ray instance's handle in this process (None when Ray is not running)."""
    import ray

    return _node(ray) if ray.is_initialized() else None


def _ours(ray) -> bool:
    """Whether the running instance is the embedded one this module started (not one the caller
    started or joined after shutting ours down)."""
    return _started["embedded"] and ray.is_initialized() and _node(ray) is _started["node"]


def stop_embedded() -> None:
    """Stop the embedded instance this module started, quickly; called at exit.

    Ray's own exit hook sleeps 0.5 s for late log lines, then sends SIGTERM to each of its
    processes in turn and waits up to 1 s for each; the autoscaler monitor of a local
    instance never exits on SIGTERM, so every process paid that second. Here the monitor
    (which has nothing to save for an instance that ends with this process) is killed
    first, then Ray shuts down as usual; Ray's hook then finds nothing left to do. Worker
    log lines that arrive after that are not waited for (the engine records workers'
    failures itself). An instance the caller started or joined is left alone.
    """
    import ray

    if not _ours(ray):
        _started["embedded"] = False
        return
    try:
        node = _node(ray)  # private: guarded, a plain shutdown follows anyway
        for info in (node.all_processes.get("monitor", []) if node is not None else []):
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception:
        pass
    ray.shutdown()
    _started["embedded"] = False
