"""Tests for CeFMC driven in-process: a view that misses round 0 joins later."""

from __future__ import annotations

import numpy as np
import pytest

from raymvc.data.types import Shard
from raymvc.messages import Done
from raymvc.metrics import acc
from raymvc.protocol import ClientContext, ServerContext
from raymvc.protocols import get


def _views(n=150, k=3, seed=0):
    """View 0 holds the clusters; views 1 and 2 are pure noise."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    X0 = 6.0 * rng.standard_normal((k, 8))[y] + rng.standard_normal((n, 8))
    return [X0, rng.standard_normal((n, 8)), rng.standard_normal((n, 8))], y


def _run(method, drop, max_rounds=8, seed=0, late=lambda r: ()):
    """Drive clients and server; ``drop(round)`` names the clients whose message is lost,
    ``late(round)`` those whose reply is lost after they handled the message."""
    proto = get(method)
    cfg = proto.config(max_rounds=max_rounds, tol=0.0)
    views, y = _views(seed=seed)
    V, k, n = len(views), 3, len(y)
    clients = {v: proto.client(cfg, Shard(views=[views[v]]), ClientContext(v, V, k, seed)) for v in range(V)}
    server = proto.server(cfg, ServerContext(list(range(V)), k, seed, n_samples=n))
    out, r, infos = server.start(), 0, []
    while True:
        lost = set(drop(r)) & set(out)
        for c in clients.values():
            c.ctx.round = r
        replies = {c: clients[c].handle(m) for c, m in out.items() if c not in lost}
        for c in set(late(r)) & set(replies):
            del replies[c]
            lost.add(c)
        res = server.step(r, replies, lost)
        infos.append(dict(server.info))
        if isinstance(res, Done):
            return res, server, clients, y, infos
        out, r = res, r + 1


@pytest.mark.parametrize("method", ["cefmc", "cefmc-h"])
def test_view_missing_in_round_0_joins_and_is_used(method):
    res, server, clients, y, infos = _run(method, lambda r: {0} if r == 0 else set())
    assert infos[0]["left_out"] == [0]
    assert infos[1]["joined"] == [0] and infos[1]["left_out"] == []
    assert server.members == [1, 2, 0]
    # view 0 alone separates the clusters; the noise views alone cannot
    assert acc(y, res.labels) > 0.9
    gone, *_ = _run(method, lambda r: {0})
    assert acc(y, gone.labels) < 0.6
    # client and server hold the same fixed blocks, the late view's and the re-fixed others'
    for c in (0, 1, 2):
        np.testing.assert_array_equal(clients[c].C, server.Cfix[c])


@pytest.mark.parametrize("where", ["message", "reply"])
def test_lost_first_consensus_refixes_block(where):
    """A member whose first consensus or its answer is lost fixes its block from the next one, as the server does."""
    lose = lambda r: {1} if r == 1 else set()  # noqa: E731
    if where == "message":
        res, server, clients, y, infos = _run("cefmc", lose)
    else:
        res, server, clients, y, infos = _run("cefmc", lambda r: set(), late=lose)
    assert infos[1]["stale_clients"] == [1]
    for c in (0, 1, 2):
        np.testing.assert_array_equal(clients[c].C, server.Cfix[c])
    assert acc(y, res.labels) > 0.9
