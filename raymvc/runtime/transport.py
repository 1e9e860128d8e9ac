"""How frames reach client nodes: directly in this process, or to Ray actors.

On Ray every actor is a :class:`~raymvc.runtime.nodes.ClientPool` hosting one or more
logical clients (``runtime.clients_per_actor``, default 1). A round sends one call per
actor, all at once, and waits for them together (``ray.wait``) with a wall-clock limit.

Frames arrive as ``(header, body)`` pairs. A body that several actors' frames share (a
broadcast without encryption: the server encodes it once and every frame holds the same
body object) and that is at least :data:`SHARE_MIN_BYTES` long is put in Ray's object
store once and passed to each actor by reference; otherwise Ray would copy it into the
store once per call. Only the per-recipient headers travel per call.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field

# what a pooled actor may take beyond its clients' deadlines before the whole actor counts as hung
POOL_GRACE_S = 5.0


@dataclass
class Outcome:
    """What became of one frame sent to a client."""

    status: str  # ok | rejected | error | crashed | timeout
    frame: bytes | None = None
    detail: str | None = None  # one line
    compute_s: float = 0.0
    traceback: str | None = None  # an error's full traceback (bounded)


# below this Ray passes arguments inline with the call (its own limit is 100 KiB), where a
# shared reference would cost more than the copy it saves
SHARE_MIN_BYTES = 100 * 1024


class Interruption(BaseException):
    """Raised into client code from outside it (a wall-clock limit, the driver's stop): it
    passes through the client's call instead of becoming that client's error."""


class _Hung(Interruption):
    """Raised inside a client call that outlived ``runtime.reply_timeout_s`` (in-process backend)."""


@contextlib.contextmanager
def _wall_limit(seconds: float | None):
    """Interrupt the body after ``seconds`` of wall time (SIGALRM; main thread only, else no limit)."""
    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum, frame):
        raise _Hung()

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


LOST_NAMES = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "NodeDiedError", "ObjectLostError",
               "OwnerDiedError", "WorkerCrashedError")  # ObjectLostError covers ObjectReconstructionFailedError


def party_lost(e: BaseException) -> bool:
    """Whether an exception means a party (or an object it held) is gone or out of reach --
    its process or node lost, no answer in time -- rather than code that raised. An actor
    whose constructor raised is code that raised; so is a remote call that raised, unless
    what it raised is itself a lost party (a server that lost an object with its node)."""
    if isinstance(e, TimeoutError):  # Ray's GetTimeoutError is one too
        return True
    import sys

    ray = sys.modules.get("ray")
    if ray is None or "creation task" in str(e):
        return False
    rex = ray.exceptions
    if isinstance(e, rex.RayTaskError):
        cause = getattr(e, "cause", None)
        return cause is not None and cause is not e and party_lost(cause)
    return isinstance(e, tuple(getattr(rex, n) for n in LOST_NAMES if hasattr(rex, n)))


def _limited(fn, seconds: float | None, busy: set, cid: int):
    """``fn()`` within ``seconds`` of wall time. On the main thread SIGALRM interrupts it; on
    any other thread (a run started from a thread of the caller's: no signal reaches it) it
    runs on a thread of its own that the caller stops waiting for: a client that overruns is
    then left busy (``busy``) and out of the run, as a hung actor is on Ray."""
    if not seconds or threading.current_thread() is threading.main_thread():
        with _wall_limit(seconds):
            return fn()
    box: dict = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller as it is
            box["error"] = e

    t = threading.Thread(target=work, name=f"raymvc-client-{cid}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        busy.add(cid)
        raise _Hung()
    if "error" in box:
        raise box["error"]
    return box["value"]


class LocalTransport:
    """Calls client nodes directly, in this process, each call limited to ``timeout_s`` of wall time."""

    def __init__(self, clients: dict, timeout_s: float | None = None):
        self.clients = clients
        self.timeout_s = timeout_s
        self.dead: set[int] = set()
        self.busy: set[int] = set()  # still inside a call that overran (off the main thread): never called again

    def _run(self, cid: int, fn):
        return _limited(fn, self.timeout_s, self.busy, cid)

    def call(self, cid: int, method: str, *args):
        if cid in self.dead or cid in self.busy:
            raise ConnectionError(f"client {cid} is {'dead' if cid in self.dead else 'still busy past its deadline'}")
        try:
            return self._run(cid, lambda: getattr(self.clients[cid], method)(*args))
        except _Hung:
            raise TimeoutError(f"client {cid} did not answer within {self.timeout_s} s") from None

    def hello_all(self, cids: list[int], key: bytes | None) -> dict[int, object]:
        """Every client's public key, or the exception that kept it from answering."""
        out: dict[int, object] = {}
        for cid in cids:
            try:
                out[cid] = self.call(cid, "hello", key)
            except Exception as e:
                out[cid] = e
        return out

    def exchange(self, frames: dict[int, tuple[bytes, bytes]]) -> dict[int, Outcome]:
        out = {}
        for cid, frame in frames.items():
            if cid in self.dead:
                out[cid] = Outcome("crashed", detail="actor is dead")
                continue
            if cid in self.busy:
                out[cid] = Outcome("timeout", detail="still busy with a call that overran its deadline")
                continue
            try:
                out[cid] = Outcome(*self._run(cid, lambda cid=cid, frame=frame: self.clients[cid].deliver(frame)))
            except _Hung:
                out[cid] = Outcome("timeout", detail=f"no reply within {self.timeout_s} s wall time")
        return out

    def probe(self, cids: list[int], model: bytes) -> dict[int, tuple]:
        """Each live client's labels with ``model`` on a copy of it (``ClientNode.probe``),
        each within ``timeout_s`` of wall time like any call."""
        out = {}
        for cid in cids:
            if cid in self.dead or cid in self.busy:
                continue
            try:
                out[cid] = self._run(cid, lambda cid=cid: self.clients[cid].probe(model))
            except _Hung:
                out[cid] = ("error", f"no reply within {self.timeout_s} s wall time", None)
        return out

    def kill(self, cid: int) -> None:
        self.dead.add(cid)

    def placement(self) -> dict[int, str]:
        return {cid: "local" for cid in self.clients}


@dataclass
class RayPools:
    """Actor handles of the client pools and which pool hosts which client."""

    handles: dict[int, object]  # pool id -> actor handle
    owner: dict[int, int]  # client id -> pool id
    sizes: dict[int, int] = field(default_factory=dict)  # pool id -> logical clients


class RayTransport:
    """Sends frames to the client pools at once and waits for replies with a wall-clock limit."""

    def __init__(self, pools: RayPools, timeout_s: float):
        import ray

        self.ray = ray
        self.pools = pools
        self.timeout_s = timeout_s
        self.dead: set[int] = set()  # logical clients killed inside a pool that lives on
        self.shared_puts = 0  # broadcast bodies put in the object store once for several actors

    def _pool(self, cid: int):
        return self.pools.handles[self.pools.owner[cid]]

    def call(self, cid: int, method: str, *args):
        return self.ray.get(getattr(self._pool(cid), method).remote(cid, *args), timeout=self.timeout_s)

    def hello_all(self, cids: list[int], key: bytes | None) -> dict[int, object]:
        """Every client's public key (one call per actor, all at once), or the exception that
        kept it from answering within the timeout."""
        ray = self.ray
        wanted = set(cids)
        pools = sorted({self.pools.owner[c] for c in cids})
        refs = {pid: self.pools.handles[pid].hello_all.remote(key) for pid in pools}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.timeout_s)
        ready = set(ready)
        out: dict[int, object] = {}
        for pid, ref in refs.items():
            members = [c for c, p in self.pools.owner.items() if p == pid and c in wanted]
            try:
                if ref not in ready:
                    raise TimeoutError(f"no answer within {self.timeout_s} s")
                keys = ray.get(ref)
                out.update({c: keys[c] for c in members})
            except Exception as e:
                out.update({c: e for c in members})
        return out

    def exchange(self, frames: dict[int, tuple[bytes, bytes]]) -> dict[int, Outcome]:
        ray = self.ray
        groups: dict[int, dict[int, tuple]] = {}
        out: dict[int, Outcome] = {}
        for cid, frame in frames.items():
            if cid in self.dead:
                out[cid] = Outcome("crashed", detail="logical client killed")
                continue
            groups.setdefault(self.pools.owner[cid], {})[cid] = frame
        calls = self._share_bodies(groups)
        refs = {pid: self.pools.handles[pid].deliver.remote(group, self.timeout_s, *shared)
                for pid, (group, shared) in calls.items()}
        # a pool gives each of its clients, one after another, up to timeout_s and answers for
        # the one that overran itself; past this the actor as a whole is stuck (e.g. in native code)
        limit = self.timeout_s * max((len(g) for g in groups.values()), default=1) + POOL_GRACE_S
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=limit) if refs else ([], [])
        ready = set(ready)
        for pid, ref in refs.items():
            if ref not in ready:
                ray.cancel(ref, force=False)
                for cid in groups[pid]:
                    out[cid] = Outcome("timeout", detail=f"no reply within {limit} s wall time")
                continue
            try:
                out.update({cid: Outcome(*res) for cid, res in ray.get(ref).items()})
            except Exception as e:  # the actor, its node or an object it held is gone: its clients crashed
                if not party_lost(e):
                    raise
                out.update({cid: Outcome("crashed", detail=type(e).__name__) for cid in groups[pid]})
        return {cid: out[cid] for cid in frames}

    def _share_bodies(self, groups: dict[int, dict[int, tuple]]) -> dict[int, tuple[dict, list]]:
        """Per actor: its frames, with every body that other actors' frames share (same
        object) and of at least :data:`SHARE_MIN_BYTES` replaced by an index into the
        call's extra arguments, which are object references put once for all actors."""
        users: dict[int, tuple[bytes, set[int]]] = {}  # id(body) -> (body, actors whose frames hold it)
        for pid, group in groups.items():
            for _, body in group.values():
                if len(body) >= SHARE_MIN_BYTES:
                    users.setdefault(id(body), (body, set()))[1].add(pid)
        put = {key: self.ray.put(body) for key, (body, pids) in users.items() if len(pids) > 1}
        self.shared_puts += len(put)
        calls = {}
        for pid, group in groups.items():
            shared: list = []
            slot: dict[int, int] = {}
            parts = {}
            for cid, (header, body) in group.items():
                key = id(body)
                if key in put:
                    if key not in slot:
                        slot[key] = len(shared)
                        shared.append(put[key])
                    parts[cid] = (header, slot[key])
                else:
                    parts[cid] = (header, body)
            calls[pid] = (parts, shared)
        return calls

    def probe(self, cids: list[int], model: bytes) -> dict[int, tuple]:
        """``ClientPool.probe`` on every pool hosting one of ``cids``, all at once; a pool
        that is gone or does not answer within the reply timeout labels nothing."""
        ray = self.ray
        groups: dict[int, list[int]] = {}
        for cid in cids:
            if cid not in self.dead:
                groups.setdefault(self.pools.owner[cid], []).append(cid)
        shared = ray.put(model) if len(groups) > 1 else model
        refs = {pid: self.pools.handles[pid].probe.remote(members, shared) for pid, members in groups.items()}
        # a pool probes its clients one after another: the exchange's limit for such a call
        limit = self.timeout_s * max((len(g) for g in groups.values()), default=1) + POOL_GRACE_S
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=limit) if refs else ([], [])
        ready = set(ready)
        out: dict[int, tuple] = {}
        for pid, ref in refs.items():
            why = None
            if ref not in ready:  # still running: the pool's next call waits for it
                ray.cancel(ref, force=False)
                why = f"no reply within {limit} s wall time"
            else:
                try:
                    out.update(ray.get(ref))
                except Exception as e:
                    if not party_lost(e):
                        raise
                    why = f"lost ({type(e).__name__})"
            if why is not None:
                out.update({cid: ("error", why, None) for cid in groups[pid]})
        return out

    def kill(self, cid: int) -> None:
        pid = self.pools.owner[cid]
        self.dead.add(cid)
        if self.pools.sizes.get(pid, 1) == 1:
            self.ray.kill(self.pools.handles[pid], no_restart=True)  # a real crash: the process is gone
        else:  # its neighbours live on; the pool drops it without waiting (it may be busy or hung)
            self.pools.handles[pid].kill.remote(cid)

    def placement(self) -> dict[int, str]:
        """Node id of every client's actor (``unreachable`` for an actor that did not answer);
        the GPU ids Ray gave each client's actor are kept in ``gpu_ids`` (``None`` where unknown)."""
        ray = self.ray
        refs = {pid: h.where.remote() for pid, h in self.pools.handles.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=min(self.timeout_s, 60.0))
        ready = set(ready)
        by_pool = {}
        for pid, ref in refs.items():
            try:
                by_pool[pid] = ray.get(ref) if ref in ready else ("unreachable", None)
            except Exception:
                by_pool[pid] = ("unreachable", None)
        owners = sorted(self.pools.owner.items())
        self.gpu_ids = {cid: by_pool[pid][1] for cid, pid in owners}
        # each client actor's arithmetic (raymvc.arithmetic), by pool
        self.arithmetic = {f"pool {pid}": got[2] for pid, got in by_pool.items() if len(got) > 2}
        return {cid: by_pool[pid][0] for cid, pid in owners}


def make_transport(clients, timeout_s: float):
    """In-process client nodes get a :class:`LocalTransport`, Ray client pools a :class:`RayTransport`."""
    if isinstance(clients, RayPools):
        return RayTransport(clients, timeout_s)
    return LocalTransport(clients, timeout_s)
