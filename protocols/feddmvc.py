"""FedDMVC: federated deep multi-view clustering with global self-supervision (torch, CPU).

Vertical, partially overlapping setting: client ``m`` holds view ``m`` (``D_m``
features) of the samples it has (``N_m`` of the ``N``; index set ``I_m``); every sample
has at least one view; ``K`` clusters. The overlap rate ``δ`` is the fraction of samples
that every client has (``data.missing.rate = 1 - δ`` with the ``point`` pattern: the
other samples keep a random 1..V-1 of the views).

Client model
------------
Autoencoder ``E_m: D_m -> h_1 -> h_2 -> h_3 -> d`` (``hidden``, default
``(500, 500, 2000)``, the authors' widths; ``d = latent_dim = 10``, ReLU between layers,
linear embedding) with the mirrored
decoder ``D_m``, and a clustering layer ``U_m`` (``K x d``) giving Student-t soft
assignments ``q_ij = (1 + ||z_i - u_j||^2)^-1 / Σ_j' (1 + ||z_i - u_j'||^2)^-1``.
Each client scales its present rows to [0, 1] per feature (``scale: minmax``) and
never sends them. With the project's option ``standardize: s`` (off by default, as in
the paper) the embedding is multiplied after pretraining by one fixed scalar per client
so that its entries have standard deviation ``s`` (see below).

Exchange (round r; ``rounds`` = T fine-tune rounds, so T + 1 server steps)
-------------------------------------------------------------------------
* r = 0, ``pretrain`` (no fields): the client trains its autoencoder on the
  reconstruction loss ``L_r`` for ``pretrain_epochs`` epochs, sets ``U_m`` to the k-means
  centres of its embeddings and replies ``embedding``: ``Z_m`` (``N_m x d``), ``Q_m``
  (``N_m x K``), its sample ids ``idx`` (once) and its mean loss.
* the server, every step (its "global self-supervision"):
  1. ``Z_C`` = the rows of ``Z = [Z_1 ... Z_M]`` of complete samples (present in every
     member view); prototypes ``C`` (``K x Σ d``) = k-means centres of ``Z_C`` (Eq. 8);
  2. cluster alignment: each ``Q_m`` is permuted (Hungarian method,
     ``scipy.optimize.linear_sum_assignment`` on the co-occurrence counts of its hard
     labels with the anchor labels over the overlapping samples, Eq. 6) and
     ``Q`` = the mean of the aligned ``Q_m`` over each sample's present views (Eq. 5);
  3. view-specific patterns ``W_m`` (``d x d``): least squares
     ``min_W Σ_{i ∈ C} ||z_i^m - W (q_i C^m)||^2`` (Eq. 9, a tiny ridge ``ridge``);
  4. imputation of every missing ``z_i^m = W_m (q_i C^m)`` (Eq. 10);
  5. k-means on the completed ``Z`` (Eq. 11) -> centres, Student-t ``s_ij`` (Eq. 12),
     sharpened target ``p_ij = (s_ij^2 / f_j) / Σ_j' (s_ij'^2 / f_j')``,
     ``f_j = Σ_i s_ij`` (DEC's target distribution, Eq. 13); labels ``y = argmax_j p_ij``
     (Eq. 14);
  6. it sends each member ``finetune``: its block ``C^m`` (``K x d``) and the rows
     ``P^m = P[I_m]`` (``N_m x K``).
* r >= 1, ``finetune``: the client sets ``U_m = C^m``, trains
  ``L = L_r + γ KL(P^m || Q_m)`` for ``finetune_epochs`` epochs and replies
  ``embedding`` (``Z_m``, ``Q_m``, loss; no ids).
* after step T the server returns ``y`` as the final labels (the server holds them;
  samples no member has are labelled -1).

Traffic per client and round (floats are float32 whatever ``channel.float_dtype``;
``b`` = bytes of a sample id, the smallest unsigned type holding ``N - 1``):
up ``4 N_m (d + K) + 8`` (+ ``b N_m`` ids in round 0); down ``4 (K d + N_m K)``
from round 1 on (round 0 sends an empty message). :func:`communication` states it;
``PROTOCOL.analytic_bytes`` sums it (``RunFacts.client_sizes`` must hold ``N_m``, the
rows a client has).

Missing replies
---------------
A member whose reply is missing in a round (dropped, late, crashed, rejected) is
represented by its last ``Z_m`` and ``Q_m`` (listed in ``stale_clients``); it still gets
``C^m`` and ``P^m`` next round. A client that never delivered an embedding (it missed the
pretraining round) is not a member yet: the server sends it ``finetune`` with all of
``P`` (``P_all``, ``N x K``) and no ``C^m``. On such a message the client pretrains first
(as in round 0), orders its k-means clusters like ``P`` (Hungarian method on its own
samples: its hard labels against ``argmax P``), fine-tunes, and replies with its ids;
from then on it is a member (``joined`` in the round log), so a missed pretraining
round costs the client nothing but that round. If no client has delivered yet, the
server asks again with ``pretrain``. Samples that no member holds are labelled -1.

Project option ``quorum: q`` (off by default): a round counts toward the schedule only if
at least ``ceil(q M)`` of the ``M`` clients took part in it: before fine-tuning, had
delivered an embedding (a pretraining round below the quorum is repeated, asking only the
clients not in yet, so it has no reply when those are all away: pair a quorum with
``faults.min_clients: 0``; ``stale_clients`` there also lists the members it did not ask);
after, replied in the round (a fine-tune round below it runs as usual and is run again).
``patience`` caps the rounds that fail to count; past them every round counts. Without
faults every round counts, so the labels are the paper's. Under availability tied to what
a client holds it gives the narrow, often-away views more rounds in which to reply; the
measured effect is on ``studies/robustness.md`` (Remedies).

Departures from the paper (each an option; where the default is not the paper's own
setting, the item says so: ``target: dec`` and the closed-form ``W_m`` are readings of
what the paper leaves open or prints ambiguously, and are defaults)
-------------------------------------------------------------------------------------
* Anchor of the alignment (``align_to``): the paper aligns every client to client 1's
  labels (``client1``, the default): every ``Q_m``'s columns and ``C``'s rows are put in
  the first member's cluster order (Hungarian method on the overlapping samples), so
  Eq. 9's ``q_i C^m`` pairs matching clusters. The project's ``prototypes`` aligns every
  client (client 1 included) to the k-means labels of ``Z_C`` from step 1 instead.
* Step 1's k-means across rounds (``prototype_restart``): fresh restarts each round
  (``fresh``, the paper). The project's ``fresh_or_warm`` also runs k-means started at the
  means of ``Z_C`` grouped by the previous round's labels and keeps the lower k-means
  objective, so a poor first clustering (two digits merged, one split) is not locked in
  or out by chance. Either way step 5 starts at ``C``, and the clusters are renumbered to
  match the previous round's labels (an order only: cluster ``j`` means the same thing in
  ``C``, ``P`` and every client's ``U_m``).
* Fewer complete samples than clusters (e.g. δ = 0 or a member with no overlap): step 1
  uses every covered sample with missing blocks filled by the block's mean, and step 3
  keeps ``W_m = I`` (imputation ``q_i C^m``).
* Ablation switch (the paper's Table 2): ``extension: no_w`` imputes ``q_i C^m`` without
  ``W_m``; ``extension: none`` imputes nothing (absent blocks hold the block's mean).
* Targets: Eq. 13 as printed divides ``s_ij`` by ``Σ_j s_ij``, a sum over clusters that is
  1, so it only squares and renormalises each row (``target: square``). We read it as
  DEC's target distribution, ``f_j = Σ_i s_ij`` a sum over samples (``target: dec``, the
  default): the paper builds on DEC's clustering layer and the printed sum is otherwise a
  no-op. The ``feddmvc-target`` study runs both.
* Project option, off by default (``standardize: 1.0`` turns it on; studies label it
  "ours"). Standardised embeddings: with [0, 1] inputs and Adam, raw embeddings are ~0.3 in size,
  so the Student-t kernel (one degree of freedom) gives nearly uniform ``q_i`` (mean
  entropy 2.2 nats of at most 2.3 on HW): Eq. 5's average, the imputation ``q_i C^m``
  and the KL target carry almost no cluster information. One scalar per client, fixed
  after pretraining (``1 / std`` of its embedding entries; the decoder divides it back
  out). Its measured effect, seed set by seed set, is on the method's page
  (``studies/feddmvc.md``: the ``feddmvc-overlap`` and ``feddmvc-heldout`` studies).
* Losses: Eqs. 1 and 3 sum over samples, Eq. 1 also over a view's features. Per batch
  both are taken as means over the batch's samples (the ratio of the two sums is kept):
  ``L_r`` sums a sample's squared errors over its ``D_m`` features, ``KL`` over the
  clusters (``loss: sum``, the default). The authors' released code averages the squared
  error over features too (``loss: mean``), which weighs the KL term ``D_m`` times more;
  the method's page has its measured effect. Adam is the optimiser (not stated here).
* The training budget is not stated in this paper. The defaults are the ones the same
  authors state for the same autoencoders in FCUIF (its Sec. 4.1, and their released code):
  widths 500-500-2000, 500 pretraining epochs, 300 local epochs a round, batch 256, Adam
  1e-3, 3 rounds. That is hours a run on a 2-core CPU, so the shipped scenarios pin a
  shortened budget by name (30 + 10 epochs, 256-256-1024, batch 128) and say so in their
  labels; the method's page has the budget study.

Hyperparameters
---------------
``γ = 0.1`` (the paper's value for every data set); everything the paper leaves open
takes the value FCUIF's paper states for the same autoencoders: ``rounds = 3``,
``pretrain_epochs = 500``, ``finetune_epochs = 300``, ``batch_size = 256``,
``hidden = (500, 500, 2000)``, ``d = 10``, Adam ``lr = 1e-3``. ``raymvc params feddmvc``
says where each value comes from; the numbers are on the method's page.

Determinism: each client's initial weights come from ``ctx.rng_for("init", 0)``
(the same whenever it first trains); shuffling, k-means and training draw from the
stream of the round being handled; the server's k-means from ``ctx.rng_for(tag, round)``.
Deterministic torch algorithms are on during every call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
from pydantic import Field
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans

from raymvc.messages import Done, Message
from raymvc.protocol import (
    Client,
    ClientContext,
    NoInput,
    Protocol,
    ProtocolConfig,
    RunFacts,
    Server,
    ServerContext,
    departure,
    not_stated,
    paper,
    project_option,
    seed_from,
)

from ._torch import Linear, batches, generator, resolve_device, seeded, sqdist, torch_mode


class Config(ProtocolConfig):
    rounds: int = Field(default=3, ge=1, description="T, fine-tune rounds after the pretraining round (the authors' R = 3)",
        **not_stated("3, the R = 3 of FCUIF's paper (same authors, same autoencoders, its Sec. 4.1.3); Alg. "
            "1's number of epochs E is not given"))
    pretrain_epochs: int = Field(default=500, ge=1, description="autoencoder epochs in the pretraining round (the authors' 500)",
        **not_stated("500, as FCUIF's paper (same authors, same autoencoders, its Sec. 4.1.3); the pretraining"
            " length is not given"))
    finetune_epochs: int = Field(default=300, ge=1, description="T_1, local epochs per fine-tune round (the authors' 300)",
        **not_stated("300, as FCUIF's paper (same authors, same autoencoders, its Sec. 4.1.3); Alg. 1's T_1 is"
            " not given"))
    batch_size: int = Field(default=256, ge=2, description="rows per training step of a client's autoencoder",
        **not_stated("256, as FCUIF's paper (same authors, same autoencoders, its Sec. 4.1.3); no batch size "
            "is given"))
    lr: float = Field(default=1e-3, gt=0.0, description="Adam learning rate",
        **not_stated("Adam at 1e-3, as FCUIF's paper (same authors, same autoencoders, its Sec. 4.1.3); the "
            "paper names no optimiser"))
    hidden: tuple[int, ...] = Field(default=(500, 500, 2000), min_length=1, description="encoder widths",
        **not_stated("500-500-2000, as FCUIF's paper (same authors, same autoencoders, its Sec. 4.1.3); the "
            "paper gives no widths"))
    latent_dim: int = Field(default=10, ge=1, description="d, embedding size per view",
        **not_stated("10, as FCUIF's paper (same authors, same autoencoders, its Sec. 4.1.3); d_m is not given"))
    init: Literal["torch", "xavier"] = Field(
        default="xavier", description="initial weights of the autoencoders: Xavier-uniform with gain sqrt(2) and "
                                      "zero biases (the authors' released code) or PyTorch's default (uniform within "
                                      "1/sqrt(fan_in), biases too)",
        **not_stated("the authors' released code's (Xavier-uniform, gain sqrt(2), zero biases): the paper names no "
                     "initialisation, so we run the methods as their authors do"))
    gamma: float = Field(default=0.1, ge=0.0, description="γ, weight of KL(P || Q)",
        **paper("Sec. 4.3, Parameter Analysis (γ = 0.1 for all data sets)", value=0.1))
    loss: Literal["sum", "mean"] = Field(
        default="sum", description="scale of the two losses: per sample, the squared error summed over the view's "
                                   "features and the KL summed over clusters (Eqs. 1 and 3, the paper), or the "
                                   "squared error averaged over features (the authors' released code, mse_loss), "
                                   "which weighs the KL term D_m times more",
        **paper("Eqs. 1, 3 and 4 (L_r = ||X^m - X^^m||_F^2 and the KL summed over samples and clusters)",
                value="sum"))
    standardize: float = Field(default=0.0, ge=0.0,
                               description="project option: std of the embedding entries after pretraining "
                                           "(one scalar per client; 0 = off, the paper)",
        **project_option("off"))
    scale: str = Field(default="minmax", pattern="^(minmax|none)$", description="client-side scaling of its rows",
        **not_stated("min-max per feature on each client (the method's spec); the paper does not say how views"
            " are scaled"))
    kmeans_init: int = Field(default=10, ge=1, description="k-means restarts (client init, server round 0)",
        **not_stated("10 starts, scikit-learn's usual number; the k-means of Eqs. 8 and 11 does not say how "
            "many"))
    ridge: float = Field(default=1e-6, ge=0.0, description="ridge of the W_m least squares, relative to the trace",
        **departure("Alg. 1, lines 15-17 and Eq. 9: W is a server network trained for T_2 iterations",
            "W_m as the closed-form least squares of Eq. 9, with this ridge relative to the trace: "
            "exact, and no T_2 or server widths to choose"))
    extension: Literal["full", "no_w", "none"] = Field(
        default="full", description="the server's data extension (Table 2's ablation): W_m (q_i C^m), q_i C^m "
                                    "without W_m, or none (absent blocks keep the block's mean)",
        **paper("Sec. 3.3, Eqs. 9-10 (imputation by W_m q_i C^m; Table 2 ablates it)", value="full"))
    align_to: Literal["client1", "prototypes"] = Field(
        default="client1", description="anchor of the cluster alignment (Eq. 6): the first client's labels, as in "
                                       "the paper, or the k-means labels of the complete samples (the project's)",
        **paper("Sec. 3.3, Eq. 6 (client 1's labels l^1 as the anchor)", value="client1"))
    prototype_restart: Literal["fresh", "fresh_or_warm"] = Field(
        default="fresh", description="step 1's k-means each round: fresh restarts (the paper), or also one started "
                                     "at the previous labels' means, the lower objective kept (the project's)",
        **paper("Alg. 1, line 14 (C by Eq. 8's k-means every round)", value="fresh"))
    server_norm: Literal["none", "l1"] = Field(
        default="none", description="what the server does to each view's embedding rows before it fuses them: nothing, "
                                    "or divide each row by its L1 norm (the authors' released code); the prototypes "
                                    "it sends stay in each client's own embedding space",
        **paper("Eq. 7 (the uploaded embeddings concatenated as they are)", value="none"))
    target: Literal["dec", "square"] = Field(
        default="dec", description="Eq. 13's P: DEC's target (divided by cluster frequency) or the equation as printed",
        **departure("Eq. 13 as printed squares each row of S and renormalises it",
            "DEC's target, each column divided by its cluster frequency first, as the paper's source "
            "for P defines it; 'square' is the print"))
    quorum: float = Field(default=0.0, ge=0.0, le=1.0,
                          description="a round counts toward the schedule (the pretraining round, then `rounds` fine-tune "
                                      "rounds) only if at least this share of the clients took part: before fine-tuning "
                                      "starts, had delivered an embedding; after, replied in the round. A round that "
                                      "does not count is repeated (pretraining asks only the clients not yet in; a "
                                      "fine-tune round runs as usual); 0 = every round counts. As a count: the "
                                      "share times the clients, rounded up (info.quorum_clients)",
                          **project_option("0: every round counts, the paper; a remedy for availability tied to what "
                                           "a client holds (studies/robustness.md, Remedies)"))
    patience: int = Field(default=10, ge=0, le=1000,
                          description="with a quorum: rounds in a run, in all (not in a row, as k-FED's patience), "
                                      "that may fail to count; past them every round counts",
                          **project_option("10; only read with a quorum"))
    deterministic: bool = Field(default=True, description="torch.use_deterministic_algorithms during every call",
        **project_option("on, so a run repeats bit for bit"))
    device: Literal["cpu", "cuda", "auto"] = Field(
        default="cpu", description="where clients train (auto: CUDA in process if torch sees one; in a Ray actor "
                                   "only if Ray gave it a GPU)",
        **project_option())


# ---------------------------------------------------------------------------
# pieces of the method, as plain functions (tested one by one)
def index_dtype(n: int) -> np.dtype:
    """Smallest unsigned integer type that holds the sample ids ``0..n-1``."""
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if max(n - 1, 0) <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError("too many samples")  # pragma: no cover


def student_t(Z: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Eq. (2)/(12): ``s_ij ∝ (1 + ||z_i - c_j||^2)^-1``, rows normalised."""
    d2 = np.maximum((Z * Z).sum(1)[:, None] - 2.0 * Z @ C.T + (C * C).sum(1)[None, :], 0.0)
    s = 1.0 / (1.0 + d2)
    return s / s.sum(axis=1, keepdims=True)


