"""Study files: a paper's table or figure as one YAML file that ``raymvc sweep`` runs.

A study names the scenarios to run (each a *run*: the paper's variant, the project's,
an ablation), the grid of overrides, the seeds and the paper's own numbers, so that one
command reproduces the experiment and one script of the repository (``tools/study_pages.py``) writes its page::

    study:
      paper: feddmvc                  # the page it belongs to: studies/feddmvc.md
      title: Overlap rate on HW
      source: Table 1                 # where the paper reports it
      seeds: 0-4
      grid: {data.missing.rate: [0.0, 0.5]}
      runs:
        - {id: paper, label: FedDMVC, variant: paper, scenario: ../scenarios/hw-feddmvc.yaml}
        - {id: ours, label: FedDMVC + standardised embeddings, variant: project,
           scenario: ../scenarios/hw-feddmvc.yaml, set: {params.standardize: 1.0}}
      paper_results:
        - {run: paper, at: {data.missing.rate: 0.5}, acc: 0.893, nmi: 0.824}
      spread: {run: paper, set: {runtime.threads: 2}}   # the same seeds, another platform setting
      # or several: spread: [{run: paper, set: {runtime.threads: 2}}, {run: paper, set: {params.device: cuda}}]

A *tuning* study checks a default on seeds the reported tables never use: its grid holds
the candidate values, ``tuning.default`` names the grid point the run's scenario resolves
to (``Study.check`` verifies that), and the page says which point scores best there::

      seeds: 100-102
      grid: {params.lr: [0.001, 0.002]}
      tuning: {run: paper, default: {params.lr: 0.001}, metric: acc}

``raymvc sweep studies/X.yaml`` runs every (run, grid point, seed), into ``runs/studies/X``
by default; each run's scenario gets the run's ``set`` values and its ``id`` as name, so
its cells are told apart in ``sweep.csv``. ``spread`` adds the named run once more for
each of its settings (thread count, device) to measure how far a seed's result moves
across platforms. A spread that sets ``params.device: cuda`` runs only where torch sees a
CUDA device (elsewhere ``raymvc sweep`` skips it and says so); ``raymvc sweep --only``
runs a subset of the runs, e.g. just that spread on a GPU machine.
Paths in a study file are relative to that file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..metrics import SCORES
from ..scenario import MAX_FILE_BYTES, ScenarioError, safe_yaml_load

METRIC_NAMES = tuple(SCORES)  # a study's metrics: any score a run reports (metrics.SCORES), or info.<key>
_INFO = re.compile(r"^info\.[A-Za-z][A-Za-z0-9_]{0,63}$")


def check_metric(name: str) -> str:
    """A study's metric: a score of :data:`raymvc.metrics.SCORES` (``acc``, ``kappa``, ...) or
    ``info.<key>``, a number the method reports in ``protocol_info``."""
    if name in SCORES or _INFO.match(name):
        return name
    raise ValueError(f"{name!r} is no score a run reports: one of {', '.join(SCORES)}, or info.<key> "
                     "for a number the method reports (protocol_info)")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
_PAPER = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")  # names studies/<paper>.md: never a path


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RunSpec(_Strict):
    id: str = Field(description="short name of the run; its cells' scenario name")
    label: str = Field(description="how tables and figures name it")
    variant: Literal["paper", "project", "ablation", "baseline"] = "paper"
    scenario: str
    set: dict[str, Any] = Field(default_factory=dict)
    seeds: str | int | None = Field(default=None, description="a subset of the study's seeds for this run "
                                    "alone (a run too slow for all of them); the page says so")

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError("letters, digits, '.', '_' or '-', at most 40, starting with a letter or digit")
        return v


class PaperResult(_Strict):
    run: str | None = None  # the run it stands beside (default: the first paper-variant run)
    method: str | None = None  # a label of its own, e.g. k-FED's row in the CCFC paper
    at: dict[str, Any] = Field(default_factory=dict)
    acc: float | None = None
    nmi: float | None = None
    ari: float | None = None
    mb: float | None = None
    kappa: float | None = None
    purity: float | None = None
    fscore: float | None = None


class SpreadSpec(_Strict):
    run: str
    set: dict[str, Any]
    label: str | None = None


def seed_list(seeds: str | list[int]) -> list[int]:
    """A study's ``seeds`` (``"0-4"`` or a list) as a list."""
    from .grid import parse_seeds

    if isinstance(seeds, bool):
        raise ValueError("seeds: a seed, a range like 0-4 or a list of seeds, not a truth value")
    return list(seeds) if isinstance(seeds, list) else parse_seeds(str(seeds), "seeds")


