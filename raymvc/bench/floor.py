"""The floor under a run on Ray: Ray alone, with as many empty actors as the run has parties.

``python -m raymvc.bench.floor N CPUS CLIENT_CPUS SERVER_CPUS [TIMEOUT [MODULES [SERVER_MODULES [DATA]]]]``
imports Ray, starts an
embedded instance the way raymvc does (``address="local"``, no dashboard, workers' output
not copied to the driver as with ``raymvc run --json``, a token of this process's own),
starts one actor asking for ``SERVER_CPUS`` (the server) and ``N - 1`` asking for
``CLIENT_CPUS`` (one per client actor), calls each once, prints its timings as one JSON
line and exits the way the ``raymvc`` command does (autoscaler monitor killed first, Ray
shut down, no module teardown). The actors import nothing of raymvc, so a run's time
above this process's time is what raymvc itself costs. ``MODULES`` (comma-separated, e.g.
``sklearn.cluster``) are imported by every actor as it starts: the libraries a method's
parties need whatever runs them, for a floor that includes them; ``SERVER_MODULES`` (if
given) are the server's instead, so that each party imports what its side needs. With
``DATA`` (an ``.npz`` whose numeric 2-D arrays are the views) the process also does what any run's driver
must: it loads the views, scales each row to unit length and hands one view to each
client actor as it starts (a vertical split). :func:`ray_alone` runs it and times the
whole process.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .timed import run_timed


def ray_alone(n_actors: int, cpus: int, client_cpus: float, server_cpus: float, timeout_s: float = 300.0,
              imports: tuple[str, ...] = (), server_imports: tuple[str, ...] | None = None,
              data: Path | None = None) -> dict:
    """Run the floor process. Returns ``outside_s`` (interpreter start and ``import ray``,
    timed from here), ``ray_init_s``, ``startup_s`` (actors up), ``exit_s`` (after its
    line) and ``process_s``."""
    root = Path(__file__).resolve().parents[2]  # this checkout first on the path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    run = run_timed([sys.executable, "-m", "raymvc.bench.floor", str(n_actors), str(cpus), str(client_cpus),
                     str(server_cpus), str(timeout_s), ",".join(imports),
                     ",".join(imports if server_imports is None else server_imports), str(data or "")],
                    last_line=lambda line: True, cwd=tempfile.gettempdir(), env=env)
    r = json.loads(run.answer)
    return {"outside_s": run.answer_s - r["ray_init_s"] - r["startup_s"], "ray_init_s": r["ray_init_s"],
            "startup_s": r["startup_s"], "exit_s": run.exit_s, "process_s": run.process_s}


def main(argv: list[str]) -> None:
    import secrets

    t0 = time.perf_counter()
    import ray

    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))  # nothing written to ~/.ray
    n, cpus, client_cpus, server_cpus = int(argv[0]), int(argv[1]), float(argv[2]), float(argv[3])
    timeout_s = float(argv[4]) if len(argv) > 4 else 300.0
    modules = [m for m in (argv[5] if len(argv) > 5 else "").split(",") if m]
    server_modules = [m for m in argv[6].split(",") if m] if len(argv) > 6 else modules
    views = _views(argv[7]) if len(argv) > 7 and argv[7] else []
    t1 = time.perf_counter()
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False,
             configure_logging=False, log_to_driver=False)
    t2 = time.perf_counter()

    class Empty:
        def __init__(self, mods, shard=None):
            import importlib

            for m in mods:
                importlib.import_module(m)
            self.rows = 0 if shard is None else len(shard)

        def ping(self) -> int:
            return 1

    def shard(i: int):
        return views[(i - 1) % len(views)] if i and views else None

    actors = [ray.remote(num_cpus=server_cpus if i == 0 else client_cpus)(Empty).remote(
        server_modules if i == 0 else modules, shard(i)) for i in range(n)]
    ray.get([a.ping.remote() for a in actors], timeout=timeout_s)
    t3 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "ray_init_s": t2 - t1, "startup_s": t3 - t2}), flush=True)
    node = ray._private.worker._global_node  # as raymvc.driver.cluster.stop_embedded does
    for info in node.all_processes.get("monitor", []):
        info.process.kill()
    ray.shutdown()
    sys.stdout.flush()
    os._exit(0)


def _views(path: str) -> list:
    """The views of an ``.npz`` (its numeric 2-D arrays, in the file's order), each row scaled
    to unit length."""
    import numpy as np

    out = []
    with np.load(path) as f:
        for k in f.files:
            x = f[k]
            if x.ndim == 2 and x.dtype.kind in "fiu":
                x = x.astype(np.float64)
                out.append(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
