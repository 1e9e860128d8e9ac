"""Scenario files: YAML -> validated, typed :class:`Scenario`.

Every problem is reported as :class:`ScenarioError` with one line that names the file
and the key path, e.g. ``scenarios/x.yaml: faults.dropout.rate: must be <= 1, got 1.5``.
``--set key.path=value`` overrides are applied to the raw YAML before validation, so
they are checked exactly like keys written in the file.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)


class ScenarioError(ValueError):
    """A scenario problem, already phrased as one line for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Rate = Field(default=0.0, ge=0.0, le=1.0)


class MissingCfg(_Strict):
    rate: float = Field(default=0.0, ge=0.0, lt=1.0)
    pattern: Literal["point", "block", "imbalanced"] = "point"


class SyntheticCfg(_Strict):
    n_samples: int = Field(default=1000, ge=2)
    n_views: int = Field(default=3, ge=1)
    dims: int | list[int] = 20
    n_clusters: int = Field(default=5, ge=2)
    noise: float = Field(default=1.0, ge=0.0)


class DataCfg(_Strict):
    dataset: str | None = None
    path: str | None = None
    normalize: Literal["none", "l2", "zscore", "minmax"] = "none"
    partition: Literal["vertical", "horizontal"] | None = None
    views: list[int] | None = None
    missing: MissingCfg = MissingCfg()
    unaligned: float = Field(default=0.0, ge=0.0, le=1.0)
    n_clients: int | None = Field(default=None, ge=1)
    heterogeneity: float = Rate
    dirichlet_alpha: float | None = Field(default=None, gt=0.0)
    # vertical splits: sample-size imbalance across clients, Dirichlet(alpha) shares of
    # the views that incomplete samples drop (needs missing.rate > 0; None = off)
    imbalance_alpha: float | None = Field(default=None, gt=0.0)
    synthetic: SyntheticCfg = SyntheticCfg()

    @model_validator(mode="after")
    def _one_source(self) -> DataCfg:
        if (self.dataset is None) == (self.path is None):
            raise ValueError("give exactly one of data.dataset or data.path")
        if self.imbalance_alpha is not None:
            if self.partition == "horizontal":
                raise ValueError("data.imbalance_alpha applies to vertical splits (horizontal: data.dirichlet_alpha)")
            if self.missing.rate <= 0:
                raise ValueError("data.imbalance_alpha needs data.missing.rate > 0 (complete samples are in every client)")
        return self


class ChannelCfg(_Strict):
    encryption: Literal["none", "aes-gcm"] = "none"
    compression: Literal["none", "zlib"] = "none"
    float_dtype: Literal["float64", "float32"] = "float64"


class RateCfg(_Strict):
    rate: float = Rate


class DelayCfg(_Strict):
    dist: Literal["lognormal", "exponential", "constant", "uniform"] = "lognormal"
    mean: float = Field(default=2.0, ge=0.0)
    sigma: float = Field(default=0.5, ge=0.0)


class StragglerCfg(_Strict):
    fraction: float = Rate
    delay_s: DelayCfg = DelayCfg()


class CrashCfg(_Strict):
    client: int = Field(ge=0)
    at_round: int = Field(ge=0)


class FaultsCfg(_Strict):
    dropout: RateCfg = RateCfg()
    disconnect: RateCfg = RateCfg()
    crash: list[CrashCfg] = []
    stragglers: StragglerCfg = StragglerCfg()
    deadline_s: float | None = Field(default=None, gt=0.0)
    min_clients: int = Field(default=1, ge=1)


class NetworkCfg(_Strict):
    latency_ms: float = Field(default=0.0, ge=0.0)
    bandwidth_mbps: float | None = Field(default=None, gt=0.0)