def target_distribution(S: np.ndarray, kind: str = "dec") -> np.ndarray:
    """Eq. (13), DEC's target: ``p_ij = (s_ij^2 / f_j) / Σ_j' (s_ij'^2 / f_j')``, ``f_j = Σ_i s_ij``;
    ``kind="square"``: the equation as printed (its inner sum runs over ``j`` and is 1), ``s_ij^2 / Σ_j' s_ij'^2``."""
    f = np.maximum(S.sum(axis=0), 1e-12) if kind == "dec" else np.ones(S.shape[1])
    w = S * S / f[None, :]
    return w / np.maximum(w.sum(axis=1, keepdims=True), 1e-300)


def align_permutation(anchor: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Eq. (6): ``perm`` with ``perm[a]`` = the local cluster matched to anchor cluster ``a``.

    Hungarian method on the co-occurrence counts ``M[a, b] = #{i: anchor_i = a, labels_i = b}``
    (maximised); ``Q[:, perm]`` puts a client's columns in the anchor's order.
    """
    M = np.zeros((k, k), dtype=np.int64)
    np.add.at(M, (np.asarray(anchor, dtype=np.intp), np.asarray(labels, dtype=np.intp)), 1)
    rows, cols = linear_sum_assignment(M.max() - M)
    perm = np.empty(k, dtype=np.intp)
    perm[rows] = cols
    return perm


def l1_rows(Z: np.ndarray) -> np.ndarray:
    """Each row divided by its L1 norm (an all-zero row stays zero), as scikit-learn's ``Normalizer('l1')``."""
    norm = np.abs(Z).sum(axis=1, keepdims=True)
    return Z / np.where(norm > 0, norm, 1.0)


def fit_patterns(QC: np.ndarray, Zm: np.ndarray, ridge: float = 1e-6) -> np.ndarray:
    """Eq. (9) for one view: ``Wt`` (``d x d``, the transpose of ``W_m``) minimising
    ``||Zm - QC Wt||^2 + ridge tr(QC^T QC) / d ||Wt||^2``; rows of ``QC`` are ``q_i C^m``."""
    G = QC.T @ QC
    lam = ridge * max(float(np.trace(G)), 1e-12) / max(G.shape[0], 1)
    return np.linalg.solve(G + lam * np.eye(G.shape[0]), QC.T @ Zm)


def _fill_blocks(Z: np.ndarray, H: np.ndarray, d: int) -> np.ndarray:
    """``Z`` with every absent block (``H[i, m]`` False) set to the mean of the block's present rows."""
    Zf = Z.copy()
    for j in range(H.shape[1]):
        col = slice(j * d, (j + 1) * d)
        if H[:, j].any():
            Zf[~H[:, j], col] = Z[H[:, j], col].mean(axis=0)
    return Zf


def communication(n_m: int, n: int, k: int, d: int, rounds: int) -> dict:
    """Data bytes one client exchanges in a fault-free run of ``rounds`` fine-tune rounds."""
    up_round = 4 * n_m * (d + k) + 8
    up = (rounds + 1) * up_round + index_dtype(n).itemsize * n_m
    down = rounds * 4 * (k * d + n_m * k)
    return {"up": up, "down": down, "total": up + down}


def analytic_bytes(config: Config, facts: RunFacts) -> int:
    t = max(int(facts.rounds) - 1, 0)  # server steps = pretraining + t fine-tune rounds
    return sum(communication(int(facts.client_sizes[c]), facts.n_samples, facts.n_clusters, config.latent_dim, t)["total"]
               for c in facts.client_ids)


# ---------------------------------------------------------------------------
# client model
def mlp(dims: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(Linear(a, b))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class AutoEncoder(nn.Module):
    """``D -> hidden... -> d`` encoder, mirrored decoder, clustering layer ``U`` (``K x d``).

    ``scale`` (a fixed scalar, 1 until set after pretraining) multiplies the encoder's
    output; the decoder undoes it, so it changes only the space the Student-t kernel sees.
    """

    def __init__(self, n_in: int, hidden: tuple[int, ...], d: int, k: int, init: str = "xavier"):
        super().__init__()
        dims = [n_in, *hidden, d]
        self.encoder = mlp(dims)
        self.decoder = mlp(dims[::-1])
        if init == "xavier":  # Xavier-uniform weights with ReLU's gain sqrt(2), zero biases
            for m in (*self.encoder, *self.decoder):
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight, gain=math.sqrt(2.0))
                    nn.init.zeros_(m.bias)
        self.U = nn.Parameter(torch.zeros(k, d))
        self.register_buffer("scale", torch.ones(()))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.embed(x)
        return z, self.decoder(z / self.scale)

    def soft_assign(self, z: torch.Tensor) -> torch.Tensor:
        """Eq. (2): Student-t kernel between embeddings and ``U``, rows normalised."""
        s = 1.0 / (1.0 + sqdist(z, self.U))
        return s / s.sum(dim=1, keepdim=True)


class FedDMVCClient(Client):
    def __init__(self, config: Config, shard, ctx: ClientContext):
        super().__init__(config, shard, ctx)
        X = np.asarray(shard.X, dtype=np.float64)
        present = shard.present[0]
        self.n_total = int(X.shape[0])  # vertical shards hold all N rows (+ a present mask)
        self.idx = np.arange(self.n_total) if present is None else np.flatnonzero(np.asarray(present, dtype=bool))
        X = X[self.idx]
        if config.scale == "minmax" and len(X):
            lo, span = X.min(axis=0), X.max(axis=0) - X.min(axis=0)
            X = (X - lo) / np.where(span > 0, span, 1.0)
        self.dev = resolve_device(config.device)
        self.x = torch.from_numpy(X.astype(np.float32)).to(self.dev)
        self.n = int(len(self.idx))
        self.k = ctx.n_clusters
        # seeded from round 0 whenever it is built; built here so that a checkpoint can be loaded into it
        self.model = seeded(lambda: AutoEncoder(self.x.shape[1], tuple(config.hidden), config.latent_dim, self.k,
                                                config.init),
                            seed_from(ctx.rng_for("init", 0))).to(self.dev)
        self.pretrained = False

    # -- messages -------------------------------------------------------------
    def handle(self, msg: Message) -> Message | None:
        with torch_mode(self.config.deterministic):
            if msg.kind == "pretrain":
                send_ids = True
                if not self.pretrained:
                    self._pretrain()
                loss = self.last_loss
            elif msg.kind == "finetune":
                send_ids = "P_all" in msg
                loss = self._finetune(msg)
            else:
                raise ValueError(f"feddmvc client: unexpected message {msg.kind!r}")
            Z, Q = self._embed()
        fields: dict = {"Z": Z, "Q": Q, "loss": float(loss)}
        if send_ids:
            fields["idx"] = self.idx.astype(index_dtype(self.n_total))
        return Message("embedding", fields)

    # -- training ---------------------------------------------------------------
    def _pretrain(self) -> None:
        """Round 1 of the paper: reconstruction only, then U_m = k-means centres of Z_m."""
        cfg = self.config
        self.last_loss = self._train(cfg.pretrain_epochs, None, seed_from(self.ctx.rng_for("pretrain")))
        Z = self._embed()[0].astype(np.float64)
        if cfg.standardize > 0 and self.n >= 2 and Z.std() > 0:  # entries of std `standardize` (see docstring)
            with torch.no_grad():
                self.model.scale.fill_(float(cfg.standardize / Z.std()))
            Z = self._embed()[0].astype(np.float64)
        if self.n >= self.k:
            km = KMeans(n_clusters=self.k, n_init=cfg.kmeans_init, random_state=seed_from(self.ctx.rng_for("kmeans")))
            km.fit(Z)
            U = km.cluster_centers_
        else:  # too few samples: U on the samples themselves, repeated
            U = Z[np.arange(self.k) % max(self.n, 1)] if self.n else np.zeros((self.k, self.config.latent_dim))
        with torch.no_grad():
            self.model.U.copy_(torch.from_numpy(U.astype(np.float32)).to(self.dev))
        self.pretrained = True

    def _finetune(self, msg: Message) -> float:
        """U_m <- C^m (or, for a client new to the federation, its clusters ordered like P),
        then L = L_r + γ KL(P^m || Q_m) for T_1 epochs."""
        if not self.pretrained:
            self._pretrain()
        if "P_all" in msg:
            P = np.asarray(msg["P_all"], dtype=np.float32)[self.idx]
        else:
            P = np.asarray(msg["P"], dtype=np.float32)
        if P.shape != (self.n, self.k):
            raise ValueError(f"feddmvc client: P has shape {P.shape}, expected {(self.n, self.k)}")
        if "C" in msg:
            C = np.asarray(msg["C"], dtype=np.float32)
            with torch.no_grad():
                self.model.U.copy_(torch.from_numpy(C).to(self.dev))
        elif self.n:  # order U's clusters like P's columns (Hungarian on its own samples)
            _, Q = self._embed()
            perm = align_permutation(P.argmax(1), Q.argmax(1), self.k)
            with torch.no_grad():
                self.model.U.copy_(self.model.U[torch.from_numpy(perm).to(self.dev)].clone())
        return self._train(self.config.finetune_epochs, torch.from_numpy(P).to(self.dev),
                           seed_from(self.ctx.rng_for("finetune")))

    def _train(self, epochs: int, P: torch.Tensor | None, seed: int) -> float:
        cfg = self.config
        model = self.model
        if self.n < 2:
            return 0.0
        params = list(model.encoder.parameters()) + list(model.decoder.parameters())
        if P is not None:
            params.append(model.U)
        opt = torch.optim.Adam(params, lr=cfg.lr)
        g = generator(seed)
        model.train()
        total, steps = 0.0, 0
        # ctx.work < 1 (faults.partial_work): only that share of the epochs' batches
        for b in self.ctx.local_batches(epochs, lambda: batches(self.n, cfg.batch_size, g)):
            b = b.to(self.dev)
            xb = self.x[b]
            z, xr = model(xb)
            err = (xr - xb) ** 2  # L_r: Eq. 1 sums over a sample's features; `mean` averages them
            loss = err.sum(1).mean() if cfg.loss == "sum" else err.mean()
            if P is not None and cfg.gamma > 0:
                q = model.soft_assign(z)
                pb = P[b]
                # KL(P^m || Q_m), mean over the batch's samples
                kl = (pb * (torch.log(pb.clamp_min(1e-12)) - torch.log(q.clamp_min(1e-12)))).sum(1).mean()
                loss = loss + cfg.gamma * kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
        return total / steps if steps else 0.0

    @torch.no_grad()
    def _embed(self) -> tuple[np.ndarray, np.ndarray]:
        """Z_m and Q_m of the client's samples (float32)."""
        self.model.eval()
        z = torch.cat([self.model.embed(self.x[i:i + 1024]) for i in range(0, self.n, 1024)]) if self.n \
            else torch.zeros(0, self.config.latent_dim, device=self.dev)
        q = self.model.soft_assign(z) if self.n else torch.zeros(0, self.k, device=self.dev)
        return z.cpu().numpy().astype(np.float32), q.cpu().numpy().astype(np.float32)


# ---------------------------------------------------------------------------
class FedDMVCServer(Server):
    def __init__(self, config: Config, ctx: ServerContext):
        super().__init__(config, ctx)
        if ctx.n_samples is None:
            raise ValueError("feddmvc needs a vertical split (ServerContext.n_samples)")
        self.N = int(ctx.n_samples)
        self.k = ctx.n_clusters
        self.ids: dict[int, np.ndarray] = {}  # client -> its sample ids
        self.Z: dict[int, np.ndarray] = {}  # latest Z_m (N_m x d) as the server fuses it (server_norm)
        self.Zraw: dict[int, np.ndarray] = {}  # latest Z_m as the client sent it (only kept with server_norm)
        self.Q: dict[int, np.ndarray] = {}  # latest Q_m (N_m x K)
        self.C: np.ndarray | None = None  # prototypes, K x (members x d)
        self.P: np.ndarray | None = None
        self.y: np.ndarray | None = None
        self.counted = 0  # with a quorum: rounds that counted toward the schedule (the pretraining round first)
        self.waited = 0  # with a quorum: rounds that did not

    @property
    def members(self) -> list[int]:
        return sorted(self.Z)

    def start(self) -> dict[int, Message]:
        return {c: Message("pretrain") for c in self.ctx.client_ids}

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]) -> dict[int, Message] | Done:
        before = set(self.members)
        losses, fresh = [], 0
        for c, r in replies.items():
            if r.kind != "embedding":
                continue
            if "idx" in r:
                self.ids[c] = np.asarray(r["idx"], dtype=np.intp)
            if c in self.ids:
                self.Z[c] = np.asarray(r["Z"], dtype=np.float64)
                if self.config.server_norm == "l1":
                    self.Zraw[c] = self.Z[c]
                    self.Z[c] = l1_rows(self.Z[c])
                self.Q[c] = np.asarray(r["Q"], dtype=np.float64)
                losses.append(float(r["loss"]))
                fresh += 1
        self.info = {"members": self.members, "joined": sorted(set(self.members) - before) if round else [],
                     "stale_clients": sorted(c for c in before if c not in replies),
                     "loss": float(np.mean(losses)) if losses else None}
        counted = self.count_round(round, fresh)
        if self.members:
            self.global_step(round)
        if counted > self.config.rounds:  # the pretraining round and `rounds` fine-tune rounds counted
            if self.y is None:
                raise NoInput("feddmvc: no client delivered embeddings")
            return Done(labels=self.y.copy(), info={"members": self.members})
        if self.P is None:
            return {c: Message("pretrain") for c in self.ctx.client_ids}
        if not counted:  # below the quorum before fine-tuning: ask only the clients not in yet
            return {c: Message("pretrain") for c in self.ctx.client_ids if c not in self.Z}
        P = self.P.astype(np.float32)
        out = {}
        for c in self.ctx.client_ids:
            if c in self.Z:
                j = self.members.index(c)
                out[c] = Message("finetune", C=np.ascontiguousarray(self.client_prototypes(c, j), dtype=np.float32),
                                 P=np.ascontiguousarray(P[self.rows(c)]))
            else:
                out[c] = Message("finetune", P_all=P)
        return out

    def count_round(self, round: int, fresh: int) -> int:
        """The rounds that have counted toward the schedule, this one included if it counts.
        Without a quorum every round counts (``round + 1``). With one, before fine-tuning the
        members, after it the clients that replied (``fresh``), against the quorum's share of
        all clients; past ``patience`` rounds that did not count, every round counts."""
        cfg = self.config
        if cfg.quorum <= 0:
            return round + 1
        took_part = len(self.members) if not self.counted else fresh
        need = math.ceil(cfg.quorum * len(self.ctx.client_ids) - 1e-9)
        if took_part >= need or self.waited >= cfg.patience:
            self.counted += 1
        else:
            self.waited += 1
        # the quorum as a count of clients (0.66 of 3 is 2; 0.67 of 3 is all 3): protocol_info, sweep.csv's info.quorum_clients
        self.info.update({"counted": self.counted, "waited": self.waited, "quorum_clients": need})
        return self.counted

    def client_prototypes(self, c: int, j: int) -> np.ndarray:
        """``C^m`` for member ``c`` (the ``j``-th): its block of ``C``, in the space of the embeddings it
        sent. With ``server_norm`` the server's space is not the client's: the block is the mean of the
        client's own rows in each cluster (the server's labels), a cluster it has no row of the block
        times the mean L1 norm of its rows."""
        d = self.config.latent_dim
        block = self.C[:, j * d:(j + 1) * d]
        if self.config.server_norm == "none":
            return block
        raw = self.Zraw[c]
        out = block * float(np.abs(raw).sum(axis=1).mean()) if len(raw) else block.copy()
        y = self.y[self.rows(c)]
        for a in range(self.k):
            sel = y == a
            if sel.any():
                out[a] = raw[sel].mean(axis=0)
        return out

    def rows(self, c: int) -> np.ndarray:
        """The sample (row of ``Z``, ``P``) of each row client ``c`` sent, in its order."""
        return self.ids[c]

    def trusted(self, complete: np.ndarray) -> np.ndarray:
        """Rows that fix the prototypes and the view patterns: here every complete row."""
        return complete

    def global_step(self, round: int) -> None:
        """Steps 1-5 of the module docstring: C, aligned Q, W_m, imputation, P."""
        cfg, k, d, N = self.config, self.k, self.config.latent_dim, self.N
        mem = self.members
        M = len(mem)
        H = np.zeros((N, M), dtype=bool)  # h_im: member m has sample i
        Z = np.zeros((N, M * d))
        for j, c in enumerate(mem):
            H[self.rows(c), j] = True
            Z[self.rows(c), j * d:(j + 1) * d] = self.Z[c]
        covered = H.any(axis=1)
        complete = H.all(axis=1)
        trusted = self.trusted(complete)
        raw = _fill_blocks(Z, H, d)  # absent blocks filled with the block's mean (no imputation)
        few = trusted.sum() < k  # too little overlap: every covered sample, absent blocks mean-filled
        base = covered if few else trusted
        C, labels = self.prototypes((raw if few else Z)[base], base, round)
        anchor = np.full(N, -1, dtype=np.intp)
        if cfg.align_to == "client1":  # the paper: every view, and C, in the first client's cluster order
            first = mem[0]
            anchor[self.rows(first)] = self.Q[first].argmax(axis=1)
            full = np.full(N, -1, dtype=np.intp)
            full[base] = labels
            ok = base & (anchor >= 0)
            if ok.any():
                perm = align_permutation(anchor[ok], full[ok], k)  # perm[a] = prototype matched to a
                C, labels = C[perm], np.argsort(perm)[labels]
        else:
            anchor[base] = labels
        # step 2, Eqs. (5)-(6): align each Q_m to the anchor labels, average over present views
        Q = np.zeros((N, k))
        for j, c in enumerate(mem):
            rows = self.rows(c)
            Q[rows] += self.Q[c][:, self.column_order(c, anchor)]
        Q[covered] /= H[covered].sum(axis=1, keepdims=True)
        # steps 3-4, Eqs. (9)-(10): W_m from the trusted complete rows, impute the missing z_i^m
        for j in range(M if cfg.extension != "none" else 0):
            col = slice(j * d, (j + 1) * d)
            QC = Q @ C[:, col]  # rows q_i C^m
            hole = covered & ~H[:, j]
            if hole.any():
                Z[hole, col] = self.impute_view(j, QC, Z[:, col], trusted if trusted.sum() >= k else None,
                                                hole, round)
        if cfg.extension == "none":  # ablation: no data extension, absent blocks hold the block's mean
            Z = raw.copy()
        Z = self.choose_features(Z, raw, H, C, round)
        # step 5, Eqs. (11)-(14): k-means on the completed Z (started at C), S, P, labels
        km2 = KMeans(n_clusters=k, init=C, n_init=1).fit(Z[covered])
        P = np.full((N, k), 1.0 / k)
        P[covered] = target_distribution(student_t(Z[covered], km2.cluster_centers_), cfg.target)
        y = np.full(N, -1, dtype=np.int64)
        y[covered] = self.final_labels(P, Q)[covered]
        if self.y is not None:
            both = (y >= 0) & (self.y >= 0)
            self.info["label_change"] = float(np.mean(y[both] != self.y[both])) if both.any() else None
        self.info.update({"n_complete": int(complete.sum()), "n_covered": int(covered.sum())})
        self.C, self.P, self.y = C, P, y

    def prototypes(self, Zc: np.ndarray, base: np.ndarray, round: int) -> tuple[np.ndarray, np.ndarray]:
        """Step 1, Eq. (8): prototypes C = k-means centres of ``Zc`` (the ``base`` rows) and their
        labels; fresh restarts and a start at the previous labels' means, the lower objective
        wins, clusters renumbered to match the previous labels."""
        k = self.k
        km = KMeans(n_clusters=k, n_init=self.config.kmeans_init,
                    random_state=seed_from(self.ctx.rng_for("prototypes", round))).fit(Zc)
        init = self.warm_start(Zc, base) if self.config.prototype_restart == "fresh_or_warm" else None
        if init is not None:  # also from the previous labels' means; the lower k-means objective wins
            warm = KMeans(n_clusters=k, init=init, n_init=1).fit(Zc)
            if warm.inertia_ <= km.inertia_:
                km = warm
        return self.renumber(km.cluster_centers_, km.labels_, base)

    def renumber(self, C: np.ndarray, labels: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keep cluster j = last round's cluster j (Hungarian method on the base rows)."""
        if self.y is not None:
            prev = self.y[base]
            ok = prev >= 0
            if ok.any():
                perm = align_permutation(labels[ok], prev[ok], self.k)  # perm[new] = old
                order = np.argsort(perm)  # order[old] = new
                C, labels = C[order], np.argsort(order)[labels]
        return C, labels

    def column_order(self, c: int, anchor: np.ndarray) -> np.ndarray:
        """Eq. (6): the order of ``Q_c``'s columns that matches the anchor labels (identity without overlap)."""
        ok = anchor[self.rows(c)] >= 0
        if not ok.any():
            return np.arange(self.k)
        return align_permutation(anchor[self.rows(c)][ok], self.Q[c][ok].argmax(1), self.k)

    def impute_view(self, j: int, QC: np.ndarray, Zj: np.ndarray, trusted: np.ndarray | None, hole: np.ndarray,
                    round: int) -> np.ndarray:
        """Eqs. (9)-(10) for view ``j``: ``z_i = W_m (q_i C^m)`` on the ``hole`` rows, ``W_m`` the
        least squares fit on the trusted rows (``W_m = I`` without them)."""
        if trusted is None or self.config.extension == "no_w":
            return QC[hole]
        return QC[hole] @ fit_patterns(QC[trusted], Zj[trusted], self.config.ridge)

    def choose_features(self, imputed: np.ndarray, raw: np.ndarray, H: np.ndarray, C: np.ndarray,
                        round: int) -> np.ndarray:
        """The fused features step 5 clusters: FedDMVC always takes the imputed ones."""
        return imputed

    def final_labels(self, P: np.ndarray, Q: np.ndarray) -> np.ndarray:
        """Eq. (14): ``y = argmax_j p_ij``."""
        return P.argmax(axis=1)

    def warm_start(self, Zc: np.ndarray, base: np.ndarray) -> np.ndarray | None:
        """Means of ``Zc`` grouped by the previous labels (None in round 0 or if a cluster is empty)."""
        if self.y is None:
            return None
        prev = self.y[base]
        init = np.zeros((self.k, Zc.shape[1]))
        for j in range(self.k):
            sel = prev == j
            if not sel.any():
                return None
            init[j] = Zc[sel].mean(axis=0)
        return init

    def result(self) -> Done | None:
        if self.y is None:
            return None  # no labels yet
        return Done(labels=self.y.copy(), info={"members": self.members, "early": True})


PROTOCOL = Protocol(
    name="feddmvc",
    config=Config,
    client=FedDMVCClient,
    server=FedDMVCServer,
    partition="vertical",
    summary="deep autoencoders per view; server aligns, imputes and sends prototypes + DEC targets; N_m (d+K) floats per round",
    paper="X. Chen, J. Xu, Y. Ren, X. Pu, C. Zhu, X. Zhu, Z. Hao, L. He: Federated Deep Multi-View Clustering "
          "with Global Self-Supervision (ACM Multimedia 2023)",
    # a few epochs on tiny widths: the larger step (the default before it was tuned) learns in them
    quick_params={"rounds": 2, "pretrain_epochs": 3, "finetune_epochs": 2, "batch_size": 64,
                  "hidden": (32, 32, 64), "latent_dim": 8, "kmeans_init": 2, "lr": 2e-3},
    analytic_bytes=analytic_bytes,
    supports=frozenset({"partial_work"}),  # local epochs scaled by ctx.work (faults.partial_work)
)
