"""The driver: scenario -> data -> parties -> rounds -> results on disk.

``run_scenario`` loads and splits the data, starts the server and one client per
shard (Ray actors, or plain objects with ``runtime.backend: local``), lets the server
node drive the rounds, writes ``rounds.jsonl`` as they end, scores the labels and
writes ``summary.json`` and ``messages.csv``. Whatever fails after the run directory
exists -- a crashed client, a protocol error, too few replies -- the files are still
written, with ``status`` saying what happened.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..data import load_dataset, normalize
from ..data import partition as parts
from ..metrics import clustering_scores, label_free_scores
from ..protocols import get
from ..results import RunWriter, default_out_dir, format_summary
from ..scenario import Scenario, ScenarioError
from .nodes import ClientNode, ServerNode


def _err(sc: Scenario, key: str, msg: str) -> ScenarioError:
    where = f"{sc.source}: " if sc.source else ""
    return ScenarioError(f"{where}{key}: {msg}")


def prepare(sc: Scenario):
    """Load, normalise and split the data as the scenario says (no Ray needed).

    Every problem is raised as a :class:`ScenarioError` naming the key.
    """
    from ..data import DataError

    proto = get(sc.method)
    d = sc.data
    try:
        if d.path is not None:
            ds = load_dataset(path=str(sc.data_path()), views=d.views)
        elif d.dataset == "synthetic":
            s = d.synthetic
            ds = load_dataset("synthetic", n_samples=s.n_samples, n_views=s.n_views, dims=s.dims,
                              n_clusters=s.n_clusters, noise=s.noise, seed=sc.seed, views=d.views)
        else:
            ds = load_dataset(d.dataset, views=d.views)
    except DataError as e:
        raise _err(sc, "data.path" if d.path else "data.dataset", str(e)) from None
    except (KeyError, ValueError) as e:
        raise _err(sc, "data.dataset", str(e).strip("'\"")) from None
    if d.n_clusters is not None:
        ds.k = d.n_clusters
    elif not ds.has_labels:
        raise _err(sc, "data.n_clusters", f"{ds.name} has no labels; give the number of clusters (data.n_clusters: K)")
    if not ds.has_labels and (d.heterogeneity > 0):
        raise _err(sc, "data.heterogeneity", "a label-skewed split needs labels; this data has none")
    ds = normalize(ds, d.normalize)
    kind = d.partition or proto.partition
    if kind != proto.partition:
        raise _err(sc, "data.partition", f"method {sc.method} needs a {proto.partition} split, got {kind}")
    rng = np.random.default_rng([sc.seed, 1])
    try:
        if kind == "vertical":
            if d.n_clients is not None and d.n_clients != ds.n_views:
                raise _err(sc, "data.n_clients", f"a vertical split has one client per view ({ds.n_views}), got {d.n_clients}")
            mask = None
            if d.missing.rate > 0:
                mask = parts.missing_mask(ds.n_samples, ds.n_views, d.missing.rate, d.missing.pattern, rng,
                                          base=ds.present)
            part = parts.vertical(ds, rng, missing=mask)
            if d.unaligned > 0:
                part = parts.unalign(part, d.unaligned, rng)
        else:
            if ds.n_views != 1 and d.views is None:
                raise _err(sc, "data.views", f"{ds.name} has {ds.n_views} views; a horizontal split needs one "
                                             "(e.g. data.views: [4])")
            n_clients = d.n_clients or ds.n_clusters
            part = parts.horizontal(ds, n_clients, rng, heterogeneity=d.heterogeneity,
                                    dirichlet_alpha=d.dirichlet_alpha)
    except ValueError as e:
        if isinstance(e, ScenarioError):
            raise
        raise _err(sc, "data", str(e)) from None
    for c in sc.faults.crash:
        if c.client >= part.n_clients:
            raise _err(sc, "faults.crash", f"client {c.client} does not exist (clients are 0..{part.n_clients - 1})")
    if sc.faults.min_clients > part.n_clients:
        raise _err(sc, "faults.min_clients", f"{sc.faults.min_clients} is more than the {part.n_clients} clients")
    return ds, part


def _progress_default(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    """Joining an existing Ray cluster failed (one line, names runtime.address)."""


def _token_auth_if_available() -> None:
    """Ray 2.60 clusters started by `ray start --head` expect a token from every driver.

    When joining a cluster and a token is at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
    ~/.ray/auth_token), turn token mode on unless the user chose a mode already.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or \
            (Path.home() / ".ray" / "auth_token").is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when nothing listens at host:port (Ray itself retries for minutes)."""
    import socket

    if "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as e:
        raise ClusterError(f"runtime.address: cannot join the Ray cluster at {address}: "
                           f"nothing answers there ({e.__class__.__name__})") from None


def init_ray(sc: Scenario, n_clients: int) -> float:
    """Start (or join) Ray; returns the seconds it took (0 if already running)."""
    if sc.runtime.address:
        _token_auth_if_available()  # before Ray reads its configuration
    import ray

    if ray.is_initialized():
        return 0.0
    t = time.perf_counter()
    rt = sc.runtime
    kwargs = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    if rt.address:
        _check_reachable(rt.address)
        try:
            ray.init(address=rt.address, **kwargs)
        except Exception as e:  # ConnectionError, AuthenticationError, ...
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ClusterError(
                f"runtime.address: cannot join the Ray cluster at {rt.address}: {first}. With token "
                "authentication, give this driver the cluster's token (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            ) from None
    else:
        need = math.ceil(n_clients * rt.client_cpus + rt.server_cpus)
        # address="local": always a fresh embedded instance, even if `ray start` runs here.
        # Ray keeps its default (token mode on); only its notice about that is not shown.
        import logging

        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        ray.init(address="local", num_cpus=rt.num_cpus or max(os.cpu_count() or 1, need), **kwargs)
    return time.perf_counter() - t


def _spawn(sc: Scenario, part, ds) -> tuple[object, dict, Callable[[object], object], list]:
    """Create the parties; returns (server, clients, get, handles-to-kill)."""
    rt = sc.runtime
    ids = list(range(part.n_clients))
    common = dict(n_clients=part.n_clients, n_clusters=ds.n_clusters, channel=sc.channel.model_dump(),
                  seed=sc.seed, threads=rt.threads)
    srv_kw = dict(client_ids=ids, n_clusters=ds.n_clusters,
                  n_samples=part.n_samples if part.kind == "vertical" else None,
                  channel=sc.channel.model_dump(), faults=sc.faults.model_dump(), network=sc.network.model_dump(),
                  seed=sc.seed, reply_timeout_s=rt.reply_timeout_s, threads=rt.threads,
                  client_sizes={c: int(part.shards[c].n_local) for c in ids})
    if rt.backend == "local":
        clients = {c: ClientNode(c, sc.method, sc.params, part.shards[c], **common) for c in ids}
        server = ServerNode(sc.method, sc.params, clients, **srv_kw)
        return server, clients, (lambda x: x), []
    import ray

    ClientActor = ray.remote(num_cpus=rt.client_cpus, max_restarts=0)(ClientNode)
    ServerActor = ray.remote(num_cpus=rt.server_cpus, max_restarts=0)(ServerNode)
    clients = {c: ClientActor.remote(c, sc.method, sc.params, part.shards[c], **common) for c in ids}
    server = ServerActor.remote(sc.method, sc.params, clients, **srv_kw)
    return server, clients, ray.get, [server, *clients.values()]


class _Call:
    """Call a node method the same way on both backends."""

    def __init__(self, node, backend: str):
        self.node, self.remote = node, backend == "ray"

    def __call__(self, name: str, *args):
        if self.remote:
            import ray

            return ray.get(getattr(self.node, name).remote(*args))
        return getattr(self.node, name)(*args)


def run_scenario(sc: Scenario, out_dir: str | Path | None = None, *, progress: Callable[[str], None] | None = None,
                 prepared=None, on_round: Callable[[dict], None] | None = None) -> dict:
    """Run one scenario end to end and return its summary (also written to disk).

    ``on_round(record)``, if given, receives every round's record instead of the
    round's progress line (the command line draws its own progress from it).
    """
    progress = progress or _progress_default
    wall0 = time.perf_counter()
    ds, part = prepared or prepare(sc)
    ray_init_s = init_ray(sc, part.n_clients) if sc.runtime.backend == "ray" else 0.0
    out = Path(out_dir) if out_dir else default_out_dir(sc.name)
    writer = RunWriter(out)
    writer.scenario(sc.to_yaml())
    proto = get(sc.method)
    handles: list = []
    fin: dict | None = None
    protocol_s = startup_s = 0.0
    try:
        server, clients, _, handles = _spawn(sc, part, ds)
        call = _Call(server, sc.runtime.backend)
        t_start = time.perf_counter()
        connected = call("connect")  # waits for every actor to be up, then agrees keys
        startup_s = time.perf_counter() - t_start
        t0 = time.perf_counter()
        progress(f"[{sc.name}] {sc.method}: {len(connected)}/{part.n_clients} clients connected "
                 f"({sc.runtime.backend} backend)")
        call("begin")
        while True:
            rec = call("run_round")
            writer.round(rec)
            if on_round is not None:
                on_round(rec)
                if rec["done"]:
                    break
                continue
            info = rec.get("info") or {}
            extra = "".join(f" {k}={v:.6g}" for k, v in info.items() if isinstance(v, float))
            miss = f" missing={rec['missing']}" if rec["missing"] else ""
            progress(f"[{sc.name}] round {rec['round']}: {len(rec['replied'])} replies, "
                     f"{rec['wire_bytes'] / 1e6:.3f} MB{miss}{extra}")
            if rec["done"]:
                break
        fin = call("finish")
        protocol_s = time.perf_counter() - t0
    except Exception as e:  # keep whatever we have; the summary says what went wrong
        fin = fin or {"status": "failed", "error": f"{type(e).__name__}: {e}", "labels": None, "predictions": {},
                      "info": {}, "rounds": 0, "virtual_s": 0.0, "counts": {}, "crashed": [], "disconnected": [],
                      "client_errors": [], "ledger": None, "compute_s": 0.0}
    finally:
        if handles:
            import ray

            for h in handles:
                try:
                    ray.kill(h, no_restart=True)
                except Exception:
                    pass
    summary = _summarise(sc, ds, part, proto, fin, ray_init_s, protocol_s, time.perf_counter() - wall0, out)
    summary["timing"]["startup_s"] = startup_s
    writer.labels(_assemble_labels(part, fin), part.n_samples)
    if fin.get("ledger") is not None:
        writer.messages(fin["ledger"])
    writer.summary(summary)
    writer.close()
    return summary


def _assemble_labels(part, fin) -> np.ndarray | None:
    if fin.get("labels") is not None:
        return np.asarray(fin["labels"]).astype(np.int64)
    preds = fin.get("predictions") or {}
    if not preds:
        return None
    y = np.full(part.n_samples, -1, dtype=np.int64)
    for c, p in preds.items():
        y[part.rows[c]] = np.asarray(p, dtype=np.int64)
    return y


def _summarise(sc, ds, part, proto, fin, ray_init_s, protocol_s, wall_s, out) -> dict:
    labels = _assemble_labels(part, fin)
    metrics = metrics_labelled = None
    kappa = proto.partition == "horizontal"
    if labels is not None and not ds.has_labels:  # unlabelled data: label-free scores only
        metrics = label_free_scores(ds, labels, seed=sc.seed)
    elif labels is not None:
        metrics = clustering_scores(ds.labels, labels, kappa=kappa)
        has = labels >= 0
        if 0 < has.sum() < len(labels):  # some clients could not label: score the rest apart
            metrics_labelled = clustering_scores(ds.labels[has], labels[has], kappa=kappa)
    ledger = fin.get("ledger")
    empty = {"messages": 0, "data_bytes": 0, "payload_bytes": 0, "wire_bytes": 0, "bytes_up": 0, "bytes_down": 0, "mb_total": 0.0}
    comm = ledger.totals("protocol") if ledger is not None else empty
    counts = fin.get("counts") or {}
    crashed = list(fin.get("crashed") or [])
    disconnected = list(fin.get("disconnected") or [])
    status = fin.get("status")
    if status != "failed":
        troubled = crashed or disconnected or counts.get("dropped_replies") or counts.get("late_replies") \
            or counts.get("rejected_messages") or counts.get("client_errors")
        status = "degraded" if troubled else "completed"
    if labels is None and status != "failed":
        status = "failed"
    unlabelled = int(np.sum(labels < 0)) if labels is not None else part.n_samples
    summary = {
        "name": sc.name,
        "method": sc.method,
        "dataset": ds.name,
        "partition": part.kind,
        "n_samples": part.n_samples,
        "n_clients": part.n_clients,
        "n_clusters": ds.n_clusters,
        "seed": sc.seed,
        "backend": sc.runtime.backend,
        "status": status,
        "error": fin.get("error"),
        "rounds": fin.get("rounds", 0),
        "metrics": metrics,
        "unlabelled_samples": unlabelled,
        "metrics_labelled": metrics_labelled,
        "communication": comm,
        "communication_eval": ledger.totals("eval") if ledger is not None else empty,
        "communication_setup": ledger.totals("setup") if ledger is not None else empty,
        "per_client_bytes": ledger.per_client("protocol") if ledger is not None else {},
        "faults": {
            "dropped_replies": counts.get("dropped_replies", 0),
            "late_replies": counts.get("late_replies", 0),
            "crashed_clients": crashed,
            "rejected_messages": counts.get("rejected_messages", 0),
            "disconnected_clients": disconnected,
            "client_errors": fin.get("client_errors") or [],
        },
        "timing": {
            "wall_s": wall_s,
            "ray_init_s": ray_init_s,
            "protocol_s": protocol_s,
            "virtual_s": fin.get("virtual_s", 0.0),
            "client_compute_s": fin.get("compute_s", 0.0),
        },
        "protocol_info": fin.get("info") or {},
        "data_info": part.info,
        "out_dir": str(out),
    }
    return summary


__all__ = ["run_scenario", "prepare", "init_ray", "ClusterError", "format_summary"]
