"""Reserving the cluster's CPUs for a run's actors before they start (Ray placement groups).

The server's CPUs are reserved first, on the driver's node when it has room (so losing
a worker node never takes the server with it), else on any node; then one bundle per
client actor, packed onto as few nodes as possible (``runtime.placement: default``) or
spread over the nodes (``spread``). Both reservations together wait at most
``runtime.placement_timeout_s``; what could not be placed by then is a one-line
:class:`~raymvc.driver.cluster.ClusterError` naming it and the cluster's free CPUs,
never a run that waits forever for a busy or too small node.
"""

from __future__ import annotations

import math
import threading
import time

from ..scenario import Scenario
from .cluster import AUTO_CAP, AUTO_FLOOR, ClusterError, actors_needed


class Seats:
    """The reservations of one run: where the server and each client actor go."""

    def __init__(self, ray, server_pg, pools_pg, driver_node: str, client_cpus: float = 0.0):
        self.ray, self.server_pg, self.pools_pg, self.driver_node = ray, server_pg, pools_pg, driver_node
        self.client_cpus = client_cpus  # what each client actor was given (runtime.client_cpus, resolved)

    def server(self):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        if self.server_pg is None:  # a server of 0 CPUs needs no reservation: beside the driver
            return NodeAffinitySchedulingStrategy(node_id=self.driver_node, soft=True)
        return PlacementGroupSchedulingStrategy(placement_group=self.server_pg, placement_group_bundle_index=0)

    def pool(self, index: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.pools_pg, placement_group_bundle_index=index)

    def release(self) -> None:
        for pg in (self.server_pg, self.pools_pg):
            if pg is not None:
                try:
                    self.ray.util.remove_placement_group(pg)
                except Exception:  # Ray is gone already: nothing left to free
                    pass


def _group(ray, bundles: list[dict], strategy: str, near: str | None = None):
    from ray.util import placement_group

    if near is not None:
        try:  # a hint Ray follows while the node has room (private in Ray 2.60, hence the fallback)
            return placement_group(bundles, strategy=strategy, _soft_target_node_id=near)
        except (TypeError, ValueError):
            pass
    return placement_group(bundles, strategy=strategy)


def client_cpus(sc: Scenario, n_actors: int, free: float) -> float:
    """CPUs per client actor: ``runtime.client_cpus``, or with ``auto`` the ``free`` CPUs left
    after the server's shared among the actors, in hundredths, within [0.05, 1]."""
    rt = sc.runtime
    if rt.client_cpus != "auto":
        return float(rt.client_cpus)
    share = math.floor(max(0.0, free - rt.server_cpus) / max(n_actors, 1) * 100) / 100
    return min(AUTO_CAP, max(AUTO_FLOOR, share))


_RESERVING = threading.Lock()


def could_hold(sc: Scenario, n_actors: int) -> bool:
    """Whether the cluster's CPUs and GPUs, all of them free, would hold the server and
    ``n_actors`` client actors (a warm crew's room is cut to its run's own need otherwise)."""
    import ray

    rt = sc.runtime
    total = ray.cluster_resources()
    cpus = n_actors * client_cpus(sc, n_actors, total.get("CPU", 0.0)) + rt.server_cpus
    gpus = n_actors * rt.client_gpus + rt.server_gpus
    return cpus <= total.get("CPU", 0.0) + 1e-9 and gpus <= total.get("GPU", 0.0) + 1e-9


def reserve(sc: Scenario, n_clients: int, n_actors: int | None = None) -> Seats:
    """Reserve the CPUs of the server and of the actors hosting ``n_clients`` clients (or of
    ``n_actors`` client actors, where a warm crew keeps room for larger runs), or raise ClusterError.

    One reservation at a time in this process: runs of a sweep started side by side never
    each hold part of what they need while waiting for the rest (a deadlock); the one
    waiting holds nothing until all of its reservation is placed.
    """
    with _RESERVING:
        return _reserve(sc, n_clients, n_actors)


