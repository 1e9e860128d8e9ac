"""End-to-end behaviour of the engine with CeFMC on the built-in handwritten data."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from raymvc.driver import run_scenario
from raymvc.messages import Message
from raymvc.protocols import get
from raymvc.runtime import transport
from raymvc.scenario import load_scenario

QUICK = Path(__file__).resolve().parents[1] / "scenarios" / "hw-cefmc.yaml"
QUICK_H = Path(__file__).resolve().parents[1] / "scenarios" / "hw-cefmch.yaml"

SUMMARY_KEYS = {"method", "platform", "dataset", "n_samples", "n_clients", "seed", "status", "rounds", "metrics",
                "communication", "faults", "timing"}


def run(tmp_path, name, *overrides, scenario=QUICK, backend="local"):
    sc = load_scenario(scenario, [f"runtime.backend={backend}", *overrides])
    return run_scenario(sc, tmp_path / name, progress=lambda line: None)


def read_ledger(out_dir):
    with open(Path(out_dir) / "messages.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return run(tmp_path_factory.mktemp("quick"), "run")


def test_quickstart_quality_traffic_and_files(quick):
    s = quick
    assert SUMMARY_KEYS <= s.keys()
    assert s["status"] == "completed"
    assert s["metrics"]["acc"] >= 0.93 and s["metrics"]["nmi"] >= 0.86
    assert set(s["metrics"]) == {"acc", "nmi", "ari", "purity", "fscore"}
    c = s["communication"]
    assert {"messages", "payload_bytes", "wire_bytes", "bytes_up", "bytes_down", "mb_total"} <= c.keys()
    assert 0 < c["mb_total"] <= 1.30
    assert c["bytes_up"] + c["bytes_down"] == c["wire_bytes"]
    assert {"dropped_replies", "late_replies", "crashed_clients", "rejected_messages"} <= s["faults"].keys()
    assert {"wall_s", "ray_init_s", "protocol_s", "virtual_s"} <= s["timing"].keys()
    out = Path(s["out_dir"])
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["metrics"] == s["metrics"]
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == s["rounds"] and rounds[-1]["done"]
    assert all("objective" in r["info"] for r in rounds[1:])
    ledger = read_ledger(out)
    proto_rows = [r for r in ledger if r["path"] == "protocol"]
    assert len(proto_rows) == c["messages"]
    assert sum(int(r["wire_bytes"]) for r in proto_rows) == c["wire_bytes"]
    assert (out / "scenario.yaml").read_text().startswith("name: hw-cefmc")


def test_labels_travel_as_uint8_and_only_embeddings_once(quick):
    ledger = read_ledger(quick["out_dir"])
    n, k = 2000, 10
    up = [r for r in ledger if r["path"] == "protocol" and r["src"].startswith("client")]
    embeddings = [r for r in up if r["kind"] == "embedding"]
    assert len(embeddings) == 6 and all(int(r["round"]) == 0 for r in embeddings)
    for r in up:
        if r["kind"] == "labels":
            assert int(r["data_bytes"]) == n * 1 + 8  # uint8 labels + one float objective
    assert all(int(r["data_bytes"]) == n * k * 8 for r in embeddings)


def test_analytic_count_matches_ledger(quick):
    from raymvc.protocols.cefmc import communication

    ledger = read_ledger(quick["out_dir"])
    per = defaultdict(lambda: {"up": 0, "down": 0})
    for r in ledger:
        if r["path"] != "protocol":
            continue
        if r["src"] == "server":
            per[r["dst"]]["down"] += int(r["data_bytes"])
        else:
            per[r["src"]]["up"] += int(r["data_bytes"])
    # rounds: round 0 (embeddings) + t label rounds; the last step's Done sends nothing
    t = quick["rounds"] - 1
    want = communication(2000, 10, t)
    # t label rounds were answered, but consensus was sent t times (after init and t-1 rounds)
    want_down = want["down"] - (2000 + 100 * 8)
    assert len(per) == 6
    for party, got in per.items():
        assert got["up"] == want["up"], party
        assert got["down"] == want_down, party


def test_same_seed_same_results_and_seed_changes_init(tmp_path, quick):
    again = run(tmp_path, "again")
    assert again["metrics"] == quick["metrics"]
    assert again["communication"] == quick["communication"]
    assert read_ledger(again["out_dir"]) == read_ledger(quick["out_dir"])
    assert (Path(again["out_dir"]) / "labels.csv").read_text() == (Path(quick["out_dir"]) / "labels.csv").read_text()
    other = run(tmp_path, "other", "seed=5")
    assert other["status"] == "completed"
    # another seed, another k-means initialisation: the assignments differ somewhere
    assert (Path(other["out_dir"]) / "labels.csv").read_text() != (Path(quick["out_dir"]) / "labels.csv").read_text()


def test_ray_backend_matches_local(ray_session, tmp_path, quick):
    s = run(tmp_path, "ray", backend="ray")
    assert s["backend"] == "ray" and s["status"] == "completed"
    assert s["metrics"] == quick["metrics"]
    assert s["communication"] == quick["communication"]
    assert s["rounds"] == quick["rounds"]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("send_t", "arrive_t")} for r in rows]
    assert strip(read_ledger(s["out_dir"])) == strip(read_ledger(quick["out_dir"]))


def test_encryption_same_results_more_wire_bytes(tmp_path, quick):
    s = run(tmp_path, "aes", "channel.encryption=aes-gcm")
    assert s["metrics"] == quick["metrics"]
    assert s["communication"]["payload_bytes"] == quick["communication"]["payload_bytes"]
    assert s["communication"]["wire_bytes"] == quick["communication"]["wire_bytes"] + 16 * s["communication"]["messages"]
    assert s["faults"]["rejected_messages"] == 0
    assert s["communication_setup"]["wire_bytes"] == 2 * 6 * 32  # one X25519 key each way per link


def test_float32_halves_float_traffic(tmp_path, quick):
    s = run(tmp_path, "f32", "channel.float_dtype=float32")
    assert s["status"] == "completed"
    # the round-0 embeddings dominate: 6 x 2000 x 10 floats
    saved = quick["communication"]["data_bytes"] - s["communication"]["data_bytes"]
    assert saved >= 6 * 2000 * 10 * 4
    assert abs(s["metrics"]["acc"] - quick["metrics"]["acc"]) <= 0.02


def test_cefmc_costs_at_most_half_of_cefmc_h(tmp_path, quick):
    h = run(tmp_path, "h", scenario=QUICK_H)
    assert h["method"] == "cefmc-h" and h["status"] == "completed"
    assert quick["communication"]["mb_total"] <= 0.5 * h["communication"]["mb_total"]
    assert abs(quick["metrics"]["acc"] - h["metrics"]["acc"]) <= 0.02


def test_dropouts_and_late_stragglers_are_counted(tmp_path):
    s = run(tmp_path, "faults", "faults.dropout.rate=0.3", "faults.stragglers.fraction=0.3", "faults.deadline_s=1.0")
    f = s["faults"]
    assert s["status"] == "degraded"
    assert f["dropped_replies"] > 0 and f["late_replies"] > 0
    assert s["metrics"]["acc"] > 0.5
    rounds = [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]
    assert sum(len(r["dropped"]) for r in rounds) == f["dropped_replies"]
    assert sum(len(r["late"]) for r in rounds) == f["late_replies"]
    # a round with a missing reply waits for the deadline on the virtual clock
    waited = [r for r in rounds if r["missing"]]
    assert waited and all(r["virtual_end_s"] - r["virtual_start_s"] >= 1.0 - 1e-9 for r in waited)
    stale = [c for r in rounds[1:] for c in r["info"].get("stale_clients", [])]
    assert stale  # CeFMC reused the last labels of the clients it did not hear from
    ledger = read_ledger(s["out_dir"])
    assert sum(r["status"] == "dropped" for r in ledger) == f["dropped_replies"]
    assert sum(r["status"] == "late" for r in ledger) == f["late_replies"]
    # the same seed gives the same faults
    again = run(tmp_path, "faults2", "faults.dropout.rate=0.3", "faults.stragglers.fraction=0.3", "faults.deadline_s=1.0")
    assert again["faults"] == f and again["metrics"] == s["metrics"]


def test_network_model_sets_virtual_time(tmp_path):
    s = run(tmp_path, "net", "network.latency_ms=50", "network.bandwidth_mbps=8")
    c = s["communication"]
    # every round: down then up, each at least 50 ms; 8 Mbit/s = 1 MB/s
    assert s["timing"]["virtual_s"] >= s["rounds"] * 2 * 0.05
    assert s["timing"]["virtual_s"] >= c["bytes_up"] / 6 / 1e6


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_crashed_client_degrades_but_keeps_results(tmp_path, backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_session")
    s = run(tmp_path, f"crash-{backend}", "faults.crash=[{client: 2, at_round: 2}]", backend=backend)
    assert s["status"] == "degraded"
    assert s["faults"]["crashed_clients"] == [2]
    assert s["metrics"]["acc"] > 0.8
    out = Path(s["out_dir"])
    assert (out / "summary.json").is_file() and (out / "messages.csv").is_file()
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert rounds[2]["crashed"] == [2]
    assert all(2 in r["missing"] for r in rounds[2:-1] if r["round"] >= 2)


def test_too_few_clients_fails_but_writes_results(tmp_path):
    s = run(tmp_path, "few", "faults.dropout.rate=0.6", "faults.min_clients=6")
    assert s["status"] == "failed"
    assert "min_clients" in s["error"]
    out = Path(s["out_dir"])
    saved = json.loads((out / "summary.json").read_text())
    assert saved["status"] == "failed" and (out / "rounds.jsonl").read_text()


def test_tampered_reply_is_rejected_and_counted(tmp_path, monkeypatch):
    real = transport.LocalTransport.exchange
    hits = []

    def flip_one(self, frames):
        out = real(self, frames)
        for cid, o in out.items():
            if cid == 1 and o.frame is not None and not hits:
                b = bytearray(o.frame)
                b[-1] ^= 0x01  # one bit of the tag / ciphertext
                o.frame = bytes(b)
                hits.append(cid)
        return out

    monkeypatch.setattr(transport.LocalTransport, "exchange", flip_one)
    s = run(tmp_path, "tamper", "channel.encryption=aes-gcm")
    assert hits == [1]
    assert s["faults"]["rejected_messages"] == 1
    assert s["status"] == "degraded"
    ledger = read_ledger(s["out_dir"])
    assert [r["kind"] for r in ledger if r["status"] == "rejected"] == ["rejected:tampered"]


def test_cefmc_reuses_stale_labels_for_missing_clients():
    from raymvc.data import load_dataset, normalize
    from raymvc.data.types import Shard
    from raymvc.protocol import ClientContext, ServerContext

    proto = get("cefmc")
    cfg = proto.config()
    ds = normalize(load_dataset("handwritten"), "l2")
    clients = {v: proto.client(cfg, Shard(views=[ds.views[v]]), ClientContext(v, 6, 10, 0))
               for v in range(6)}
    server = proto.server(cfg, ServerContext(list(range(6)), 10, 9, n_samples=2000))
    out = server.start()
    out = server.step(0, {c: clients[c].handle(m) for c, m in out.items()}, set())
    first = {c: clients[c].handle(m) for c, m in out.items()}
    out = server.step(1, first, set())
    stale_y = server.last[3].copy()
    replies = {c: clients[c].handle(m) for c, m in out.items() if c != 3}
    out = server.step(2, replies, {3})
    assert server.info["stale_clients"] == [3]
    assert np.array_equal(server.last[3], stale_y)  # the last labels stand in for the missing reply
    assert set(out) == set(range(6))  # and the client is still addressed next round


def test_client_exception_is_recorded_and_run_goes_on(tmp_path, monkeypatch):
    from raymvc.protocols import cefmc

    real = cefmc.CeFMCClient.handle
    calls = {"n": 0}

    def flaky(self, msg):
        if self.ctx.client_id == 4 and msg.kind == "consensus":
            calls["n"] += 1
            if calls["n"] == 2:
                raise FloatingPointError("boom")
        return real(self, msg)

    monkeypatch.setattr(cefmc.CeFMCClient, "handle", flaky)
    s = run(tmp_path, "flaky")
    # the run goes on without the client, but a client's code that raised is an error, not a fault
    assert s["status"] == "error" and s["metrics"]["acc"] > 0.9
    errs = s["faults"]["client_errors"]
    assert len(errs) == 1 and errs[0]["client"] == 4 and errs[0]["round"] == 2
    assert "FloatingPointError: boom" in errs[0]["error"] and "\n" not in errs[0]["error"]
    assert s["errors"] == ["client 4 protocol round 2: FloatingPointError: boom"]
    log = (Path(s["out_dir"]) / "errors.log").read_text()
    assert "Traceback" in log and "in flaky" in log and "FloatingPointError: boom" in log


def test_a_dropout_is_sent_but_never_acted_on(tmp_path, monkeypatch):
    """Dropout model: the server's message is sent and paid for, the client goes offline
    before acting on it (no delivery, no reply), and it is back the next round."""
    from raymvc.runtime.nodes import ClientNode

    delivered: list[tuple[int, int]] = []
    real = ClientNode.deliver

    def spy(self, frame):
        out = real(self, frame)
        delivered.append((self.cid, self.client.ctx.round))
        return out

    monkeypatch.setattr(ClientNode, "deliver", spy)
    s = run(tmp_path, "drop", "faults.drop=[{client: 2, at_round: 1}]")
    assert s["status"] == "degraded" and s["faults"]["dropped_replies"] == 1
    assert (2, 1) not in delivered and (2, 0) in delivered and (2, 2) in delivered
    ledger = read_ledger(s["out_dir"])
    down = [r for r in ledger if r["round"] == "1" and r["dst"] == "client:2"]
    assert [r["status"] for r in down] == ["dropped"]
    assert not [r for r in ledger if r["round"] == "1" and r["src"] == "client:2"]
    assert s["communication"]["wire_bytes"] == sum(int(r["wire_bytes"]) for r in ledger if r["path"] == "protocol")
    assert s["participation"][2] == {"addressed": s["rounds"], "replied": s["rounds"] - 1, "missed": 1,
                                     "last_replied": s["rounds"] - 1}
    rounds = [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]
    assert rounds[1]["dropped"] == [2] and rounds[2]["replied"] == list(range(6))


def test_server_knows_client_sizes(tmp_path, monkeypatch):
    """ServerContext.client_sizes carries each client's row count (public, as in FedAvg)."""
    from raymvc.protocols import kfed

    seen = {}
    real = kfed.KFedServer.__init__

    def spy(self, config, ctx):
        seen.update(ctx.client_sizes)
        real(self, config, ctx)

    monkeypatch.setattr(kfed.KFedServer, "__init__", spy)
    s = run(tmp_path, "sizes", "data.dirichlet_alpha=0.5", scenario=QUICK.parent / "digits-kfed.yaml")
    assert s["status"] == "completed"
    assert sum(seen.values()) == s["n_samples"] and len(seen) == s["n_clients"]
    assert seen == {int(c): n for c, n in enumerate(s["data_info"]["client_sizes"])}
    assert len(set(seen.values())) > 1  # Dirichlet sizes differ


