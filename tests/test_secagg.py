"""Secure aggregation: Shamir sharing, masking, dropout recovery, and a run through the engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag

from raymvc.channel import codec
from raymvc.messages import Message
from raymvc.runtime import secagg as sa

# ---------------------------------------------------------------------------
# Shamir


def _is_probable_prime(n: int) -> bool:
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_field_is_prime_and_holds_32_byte_secrets():
    assert _is_probable_prime(sa.PRIME) and sa.PRIME > 2**256


@pytest.mark.parametrize("t,n", [(1, 1), (2, 3), (3, 5), (4, 6)])
def test_shamir_any_t_shares_rebuild_t_minus_1_do_not(t, n):
    import itertools

    secret = 2**256 - 12345
    xs = [c + 1 for c in range(n)]
    shares = sa.shamir_split(secret, t, xs)
    for subset in itertools.combinations(xs, t):
        assert sa.shamir_reconstruct({x: shares[x] for x in subset}, t) == secret
    if t > 1:
        few = {x: shares[x] for x in xs[: t - 1]}
        with pytest.raises(ValueError, match="need"):
            sa.shamir_reconstruct(few, t)
        assert sa.shamir_interpolate(few) != secret  # t - 1 shares interpolate to something else


def test_shamir_t_minus_1_shares_fit_every_secret():
    """Hiding: for any candidate secret a polynomial of degree t-1 passes through t-1 shares."""
    t = 3
    shares = sa.shamir_split(42, t, [1, 2, 3, 4])
    two = {1: shares[1], 2: shares[2]}
    for candidate in (0, 41, 7**60):
        # the polynomial through (0, candidate) and the two shares has degree <= t-1 ...
        poly = {0: candidate, **two}
        assert sa.shamir_interpolate(poly) == candidate
        # ... and, extended to a third point, rebuilds that candidate: both are equally possible
        x3 = 4
        y3 = _lagrange_at(poly, x3)
        assert sa.shamir_reconstruct({**two, x3: y3}, t) == candidate


def _lagrange_at(pts: dict[int, int], x: int) -> int:
    total = 0
    for xi, yi in pts.items():
        num = den = 1
        for xj in pts:
            if xj != xi:
                num = num * (x - xj) % sa.PRIME
                den = den * (xi - xj) % sa.PRIME
        total = (total + yi * num * pow(den, -1, sa.PRIME)) % sa.PRIME
    return total


def test_shamir_rejects_bad_arguments():
    with pytest.raises(ValueError):
        sa.shamir_split(1, 4, [1, 2, 3])
    with pytest.raises(ValueError):
        sa.shamir_split(1, 2, [1, 1, 2])
    with pytest.raises(ValueError):
        sa.shamir_split(sa.PRIME, 2, [1, 2])


def test_fixed_point_round_trip_and_wraparound_sum():
    v = np.array([-3.25, 0.0, 1e-6, 1234.5])
    for bits, frac in ((64, 24), (32, 12)):
        u = sa.encode_fixed(v, frac, bits)
        assert u.dtype == sa.ring_dtype(bits)
        np.testing.assert_allclose(sa.decode_fixed(u, frac, bits), v, atol=2.0**-frac)
        s = u + u + sa.encode_fixed(-v, frac, bits)  # negative numbers wrap around and cancel
        np.testing.assert_allclose(sa.decode_fixed(s, frac, bits), v, atol=2 * 2.0**-frac)


# ---------------------------------------------------------------------------
# An in-memory driver: every message goes through the codec, the server's inbox is recorded


class Net:
    def __init__(self, n: int, params: sa.SecAggParams | None = None):
        self.params = params or sa.SecAggParams()
        self.server = sa.SecAggServer(range(n), self.params)
        self.clients = {c: sa.SecAggClient(c, self.params) for c in range(n)}
        self.inbox: list[Message] = []  # everything the server received
        self.senders: list[int] = []  # who sent each message of the inbox
        self.rounds = 0

    def exchange(self, out: dict[int, Message], drop: set[int] = frozenset(), x=None, w=None,
                 late: set[int] = frozenset()):
        """``drop``: never acted on; ``late``: acted on, the reply reached the server's inbox
        but after the deadline, so the protocol treats it as missing."""
        self.rounds += 1
        replies = {}
        for c, msg in out.items():
            msg = codec.decode(codec.encode(msg))
            if c in drop:
                continue
            cl = self.clients[c]
            rep = cl.handle(msg) if cl.owns(msg) else cl.masked(msg, x[c], w[c])
            if rep is not None:
                rep = codec.decode(codec.encode(rep))
                self.inbox.append(rep)
                self.senders.append(c)
                if c not in late:
                    replies[c] = rep
        missing = set(out) - set(replies)
        return replies, missing

    def setup(self, drop_advertise=frozenset(), drop_shares=frozenset()):
        replies, missing = self.exchange(self.server.start(), drop_advertise)
        out = self.server.step(replies, missing)
        replies, missing = self.exchange(out.send, drop_shares)
        res = self.server.step(replies, missing)
        assert res.send is None and self.server.ready

    def aggregate(self, x, w, drop_input=frozenset(), drop_unmask=frozenset(), late=frozenset(),
                  drop_reply=frozenset(), late_unmask=frozenset()) -> sa.Outcome:
        """One aggregation as the engine runs it: the clients' replies bring fresh mask keys
        (``drop_reply``: clients whose reply never came), then masked input, then unmasking."""
        senders = [c for c in self.clients if c not in drop_reply]
        keys = {}
        for c in senders:
            key = self.clients[c].fresh_key()
            if key is not None:
                keys[c] = codec.decode(codec.encode(key))
                self.inbox.append(keys[c])
                self.senders.append(c)
        self.server.take_keys(keys)
        self.server.begin(among=senders)
        req = self.server.input_requests("model", {}, senders)
        replies, missing = self.exchange(req, drop_input, x, w, late)
        out = self.server.step(replies, missing)
        if out.send is None:
            return out
        replies, missing = self.exchange(out.send, drop_unmask, late=late_unmask)
        return self.server.step(replies, missing)


def _inputs(n, L, seed=0):
    rng = np.random.default_rng(seed)
    x = {c: rng.uniform(-5, 5, L) for c in range(n)}
    w = {c: float(rng.integers(1, 50)) for c in range(n)}
    return x, w


def _plain(x, w, who):
    return sum(w[c] * x[c] for c in who), sum(w[c] for c in who)


@pytest.mark.parametrize("drop", [set(), {2}, {0, 3}, {1, 4}])
def test_aggregate_equals_weighted_sum_with_dropouts_after_masking(drop):
    n, L = 6, 50
    net = Net(n)
    net.setup()
    x, w = _inputs(n, L)
    out = net.aggregate(x, w, drop_input=drop)
    alive = sorted(set(range(n)) - drop)
    assert out.ended and out.failed is None and out.contributors == alive and out.dropped == sorted(drop)
    total, weight = _plain(x, w, alive)
    tol = len(alive) * 2.0 ** -net.params.frac_bits
    np.testing.assert_allclose(out.total, total, atol=tol)
    assert math.isclose(out.weight, weight, abs_tol=tol)


def test_dropouts_during_unmasking_above_threshold_still_aggregate():
    n = 6  # t = 4
    net = Net(n)
    net.setup()
    x, w = _inputs(n, 8)
    out = net.aggregate(x, w, drop_input={5}, drop_unmask={0})
    total, _ = _plain(x, w, [0, 1, 2, 3, 4])  # 0 sent its input, then vanished: still counted
    np.testing.assert_allclose(out.total, total, atol=1e-5)


def test_fewer_than_t_survivors_fail_without_unmasking():
    net = Net(5)  # t = 3
    net.setup()
    x, w = _inputs(5, 4)
    before = len(net.inbox)
    out = net.aggregate(x, w, drop_input={0, 1, 2})
    assert out.ended and out.total is None and "threshold" in out.failed
    assert all(m.kind in (sa.MASKED, sa.REKEY) for m in net.inbox[before:])  # no reveal was asked for
    # too few reveals: the round fails, nothing partial comes out
    out = net.aggregate(x, w, drop_unmask={0, 1, 2})
    assert out.ended and out.total is None and "fewer than" in out.failed
    # and the next aggregation works again
    out = net.aggregate(x, w)
    np.testing.assert_allclose(out.total, _plain(x, w, range(5))[0], atol=1e-5)


def test_late_reveals_after_too_few_shares_would_unmask_the_survivors_so_they_are_disclosed():
    net = Net(5)  # t = 3
    net.setup()
    x, w = _inputs(5, 4)
    start = len(net.inbox)
    out = net.aggregate(x, w, late_unmask={0, 1, 2})  # their reveals reach the inbox after the deadline
    assert out.ended and out.total is None and "fewer than 3 shares" in out.failed and out.contributors == []
    assert out.disclosed == [0, 1, 2, 3, 4]
    # what a server that keeps late replies holds: every masked input and every reveal
    got = list(zip(net.senders[start:], net.inbox[start:]))
    y = {c: m["y"] for c, m in got if m.kind == sa.MASKED}
    shares = {j: {} for j in y}
    for c, m in got:
        if m.kind == sa.REVEAL:
            for j, row in zip(np.asarray(m["b_ids"]).tolist(), np.asarray(m["b_sh"])):
                shares[j][c + 1] = int.from_bytes(bytes(row), "big")
    k, L = net.server.k, len(next(iter(y.values())))
    acc = np.zeros(L, dtype=sa.ring_dtype(net.params.ring_bits))
    for j, yj in y.items():
        acc += yj
        acc -= sa.prg(sa.self_seed(sa.shamir_reconstruct(shares[j], 3), k), L, net.params.ring_bits)
    vals = sa.decode_fixed(acc, net.params.frac_bits, net.params.ring_bits)
    np.testing.assert_allclose(vals[:-1], _plain(x, w, range(5))[0], atol=1e-5)  # the sum is out
    # a failure before any reveal was asked for discloses nothing
    out = net.aggregate(x, w, drop_input={0, 1, 2})
    assert "threshold" in out.failed and out.disclosed == []


def test_every_aggregation_masks_with_fresh_keys_and_a_dropped_client_is_back_at_once():
    n = 5
    net = Net(n)
    net.setup()
    x, w = _inputs(n, 6)
    used = []
    out = net.aggregate(x, w, drop_input={1})
    used.append(dict(net.server.active_pk))
    assert out.contributors == [0, 2, 3, 4] and 1 in net.server.exposed
    out = net.aggregate(x, w)  # 1 brought a fresh key with its reply: it takes part again
    used.append(dict(net.server.active_pk))
    assert out.contributors == [0, 1, 2, 3, 4] and 1 not in net.server.exposed
    out = net.aggregate(x, w, drop_input={3}, drop_reply={4})  # 3 drops: its dangling masks are rebuilt
    used.append(dict(net.server.active_pk))
    assert out.contributors == [0, 1, 2]
    np.testing.assert_allclose(out.total, _plain(x, w, [0, 1, 2])[0], atol=1e-5)
    for c in range(4):  # no client masked two aggregations with one key
        keys = [u[c] for u in used if c in u]
        assert len(set(keys)) == len(keys), c


def _curious_server(net: Net, peers_pk: dict[int, dict[int, bytes]]) -> list[tuple[int, int]]:
    """An honest-but-curious server with its whole inbox over several aggregations: for every
    masked input it holds, it tries the self-mask seed revealed in that aggregation with every
    mask secret key revealed in any aggregation. Returns the (client, aggregation) whose input
    it read; ``peers_pk[k]`` are the mask public keys the server listed for aggregation ``k``."""
    p = net.params
    b_sh: dict[tuple[int, int], dict[int, int]] = {}
    s_sh: dict[tuple[int, int], dict[int, int]] = {}
    masked: dict[tuple[int, int], np.ndarray] = {}
    for c, m in zip(net.senders, net.inbox):
        if m.kind == sa.MASKED:
            masked[(c, int(m["k"]))] = np.asarray(m["y"])
        elif m.kind == sa.REVEAL:
            for ids, sh, into in (("b_ids", "b_sh", b_sh), ("s_ids", "s_sh", s_sh)):
                for j, row in zip(np.asarray(m[ids]).tolist(), np.asarray(m[sh])):
                    into.setdefault((j, int(m["k"])), {})[c + 1] = int.from_bytes(bytes(row), "big")
    b = {key: sa.shamir_reconstruct(sh, net.server.t) for key, sh in b_sh.items() if len(sh) >= net.server.t}
    keys = [(j, sa.secret_from_int(sa.shamir_reconstruct(sh, net.server.t)))
            for (j, _), sh in s_sh.items() if len(sh) >= net.server.t]
    read = []
    for (i, k), y in masked.items():
        if (i, k) not in b:
            continue
        bare = y - sa.prg(sa.self_seed(b[(i, k)], k), len(y), p.ring_bits)
        for j, sk in keys:
            if j != i:
                continue
            v = bare.copy()
            for peer, pk in peers_pk[k].items():
                if peer != i:
                    mask = sa.prg(sa.pairwise_seed(sk, pk, i, peer, k), len(y), p.ring_bits)
                    v = v - mask if sa.mask_sign(i, peer) > 0 else v + mask
            vals = sa.decode_fixed(v, p.frac_bits, p.ring_bits)
            if np.all(np.abs(vals) < 1e6):  # masks removed: a plausible w * x, not ring noise
                read.append((i, k))
    return sorted(set(read))


@pytest.mark.parametrize("rotate", [True, False])
def test_a_curious_server_reads_no_input_across_aggregations(rotate, monkeypatch):
    """Aggregation 1: everybody contributes (the survivors reveal each b_2); aggregation 2:
    client 2 drops (they reveal its s_SK); aggregation 3: client 3's input arrives late. With
    one mask key per aggregation nothing combines; with a key kept across aggregations (the
    weakened variant) b_2 of 1 and s_SK of 2 unmask client 2's first input."""
    monkeypatch.setattr(sa.SecAggClient, "_rotate", rotate)
    n = 5
    net = Net(n)
    net.setup()
    x, w = _inputs(n, 16)
    peers_pk = {}
    for k, (drop, late) in enumerate([(set(), set()), ({2}, set()), (set(), {3}), (set(), set())], start=1):
        out = net.aggregate(x, w, drop_input=drop, late=late)
        peers_pk[k] = dict(net.server.active_pk)
        assert out.failed is None and out.contributors == sorted(set(net.server.active) - drop - late)
        np.testing.assert_allclose(out.total, _plain(x, w, out.contributors)[0], atol=1e-5)
    read = _curious_server(net, peers_pk)
    if rotate:
        assert read == []
    else:
        assert (2, 1) in read  # the attack works on keys kept across aggregations


