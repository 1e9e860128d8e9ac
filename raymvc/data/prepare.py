"""The data of a run as its scenario says: loaded, normalised, split, and checked against the
method and the faults -- everything a run needs before any party starts, with no Ray
(:func:`prepare`). The engine, the study layer and ``raymvc validate`` all start here.
"""

from __future__ import annotations

from .. import kinds, streams
from ..protocol import scores_mid_run
from ..safeio import available_memory  # noqa: F401 (re-exported; checks here call this name)
from ..scenario import ChannelCfg, Scenario, ScenarioError, show_override
from ..scenario.sidefiles import availability_trace
from ..streams import stream
from . import normalize
from . import partition as parts
from .datasets import load_dataset


def scenario_error(sc: Scenario, key: str, msg: str) -> ScenarioError:
    where = f"{sc.source}: " if sc.source else ""
    return ScenarioError(f"{where}{key}: {msg}")


def _check_secure_aggregation(sc: Scenario, proto) -> None:
    """Secure-aggregation settings that the method or the rest of the scenario cannot honour."""
    ch = sc.channel
    if ch.secure_aggregation and not proto.secure_sums:
        raise scenario_error(sc, "channel.secure_aggregation", f"method {sc.method} declares no sum to aggregate securely "
                                                     "(Protocol.secure_sums)")
    if ch.secagg_neighbours and not ch.secure_aggregation:
        raise scenario_error(sc, "channel.secagg_neighbours", "needs channel.secure_aggregation: true")
    if ch.secagg_threshold != ChannelCfg.model_fields["secagg_threshold"].default and not ch.secure_aggregation:
        raise scenario_error(sc, "channel.secagg_threshold", "needs channel.secure_aggregation: true")
    if ch.secure_aggregation and sc.runtime.checkpoint:
        raise scenario_error(sc, "runtime.checkpoint", "cannot be combined with channel.secure_aggregation: the clients' "
                                             "secure-aggregation keys never leave them, not even into a checkpoint")


def _check_sampled_secure_aggregation(sc: Scenario, asked: int, n_clients: int) -> None:
    """Secure aggregation is set up once among all clients: the clients a round asks must
    reach its threshold on their own, or no round's sum could ever be rebuilt."""
    ch = sc.channel
    if not ch.secure_aggregation:
        return
    if ch.secagg_neighbours:
        raise scenario_error(sc, "faults.sampling", "cannot be combined with channel.secagg_neighbours (a round's sampled "
                                          "clients may leave a neighbourhood under its threshold)")
    need = int(ch.secagg_threshold * n_clients) + 1
    if asked < need:
        raise scenario_error(sc, "faults.sampling", f"asks {asked} of {n_clients} clients per round, fewer than the {need} "
                                          f"secure aggregation needs (channel.secagg_threshold "
                                          f"{ch.secagg_threshold}); lower the threshold below {asked / n_clients:g}")


def prepare(sc: Scenario, dataset=None, machine: bool = True):
    """Load, normalise and split the data as the scenario says (no Ray needed); ``dataset``
    (a :class:`~raymvc.data.types.MultiViewDataset`) replaces ``data.path``/``data.dataset``;
    ``machine``: also refuse a run this machine could not hold (off: only the data are wanted).

    Every problem is raised as a :class:`ScenarioError` naming the key.
    """
    from ..protocols import get

    proto = get(sc.method)
    _check_secure_aggregation(sc, proto)
    ds = normalize(_load(sc, dataset), sc.data.normalize)
    kind = sc.data.partition or proto.partition
    if kind != proto.partition:
        if "method" in sc._overrides and "data.partition" not in sc._overrides:  # the method came from --set
            raise ScenarioError(f"--set {show_override('method', sc.method)}: method {sc.method} needs a "
                                f"{proto.partition} split; {sc.source or 'the scenario'} has data.partition: {kind} "
                                f"(add --set data.partition={proto.partition}, or pick a {kind} method)")
        raise scenario_error(sc, "data.partition", f"method {sc.method} needs a {proto.partition} split, got {kind}")
    pooled = central(sc, proto)
    if pooled:
        _check_central(sc, proto)
    try:
        part = _split(sc, ds, kind, pooled)
    except ValueError as e:
        if isinstance(e, ScenarioError):
            raise
        raise scenario_error(sc, "data", str(e)) from None
    _check_faults_fit(sc, proto, part)
    if machine:
        _check_machine_bounds(sc, proto, part)
    if sc.runtime.score_every and not scores_mid_run(proto):
        raise scenario_error(sc, "runtime.score_every", f"method {sc.method} has no model to score along its rounds "
                                                        "(its server does not define current_model); leave it out")
    return ds, part


