"""A broadcast encoded once and put in Ray's object store once, against one copy per client.

The server endpoint sends one message (a float32 array of ``--mb`` MB, no encryption,
no compression) to ``--clients`` clients, one echo actor each, through the engine's own
path: ``Endpoint.encode`` / ``Endpoint.seal`` and ``RayTransport.exchange``. The actors
receive every frame's header and body as the client pools do and answer with a short
frame. Two ways, alternating:

- ``once``: what the engine does -- one encoding for all recipients, frames sharing one
  body, the body put in the object store once and passed by reference;
- ``per client``: each frame encoded on its own and passed by value, so Ray copies each
  actor's body into the object store itself (what the engine did before).

Reports the median time of one exchange (seal + send + all replies back) and how many
MB of bodies go into the object store per exchange (counted: bodies x size, not read
from Ray). Writes ``benchmarks/broadcast_once.md``.

    python benchmarks/broadcast_once.py --clients 8 --mb 4
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--mb", type=float, default=4.0, help="size of the broadcast array (MB = 10**6 bytes)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--md", type=Path, default=ROOT / "benchmarks" / "broadcast_once.md")
    args = ap.parse_args(argv)

    import ray

    from raymvc.bench.machine import cpu_model
    from raymvc.channel import Endpoint
    from raymvc.messages import Message
    from raymvc.runtime import transport
    from raymvc.runtime.transport import RayPools, RayTransport

    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))  # this process's own; nothing on disk
    tmp = tempfile.mkdtemp(prefix="rmvc-bo-", dir="/tmp")
    n = args.clients
    ray.init(address="local", num_cpus=max(2, n), include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=tmp)
    try:
        @ray.remote(num_cpus=0.25)
        class Echo:
            def deliver(self, frames, *shared):
                out = {}
                for cid, (header, body) in frames.items():
                    body = shared[body] if isinstance(body, int) else body
                    out[cid] = ("ok", bytes(header) + bytes(body[:32]), None, 0.0)
                return out

        handles = {c: Echo.remote() for c in range(n)}
        tr = RayTransport(RayPools(handles=handles, owner={c: c for c in range(n)}, sizes={c: 1 for c in range(n)}),
                          timeout_s=120.0)
        server = Endpoint("server")
        for c in range(n):
            server.add_peer(f"client:{c}", None)
        rng = np.random.default_rng(0)
        msg = Message("weights", w=rng.standard_normal(int(args.mb * 1e6 / 4)).astype(np.float32))
        default_min = transport.SHARE_MIN_BYTES

        def exchange(mode: str, rnd: int) -> float:
            t = time.perf_counter()
            if mode == "once":
                transport.SHARE_MIN_BYTES = default_min
                enc = server.encode(msg)
                frames = {c: server.seal(f"client:{c}", rnd, msg, encoded=enc).parts for c in range(n)}
            else:
                transport.SHARE_MIN_BYTES = 2**62  # never shared: Ray copies each call's body itself
                frames = {c: server.seal(f"client:{c}", rnd, msg).parts for c in range(n)}
            out = tr.exchange(frames)
            assert all(o.status == "ok" for o in out.values())
            return time.perf_counter() - t

        exchange("once", 0)  # warm up the actors
        exchange("per client", 0)
        times: dict[str, list[float]] = {"once": [], "per client": []}
        for i in range(args.repeat):
            for mode in ("once", "per client") if i % 2 == 0 else ("per client", "once"):
                times[mode].append(exchange(mode, i + 1))
        transport.SHARE_MIN_BYTES = default_min
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    body_mb = server.encode(msg).payload_bytes / 1e6
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    store = {"once": body_mb, "per client": n * body_mb}
    lines = [
        "# A broadcast encoded once and put in the object store once",
        "",
        f"- command: `python benchmarks/broadcast_once.py --clients {n} --mb {args.mb:g}`",
        f"- machine: {os.cpu_count()} cores ({cpu_model()})",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- {n} echo actors, one per client; a {body_mb:.2f} MB body; medians of {args.repeat} exchanges per way, "
        "ways alternating; an exchange = seal for every client + send + every reply back",
        "",
        "| way | ms per exchange (median) | bodies put in the object store per exchange, MB (count x size) |",
        "|---|---|---|",
        *(f"| {k} | {med[k]:.1f} | {store[k]:.1f} |" for k in med),
        "",
        f"Ratio once / per client: {med['once'] / med['per client']:.2f} (time), {1 / n:.2f} (bodies in the object "
        "store). The time saved is the encodings and the copies together.",
        "",
        "Sharing is decided when the message is sealed, by identity: the server encodes messages with "
        "the same kind and the same array objects once (`raymvc.runtime.nodes.broadcast_key`), so "
        "nothing is hashed or compared, and frames keep header and body apart up to the client's "
        "`Endpoint.open`. An earlier version (commits 3912136 and 867ac44, reverted) found shared "
        "bodies by slicing and hashing every joined frame and measured 1.8x slower than per-actor copies.",
    ]
    text = "\n".join(lines) + "\n"
    args.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
