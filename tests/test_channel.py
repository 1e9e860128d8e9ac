"""Tests for the channel: codec, link layer and ledger."""

from __future__ import annotations

import csv
import json
import math
import struct
import zlib

import numpy as np
import pytest

from raymvc.channel import CodecError, Endpoint, Ledger, LedgerRow, RejectedMessage, decode, encode, handshake_bytes
from raymvc.channel import link as link_mod
from raymvc.messages import Message

ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
              "uint64", "float16", "float32", "float64"]


def _sample(dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.random((3, 4)) > 0.5
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        vals = np.array([info.min, info.max, 0, 1, 7, info.max // 3], dtype=dtype)
        return vals.reshape(2, 3)
    return rng.standard_normal((2, 3, 2)).astype(dtype)


def _build(header: dict, buffers: bytes = b"", version: int = 1, magic: bytes = b"RMVC") -> bytes:
    h = json.dumps(header).encode()
    return magic + bytes([version]) + struct.pack("<I", len(h)) + h + buffers


def _buffer_bytes(data: bytes) -> int:
    """Bytes of array buffers in an encoding (everything after the JSON header)."""
    (hlen,) = struct.unpack_from("<I", data, 5)
    return len(data) - 9 - hlen


def _arr_header(entry: list) -> dict:
    return {"kind": "k", "scalars": {}, "arrays": [entry]}


# ------------------------------------------------------------------------ codec


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_codec_round_trip_each_dtype(dtype):
    arr = _sample(dtype, np.random.default_rng(0))
    msg = Message("m", a=arr, a_t=np.asfortranarray(arr).T)
    out = decode(encode(msg))
    assert out == msg
    assert out["a"].dtype == np.dtype(dtype) and out["a"].shape == arr.shape
    assert out["a"].flags.writeable and out["a_t"].flags.writeable
    out["a"].flat[0] = out["a"].flat[1]  # receivers may modify arrays


def test_codec_round_trip_scalars_and_edge_arrays():
    msg = Message(
        "mixed",
        t=True, f=False, i=1, big=2**70, neg=-5, x=1.0, negzero=-0.0, tiny=5e-324,
        nan=math.nan, inf=math.inf, ninf=-math.inf, s="héllo \u2603", empty_s="", none=None,
        empty=np.zeros((0, 3), dtype=np.float64), zero_d=np.array(7, dtype=np.int16),
        empty_u8=np.array([], dtype=np.uint8), big_endian=np.arange(5, dtype=">i4"),
    )
    out = decode(encode(msg))
    assert out.kind == "mixed"
    assert out["t"] is True and out["f"] is False
    assert type(out["i"]) is int and out["i"] == 1 and out["big"] == 2**70
    assert type(out["x"]) is float and out["x"] == 1.0
    assert math.copysign(1.0, out["negzero"]) == -1.0 and out["tiny"] == 5e-324
    assert math.isnan(out["nan"]) and out["inf"] == math.inf and out["ninf"] == -math.inf
    assert out["s"] == "héllo \u2603" and out["empty_s"] == "" and out["none"] is None
    assert out["empty"].shape == (0, 3) and out["empty"].dtype == np.float64
    assert out["zero_d"].shape == () and out["zero_d"] == 7 and out["zero_d"].dtype == np.int16
    assert out["empty_u8"].shape == (0,) and out["empty_u8"].dtype == np.uint8
    np.testing.assert_array_equal(out["big_endian"], np.arange(5))
    assert out["big_endian"].dtype == np.dtype("int32")
    # the rest compares equal (nan never equals itself; byte order is normalised)
    for name in ("nan", "big_endian"):
        del msg.fields[name], out.fields[name]
    assert out == msg


def test_codec_float64_exact_and_nonfinite_arrays():
    arr = np.array([np.nan, np.inf, -np.inf, 1e-310, np.pi, -0.0])
    out = decode(encode(Message("m", a=arr)))["a"]
    assert out.tobytes() == arr.tobytes()


def test_float32_mode_halves_float_bytes_and_keeps_ints():
    x = np.random.default_rng(1).standard_normal((100, 10))
    y = np.arange(1000, dtype=np.uint8)
    full = encode(Message("m", x=x), "float64")
    half = encode(Message("m", x=x), "float32")
    assert _buffer_bytes(full) == 8000 and _buffer_bytes(half) == 4000
    out = decode(half)["x"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x, rtol=1e-6)
    assert decode(encode(Message("m", y=y), "float32"))["y"].dtype == np.uint8
    assert len(encode(Message("m", y=y), "float32")) == len(encode(Message("m", y=y)))
    f32 = np.ones(4, dtype=np.float32)
    assert decode(encode(Message("m", a=f32), "float64"))["a"].dtype == np.float32
    f16 = np.ones(4, dtype=np.float16)
    assert decode(encode(Message("m", a=f16), "float32"))["a"].dtype == np.float32
    with pytest.raises(ValueError):
        encode(Message("m"), "float8")


def test_object_arrays_refused_and_complex_not_encodable():
    with pytest.raises(TypeError):
        Message("m", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(TypeError):
        Message("m", a=[1, 2])
    with pytest.raises(TypeError, match="unsupported dtype"):  # the codec carries no complex numbers
        Message("m", c=np.ones(2, dtype=np.complex128))


_GOOD = {"kind": "k", "scalars": {}, "arrays": [["a", "int32", [2], 8]]}
MALFORMED = {
    "empty": b"",
    "short": b"RMVC\x01",
    "bad magic": _build(_GOOD, b"\0" * 8, magic=b"XXXX"),
    "bad version": _build(_GOOD, b"\0" * 8, version=2),
    "header overrun": b"RMVC\x01" + struct.pack("<I", 1000) + b"{}",
    "not json": b"RMVC\x01" + struct.pack("<I", 5) + b"{kind",
    "not utf8": b"RMVC\x01" + struct.pack("<I", 2) + b"\xff\xfe",
    "json list": _build([1, 2]),  # type: ignore[arg-type]
    "missing key": _build({"kind": "k", "scalars": {}}),
    "extra key": _build({"kind": "k", "scalars": {}, "arrays": [], "x": 1}),
    "empty kind": _build({"kind": "", "scalars": {}, "arrays": []}),
    "kind not str": _build({"kind": 3, "scalars": {}, "arrays": []}),
    "scalars list": _build({"kind": "k", "scalars": [], "arrays": []}),
    "bad scalar": _build({"kind": "k", "scalars": {"a": [1]}, "arrays": []}),
    "bad tag": _build({"kind": "k", "scalars": {"a": {"f": "zero"}}, "arrays": []}),
    "nan literal": b"RMVC\x01" + struct.pack("<I", 44)
    + b'{"kind":"k","scalars":{"a":NaN},"arrays":[]}',
    "object dtype": _build(_arr_header(["a", "object", [1], 8]), b"\0" * 8),
    "complex dtype": _build(_arr_header(["a", "complex128", [1], 16]), b"\0" * 16),
    "datetime dtype": _build(_arr_header(["a", "datetime64", [1], 8]), b"\0" * 8),
    "negative dim": _build(_arr_header(["a", "int32", [-2], 8]), b"\0" * 8),
    "float dim": _build(_arr_header(["a", "int32", [2.0], 8]), b"\0" * 8),
    "bool dim": _build(_arr_header(["a", "uint8", [True], 1]), b"\0"),
    "shape not list": _build(_arr_header(["a", "int32", 2, 8]), b"\0" * 8),
    "nbytes mismatch": _build(_arr_header(["a", "int32", [2], 4]), b"\0" * 4),
    "short entry": _build({"kind": "k", "scalars": {}, "arrays": [["a", "int32", [2]]]}),
    "buffer overrun": _build(_GOOD, b"\0" * 7),
    "trailing bytes": _build(_GOOD, b"\0" * 9),
    "dup array": _build({"kind": "k", "scalars": {}, "arrays": [_GOOD["arrays"][0]] * 2},
                        b"\0" * 16),
    "dup scalar/array": _build({"kind": "k", "scalars": {"a": 1},
                                "arrays": [_GOOD["arrays"][0]]}, b"\0" * 8),
    "dup json key": b"RMVC\x01" + struct.pack("<I", 51)
    + b'{"kind":"k","scalars":{"a":1,"a":2},"arrays":[]}   ',
    "empty name": _build(_arr_header(["", "int32", [2], 8]), b"\0" * 8),
    "huge empty dims": _build(_arr_header(["a", "int8", [0, 2**62, 2**62], 0])),
    "bool bytes": _build(_arr_header(["a", "bool", [2], 2]), b"\x01\x02"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_decode_malformed_raises_codec_error(name):
    with pytest.raises(CodecError):
        decode(MALFORMED[name])


def test_malformed_cases_differ_from_a_valid_encoding():
    # sanity: the valid header used as a template decodes
    assert decode(_build(_GOOD, struct.pack("<2i", 3, -4)))["a"].tolist() == [3, -4]


def test_decode_fuzz_only_codec_error():
    rng = np.random.default_rng(1234)
    msg = Message("fuzz", a=np.arange(12, dtype=np.float64).reshape(3, 4),
                  b=np.array([True, False]), n=3, s="x", z=None, q=math.inf)
    good = encode(msg)
    ok = bad = 0
    for i in range(300):
        data = bytearray(good)
        if i % 3 == 0:
            data = data[: int(rng.integers(0, len(data)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(0, len(data)))
                data[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            out = decode(bytes(data))
        except CodecError:
            bad += 1
        else:
            assert isinstance(out, Message)
            ok += 1
    assert bad > 100 and ok + bad == 300


# ------------------------------------------------------------------------ link


def _pair(encryption="none", compression="none", float_dtype="float64",
          client="client:2"):
    server = Endpoint("server", encryption=encryption, compression=compression,
                      float_dtype=float_dtype)
    cli = Endpoint(client, encryption=encryption, compression=compression,
                   float_dtype=float_dtype)
    server.add_peer(client, cli.public_key())
    cli.add_peer("server", server.public_key())
    return server, cli


def _msg():
    return Message("centroids", c=np.random.default_rng(5).standard_normal((4, 6)),
                   y=np.zeros(500, dtype=np.uint8), it=3, done=False)


@pytest.mark.parametrize("encryption", ["none", "aes-gcm"])
@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_seal_open_round_trip(encryption, compression):
    server, cli = _pair(encryption, compression)
    msg = _msg()
    for k in range(3):
        sealed = server.seal("client:2", 7 + k, msg)
        assert sealed.seq == k + 1 and sealed.kind == "centroids"
        assert sealed.wire_bytes == len(sealed.frame)
        assert sealed.payload_bytes == len(encode(msg))
        opened = cli.open(sealed.frame)
        assert (opened.src, opened.dst, opened.round, opened.seq) == ("server", "client:2",
                                                                      7 + k, k + 1)
        assert opened.msg == msg and opened.payload_bytes == sealed.payload_bytes
    reply = cli.seal("server", 9, Message("ack", ok=True))
    assert reply.seq == 1 and server.open(reply.frame).msg["ok"] is True
    if compression == "zlib":
        assert sealed.wire_bytes < sealed.payload_bytes  # 500 zero bytes compress well
    if encryption == "aes-gcm":
        assert len(server.public_key()) == 32
        assert msg.kind.encode() not in sealed.frame and b"RMVC" not in sealed.frame
    else:
        assert server.public_key() is None
    assert sum(cli.rejected.values()) == 0


def test_endpoint_validates_options():
    for kw in ({"encryption": "rot13"}, {"compression": "lz4"}, {"float_dtype": "int8"}):
        with pytest.raises(ValueError):
            Endpoint("server", **kw)
    with pytest.raises(ValueError):
        Endpoint("server", encryption="aes-gcm").add_peer("client:0", None)
    with pytest.raises(ValueError):
        Endpoint("server", encryption="aes-gcm").add_peer("client:0", b"short")
    assert handshake_bytes("aes-gcm") == 32 and handshake_bytes("none") == 0
    with pytest.raises(KeyError):
        Endpoint("server").seal("client:9", 0, Message("m"))


def test_float32_endpoint_sends_float32():
    server, cli = _pair(float_dtype="float32")
    sealed = server.seal("client:2", 0, _msg())
    out = cli.open(sealed.frame).msg
    assert out["c"].dtype == np.float32 and out["y"].dtype == np.uint8
    assert sealed.payload_bytes == len(encode(_msg(), "float32"))
    assert _buffer_bytes(encode(_msg(), "float32")) == _buffer_bytes(encode(_msg())) - 4 * 24


def test_encryption_overhead_is_exactly_the_tag():
    plain, _ = _pair("none")
    enc, _ = _pair("aes-gcm")
    for m in (_msg(), Message("empty"), Message("s", s="x" * 1000)):
        a, b = plain.seal("client:2", 1, m), enc.seal("client:2", 1, m)
        assert b.payload_bytes == a.payload_bytes
        assert b.wire_bytes - a.wire_bytes == 16


@pytest.mark.parametrize("encryption", ["none", "aes-gcm"])
@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_one_encoding_sealed_for_many_peers(encryption, compression):
    """A broadcast is encoded once and sealed per peer; each frame is the one a separate
    seal would give, and without encryption every frame holds the same body object."""
    kw = dict(encryption=encryption, compression=compression)
    server, twin = Endpoint("server", **kw), Endpoint("server", **kw)
    clients = {f"client:{i}": Endpoint(f"client:{i}", **kw) for i in range(3)}
    for name, c in clients.items():
        server.add_peer(name, c.public_key())
        c.add_peer("server", server.public_key())
        twin.add_peer(name, None if encryption == "none" else c.public_key())
    msg = _msg()
    enc = server.encode(msg)
    sealed = {name: server.seal(name, 4, msg, encoded=enc) for name in clients}
    bodies = [s.body for s in sealed.values()]
    if encryption == "none":
        assert all(b is bodies[0] for b in bodies)
        for name, s in sealed.items():  # byte for byte what a per-peer seal gives
            assert s.frame == twin.seal(name, 4, msg).frame
    else:
        assert len({bytes(b) for b in bodies}) == 3  # one ciphertext per link
    for name, s in sealed.items():
        assert s.wire_bytes == len(s.header) + len(s.body) and s.payload_bytes == len(encode(msg))
        opened = clients[name].open(s.parts)
        assert opened.msg == msg and (opened.dst, opened.round, opened.seq) == (name, 4, 1)
    with pytest.raises(ValueError, match="another message"):
        server.seal("client:0", 5, Message("other"), encoded=enc)


def test_open_checks_a_header_body_pair():
    server, cli = _pair("aes-gcm")
    s = server.seal("client:2", 1, _msg())
    _expect(cli, (s.header + b"x", s.body), "malformed")  # a header with trailing bytes
    _expect(cli, (s.header, s.body, b""), "malformed")
    _expect(cli, (s.header, "text"), "malformed")
    moved = (s.header[:-1], s.header[-1:] + s.body)  # the split moved: the header no longer parses
    _expect(cli, moved, "malformed")
    flipped = bytearray(s.body)
    flipped[0] ^= 1
    _expect(cli, (s.header, bytes(flipped)), "tampered")
    assert cli.open((memoryview(s.header), bytearray(s.body))).msg == _msg()
    small = Endpoint("client:2", max_message_bytes=100)
    small.add_peer("server", None)
    plain = Endpoint("server")
    plain.add_peer("client:2", None)
    big = plain.seal("client:2", 1, _msg())
    _expect(small, big.parts, "oversized")
    s2 = server.seal("client:2", 2, _msg())
    with pytest.raises(RejectedMessage, match="expected bytes, got tuple"):
        cli.open(s2.parts, pair_ok=False)  # a receiver that meters frames by length takes joined bytes only
    gone = memoryview(s2.frame)
    gone.release()
    _expect(cli, gone, "malformed")
    _expect(cli, (s2.header, gone), "malformed")
    assert cli.open(s2.frame, pair_ok=False).seq == 2


def _expect(endpoint, frame, reason):
    before = dict(endpoint.rejected)
    with pytest.raises(RejectedMessage) as info:
        endpoint.open(frame)
    assert info.value.reason == reason
    assert endpoint.rejected[reason] == before[reason] + 1
    return info.value


def test_flipped_ciphertext_bit_is_tampered():
    server, cli = _pair("aes-gcm")
    frame = bytearray(server.seal("client:2", 1, _msg()).frame)
    frame[-40] ^= 0x01
    _expect(cli, bytes(frame), "tampered")
    frame = bytearray(server.seal("client:2", 1, _msg()).frame)
    frame[-1] ^= 0x80  # the tag itself
    _expect(cli, bytes(frame), "tampered")


def test_replay_detected_after_authentication():
    server, cli = _pair("aes-gcm")
    f1 = server.seal("client:2", 1, _msg()).frame
    f2 = server.seal("client:2", 1, _msg()).frame
    cli.open(f1)
    _expect(cli, f1, "replayed")
    cli.open(f2)
    _expect(cli, f1, "replayed")  # older seq also refused
    # a forged frame with a fresh seq fails authentication, and does not advance seq
    f3 = server.seal("client:2", 1, _msg()).frame
    forged = bytearray(f3)
    forged[-1] ^= 1
    _expect(cli, bytes(forged), "tampered")
    assert cli.open(f3).seq == 3


def test_replay_detected_without_encryption():
    server, cli = _pair("none")
    f1 = server.seal("client:2", 1, _msg()).frame
    cli.open(f1)
    _expect(cli, f1, "replayed")


def _rewrite_header(frame: bytes, dst: str | None = None, round: int | None = None) -> bytes:
    flags, src, old_dst, rnd, seq, pos = link_mod._parse_frame(frame)
    head = (b"RMF1" + bytes([flags]) + struct.pack("<H", len(src)) + src.encode()
            + struct.pack("<H", len(dst or old_dst)) + (dst or old_dst).encode()
            + struct.pack("<iQ", rnd if round is None else round, seq))
    return head + frame[pos:]


def test_misrouted_frames():
    server = Endpoint("server", encryption="aes-gcm")
    c2 = Endpoint("client:2", encryption="aes-gcm")
    c3 = Endpoint("client:3", encryption="aes-gcm")
    for c in (c2, c3):
        server.add_peer(c.party, c.public_key())
        c.add_peer("server", server.public_key())
    frame = server.seal("client:2", 1, _msg()).frame
    _expect(c3, frame, "misrouted")
    _expect(c3, _rewrite_header(frame, dst="client:3"), "tampered")
    assert c2.open(frame).msg == _msg()  # the genuine receiver still accepts it


def test_edited_round_is_tampered():
    server, cli = _pair("aes-gcm")
    frame = server.seal("client:2", 4, _msg()).frame
    assert _rewrite_header(frame) == frame
    _expect(cli, _rewrite_header(frame, round=5), "tampered")
    assert cli.open(frame).round == 4


def test_unknown_peer_malformed_and_mode_mismatch():
    server, cli = _pair("aes-gcm")
    stranger = Endpoint("client:7", encryption="aes-gcm")
    stranger.add_peer("client:2", cli.public_key())
    _expect(cli, stranger.seal("client:2", 1, _msg()).frame, "unknown-peer")
    for junk in (b"", b"RMF1", b"XXXX" + bytes(30), b"RMF1\x80" + bytes(30),
                 b"RMF1\x02\xff\xff", b"RMF1\x02\x01\x00\xff\x01\x00a"):
        _expect(cli, junk, "malformed")
    plain_server = Endpoint("server")
    plain_server.add_peer("client:2", None)
    _expect(cli, plain_server.seal("client:2", 1, _msg()).frame, "tampered")
    assert cli.rejected == {"malformed": 6, "tampered": 1, "replayed": 0,
                            "misrouted": 0, "unknown-peer": 1, "oversized": 0, "stale-round": 0}


def test_plaintext_bad_body_and_zlib_bomb_are_malformed():
    server, cli = _pair("none", "zlib")
    frame = server.seal("client:2", 1, _msg()).frame
    _, _, _, _, _, pos = link_mod._parse_frame(frame)
    _expect(cli, frame[:pos] + b"not zlib", "malformed")
    _expect(cli, frame[:-3], "malformed")  # truncated stream
    cli.max_payload_bytes = len(frame) + 1
    _expect(cli, frame, "oversized")  # inflated payload bigger than the cap
    cli.max_payload_bytes = 1 << 30
    assert cli.open(frame).seq == 1  # rejected frames did not consume the seq
    fresh = server.seal("client:2", 2, _msg()).frame  # seq 2, not yet seen
    bomb = fresh[:pos] + zlib.compress(b"RMVC" + bytes(50_000))
    cli.max_payload_bytes = 100
    _expect(cli, bomb, "oversized")
    raw_server, raw_cli = _pair("none")
    frame = raw_server.seal("client:2", 1, _msg()).frame
    _expect(raw_cli, frame[:-1], "malformed")  # codec failure


# ------------------------------------------------------------------------ ledger


def _ledger() -> Ledger:
    led = Ledger()
    led.record(round=0, src="server", dst="client:0", kind="init", path="protocol",
               payload_bytes=90, wire_bytes=100, send_t=0.0, arrive_t=0.1)
    led.record(round=0, src="server", dst="client:1", kind="init", path="protocol",
               payload_bytes=90, wire_bytes=100, send_t=0.0, arrive_t=None, status="dropped")
    led.record(round=0, src="client:0", dst="server", kind="upd", path="protocol",
               payload_bytes=40, wire_bytes=50, send_t=0.2, arrive_t=0.3)
    led.record(round=1, src="client:1", dst="server", kind="upd", path="protocol",
               payload_bytes=20, wire_bytes=30, send_t=1.0, arrive_t=None, status="lost")
    led.record(round=1, src="client:0", dst="server", kind="labels", path="eval",
               payload_bytes=1000, wire_bytes=1016, send_t=2.0, arrive_t=2.5)
    led.extend([LedgerRow(round=0, src="client:1", dst="server", kind="pk", path="setup",
                          payload_bytes=32, wire_bytes=32, send_t=0.0, arrive_t=0.0)])
    return led


def test_ledger_totals_and_breakdowns(tmp_path):
    led = _ledger()
    tot = led.totals()
    assert tot == {"messages": 4, "data_bytes": 0, "payload_bytes": 240, "wire_bytes": 280, "bytes_up": 80,
                   "bytes_down": 200, "mb_total": 280 / 1e6}
    assert led.totals("eval")["bytes_up"] == 1016 and led.totals("setup")["messages"] == 1
    assert led.totals(None)["wire_bytes"] == 280 + 1016 + 32
    assert led.per_client() == {0: {"up": 50, "down": 100, "messages": 2},
                                1: {"up": 30, "down": 100, "messages": 2}}
    pr = led.per_round()
    assert list(pr) == [0, 1]
    assert pr[0]["messages"] == 3 and pr[0]["wire_bytes"] == 250 and pr[0]["bytes_down"] == 200
    assert pr[1]["bytes_up"] == 30 and pr[1]["bytes_down"] == 0
    assert led.to_dicts()[1]["status"] == "dropped" and len(led.to_dicts()) == 6

    out = tmp_path / "ledger.csv"
    led.write_csv(str(out))
    with open(out, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["round", "src", "dst", "kind", "path", "payload_bytes", "wire_bytes",
                       "send_t", "arrive_t", "status", "data_bytes"]
    assert len(rows) == 7 and rows[2][8] == "" and rows[2][9] == "dropped"
    assert rows[5][4] == "eval" and rows[5][6] == "1016"


def test_ledger_rejects_bad_rows():
    led = Ledger()
    with pytest.raises(ValueError):
        led.record(round=0, src="server", dst="client:0", kind="k", path="other",
                   payload_bytes=1, wire_bytes=1, send_t=0.0)
    with pytest.raises(ValueError):
        led.record(round=0, src="server", dst="client:0", kind="k", path="eval",
                   payload_bytes=1, wire_bytes=1, send_t=0.0, status="weird")
    with pytest.raises(TypeError):
        led.record(round=0, src="server")
    with pytest.raises(TypeError):
        led.extend([{"round": 0}])
    assert led.rows == []


def test_ledger_meters_sealed_frames():
    server, cli = _pair("aes-gcm", "zlib")
    led = Ledger()
    for r in range(3):
        s = server.seal("client:2", r, _msg())
        cli.open(s.frame)
        led.record(round=r, src="server", dst="client:2", kind=s.kind, path="protocol",
                   payload_bytes=s.payload_bytes, wire_bytes=s.wire_bytes, send_t=float(r))
    tot = led.totals()
    assert tot["messages"] == 3 and tot["bytes_down"] == tot["wire_bytes"]
    assert led.per_client()[2]["down"] == tot["wire_bytes"]


# ------------------------------------------------------------------------ bounded decoding


def _zlib_frame(server: Endpoint, chunks) -> bytes:
    """A frame whose body is the zlib stream of ``chunks`` (compressed piece by piece)."""
    frame = server.seal("client:2", 1, Message("x")).frame
    pos = link_mod._parse_frame(frame)[-1]
    z = zlib.compressobj(9)
    return frame[:pos] + b"".join(z.compress(c) for c in chunks) + z.flush()


def _prefix(hlen: int) -> bytes:
    return b"RMVC" + bytes([1]) + struct.pack("<I", hlen)


def test_header_bomb_is_refused_before_it_is_inflated():
    """A small compressed frame whose JSON header inflates to 64 MB (under the 256 MB cap)."""
    server, cli = _pair("none", "zlib")
    size = 64 << 20
    head, tail = b'{"kind":"k","scalars":{"s":"', b'"},"arrays":[]}'
    mb = b"a" * (1 << 20)
    chunks = [_prefix(len(head) + size + len(tail)), head, *([mb] * 64), tail]
    frame = _zlib_frame(server, chunks)
    assert len(frame) < 1_000_000
    err = _expect(cli, frame, "oversized")
    assert "header of" in err.detail and "limit" in err.detail


def test_millions_of_empty_arrays_are_refused():
    server, cli = _pair("none", "zlib")
    entries = b",".join(b'["%x","bool",[0],0]' % i for i in range(200_000))  # 4 MB of header
    header = b'{"kind":"k","scalars":{},"arrays":[' + entries + b"]}"
    err = _expect(cli, _zlib_frame(server, [_prefix(len(header)), header]), "oversized")
    assert "header of" in err.detail
    with pytest.raises(CodecError, match="header of"):  # the same without compression
        decode(_prefix(len(header)) + header)


def test_too_many_fields_are_refused_within_the_header_limit():
    from raymvc.channel.codec import MAX_FIELDS, MAX_HEADER_BYTES, CodecLimit

    n = MAX_FIELDS + 1
    header = json.dumps({"kind": "k", "scalars": {f"{i:x}": 0 for i in range(n)}, "arrays": []},
                        separators=(",", ":")).encode()
    assert len(header) <= MAX_HEADER_BYTES
    with pytest.raises(CodecLimit, match="fields"):
        decode(_prefix(len(header)) + header)
    server, cli = _pair("none", "zlib")
    err = _expect(cli, _zlib_frame(server, [_prefix(len(header)), header]), "oversized")
    assert "fields" in err.detail
    with pytest.raises(CodecLimit, match="fields"):
        encode(Message("k", {f"{i:x}": 0 for i in range(n)}))
    with pytest.raises(CodecLimit, match="header of"):
        encode(Message("k", s="a" * (MAX_HEADER_BYTES + 1)))
