"""The floor under a run on Ray: Ray alone, with as many empty actors as the run has parties.

``python -m raymvc.bench.floor N CPUS CLIENT_CPUS`` imports Ray, starts an embedded
instance the way raymvc does (``address="local"``, no dashboard, a token of this
process's own), starts one actor asking for 1 CPU (the server) and ``N - 1`` asking for
``CLIENT_CPUS``, calls each once, prints its timings as one JSON line and exits the way
the ``raymvc`` command does (autoscaler monitor killed first, Ray shut down, no module
teardown). The actors import nothing of raymvc, so a run's time above this process's
time is what raymvc itself costs. :func:`ray_alone` runs it and times the whole process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def ray_alone(n_actors: int, cpus: int, client_cpus: float) -> dict:
    """Run the floor process; its timings plus ``process_s`` and ``exit_s`` (after its line)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "raymvc.bench.floor", str(n_actors), str(cpus), str(client_cpus)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tempfile.gettempdir())
    line = proc.stdout.readline()
    t_line = time.perf_counter()
    proc.stdout.read()
    if proc.wait() != 0 or not line.strip():
        raise RuntimeError("the Ray-alone process failed")
    t_end = time.perf_counter()
    return {**json.loads(line), "process_s": t_end - t0, "exit_s": t_end - t_line}


def main(argv: list[str]) -> None:
    import secrets

    t0 = time.perf_counter()
    import ray

    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))  # nothing written to ~/.ray
    n, cpus, client_cpus = int(argv[0]), int(argv[1]), float(argv[2])
    t1 = time.perf_counter()
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False,
             configure_logging=False)
    t2 = time.perf_counter()

    class Empty:
        def ping(self) -> int:
            return 1

    actors = [ray.remote(num_cpus=1.0 if i == 0 else client_cpus)(Empty).remote() for i in range(n)]
    ray.get([a.ping.remote() for a in actors])
    t3 = time.perf_counter()
    print(json.dumps({"outside_s": t1 - t0, "ray_init_s": t2 - t1, "startup_s": t3 - t2}), flush=True)
    node = ray._private.worker._global_node  # as raymvc.runtime.cluster.stop_embedded does
    for info in node.all_processes.get("monitor", []):
        info.process.kill()
    ray.shutdown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
