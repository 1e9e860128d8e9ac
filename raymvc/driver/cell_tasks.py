"""Cells as Ray tasks: one study cell simulated in-process inside one Ray task.

``raymvc sweep --backend ray --cells tasks`` sends every cell (scenario, grid point, seed)
to the cluster as a task that reserves the cell's CPUs (``runtime.threads``; one GPU when
the method's ``params.device`` is ``cuda``) and runs the whole federation in that
task's process, on the in-process backend. A study then spreads over every node of a
cluster (tasks are scheduled with Ray's ``SPREAD`` strategy), pays no actor start-up per
cell, and gives the same results as ``--backend local``: the cells are the same
in-process runs, with the same fingerprints.

The task writes the run folder in a temporary folder of its node and hands its files
back; the driver writes them into the sweep folder (nodes share no file system). The
summary gains ``cell: {executor: ray-task, node: <Ray node id>}``. A task whose worker
or node dies is run again by Ray (``max_retries``); an error inside the run is the run's
own result (``failed`` or ``error``), never retried.

What this executor does not simulate: client actors on separate processes or nodes, so
a node lost in the middle of a run, real network delays or actor crashes. Use the
per-client actors (``--cells actors``, the default on Ray) for those.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

TASK_RETRIES = 2  # a cell whose worker or node died is run again, at most this often

_REMOTE: dict[str, Any] = {}


def run_cell_here(sc, run_name: str, search: list[str]) -> tuple[dict, dict[str, bytes], str]:
    """The body of a cell's task: run ``sc`` in this process into a temporary folder and
    return (summary, the run folder's files by relative path, the Ray node id or "")."""
    from .. import protocols
    from ..scenario import ScenarioError
    from . import run_scenario

    for folder in search:  # where the driver found user methods
        protocols.add_search_path(folder)
    node = ""
    try:
        import ray

        if ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
    except Exception:
        node = ""
    tmp = Path(tempfile.mkdtemp(prefix="raymvc-cell-"))
    try:
        run_dir = tmp / run_name
        try:
            summary = run_scenario(sc, run_dir, overwrite=True, progress=lambda line: None)
        except ScenarioError as e:  # most often a file the driver's machine has and this node has not
            raise ScenarioError(f"{e} (on node {node[:12] or 'unknown'}: a cell runs on whichever node Ray picks, "
                                "which must see the scenario's files at the same paths)") from None
        files = {p.relative_to(run_dir).as_posix(): p.read_bytes()
                 for p in sorted(run_dir.rglob("*")) if p.is_file() and not p.name.startswith(".")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary, files, node


def task_resources(sc) -> dict[str, float]:
    """What one cell's task reserves: its threads as CPUs, one GPU for a CUDA method."""
    res: dict[str, float] = {"num_cpus": float(max(1, sc.runtime.threads))}
    if str((sc.params or {}).get("device", "")).startswith("cuda"):
        res["num_gpus"] = 1.0
    return res


def submit(sc, run_name: str, search: list[str]):
    """Start a cell's task; returns its ``ObjectRef`` (``ref.future()`` waits for
    :func:`run_cell_here`'s result)."""
    import ray

    if "task" not in _REMOTE:
        _REMOTE["task"] = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)(run_cell_here)
    task = _REMOTE["task"].options(scheduling_strategy="SPREAD", **task_resources(sc))
    return task.remote(sc, run_name, search)


def cancel(refs, force: bool = False) -> None:
    """Ask Ray to stop the tasks behind ``refs`` (a signal stopped the sweep); ``force``
    (a second signal): kill their worker processes."""
    import ray

    for ref in refs:
        try:
            ray.cancel(ref, force=force)
        except Exception:  # already finished or gone: nothing to stop
            pass


__all__ = ["run_cell_here", "submit", "task_resources", "cancel", "TASK_RETRIES"]
