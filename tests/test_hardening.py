"""Hardening: bounded inputs, checked replies, safe paths, checked data, and properties of
the codec, the link and the partitions (Hypothesis)."""

from __future__ import annotations

import math
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from raymvc import cli
from raymvc.channel import CodecError, Endpoint, RejectedMessage, decode, encode
from raymvc.channel import link as link_mod
from raymvc.data import DataError, horizontal, load_dataset, missing_mask
from raymvc.data.datasets import DataWarning, synthetic
from raymvc.data.types import MultiViewDataset
from raymvc.messages import Message
from raymvc.results.folder import ResultsError, check_out_dir, default_out_dir, read_summary
from raymvc.scenario import (
    MAX_ERROR_CHARS,
    ChannelCfg,
    ScenarioError,
    load_scenario,
    safe_yaml_load,
    scenario_from_dict,
)

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BILLION_LAUGHS = """\
method: kfed
data: {dataset: digits}
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
name: *i
"""

KFED = {"method": "kfed", "data": {"dataset": "digits"}}
CEFMC = {"method": "cefmc", "data": {"dataset": "handwritten"}}


def _one_line_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------- 5. unbounded inputs


def test_billion_laughs_fails_fast_in_one_line_and_small_memory(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text(BILLION_LAUGHS)
    tracemalloc.start()
    with pytest.raises(ScenarioError) as exc:
        load_scenario(f)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    msg = str(exc.value)
    assert "aliases" in msg and "\n" not in msg and len(msg) <= MAX_ERROR_CHARS
    assert peak < 20_000_000  # refused while composing: the billion strings were never built


def test_a_few_aliases_still_load():
    doc = safe_yaml_load("base: &b {rate: 0.1}\nx: *b\ny: *b\n")
    assert doc["x"] == doc["y"] == {"rate": 0.1}


def test_deep_nesting_and_big_files_are_refused(tmp_path):
    with pytest.raises(Exception, match="nested deeper"):
        safe_yaml_load("x: " + "[" * 200 + "]" * 200)
    f = tmp_path / "big.yaml"
    f.write_text("method: kfed\ndescription: " + "x" * 1_100_000 + "\n")
    with pytest.raises(ScenarioError, match="at most"):
        load_scenario(f)


def test_long_rejected_values_are_cut_in_errors():
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict({**KFED, "seed": ["x" * 1000] * 1000})
    msg = str(exc.value)
    assert msg.startswith("seed: ") and "..." in msg and len(msg) <= MAX_ERROR_CHARS and "\n" not in msg
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict({**KFED, "k" * 10_000: 1})
    assert len(str(exc.value)) <= MAX_ERROR_CHARS


def test_override_alias_bomb_is_refused():
    with pytest.raises(ScenarioError, match="aliases"):
        scenario_from_dict(KFED, overrides=["description=" + "[" + ",".join(["&a x"] + ["*a"] * 20) + "]"])


def test_max_message_mb_reaches_the_endpoint_cap():
    assert ChannelCfg().max_message_mb == 256 and ChannelCfg().max_message_bytes() == 256_000_000
    assert ChannelCfg(max_message_mb=0.5).max_message_bytes() == 500_000
    with pytest.raises(ScenarioError, match="channel.max_message_mb"):
        scenario_from_dict({**KFED, "channel": {"max_message_mb": 0}})
    with pytest.raises(ValueError, match="max_message_bytes"):
        Endpoint("server", max_message_bytes=0)


def _pair(encryption="none", compression="none", cap=link_mod.MAX_PAYLOAD_BYTES, clients=(0,)):
    server = Endpoint("server", encryption=encryption, compression=compression, max_message_bytes=cap)
    parties = {}
    for c in clients:
        cli_ep = Endpoint(f"client:{c}", encryption=encryption, compression=compression, max_message_bytes=cap)
        server.add_peer(f"client:{c}", cli_ep.public_key())
        cli_ep.add_peer("server", server.public_key())
        parties[c] = cli_ep
    return server, parties


def test_zlib_bomb_is_rejected_without_inflating_it():
    server, clients = _pair("none", "zlib", cap=1_000_000)
    frame = clients[0].seal("server", 1, Message("m", x=1)).frame
    _, _, _, _, _, pos = link_mod._parse_frame(frame)
    comp = zlib.compressobj(9)
    zeros = bytes(1 << 20)
    body = b"".join(comp.compress(zeros) for _ in range(256)) + comp.flush()  # 256 MiB of zeros
    bomb = frame[:pos] + body
    assert len(bomb) < 1_000_000
    tracemalloc.start()
    with pytest.raises(RejectedMessage) as exc:
        server.open(bomb)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert exc.value.reason == "oversized" and server.rejected["oversized"] == 1
    assert peak < 10_000_000  # the decompressor stopped at the cap
    assert server.open(frame).msg["x"] == 1  # the rejected bomb consumed nothing


def test_uncompressed_frame_over_the_cap_is_oversized():
    server, clients = _pair("aes-gcm", cap=10_000)
    big = clients[0].seal("server", 1, Message("m", x=np.zeros(2000))).frame
    with pytest.raises(RejectedMessage) as exc:
        server.open(big)
    assert exc.value.reason == "oversized"
    assert server.rejected == {**{r: 0 for r in link_mod.REASONS}, "oversized": 1}


# --------------------------------------------------------------------- 6. who answered


def test_reply_from_another_client_is_misrouted():
    server, clients = _pair(clients=(0, 1))
    from_1 = clients[1].seal("server", 3, Message("upd", v=1)).frame
    with pytest.raises(RejectedMessage) as exc:
        server.open(from_1, expect_src="client:0", expect_round=3)
    assert exc.value.reason == "misrouted" and "client:0" in str(exc.value)
    assert server.open(from_1, expect_src="client:1", expect_round=3).src == "client:1"


@pytest.mark.parametrize("encryption", ["none", "aes-gcm"])
def test_reply_from_an_old_round_is_stale(encryption):
    server, clients = _pair(encryption)
    old = clients[0].seal("server", 1, Message("upd", v=1)).frame
    with pytest.raises(RejectedMessage) as exc:
        server.open(old, expect_src="client:0", expect_round=5)
    assert exc.value.reason == "stale-round" and server.rejected["stale-round"] == 1
    fresh = clients[0].seal("server", 5, Message("upd", v=2)).frame
    assert server.open(fresh, expect_src="client:0", expect_round=5).msg["v"] == 2
    with pytest.raises(RejectedMessage) as exc:  # the old one, now also behind the last seq
        server.open(old, expect_src="client:0", expect_round=5)
    assert exc.value.reason in ("replayed", "stale-round")


# --------------------------------------------------------------------- 7. paths


@pytest.mark.parametrize("name", ["../../x", "/etc/x", "a/b", "..", ".hidden", "a b", "", "x" * 81, "a..b", "a\\b"])
def test_unsafe_names_are_refused(name):
    with pytest.raises(ScenarioError, match="name: must be"):
        scenario_from_dict({**KFED, "name": name})


@pytest.mark.parametrize("name", ["hw-cefmc", "run_1.v2", "A"])
def test_safe_names_are_kept(name):
    assert scenario_from_dict({**KFED, "name": name}).name == name


def test_default_out_dir_never_leaves_its_root(tmp_path):
    assert default_out_dir("ok-1", tmp_path).parent == tmp_path
    for bad in ("../x", "/abs", "a/b"):
        with pytest.raises(ResultsError):
            default_out_dir(bad, tmp_path)


def test_out_dir_checks(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ResultsError, match="not a folder"):
        check_out_dir(f)
    with pytest.raises(ResultsError, match="not a folder"):
        check_out_dir(f / "sub", create=False)
    assert check_out_dir(tmp_path / "a" / "b").is_dir()


def test_cli_bad_out_is_one_line(tmp_path, capsys, scenario_path):
    f = tmp_path / "file"
    f.write_text("x")
    sc = str(scenario_path("digits-kfed.yaml"))
    err = _one_line_error(capsys, ["run", sc, "--backend", "local", "--quiet", "--out", str(f)])
    assert "--out" in err and "not a folder" in err
    err = _one_line_error(capsys, ["run", sc, "--backend", "local", "--quiet", "--out", "/proc/raymvc-x/y"])
    assert "cannot create" in err
    err = _one_line_error(capsys, ["run", sc, "--backend", "local", "--quiet", "--set", "name=../../x"])
    assert "name: must be" in err


def test_synthetic_size_is_capped():
    with pytest.raises(ScenarioError, match="data.synthetic: n_samples x total dims"):
        scenario_from_dict({**CEFMC, "data": {"dataset": "synthetic", "synthetic": {"n_samples": 10**12}}})
    with pytest.raises(DataError, match="limit"):
        synthetic(n_samples=10**12)


def test_report_on_corrupt_or_odd_summary(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for text, expect in [('{"method": ', "not valid JSON"), ("[1, 2]", "expected a JSON object"),
                         ("\xff\xfe", "corrupt"), ('{"metrics": {"acc": "x"}}', "corrupt")]:
        (run / "summary.json").write_bytes(text.encode("latin-1"))
        err = _one_line_error(capsys, ["report", str(run)])
        assert expect in err
    (run / "summary.json").unlink()
    with pytest.raises(ResultsError, match="not found"):
        read_summary(run)
    _one_line_error(capsys, ["report", str(run)])
    # a sweep folder whose sweep.json is not an object and whose sweep.csv lacks its columns
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("[]")
    (sweep / "sweep.csv").write_text("seed,status\n0,completed\n")
    err = _one_line_error(capsys, ["report", str(sweep)])
    assert "sweep.csv: no 'scenario' column" in err


# --------------------------------------------------------------------- 8. data checks


def _npz(tmp_path, name, **arrays):
    p = tmp_path / f"{name}.npz"
    np.savez(p, **arrays)
    return p


def test_data_file_defects_are_named(tmp_path):
    rng = np.random.default_rng(0)
    X0, X1 = rng.standard_normal((30, 4)), rng.standard_normal((30, 3))
    y = np.arange(30) % 3
    bad = X1.copy()
    bad[1, 1], bad[2, 0], bad[5, 2] = np.inf, np.nan, -np.inf
    cases = {
        "view 1 has 3 non-finite values": dict(X0=X0, X1=bad, y=y),
        "no samples": dict(X0=np.zeros((0, 4)), X1=np.zeros((0, 3)), y=np.zeros(0)),
        "labels have 1 non-finite value": dict(X0=X0, X1=X1, y=np.where(np.arange(30) == 4, np.nan, y)),
        "view 0 holds complex numbers": dict(X0=X0 + 1j, X1=X1, y=y),
        "labels hold complex numbers": dict(X0=X0, X1=X1, y=y + 1j),
        "view 1 has no features": dict(X0=X0, X1=np.zeros((30, 0)), y=y),
    }
    for expect, arrays in cases.items():
        p = _npz(tmp_path, "bad", **arrays)
        with pytest.raises(DataError) as exc:
            load_dataset(path=str(p))
        assert str(exc.value).startswith(f"{p}: ") and expect in str(exc.value), str(exc.value)


def test_one_class_only_warns(tmp_path):
    p = _npz(tmp_path, "one", X0=np.ones((10, 2)), y=np.zeros(10))
    with pytest.warns(DataWarning, match="single class"):
        ds = load_dataset(path=str(p))
    assert ds.n_samples == 10


def test_data_errors_on_the_command_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4))
    X[3, 3] = np.inf
    _npz(tmp_path, "inf", X0=X, X1=X, y=np.arange(30) % 3)
    sc = tmp_path / "s.yaml"
    sc.write_text("method: cefmc\ndata: {path: inf.npz}\n")
    err = _one_line_error(capsys, ["validate", str(sc)])
    assert err.startswith(f"error: {sc}: data.path: ") and "view 0 has 1 non-finite value" in err
    _npz(tmp_path, "one", X0=rng.standard_normal((30, 2)), X1=rng.standard_normal((30, 3)), y=np.zeros(30))
    sc.write_text("method: cefmc\ndata: {path: one.npz, n_clusters: 2}\n")
    assert cli.main(["validate", str(sc)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "single class" in err and err.count("\n") == 1


def test_data_that_would_not_fit_in_memory_is_refused_up_front(tmp_path, capsys, monkeypatch):
    from raymvc.data import prepare as prep

    drawn = []
    monkeypatch.setattr(prep, "load_dataset", lambda *a, **k: drawn.append(a) or load_dataset(*a, **k))
    sc = tmp_path / "s.yaml"
    sc.write_text("method: kfed\ndata: {dataset: synthetic, synthetic: {n_samples: 10000, n_views: 1, dims: 50}}\n")
    assert cli.main(["validate", str(sc)]) == 0 and drawn  # enough memory: accepted
    drawn.clear()
    # 10000 x 50 float64 values = 4 MB, three copies 12 MB: refused with 5 MB left, before a value is drawn
    monkeypatch.setattr(prep, "available_memory", lambda: 5_000_000)
    err = _one_line_error(capsys, ["validate", str(sc)])
    assert err.startswith(f"error: {sc}: data: needs about 0.01 GB") and "0.01 GB is available" in err
    assert not drawn
    # a data file: refused once its size is known, before it is normalised or split
    _npz(tmp_path, "big", X0=np.zeros((2000, 300)), X1=np.zeros((2000, 200)), y=np.arange(2000) % 3)
    sc.write_text("method: cefmc\ndata: {path: big.npz}\n")
    split = []
    monkeypatch.setattr(prep.parts, "vertical", lambda *a, **k: split.append(1))
    err = _one_line_error(capsys, ["validate", str(sc)])
    assert "data: needs about 0.02 GB" in err and not split


def test_available_memory_honours_an_address_space_limit(monkeypatch):
    import resource

    from raymvc.data.prepare import available_memory

    free = available_memory()
    assert free is None or free > 0
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1_000_000, resource.RLIM_INFINITY))
    assert available_memory() == 1_000_000 if free is None else available_memory() == min(free, 1_000_000)