class RuntimeCfg(_Strict):
    backend: Literal["ray", "local"] = "ray"
    address: str | None = None
    client_cpus: float = Field(default=0.5, gt=0.0)
    server_cpus: float = Field(default=0.5, ge=0.0)
    num_cpus: int | None = Field(default=None, ge=1)
    reply_timeout_s: float = Field(default=600.0, gt=0.0)
    threads: int = Field(default=1, ge=1)


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    method: str
    params: dict[str, Any] = {}
    data: DataCfg
    channel: ChannelCfg = ChannelCfg()
    faults: FaultsCfg = FaultsCfg()
    network: NetworkCfg = NetworkCfg()
    runtime: RuntimeCfg = RuntimeCfg()
    seed: int = Field(default=0, ge=0)

    # where the file lives; relative data paths resolve against it
    source: str | None = Field(default=None, exclude=True)

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        from .protocols import available

        names = available()
        if v not in names:
            raise ValueError(f"unknown method {v!r}; choose one of {', '.join(sorted(names))}")
        return v

    def data_path(self) -> Path | None:
        if self.data.path is None:
            return None
        p = Path(self.data.path).expanduser()
        if not p.is_absolute() and self.source:
            p = Path(self.source).parent / p
        return p

    def protocol_config(self):
        """The method's validated config object (raises ScenarioError)."""
        from .protocols import get

        proto = get(self.method)
        try:
            return proto.config(**self.params)
        except ValidationError as e:
            raise ScenarioError(_format(self.source, e, prefix=("params",))) from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------------
def _format(source: str | None, err: ValidationError, prefix: tuple = ()) -> str:
    e = err.errors()[0]
    loc = [str(x) for x in (*prefix, *e["loc"]) if not str(x).startswith("function-")]
    # pydantic adds the union/literal branch name to the location; drop it
    loc = [x for x in loc if x not in {"int", "list[int]", "constrained-float"}]
    key = ".".join(loc) or "(top level)"
    typ = e["type"]
    if typ == "extra_forbidden":
        msg = "unknown key"
    elif typ == "missing":
        msg = "required key is missing"
    else:
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        msg = msg[0].lower() + msg[1:]
        if "input" in e and typ not in {"value_error", "model_type", "dict_type"}:
            msg += f", got {e['input']!r}"
    where = f"{source}: " if source else ""
    return f"{where}{key}: {msg}"


def _set_path(raw: dict, dotted: str, value: Any, source: str | None) -> None:
    keys = dotted.split(".")
    node = raw
    for i, k in enumerate(keys[:-1]):
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            where = f"{source}: " if source else ""
            raise ScenarioError(f"{where}{'.'.join(keys[: i + 1])}: cannot set a key inside a {type(nxt).__name__}")
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``'faults.dropout.rate=0.2'`` -> ``('faults.dropout.rate', 0.2)`` (value parsed as YAML)."""
    if "=" not in text:
        raise ScenarioError(f"--set {text}: expected key.path=value")
    key, val = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ScenarioError(f"--set {text}: bad key path {key!r}")
    try:
        value = yaml.safe_load(val) if val.strip() else None
    except yaml.YAMLError as e:
        raise ScenarioError(f"--set {key}: value is not valid YAML ({_yaml_problem(e)})") from None
    return key, value


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return problem


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read, override and validate a scenario file; every error is a ScenarioError."""
    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise ScenarioError(f"{src}: file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{src}: invalid YAML: {_yaml_problem(e)}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{src}: not a text file") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{src}: the top level must be a mapping of keys, got {type(raw).__name__}")
    return scenario_from_dict(raw, source=src, overrides=overrides)


def scenario_from_dict(raw: dict, source: str | None = None, overrides=()) -> Scenario:
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, value = parse_override(item)
        _set_path(raw, key, value, source)
    raw.pop("source", None)
    try:
        sc = Scenario(**raw, source=source)
    except ValidationError as e:
        raise ScenarioError(_format(source, e)) from None
    except TypeError as e:  # e.g. a key that is not a string
        where = f"{source}: " if source else ""
        raise ScenarioError(f"{where}(top level): {e}") from None
    sc.protocol_config()
    p = sc.data_path()
    if p is not None and not p.is_file():
        where = f"{source}: " if source else ""
        raise ScenarioError(f"{where}data.path: file not found: {p}")
    return sc