class ModeSpec(_Strict):
    """Two outcomes a study expects to see (e.g. two digits merged or not): each row counts
    its seeds on either side of ``split`` of ``metric``, declared before the runs."""

    metric: str = "acc"
    split: float
    below: str = Field(min_length=1, max_length=60)
    above: str = Field(min_length=1, max_length=60)

    _metric = field_validator("metric")(classmethod(lambda cls, v: check_metric(v)))


class TuningSpec(_Strict):
    run: str | None = None  # the run whose grid is tuned (default: the first run)
    default: dict[str, Any] = Field(min_length=1)
    metric: Literal["acc", "nmi", "ari"] = "acc"




class StudySpec(_Strict):
    paper: str
    title: str
    source: str = ""
    seeds: int | str | list[int] = "0-4"  # one seed, "0-4" or a list
    grid: dict[str, list] = Field(default_factory=dict)
    x: str | None = None
    x_label: str | None = None
    metrics: list[str] = Field(default_factory=lambda: ["acc", "nmi"], min_length=1)
    runs: list[RunSpec] = Field(min_length=1)
    paper_results: list[PaperResult] = Field(default_factory=list)
    spread: list[SpreadSpec] = Field(default_factory=list)  # one mapping or a list of them
    tuning: TuningSpec | None = None
    modes: ModeSpec | None = None
    readme: bool | Literal["mean"] = True  # rows in README's table; "mean": averaged over the grid per seed
    notes: str = ""

    @field_validator("paper")
    @classmethod
    def _paper(cls, v: str) -> str:
        if not _PAPER.match(v):
            raise ValueError(f"{v!r}: the page's name, lower-case letters, digits and '-' (e.g. feddmvc)")
        return v

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        return [check_metric(m) for m in v]

    @field_validator("spread", mode="before")
    @classmethod
    def _one_or_several(cls, v):
        return [] if v is None else [v] if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _consistent(self):
        ids = [r.id for r in self.runs]
        from .grid import check_size

        try:
            n_seeds = len(seed_list(self.seeds))
        except ScenarioError as e:
            raise ValueError(str(e)) from None
        try:
            check_size(len(self.runs) + len(self.spread), [len(v) for v in self.grid.values()], n_seeds)
        except ScenarioError as e:
            raise ValueError(f"grid: {e}") from None
        if len(set(ids)) != len(ids):
            raise ValueError(f"runs: two runs share the id {next(i for i in ids if ids.count(i) > 1)!r}")
        for key, vals in self.grid.items():
            if not vals:
                raise ValueError(f"grid.{key}: give at least one value")
        if self.x is not None and self.x not in self.grid:
            raise ValueError(f"x: {self.x!r} is not a grid key (grid: {', '.join(self.grid) or 'none'})")
        for i, pr in enumerate(self.paper_results):
            if pr.run is not None and pr.run not in ids:
                raise ValueError(f"paper_results.{i}.run: no run {pr.run!r} (runs: {', '.join(ids)})")
            for k in pr.at:
                if k not in self.grid:
                    raise ValueError(f"paper_results.{i}.at.{k}: not a grid key")
        for i, sp in enumerate(self.spread):
            if sp.run not in ids:
                raise ValueError(f"spread.{i}.run: no run {sp.run!r} (runs: {', '.join(ids)})")
        if self.tuning is not None:
            self._check_tuning(ids)
        every = set(seed_list(self.seeds))
        for r in self.runs:
            if r.seeds is not None and not set(seed_list(r.seeds)) <= every:
                raise ValueError(f"runs.{r.id}.seeds: {r.seeds} is not a subset of the study's seeds {self.seeds}")
        return self

    def spreads(self) -> list[SpreadSpec]:
        """The ``spread`` settings, in the file's order (a single mapping is a list of one)."""
        return list(self.spread)

    def _check_tuning(self, ids: list[str]) -> None:
        t = self.tuning
        if t.run is not None and t.run not in ids:
            raise ValueError(f"tuning.run: no run {t.run!r} (runs: {', '.join(ids)})")
        for k, v in t.default.items():
            if k not in self.grid:
                raise ValueError(f"tuning.default.{k}: not a grid key")
            same = [g for g in self.grid[k] if _same(g, v)]
            if not same:
                hint = " (YAML reads 1e-3 as text: write 0.001)" if isinstance(v, str) else ""
                raise ValueError(f"tuning.default.{k}: {v!r} is not one of the grid's values {self.grid[k]}{hint}")
            t.default[k] = same[0]  # the grid's own value, as the cells are named by it
        missing = [k for k in self.grid if k not in t.default]
        if missing:
            raise ValueError(f"tuning.default: name the default of every grid key (missing: {', '.join(missing)})")


