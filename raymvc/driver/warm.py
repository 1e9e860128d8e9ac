"""Warm actors: a sweep's server and client actors kept from one run to the next.

Starting a Ray actor costs a process and its imports (about a second of a core each on
a small machine), so a sweep of many short runs spends most of its time starting
actors. Within one sweep, a run that ends cleanly hands its actors and their reserved
CPUs (a :class:`Crew`) back to :class:`WarmActors`; the next run of the same *kind*
(the same CPUs and GPUs per actor, clients per actor and placement) with at most as many
client actors as the crew has room for takes them and resets every actor it uses to a
new run: each rebuilds its protocol object,
endpoint, keys, fault plan and ledger from the new run's arguments exactly as a fresh
actor's constructor does (``reset`` calls ``__init__``), so nothing of the earlier run
is left but the process and its imports. A crew reserves room for the most client
actors any run of its kind in the sweep needs (:meth:`WarmActors.plan`) and starts its
client actors as runs first need them, so a sweep over scenarios with different client
counts starts one set of actors, not one per client count. A crew is kept only when every actor answers
after the run and none is still busy with an abandoned call; anything else (a crash
fault, a lost node, a stopped run) ends its actors as a run without warm actors would.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

KEEP_CHECK_S = 10.0  # how long a finished run's actors may take to say they can be reused


@dataclass
class Crew:
    """One run's actors and the reservation they sit in."""

    key: tuple
    seats: object  # placement.Seats
    node: object  # the Ray instance the actors live in (a restarted instance has none of them)
    room: int = 0  # client actors its reservation holds (it starts them as runs need them)
    started_now: int = 0  # actors the current run started (the rest were reset)
    server: object = None  # actor handles, once spawned
    pools: dict = field(default_factory=dict)

    def actors(self) -> list:
        return [a for a in (self.server, *self.pools.values()) if a is not None]

    def stop(self) -> None:
        """End the actors, then free their CPUs."""
        import ray

        for a in self.actors():
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.server, self.pools = None, {}
        self.seats.release()


def crew_key(sc) -> tuple:
    """What two runs must share for one to reuse the other's actors (besides room enough)."""
    rt = sc.runtime
    return (rt.address, rt.clients_per_actor, rt.client_cpus, rt.client_gpus, rt.server_cpus, rt.server_gpus,
            rt.placement)


class WarmActors:
    """Idle crews between the runs of one sweep (thread-safe: concurrent runs share it).

    ``take`` hands a run an idle crew of its kind with room enough, the smallest such (or
    ``None``: the run reserves and starts its own, with the room :meth:`plan` gave its
    kind); ``give`` takes a finished run's crew back if every actor can be
    reused, else ends it; ``close`` ends every idle crew.
    """

    def __init__(self):
        self.idle: list[Crew] = []
        self.lock = threading.Lock()
        self.waiting = 0  # runs waiting for room to reserve a new crew: crews given back are ended for them
        self.rooms: dict[tuple, int] = {}  # kind -> client actors a new crew of it reserves

    def plan(self, needs) -> None:
        """``needs``: (kind, client actors) of every run to come; a new crew of a kind
        reserves room for the largest of its runs."""
        for key, n in needs:
            self.rooms[key] = max(self.rooms.get(key, 0), int(n))

    @contextlib.contextmanager
    def reserving(self):
        """A new crew's reservation is under way (it may wait for CPUs idle crews hold)."""
        with self.lock:
            self.waiting += 1
        try:
            yield
        finally:
            with self.lock:
                self.waiting -= 1

    def acquire(self, key: tuple, n_actors: int, reserve, fits=lambda room: True) -> Crew:
        """An idle crew of this kind with room for ``n_actors`` client actors, or a new one in
        the CPUs ``reserve(room)`` reserves for ``room`` client actors: the room planned for
        the kind where the cluster could hold it at all (``fits(room)``), else the run's own
        count. While it reserves, every idle crew is ended (their CPUs may be what it needs)
        and so is every crew handed back (see :meth:`give`)."""
        from .cluster import current_node

        with self.reserving():
            crew = self.take(key, n_actors)
            if crew is not None:
                return crew
            self.make_room()
            room = max(n_actors, self.rooms.get(key, 0))
            if room > n_actors and not fits(room):
                room = n_actors
            return Crew(key, reserve(room), current_node(), room=room)

    def take(self, key: tuple, n_actors: int) -> Crew | None:
        from .cluster import current_node

        node = current_node()
        with self.lock:
            gone = [c for c in self.idle if c.node is not node]  # crews of a Ray instance since restarted
            self.idle = [c for c in self.idle if c.node is node]
            fit = [i for i, c in enumerate(self.idle) if c.key == key and c.room >= n_actors]
            found = min(fit, key=lambda i: self.idle[i].room) if fit else None
            crew = self.idle.pop(found) if found is not None else None
        for c in gone:
            c.stop()
        return crew

    def make_room(self) -> None:
        """End every idle crew: their reserved CPUs may be what a new crew needs."""
        with self.lock:
            idle, self.idle = self.idle, []
        for c in idle:
            c.stop()

    def give(self, crew: Crew, reusable: bool) -> None:
        if reusable and crew.server is not None and _all_reusable(crew):
            with self.lock:
                if not self.waiting:
                    self.idle.append(crew)
                    return
        crew.stop()

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for c in idle:
            c.stop()


def _all_reusable(crew: Crew) -> bool:
    """Every actor answers, and none still runs a call that overran its deadline."""
    import ray

    try:
        return all(ray.get([a.reusable.remote() for a in crew.actors()], timeout=KEEP_CHECK_S))
    except Exception:
        return False