def _echo(tmp_path, *, rounds: int, floats: int, n_clients: int, runtime: str) -> Path:
    """A FedAvg-echo scenario file (raymvc.bench.fedavg_echo) on digits, split horizontally."""
    path = tmp_path / "echo.yaml"
    path.write_text(f"method: raymvc.bench.fedavg_echo\nparams: {{rounds: {rounds}, floats: {floats}}}\n"
                    f"data: {{dataset: digits, partition: horizontal, n_clients: {n_clients}}}\n"
                    f"runtime: {{{runtime}}}\n")
    return path


def test_a_broadcast_is_encoded_once_and_metered_per_recipient(tmp_path, monkeypatch):
    from raymvc.channel import link

    kinds = []
    real = link.codec.encode

    def counting(msg, *a, **k):
        kinds.append(msg.kind)
        return real(msg, *a, **k)

    monkeypatch.setattr(link.codec, "encode", counting)
    echo = _echo(tmp_path, rounds=3, floats=64, n_clients=4, runtime="backend: local")
    s = run_scenario(load_scenario(echo), tmp_path / "out", progress=lambda line: None)
    assert s["status"] == "completed"
    assert kinds.count("model") == 3  # one encoding per round, not one per client
    assert kinds.count("update") == 3 * 4
    ledger = read_ledger(s["out_dir"])
    assert sum(r["kind"] == "model" for r in ledger) == 3 * 4  # still one metered frame per recipient
    assert s["communication"]["data_bytes"] == 3 * 4 * (2 * 64 * 8 + 8)  # the vector down and up, n up