def test_missed_share_round_joins_through_rekey():
    net = Net(4)
    net.setup(drop_shares={2})
    x, w = _inputs(4, 3)
    assert net.aggregate(x, w).contributors == [0, 1, 3]  # 2 never saw the roster: it is sent again
    assert net.aggregate(x, w).contributors == [0, 1, 2, 3]


def test_ring_32_bits():
    params = sa.SecAggParams(ring_bits=32, frac_bits=10, clip=10.0)
    net = Net(4, params)
    net.setup()
    x = {c: np.linspace(-1, 1, 7) * (c + 1) for c in range(4)}
    w = {c: 1.0 for c in range(4)}
    out = net.aggregate(x, w, drop_input={2})
    np.testing.assert_allclose(out.total, _plain(x, w, [0, 1, 3])[0], atol=4 * 2.0**-10)


# ---------------------------------------------------------------------------
# What the server sees


def _chi2_bytes(a: np.ndarray) -> float:
    counts = np.bincount(np.frombuffer(a.tobytes(), dtype=np.uint8), minlength=256)
    expected = counts.sum() / 256
    return float(((counts - expected) ** 2 / expected).sum())


def test_masked_input_looks_uniform_and_differs_from_plain():
    n, L = 3, 1 << 15
    net = Net(n)
    net.setup()
    x = {c: np.full(L, 0.5) for c in range(n)}  # a very non-uniform input
    w = {c: 1.0 for c in range(n)}
    req = net.server.input_requests("model", {}, net.clients)
    replies, _ = net.exchange(req, set(), x, w)
    y = np.asarray(replies[0]["y"])
    plain = sa.encode_fixed(np.append(x[0], 1.0), net.params.frac_bits)
    assert not np.array_equal(y, plain)
    assert np.mean(y == plain) < 1e-3
    # 255 degrees of freedom: mean 255, sd 22.6; 400 is > 6 sd away
    assert _chi2_bytes(y) < 400
    assert _chi2_bytes(plain) > 10_000  # the test does detect structure