def test_missing_views_on_a_horizontal_split_are_an_error():
    with pytest.raises(ScenarioError, match="data.missing.rate: missing views apply to vertical splits"):
        scenario_from_dict({**KFED, "data": {"dataset": "digits", "missing": {"rate": 0.2}}})
    with pytest.raises(ScenarioError, match="data.unaligned"):
        scenario_from_dict({**KFED, "data": {"dataset": "digits", "unaligned": 0.2}})
    with pytest.raises(ScenarioError, match="data.heterogeneity"):
        scenario_from_dict({**CEFMC, "data": {"dataset": "handwritten", "heterogeneity": 0.5}})


def test_non_finite_scenario_numbers_are_refused():
    with pytest.raises(ScenarioError, match="network.latency_ms"):
        scenario_from_dict({**KFED, "network": {"latency_ms": float("inf")}})


# --------------------------------------------------------------------- properties: codec

_NAMES = st.text(min_size=1, max_size=6)
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_DTYPES = st.sampled_from(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                           "float16", "float32", "float64"])
_ARRAYS = _DTYPES.flatmap(lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                                                   max_side=4)))
_MESSAGES = st.builds(Message, st.text(min_size=1, max_size=10),
                      st.dictionaries(_NAMES, st.one_of(_SCALARS, _ARRAYS), max_size=6))


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, float):
        return type(b) is float and a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