class _FakeRay:
    """Just enough of ``ray`` for RayTransport: calls run at once, put returns a tagged reference."""

    class Ref:
        def __init__(self, value):
            self.value = value

    def __init__(self):
        self.puts = []

    def put(self, value):
        self.puts.append(value)
        return _FakeRay.Ref(value)

    def wait(self, refs, num_returns, timeout):
        return list(refs), []

    def get(self, ref):
        return ref.value


class _FakePool:
    def __init__(self, fake):
        self.calls = []
        pool = self

        class _Method:
            def remote(self, frames, deadline_s, *shared):
                assert deadline_s == 5.0  # the transport's reply_timeout_s, per client
                pool.calls.append((frames, shared))
                resolved = [r.value for r in shared]  # what Ray hands the actor: the bytes
                return _FakeRay.Ref({c: ("ok", bytes(resolved[b]) if isinstance(b, int) else b, None, 0.0)
                                     for c, (_, b) in frames.items()})

        self.deliver = _Method()


def test_ray_transport_puts_a_shared_body_once():
    fake = _FakeRay()
    pools = {p: _FakePool(fake) for p in range(3)}
    owner = {c: c // 2 for c in range(6)}  # two clients per pool
    t = transport.RayTransport.__new__(transport.RayTransport)
    t.ray, t.timeout_s, t.dead, t.shared_puts = fake, 5.0, set(), 0
    t.pools = transport.RayPools(handles=pools, owner=owner, sizes={p: 2 for p in pools})
    big, small = b"B" * transport.SHARE_MIN_BYTES, b"s" * 100
    own = {c: bytes([c]) * transport.SHARE_MIN_BYTES for c in range(6)}  # per-client (e.g. encrypted)
    frames = {c: (b"h%d" % c, big) for c in range(6)}
    out = t.exchange(frames)
    assert fake.puts == [big] and t.shared_puts == 1
    for p, pool in pools.items():
        ((parts, shared),) = pool.calls
        assert [r.value for r in shared] == [big] and all(b == 0 for _, b in parts.values())
        assert {c: h for c, (h, _) in parts.items()} == {c: b"h%d" % c for c in owner if owner[c] == p}
    assert {c: o.frame for c, o in out.items()} == {c: big for c in range(6)}
    for frames in ({c: (b"h", small) for c in range(6)}, {c: (b"h", own[c]) for c in range(6)},
                   {0: (b"h", big), 1: (b"h", big), 2: (b"h", own[2])}):  # small / not shared / one pool only
        fake.puts.clear()
        t.exchange(frames)
        assert fake.puts == []
    assert t.shared_puts == 1


def test_ray_shares_broadcast_bodies_with_the_same_results(ray_session, tmp_path):
    echo = _echo(tmp_path, rounds=3, floats=20000, n_clients=4, runtime="client_cpus: 0.25, clients_per_actor: 2")
    runs = {b: run_scenario(load_scenario(echo, [f"runtime.backend={b}"]), tmp_path / b, progress=lambda line: None)
            for b in ("local", "ray")}
    assert runs["ray"]["status"] == runs["local"]["status"] == "completed"
    assert runs["ray"]["placement"]["shared_bodies"] == 3  # 160 kB to two actors, three rounds
    assert runs["local"]["placement"]["shared_bodies"] == 0
    assert runs["ray"]["communication"] == runs["local"]["communication"]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("send_t", "arrive_t")} for r in rows]
    assert strip(read_ledger(runs["ray"]["out_dir"])) == strip(read_ledger(runs["local"]["out_dir"]))


