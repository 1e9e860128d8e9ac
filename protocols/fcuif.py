"""FCUIF: federated multi-view clustering of unaligned and incomplete views (torch, CPU).

Vertical setting of FedDMVC (:mod:`raymvc.protocols.feddmvc`): client ``m`` holds view
``m`` of the samples it has. Its rows fall in three parts: aligned rows ``A`` (matched
across clients by a shared sample id), unaligned rows ``U`` (samples every client has,
but each client lists them in its own order, so the server cannot match them without
the ids) and rows only some clients have (incomplete samples). The data layer makes
``U`` (``data.unaligned`` = δ1, the share of complete samples whose rows are shuffled
inside every client but client 0) and the missing views (``data.missing``: rate δ2 and
pattern point / block / imbalanced). The true correspondence of ``U`` never leaves a
client; a client only says which of its rows are unaligned (``shard.meta["aligned"]``).

Client
------
FedDMVC's client unchanged (autoencoder, Student-t clustering layer, pretraining round,
then fine-tuning on ``L_r + γ KL(P^m || Q_m)``), except that with its sample ids it
sends ``aligned`` (one byte per row: 1 aligned, 0 unaligned). The id of an unaligned row
is only its slot in the client's list: the server knows which slots hold ``U``, not
which sample sits in them.

Server, every step (FedDMVC's global self-supervision with two additions)
---------------------------------------------------------------------------
1. Prototypes ``C`` = k-means centres of the rows that are complete *and aligned*
   (the trusted rows); each ``Q_m``'s columns are put in ``C``'s order (Hungarian method
   on the trusted rows). Of ``kmeans_init`` k-means restarts (and, only with FedDMVC's
   project option ``prototype_restart: fresh_or_warm``, one started at the previous
   round's clusters) the server keeps the one with the lowest k-means objective
   (FedDMVC's rule and the paper's, ``prototypes: inertia``, the default). The project's
   option ``prototypes: score`` keeps instead the one whose labels score best by the
   label-free criterion of step 4 (why: ``benchmarks/fcuif_tuning.md``; what it changes
   over seeds 0-4: ``studies/fcuif.md``).
2. **Adaptive alignment** (Eqs. 10-11). Sample-commonality features ``H^m = Q^m C``
   (``N_m x Σd``). One small MLP per view, ``Σd -> 32 -> 64 -> Σd`` with ReLU (the
   anchor's ``W^a`` and every other member's ``W^m``), trained with Adam on the trusted
   rows: in a batch of ``B`` trusted rows each other member's rows are shuffled by a
   known permutation (``A_gt``), ``A^m = softmax((H^a W^a)(H̃^m W^m)^T / sqrt(Σd))``
   (row-wise) and the loss is ``Σ_m mean_i ||(H^a W^a)_i - (A^m H̃^m W^m)_i||^2 +
   α mean_i CE(A^m_gt,i, A^m_i)`` (the regulariser ``f`` as a cross-entropy of each row of
   ``A^m`` against the known permutation's row: see below). Then for every member's unaligned rows the
   logits ``(H_U^a W^a)(H_U^m W^m)^T`` give the match: the permutation with the largest
   total logit (Hungarian method), which re-orders that member's ``Z_U^m`` and ``Q_U^m``
   into the anchor's order. The anchor is client 0 (the lowest member when client 0 has
   not delivered): its order is the data's sample order, so the labels of unaligned rows
   are reported in it.
3. FedDMVC's fused ``Q`` (Eq. 12), view patterns ``W_I^m`` fitted on the trusted rows
   (Eq. 13; an MLP ``d -> 32 -> 64 -> d`` as in the paper, ``view_patterns: mlp``; or
   FedDMVC's linear ``d x d`` fit, ``linear``; or none, ``q_i C^m`` itself, the ablation's
   "without C") and imputation of every absent block (Eq. 14).
4. **Adaptive imputation.** The server clusters two versions of the fused features
   (k-means started at ``C``): imputed blocks, and absent blocks filled with the block's
   mean (no imputation). Each labelling is scored without ground truth on the embeddings
   clients really sent: the mean over views of the silhouette of the labels on that
   view's present rows (``criterion: silhouette``; or the Calinski-Harabasz index). The
   imputed features are kept unless the non-imputed ones score higher.
5. Targets ``P`` (Student-t + DEC sharpening) on the chosen features, sent to every member
   in its own row order (unaligned rows through the learned match) with its block ``C^m``.
   Labels: Eq. 9's ``argmax`` of the fused ``Q`` (``labels: q``, the paper's, default)
   or ``argmax P`` (``labels: p``, FedDMVC's Eq. 14, a project option).

Per round, ``rounds.jsonl`` reports (no labels used): ``align_holdout_match``, the share
of held-out trusted rows (``align_holdout`` of them, shuffled like unaligned rows and not
used in training) that the learned match puts back in place, mean over members;
``align_cluster_agreement``, the share of unaligned rows whose matched rows fall in the
same cluster (argmax of the column-ordered ``Q``) in the anchor and the member; and
``imputation`` (the two scores and which features were used).

Exchange, traffic and missing replies: FedDMVC's (see that module), plus one byte per
row of ``aligned`` flags with the ids. A member that misses a round is represented by its
last embeddings, re-matched every round.

Paper and project variants
--------------------------
``method: fcuif`` with default parameters is the paper's procedure (within the departures
below). The project's variant, labelled "ours" in the studies, adds ``prototypes: score``,
``labels: p`` and FedDMVC's ``standardize: 1.0``. Ablation switches (the paper's Table 2):
``alpha: 0`` (without A, the permutation term), ``align_patterns: false`` (without B, the
alignment's W_H), ``view_patterns: none`` (without C, W_I), ``impute: always`` (without D,
the adaptive imputation).

Departures from the paper
-------------------------
* Prototypes ``C`` are recomputed from the trusted rows (complete and aligned) every
  round; the paper initialises them from those rows and then updates them in its fusion
  step. The k-means of step 5 starts at ``C`` and uses every covered row.
* ``rounds`` counts the fine-tune rounds after the pretraining round, so ``rounds: 3``
  (the paper's R = 3) is four server steps; the first only pretrains. The value is the
  paper's, its meaning is not: the paper's R = 3 may count the pretraining round among
  its three (not stated), which would be ``rounds: 2`` here. ``raymvc params fcuif``
  marks ``rounds`` as a departure for that reason.
* The match is a permutation (Hungarian method on the logits) rather than the soft
  ``A^m`` applied to the rows: unaligned rows are a permutation of each other, and a
  soft average of rows would blur a sample's embedding with its neighbours'.
* The imputation is judged by an internal criterion on the clients' embeddings; the
  authors' code compares the accuracy of both branches against ground truth, which a
  clustering method cannot know. Labels are never read here.
* Anchor: client 0 (see step 2) instead of "the client with the best training result",
  which the paper measures by accuracy (labels a clustering method cannot read). It is
  the parameter ``anchor`` (``first``, the only value), listed by ``raymvc params fcuif``.
* FedDMVC's losses (Eqs. 1 and 3 as sums, ``loss: sum``) and its option of standardised embeddings. The
  training budget is the paper's by default (Sec. 4.1: 500-500-2000, 500 pretraining and
  300 local epochs, batch 256, Adam 1e-3, R = 3); the shipped scenarios shorten it by
  name (30 + 10 epochs, 256-256-1024, batch 128) and say so in their labels.

The regulariser ``f`` the paper leaves open is a cross-entropy, and the regression term a
mean per entry: with a squared error for ``f`` the MLPs did not learn
(``benchmarks/fcuif_tuning.md`` has the measurements).
Defaults: α = 0.1 and Adam 1e-3 (the paper's) for the alignment MLPs, 60 passes over the
trusted rows in batches of 256 (not stated; a few seconds per round), 20% of the trusted
rows held out to score the match (a project option); the autoencoders and their budget as
stated in Sec. 4.1. ``raymvc params fcuif`` says where each value comes from.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import calinski_harabasz_score, silhouette_score

from raymvc.messages import Message
from raymvc.protocol import (
    Protocol,
    RunFacts,
    ServerContext,
    departure,
    not_stated,
    paper,
    project_option,
    remark,
    seed_from,
)

from . import feddmvc as fd
from ._torch import batches, generator, mm, seeded, torch_mode


class Config(fd.Config):
    alpha: float = Field(default=0.1, ge=0.0, description="α, weight of the permutation term of the alignment loss",
        **paper("Sec. 4.1.3 (α = 0.1)", value=0.1))
    align_hidden: tuple[int, ...] = Field(default=(32, 64), min_length=1, description="hidden widths of the alignment MLPs",
        **paper("Sec. 4.1.3 (three-layer MLPs d_m-32-64-d_m on the server)", value=(32, 64)))
    align_epochs: int = Field(default=60, ge=1, description="passes over the trusted rows per alignment",
        **not_stated("60 passes over the trusted rows, a few seconds a round; the server MLPs' training length"
            " is not given"))
    align_batch: int = Field(default=256, ge=2, description="rows per alignment batch (the size of A^m)",
        **not_stated("256, the batch size Sec. 4.1.3 gives without saying for which network"))
    align_lr: float = Field(default=1e-3, gt=0.0, description="Adam learning rate of the alignment MLPs",
        **paper("Sec. 4.1.3 (Adam, learning rate 0.001)", value=0.001))
    align_holdout: float = Field(default=0.2, ge=0.0, lt=1.0,
                                 description="share of trusted rows held out to score the alignment",
        **departure("Sec. 3.3.1, Eq. 10: the alignment trains on the aligned rows",
            "a fifth of them held out to score the match without labels (align_holdout_match in the "
            "round log)"))
    impute: Literal["adaptive", "always", "never"] = Field(default="adaptive",
                                                          description="impute absent blocks: judged per round, always or never",
        **paper("Sec. 3.3.2 (imputation kept only where it clusters better)", value="adaptive"))
    criterion: Literal["silhouette", "calinski_harabasz"] = Field(default="silhouette",
                                                                  description="label-free score of the imputation choice",
        **not_stated("the silhouette on each view's present rows: Sec. 3.3.2 compares 'clustering results' "
            "without naming a label-free score (the authors' code compares accuracies)"))
    labels: Literal["p", "q"] = Field(default="q", description="final labels: argmax of the fused Q (Eq. 9, the paper) "
                                                              "or argmax P (project option)",
        **paper("Eq. 9 (argmax of the clients' mean aligned Q)", value="q"))
    prototypes: Literal["score", "inertia"] = Field(
        default="inertia", description="k-means restart kept for C: lowest k-means objective (the paper's k-means), "
                                       "or best label-free score (project option)",
        **paper("Eq. 6 (k-means; of its restarts the lowest objective)", value="inertia"))
    view_patterns: Literal["mlp", "linear", "none"] = Field(
        default="mlp", description="W_I of Eq. 13: an MLP d-32-64-d (the paper), a d x d least squares fit, or none "
                                   "(impute q_i C^m; ablation C)",
        **paper("Eq. 13 and Sec. 4.1.3 (W_I an MLP d_m-32-64-d_m)", value="mlp"))
    align_patterns: bool = Field(default=True, description="W_H: learn the alignment MLPs (false: match the raw "
                                                           "commonality features; ablation B)",
        **paper("Eqs. 10-11 (W_H learned; Table 2's B drops it)", value=True))
    # inherited from FedDMVC's Config, marked again where FCUIF's own paper speaks (defaults unchanged)
    rounds: int = remark(
        fd.Config, "rounds",
        departure("Sec. 4.1.3 (R = 3 communication rounds)",
                  "3 fine-tune rounds after the pretraining round, four server steps; whether the paper's three "
                  "count the pretraining round is not stated"))
    anchor: Literal["first"] = Field(default="first", description="the alignment's anchor: the first member to "
                                                                   "deliver (client 0 when it has)",
        **departure("Sec. 3.3.1 (the client with the best training result)",
                    "the first member: the paper judges 'best' by accuracy, which needs labels"))
    pretrain_epochs: int = remark(
        fd.Config, "pretrain_epochs",
        paper("Sec. 4.1.3 (pretrained for 500 epochs)", value=500))
    finetune_epochs: int = remark(
        fd.Config, "finetune_epochs",
        paper("Sec. 4.1.3 (300 local epochs)", value=300))
    batch_size: int = remark(
        fd.Config, "batch_size",
        paper("Sec. 4.1.3 (batch size 256)", value=256))
    lr: float = remark(
        fd.Config, "lr",
        paper("Sec. 4.1.3 (Adam, learning rate 0.001)", value=0.001))
    hidden: tuple[int, ...] = remark(
        fd.Config, "hidden",
        paper("Sec. 4.1.3 (encoder Input-500-500-2000-10)", value=(500, 500, 2000)))
    latent_dim: int = remark(
        fd.Config, "latent_dim",
        paper("Sec. 4.1.3 (embeddings of dimension 10)", value=10))
    gamma: float = remark(
        fd.Config, "gamma",
        paper("Sec. 4.1.3 (γ = 0.1)", value=0.1))
    loss: Literal["sum", "mean"] = remark(
        fd.Config, "loss",
        paper("Eqs. 1, 3 and 4 (L_r = ||X^m - g(f(X^m))||_F^2 and the KL summed over samples and clusters)",
              value="sum"))
    ridge: float = remark(
        fd.Config, "ridge",
        project_option("used only with view_patterns: linear, FedDMVC's least squares"))
    extension: Literal["full", "no_w", "none"] = remark(
        fd.Config, "extension",
        paper("Sec. 3.3.2, Eqs. 13-14 (imputation by W_I q_i C^m)", value="full"))
    align_to: Literal["client1", "prototypes"] = remark(
        fd.Config, "align_to",
        not_stated("client 1's labels, as FedDMVC's Eq. 6; FCUIF's Eq. 12 averages the clients' Q without "
            "saying how their clusters are matched"))
    prototype_restart: Literal["fresh", "fresh_or_warm"] = remark(
        fd.Config, "prototype_restart",
        departure("Sec. 3.3: C is initialised from the aligned complete rows by Eq. 6, then updated in the "
            "fusion step",
            "recomputed from the trusted rows every round, by fresh k-means restarts"))
    server_norm: Literal["none", "l1"] = remark(
        fd.Config, "server_norm",
        paper("Eq. 5 (the embeddings concatenated as they are)", value="none"))
    target: Literal["dec", "square"] = remark(
        fd.Config, "target",
        departure("Eq. 8 as printed squares each row of T and renormalises it",
            "DEC's target, each column divided by its cluster frequency first; 'square' is the print"))


# ---------------------------------------------------------------------------
# pieces of the method, as plain functions
class Versatility(nn.Module):
    """A view's alignment MLP ``D -> hidden... -> D`` (ReLU between layers)."""

    def __init__(self, dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.net = fd.mlp([dim, *hidden, dim])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h)


