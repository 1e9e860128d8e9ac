"""Run one small cell of FedDMVC, FCUIF, CCFC and EFIMVC in this process's environment and
print ``{method: [labels hash, arithmetic block]}`` as JSON (tests/test_arithmetic.py).

``python tests/arithmetic_cells.py local|ray OUT``. With ``ray``, Ray is started here
*before* raymvc is imported, from whatever environment the caller gave, as a cluster
someone else started would be: only the workers' ``runtime_env`` can pin them.
"""

from __future__ import annotations

import json
import os
import secrets
import sys

backend, out = sys.argv[1], sys.argv[2]
if backend == "ray":
    import ray

    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)

import raymvc  # noqa: E402  (after Ray, on purpose)
from raymvc.protocols import get  # noqa: E402
from raymvc.results.runfolder import RunFolder  # noqa: E402

HW = {"dataset": "handwritten", "partition": "vertical", "normalize": "none"}
CELLS = {
    "feddmvc": {"data": HW},
    "fcuif": {"data": {**HW, "missing": {"rate": 0.5, "pattern": "point"}}, "params": {"pretrain_epochs": 4}},
    "efimvc": {"data": {**HW, "normalize": "l2", "missing": {"rate": 0.3, "pattern": "point"}}},
    "ccfc": {"data": {"dataset": "digits", "partition": "horizontal", "n_clients": 3}},
}
found = {}
try:
    for method, cell in CELLS.items():
        params = {**get(method).quick_params, **cell.get("params", {})}
        sc = {"name": f"arith-{method}", "method": method, "params": params, "data": cell["data"],
              "runtime": {"backend": backend, "client_cpus": 0.25, "clients_per_actor": 6}, "seed": 3}
        r = raymvc.run(sc, out=os.path.join(out, method), progress=False)
        assert r.status == "completed", (method, r.status, r.summary.get("error"))
        found[method] = [RunFolder(r.out).labels_sha256(), r.summary["arithmetic"]]
finally:
    if backend == "ray":
        ray.shutdown()
print(json.dumps(found))
