"""Checks a method of your own must pass, the way scikit-learn's ``check_estimator`` checks
an estimator: ``raymvc.testing.check_protocol("mylab.mymethod")``.

The method runs with its ``quick_params`` on a small split of the kind it expects
(vertical: a synthetic three-view set; horizontal: 8x8 digits over three clients),
in-process, and must:

* ``completes``: finish with status ``completed``, no party raising, every sample labelled;
* ``deterministic``: give the same labels and the same ledger for the same seed;
* ``missing_reply``: survive client 0's reply missing in any single round (status
  ``degraded``, no error);
* ``labels_unseen``: give the same clusters when the ground truth is replaced by random
  labels (no party may use labels);
* ``analytic_bytes``: where it declares ``analytic_bytes``, match the ledger's data bytes;
* ``secure_sums``: where it declares sums, run with ``channel.secure_aggregation`` on and
  give the same labels.

The package's own methods pass the fuller suite in ``tests/test_conformance.py``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from .results.runfolder import RunFolder


def _scenario(name: str, proto, **values):
    from .scenario import scenario_from_dict

    if proto.partition == "vertical":
        data = {"dataset": "synthetic", "normalize": "zscore",
                "synthetic": {"n_samples": 150, "n_views": 3, "dims": [6, 8, 10], "n_clusters": 3, "noise": 0.6}}
    else:
        data = {"dataset": "digits", "partition": "horizontal", "n_clients": 3, "heterogeneity": 0.0}
    raw = {"name": "check", "method": name, "params": dict(proto.quick_params), "data": data,
           "runtime": {"backend": "local"}, "seed": 3}
    return scenario_from_dict(raw, values=values)


def _labels(s) -> np.ndarray:
    return RunFolder(s["out_dir"]).labels()


def _ledger(s) -> list[dict]:
    return RunFolder(s["out_dir"]).ledger()


def check_protocol(method, *, workdir: str | Path | None = None) -> list[str]:
    """Run the checks on ``method`` (a name, an import path, or an imported module that
    defines ``PROTOCOL``); returns the names of the checks it passed, or raises
    ``AssertionError`` listing every check it failed and why. Run folders go to
    ``workdir`` (default: a temporary folder, removed afterwards)."""
    from .data.prepare import prepare
    from .driver import run_scenario
    from .protocol import RunFacts
    from .protocols import get

    name = method if isinstance(method, str) else method.__name__
    proto = get(name)
    failed: list[str] = []
    passed: list[str] = []

    def check(label: str, ok: bool, why: str) -> bool:
        (passed.append(label) if ok else failed.append(f"{label}: {why}"))
        return ok

    with tempfile.TemporaryDirectory(prefix="raymvc-check-") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)

        def run(tag: str, prepared=None, **values) -> dict:
            return run_scenario(_scenario(name, proto, **values), root / tag, progress=lambda line: None,
                                prepared=prepared, overwrite=True)

        base = run("base")
        y = _labels(base)
        if not check("completes", base["status"] == "completed" and not base["errors"] and len(y) == base["n_samples"]
                     and bool((y >= 0).all()),
                     f"status {base['status']}, errors {base['errors'][:2]}, {int((y < 0).sum())} samples unlabelled"):
            raise AssertionError(f"{name} failed raymvc's protocol checks:\n  " + "\n  ".join(failed))
        again = run("again")
        check("deterministic", np.array_equal(_labels(again), y) and _ledger(again) == _ledger(base),
              "a second run with the same seed gave other labels or messages")
        bad = []
        for r in range(base["rounds"]):
            d = run(f"drop{r}", **{"faults.drop": [{"client": 0, "at_round": r}]})
            if d["status"] != "degraded" or d["errors"] or d["faults"]["dropped_replies"] != 1:
                bad.append(f"round {r}: {d['status']} {d['errors'][:1] or d['error'] or ''}")
        check("missing_reply", not bad, "; ".join(bad[:3]))
        sc = _scenario(name, proto)
        ds, part = prepare(sc)
        noise = np.random.default_rng(99).integers(0, ds.n_clusters, size=len(ds.labels))
        shuffled = run("random-labels", prepared=(dataclasses.replace(ds, labels=noise), part))
        check("labels_unseen", np.array_equal(_labels(shuffled), y),
              "other clusters when the ground truth was replaced by random labels")
        if proto.analytic_bytes is not None:
            ids = list(range(part.n_clients))
            facts = RunFacts(n_samples=part.n_samples, n_clusters=ds.n_clusters, client_ids=ids,
                             client_sizes={c: part.shards[c].rows_held for c in ids},
                             client_dims={c: int(part.shards[c].views[0].shape[1]) for c in ids},
                             rounds=base["rounds"])
            want = proto.analytic_bytes(sc.protocol_config(), facts)
            got = base["communication"]["data_bytes"]
            check("analytic_bytes", got == want, f"the ledger counts {got} data bytes, analytic_bytes says {want}")
        if proto.secure_sums:
            sec = run("secure", **{"channel.secure_aggregation": True})
            check("secure_sums", sec["status"] == "completed" and np.array_equal(_labels(sec), y),
                  f"with secure aggregation: {sec['status']} {sec['errors'][:1]}, labels "
                  f"{'equal' if np.array_equal(_labels(sec), y) else 'differ'}")
    if failed:
        raise AssertionError(f"{name} failed raymvc's protocol checks:\n  " + "\n  ".join(failed))
    return passed


__all__ = ["check_protocol"]
