"""CCFC: cluster-contrastive federated clustering (torch, CPU).

Horizontal setting: client ``l`` holds ``n_l`` images (rows of one view, reshaped with
``shard.meta["image_shape"]``) of ``k`` classes; the server sees models and centroids only.

Model
-----
Encoder ``f`` = small CNN backbone (three 3x3 convolutions, widths ``channels``, with
BatchNorm -- or, with ``norm: group``, GroupNorm in gcd(8, width) groups -- and
LeakyReLU; the second and third have stride 2, the first stride 1 on 8x8 digits and 2
on larger images such as the 16x15 pixel view; then average pooling to a
``pool_grid`` x ``pool_grid`` grid, flattened: 1 = global pooling) + 2-layer MLP projector
whose last BatchNorm has no affine parameters; predictor ``h`` = 2-layer bottleneck MLP
(``latent -> pred_dim -> latent``). Images are scaled to [0, 1] per image. Augmentations
(torch, CPU): random shifts of up to ``max_shift`` pixels with zero fill, Gaussian noise
``noise_std``; optional small rotation/zoom, random resized crop (``crop_scale``: a crop
of a random ``[crop_scale, 1]`` fraction of the area, aspect ratio in ``[1/crop_ratio,
crop_ratio]``, resized to the image by bilinear sampling, drawn together with the
rotation) and cutout. Defaults (``pool_grid: 1``, ``crop_scale: 1``) build the same model
and draw the same augmentations as before these options existed.

Rounds
------
Every round the server sends the global weights ``w_g = (f_g, h_g)`` to every client
(``"w.<state dict name>"`` arrays: parameters, BatchNorm running statistics and
``num_batches_tracked``), plus the ``k`` global centroids in the cluster phase. A client
loads them, trains one copy for ``local_epochs`` epochs with Adam and replies with its
weights (the same ``"w.*"`` arrays), its sample count ``n`` and, when the server asks for
them, its ``k`` local centroids.

* warm-up (``warmup_rounds``): SimSiam -- two augmentations of every image, loss
  ``1/2 [D(p1, sg z2) + D(p2, sg z1)]`` with ``D(p, z) = -cos(p, z)``.
* cluster phase (``cluster_rounds``): the client labels its images by the nearest
  global centroid (cosine similarity of L2-normalised projector outputs of the frozen
  global model, Eq. 3), then minimises the cluster-contrastive loss (Eq. 2: for every
  pseudo-cluster with at least two members in a batch, the mean over pairs ``i != j``
  of ``-cos(p_i, sg z_j)``; averaged over the clusters of the batch) plus ``λ`` times
  the model-contrastive term ``-cos(p_i^local, sg p_i^global)`` (Eq. 4-7) with the
  global model frozen. ``cluster_views: 1`` (default) is the paper's form, one
  augmentation per image; with ``cluster_views: 2`` every image gets two augmentations
  and the loss is symmetrised, ``1/2 [L(p1, sg z2) + L(p2, sg z1)]``, pairs still ``i != j``.
* after local training in the last warm-up round and in every cluster round, the
  client embeds its images with its trained local model (``centroid_model: local``, the
  paper's; ``global``: with the global model it received that round, i.e. the previous
  aggregation, so that round's local training does not move them) and runs k-means
  (``k`` clusters on L2-normalised outputs) -> ``k`` local centroids.

Server: ``w_g = Σ_l (n_l / Σ n) w_l`` over the clients that replied in the round (the
weights are renormalised over them; ``num_batches_tracked`` is averaged and rounded);
global centroids = k-means (``k``) over all received local centroids, L2-normalised.
The phase schedule counts training steps (one per FedAvg of the weights); without
secure aggregation a training step is an engine round.

After the last round the server sends the final global weights and centroids
(``"final"``); every client keeps them and acknowledges. Final labels: each client
labels its own images by the nearest global centroid in the latent space of the global
encoder, in ``predict()``, which the engine calls on the evaluation path only.

Missing replies and disconnected clients
----------------------------------------
Clients that do not reply in a round (dropped, late, crashed, disconnected) take no
part in that round's average or centroid k-means; when no client replies, the global
model and centroids stay as they were. Every connected client is addressed every round
with the full global model, so a client that missed a round rejoins with its next
reply: its weights enter that round's average and, from the last warm-up round on, its
local centroids the global k-means. Should no client deliver centroids in the last
warm-up round, the cluster phase waits: rounds stay SimSiam rounds (still asking for
centroids) until the server holds global centroids. A client that never receives any
global centroids cannot label its samples (they stay unlabelled); a client that missed
only the final message labels with the last global model and centroids it received.

Asynchronous rounds
-------------------
Under ``faults.asynchronous`` (buffered steps on the virtual clock, a project setting; the
paper's rounds are synchronous) a training step takes the first ``buffer`` updates to
arrive, each trained on the weights of the step ``tau`` steps earlier that its client was
sent. The step is FedBuff's: ``w <- w + sum_l n_l s(tau_l) (w_l - w^(step - tau_l)) / sum_l
n_l`` with ``s(tau) = 1/sqrt(1 + tau)`` (``staleness: constant``: 1), which is FedAvg of the
buffer when every tau is 0; the BatchNorm statistics step with the weights (a running
variance stepped below zero is set to zero); the global centroids are k-means over the
centroids in the buffer. The phase schedule still counts steps, so a run with a buffer of ``B`` of ``L``
clients trains on about ``B / L`` of the updates a synchronous run of as many rounds does.

Secure aggregation
------------------
The ``"w.*"`` fields of ``update`` are declared a weighted sum with weight ``n``
(``Protocol.secure_sums``); the server reads them with ``weighted_sum``. With
``channel.secure_aggregation: true`` the engine masks them (``raymvc.runtime.secure``)
and the server learns ``Σ n_l w_l`` and ``Σ n_l`` over the clients whose masked input
arrived, never one client's weights; ``n``, ``loss`` and ``centroids`` still travel in
the clear. The sum is taken in fixed point (24 fractional bits in Z_{2^64},
``raymvc.fixedpoint``) with or without the layer, so a run gives the same weights, bit
for bit, either way; BatchNorm counters (``num_batches_tracked``) are integers and exact. A client whose input is not in the sum
(it dropped out of a sub-exchange, or the aggregation fell below its threshold) is a
missing reply. The server still sees the global model it sends, every client's local
centroids, its loss and ``n_l``, who took part, and the sum (``docs/threat-model.md``).

Departures from the paper (each a named option where it changes the algorithm; the
defaults are the paper's choices where it states them): ``norm: group`` (GroupNorm in
the convolutions instead of BatchNorm) and ``centroid_model: global`` (local centroids
from the global model a client received, not its freshly trained one) carry label-skewed
splits and are set in ``scenarios/mnist-ccfc.yaml``; ``cluster_views: 2`` symmetrises the
cluster-contrastive loss over two augmentations; ``pool_grid`` keeps a small spatial map
before the projector instead of global pooling. The paper states per data set λ and the
latent size (1e-3 and 256 on MNIST, the defaults here) and names Adam as the optimiser;
it does not give Adam's learning rate, the batch size or the local epochs (1e-3, 128 and
one here, the method spec's values), nor the backbone widths for MNIST-sized images, the
augmentations, the round counts or the k-means restarts: the widths, augmentations and
rounds here are sized for two CPU cores, k-means takes the best of ``kmeans_init``
starts on a client and ``server_kmeans_init`` on the server. ``raymvc params ccfc`` marks
each value. Why each project choice was made (labels used only to score):
``benchmarks/ccfc_tuning.md``; the departures with their measured effect:
``studies/ccfc.md``.

Communication per round and client: the model (``4 x`` the number of float parameters
and buffer entries, plus ``8`` bytes per ``num_batches_tracked``) down and up, plus
``k x latent x 4`` bytes of centroids down in the cluster phase and up whenever they are
asked for (:func:`model_payload_bytes`). With secure aggregation the masked upload
carries ``8`` bytes per entry (plus one for ``n``) instead of ``4``, and the layer's
exchanges add keys and share ciphertexts (reported apart in the summary).

Determinism: the server draws the initial weights from its seeded generator; each
client draws a torch seed from ``ctx.rng_for("train", step)``, its stream for that round (shuffling and
augmentations use a ``torch.Generator``); deterministic algorithms are switched on
during every call and restored afterwards. The engine fixes thread counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field

from raymvc.messages import Done, Message
from raymvc.protocol import (
    Client,
    ClientContext,
    NoInput,
    Protocol,
    ProtocolConfig,
    SecureSum,
    Server,
    ServerContext,
    not_stated,
    paper,
    project_option,
    seed_from,
    weighted_sum,
)

from . import _torch
from ._common import kmeans_capped, normalise_rows
from ._torch import W_PREFIX, Linear, arrays_from_message, fedavg, mm, seeded, state_to_arrays

__all__ = ["W_PREFIX", "UPDATE", "arrays_from_message", "fedavg", "load_arrays", "state_to_arrays"]

# the model weights of an update: the server needs only their n-weighted sum
UPDATE = SecureSum("update", (W_PREFIX + "*",), weight="n", weight_is_rows=True)


class Config(ProtocolConfig):
    warmup_rounds: int = Field(default=100, ge=1, description="SimSiam rounds before the cluster phase",
                               **not_stated("100 SimSiam rounds, sized for two CPU cores: the warm-up is how the "
                                            "global model and centroids are initialised (Alg. 1, line 1), which the "
                                            "paper leaves open (the method's spec: the authors warm up with SimSiam)"))
    cluster_rounds: int = Field(default=100, ge=1, description="cluster-contrastive rounds",
                                **not_stated("100, sized for two CPU cores: Alg. 1's round count t is not given"))
    local_epochs: int = Field(default=1, ge=1, description="passes over its images a client trains per round",
                              **not_stated("1 pass a round, the method's spec's; the paper gives no local epoch "
                                           "count"))
    batch_size: int = Field(default=128, ge=2, description="images per training step",
                            **not_stated("128, the method's spec's; the paper gives no batch size"))
    lr: float = Field(default=1e-3, gt=0.0, description="Adam learning rate (the paper names Adam, not its rate)",
                      **not_stated("1e-3, Adam's usual step and the method's spec's: the paper names Adam only "
                                   "(Sec. 4.1); on digits 3e-3 scores higher (studies/ccfc.md)"))
    weight_decay: float = Field(default=0.0, ge=0.0, description="Adam's L2 weight decay",
                                **not_stated("0, plain Adam; the paper mentions no weight decay"))
    lam: float = Field(default=1e-3, ge=0.0, alias="lambda",
                       description="λ, weight of the model-contrastive term (the paper's MNIST value)",
                       **paper("Sec. 4.1 (λ = 0.001 on MNIST)", value=1e-3))
    channels: tuple[int, int, int] = Field(default=(32, 64, 128), description="conv widths of the backbone",
                                           **not_stated("three convolutions as the paper's MNIST encoder "
                                                        "(Sec. 4.1), which gives no widths; 32/64/128 sized for "
                                                        "two CPU cores"))
    first_stride: int | None = Field(default=None, ge=1, le=2,
                                     description="stride of the first conv (default: 1 for images up to 8 pixels a side, else 2)",
                                     **not_stated("by image size: 1 on 8x8 digits, so three convolutions still "
                                                  "leave a map, 2 on larger images; the paper gives no strides"))
    pool_grid: int = Field(default=1, ge=1, le=8,
                           description="average-pool the last map to a g x g grid, flattened (1 = global pooling)",
                           **project_option("1 is global average pooling, the usual end of a conv backbone; "
                                            "larger grids are the project's"))
    proj_hidden: int = Field(default=128, ge=1, description="width of the projector's hidden layer",
                             **not_stated("128: the paper's projector has two fully connected layers (Sec. 4.1), "
                                          "of no stated width"))
    latent_dim: int = Field(default=256, ge=2,
                            description="dimension of the embedding that is clustered (the paper's MNIST value)",
                            **paper("Sec. 4.1 (256 on MNIST)", value=256))
    pred_dim: int = Field(default=16, ge=1, description="predictor bottleneck",
                          **not_stated("16: the paper's predictor has two fully connected layers (Sec. 4.1); the "
                                       "bottleneck is the method spec's (the authors: 256 -> 16 -> 256)"))
    max_shift: int = Field(default=1, ge=0, description="random shift of up to this many pixels (augmentation)",
                           **not_stated("1 pixel: the paper names no augmentation; small shifts and noise suit "
                                        "8x8 digits"))
    noise_std: float = Field(default=0.2, ge=0.0, description="Gaussian pixel noise (images in [0, 1])",
                             **not_stated("0.2: the paper names no augmentation (see max_shift)"))
    rotate_deg: float = Field(default=0.0, ge=0.0, description="random rotation of up to this many degrees",
                              **project_option("off"))
    scale: float = Field(default=0.0, ge=0.0, lt=1.0, description="random zoom by a factor in [1 - scale, 1 + scale]",
                         **project_option("off"))
    crop_scale: float = Field(default=1.0, gt=0.0, le=1.0,
                              description="random resized crop: area fraction drawn from [crop_scale, 1] (1 = off)",
                              **project_option("off"))
    crop_ratio: float = Field(default=4 / 3, ge=1.0, description="crop aspect ratio drawn log-uniformly from [1/r, r]",
                              **project_option("used only with crop_scale < 1; 4/3 as torchvision's resized crop"))
    cutout: int = Field(default=0, ge=0, description="side of a random square patch set to zero (0 = off)",
                        **project_option("off"))
    cluster_views: int = Field(default=1, ge=1, le=2,
                               description="augmented views per image in the cluster phase (1: the paper's form)",
                               **paper("Sec. 3.1, Eq. 2 (one path per image of the cluster)", value=1))
    self_positive: bool = Field(default=False, description="with 2 views, an image's other view is a positive too",
                                **project_option())
    cluster_augment: bool = Field(default=True, description="augment images in the cluster phase too",
                                  **not_stated("on: the paper does not say whether the cluster phase augments; "
                                               "SimSiam, its base (Sec. 3.1), does"))
    kmeans_init: int = Field(default=3, ge=1, description="k-means restarts on the clients",
                             **not_stated("best of 3 starts, for time: Alg. 1, line 11 runs KM without saying how "
                                          "many starts"))
    server_kmeans_init: int = Field(default=10, ge=1, description="k-means restarts on the server",
                                    **not_stated("10 starts, scikit-learn's usual number: Alg. 1, line 19 does not "
                                                 "say"))
    weighted_centroids: bool = Field(default=False, description="weight local centroids by cluster size on the server",
                                     **paper("Alg. 1, line 19 (KM over the local centroids, unweighted)", value=False))
    centroids_from: Literal["round", "latest"] = Field(
        default="round", description="local centroids the server's k-means runs over: the round's replies (the "
                                     "paper), or every client's latest, an absent client's kept from its last reply "
                                     "for at most centroid_max_age rounds (a remedy for dropouts)",
        **project_option("round (Alg. 1, line 19: the centroids received)"))
    stable_ids: bool = Field(
        default=False, description="keep each global cluster's index from round to round (each round's centroids "
                                   "matched to the last round's, Hungarian on cosine similarity), so clients that "
                                   "missed the latest rounds label with the same indices (a remedy for dropouts)",
        **project_option("off: Alg. 1, line 19 runs KM afresh each round"))
    centroid_max_age: int = Field(default=5, ge=1, description="with centroids_from: latest, the oldest kept "
                                                              "centroids, in rounds", **project_option())
    staleness: Literal["sqrt", "constant"] = Field(
        default="sqrt", description="under faults.asynchronous, the weight of an update trained on a model tau "
                                    "steps old: sqrt = 1/sqrt(1 + tau), constant = 1",
        **project_option("the paper's rounds are synchronous; sqrt is FedBuff's polynomial staleness weight"))
    deterministic: bool = Field(default=True, description="torch.use_deterministic_algorithms during every call",
                                **project_option("on, so a run repeats bit for bit"))
    norm: Literal["batch", "group"] = Field(default="batch", description="normalisation in the conv backbone",
                                            **not_stated("BatchNorm, as SimSiam and the authors' encoder (the "
                                                         "method's spec); the paper names no normalisation"))
    centroid_model: Literal["local", "global"] = Field(
        default="local", description="model that embeds a client's images for its local centroids",
        **paper("Sec. 3.2 and Alg. 1, line 11 (each client's trained local model)", value="local"))
    device: Literal["cpu", "cuda", "auto"] = Field(
        default="cpu", description="where clients train (auto: CUDA in process if torch sees one; in a Ray actor "
                                   "only if Ray gave it a GPU)", **project_option())


# ---------------------------------------------------------------------------
# model
def _conv(cin: int, cout: int, stride: int, norm: str = "batch") -> nn.Sequential:
    layer = nn.BatchNorm2d(cout) if norm == "batch" else nn.GroupNorm(math.gcd(8, cout), cout)
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), layer, nn.LeakyReLU(0.1))


class Encoder(nn.Module):
    """Backbone (3 conv layers + global average pooling) and 2-layer MLP projector."""

    def __init__(self, cfg: Config, image_shape: tuple[int, int] = (8, 8)):
        super().__init__()
        c1, c2, c3 = cfg.channels
        s1 = cfg.first_stride or (1 if min(image_shape) <= 8 else 2)
        self.backbone = nn.Sequential(_conv(1, c1, s1, cfg.norm), _conv(c1, c2, 2, cfg.norm), _conv(c2, c3, 2, cfg.norm),
                                      nn.AdaptiveAvgPool2d(cfg.pool_grid), nn.Flatten())
        self.projector = nn.Sequential(
            Linear(c3 * cfg.pool_grid ** 2, cfg.proj_hidden, bias=False), nn.BatchNorm1d(cfg.proj_hidden), nn.ReLU(),
            Linear(cfg.proj_hidden, cfg.latent_dim, bias=False), nn.BatchNorm1d(cfg.latent_dim, affine=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.projector[0].weight.device)  # images stay on the CPU (augmentation); the model may not
        return self.projector(self.backbone(x))


class Predictor(nn.Module):
    """2-layer bottleneck MLP: latent -> pred_dim -> latent."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.net = nn.Sequential(Linear(cfg.latent_dim, cfg.pred_dim, bias=False), nn.BatchNorm1d(cfg.pred_dim),
                                 nn.ReLU(), Linear(cfg.pred_dim, cfg.latent_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class CCFCModel(nn.Module):
    def __init__(self, cfg: Config, image_shape: tuple[int, int] = (8, 8)):
        super().__init__()
        self.encoder = Encoder(cfg, image_shape)
        self.predictor = Predictor(cfg)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder(x)
        return z, self.predictor(z)


def build_model(cfg: Config, seed: int, image_shape: tuple[int, int] = (8, 8)) -> CCFCModel:
    """A fresh model whose initial weights depend only on ``seed`` (global RNG untouched).

    The image shape only sets the first stride; the weights' names and shapes do not
    depend on it, so the server (which never sees an image) builds the same state dict.
    """
    return seeded(lambda: CCFCModel(cfg, image_shape), seed)


# ---------------------------------------------------------------------------
# weights <-> message fields: shared torch plumbing (protocols/_torch.py)
def load_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Copy received arrays into ``model``; names, shapes must match the model exactly."""
    _torch.load_arrays(model, arrays, who="ccfc")


def model_payload_bytes(cfg: Config) -> int:
    """Bytes of the ``"w.*"`` fields of one message (float32 entries x 4 + int64 x 8).

    The backbone ends in global average pooling, so the size does not depend on the image shape.
    """
    model = build_model(cfg, 0)
    return sum(int(a.nbytes) for a in state_to_arrays(model).values())


# ---------------------------------------------------------------------------
# augmentation and losses
def _as_images(X: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    """Rows -> (n, 1, H, W) float32 images scaled to [0, 1] per image."""
    X = np.asarray(X, dtype=np.float64)
    lo = X.min(axis=1, keepdims=True)
    span = X.max(axis=1, keepdims=True) - lo
    X = (X - lo) / np.where(span > 0, span, 1.0)
    return torch.from_numpy(X.astype(np.float32)).reshape(-1, 1, *shape)


def augment(x: torch.Tensor, cfg: Config, g: torch.Generator) -> torch.Tensor:
    """Random integer shifts (zero fill), optional small rotation / zoom, cutout, Gaussian noise."""
    B, C, H, W = x.shape
    s = cfg.max_shift
    if s > 0:
        pad = F.pad(x, (s, s, s, s))
        dy = torch.randint(0, 2 * s + 1, (B,), generator=g)
        dx = torch.randint(0, 2 * s + 1, (B,), generator=g)
        rows = (dy[:, None] + torch.arange(H))[:, :, None]  # B x H x 1
        cols = (dx[:, None] + torch.arange(W))[:, None, :]  # B x 1 x W
        x = pad[torch.arange(B)[:, None, None], 0, rows, cols].unsqueeze(1)
    if cfg.rotate_deg > 0 or cfg.scale > 0 or cfg.crop_scale < 1:
        ang = (torch.rand(B, generator=g) * 2 - 1) * math.radians(cfg.rotate_deg)
        zoom = 1.0 + (torch.rand(B, generator=g) * 2 - 1) * cfg.scale
        cos, sin = torch.cos(ang) / zoom, torch.sin(ang) / zoom
        theta = torch.zeros(B, 2, 3)
        theta[:, 0, 0], theta[:, 0, 1], theta[:, 1, 0], theta[:, 1, 1] = cos, -sin * H / W, sin * W / H, cos
        if cfg.crop_scale < 1:  # a crop of (w, h), in fractions of the image, at a random place, resized to H x W
            area = cfg.crop_scale + torch.rand(B, generator=g) * (1 - cfg.crop_scale)
            ratio = torch.exp((torch.rand(B, generator=g) * 2 - 1) * math.log(cfg.crop_ratio))
            w = torch.sqrt(area * ratio).clamp(max=1.0)
            h = torch.sqrt(area / ratio).clamp(max=1.0)
            theta[:, 0, :2] *= w[:, None]
            theta[:, 1, :2] *= h[:, None]
            theta[:, 0, 2] = (torch.rand(B, generator=g) * 2 - 1) * (1 - w)
            theta[:, 1, 2] = (torch.rand(B, generator=g) * 2 - 1) * (1 - h)
        grid = _torch.affine_grid(theta, H, W)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    if cfg.cutout > 0:
        c = min(cfg.cutout, H, W)
        top = torch.randint(0, H - c + 1, (B,), generator=g)
        left = torch.randint(0, W - c + 1, (B,), generator=g)
        r = torch.arange(H)[None, :, None]
        q = torch.arange(W)[None, None, :]
        hole = ((r >= top[:, None, None]) & (r < top[:, None, None] + c)
                & (q >= left[:, None, None]) & (q < left[:, None, None] + c))
        x = x * (~hole).unsqueeze(1).to(x.dtype)
    if cfg.noise_std > 0:
        x = x + cfg.noise_std * torch.randn(x.shape, generator=g)
    return x


def _neg_cos(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return -(F.normalize(p, dim=1) * F.normalize(z.detach(), dim=1)).sum(dim=1)


def simsiam_loss(model: CCFCModel, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    z1, p1 = model(x1)
    z2, p2 = model(x2)
    return 0.5 * (_neg_cos(p1, z2).mean() + _neg_cos(p2, z1).mean())


def _cluster_weights(y: torch.Tensor) -> torch.Tensor:
    """Per-sample weight 1 / (K_b n_c): the mean over samples of a cluster, then over clusters."""
    _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
    return 1.0 / (counts[inv].float() * len(counts))


def cluster_contrastive_loss(p: torch.Tensor, z: torch.Tensor, y: torch.Tensor,
                             self_positive: bool = False) -> torch.Tensor:
    """Eq. (1)-(2) on one batch: the mean over pairs ``(i, j)`` of one pseudo-cluster of
    ``-cos(p_i, sg z_j)``, ``j != i`` (``self_positive``: ``j = i`` counts too, for ``p`` and
    ``z`` from two augmentations of the batch), averaged over the batch's samples of a
    cluster and then over its clusters; samples without a positive are left out.
    """
    P = F.normalize(p, dim=1)
    Z = F.normalize(z.detach(), dim=1)
    y = y.to(p.device)
    same = y[:, None] == y[None, :]
    if not self_positive:
        same = same & ~torch.eye(len(y), dtype=torch.bool, device=p.device)
    npos = same.sum(dim=1)
    ok = npos > 0
    if not bool(ok.any()):
        return p.sum() * 0.0
    D = -(mm(P, Z.T) * same).sum(dim=1)[ok] / npos[ok]
    w = _cluster_weights(y[ok])
    return (w * D).sum()


def ccfc_loss(model: CCFCModel, global_model: CCFCModel, xb: torch.Tensor, yb: torch.Tensor, cfg: Config,
              g: torch.Generator) -> torch.Tensor:
    """Eq. (4): cluster-contrastive loss + λ · model-contrastive term (global model frozen).

    One augmented view per image (``cluster_views: 1``, the paper's form), or two views
    with the loss symmetrised over them (``cluster_views: 2``).
    """
    if cfg.cluster_views == 1:
        views = [augment(xb, cfg, g) if cfg.cluster_augment else xb]
    else:
        views = [augment(xb, cfg, g), augment(xb, cfg, g)]
    outs = [model(v) for v in views]
    if len(views) == 1:
        z, p = outs[0]
        loss = cluster_contrastive_loss(p, z, yb)
    else:
        (z1, p1), (z2, p2) = outs
        loss = 0.5 * (cluster_contrastive_loss(p1, z2, yb, cfg.self_positive)
                      + cluster_contrastive_loss(p2, z1, yb, cfg.self_positive))
    if cfg.lam > 0:
        w = _cluster_weights(yb.to(outs[0][1].device))
        reg = 0.0
        for v, (_, p) in zip(views, outs):
            with torch.no_grad():
                _, pg = global_model(v)
            reg = reg + (w * _neg_cos(p, pg)).sum()
        loss = loss + cfg.lam * reg / len(views)
    return loss


# ---------------------------------------------------------------------------
_torch_mode = _torch.torch_mode
_batches = _torch.batches


@torch.no_grad()
def embed(model: CCFCModel, x: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """L2-normalised projector outputs in eval mode."""
    model.eval()
    if len(x) == 0:
        return torch.zeros(0, model.encoder.projector[-1].num_features)
    if len(x) == 1:  # a batch of one takes torch's fallback convolution (MKL's products): embed it twice
        return F.normalize(model.encoder(x.repeat(2, 1, 1, 1))[:1].cpu(), dim=1)
    # nearly equal chunks, never one of a single image
    out = torch.cat([model.encoder(part).cpu() for part in x.tensor_split(math.ceil(len(x) / chunk))])
    return F.normalize(out, dim=1)


def assign(Z: torch.Tensor, C: np.ndarray) -> torch.Tensor:
    """Nearest global centroid by cosine similarity (Eq. 3 on normalised vectors)."""
    Cn = F.normalize(torch.from_numpy(np.asarray(C, dtype=np.float32)), dim=1)
    return torch.argmax(mm(Z, Cn.T), dim=1)


# ---------------------------------------------------------------------------
class CCFCClient(Client):
    def __init__(self, config: Config, shard, ctx: ClientContext):
        super().__init__(config, shard, ctx)
        X = np.asarray(shard.X, dtype=np.float64)
        shape = tuple(shard.meta.get("image_shape") or ())
        if len(shape) != 2 or shape[0] * shape[1] != X.shape[1]:
            side = int(round(math.sqrt(X.shape[1])))
            if side * side != X.shape[1]:
                raise ValueError(f"ccfc: rows of {X.shape[1]} values need shard.meta['image_shape']")
            shape = (side, side)
        self.shape = shape
        self.x = _as_images(X, shape)
        self.n = int(len(self.x))
        dev = _torch.resolve_device(config.device)
        self.model = build_model(config, 0, shape).to(dev)  # architecture only; weights come from the server
        self.global_model = build_model(config, 0, shape).to(dev)
        self.C: np.ndarray | None = None  # last global centroids received
        self.have_global = False

    # -- messages -----------------------------------------------------------
    def handle(self, msg: Message) -> Message | None:
        with _torch_mode(self.config.deterministic):
            if msg.kind == "train":
                return self._train(msg)
            if msg.kind == "final":
                self._receive(msg)
                return Message("ack", n=self.n)
        raise ValueError(f"ccfc client: unexpected message {msg.kind!r}")

    def _receive(self, msg: Message) -> None:
        load_arrays(self.global_model, arrays_from_message(msg))
        self.have_global = True
        if "C" in msg:
            self.C = np.asarray(msg["C"], dtype=np.float32)

    def _train(self, msg: Message) -> Message:
        cfg = self.config
        self._receive(msg)
        phase = str(msg["phase"])
        step = self.ctx.round
        self.model.load_state_dict(self.global_model.state_dict())
        g = torch.Generator().manual_seed(int(self.ctx.rng_for("train", step).integers(2**63 - 1)))
        loss_sum, steps = 0.0, 0
        z_global = None  # the received model's embedding, if this round computes it
        if self.n >= 2:
            if phase == "cluster":
                if self.C is None:
                    raise RuntimeError("ccfc client: cluster phase without global centroids")
                z_global = embed(self.global_model, self.x)
                y = assign(z_global, self.C)
                self.global_model.eval()
            opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            # ctx.work < 1 (faults.partial_work): only that share of the epochs' batches
            for idx in self.ctx.local_batches(cfg.local_epochs, lambda: _batches(self.n, cfg.batch_size, g)):
                self.model.train()
                xb = self.x[idx]
                if phase == "simsiam":
                    loss = simsiam_loss(self.model, augment(xb, cfg, g), augment(xb, cfg, g))
                else:
                    loss = ccfc_loss(self.model, self.global_model, xb, y[idx], cfg, g)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                loss_sum += float(loss.detach())
                steps += 1
        fields: dict = dict(state_to_arrays(self.model))
        fields["n"] = self.n
        fields["loss"] = loss_sum / steps if steps else 0.0
        if bool(msg.get("want_centroids", False)) and self.n > 0:
            fields["centroids"] = self._local_centroids(step, z_global)
        return Message("update", fields)

    def _local_centroids(self, step: int, z_global: torch.Tensor | None = None) -> np.ndarray:
        """k-means of the images' embedding by the model ``centroid_model`` names; ``z_global``:
        the received global model's embedding, when the round has computed it already."""
        if self.config.centroid_model == "local":
            Z = embed(self.model, self.x)
        else:
            Z = z_global if z_global is not None else embed(self.global_model, self.x)
        Z = Z.numpy().astype(np.float64)
        # padded by repetition: the message keeps its k x latent size
        C, _ = kmeans_capped(Z, self.ctx.n_clusters, self.ctx.rng_for("local_kmeans", step), self.config.kmeans_init)
        return C.astype(np.float32)

    def predict(self) -> np.ndarray | None:
        if not self.have_global or self.C is None:
            return None  # no global model and centroids received: its rows stay unlabelled
        with _torch_mode(self.config.deterministic):
            return assign(embed(self.global_model, self.x), self.C).numpy().astype(np.int64)


def match_rows(C: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """The order of ``C``'s rows that puts each under the row of ``prev`` it is most similar to
    (unit rows: the assignment that maximises the summed cosine similarity)."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(-(prev.astype(np.float64) @ C.astype(np.float64).T))
    order = np.empty(len(C), dtype=np.int64)
    order[rows] = cols
    return order


def _like(x: np.ndarray, old) -> np.ndarray:
    """An averaged float64 state entry back in the dtype of ``old``: float arrays as float32,
    counters (``num_batches_tracked``) rounded, as fedavg does."""
    dtype = np.asarray(old).dtype
    return np.asarray(x.astype(np.float32) if dtype.kind == "f" else np.rint(x).astype(dtype))


class CCFCServer(Server):
    def __init__(self, config: Config, ctx: ServerContext):
        super().__init__(config, ctx)
        self.model = build_model(config, seed_from(ctx.rng_for("model_init", 0)))
        self.weights = state_to_arrays(self.model)  # "w.<name>" -> array
        self.C: np.ndarray | None = None
        self.total = config.warmup_rounds + config.cluster_rounds
        self.latest: dict[int, tuple[int, Message]] = {}  # centroids_from: latest -- client -> (round, its reply)
        self.sent: dict[int, dict[str, np.ndarray]] = {}  # faults.asynchronous: step -> the weights sent then

    def _phase(self, step: int) -> str:
        """The phase of training step ``step`` (0-based)."""
        return "simsiam" if step < self.config.warmup_rounds else "cluster"

    def _train_fields(self, step: int) -> dict:
        fields: dict = dict(self.weights)
        # no centroids yet (no client answered the last warm-up round): one more warm-up round
        phase = "simsiam" if self.C is None else self._phase(step)
        fields["phase"] = phase
        fields["want_centroids"] = step >= self.config.warmup_rounds - 1
        if phase == "cluster":
            fields["C"] = self.C
        return fields

    def _train_messages(self, step: int) -> dict[int, Message]:
        fields = self._train_fields(step)
        if self.ctx.max_staleness is not None:  # kept while an update trained on them may still be taken
            self.sent = {s: w for s, w in self.sent.items() if s >= step - self.ctx.max_staleness}
            self.sent[step] = self.weights
        return {c: Message("train", fields) for c in self.ctx.client_ids}

    def start(self) -> dict[int, Message]:
        return self._train_messages(0)

    def aggregate(self, replies: Mapping[int, Message], round: int = 0) -> list[int]:
        """FedAvg of the weights (``UPDATE``'s weighted sum, plain or secure) and the global
        centroids over the updates that arrived; returns the clients in the average."""
        ups = {c: m for c, m in replies.items() if m.kind == "update"}
        if self.ctx.max_staleness is not None:
            self._buffered_update(ups, getattr(replies, "ages", {}), round)
            self._global_centroids(ups, round)
            return sorted(ups)
        s = weighted_sum(replies, UPDATE)
        mean = s.mean()
        if mean is not None:
            self.weights = {k: _like(mean[k], v) if k in mean else v for k, v in self.weights.items()}
        self._global_centroids(ups, round)
        if s.failed is not None:
            self.info["aggregation_failed"] = s.failed
        return s.contributors

    def _buffered_update(self, ups: Mapping[int, Message], ages: Mapping[int, int], step: int) -> None:
        """Asynchronous rounds (FedBuff): ``w <- w + sum_i n_i s(tau_i) (w_i - w^(step - tau_i)) /
        sum_i n_i`` over the buffer, ``w^(t)`` the weights sent in step ``t``, for every entry of
        the state (BatchNorm statistics too, as one vector); with every tau 0 this is FedAvg of
        the buffer. A running variance stepped below zero is set to zero; counters are rounded
        back."""
        total = float(sum(float(m["n"]) for m in ups.values()))
        if not ups or total <= 0:
            return
        shares = {c: float(m["n"]) / total * self._staleness_weight(ages.get(c, 0)) for c, m in ups.items()}
        new = {}
        for k, v in self.weights.items():
            acc = np.asarray(v, dtype=np.float64).copy()
            for c in sorted(ups):
                base = np.asarray(self.sent[step - ages.get(c, 0)][k], dtype=np.float64)
                acc += shares[c] * (np.asarray(ups[c][k], dtype=np.float64) - base)
            new[k] = _like(np.maximum(acc, 0.0) if k.endswith("running_var") else acc, v)
        self.weights = new

    def _staleness_weight(self, tau: int) -> float:
        return 1.0 / math.sqrt(1.0 + tau) if self.config.staleness == "sqrt" else 1.0

    def _global_centroids(self, ups: Mapping[int, Message], step: int) -> None:
        """k-means over every local centroid received (none received: the centroids stay); with
        ``centroids_from: latest`` also over the last ones of each client absent this round, while
        they are at most ``centroid_max_age`` rounds old."""
        if self.config.centroids_from == "latest":
            self.latest.update({c: (step, m) for c, m in ups.items() if "centroids" in m})
            kept = {c: m for c, (when, m) in self.latest.items() if step - when <= self.config.centroid_max_age}
            ups = {**kept, **ups}
        cents = [np.asarray(m["centroids"], dtype=np.float64) for c, m in sorted(ups.items()) if "centroids" in m]
        if cents:
            P = np.vstack(cents)
            w = None
            if self.config.weighted_centroids:
                w = np.concatenate([np.full(len(m["centroids"]), float(m["n"]) / len(m["centroids"]))
                                    for _, m in sorted(ups.items()) if "centroids" in m])
            C, _ = kmeans_capped(P, self.ctx.n_clusters, self.ctx.rng_for("global_kmeans", step),
                                 self.config.server_kmeans_init, sample_weight=w)
            C = normalise_rows(C).astype(np.float32)
            if self.config.stable_ids and self.C is not None and self.C.shape == C.shape:
                C = C[match_rows(C, self.C)]
            self.C = C

    def _final_message(self) -> Message:
        """The final model: the averaged weights and the global centroids."""
        if self.C is None:
            raise NoInput("ccfc: no client delivered local centroids")
        return Message("final", {**self.weights, "C": self.C})

    def _final(self) -> dict[int, Message]:
        msg = self._final_message()
        return {c: msg for c in self.ctx.client_ids}

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        if round >= self.total:  # the final round: acknowledgements only
            self.info = {"acknowledged": sorted(replies), "missing": sorted(missing)}
            return Done(labels=None, info={"rounds_trained": self.total}, final=self._final_message())
        self.info = {}
        used = self.aggregate(replies, round)
        losses = [float(replies[c]["loss"]) for c in used]
        self.info.update({"phase": self._phase(round), "aggregated": used, "missing": sorted(missing),
                          "loss": float(np.mean(losses)) if losses else None})
        if round + 1 < self.total:
            return self._train_messages(round + 1)
        return self._final()

    def result(self) -> Done:
        return Done(labels=None, info={"rounds_trained": None})

    def current_model(self) -> Message | None:
        """The final message as it would be now (``runtime.score_every``); none before the
        first global centroids."""
        return None if self.C is None else self._final_message()


PROTOCOL = Protocol(
    name="ccfc",
    config=Config,
    client=CCFCClient,
    server=CCFCServer,
    partition="horizontal",
    summary="FedAvg of a SimSiam / cluster-contrastive CNN + k-means of local centroids; model up and down every round",
    paper="J. Liu, J. Yan, Z.-Y. Zhang: CCFC: Bridging Federated Clustering and Contrastive Learning (preprint)",
    quick_params={"warmup_rounds": 1, "cluster_rounds": 1, "batch_size": 64, "channels": [4, 8, 8], "proj_hidden": 8,
                  "latent_dim": 8, "pred_dim": 4, "kmeans_init": 1, "server_kmeans_init": 2},
    secure_sums=(UPDATE,),
    supports=frozenset({"partial_work"}),  # local epochs scaled by ctx.work (faults.partial_work)
    final_model=True,  # Done.final: the trained encoder and centroids (faults.inference_round)
    async_kinds=("train",),  # faults.asynchronous: buffered, staleness-weighted steps (Config.staleness)
)
