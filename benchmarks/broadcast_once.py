"""A broadcast body in Ray's object store once vs once per actor: time of one exchange.

The server seals one message (a float32 array of ``--mb`` MB, no encryption) for each of
``--clients`` clients, and ``RayTransport.exchange`` sends the frames to echo actors (one
per client) that answer with a short frame. Alternating runs with the shared body on
(default) and off (``SHARE_MIN_BYTES`` above the body size, so each actor's frame is its
own object, as before); medians of ``--repeat`` exchanges each; writes
``benchmarks/broadcast_once.md``.

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
    ap.add_argument("--mb", type=float, default=4.0, help="size of the broadcast array")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--md", type=Path, default=ROOT / "benchmarks" / "broadcast_once.md")
    args = ap.parse_args(argv)

    import ray

    from raymvc.channel import Endpoint
    from raymvc.messages import Message
    from raymvc.runtime import transport
    from raymvc.runtime.transport import RayPools, RayTransport, join_frames

    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    tmp = tempfile.mkdtemp(prefix="rmvc-bo-", dir="/tmp")
    ray.init(address="local", num_cpus=max(2, args.clients), include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=tmp)

    @ray.remote(num_cpus=0.5)
    class Echo:
        def deliver(self, frames):
            return {cid: ("ok", f[:64], None, 0.0) for cid, f in frames.items()}

        def deliver_parts(self, plan, *shared):
            return self.deliver(join_frames(plan, shared))

    n = args.clients
    pools = RayPools(handles={c: Echo.remote() for c in range(n)}, owner={c: c for c in range(n)}, sizes={c: 1 for c in range(n)})
    tr = RayTransport(pools, timeout_s=120.0)
    server = Endpoint("server")
    for c in range(n):
        server.add_peer(f"client:{c}", None)
    msg = Message("weights", w=np.zeros(int(args.mb * 2**20 / 4), dtype=np.float32))
    default_min = transport.SHARE_MIN_BYTES
    times: dict[str, list[float]] = {"shared": [], "per actor": []}
    tr.exchange({c: server.seal(f"client:{c}", 0, msg).frame for c in range(n)})  # warm up the actors
    for i in range(args.repeat):
        for mode in ("shared", "per actor") if i % 2 == 0 else ("per actor", "shared"):
            transport.SHARE_MIN_BYTES = default_min if mode == "shared" else 2**62
            frames = {c: server.seal(f"client:{c}", i + 1, msg).frame for c in range(n)}
            t = time.perf_counter()
            tr.exchange(frames)
            times[mode].append(time.perf_counter() - t)
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    lines = [
        "# A broadcast body in the object store once",
        "",
        f"`python benchmarks/broadcast_once.py --clients {n} --mb {args.mb}` ({time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores, medians of {args.repeat} alternating exchanges; echo actors, one per client).",
        "",
        "| body | ms per exchange (median) |",
        "|---|---|",
        *(f"| {k} | {v:.1f} |" for k, v in med.items()),
        "",
        f"Ratio shared / per actor: {med['shared'] / med['per actor']:.2f}.",
    ]
    text = "\n".join(lines) + "\n"
    args.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