def test_server_never_receives_a_plain_input():
    n, L = 5, 64
    net = Net(n)
    net.setup()
    x, w = _inputs(n, L, seed=3)
    net.aggregate(x, w, drop_input={4})
    net.aggregate(x, w)
    needles = []
    for c in range(n):
        for v in (x[c], w[c] * x[c]):
            needles.append(v.astype(np.float64).tobytes()[:64])
            needles.append(v.astype(np.float32).tobytes()[:32])
            needles.append(sa.encode_fixed(v, net.params.frac_bits).tobytes()[:64])
    assert net.inbox
    for m in net.inbox:
        for name, arr in m.arrays().items():
            blob = arr.tobytes()
            assert not any(nd in blob for nd in needles), m.kind
            # the masked vector matches no plain entry at all
            if m.kind == sa.MASKED and name == "y":
                for c in range(n):
                    enc = sa.encode_fixed(w[c] * x[c], net.params.frac_bits)
                    assert np.mean(arr[:-1] == enc) < 0.05


def test_client_refuses_to_reveal_both_shares_and_to_mask_twice():
    net = Net(4)
    net.setup()
    x, w = _inputs(4, 3)
    req = net.server.input_requests("model", {}, net.clients)
    replies, missing = net.exchange(req, set(), x, w)
    out = net.server.step(replies, missing)
    # a lying server names client 3 dropped although its input arrived
    lie = out.send[0]
    fields = dict(lie.fields)
    fields["U"] = np.asarray([0, 1, 2], dtype=np.int64)
    fields["D"] = np.asarray([3], dtype=np.int64)
    with pytest.raises(ValueError, match="dropped sent its input"):
        net.clients[0].handle(Message(sa.UNMASK, fields))
    # the same aggregation index twice: no second masked input
    with pytest.raises(ValueError, match="not new"):
        net.clients[1].masked(req[1], x[1], w[1])