def alignment_loss(Fa: torch.Tensor, Fm: torch.Tensor, perm: torch.Tensor, alpha: float) -> torch.Tensor:
    """Eq. (10) for one member: ``Fa`` (``B x D``, anchor), ``Fm`` (``B x D``, the member's rows
    shuffled so that row ``j`` is the anchor's row ``perm[j]``)."""
    logits = mm(Fa, Fm.T) / math.sqrt(Fa.shape[1])
    A = torch.softmax(logits, dim=1)
    fit = ((Fa - mm(A, Fm)) ** 2).mean()  # mean per entry (Eq. 10 sums; see the docstring)
    # f(A - A_gt): cross-entropy of each row of A against the true column
    target = torch.empty_like(perm)
    target[perm] = torch.arange(len(perm))
    return fit + alpha * F.cross_entropy(logits, target)


def fit_alignment(Ha: np.ndarray, Hs: list[np.ndarray], cfg: Config, seed: int) -> tuple[Versatility, list[Versatility]]:
    """Train the anchor's MLP and one per other member on matched rows ``Ha[i] <-> Hs[m][i]``."""
    D = Ha.shape[1]
    net_a = seeded(lambda: Versatility(D, tuple(cfg.align_hidden)), seed)
    nets = [seeded(lambda: Versatility(D, tuple(cfg.align_hidden)), seed + 1 + m) for m in range(len(Hs))]
    params = list(net_a.parameters()) + [p for n in nets for p in n.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.align_lr)
    ha = torch.from_numpy(Ha.astype(np.float32))
    hs = [torch.from_numpy(H.astype(np.float32)) for H in Hs]
    g = generator(seed)
    for _ in range(cfg.align_epochs):
        for b in batches(len(ha), cfg.align_batch, g):
            Fa = net_a(ha[b])
            loss = torch.zeros(())
            for net, h in zip(nets, hs):
                perm = torch.randperm(len(b), generator=g)
                loss = loss + alignment_loss(Fa, net(h[b][perm]), perm, cfg.alpha)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return net_a, nets


