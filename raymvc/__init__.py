"""raymvc: federated multi-view clustering as message passing between Ray actors.

The Python API (details in each name's docstring)::

    import raymvc
    r = raymvc.run("scenarios/hw-cefmc.yaml", backend="local")   # -> RunResult
    r.status, r.metrics["acc"], r.labels, r.communication["mb_total"], r.rounds, r.ledger
    s = raymvc.sweep("scenarios/hw-cefmc.yaml", grid={"faults.dropout.rate": [0, 0.3]},
                     seeds=range(3), out="runs/my-sweep")            # -> SweepResult
    raymvc.run({...}, data=raymvc.MultiViewData(views=[X0, X1]))     # data held in memory
    raymvc.testing.check_protocol("mylab.mymethod")                  # a method of your own

The command line (``raymvc run | sweep | ...``) is a thin layer over the same calls.
Names are imported on first use, so ``import raymvc`` stays cheap in every actor. Importing
raymvc pins the numerical libraries' code paths (:mod:`raymvc.arithmetic`; import raymvc
before numpy and torch, or set ``RAYMVC_ARITHMETIC=native`` to leave them free).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

from . import arithmetic as _arithmetic

# before anything of raymvc imports numpy or torch: their code paths are chosen when they load
_arithmetic.apply()

try:  # the version lives in pyproject.toml only
    __version__ = _installed_version("raymvc")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

_API = {"run", "sweep", "RunResult", "SweepResult", "MultiViewData", "Messages"}


def __getattr__(name: str):
    import importlib

    if name in _API:
        return getattr(importlib.import_module("raymvc.api"), name)
    if name == "testing":
        return importlib.import_module("raymvc.testing")
    if name in ("load_scenario", "Scenario", "ScenarioError"):
        return getattr(importlib.import_module("raymvc.scenario"), name)
    raise AttributeError(f"module 'raymvc' has no attribute {name!r}")


__all__ = ["run", "sweep", "RunResult", "SweepResult", "MultiViewData", "Messages", "testing", "load_scenario",
           "Scenario", "ScenarioError", "__version__"]