def test_share_ciphertexts_are_bound_to_sender_receiver_and_purpose():
    a, b = sa.SecAggClient(0), sa.SecAggClient(1)
    pk = lambda c: sa.public_bytes(c.c_sk)  # noqa: E731
    ct = sa.seal_share(a.c_sk, pk(b), 0, 1, sa.SHARE_OF_SEED, 3, 12345)
    assert sa.open_share(b.c_sk, pk(a), 0, 1, sa.SHARE_OF_SEED, 3, ct) == 12345
    for args in ((1, 0, sa.SHARE_OF_SEED, 3), (0, 1, sa.SHARE_OF_KEY, 3), (0, 1, sa.SHARE_OF_SEED, 4)):
        with pytest.raises(InvalidTag):
            sa.open_share(b.c_sk, pk(a), *args, ct)


# ---------------------------------------------------------------------------
# SecAgg+: groups of neighbours


def test_neighbourhoods_are_symmetric_small_and_seeded():
    g = sa.neighbourhoods(range(40), 6, seed=3)
    assert all(len(v) == 7 and c in v for c, v in g.items())
    assert all(c in g[j] for c, v in g.items() for j in v)  # masks cancel only on a symmetric relation
    assert g == sa.neighbourhoods(range(40), 6, seed=3) and g != sa.neighbourhoods(range(40), 6, seed=4)
    assert sa.neighbourhoods(range(5), 6) == {c: list(range(5)) for c in range(5)}  # k >= n - 1: everyone
    assert sa.neighbourhoods(range(5), 0) == {c: list(range(5)) for c in range(5)}


@pytest.mark.parametrize("drop_input,drop_unmask", [(set(), set()), ({3}, set()), ({0, 7}, {11}), (set(), {5})])
def test_secagg_plus_sums_with_dropouts_and_keeps_to_the_group(drop_input, drop_unmask):
    n = 16
    net = Net(n, sa.SecAggParams(neighbours=4))
    net.setup()
    assert net.server.t == 3 and all(len(v) == 5 for v in net.server.group.values())
    x, w = _inputs(n, 20)
    out = net.aggregate(x, w, drop_input=drop_input, drop_unmask=drop_unmask)
    assert out.failed is None and out.contributors == sorted(set(range(n)) - drop_input)
    total, weight = _plain(x, w, out.contributors)
    np.testing.assert_allclose(out.total, total, atol=1e-5)
    assert out.weight == pytest.approx(weight)
    for c, cl in net.clients.items():  # each client masked with and shared among its group only
        assert cl.roster == net.server.group[c]
        if c not in drop_input:
            assert set(cl.masked_with[cl.last_k]) <= set(net.server.group[c]) - {c}
    # a second aggregation, with the dropped clients re-keyed, still sums right
    out = net.aggregate(x, w)
    np.testing.assert_allclose(out.total, _plain(x, w, out.contributors)[0], atol=1e-5)


def test_secagg_plus_fails_when_a_group_is_short_of_survivors():
    n = 16
    net = Net(n, sa.SecAggParams(neighbours=4))
    net.setup()
    x, w = _inputs(n, 5)
    group = net.server.group[0]
    out = net.aggregate(x, w, drop_input=set(group[:3]))  # 2 of 0's group of 5 left, t = 3
    assert out.failed is not None and "survivors in the groups" in out.failed and out.total is None


def test_automatic_bound_refuses_what_would_wrap_around():
    c = sa.SecAggClient(0, sa.SecAggParams(clip=None), n_clients=4)
    bound = c.bound(100.0)
    assert bound == pytest.approx(2.0 ** (64 - 2 - 24) / (100 * 4))
    net = Net(3, sa.SecAggParams(clip=None))
    for cl in net.clients.values():
        cl.n_clients = 3
    net.setup()
    x = {i: np.full(4, 0.5) for i in range(3)}
    x[1][2] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        net.aggregate(x, {i: 2.0 for i in range(3)})


# ---------------------------------------------------------------------------
# Through the engine: the layer any method switches on

ECHO = """
name: {name}
method: raymvc.bench.fedavg_echo
params: {{rounds: {rounds}, floats: 32}}
data: {{dataset: digits, partition: horizontal, n_clients: {n_clients}}}
channel: {{secure_aggregation: {secure}}}
runtime: {{backend: local}}
seed: 0
"""


class _Spy:
    """The echo server's vector after every step, and what its step was given."""

    def __init__(self):
        self.vectors: list[np.ndarray] = []
        self.plain_w_seen = 0  # replies in which the server could read a client's vector
        self.secure_sums = 0  # steps given an engine-computed sum


def _run(tmp_path, name, secure, *overrides, rounds=3, n_clients=6, spy=None, mp=None):
    from raymvc.bench import fedavg_echo
    from raymvc.driver import run_scenario
    from raymvc.scenario import load_scenario

    if spy is not None:
        real = fedavg_echo.EchoServer.step

        def step(self, round, replies, missing):
            spy.plain_w_seen += sum("w" in m for m in replies.values())
            spy.secure_sums += bool(getattr(replies, "sums", None))
            out = real(self, round, replies, missing)
            spy.vectors.append(self.w.copy())
            return out

        mp.setattr(fedavg_echo.EchoServer, "step", step)
    path = tmp_path / f"{name}.yaml"
    path.write_text(ECHO.format(name=name, rounds=rounds, secure=str(secure).lower(), n_clients=n_clients))
    summary = run_scenario(load_scenario(path, list(overrides)), tmp_path / name, progress=lambda s: None)
    log = [json.loads(line) for line in (tmp_path / name / "rounds.jsonl").read_text().splitlines()]
    return summary, log


@pytest.fixture(scope="module")
def plain_and_secure(tmp_path_factory):
    """Both runs' (summary, rounds log) and spies on the server's step."""
    tmp = tmp_path_factory.mktemp("echo")
    spies = {"plain": _Spy(), "secure": _Spy()}
    with pytest.MonkeyPatch.context() as mp:
        plain = _run(tmp, "plain", False, spy=spies["plain"], mp=mp)
    with pytest.MonkeyPatch.context() as mp:
        sec = _run(tmp, "secure", True, spy=spies["secure"], mp=mp)
    return plain, sec, spies