def _reserve(sc: Scenario, n_clients: int, n_actors: int | None = None) -> Seats:
    import ray

    rt = sc.runtime
    n_actors = n_actors or actors_needed(sc, n_clients)
    per = client_cpus(sc, n_actors, ray.available_resources().get("CPU", 0.0))
    _check_gpus(ray, rt, n_actors)
    here = ray.get_runtime_context().get_node_id()
    deadline = time.monotonic() + rt.placement_timeout_s
    server_pg = pools_pg = None
    if rt.server_cpus > 0 or rt.server_gpus > 0:
        server_pg = _group(ray, [_bundle(rt.server_cpus, rt.server_gpus)], "STRICT_PACK", near=here)
    seats = Seats(ray, server_pg, None, here, per)
    if server_pg is not None and not server_pg.wait(max(0.0, deadline - time.monotonic())):
        msg = _unplaced(ray, sc, n_actors, server_placed=False, per=per)
        seats.release()
        raise ClusterError(msg)
    pools_pg = _group(ray, [_bundle(per, rt.client_gpus)] * n_actors, "SPREAD" if rt.placement == "spread" else "PACK")
    seats.pools_pg = pools_pg
    if not pools_pg.wait(max(0.0, deadline - time.monotonic())):
        msg = _unplaced(ray, sc, n_actors, server_placed=True, per=per)
        seats.release()
        raise ClusterError(msg)
    return seats


def _bundle(cpus: float, gpus: float) -> dict:
    return {"CPU": cpus, "GPU": gpus} if gpus > 0 else {"CPU": cpus}


def _check_gpus(ray, rt, n_actors: int) -> None:
    """GPUs asked for that the whole cluster does not have: one line at once, not a wait."""
    need = rt.client_gpus * n_actors + rt.server_gpus
    if need <= 0:
        return
    have = ray.cluster_resources().get("GPU", 0.0)
    if need > have + 1e-9:
        key = "runtime.client_gpus" if rt.client_gpus > 0 else "runtime.server_gpus"
        raise ClusterError(f"{key}: the run needs {need:g} GPUs ({n_actors} client actors x {rt.client_gpus:g} "
                           f"+ server {rt.server_gpus:g}), the cluster has {have:g}")


def _free_per_node(ray) -> list[tuple[float, float]]:
    """(free, total) CPUs of every live node; [] when Ray does not say per node."""
    try:
        free = ray._private.state.available_resources_per_node()  # private: guarded
        return [(free.get(n["NodeID"], {}).get("CPU", 0.0), n["Resources"].get("CPU", 0.0))
                for n in ray.nodes() if n.get("Alive")]
    except Exception:
        return []


def _fits(free: list[float], size: float, n: int) -> int:
    """How many of ``n`` bundles of ``size`` CPUs fit in these free CPUs, node by node."""
    placed = 0
    for f in free:
        while placed < n and f + 1e-9 >= size:
            f -= size
            placed += 1
    return placed


def _unplaced(ray, sc: Scenario, n_actors: int, server_placed: bool, per: float | None = None) -> str:
    rt = sc.runtime
    per = per if per is not None else client_cpus(sc, n_actors, 0.0)
    nodes = _free_per_node(ray)
    if nodes:
        free, total = sum(f for f, _ in nodes), sum(t for _, t in nodes)
        missing = n_actors - _fits([f for f, _ in nodes], per, n_actors)
        where = f" (per node, free/total: {', '.join(f'{f:g}/{t:g}' for f, t in nodes)})"
    else:
        free, total = ray.available_resources().get("CPU", 0.0), ray.cluster_resources().get("CPU", 0.0)
        missing = n_actors - min(n_actors, int((free + 1e-9) // per))
        where = ""
    if server_placed:
        missing = missing or n_actors  # the bundles looked as if they fit, yet Ray placed none of them
    what = [] if server_placed else [f"the server ({rt.server_cpus:g} CPU)"]
    if missing:
        of = f"{missing} of {n_actors}" if missing < n_actors else f"{n_actors}"
        what.append(f"{of} client actor{'s' if n_actors > 1 else ''} ({per:g} CPU each)")
    return (f"runtime: {' and '.join(what)} could not be placed within {rt.placement_timeout_s:g} s "
            f"(runtime.placement_timeout_s); the cluster has {free:g} of {total:g} CPUs free{where}; "
            "lower runtime.client_cpus (or set it to auto), pool clients (runtime.clients_per_actor) or free the "
            "cluster's CPUs")