def fit_pattern_mlp(X: np.ndarray, Y: np.ndarray, cfg: Config, seed: int) -> Versatility:
    """One view's ``W_I``: an MLP ``d -> hidden -> d`` fitted to ``Y`` (the client's embeddings)
    from ``X`` (rows ``q_i C^m``) by mean squared error, Adam, ``align_epochs`` passes."""
    net = seeded(lambda: Versatility(X.shape[1], tuple(cfg.align_hidden)), seed)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.align_lr)
    x = torch.from_numpy(X.astype(np.float32))
    y = torch.from_numpy(Y.astype(np.float32))
    g = generator(seed)
    for _ in range(cfg.align_epochs):
        for b in batches(len(x), cfg.align_batch, g):
            loss = ((net(x[b]) - y[b]) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return net


@torch.no_grad()
def match_rows(net_a: Versatility, net_m: Versatility, Ha: np.ndarray, Hm: np.ndarray) -> np.ndarray:
    """``col`` with ``Hm[col[i]]`` matched to ``Ha[i]``: the permutation with the largest total
    logit ``(Ha W^a)(Hm W^m)^T`` (Hungarian method; rectangular inputs match ``min`` rows)."""
    if len(Ha) == 0 or len(Hm) == 0:
        return np.zeros(0, dtype=np.intp)
    Fa = net_a(torch.from_numpy(Ha.astype(np.float32))).numpy().astype(np.float64)
    Fm = net_m(torch.from_numpy(Hm.astype(np.float32))).numpy().astype(np.float64)
    rows, cols = linear_sum_assignment(Fa @ Fm.T, maximize=True)
    col = np.full(len(Ha), -1, dtype=np.intp)
    col[rows] = cols
    return col


def view_score(y: np.ndarray, Z: np.ndarray, H: np.ndarray, d: int, criterion: str, seed: int,
               max_rows: int = 2000) -> float:
    """Mean over views of an internal clustering index of the labels ``y`` on the rows each view
    really has (``H[:, m]``), in that view's block of ``Z``; never reads ground truth."""
    scores = []
    for j in range(H.shape[1]):
        rows = np.flatnonzero(H[:, j] & (y >= 0))
        if len(np.unique(y[rows])) < 2:
            continue
        X, lab = Z[rows, j * d:(j + 1) * d], y[rows]
        if criterion == "silhouette":
            scores.append(silhouette_score(X, lab, sample_size=min(len(rows), max_rows), random_state=seed))
        else:
            scores.append(calinski_harabasz_score(X, lab))
    return float(np.mean(scores)) if scores else -np.inf


# ---------------------------------------------------------------------------
class FCUIFClient(fd.FedDMVCClient):
    def __init__(self, config: Config, shard, ctx):
        super().__init__(config, shard, ctx)
        flags = shard.meta.get("aligned")
        self.aligned = np.ones(self.n_total, dtype=bool) if flags is None else np.asarray(flags, dtype=bool)

    def handle(self, msg: Message) -> Message | None:
        reply = super().handle(msg)
        if reply is not None and "idx" in reply:
            reply = Message(reply.kind, {**reply.fields, "aligned": self.aligned[self.idx].astype(np.uint8)})
        return reply


class FCUIFServer(fd.FedDMVCServer):
    def __init__(self, config: Config, ctx: ServerContext):
        super().__init__(config, ctx)
        self.flags: dict[int, np.ndarray] = {}  # client -> aligned flag of each row it sent
        self.ref: dict[int, np.ndarray] = {}  # client -> the anchor-order sample of each row it sent
        self._prototype_memo: dict = {}

    def step(self, round: int, replies: Mapping[int, Message], missing: set[int]):
        for c, r in replies.items():
            if r.kind == "embedding" and "idx" in r:
                self.flags[c] = np.asarray(r.get("aligned", np.ones(len(r["idx"]))), dtype=bool)
        return super().step(round, replies, missing)

    def rows(self, c: int) -> np.ndarray:
        return self.ref.get(c, self.ids[c])

    def trusted(self, complete: np.ndarray) -> np.ndarray:
        ok = complete.copy()
        for c in self.members:
            ok[self.ids[c][~self.flags.get(c, np.ones(len(self.ids[c]), dtype=bool))]] = False
        return ok

    def global_step(self, round: int) -> None:
        try:
            self._align(round)
            super().global_step(round)
        finally:
            self._prototype_memo = {}  # lives within one step (and stays out of checkpoints)

    # -- step 2: adaptive alignment ---------------------------------------------------
    def _align(self, round: int) -> None:
        mem = self.members
        self.ref = {c: self.ids[c] for c in mem}
        unaligned = {c: self.ids[c][~self.flags[c]] for c in mem if c in self.flags and (~self.flags[c]).any()}
        if not unaligned:
            return
        anchor = mem[0]
        others = [c for c in mem if c != anchor and c in unaligned]
        if anchor not in unaligned or not others:
            return
        common = self._commonality(round)
        if common is None:
            return
        H, hard = common
        trusted = np.flatnonzero(self._trusted_slots())
        rng = self.ctx.rng_for("align", round)
        held = rng.permutation(trusted)[: int(self.config.align_holdout * len(trusted) + 0.5)]
        train = np.setdiff1d(trusted, held)
        with torch_mode(self.config.deterministic):
            if self.config.align_patterns:
                net_a, nets = fit_alignment(H[anchor][train], [H[c][train] for c in others], self.config,
                                            seed_from(rng))
            else:  # ablation B: no view-specific patterns W_H, match the commonality features as they are
                net_a, nets = nn.Identity(), [nn.Identity() for _ in others]
            held_match, agree = [], []
            slots_a = unaligned[anchor]
            for net, c in zip(nets, others):
                if len(held) >= 2:
                    shuffle = rng.permutation(len(held))
                    col = match_rows(net_a, net, H[anchor][held], H[c][held][shuffle])
                    held_match.append(float(np.mean(shuffle[col] == np.arange(len(held)))))
                self.ref[c], same = self._rematch(c, net_a, net, H, hard, slots_a)
                agree.append(same)
        self.info.update({"align_holdout_match": float(np.mean(held_match)) if held_match else None,
                          "align_cluster_agreement": float(np.mean(agree)) if agree else None,
                          "n_unaligned": int(len(slots_a))})

    def _rematch(self, c: int, net_a, net, H: dict, hard: dict, slots_a: np.ndarray) -> tuple[np.ndarray, float]:
        """Member ``c``'s rows in anchor order (its unaligned rows matched to the anchor's) and the
        share of matches whose two rows fall in the same cluster (``hard``: argmax of the ordered Q)."""
        ids = self.ids[c]
        mine = np.flatnonzero(~self.flags[c])  # positions (in c's list) of its unaligned rows
        own_slots = ids[mine]
        cand = slots_a[np.isin(slots_a, own_slots)]  # anchor rows whose slot c also lists as unaligned
        col = match_rows(net_a, net, H[self.members[0]][cand], H[c][own_slots])
        ref = ids.copy()
        hit = col >= 0
        ref[mine[col[hit]]] = cand[hit]
        unmatched = np.setdiff1d(np.arange(len(mine)), col[hit])
        ref[mine[unmatched]] = np.setdiff1d(own_slots, cand[hit])[: len(unmatched)]
        qa, qc = hard[self.members[0]][cand[hit]], hard[c][own_slots[col[hit]]]
        return ref, float(np.mean(qa == qc)) if hit.any() else 0.0

    def _trusted_slots(self) -> np.ndarray:
        H = np.zeros(self.N, dtype=np.int64)
        for c in self.members:
            H[self.ids[c]] += 1
        return self.trusted(H == len(self.members))

    def _commonality(self, round: int) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]] | None:
        """``H^m = Q^m C`` (``N x Σd``, indexed by slot) with ``C`` from the trusted rows and
        each ``Q^m``'s columns in ``C``'s order, and each member's hard labels (argmax of that Q)."""
        mem, d, k = self.members, self.config.latent_dim, self.k
        trusted = self._trusted_slots()
        if trusted.sum() < max(k, 4):
            return None
        Z = np.zeros((self.N, len(mem) * d))
        for j, c in enumerate(mem):
            Z[self.ids[c], j * d:(j + 1) * d] = self.Z[c]
        C, labels = self.prototypes(Z[trusted], trusted, round)
        anchor = np.full(self.N, -1, dtype=np.intp)
        anchor[trusted] = labels
        H, hard = {}, {}
        for c in mem:
            Qc = np.zeros((self.N, k))
            order = self.column_order(c, anchor)  # self.rows(c) are the slots here
            Qc[self.ids[c]] = self.Q[c][:, order]
            H[c] = Qc @ C
            hard[c] = Qc.argmax(axis=1)
        return H, hard

    # -- step 1: prototypes --------------------------------------------------------------
    def prototypes(self, Zc: np.ndarray, base: np.ndarray, round: int) -> tuple[np.ndarray, np.ndarray]:
        """``kmeans_init`` single k-means restarts (and one from the previous labels' means);
        the one whose labels score best by the label-free criterion wins (``prototypes: score``),
        or the lowest k-means objective (``prototypes: inertia``, FedDMVC's rule)."""
        cfg = self.config
        key = (round, hashlib.sha256(Zc.tobytes()).digest())
        if self._prototype_memo.get("key") == key:  # step 2 and step 1 ask for the same rows
            return self._prototype_memo["value"]
        if cfg.prototypes == "inertia":
            value = super().prototypes(Zc, base, round)
        else:
            value = self._best_restart(Zc, base, round)
        self._prototype_memo = {"key": key, "value": value}
        return value

    def _best_restart(self, Zc: np.ndarray, base: np.ndarray, round: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.config
        rng = self.ctx.rng_for("prototypes", round)
        runs = [KMeans(n_clusters=self.k, n_init=1, random_state=seed_from(rng)).fit(Zc) for _ in range(cfg.kmeans_init)]
        init = self.warm_start(Zc, base)
        if init is not None:
            runs.append(KMeans(n_clusters=self.k, init=init, n_init=1).fit(Zc))
        present = np.ones((len(Zc), len(self.members)), dtype=bool)
        seed = seed_from(self.ctx.rng_for("criterion", round))
        scores = [view_score(km.labels_, Zc, present, cfg.latent_dim, cfg.criterion, seed) for km in runs]
        best = runs[int(np.argmax(scores))]
        self.info["prototype_score"] = float(max(scores))
        return self.renumber(best.cluster_centers_, best.labels_, base)

    # -- step 3: view-specific patterns W_I ----------------------------------------------
    def impute_view(self, j, QC, Zj, trusted, hole, round):
        """Eqs. (13)-(14): ``z_i^m = W_I^m(q_i C^m)`` with ``W_I^m`` an MLP ``d -> 32 -> 64 -> d``
        (``align_hidden``; the paper's) trained on the trusted rows, a linear fit, or none."""
        cfg = self.config
        if cfg.view_patterns == "linear" or trusted is None:
            return super().impute_view(j, QC, Zj, trusted, hole, round)
        if cfg.view_patterns == "none":
            return QC[hole]
        with torch_mode(cfg.deterministic):
            net = fit_pattern_mlp(QC[trusted], Zj[trusted], cfg, seed_from(self.ctx.rng_for(f"patterns-{j}", round)))
            with torch.no_grad():
                return net(torch.from_numpy(QC[hole].astype(np.float32))).numpy().astype(np.float64)

    # -- step 4: adaptive imputation ---------------------------------------------------
    def choose_features(self, imputed, raw, H, C, round):
        cfg = self.config
        if cfg.impute == "always" or H.all():
            return imputed
        if cfg.impute == "never":
            return raw
        covered = H.any(axis=1)
        seed = seed_from(self.ctx.rng_for("criterion", round))
        scores = {}
        for name, Zf in (("imputed", imputed), ("raw", raw)):
            y = np.full(self.N, -1, dtype=np.int64)
            y[covered] = KMeans(n_clusters=self.k, init=C, n_init=1).fit_predict(Zf[covered])
            scores[name] = view_score(y, raw, H, cfg.latent_dim, cfg.criterion, seed)
        use = scores["imputed"] >= scores["raw"]
        self.info["imputation"] = {"used": bool(use), "score_imputed": scores["imputed"], "score_raw": scores["raw"]}
        return imputed if use else raw

    def final_labels(self, P: np.ndarray, Q: np.ndarray) -> np.ndarray:
        return Q.argmax(axis=1) if self.config.labels == "q" else P.argmax(axis=1)


def analytic_bytes(config: Config, facts: RunFacts) -> int:
    """FedDMVC's bytes plus the ``aligned`` flags (one byte per row a client holds)."""
    return fd.analytic_bytes(config, facts) + sum(int(facts.client_sizes[c]) for c in facts.client_ids)


PROTOCOL = Protocol(
    name="fcuif",
    config=Config,
    client=FCUIFClient,
    server=FCUIFServer,
    partition="vertical",
    summary="FedDMVC clients; server matches unaligned rows with learned MLPs and imputes only when a label-free score agrees",
    paper="Y. Ren, X. Chen, J. Xu et al.: A novel federated multi-view clustering method for unaligned and "
          "incomplete data fusion (journal article, 2024)",
    # the paper's readout (argmax of the fused Q) needs clustering layers that have learned something:
    # a few more pretraining epochs than FedDMVC's quick setting (argmax P) gets by with
    # one more fine-tune round than FedDMVC's: with the paper's alignment to the first client,
    # two rounds leave small unaligned, incomplete data unclustered
    quick_params={**fd.PROTOCOL.quick_params, "rounds": 3, "pretrain_epochs": 15, "align_epochs": 3,
                  "align_batch": 32},
    analytic_bytes=analytic_bytes,
    supports=frozenset({"partial_work"}),  # local epochs scaled by ctx.work (faults.partial_work)
)