def _load(sc: Scenario, dataset=None):
    """The scenario's data set (or ``dataset``), its image shapes and cluster count checked, not
    yet normalised; refused in one line where it would not fit in memory."""
    from . import DataError
    from .datasets import image_shapes_for, select_views

    d = sc.data
    if dataset is None and d.path is None and d.dataset == "synthetic":  # known before a value is drawn
        _check_memory(sc, d.synthetic.n_values() * 8)
    try:
        if dataset is not None:
            ds = select_views(dataset, d.views) if d.views is not None else dataset
        elif d.path is not None:
            p = sc.data_path()
            ds = load_dataset(path=[str(q) for q in p] if isinstance(p, list) else str(p), views=d.views,
                              label_column=d.label_column)
        elif d.dataset == "synthetic":
            s = d.synthetic
            ds = load_dataset("synthetic", n_samples=s.n_samples, n_views=s.n_views, dims=s.dims,
                              n_clusters=s.n_clusters, noise=s.noise, seed=sc.seed, views=d.views)
        else:
            ds = load_dataset(d.dataset, views=d.views)
    except DataError as e:
        raise scenario_error(sc, "data.path" if d.path else "data.dataset", str(e)) from None
    except (KeyError, ValueError) as e:
        raise scenario_error(sc, "data.dataset", str(e).strip("'\"")) from None
    if d.image_shape is not None:
        try:
            ds.image_shapes = image_shapes_for(ds, d.image_shape)
        except DataError as e:
            raise scenario_error(sc, "data.image_shape", str(e)) from None
    if d.n_clusters is not None:
        if d.n_clusters > ds.n_samples:
            raise scenario_error(sc, "data.n_clusters", f"{d.n_clusters} clusters for {ds.n_samples} samples: "
                                                        "a clustering has at most one cluster per sample")
        ds.k = d.n_clusters
    elif not ds.has_labels:
        raise scenario_error(sc, "data.n_clusters", f"{ds.name} has no labels; give the number of clusters (data.n_clusters: K)")
    if not ds.has_labels and (d.heterogeneity > 0):
        raise scenario_error(sc, "data.heterogeneity", "a label-skewed split needs labels; this data has none")
    _check_memory(sc, sum(int(v.nbytes) for v in ds.views))
    return ds


def _split(sc: Scenario, ds, kind: str, pooled: bool):
    """The partition: ``pooled`` (a centralised reference) puts every row, or every view side
    by side, at one party; otherwise the scenario's vertical or horizontal split."""
    d, rng = sc.data, stream(sc.seed, streams.SPLIT)
    if kind == "vertical":
        if pooled:
            return parts.pooled_views(ds)
        if d.n_clients is not None and d.n_clients != ds.n_views:
            raise scenario_error(sc, "data.n_clients",
                                 f"a vertical split has one client per view ({ds.n_views}), got {d.n_clients}")
        mask = None
        if d.missing.rate > 0:
            mask = parts.missing_mask(ds.n_samples, ds.n_views, d.missing.rate, d.missing.pattern, rng,
                                      base=ds.present, imbalance_alpha=d.imbalance_alpha)
        part = parts.vertical(ds, rng, missing=mask)
        return parts.unalign(part, d.unaligned, rng) if d.unaligned > 0 else part
    if ds.n_views != 1 and d.views is None:
        raise scenario_error(sc, "data.views", f"{ds.name} has {ds.n_views} views; a horizontal split needs one "
                                               "(e.g. data.views: [4])")
    if pooled:
        return parts.horizontal(ds, 1, rng)
    return parts.horizontal(ds, d.n_clients or ds.n_clusters, rng, heterogeneity=d.heterogeneity,
                            dirichlet_alpha=d.dirichlet_alpha)

def central(sc: Scenario, proto) -> bool:
    """Whether the run is a centralised reference: ``central: true``, or a method that is one."""
    return bool(sc.central or getattr(proto, "pooled", False))


