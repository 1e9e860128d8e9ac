"""raymvc as a library: run a scenario or a sweep from Python and get typed results.

::

    import raymvc

    r = raymvc.run("scenarios/hw-cefmc.yaml", backend="local")
    r.metrics["acc"], r.labels.shape, r.communication["mb_total"]

    X0, X1 = ...  # two views of the same samples, rows = samples
    r = raymvc.run({"name": "mine", "method": "cefmc", "data": {"n_clusters": 3}},
                   data=raymvc.MultiViewData(views=[X0, X1]), backend="local")

A run writes the same folder as ``raymvc run`` (``out``, by default
``runs/<name>-<time>``); :class:`RunResult` is read back from it, so a result held in
Python and one on disk are the same thing (:meth:`RunResult.load`).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .results.folder import csv_value
from .results.runfolder import RunFolder
from .results.status import Status
from .results.summary import RunSummary
from .runtime.records import RoundRecord
from .scenario import Scenario, ScenarioError, as_overrides, load_scenario, merge_overrides, scenario_from_dict


@dataclass
class MultiViewData:
    """Data held in memory, in place of a scenario's ``data.path`` or ``data.dataset``.

    ``views``: one ``(n, d_v)`` array per view, rows in the same sample order; a row of
    NaN means the view is absent for that sample (or give ``present``, an ``(n, V)``
    bool mask). ``labels`` (optional) are ground truth, used only to score; without them
    the scenario must give ``data.n_clusters`` and the run reports label-free scores.
    Checked like a data file: finite values where present, matching row counts.
    """

    views: Sequence[Any]
    labels: Any = None
    present: Any = None
    view_names: Sequence[str] | None = None
    name: str = "memory"

    def dataset(self):
        """The checked :class:`~raymvc.data.types.MultiViewDataset` (a ``ValueError`` names what is wrong)."""
        from .data import DataError
        from .data.assemble import assemble

        views = [np.asarray(v) for v in self.views]
        if not views:
            raise ValueError("MultiViewData: no views")
        try:
            ds = assemble(Path(self.name), views, None if self.labels is None else np.asarray(self.labels),
                           None if self.present is None else np.asarray(self.present), None,
                           list(self.view_names) if self.view_names else None)
        except DataError as e:
            raise ValueError(f"MultiViewData: {str(e).removeprefix(self.name + ': ')}") from None
        h = hashlib.sha256()
        for a in (*ds.views, ds.labels, *(() if ds.present is None else (ds.present,))):
            h.update(np.ascontiguousarray(a).tobytes())
        ds.source = f"memory:{h.hexdigest()[:16]}"
        return ds


@dataclass
class Messages:
    """The ledger (``messages.csv``): one record per message, as dicts of typed values.

    It holds every path: the protocol's messages (``path`` ``protocol``, what
    ``communication.messages`` counts), the evaluation path's (``eval``: labels fetched to
    score) and the key handshake's (``setup``), so ``len(ledger)`` is more than the
    summary's count; :meth:`on` keeps one path."""

    records: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.records)

    def on(self, path: str) -> Messages:
        """The messages of one path (``protocol``, ``eval``, ``setup``)."""
        return Messages([r for r in self.records if r.get("path") == path])

    def __iter__(self):
        return iter(self.records)

    def to_pandas(self):
        """A ``pandas.DataFrame`` of the records (pandas is not a dependency: install it to use this)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Messages.to_pandas needs pandas: pip install pandas") from None
        return pd.DataFrame.from_records(self.records)


@dataclass
class RunResult:
    """One run's results, as ``raymvc run`` writes them.

    ``status``: a :class:`~raymvc.results.status.Status` -- ``completed``, ``degraded``
    (injected faults only), ``failed``, ``error`` (a party's code raised) or
    ``interrupted``. ``metrics``: the scores (``None`` when the run produced no labels).
    ``labels``: one cluster per sample, ``-1`` where no label came back. ``rounds``: the
    round records (``rounds.jsonl``). ``ledger``: every message. ``summary``: a
    :class:`~raymvc.results.summary.RunSummary` (typed fields, and a read-only mapping over the
    whole ``summary.json``).
    """

    status: Status
    metrics: dict[str, float] | None
    labels: np.ndarray
    communication: dict[str, Any]
    rounds: list[RoundRecord]
    ledger: Messages
    faults: dict[str, Any]
    out: Path
    summary: RunSummary = field(repr=False)

    @classmethod
    def load(cls, out: str | Path) -> RunResult:
        """Read a run folder written by ``raymvc run`` or :func:`run`."""
        folder = RunFolder(out)
        summary = folder.summary()
        return cls(status=summary.status, metrics=summary.metrics, labels=folder.labels(),
                   communication=summary.get("communication", {}), rounds=folder.rounds(),
                   ledger=Messages(folder.ledger()), faults=summary.faults, out=folder.path, summary=summary)


def _scenario(scenario: str | Path | Mapping | Scenario, overrides: dict[str, Any], in_memory: bool = False) -> Scenario:
    if in_memory and isinstance(scenario, Mapping):  # the data comes with the call: name it in the scenario
        data = dict(scenario.get("data") or {})
        if data.get("dataset") is None and data.get("path") is None:
            data["dataset"] = "memory"
        scenario = {**scenario, "data": data}
    if isinstance(scenario, Scenario):
        import yaml

        raw = yaml.safe_load(scenario.to_yaml())
        return scenario_from_dict(raw, source=scenario.source, overrides=overrides)
    if isinstance(scenario, Mapping):
        return scenario_from_dict(dict(scenario), overrides=overrides)
    return load_scenario(scenario, overrides)


@contextlib.contextmanager
def _api_words():
    """A scenario error as the Python API's caller wrote the cause: ``overrides`` and ``grid``
    where the command line's message says ``--set`` and ``--grid``."""
    try:
        yield
    except ScenarioError as e:
        text = str(e)
        said = re.sub(r"(^|: )--(set|grid) ", lambda m: m.group(1) + ("overrides " if m.group(2) == "set" else "grid "),
                      text)
        if said == text:
            raise
        raise ScenarioError(said) from None


def _progress(show: bool):
    if show:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return lambda line: None


def run(scenario: str | Path | Mapping | Scenario, *, data: MultiViewData | None = None,
        overrides: Mapping[str, Any] | Sequence[str] | None = None, out: str | Path | None = None,
        backend: str | None = None, progress: bool = False, overwrite: bool = False) -> RunResult:
    """Run one scenario and return its :class:`RunResult`.

    ``scenario``: a YAML file, a dict with the same keys, or a
    :class:`~raymvc.scenario.Scenario`. ``data``: arrays held in memory instead of the
    scenario's data set. ``overrides``: key -> value (``{"faults.dropout.rate": 0.2}``),
    as ``--set`` applies them (a list of ``"key=value"`` strings is parsed first).
    ``backend``: ``"local"`` (in-process) or ``"ray"``; default: the scenario's.
    ``out``: the run folder (default ``runs/<name>-<time>``; one raymvc wrote before is
    replaced with ``overwrite=True``, as ``--overwrite``). A bad scenario or bad data
    raises :class:`~raymvc.scenario.ScenarioError` (or ``ValueError`` for ``data``).
    """
    from .data.prepare import prepare
    from .driver import run_scenario
    from .results.folder import default_out_dir

    with _api_words():
        sets = merge_overrides(as_overrides(overrides), {"runtime.backend": backend} if backend else {})
        sc = _scenario(scenario, sets, in_memory=data is not None)
        prepared = prepare(sc, dataset=data.dataset()) if data is not None else None
        out = Path(out) if out is not None else default_out_dir(sc.name)
        summary = run_scenario(sc, out, progress=_progress(progress), prepared=prepared, overwrite=overwrite)
    return RunResult.load(summary["out_dir"])


@dataclass
class SweepResult:
    """A sweep's results: ``runs`` (one dict per run, the columns of ``sweep.csv``),
    ``aggregate`` (mean and std over seeds per grid point, ``aggregate.csv``), ``out``."""

    runs: list[dict[str, Any]]
    aggregate: list[dict[str, Any]]
    out: Path

    @classmethod
    def load(cls, out: str | Path) -> SweepResult:
        out = Path(out)

        def rows(name: str) -> list[dict[str, Any]]:
            if not (out / name).is_file():
                return []
            with open(out / name, newline="") as fh:
                return [{k: csv_value(v) for k, v in r.items()} for r in csv.DictReader(fh)]

        return cls(runs=rows("sweep.csv"), aggregate=rows("aggregate.csv"), out=out)

    def to_pandas(self, aggregate: bool = False):
        """The runs (or, with ``aggregate``, the aggregate) as a ``pandas.DataFrame``, one row
        per run or grid point (pandas is not a dependency: install it to use this)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("SweepResult.to_pandas needs pandas: pip install pandas") from None
        return pd.DataFrame.from_records(self.aggregate if aggregate else self.runs)

    def to_latex(self) -> str:
        """The aggregate as a LaTeX ``tabular`` to paste, as ``raymvc report OUT --format latex``
        prints it: mean ± std of each score per scenario and grid point, the best in bold."""
        return self._table("latex")

    def to_markdown(self) -> str:
        """The aggregate as a Markdown table (``raymvc report OUT --format markdown``)."""
        return self._table("markdown")

    def _table(self, fmt: str) -> str:
        from .study.sweep import read_sweep
        from .study.tables import sweep_table

        meta, _, agg = read_sweep(self.out)
        return sweep_table(agg, list(meta.get("grid_keys") or []), fmt,
                           f"{self.out.name}: mean ± std over the seeds of the runs that finished")

    def result(self, i: int) -> RunResult:
        """The full :class:`RunResult` of run ``i`` of ``runs``."""
        run_dir = Path(str(self.runs[i]["run_dir"]))
        return RunResult.load(run_dir if run_dir.is_absolute() else self.out / run_dir)


def sweep(scenarios: str | Path | Sequence[str | Path], *, grid: Mapping[str, Sequence[Any]] | None = None,
          seeds: Sequence[int] | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None,
          out: str | Path | None = None,
          jobs: int | None = None, backend: str | None = None, progress: bool = False,
          fresh_actors: bool = False, only: Sequence[str] | None = None, cells: str = "actors",
          address: str | None = None, allow_uncommitted: bool = False) -> SweepResult:
    """Run every scenario at every grid point and seed, as ``raymvc sweep`` does (same
    folder layout; rerunning into ``out`` reuses the cells that still stand).

    ``grid``: ``{"faults.dropout.rate": [0, 0.3]}``; ``seeds``: e.g. ``range(5)``
    (default: each scenario's own seed); ``overrides`` as for :func:`run`. ``jobs``: runs at once (default: one with the
    local backend, as many as the cluster holds on Ray); on Ray the actors are kept from one
    run to the next unless ``fresh_actors``; ``cells="tasks"`` runs each cell as one Ray
    task simulating in-process instead (on the cluster at ``address``, or an embedded Ray).
    A study file (``studies/X.yaml``) brings its own scenarios, grid and seeds; its folder
    defaults to ``runs/studies/X``, and ``only`` picks some of its runs by id (as
    ``raymvc sweep --only``). A study file runs only where git holds it and its scenarios
    committed unchanged (its seeds come before its runs); ``allow_uncommitted`` waives
    that, and its cells then record ``uncommitted`` (``raymvc sweep --allow-uncommitted``).
    """
    from .study.sweep import SweepRequest

    picked = ((only,) if isinstance(only, str) else tuple(only)) if only else ()
    with _api_words():
        return _sweep(SweepRequest.build(scenarios, grid=grid, seeds=seeds, overrides=as_overrides(overrides),
                             out=str(out) if out is not None else None, jobs=None if jobs is None else int(jobs),
                             backend=backend, address=address, cells=cells, fresh_actors=fresh_actors,
                             only=picked, quiet=not progress, allow_uncommitted=allow_uncommitted), progress)


def _sweep(req, progress: bool) -> SweepResult:
    from .study.sweep import run_sweep

    with contextlib.nullcontext() if progress else contextlib.redirect_stdout(io.StringIO()):
        code, folder = run_sweep(req)  # prints its aggregate table: shown only with progress
    if code == 130:
        raise KeyboardInterrupt(f"sweep stopped by a signal; the finished runs are in {folder}")
    return SweepResult.load(folder)


__all__ = ["MultiViewData", "Messages", "RunResult", "SweepResult", "run", "sweep"]