def test_the_server_runs_fast_rounds_in_batches(tmp_path):
    from raymvc.driver.engine import _spawn, prepare

    echo = _echo(tmp_path, rounds=6, floats=8, n_clients=3, runtime="backend: local")
    sc = load_scenario(echo)
    ds, part = prepare(sc)
    server, _ = _spawn(sc, part, ds)
    server.connect()
    server.begin()
    assert [r.round for r in server.run_rounds(0.0, 100)] == [0]  # no time left: still one round
    assert [r.round for r in server.run_rounds(60.0, 2)] == [1, 2]  # at most max_rounds
    last = server.run_rounds(60.0, 100)  # ends with the round that finishes the run
    assert [r.round for r in last] == [3, 4, 5] and last[-1].done and not any(r.done for r in last[:-1])


def test_rounds_of_a_batch_reach_disk_when_a_later_round_raises(tmp_path, monkeypatch):
    """A round that raises inside a batch: the rounds before it are on disk, the run fails."""
    from raymvc.bench import fedavg_echo

    real = fedavg_echo.EchoServer._send
    sends = []

    def bad_at_round_3(self):
        out = real(self)
        sends.append(1)
        if len(sends) == 4:  # the messages of round 3 carry a string the codec cannot encode
            out = {c: Message("model", w=m["w"], note="\ud800") for c, m in out.items()}
        return out

    monkeypatch.setattr(fedavg_echo.EchoServer, "_send", bad_at_round_3)
    echo = _echo(tmp_path, rounds=6, floats=8, n_clients=3, runtime="backend: local")
    s = run_scenario(load_scenario(echo), tmp_path / "out", progress=lambda line: None)
    assert s["status"] == "error" and len(s["errors"]) == 1
    assert "Traceback" in (Path(s["out_dir"]) / "errors.log").read_text()
    lines = (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0, 1, 2]


