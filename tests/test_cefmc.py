"""Tests for CeFMC driven in-process: a view that misses round 0 joins later."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raymvc.data.types import Shard
from raymvc.messages import Done, Message, labels_array
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


def _round0(method="cefmc", **params):
    proto = get(method)
    cfg = proto.config(**params)
    views, y = _views()
    V, k, n = len(views), 3, len(y)
    clients = {v: proto.client(cfg, Shard(views=[views[v]]), ClientContext(v, V, k, 0)) for v in range(V)}
    server = proto.server(cfg, ServerContext(list(range(V)), k, 0, n_samples=n))
    out = server.step(0, {c: clients[c].handle(m) for c, m in server.start().items()}, set())
    return server, out


def test_round0_consensus_is_a_fixed_point_of_the_server():
    """Every view answering with the consensus gives back the same labels and centroids."""
    server, out = _round0(tol=0.0)
    y0, C0 = server.y.copy(), server.C.copy()
    replies = {c: Message("labels", y=labels_array(y0), obj=1.0) for c in out}
    nxt = server.step(1, replies, set())
    assert not isinstance(nxt, Done)
    assert np.array_equal(server.y, y0) and np.allclose(server.C, C0, atol=1e-12)
    assert server.info["labels_moved"] == 0


def _one_client(**params):
    """A CeFMC client of view 0 after round 0 and its first consensus ``(y, C̄)``, which it
    fixes as ``(Y_v, C_v)`` before its H_v steps; returns the client and ``y``."""
    proto = get("cefmc")
    views, y = _views()
    client = proto.client(proto.config(**params), Shard(views=[views[0]]), ClientContext(0, 1, 3, 0))
    client.handle(Message("embed"))
    Cbar = np.linalg.qr(np.random.default_rng(1).standard_normal((3, 3)))[0]
    client.handle(Message("consensus", y=labels_array(y), C=Cbar))
    return client, y


def test_alg1_runs_until_converged_and_fixed_steps_stay_reachable():
    """Alg. 1 repeats "until convergent": by default until Eq. 25's objective changes by at
    most inner_tol (relative), inner_iters only a cap; inner_iters 3 with inner_tol 0 is the
    earlier default of three fixed steps."""
    from raymvc.protocols._common import polar, rel_change

    client, y = _one_client(**{"lambda": 100.0})  # a label term large enough to pull H_v off the singular vectors
    cfg = client.config
    assert 1 < client.h_iters < cfg.inner_iters  # ended by the test, not by the cap
    target = cfg.lam * client.C[y]

    def objective(H):
        XtH = client.X.T @ H
        return float(np.sum(XtH * XtH) + np.sum(H * target))

    H = client.H  # where it stopped: one more step moves the objective by no more than the tolerance
    assert rel_change(objective(polar(client.X @ (client.X.T @ H) + target)), objective(H)) <= cfg.inner_tol
    assert _one_client(**{"lambda": 100.0, "inner_iters": 3, "inner_tol": 0.0})[0].h_iters == 3
    assert _one_client(**{"lambda": 100.0, "inner_iters": 1})[0].h_iters == 1  # the cap holds


def test_one_view_voting_otherwise_moves_a_label_only_with_enough_weight():
    """The server weighs a view's vote by its block of C: a lone dissenting view loses."""
    server, out = _round0(tol=0.0)
    y0 = server.y.copy()
    other = (y0 + 1) % 3
    replies = {c: Message("labels", y=labels_array(y0), obj=1.0) for c in out}
    replies[2] = Message("labels", y=labels_array(other), obj=1.0)  # a noise view disagrees everywhere
    server.step(1, replies, set())
    assert np.array_equal(server.y, y0)
    every = {c: Message("labels", y=labels_array(other), obj=1.0) for c in out}
    server.step(2, every, set())
    assert np.array_equal(server.y, other)  # all views agree on other labels: the consensus follows


HW = Path(__file__).resolve().parents[1] / "scenarios" / "hw-cefmc.yaml"


def _hw_rounds(tmp_path, *sets):
    import raymvc

    r = raymvc.run(HW, backend="local", out=tmp_path / "r", overrides=["params.max_rounds=12", *sets])
    rows = [json.loads(line) for line in (tmp_path / "r" / "rounds.jsonl").read_text().splitlines()]
    objective = [row["info"]["objective"] for row in rows[1:]]
    moved = sum(row["info"]["labels_moved"] or 0 for row in rows[1:])
    return r, objective, moved


def test_hw_paper_setting_keeps_round0_labels_and_small_beta_moves_them(tmp_path):
    _, _, moved = _hw_rounds(tmp_path / "a")
    assert moved == 0  # λ = β: the fixed point above, on real data
    _, objective, moved = _hw_rounds(tmp_path / "b", "params.beta=0.001", "params.h_step=gradient")
    assert moved > 0  # β weighs the prior in the client's label step
    assert all(b >= a - 1e-12 * abs(a) for a, b in zip(objective, objective[1:]))  # never falls