class Study:
    """A loaded study file: its spec, where it lives and what to run."""

    def __init__(self, spec: StudySpec, path: Path):
        self.spec, self.path = spec, path

    @property
    def name(self) -> str:
        return self.path.stem

    def seeds(self) -> list[int]:
        return seed_list(self.spec.seeds)

    def run_seeds(self, run: RunSpec) -> list[int]:
        """The seeds ``run`` sweeps: its own subset, or all of the study's."""
        return seed_list(run.seeds) if run.seeds is not None else self.seeds()

    def scenario_path(self, run: RunSpec) -> str:
        p = Path(run.scenario)
        return str(p if p.is_absolute() else (self.path.parent / p))

    def spread_ids(self) -> list[str]:
        """The run id of each ``spread`` setting, in the file's order."""
        return [self._spread_id(sp) for sp in self.spec.spreads()]

    @staticmethod
    def _spread_id(sp: SpreadSpec) -> str:
        tag = "-".join(f"{k.split('.')[-1]}{v}" for k, v in sp.set.items())
        return _slug_id(f"{sp.run}.{tag}")

    def entries(self) -> list[tuple[str, dict[str, Any], RunSpec]]:
        """``(scenario file, overrides, run)`` per run (and spread run), overrides as key -> value."""
        out = []
        for r in self.spec.runs:
            out.append((self.scenario_path(r), {**r.set, "name": r.id}, r))
        for sp in self.spec.spreads():
            base = next(r for r in self.spec.runs if r.id == sp.run)
            label = sp.label or f"{base.label} ({', '.join(f'{k}={v}' for k, v in sp.set.items())})"
            spread = RunSpec(id=self._spread_id(sp), label=label, variant=base.variant, scenario=base.scenario, seeds=base.seeds,
                             set={**base.set, **sp.set})
            out.append((self.scenario_path(base), {**spread.set, "name": spread.id}, spread))
        return out

    def points(self) -> list[dict]:
        """Every grid point (``[{}]`` without a grid), in the sweep's order."""
        import itertools

        keys = list(self.spec.grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*self.spec.grid.values())]

    def check(self) -> int:
        """Load every run's scenario at every grid point (first seed) without loading data:
        a bad key or value anywhere is a ScenarioError; a tuning study's ``default`` must be
        what its run's scenario resolves to. Returns the number of runs the study has."""
        from ..scenario import load_scenario, merge_overrides

        points = self.points()
        seeds = self.seeds()
        for scenario, overrides, run in self.entries():
            for point in points:
                over = merge_overrides(overrides, point, {"seed": seeds[0]})
                try:
                    load_scenario(scenario, over)
                except ScenarioError as e:
                    raise ScenarioError(f"{self.path}: study run {run.id!r}: {e}") from None
        self.check_default()
        return sum(len(self.run_seeds(run)) for _, _, run in self.entries()) * len(points)

    def check_data(self) -> None:
        """Load the data of every run (at every grid point that changes the data, else the
        first): a data set that cannot be obtained is a ScenarioError naming the run."""
        from ..data.prepare import prepare
        from ..scenario import load_scenario, merge_overrides

        points = self.points()
        if not any(k.startswith("data.") for k in self.spec.grid):
            points = points[:1]
        for scenario, overrides, run in self.entries():
            for point in points:
                over = merge_overrides(overrides, point, {"seed": self.seeds()[0]})
                try:
                    prepare(load_scenario(scenario, over))
                except ScenarioError as e:
                    raise ScenarioError(f"{self.path}: study run {run.id!r}: {e}") from None

    def tuned_run(self) -> RunSpec:
        t = self.spec.tuning
        return next(r for r in self.spec.runs if t is None or t.run is None or r.id == t.run)

    def check_default(self) -> None:
        """A tuning study's default point must be the value its run gets without the grid."""
        from ..scenario import load_scenario

        if self.spec.tuning is None:
            return
        run = self.tuned_run()
        try:
            sc = load_scenario(self.scenario_path(run), {**run.set, "seed": self.seeds()[0]})
            values = {key: resolved_value(sc, key) for key in self.spec.tuning.default}
        except ScenarioError as e:
            raise ScenarioError(f"{self.path}: study run {run.id!r}: {e}") from None
        for key, want in self.spec.tuning.default.items():
            if not _same(values[key], want):
                raise ScenarioError(f"{self.path}: study.tuning.default.{key}: {want!r}, but run {run.id!r} "
                                    f"resolves it to {values[key]!r} without the grid")

    def labels(self) -> dict[str, RunSpec]:
        return {r.id: r for _, _, r in self.entries()}

    @staticmethod
    def cell_digest(run: RunSpec, point: dict, seed: int) -> str:
        """What the study file asks of one cell, and nothing of the code that ran it: the
        run's scenario file as the study names it, its settings with the grid point, the
        seed. A record row carries it, so a row copied from another study (whatever its
        ``study`` column says) is not taken for one of this study's cells; two studies that
        ask for the same cell share it."""
        import hashlib
        import json

        from ..results.folder import short_value

        doc = {"scenario": Path(run.scenario).as_posix(), "seed": int(seed),
               "set": {k: short_value(v) for k, v in {**run.set, **point}.items()}}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def default_out(self) -> Path:
        return Path("runs") / "studies" / self.name