def test_engine_run_matches_plain_fedavg_and_meters_secagg(plain_and_secure):
    (plain, plog), (sec, slog), spies = plain_and_secure
    assert plain["status"] == sec["status"] == "completed"
    assert plain["rounds"] == sec["rounds"] == 3  # the layer's exchanges run inside the method's rounds
    assert plain["communication_secagg"]["messages"] == 0
    cs = sec["communication_secagg"]
    assert cs["messages"] > 0 and cs["mb_total"] > 0
    assert cs["wire_bytes"] < sec["communication"]["wire_bytes"]  # part of the run's total
    assert sec["communication"]["wire_bytes"] > plain["communication"]["wire_bytes"]
    assert len(sec["per_client_bytes"]) == 6
    assert all(r["info"]["aggregated"] == list(range(6)) for r in slog)
    assert slog[0]["info"]["weight"] == pytest.approx(sec["n_samples"], abs=1e-4)
    # the server never saw one client's vector, only the engine's sum ...
    assert spies["plain"].plain_w_seen == 18 and spies["secure"].plain_w_seen == 0
    assert spies["secure"].secure_sums == 3 and spies["plain"].secure_sums == 0
    # ... and ends every round exactly where the plain run does: the masks cancel in the ring
    for a, b in zip(spies["secure"].vectors, spies["plain"].vectors, strict=True):
        np.testing.assert_array_equal(a, b)


def _drop_in(monkeypatch, who: set[int], sub: int, round: int = 0):
    """Clients ``who`` go offline in exchange ``sub`` of ``round`` (1: masked input, 2: unmasking)."""
    from raymvc.runtime.faults import FaultPlan

    real = FaultPlan.dropped

    def dropped(self, r, client, s=0):
        return (r == round and s == sub and client in who) or real(self, r, client, s)

    monkeypatch.setattr(FaultPlan, "dropped", dropped)


def test_a_client_lost_before_its_masked_input_is_left_out_of_that_sum_only(tmp_path, monkeypatch):
    _drop_in(monkeypatch, {1}, sub=1)
    spy = _Spy()
    s, log = _run(tmp_path, "drop-input", True, spy=spy, mp=monkeypatch)
    assert s["status"] == "degraded" and s["faults"]["dropped_replies"] == 1 and not s["errors"]
    assert log[0]["dropped"] == [1] and 1 in log[0]["missing"]
    assert log[0]["info"]["aggregated"] == [0, 2, 3, 4, 5]
    # its revealed mask key served that aggregation alone: it is back with a fresh one
    assert log[1]["info"]["aggregated"] == log[2]["info"]["aggregated"] == list(range(6))
    assert log[0]["info"]["weight"] < log[1]["info"]["weight"] == s["n_samples"]
    # every echo is the same vector, so any correct weighted mean leaves it where it was
    for v in spy.vectors[1:]:
        np.testing.assert_allclose(v, spy.vectors[0], atol=1e-6)


def test_a_client_lost_while_unmasking_still_counts(tmp_path, monkeypatch):
    _drop_in(monkeypatch, {4}, sub=2)
    s, log = _run(tmp_path, "drop-unmask", True)
    assert s["status"] == "degraded" and s["faults"]["dropped_replies"] == 1
    assert log[0]["info"]["aggregated"] == list(range(6))  # its input arrived; its peers rebuilt its self-mask


def test_too_few_survivors_fail_the_aggregation_and_keep_the_vector(tmp_path, monkeypatch):
    _drop_in(monkeypatch, {0, 1, 2, 3}, sub=1)  # 2 masked inputs, threshold 4 of 6
    spy = _Spy()
    s, log = _run(tmp_path, "short", True, spy=spy, mp=monkeypatch)
    assert s["status"] == "degraded" and not s["errors"] and not s["faults"]["client_errors"]
    info = log[0]["info"]
    assert info["aggregated"] == [] and "threshold" in info["aggregation_failed"]
    assert sorted(log[0]["missing"]) == list(range(6))
    from raymvc.bench import fedavg_echo
    from raymvc.protocol import ServerContext

    init = fedavg_echo.EchoServer(fedavg_echo.Config(floats=32),
                                  ServerContext(client_ids=list(range(6)), n_clusters=10, seed=0)).w
    np.testing.assert_array_equal(spy.vectors[0], init)  # nothing averaged: the vector stays
    assert log[1]["info"]["aggregated"]  # the next round aggregates again


def test_rounds_record_each_secure_sum_and_whom_a_failed_one_disclosed(tmp_path, monkeypatch):
    _drop_in(monkeypatch, {0, 1, 2}, sub=2)  # all six inputs in, three reveals lost: 3 shares, t = 4
    _drop_in(monkeypatch, {0, 1, 2, 3}, sub=1, round=1)  # two inputs: fails before any reveal
    s, log = _run(tmp_path, "disclosed", True)
    assert s["status"] == "degraded"
    (first,), (second,), (third,) = (log[r]["secure_sums"] for r in range(3))
    assert first["contributors"] == [] and "fewer than 4 shares" in first["failed"]
    assert first["disclosed"] == list(range(6))
    assert "threshold" in second["failed"] and second["disclosed"] == []
    assert third == {"kind": third["kind"], "contributors": list(range(6)), "failed": None, "disclosed": []}
    plain, plain_log = _run(tmp_path, "plain", False)
    assert "secure_sums" not in plain_log[0]


def test_secagg_plus_in_the_engine_costs_less_and_sums_the_same(tmp_path):
    spies = {k: _Spy() for k in ("plain", "full", "plus")}
    runs = {}
    for name, over in (("plain", ()), ("full", ()), ("plus", ("channel.secagg_neighbours=4",))):
        with pytest.MonkeyPatch.context() as mp:
            runs[name] = _run(tmp_path, name, name != "plain", *over, rounds=2, n_clients=16, spy=spies[name],
                              mp=mp)[0]
    assert all(r["status"] == "completed" for r in runs.values())
    for a, b in zip(spies["plus"].vectors, spies["plain"].vectors, strict=True):
        np.testing.assert_array_equal(a, b)
    assert runs["plus"]["communication_secagg"]["wire_bytes"] < 0.6 * runs["full"]["communication_secagg"]["wire_bytes"]