@PROPS
@given(_MESSAGES)
def test_codec_round_trips_any_message_exactly(msg):
    out = decode(encode(msg))
    assert out.kind == msg.kind and list(out.fields) != [] or not msg.fields
    assert set(out.fields) == set(msg.fields)
    for k, v in msg.fields.items():
        assert _same(v, out.fields[k]), k


_MUTATION = st.tuples(st.sampled_from(["flip", "set", "cut", "insert", "drop"]),
                      st.integers(0, 10**6), st.integers(0, 255))


def _mutate(data: bytes, ops) -> bytes:
    buf = bytearray(data)
    for op, where, byte in ops:
        i = where % (len(buf) + 1)
        if op == "flip" and i < len(buf):
            buf[i] ^= 1 << (byte % 8)
        elif op == "set" and i < len(buf):
            buf[i] = byte
        elif op == "cut":
            del buf[i:]
        elif op == "insert":
            buf[i:i] = bytes([byte])
        elif op == "drop" and i < len(buf):
            del buf[i]
    return bytes(buf)


@PROPS
@given(_MESSAGES, st.lists(_MUTATION, min_size=1, max_size=4))
def test_codec_mutations_raise_only_codec_error(msg, ops):
    data = _mutate(encode(msg), ops)
    try:
        decode(data)
    except CodecError:
        pass


