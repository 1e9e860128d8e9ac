"""How frames reach client nodes: directly in this process, or to Ray actors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Outcome:
    """What became of one frame sent to a client."""

    status: str  # ok | rejected | error | crashed | timeout
    frame: bytes | None = None
    detail: str | None = None
    compute_s: float = 0.0


class LocalTransport:
    """Calls client nodes directly, in this process."""

    def __init__(self, clients: dict):
        self.clients = clients
        self.dead: set[int] = set()

    def call(self, cid: int, method: str, *args):
        if cid in self.dead:
            raise ConnectionError(f"client {cid} is dead")
        return getattr(self.clients[cid], method)(*args)

    def exchange(self, frames: dict[int, bytes]) -> dict[int, Outcome]:
        out = {}
        for cid, frame in frames.items():
            if cid in self.dead:
                out[cid] = Outcome("crashed", detail="actor is dead")
                continue
            out[cid] = Outcome(*self.clients[cid].deliver(frame))
        return out

    def kill(self, cid: int) -> None:
        self.dead.add(cid)


class RayTransport:
    """Sends frames to client actors at once and waits for replies with a wall-clock limit."""

    def __init__(self, handles: dict, timeout_s: float):
        import ray

        self.ray = ray
        self.handles = handles
        self.timeout_s = timeout_s

    def call(self, cid: int, method: str, *args):
        return self.ray.get(getattr(self.handles[cid], method).remote(*args), timeout=self.timeout_s)

    def exchange(self, frames: dict[int, bytes]) -> dict[int, Outcome]:
        ray = self.ray
        refs = {cid: self.handles[cid].deliver.remote(frame) for cid, frame in frames.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.timeout_s)
        ready = set(ready)
        out = {}
        for cid, ref in refs.items():
            if ref not in ready:
                ray.cancel(ref, force=False)
                out[cid] = Outcome("timeout", detail=f"no reply within {self.timeout_s} s wall time")
                continue
            try:
                out[cid] = Outcome(*ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
                out[cid] = Outcome("crashed", detail=type(e).__name__)
        return out

    def kill(self, cid: int) -> None:
        self.ray.kill(self.handles[cid], no_restart=True)


def make_transport(clients: dict, timeout_s: float):
    """In-process client nodes get a :class:`LocalTransport`, actor handles a :class:`RayTransport`."""
    from .nodes import ClientNode

    if clients and all(isinstance(c, ClientNode) for c in clients.values()):
        return LocalTransport(clients)
    return RayTransport(clients, timeout_s)