def test_secure_echo_on_ray_matches_in_process(ray_session, tmp_path, monkeypatch):
    runs = {}
    for backend in ("local", "ray"):  # dropouts in every exchange, drawn the same on both backends
        runs[backend] = _run(tmp_path, backend, True, f"runtime.backend={backend}", "faults.dropout.rate=0.5",
                             "runtime.client_cpus=0.25", "runtime.clients_per_actor=3", rounds=4)
    (loc, llog), (ray_, rlog) = runs["local"], runs["ray"]
    assert loc["status"] == ray_["status"] == "degraded"
    assert any(len(r["info"]["aggregated"]) < 6 - len(r["dropped"]) for r in llog)  # a sub-exchange lost someone
    assert [r["info"] for r in llog] == [r["info"] for r in rlog]
    assert loc["communication"]["messages"] == ray_["communication"]["messages"]
    assert loc["communication_secagg"]["messages"] == ray_["communication_secagg"]["messages"]


def test_secure_aggregation_with_a_method_that_declares_no_sum_is_a_scenario_error(capsys):
    from raymvc.cli import main

    repo = Path(__file__).resolve().parents[1]
    code = main(["validate", str(repo / "scenarios" / "digits-kfed.yaml"), "--set", "channel.secure_aggregation=true"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "channel.secure_aggregation: method kfed declares no sum" in err
    code = main(["validate", str(repo / "scenarios" / "digits-kfed.yaml"), "--set", "channel.secagg_neighbours=4"])
    assert code == 2
    assert "channel.secagg_neighbours: needs channel.secure_aggregation: true" in capsys.readouterr().err


def test_methods_hold_no_secure_aggregation_code():
    """Methods declare sums; the engine masks them. No method module runs SecAgg itself."""
    repo = Path(__file__).resolve().parents[1]
    files = sorted((repo / "protocols").glob("*.py")) + [repo / "raymvc" / "bench" / "fedavg_echo.py"]
    hits = [f"{f.name}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
            if "secagg" in line.lower()]
    assert hits == []


def test_the_layer_composes_with_encryption_and_every_fault_kind(tmp_path):
    """AES-GCM links, a crash, stragglers past a deadline and dropouts in every exchange: the run
    degrades, no party raises, and every sum that came out is right (all echoes are one vector)."""
    spy = _Spy()
    with pytest.MonkeyPatch.context() as mp:
        s, log = _run(tmp_path, "faults", True, "channel.encryption=aes-gcm", "faults.dropout.rate=0.15",
                      "faults.crash=[{client: 5, at_round: 1}]", "faults.stragglers.fraction=0.2",
                      "faults.stragglers.delay_s.mean=3", "faults.deadline_s=4", rounds=5, n_clients=10, spy=spy, mp=mp)
    assert s["status"] == "degraded" and not s["errors"] and not s["faults"]["client_errors"]
    assert s["faults"]["crashed_clients"] == [5] and s["faults"]["dropped_replies"] > 0
    assert s["faults"]["late_replies"] > 0
    assert s["communication_secagg"]["messages"] > 0
    assert all(5 not in r["info"]["aggregated"] for r in log[1:])
    assert any(r["info"]["aggregated"] for r in log)
    for v in spy.vectors[1:]:
        np.testing.assert_allclose(v, spy.vectors[0], atol=1e-6)


def test_weighted_sum_of_plain_replies_is_the_weighted_mean_in_fixed_point():
    from raymvc.protocol import SecureSum, weighted_sum

    spec = SecureSum("update", ("w.*", "b"), weight="n")
    rng = np.random.default_rng(0)
    replies = {c: Message("update", {"w.a": rng.normal(size=(3, 2)).astype(np.float32), "w.c": np.int64(c + 1),
                                     "b": float(c), "n": int(10 * (c + 1)), "loss": 0.5}) for c in range(3)}
    replies[9] = Message("other", x=1.0)
    s = weighted_sum(replies, spec)
    assert s.contributors == [0, 1, 2] and s.weight == 60.0 and not s.secure
    assert list(s.totals) == ["w.a", "w.c", "b"] and s.totals["w.a"].shape == (3, 2) and s.totals["w.c"].shape == ()
    mean = s.mean()
    exact = sum(replies[c]["n"] * replies[c]["w.a"].astype(np.float64) for c in range(3)) / 60
    np.testing.assert_allclose(mean["w.a"], exact, rtol=0, atol=2.0**-24)
    assert mean["w.c"] == (10 * 1 + 20 * 2 + 30 * 3) / 60 and mean["b"] == pytest.approx((20 + 60) / 60)
    assert weighted_sum({}, spec).mean() is None
    replies[1] = Message("update", {"w.a": np.zeros((2, 3)), "w.c": np.int64(1), "b": 1.0, "n": 3})
    with pytest.raises(ValueError, match="different summed fields"):
        weighted_sum(replies, spec)
    with pytest.raises(ValueError, match="weight field 'n'"):
        weighted_sum({0: Message("update", {"w.a": np.zeros(2), "b": 1.0})}, spec)


def test_one_overflow_rule_for_declared_sums_with_and_without_the_layer():
    """Five clients of weight 3e11 would wrap the 64-bit ring: the plain sum refuses them,
    naming the client, by the same rule as a secure-aggregation client."""
    from raymvc.fixedpoint import check_ring
    from raymvc.protocol import SecureSum, weighted_sum

    spec = SecureSum("update", ("x",), weight="n")
    big = {c: Message("update", {"x": np.full(3, 0.01), "n": 3e11}) for c in range(5)}
    with pytest.raises(ValueError, match=r"client 0's 'update' reply: .*overflows the 64-bit ring"):
        weighted_sum(big, spec)
    with pytest.raises(ValueError, match="overflows the 64-bit ring"):
        check_ring(3e11, 1.0, 5)
    ok = {c: Message("update", {"x": np.full(3, 0.01), "n": 1e10}) for c in range(5)}
    assert weighted_sum(ok, spec).weight == pytest.approx(5e10)


@pytest.mark.parametrize("rotate", [True, False])
def test_a_curious_server_reads_no_input_through_the_engine(rotate, tmp_path, monkeypatch):
    """The attack above on everything the server's endpoint opened in an engine run: client 2
    drops before its masked input in round 1 (its mask key is revealed), client 4 before its
    masked input in round 2. With the layer's fresh keys no input is read; with one key kept
    for the run, client 2's round-0 input is."""
    from types import SimpleNamespace

    from raymvc.channel import Endpoint
    from raymvc.runtime import secure

    monkeypatch.setattr(sa.SecAggClient, "_rotate", rotate)
    from raymvc.runtime.faults import FaultPlan

    real = FaultPlan.dropped
    monkeypatch.setattr(FaultPlan, "dropped", lambda self, r, c, sub=0: (r, c, sub) in {(1, 2, 1), (2, 4, 1)}
                        or real(self, r, c, sub))
    opened = []
    real_open = Endpoint.open

    def spy(self, frame, *args, **kw):
        o = real_open(self, frame, *args, **kw)
        if self.party == "server":
            opened.append((int(o.src.split(":")[1]), o.msg))
        return o

    monkeypatch.setattr(Endpoint, "open", spy)
    s, log = _run(tmp_path, f"curious-{rotate}", True, rounds=4, n_clients=5)
    assert s["status"] == "degraded" and not s["errors"]
    assert log[1]["info"]["aggregated"] == [0, 1, 3, 4]
    assert log[2]["info"]["aggregated"] == ([0, 1, 2, 3] if rotate else [0, 1, 3])  # kept keys: 2 must re-key
    pk, peers_pk, inbox = {}, {}, SimpleNamespace(inbox=[], senders=[], params=secure.params(),
                                                   server=SimpleNamespace(t=3))
    for c, m in opened:  # what the server knows: every key it was told, in order
        if m.kind == sa.KEYS:
            pk[c] = bytes(m["s_pk"])
        elif m.kind == sa.REKEY:
            pk[c] = bytes(m["s_pk"])
        elif secure.KEY[0] in m:
            pk[c] = bytes(m[secure.KEY[0]])
        elif m.kind == sa.MASKED:
            peers_pk.setdefault(int(m["k"]), dict(pk))
        inbox.inbox.append(m)
        inbox.senders.append(c)
    assert sorted(peers_pk) == [1, 2, 3, 4]
    read = _curious_server(inbox, peers_pk)
    if rotate:
        assert read == []
    else:
        assert (2, 1) in read  # round 0's input of client 2: its b from round 0, its key from round 1


def test_the_threshold_is_never_one_where_a_group_has_company():
    net = Net(8, sa.SecAggParams(neighbours=2, fraction=0.3))
    net.setup()
    assert net.server.t == 2  # floor(0.3 x 3) + 1 would be 1: a lone survivor could be unmasked
    single = Net(1)
    single.setup()
    assert single.server.t == 1


def _splitting_pair(group: dict[int, list[int]]) -> tuple[int, int]:
    """Two clients whose loss cuts the SecAgg+ ring into parts of at least two clients each."""
    ids = sorted(group)
    for a in ids:
        for b in ids:
            if a < b:
                alive = set(ids) - {a, b}
                parts, seen = [], set()
                for s in sorted(alive):
                    if s in seen:
                        continue
                    part, todo = {s}, [s]
                    while todo:
                        c = todo.pop()
                        for j in group[c]:
                            if j in alive and j not in part:
                                part.add(j)
                                todo.append(j)
                    seen |= part
                    parts.append(part)
                if len(parts) > 1 and min(len(p) for p in parts) >= 2:
                    return a, b
    raise AssertionError("no splitting pair")


def test_secagg_plus_refuses_a_sum_that_would_reveal_the_sums_of_parts():
    net = Net(8, sa.SecAggParams(neighbours=2))
    net.setup()
    a, b = _splitting_pair(net.server.group)
    x, w = _inputs(8, 4)
    before = len(net.inbox)
    out = net.aggregate(x, w, drop_input={a, b})
    assert out.total is None and "without masks between them" in out.failed
    assert not any(m.kind == sa.REVEAL for m in net.inbox[before:])  # nothing was unmasked
    out = net.aggregate(x, w)  # and the next aggregation works
    np.testing.assert_allclose(out.total, _plain(x, w, range(8))[0], atol=1e-5)


def test_an_aggregation_that_raised_half_way_leaves_the_next_one_clean():
    from raymvc.runtime.secure import ServerLayer

    layer = ServerLayer([], range(3), seed=0)
    layer.sa.roster, layer.sa.members, layer.sa.group = [0, 1, 2], {0, 1, 2}, {c: [0, 1, 2] for c in range(3)}
    layer.sa.phase, layer.sa.s_pk, layer.sa.c_pk = "idle", {c: b"k" * 32 for c in range(3)}, {c: b"c" * 32 for c in range(3)}
    layer.sa.epoch = {c: 0 for c in range(3)}

    def broken(out):
        raise RuntimeError("the link went down")

    with pytest.raises(RuntimeError):
        layer._one("update", [0, 1, 2], broken)
    assert layer.sa.phase == "idle"


# --------------------------------------------------------------------------- malformed messages: the sender's error
class _Tampered:
    """A client whose secure-aggregation messages pass through ``tamper`` on their way out."""

    def __init__(self, real, tamper):
        self.real, self.tamper = real, tamper

    def owns(self, msg):
        return self.real.owns(msg)

    def _out(self, rep):
        return None if rep is None else self.tamper(rep)

    def handle(self, msg):
        return self._out(self.real.handle(msg))

    def masked(self, msg, x, w):
        return self._out(self.real.masked(msg, x, w))

    def fresh_key(self):
        return self._out(self.real.fresh_key())


def _edit(kind, **fields):
    """A tamper that rewrites ``fields`` of messages of ``kind`` (a value may be a function of the old one)."""
    def tamper(m):
        if m.kind != kind:
            return m
        new = {k: (v(m.fields[k]) if callable(v) else v) for k, v in fields.items()}
        return Message(m.kind, {**m.fields, **new})
    return tamper


MALFORMED = {
    "short public key": (_edit(sa.KEYS, c_pk=lambda v: np.asarray(v)[:16]), "setup"),
    "all-zero mask key": (_edit(sa.KEYS, s_pk=np.zeros(32, dtype=np.uint8)), "setup"),
    "2-D masked vector": (_edit(sa.MASKED, y=lambda v: np.asarray(v)[None, :]), "masked"),
    "0-d masked vector": (_edit(sa.MASKED, y=lambda v: np.asarray(v)[0]), "masked"),
    "masked vector one entry short": (_edit(sa.MASKED, y=lambda v: np.asarray(v)[:-1]), "masked"),
    "non-integer epoch": (_edit(sa.REKEY, epoch=1.5), "rekey"),
    "all-zero new mask key": (_edit(sa.REKEY, s_pk=np.zeros(32, dtype=np.uint8)), "rekey"),
}


@pytest.mark.parametrize("what", sorted(MALFORMED))
def test_one_malformed_client_is_left_out_and_blamed_alone(what):
    """Client 0 (the lowest id, whose message the server reads first) sends one malformed
    message: nobody raises, the server blames client 0 alone, and the honest clients' inputs
    are summed exactly."""
    tamper, _phase = MALFORMED[what]
    n = 6
    net = Net(n)
    net.clients[0] = _Tampered(net.clients[0], tamper)
    net.setup()
    x, w = _inputs(n, 20)
    out = net.aggregate(x, w)
    blame = net.server.take_blame()
    assert list(blame) == [0] and blame[0].startswith("secagg: ")
    honest = [1, 2, 3, 4, 5]
    assert out.failed is None and out.contributors == honest
    total, weight = _plain(x, w, honest)
    np.testing.assert_allclose(out.total, total, atol=1e-5)
    assert math.isclose(out.weight, weight, abs_tol=1e-5)
    assert net.server.take_blame() == {}  # told once


def test_share_ciphertexts_that_do_not_open_blame_their_sender_not_the_peers():
    n = 6
    net = Net(n)
    corrupt = _edit(sa.MASKED, ct=lambda v: np.bitwise_xor(np.asarray(v), np.uint8(1)))
    net.clients[3] = _Tampered(net.clients[3], corrupt)
    net.setup()
    x, w = _inputs(n, 10)
    out = net.aggregate(x, w)  # no honest client raises
    blame = net.server.take_blame()
    assert list(blame) == [3] and "did not decrypt" in blame[3]
    assert out.failed is not None and "3" in out.failed  # its self-mask cannot be removed: that sum is lost
    again = net.aggregate(*_inputs(n, 10, seed=1), drop_reply={3})  # without it, the next one succeeds
    assert again.failed is None and again.contributors == [0, 1, 2, 4, 5]


def test_in_a_run_a_malformed_masked_input_is_its_senders_error(tmp_path, monkeypatch):
    """End to end: client 0 sends a masked vector one entry short every round; the run
    finishes, every round's sum holds the five honest clients, and errors.log names client 0."""
    real = sa.SecAggClient.masked

    def masked(self, msg, x, weight=1.0):
        rep = real(self, msg, x, weight)
        if self.id == 0 and rep is not None and rep.kind == sa.MASKED:
            rep = Message(rep.kind, {**rep.fields, "y": np.asarray(rep["y"])[:-1]})
        return rep

    monkeypatch.setattr(sa.SecAggClient, "masked", masked)
    summary, log = _run(tmp_path, "blame", True, rounds=2)
    assert summary["status"] == "error"  # a party misbehaved: never "completed"
    errors = summary["faults"]["client_errors"]
    assert errors and {e["client"] for e in errors} == {0} and all(e["path"] == "secagg" for e in errors)
    assert all(rec["client_errors"] == [0] and 0 in rec["missing"] and set(rec["replied"]) == {1, 2, 3, 4, 5}
               for rec in log)
    text = (tmp_path / "blame" / "errors.log").read_text()
    assert "client 0" in text and "entries where 5 of 6 clients sent" in text


def test_one_client_of_huge_weight_is_left_out_alike_with_and_without_the_layer(tmp_path, monkeypatch):
    """Client 2 claims weight 1e12, which the ring cannot hold for its entries: with or without
    secure aggregation it is that client's error, every round keeps the other five, and the two
    runs end on the same vector."""
    from raymvc.bench import fedavg_echo

    real = fedavg_echo.EchoClient.handle

    def handle(self, msg):
        rep = real(self, msg)
        return Message(rep.kind, {**rep.fields, "n": 1e12}) if self.ctx.client_id == 2 else rep

    monkeypatch.setattr(fedavg_echo.EchoClient, "handle", handle)
    spies = {"plain": _Spy(), "secure": _Spy()}
    runs = {}
    for name, secure in (("plain", False), ("secure", True)):
        with pytest.MonkeyPatch.context() as mp:
            runs[name] = _run(tmp_path, name, secure, rounds=2, spy=spies[name], mp=mp)
    for name, (summary, log) in runs.items():
        assert summary["status"] == "error", name  # a party misbehaved, the run went on
        assert summary["rounds"] == 2, name
        assert {e["client"] for e in summary["faults"]["client_errors"]} == {2}, name
        assert all(2 in rec["missing"] and set(rec["replied"]) == {0, 1, 3, 4, 5} for rec in log), name
    for a, b in zip(spies["secure"].vectors, spies["plain"].vectors, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_rekey_with_a_stale_epoch_is_its_senders_error(monkeypatch):
    """Client 1 labels its fresh mask key with its previous epoch: the server blames it and
    leaves it out of that sum (which comes out right for the others) instead of dropping the
    key silently and unmasking with the old one; a proper re-key brings it back."""
    n = 5
    net = Net(n)
    net.setup()
    x, w = _inputs(n, 6)
    assert net.aggregate(x, w).contributors == [0, 1, 2, 3, 4]
    real = sa.SecAggClient.fresh_key

    def stale(self):
        key = real(self)
        if self.id == 1 and key is not None:
            key = Message(key.kind, {**key.fields, "epoch": int(key["epoch"]) - 1})
        return key

    monkeypatch.setattr(sa.SecAggClient, "fresh_key", stale)
    out = net.aggregate(x, w)
    assert "epoch" in net.server.blamed.get(1, "")
    assert out.contributors == [0, 2, 3, 4]
    np.testing.assert_allclose(out.total, _plain(x, w, [0, 2, 3, 4])[0], atol=1e-5)
    monkeypatch.setattr(sa.SecAggClient, "fresh_key", real)
    out = net.aggregate(x, w)
    assert out.contributors == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(out.total, _plain(x, w, range(n))[0], atol=1e-5)