# --------------------------------------------------------------------- properties: link


@pytest.mark.parametrize("encryption", ["none", "aes-gcm"])
@pytest.mark.parametrize("compression", ["none", "zlib"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=_MESSAGES, ops=st.lists(_MUTATION, min_size=1, max_size=3))
def test_link_mutations_raise_only_rejected(encryption, compression, msg, ops):
    server, clients = _pair(encryption, compression, clients=(0, 1))
    frame = clients[0].seal("server", 2, msg).frame
    bad = _mutate(frame, ops)
    if bad == frame:
        return
    try:
        opened = server.open(bad, expect_src="client:0", expect_round=2)
    except RejectedMessage as e:
        assert e.reason in link_mod.REASONS and sum(server.rejected.values()) == 1
    else:
        assert encryption == "none", "an altered encrypted frame was accepted"
        assert opened.src == "client:0" and opened.round == 2


# --------------------------------------------------------------------- properties: partitions


@PROPS
@given(n=st.integers(1, 200), views=st.integers(2, 6), rate=st.floats(0, 1),
       pattern=st.sampled_from(["point", "block", "imbalanced"]), seed=st.integers(0, 2**32 - 1))
def test_missing_mask_keeps_a_view_for_every_sample(n, views, rate, pattern, seed):
    mask = missing_mask(n, views, rate, pattern, np.random.default_rng(seed))
    assert mask.shape == (n, views) and mask.any(axis=1).all()
    assert int((~mask.all(axis=1)).sum()) == int(round(rate * n))
    again = missing_mask(n, views, rate, pattern, np.random.default_rng(seed))
    assert np.array_equal(mask, again)


def _labelled(n: int, k: int, seed: int) -> MultiViewDataset:
    rng = np.random.default_rng(seed)
    return MultiViewDataset(name="t", views=[rng.standard_normal((n, 2))], labels=rng.integers(0, k, n))


@PROPS
@given(n=st.integers(4, 150), k=st.integers(1, 5), m=st.integers(1, 6), p=st.floats(0, 1),
       alpha=st.one_of(st.none(), st.floats(0.05, 10)), seed=st.integers(0, 2**32 - 1))
def test_horizontal_covers_every_row_once_and_the_seed_fixes_it(n, k, m, p, alpha, seed):
    ds = _labelled(n, k, seed)
    if n < (2 * m if alpha is not None else m):
        return
    part = horizontal(ds, m, np.random.default_rng(seed), heterogeneity=p, dirichlet_alpha=alpha)
    rows = np.concatenate(part.rows)
    assert len(rows) == n and np.array_equal(np.sort(rows), np.arange(n))
    for shard, r in zip(part.shards, part.rows):
        assert np.array_equal(shard.X, ds.views[0][r])
    again = horizontal(ds, m, np.random.default_rng(seed), heterogeneity=p, dirichlet_alpha=alpha)
    assert all(np.array_equal(a, b) for a, b in zip(part.rows, again.rows))


# --------------------------------------------------------------------- through a whole run (local backend)


def _local_run(scenario_path, tmp_path, *overrides):
    from raymvc.driver import run_scenario

    sc = load_scenario(scenario_path("digits-kfed.yaml"), ["runtime.backend=local", *overrides])
    summary = run_scenario(sc, tmp_path / "run", progress=lambda line: None)
    rows = [line.split(",") for line in (tmp_path / "run" / "messages.csv").read_text().splitlines()[1:]]
    return summary, [row[3] for row in rows if row[4] == "protocol"]  # faults count protocol traffic


def test_oversized_replies_are_counted_as_rejected(scenario_path, tmp_path):
    summary, kinds = _local_run(scenario_path, tmp_path, "channel.max_message_mb=0.002")
    assert summary["faults"]["rejected_messages"] == 10
    assert kinds.count("rejected:oversized") == 10


def test_server_rejects_replies_from_another_client_or_round(scenario_path, tmp_path, monkeypatch):
    from raymvc.runtime import nodes

    original = nodes.ClientNode.deliver

    def deliver(self, frame):
        status, reply, detail, compute, tb = original(self, frame)
        if reply is None or self.cid not in (0, 1):
            return status, reply, detail, compute, tb
        _, src, dst, rnd, seq, pos = link_mod._parse_frame(reply)
        if self.cid == 0:  # client 0's answer arrives under client 1's name
            impostor = Endpoint("client:1")
            impostor.add_peer("server", None)
            return status, impostor.seal("server", rnd, Message("summary", x=1)).frame, detail, compute, tb
        head = reply[:pos - link_mod._ROUND_SEQ.size]  # client 1 answers with an old round number
        return status, head + link_mod._ROUND_SEQ.pack(rnd - 1, seq) + reply[pos:], detail, compute, tb

    monkeypatch.setattr(nodes.ClientNode, "deliver", deliver)
    summary, kinds = _local_run(scenario_path, tmp_path)
    assert "rejected:misrouted" in kinds and "rejected:stale-round" in kinds
    assert summary["faults"]["rejected_messages"] == kinds.count("rejected:misrouted") + kinds.count(
        "rejected:stale-round")
