"""Transport: a body that several frames of a round share travels to the object store once."""

from __future__ import annotations

import numpy as np

from raymvc.channel import Endpoint
from raymvc.messages import Message
from raymvc.runtime import transport
from raymvc.runtime.transport import RayPools, RayTransport, join_frames, split_shared


def _frames(encryption="none", size=20_000, clients=(0, 1, 2)):
    server = Endpoint("server", encryption=encryption)
    ends = {c: Endpoint(f"client:{c}", encryption=encryption) for c in clients}
    for c, e in ends.items():
        server.add_peer(f"client:{c}", e.public_key())
        e.add_peer("server", server.public_key())
    msg = Message("weights", w=np.arange(size, dtype=np.float64))
    return {c: server.seal(f"client:{c}", 3, msg).frame for c in clients}, ends


def test_a_broadcast_body_is_split_off_once_and_joins_back_exactly():
    frames, ends = _frames()
    frames[9] = _frames(size=10)[0][0]  # a small frame travels whole
    plan, shared = split_shared(frames)
    assert len(shared) == 1 and plan[9] == (frames[9], -1)
    assert len({plan[c][0] for c in (0, 1, 2)}) == 3  # each keeps its own header (it names the recipient)
    assert join_frames(plan, tuple(shared)) == frames
    opened = ends[1].open(join_frames(plan, tuple(shared))[1], expect_src="server")
    np.testing.assert_array_equal(opened.msg["w"], np.arange(20_000, dtype=np.float64))


def test_encrypted_or_distinct_bodies_are_not_shared():
    frames, _ = _frames(encryption="aes-gcm")
    assert split_shared(frames)[1] == []
    frames, _ = _frames()
    assert split_shared({0: frames[0]})[1] == []  # one recipient: nothing to share
    assert split_shared(frames, min_bytes=10**9)[1] == []


def test_ray_transport_puts_a_shared_body_once(ray_session, monkeypatch):
    ray = ray_session

    @ray.remote(num_cpus=0.01)
    class Echo:
        """Stands in for a ClientPool: answers every frame with itself, says which call it got."""

        def deliver(self, frames):
            return {cid: ("ok", f, "whole", 0.0) for cid, f in frames.items()}

        def deliver_parts(self, plan, *shared):
            return {cid: ("ok", f, "parts", 0.0) for cid, f in join_frames(plan, shared).items()}

    pools = RayPools(handles={0: Echo.remote(), 1: Echo.remote()}, owner={0: 0, 1: 0, 2: 1}, sizes={0: 2, 1: 1})
    tr = RayTransport(pools, timeout_s=60.0)
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda x, **kw: puts.append(len(x)) or real_put(x, **kw))
    frames, _ = _frames(size=transport.SHARE_MIN_BYTES // 8 + 100)
    out = tr.exchange(frames)
    assert {c: o.frame for c, o in out.items()} == frames
    assert {o.detail for o in out.values()} == {"parts"} and len(puts) == 1
    small, _ = _frames(size=10)
    out = tr.exchange(small)
    assert {o.detail for o in out.values()} == {"whole"} and len(puts) == 1
    assert {c: o.frame for c, o in out.items()} == small