def _check_central(sc: Scenario, proto) -> None:
    """A centralised reference pools the rows at one party and injects no fault."""
    if not proto.central_form:
        raise scenario_error(sc, "central", f"method {sc.method} has no centralised form here (leave central out)")
    if proto.partition == "vertical":
        d = sc.data
        for key, value in (("data.missing.rate", d.missing.rate), ("data.unaligned", d.unaligned)):
            if value:
                raise scenario_error(sc, "central", f"the centralised reference of a vertical method pools every view "
                                                    f"of every sample, aligned; leave {key} out")
        if d.n_clients not in (None, 1):
            raise scenario_error(sc, "central", "the centralised reference holds every view at one party; leave "
                                                "data.n_clients out")
    if sc.faults != type(sc.faults)():
        raise scenario_error(sc, "central", "a centralised reference clusters the pooled data with no faults; "
                                            "leave faults out")
    if sc.channel.secure_aggregation:
        raise scenario_error(sc, "central", "a centralised reference has no channel to protect; leave "
                                            "channel.secure_aggregation out")


COPIES = 3  # the data, its normalised copy and the clients' shards live side by side while a run starts


def _check_memory(sc: Scenario, data_bytes: int) -> None:
    """Refuse in one line, before anything large is built, a data set whose copies for a run
    (:data:`COPIES` of its values) would not fit in the memory left to this process."""
    need, avail = COPIES * data_bytes, available_memory()
    if avail is not None and need > avail:
        raise scenario_error(sc, "data", f"needs about {need / 1e9:.2f} GB of memory ({COPIES} copies of "
                                         f"{data_bytes / 1e9:.2f} GB of values) but {avail / 1e9:.2f} GB is available")


def _check_asynchronous(sc: Scenario, proto, part) -> None:
    """``faults.asynchronous`` asks for a method that takes buffered updates, and for nothing
    that presumes synchronous rounds."""
    cfg, key = sc.faults.asynchronous, "faults.asynchronous"
    if cfg is None:
        return
    if not proto.async_kinds:
        raise scenario_error(sc, key, f"method {sc.method} steps on whole rounds only (Protocol.async_kinds is empty); "
                                      "leave it out")
    clashes = {"channel.secure_aggregation": sc.channel.secure_aggregation and bool(proto.secure_sums),
               "faults.stale_replies": sc.faults.stale_replies is not None,
               "faults.sampling": sc.faults.sampling is not None and sc.faults.sampling.fraction < 1.0}
    for other, on in clashes.items():
        if on:
            raise scenario_error(sc, key, f"cannot be combined with {other} (a buffered step takes the updates "
                                          "that arrived, whenever they were asked for)")
    if cfg.buffer > part.n_clients:
        raise scenario_error(sc, key, f"buffer {cfg.buffer} is more than the {part.n_clients} clients")
    if sc.devices is None and not any(name == "stragglers" for name, _ in kinds.entries(sc.faults)):
        # every update would arrive at virtual time 0: the lowest client ids would fill every buffer
        raise scenario_error(sc, key, "needs clients that take different times: give a devices block (speeds, "
                                      "links) or stragglers (faults.stragglers.fraction > 0, or the kind in "
                                      "faults.kinds); without either every update arrives at once and the same "
                                      "clients fill every buffer")
    if sc.faults.min_clients > cfg.buffer:
        raise scenario_error(sc, "faults.min_clients", f"{sc.faults.min_clients} is more than the {cfg.buffer} updates "
                                                       "a buffered step takes (faults.asynchronous.buffer)")


ACTOR_BYTES = 150 * 10**6  # resident memory of one Ray actor process with numpy and scikit-learn loaded
ACTORS_PER_CPU = 64  # beyond this many actor processes a core, start-up alone takes minutes
SECAGG_PAIR_BYTES = 400  # key agreement, encrypted shares and bookkeeping per pair of clients, over the set-up