def test_salvage_writes_the_rounds_the_driver_never_received():
    from raymvc.driver.engine import _Run
    from raymvc.runtime.records import RunEnd

    class Writer:
        def __init__(self):
            self.rounds = []

        def round(self, rec):
            self.rounds.append(rec["round"])

    run = _Run(None, None, None)
    run.call = lambda name, *args, **kw: RunEnd(status="running", unreported=[{"round": r} for r in (3, 4, 5)])
    run.last_round = 3  # round 3 reached the disk before the driver stopped waiting
    w = Writer()
    end = run.salvage("interrupted", "interrupted (SIGINT)", w)
    assert w.rounds == [4, 5] and end.status == "interrupted"


def test_ray_records_the_gpus_it_gave_each_actor(ray_session, tmp_path):
    echo = _echo(tmp_path, rounds=1, floats=10, n_clients=4, runtime="client_cpus: 0.25, clients_per_actor: 2")
    runs = {g: run_scenario(load_scenario(echo, ["runtime.backend=ray", f"runtime.client_gpus={g}"]), tmp_path / str(g),
                            progress=lambda line: None) for g in (0, 0.5)}
    assert runs[0.5]["status"] == runs[0]["status"] == "completed"
    with_gpu = runs[0.5]["placement"]["gpu_ids"]
    assert with_gpu["server"] == [] and sorted(with_gpu["clients"]) == [0, 1, 2, 3]
    assert all(len(ids) == 1 for ids in with_gpu["clients"].values())  # a share of one GPU per actor
    assert runs[0]["placement"]["gpu_ids"] == {"server": [], "clients": {c: [] for c in range(4)}}
    local = run_scenario(load_scenario(echo, ["runtime.backend=local"]), tmp_path / "local", progress=lambda line: None)
    assert local["placement"]["gpu_ids"] is None