def resolved_value(scenario, key: str) -> Any:
    """The value a dotted key (``params.lr``, ``data.missing.rate``) has in a loaded scenario,
    with the method's defaults filled in for ``params.*``."""
    parts = key.split(".")
    if parts[0] == "params":
        cfg = scenario.protocol_config()
        tree: Any = {**cfg.model_dump(), **cfg.model_dump(by_alias=True)}
        parts = parts[1:]
    else:
        tree = scenario.model_dump(mode="json")
    for p in parts:
        if not isinstance(tree, dict) or p not in tree:
            return None
        tree = tree[p]
    return tree


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _slug_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "", text)[:40]


def is_study_file(path: str | Path) -> bool:
    """Whether ``path`` is a YAML file whose top level has a ``study`` key."""
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    try:
        raw = safe_yaml_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return False
    return isinstance(raw, dict) and "study" in raw


def load_study(path: str | Path) -> Study:
    """Read and validate a study file; every problem is one ScenarioError naming the file and key."""
    p = Path(path)
    src = str(p)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ScenarioError(f"{src}: a study file may have at most {MAX_FILE_BYTES} bytes")
        raw = safe_yaml_load(p.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{src}: invalid YAML ({type(e).__name__})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{src}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(raw, dict) or set(raw) != {"study"} or not isinstance(raw["study"], dict):
        raise ScenarioError(f"{src}: a study file holds one mapping under the key 'study'")
    try:
        spec = StudySpec.model_validate(raw["study"])
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        # the cross-field checks name their key at the start of the message
        raise ScenarioError(f"{src}: study.{loc}: {msg}" if loc else f"{src}: study.{msg}") from None
    study = Study(spec, p)
    if len({r.id for _, _, r in study.entries()}) != len(study.entries()):
        runs, sids = [r.id for r in spec.runs], study.spread_ids()
        i, taken = next((i, s) for i, s in enumerate(sids) if s in runs or s in sids[:i])
        raise ScenarioError(f"{src}: study.spread.{i}: its run id {taken!r} is taken by another run or spread")
    for i, r in enumerate(spec.runs):
        if not Path(study.scenario_path(r)).is_file():
            raise ScenarioError(f"{src}: study.runs.{i}.scenario: {r.scenario} not found (paths are relative "
                                "to the study file)")
    return study