def _check_machine_bounds(sc: Scenario, proto, part) -> None:
    """Refuse, before any actor or key starts, a run this machine cannot hold: more Ray actor
    processes than its cores and memory carry (an embedded instance), or a secure aggregation
    whose pairwise set-up does not fit in memory. Each error names the setting that fixes it."""
    import math
    import os

    n, rt = part.n_clients, sc.runtime
    avail = available_memory()
    cpus = os.cpu_count() or 1
    if rt.backend == "ray" and not rt.address:
        actors = math.ceil(n / rt.clients_per_actor) + 1  # + the server
        cap = ACTORS_PER_CPU * cpus
        if avail is not None:
            cap = min(cap, max(2, avail // ACTOR_BYTES))
        if actors > cap:
            per = math.ceil(n / max(1, cap - 1))
            raise scenario_error(sc, "runtime.clients_per_actor",
                                 f"{rt.clients_per_actor} makes {actors} actor processes for {n} clients; this machine "
                                 f"({cpus} CPUs, {(avail or 0) / 1e9:.1f} GB available) holds at most {cap}: set "
                                 f"runtime.clients_per_actor to {per} or more (clients share an actor)")
    if sc.channel.secure_aggregation and proto.secure_sums:
        group = min(n, sc.channel.secagg_neighbours or n)
        need = n * group * SECAGG_PAIR_BYTES
        if avail is not None and need > avail // 2:
            fit = max(1, int((avail // 2) // (n * SECAGG_PAIR_BYTES)))
            raise scenario_error(sc, "channel.secagg_neighbours",
                                 f"secure aggregation among {group} of {n} clients needs about {need / 1e9:.1f} GB for "
                                 f"its pairwise set-up, more than half of the {avail / 1e9:.1f} GB available: set "
                                 f"channel.secagg_neighbours to {fit} or fewer (SecAgg+), or use fewer clients")


def _check_faults_fit(sc: Scenario, proto, part) -> None:
    """The scenario's faults name clients that exist and ask for no more clients than answer."""
    if sc.faults.inference_round and not proto.final_model:
        raise scenario_error(sc, "faults.inference_round", f"method {sc.method} ends with no final model to hand "
                                                            "to the clients (Protocol.final_model); leave it out")
    named = [(f"faults.{cls.shorthand}", cls.name, cls, cfg) for cls in kinds.REGISTRY.values()
             if (cfg := kinds.shorthand_config(cls, sc.faults)) is not None]
    listed = [(f"faults.kinds.{i}", e.kind, (cls := kinds.get_kind(e.kind)), cls.Config(**e.params()))
              for i, e in enumerate(sc.faults.kinds)]
    for key, name, cls, cfg in named + listed:
        lacks = sorted(cls.requires - proto.supports)
        if lacks:
            raise scenario_error(sc, key, f"fault kind {name!r} needs a method that declares "
                                          f"{', '.join(lacks)} (Protocol.supports); {sc.method} does not")
        why = cls.fits(cfg, part.n_clients) if cls.switched_on(cfg) else None
        if why:
            raise scenario_error(sc, key, why)
    if sc.faults.stale_replies is not None:
        if "stale_replies" not in proto.supports:
            raise scenario_error(sc, "faults.stale_replies", f"method {sc.method} does not use old replies "
                                                              "('stale_replies' in Protocol.supports); leave it out")
        if sc.channel.secure_aggregation:
            raise scenario_error(sc, "faults.stale_replies", "cannot be combined with channel.secure_aggregation "
                                                              "(a sum is taken over this round's inputs only)")
    _check_asynchronous(sc, proto, part)
    for c in availability_trace(sc) or {}:
        if c >= part.n_clients:
            raise scenario_error(sc, "faults.availability.path", f"the trace names client {c}, which does not exist "
                                                       f"(clients are 0..{part.n_clients - 1})")
    if sc.faults.min_clients > part.n_clients:
        raise scenario_error(sc, "faults.min_clients", f"{sc.faults.min_clients} is more than the {part.n_clients} clients")
    sampling = sc.faults.sampling
    if sampling is not None and sampling.fraction < 1.0:
        if proto.partition != "horizontal":
            raise scenario_error(sc, "faults.sampling", f"client sampling is for horizontal methods; {sc.method} is vertical "
                                              "(every view's client takes part in every round)")
        asked = max(1, int(round(sampling.fraction * part.n_clients)))
        if sc.faults.min_clients > asked:
            raise scenario_error(sc, "faults.min_clients", f"{sc.faults.min_clients} is more than the {asked} clients "
                                                 f"faults.sampling asks per round")
        _check_sampled_secure_aggregation(sc, asked, part.n_clients)
