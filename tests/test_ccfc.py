"""Tests for CCFC: end to end on a tiny model, FedAvg renormalisation, the bytes on the
ledger, state dicts through the channel, determinism and disconnected clients."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest

from raymvc.channel.codec import data_bytes

torch = pytest.importorskip("torch")

import raymvc.protocols.ccfc as ccfc  # noqa: E402
from raymvc.channel import decode, encode  # noqa: E402
from raymvc.driver import prepare, run_scenario  # noqa: E402
from raymvc.messages import Message  # noqa: E402
from raymvc.protocol import ServerContext  # noqa: E402
from raymvc.runtime.nodes import ClientNode, ServerNode  # noqa: E402
from raymvc.runtime.spec import RunSpec  # noqa: E402
from raymvc.scenario import load_scenario, scenario_from_dict  # noqa: E402

# a model small enough for a test: one round on digits takes a few tens of milliseconds
TINY = {
    "warmup_rounds": 2,
    "cluster_rounds": 2,
    "batch_size": 64,
    "channels": [8, 16, 16],
    "proj_hidden": 16,
    "latent_dim": 8,
    "pred_dim": 4,
    "kmeans_init": 1,
    "server_kmeans_init": 2,
}
K = 10  # digits classes
N_CLIENTS = 5


def scenario(**over):
    raw = {
        "name": "test-ccfc",
        "method": "ccfc",
        "params": dict(TINY),
        "data": {"dataset": "digits", "partition": "horizontal", "n_clients": N_CLIENTS, "heterogeneity": 0.0},
        "runtime": {"backend": "local"},
        "seed": 0,
    }
    return scenario_from_dict(raw, values=over)


def run_nodes(sc):
    """Drive a ServerNode and ClientNodes in-process; returns (RunEnd, partition)."""
    ds, part = prepare(sc)
    spec = RunSpec.build(sc, part, ds)
    clients = {c: ClientNode(c, spec, part.shards[c]) for c in range(part.n_clients)}
    server = ServerNode(spec, clients)
    server.connect()
    server.begin()
    while not server.run_round().done:
        pass
    return server.finish(), part


def ledger_rows(out_dir) -> list[dict]:
    with open(Path(out_dir) / "messages.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["path"] == "protocol"]


def model_bytes(cfg) -> int:
    """Parameter and buffer count x 4 bytes (+ 8 per integer counter), from torch itself."""
    model = ccfc.CCFCModel(cfg)
    return sum(t.numel() * (4 if t.is_floating_point() else 8) for t in model.state_dict().values())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ccfc-run")
    return run_scenario(scenario(), out, progress=lambda line: None)


# --------------------------------------------------------------------------- end to end
def test_tiny_run_end_to_end(tiny_run):
    s = tiny_run
    assert s["status"] == "completed", s["error"]
    assert s["rounds"] == TINY["warmup_rounds"] + TINY["cluster_rounds"] + 1  # + the final broadcast
    assert s["unlabelled_samples"] == 0
    assert "kappa" in s["metrics"]  # whether training learns anything: test_training_lowers_the_loss
    assert s["communication_eval"]["messages"] == 2 * N_CLIENTS


# --------------------------------------------------------------------------- bytes
def test_mb_per_round_is_model_plus_centroids(tiny_run):
    cfg = ccfc.Config(**TINY)
    w = model_bytes(cfg)
    assert w == ccfc.model_payload_bytes(cfg)
    cent = K * cfg.latent_dim * 4  # k x latent float32
    last_warm = TINY["warmup_rounds"] - 1
    final = TINY["warmup_rounds"] + TINY["cluster_rounds"]
    # information bytes per message: weights (+ centroids) + scalars (n, loss: 8 each; phase as UTF-8)
    expected = {}
    for r in range(final + 1):
        if r < final:
            phase = "simsiam" if r < TINY["warmup_rounds"] else "cluster"
            down = w + len(phase) + 8 + (cent if phase == "cluster" else 0)  # + want_centroids (bool)
            up = w + 8 + 8 + (cent if r >= last_warm else 0)
        else:
            down, up = w + cent, 8  # final weights and centroids; the acknowledgement carries n
        expected[r] = (down, up)
    rows = ledger_rows(tiny_run["out_dir"])
    header = 120 * 64  # bound on the codec header: a short JSON line naming each field
    payload_per_round: dict[int, int] = {}
    data_per_round: dict[int, int] = {}
    for row in rows:
        r = int(row["round"])
        want = expected[r][0 if row["src"] == "server" else 1]
        payload = int(row["payload_bytes"])
        assert want <= payload <= want + header
        payload_per_round[r] = payload_per_round.get(r, 0) + payload
        if "data_bytes" in row:  # the ledger's header-free count, where it has one
            assert int(row["data_bytes"]) == want
            data_per_round[r] = data_per_round.get(r, 0) + int(row["data_bytes"])
    assert sorted(payload_per_round) == list(expected)
    for r, (down, up) in expected.items():
        model_and_centroids = N_CLIENTS * (down + up)  # every client: one message down, one up
        assert model_and_centroids <= payload_per_round[r] <= model_and_centroids + 2 * N_CLIENTS * header
        if data_per_round:
            assert data_per_round[r] == model_and_centroids


def test_message_data_bytes_exact():
    cfg = ccfc.Config(**TINY)
    srv = ccfc.CCFCServer(cfg, ServerContext(client_ids=[0, 1], n_clusters=K, seed=0))
    msg = srv.start()[0]
    assert data_bytes(msg) == model_bytes(cfg) + len("simsiam") + 8


# --------------------------------------------------------------------------- weights
@pytest.mark.parametrize("float_dtype", ["float64", "float32"])
def test_state_dict_round_trip_through_channel(float_dtype):
    cfg = ccfc.Config(**TINY)
    src = ccfc.build_model(cfg, seed=1)
    src.train()
    with torch.no_grad():  # non-trivial BN statistics and counters
        src(torch.randn(16, 1, 8, 8))
        src(torch.randn(16, 1, 8, 8))
    arrays = ccfc.state_to_arrays(src)
    assert all(k.startswith("w.") for k in arrays)
    msg = Message("update", {**arrays, "n": 16})
    back = decode(encode(msg, float_dtype))
    dst = ccfc.build_model(cfg, seed=2)
    ccfc.load_arrays(dst, ccfc.arrays_from_message(back))
    a, b = src.state_dict(), dst.state_dict()
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype
        assert torch.equal(a[name], b[name]), name
    assert int(b["encoder.backbone.0.1.num_batches_tracked"]) == 2


def test_load_arrays_rejects_mismatch():
    cfg = ccfc.Config(**TINY)
    arrays = ccfc.state_to_arrays(ccfc.build_model(cfg, 0))
    model = ccfc.build_model(cfg, 0)
    bad = dict(arrays)
    bad.pop(next(iter(bad)))
    with pytest.raises(ValueError):
        ccfc.load_arrays(model, {k[2:]: v for k, v in bad.items()})


def test_fedavg_renormalises_over_replying_clients():
    cfg = ccfc.Config(**TINY)
    srv = ccfc.CCFCServer(cfg, ServerContext(client_ids=[0, 1, 2], n_clusters=K, seed=0))
    srv.start()
    rng = np.random.default_rng(5)
    sizes = {0: 100, 2: 300}  # client 1 is missing
    states = {}
    for c in sizes:
        st = {}
        for name, ref in srv.weights.items():
            if ref.dtype.kind == "f":
                st[name] = rng.standard_normal(ref.shape).astype(np.float32)
            else:
                st[name] = np.asarray(7 if c == 0 else 11, dtype=ref.dtype).reshape(ref.shape)
        states[c] = st
    replies = {c: Message("update", {**states[c], "n": sizes[c], "loss": 0.0}) for c in sizes}
    out = srv.step(0, replies, {1})
    assert srv.info["aggregated"] == [0, 2]
    for name, ref in srv.weights.items():
        w0, w2 = states[0][name].astype(np.float64), states[2][name].astype(np.float64)
        want = 0.25 * w0 + 0.75 * w2  # 100 / 400 and 300 / 400: weights renormalised over {0, 2}
        if ref.dtype.kind == "f":
            assert ref.dtype == np.float32
            np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-6)
        else:
            assert int(ref) == 10  # round(0.25 * 7 + 0.75 * 11)
        # every client, the missing one included, receives the averaged model next round
        for c in (0, 1, 2):
            np.testing.assert_array_equal(out[c][name], ref)


def test_fedavg_no_replies_keeps_model():
    cfg = ccfc.Config(**TINY)
    srv = ccfc.CCFCServer(cfg, ServerContext(client_ids=[0, 1], n_clusters=K, seed=0))
    before = {k: v.copy() for k, v in srv.start()[0].arrays().items()}
    out = srv.step(0, {}, {0, 1})
    for name, v in before.items():
        np.testing.assert_array_equal(out[0][name], v)


def test_fedavg_function_weights():
    s = {0: {"a": np.array([1.0, 2.0], np.float32)}, 1: {"a": np.array([3.0, 6.0], np.float32)}}
    got = ccfc.fedavg(s, {0: 1, 1: 3})["a"]
    np.testing.assert_allclose(got, [2.5, 5.0])


# --------------------------------------------------------------------------- losses
def test_cluster_contrastive_loss_pairs():
    p = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    y = torch.tensor([0, 0, 1])
    # cluster 0: D_0 = -cos(p0, z1) = 0, D_1 = -cos(p1, z0) = -1 -> mean -0.5; cluster 1 has no pair
    assert float(ccfc.cluster_contrastive_loss(p, z, y)) == pytest.approx(-0.5)
    # with self-positives: rows 0 and 1 give -0.5 each, row 2 (alone) -1 -> (-0.5 + -1) / 2
    loss = ccfc.cluster_contrastive_loss(p, z, y, self_positive=True)
    assert float(loss) == pytest.approx((-0.5 + -1.0) / 2)


def test_augment_shapes_and_determinism():
    cfg = ccfc.Config(**TINY, rotate_deg=10.0, scale=0.1, cutout=2)
    x = torch.rand(6, 1, 16, 15)
    a = ccfc.augment(x, cfg, torch.Generator().manual_seed(3))
    b = ccfc.augment(x, cfg, torch.Generator().manual_seed(3))
    assert a.shape == x.shape
    assert torch.equal(a, b)
    assert not torch.equal(a, x)
    c = ccfc.augment(x, cfg, torch.Generator().manual_seed(4))
    assert not torch.equal(a, c)  # another stream, another batch


@pytest.mark.parametrize("change", [{"max_shift": 1}, {"rotate_deg": 15.0}, {"scale": 0.2}, {"cutout": 3},
                                    {"crop_scale": 0.5}])
def test_each_geometric_augmentation_changes_images_within_range(change):
    """Without noise every transform keeps pixels in [0, 1] (zero fill, interpolation, zeroed
    patch); each one alone changes the batch (a random shift may be zero for one image)."""
    off = {"max_shift": 0, "noise_std": 0.0, "rotate_deg": 0.0, "scale": 0.0, "cutout": 0}
    cfg = ccfc.Config(**{**TINY, **off, **change})
    x = 0.2 + 0.8 * torch.rand(8, 1, 16, 15)  # no zero pixel: a zeroed or shifted-in pixel shows
    a = ccfc.augment(x, cfg, torch.Generator().manual_seed(0))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0 + 1e-6
    assert sum(not torch.allclose(a[i], x[i]) for i in range(len(x))) >= len(x) // 2
    assert torch.equal(ccfc.augment(x, ccfc.Config(**{**TINY, **off}), torch.Generator().manual_seed(0)), x)


def test_random_resized_crop_zooms_in_and_keeps_defaults_unchanged():
    """A crop of at least ``crop_scale`` of the area, resized to the image: a centred bright square
    grows on average; with ``crop_scale: 1`` the augmentation draws exactly as before."""
    off = {"max_shift": 0, "noise_std": 0.0}
    x = torch.zeros(64, 1, 28, 28)
    x[:, :, 10:18, 10:18] = 1.0
    a = ccfc.augment(x, ccfc.Config(**{**TINY, **off, "crop_scale": 0.3}), torch.Generator().manual_seed(0))
    assert float(a.sum()) > 1.3 * float(x.sum())
    base = {**TINY, "rotate_deg": 10.0}
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(ccfc.augment(x, ccfc.Config(**base), g1), ccfc.augment(x, ccfc.Config(**base, crop_scale=1.0), g2))


def test_pool_grid_keeps_a_grid_of_the_last_map():
    """``pool_grid: g`` feeds the projector c3 x g x g features; the server, which never sees
    an image, builds the same weights as a client with 28x28 images."""
    cfg = ccfc.Config(**{**TINY, "pool_grid": 4})
    server = ccfc.build_model(cfg, 0)
    client = ccfc.build_model(cfg, 0, (28, 28))
    assert server.encoder.projector[0].weight.shape == (TINY["proj_hidden"], TINY["channels"][2] * 16)
    assert all(torch.equal(a, b) for a, b in zip(server.state_dict().values(), client.state_dict().values()))
    z, p = client(torch.rand(5, 1, 28, 28))
    assert z.shape == p.shape == (5, TINY["latent_dim"])
    assert ccfc.model_payload_bytes(cfg) > ccfc.model_payload_bytes(ccfc.Config(**TINY))


def test_group_norm_backbone_has_no_batch_statistics():
    """``norm: group``: the convolutions normalise each image by itself (no running statistics in
    the backbone, so nothing of a client's class mix travels in them); the weights still go
    through the message fields, and the payload shrinks by the dropped buffers."""
    cfg = ccfc.Config(**{**TINY, "norm": "group"})
    model = ccfc.build_model(cfg, 0)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.encoder.backbone.modules())
    assert sum(isinstance(m, torch.nn.GroupNorm) for m in model.encoder.backbone.modules()) == 3
    names = list(ccfc.state_to_arrays(model))
    assert not any(n.startswith("w.encoder.backbone") and "running" in n for n in names)
    assert ccfc.model_payload_bytes(cfg) == model_bytes(cfg) < model_bytes(ccfc.Config(**TINY))
    # one image's features do not depend on the rest of the batch, even in training mode
    model.encoder.backbone.train()
    x = torch.rand(6, 1, 8, 8)
    assert torch.allclose(model.encoder.backbone(x)[:1], model.encoder.backbone(x[:1]), atol=1e-6)
    # widths that 8 does not divide get gcd(8, width) groups instead of an error
    odd = ccfc.build_model(ccfc.Config(**{**TINY, "norm": "group", "channels": [12, 6, 20]}), 0)
    assert [m.num_groups for m in odd.encoder.backbone.modules() if isinstance(m, torch.nn.GroupNorm)] == [4, 2, 4]


@pytest.mark.parametrize("which", ["local", "global"])
def test_centroid_model_picks_the_embedding_of_the_local_centroids(which):
    """``centroid_model: global`` clusters the client's images in the space of the global model it
    received that round; ``local`` (the paper's) in that of the model it has just trained. The
    centroids must equal those of the chosen model's embedding."""
    server, clients, _ = _drive({"centroid_model": which, "warmup_rounds": 2, "cluster_rounds": 1})
    c = clients[0]
    step = 99  # any step: the k-means stream is keyed by it
    want_model = c.global_model if which == "global" else c.model
    Z = ccfc.embed(want_model, c.x).numpy().astype(np.float64)
    from raymvc.protocols._common import kmeans_capped

    want, _ = kmeans_capped(Z, K, c.ctx.rng_for("local_kmeans", step), c.config.kmeans_init)
    np.testing.assert_allclose(c._local_centroids(step), want.astype(np.float32), rtol=1e-5, atol=1e-6)
    other = c.model if which == "global" else c.global_model
    Zo = ccfc.embed(other, c.x).numpy()
    assert not np.allclose(Z, Zo, atol=1e-4)  # the two models differ after local training


def test_noise_augmentation_perturbs_every_pixel():
    cfg = ccfc.Config(**{**TINY, "max_shift": 0, "noise_std": 0.2})
    x = torch.rand(4, 1, 8, 8)
    a = ccfc.augment(x, cfg, torch.Generator().manual_seed(0))
    d = a - x
    assert bool((d != 0).all()) and 0.1 < float(d.std()) < 0.3


# --------------------------------------------------------------------------- in-process runs
def _drive(params, n_clients=2, rows=150, drop=lambda r: ()):
    """Clients and server on the first ``n_clients * rows`` digits, in process;
    ``drop(round)`` names the clients whose message is lost. Returns (server, clients, losses)."""
    from raymvc.data import load_dataset
    from raymvc.data.types import Shard
    from raymvc.protocol import ClientContext

    cfg = ccfc.Config(**{**TINY, **params})
    X = load_dataset("digits").views[0][: n_clients * rows]
    ids = list(range(n_clients))
    clients = {c: ccfc.CCFCClient(cfg, Shard(views=[X[c * rows:(c + 1) * rows]], meta={"image_shape": (8, 8)}),
                                  ClientContext(c, n_clients, K, 0)) for c in ids}
    server = ccfc.CCFCServer(cfg, ServerContext(ids, K, 0))
    out, r, infos = server.start(), 0, []
    while True:
        lost = set(drop(r)) & set(out)
        for c in clients.values():
            c.ctx.round = r
        res = server.step(r, {c: clients[c].handle(m) for c, m in out.items() if c not in lost}, lost)
        infos.append(dict(server.info))
        if not isinstance(res, dict):
            return server, clients, infos
        out, r = res, r + 1


def _eval_simsiam(cfg, weights, x):
    """SimSiam loss of a global model on fixed augmentations of ``x`` (eval mode)."""
    model = ccfc.build_model(cfg, 0)
    ccfc.load_arrays(model, {k[len("w."):]: v for k, v in weights.items()})
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        return float(ccfc.simsiam_loss(model, ccfc.augment(x, cfg, g), ccfc.augment(x, cfg, g)))


def test_training_lowers_the_loss():
    """A few FedAvg rounds of SimSiam on 300 digits: the clients' loss falls from round to
    round, and the global model does better than its random initialisation on held images."""
    params = {"warmup_rounds": 5, "cluster_rounds": 1, "local_epochs": 2, "lr": 3e-3}
    cfg = ccfc.Config(**{**TINY, **params})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float sums whichever test ran before (an in-process run sets 1)
    try:
        server, clients, infos = _drive(params)
    finally:
        torch.set_num_threads(threads)
    initial = ccfc.CCFCServer(cfg, ServerContext([0, 1], K, 0)).weights
    warm = [i["loss"] for i in infos[: params["warmup_rounds"]]]
    assert warm[-1] < warm[0] - 0.02
    from raymvc.data import load_dataset

    held = ccfc._as_images(load_dataset("digits").views[0][1000:1300], (8, 8))
    # trained: 0.049 at one thread, 0.032 at two; untrained 0.144
    assert _eval_simsiam(cfg, server.weights, held) < 0.5 * _eval_simsiam(cfg, initial, held)


def test_client_missing_round_0_rejoins_and_shapes_the_model():
    params = {"warmup_rounds": 1, "cluster_rounds": 1}
    server, clients, infos = _drive(params, drop=lambda r: {0} if r == 0 else ())
    assert infos[0]["aggregated"] == [1]
    assert infos[1]["aggregated"] == [0, 1]  # back with its next reply, centroids included
    once = server.weights
    gone, _, _ = _drive(params, drop=lambda r: {0})
    assert any(not np.array_equal(once[k], gone.weights[k]) for k in once)  # its data moved the model
    assert not np.array_equal(server.C, gone.C)
    assert len(clients[0].predict()) == 150


def test_no_centroids_after_warmup_delays_the_cluster_phase():
    """If no client answers the last warm-up round, the next round stays a SimSiam round."""
    server, clients, infos = _drive({"warmup_rounds": 1, "cluster_rounds": 2}, drop=lambda r: {0, 1} if r == 0 else ())
    assert infos[0]["aggregated"] == [] and server.C is not None
    assert all(len(c.predict()) == 150 for c in clients.values())


# --------------------------------------------------------------------------- determinism and faults
def test_same_seed_same_labels():
    sc = scenario(**{"params.warmup_rounds": 1, "params.cluster_rounds": 1})
    fin1, _ = run_nodes(sc)
    fin2, _ = run_nodes(sc)
    assert fin1.status == fin2.status == "finished"
    assert sorted(fin1.predictions) == list(range(N_CLIENTS))
    for c in fin1.predictions:
        np.testing.assert_array_equal(fin1.predictions[c], fin2.predictions[c])


def test_disconnected_clients(tmp_path):
    sc = scenario(**{"faults.disconnect.rate": 0.4, "params.warmup_rounds": 1, "params.cluster_rounds": 1})
    s = run_scenario(sc, tmp_path, progress=lambda line: None)
    gone = s["faults"]["disconnected_clients"]
    assert gone and s["status"] == "degraded"
    assert s["rounds"] == 3
    ds, part = prepare(sc)
    assert s["unlabelled_samples"] == sum(len(part.rows[c]) for c in gone)
    import json

    for line in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines():
        rec = json.loads(line)
        assert set(gone) <= set(rec["missing"])
        if "aggregated" in rec["info"]:
            assert rec["info"]["aggregated"] == rec["replied"]


# --------------------------------------------------------------------------- secure aggregation
SA_CLIENTS = 4  # threshold t = 3


def _leaks(received: list[Message], plain: list[dict]) -> list[str]:
    """Fields of received messages that hold a client's plain weight array (as float32 or float64 bytes)."""
    needles = []
    for arrays in plain:
        for a in arrays.values():
            if a.size >= 4:
                needles.append(np.asarray(a, np.float32).tobytes()[:32])
                needles.append(np.asarray(a, np.float64).tobytes()[:64])
    found = []
    for m in received:
        found += [f"{m.kind}.{k}" for k in m.fields if k.startswith(ccfc.W_PREFIX)]
        for name, arr in m.arrays().items():
            blob = np.ascontiguousarray(arr).tobytes()
            if any(nd in blob for nd in needles):
                found.append(f"{m.kind}.{name}")
    return found


def _spied_run(tmp, name, secure, drops=(), sub_drops=()):
    """An engine run (local backend, TINY, digits over SA_CLIENTS clients) with everything the
    server's endpoint opened, its weights after every change, its info per round and the
    clients' plain weights recorded. ``sub_drops``: (client, round, exchange) dropouts in the
    secure-aggregation exchanges (1: masked input, 2: unmasking)."""
    from raymvc.channel import Endpoint
    from raymvc.runtime.faults import FaultPlan

    rec = {"received": [], "sent": [], "weights": [], "infos": [], "plain": []}
    orig_step, orig_train, orig_open = ccfc.CCFCServer.step, ccfc.CCFCClient._train, Endpoint.open
    orig_dropped, orig_start = FaultPlan.dropped, ccfc.CCFCServer.start

    def start(self):
        out = orig_start(self)
        rec["sent"].append(out)
        return out

    def step(self, round, replies, missing):
        before = self.weights
        out = orig_step(self, round, replies, missing)
        if isinstance(out, dict):
            rec["sent"].append(out)
        if self.weights is not before:
            rec["weights"].append({k: np.array(v) for k, v in self.weights.items()})
        rec["infos"].append(dict(self.info))
        return out

    def train(self, msg):
        reply = orig_train(self, msg)
        rec["plain"].append({k: np.array(v) for k, v in reply.fields.items() if k.startswith(ccfc.W_PREFIX)})
        return reply

    def open_(self, frame, *args, **kw):
        opened = orig_open(self, frame, *args, **kw)
        if self.party == "server":
            rec["received"].append(opened.msg)
        return opened

    def dropped(self, r, client, sub=0):
        return (client, r, sub) in sub_drops or orig_dropped(self, r, client, sub)

    over = {"data.n_clients": SA_CLIENTS, "channel.secure_aggregation": secure}
    if drops:
        over["faults.drop"] = [{"client": c, "at_round": r} for c, r in drops]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ccfc.CCFCServer, "step", step)
        mp.setattr(ccfc.CCFCServer, "start", start)
        mp.setattr(ccfc.CCFCClient, "_train", train)
        mp.setattr(Endpoint, "open", open_)
        mp.setattr(FaultPlan, "dropped", dropped)
        s = run_scenario(scenario(**over), tmp / name, progress=lambda line: None)
    return s, rec


def _labels(summary) -> np.ndarray:
    with open(Path(summary["out_dir"]) / "labels.csv", newline="") as f:
        return np.array([int(r["cluster"]) for r in csv.DictReader(f)])


def _assert_same_weights(a: dict, b: dict, atol=1e-5):
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        if a[k].dtype.kind == "f":
            np.testing.assert_allclose(a[k], b[k], rtol=0, atol=atol, err_msg=k)
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def plain_and_secure(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ccfc-secagg")
    return _spied_run(tmp, "plain", False), _spied_run(tmp, "secure", True)


def test_secure_weights_equal_plain_fedavg_and_labels_agree(plain_and_secure):
    (plain, prec), (sec, srec) = plain_and_secure
    assert plain["status"] == sec["status"] == "completed", (plain["error"], sec["error"])
    steps = TINY["warmup_rounds"] + TINY["cluster_rounds"]
    assert plain["rounds"] == sec["rounds"] == steps + 1  # the layer's exchanges run inside the rounds
    assert len(prec["weights"]) == len(srec["weights"]) == steps
    for a, b in zip(srec["weights"], prec["weights"]):  # the same fixed-point sum: the same weights, bit for bit
        _assert_same_weights(a, b, atol=0)
    done = srec["infos"][:steps]
    assert [i["phase"] for i in done] == ["simsiam"] * TINY["warmup_rounds"] + ["cluster"] * TINY["cluster_rounds"]
    assert all(i["aggregated"] == list(range(SA_CLIENTS)) and "aggregation_failed" not in i for i in done)
    np.testing.assert_array_equal(_labels(sec), _labels(plain))


def test_secure_server_never_receives_plain_weights(plain_and_secure):
    (_, prec), (_, srec) = plain_and_secure
    steps = TINY["warmup_rounds"] + TINY["cluster_rounds"]
    assert len(srec["plain"]) == SA_CLIENTS * steps
    assert _leaks(srec["received"], srec["plain"]) == []
    masked = [m for m in srec["received"] if m.kind == "secagg.masked"]
    assert len(masked) == SA_CLIENTS * steps
    updates = [m for m in srec["received"] if m.kind == "update"]
    assert len(updates) == SA_CLIENTS * steps and all({"n", "loss"} <= set(m.fields) for m in updates)
    assert sum("centroids" in m for m in updates) == SA_CLIENTS * (TINY["cluster_rounds"] + 1)
    # the detector does find plain weights where they travel
    assert _leaks([Message("update", srec["plain"][0])], srec["plain"])
    assert _leaks(prec["received"], prec["plain"])


def test_secure_aggregation_is_metered_apart(plain_and_secure):
    (plain, _), (sec, _) = plain_and_secure
    assert plain["communication_secagg"]["messages"] == 0
    cs = sec["communication_secagg"]
    assert cs["messages"] > 0 and 0 < cs["wire_bytes"] < sec["communication"]["wire_bytes"]
    print(f"ccfc TINY over {SA_CLIENTS} clients: plain {plain['communication']['mb_total']} MB; "
          f"secure {sec['communication']['mb_total']} MB, of which the layer's exchanges {cs['mb_total']} MB")


def test_secure_drop_before_masked_input_aggregates_survivors(tmp_path):
    plain, prec = _spied_run(tmp_path, "p", False, drops=[(1, 0)])
    sec, srec = _spied_run(tmp_path, "s", True, sub_drops={(1, 0, 1)})
    assert sec["status"] == "degraded" and sec["faults"]["dropped_replies"] == 1 and not sec["errors"]
    done = srec["infos"]
    assert done[0]["aggregated"] == [0, 2, 3]
    _assert_same_weights(srec["weights"][0], prec["weights"][0])
    assert done[1]["aggregated"] == list(range(SA_CLIENTS))  # back at once, with a fresh mask key
    assert sec["unlabelled_samples"] == 0


def test_secure_failed_aggregation_keeps_the_weights(tmp_path):
    sec, srec = _spied_run(tmp_path, "f", True, sub_drops={(1, 0, 1), (2, 0, 1)})  # 2 masked inputs, t = 3
    done = srec["infos"]
    assert done[0]["aggregated"] == [] and "threshold" in done[0]["aggregation_failed"]
    assert done[1]["aggregated"] == list(range(SA_CLIENTS))  # nobody's key was exposed: all back
    trains = [out[0] for out in srec["sent"] if out[0].kind == "train"]
    round0, round1 = trains[0], trains[1]
    for k, v in round0.arrays().items():  # round 1 trains from round 0's weights again
        if k.startswith(ccfc.W_PREFIX):
            np.testing.assert_array_equal(round1[k], v)
    assert len(srec["weights"]) == len(done) - 2  # no change in round 0, none in the final round
    assert sec["status"] == "degraded" and sec["unlabelled_samples"] == 0 and not sec["errors"]


# --------------------------------------------------------------------------- MNIST scenario files
REPO = Path(__file__).resolve().parents[1]
MNIST = REPO.parent / "shared" / "data" / "mnist10k" / "mnist10k.npz"


@pytest.mark.parametrize("method", ["ccfc", "kfed"])
def test_mnist_scenarios_prepare_on_a_stand_in_file(tmp_path, method):
    """The MNIST scenario files validate and split a stand-in file of 28x28 rows (the real one
    is not needed): 10 clients, every shard tagged 28x28, CCFC clients build images from it."""
    f = tmp_path / "stand-in.npz"
    r = np.random.default_rng(0)
    np.savez(f, X=r.integers(0, 256, (100, 784), dtype=np.uint8), Y=np.arange(100) % 10)
    sc = load_scenario(REPO / "scenarios" / f"mnist-{method}.yaml", [f"data.path={f}", "data.heterogeneity=0.5"])
    assert sc.method == method and sc.data.image_shape == (28, 28)
    ds, part = prepare(sc)
    assert part.n_clients == 10 and all(s.meta["image_shape"] == (28, 28) for s in part.shards)
    if method == "ccfc":
        from raymvc.protocol import ClientContext

        client = ccfc.CCFCClient(sc.protocol_config(), part.shards[0], ClientContext(0, 10, 10, 0))
        assert tuple(client.x.shape) == (10, 1, 28, 28)


@pytest.mark.skipif(not MNIST.is_file(), reason="MNIST-10k not in the shared data folder")
def test_mnist_scenarios_name_the_fetched_data_set():
    """The shipped MNIST scenarios read the fetched data set (here from the shared folder as a mirror)."""
    from raymvc.data.fetch import npz_digest

    for method in ("ccfc", "kfed"):
        sc = load_scenario(REPO / "scenarios" / f"mnist-{method}.yaml")
        assert sc.data.dataset == "mnist10k" and sc.data.path is None
    ds, _ = prepare(load_scenario(REPO / "scenarios" / "mnist-kfed.yaml"))
    assert ds.name == "mnist10k" and ds.views[0].shape == (10000, 784)
    assert npz_digest(MNIST) == npz_digest(next(Path(os.environ["RAYMVC_DATA"]).glob("mnist10k/mnist10k.npz")))


def _centroid_replies(centres: dict[int, np.ndarray]) -> dict[int, Message]:
    return {c: Message("update", centroids=v.astype(np.float32), n=len(v)) for c, v in centres.items()}


def _covers(C: np.ndarray, truth: np.ndarray) -> bool:
    """Every true centre has a row of ``C`` pointing its way."""
    return bool(((truth / np.linalg.norm(truth, axis=1, keepdims=True)) @ C.T).max(axis=1).min() > 0.99)


def test_stable_ids_keep_each_global_clusters_index_from_round_to_round():
    """``stable_ids``: each round's global centroids are matched to the last round's, so a
    client holding older centroids labels with the same indices; without it the server's
    fresh k-means may number the same clusters otherwise (it does here, at these seeds)."""
    truth = np.random.default_rng(3).standard_normal((K, 16))
    local = {0: truth[:5] + 0.01, 1: truth[5:] - 0.01}
    C = {}
    for stable in (False, True):
        srv = ccfc.CCFCServer(ccfc.Config(**TINY, stable_ids=stable), ServerContext(client_ids=[0, 1], n_clusters=K, seed=0))
        rounds = []
        for step in range(4):
            srv._global_centroids(_centroid_replies(local), step)
            rounds.append(srv.C.copy())
        C[stable] = rounds
    assert any(not np.allclose(C[False][0], r, atol=1e-3) for r in C[False][1:])  # renumbered without it
    assert all(np.allclose(C[True][0], r, atol=1e-3) for r in C[True][1:])  # the same numbering with it
    assert all(_covers(r, truth) for r in C[True])


def test_centroids_from_latest_keeps_an_absent_clients_clusters_for_a_while():
    """``centroids_from: latest``: the k-means runs over every client's last local centroids
    while they are at most ``centroid_max_age`` rounds old; the paper's ``round`` uses only
    the round's replies, so clusters only an absent client holds are lost."""
    truth = np.random.default_rng(4).standard_normal((K, 16))
    local = {0: truth[:5], 1: truth[5:]}
    got = {}
    for how in ("round", "latest"):
        srv = ccfc.CCFCServer(ccfc.Config(**TINY, centroids_from=how, centroid_max_age=2),
                              ServerContext(client_ids=[0, 1], n_clusters=K, seed=0))
        srv._global_centroids(_centroid_replies(local), 0)
        got[how] = [_covers(srv.C, truth)]
        for step in (1, 2, 3):  # client 1 is absent from now on
            srv._global_centroids(_centroid_replies({0: local[0]}), step)
            got[how].append(_covers(srv.C, truth))
    assert got["round"] == [True, False, False, False]
    assert got["latest"] == [True, True, True, False]  # kept at ages 1 and 2, dropped at 3
