"""Scenario files: YAML -> validated, typed :class:`Scenario`.

Every problem is reported as :class:`ScenarioError` with one line that names the file
and the key path, e.g. ``scenarios/x.yaml: faults.dropout.rate: must be <= 1, got 1.5``.
Overrides (key path -> value; ``--set key.path=value`` on the command line, parsed once
into that form by :func:`parse_sets`) are applied to the raw YAML before validation, so
they are checked exactly like keys written in the file; a problem that comes from an
override is reported against it (``--set params.lamda=2: params.lamda: unknown key;
did you mean 'lambda'? ...``). An unknown key always suggests the closest valid one.

Data paths: a ``data.path`` written in the YAML resolves against the YAML file's folder;
one given with ``--set`` resolves against the current directory and replaces a built-in
``data.dataset`` (and ``--set data.dataset=...`` replaces a ``data.path``).

Untrusted input stays bounded: scenario files over 1 MB, YAML documents with more than
:data:`MAX_ALIASES` aliases (``*name``) or nested deeper than :data:`MAX_DEPTH` are
refused while they are parsed, values quoted in an error are cut to 80 characters and
every error is one line. ``name`` becomes a folder name, so it may hold only letters,
digits, ``.``, ``_`` and ``-``.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from . import availability as _availability
from . import selection as _selection
from .text import MAX_ERROR_CHARS, MAX_VALUE_CHARS, one_line, short, short_value  # noqa: F401 (re-exported)

MAX_FILE_BYTES = 1_000_000  # a scenario file
MAX_ALIASES = 8  # YAML aliases (*name) in one document
MAX_DEPTH = 40  # nesting of YAML collections
MAX_SYNTHETIC_VALUES = 100_000_000  # synthetic data: n_samples x total dims (800 MB of float64)
MAX_VIEWS = 10_000  # synthetic views (each one array, and one client of a vertical split)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")

class ScenarioWarning(UserWarning):
    """Something a scenario's reader should know that is not an error (shown as one
    ``warning:`` line by the command line)."""


class ScenarioError(ValueError):
    """A scenario problem, already phrased as one line for the user (at most 400 characters)."""

    def __init__(self, message: str = ""):
        super().__init__(one_line(message))


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses alias bombs and deep nesting while composing."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases (*name); expand the repeated values",
                    mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def safe_yaml_load(text: str) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, refusing alias bombs and deep nesting."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


_Strict = _availability.ModelConfig  # unknown keys and non-finite numbers refused
Rate = _availability.Rate


class MissingCfg(_Strict):
    rate: float = Field(default=0.0, ge=0.0, lt=1.0)
    pattern: Literal["point", "block", "imbalanced"] = "point"


class SyntheticCfg(_Strict):
    n_samples: int = Field(default=1000, ge=2)
    n_views: int = Field(default=3, ge=1, le=MAX_VIEWS)
    dims: int | list[int] = 20
    n_clusters: int = Field(default=5, ge=2)
    noise: float = Field(default=1.0, ge=0.0)

    def dim_list(self) -> list[int]:
        """Each view's dimension."""
        return [self.dims] * self.n_views if isinstance(self.dims, int) else list(self.dims)

    def n_values(self) -> int:
        """How many numbers the data set holds (samples x total dims)."""
        return self.n_samples * sum(self.dim_list())

    @model_validator(mode="after")
    def _bounded(self) -> SyntheticCfg:
        dims = self.dim_list()
        if any(d < 1 for d in dims):
            raise ValueError(f"dims must be >= 1, got {short(self.dims)}")
        values = self.n_values()
        if values > MAX_SYNTHETIC_VALUES:
            raise ValueError(f"n_samples x total dims = {self.n_samples} x {sum(dims)} = {values:.3g} values, "
                             f"more than the limit of {MAX_SYNTHETIC_VALUES:.0e}")
        return self


class DataCfg(_Strict):
    dataset: str | None = None
    path: str | list[str] | None = Field(
        default=None, description="a .npz/.mat file, a .csv/.tsv table (one view), a list of tables (one view "
                                  "each, rows in the same order) or a folder of tables; relative to the scenario file")
    label_column: str | int | None = Field(
        default=None, description="the label column of .csv/.tsv data: a header name, or a 0-based index")
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
    n_clusters: int | None = Field(default=None, ge=2, description="number of clusters; required for unlabelled data")
    # (rows, columns) of every view read as an image (e.g. [28, 28]); replaces what the data set says
    image_shape: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None

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
    max_message_mb: float = Field(default=256.0, gt=0.0, le=1_000_000.0,
                                  description="largest frame (and inflated payload) a party accepts, in MB")
    secure_aggregation: bool = Field(
        default=False, description="mask the sums a method declares (Protocol.secure_sums): the server sees "
                                   "only the sum (raymvc.runtime.secure)")
    secagg_neighbours: int = Field(
        default=0, ge=0, le=100_000, description="secure aggregation among each client's k neighbours (SecAgg+); "
                                                 "0: among all clients (SecAgg)")
    secagg_threshold: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="secure aggregation: a secret is rebuilt from floor(this x group "
                                                 "size) + 1 shares (0.5: a majority); lower survives more dropouts, "
                                                 "and fewer colluding clients suffice")

    def max_message_bytes(self) -> int:
        return max(1, int(self.max_message_mb * 1_000_000))


MAX_SIGMA = 10.0  # a lognormal's sigma: e^(10 x 3) already spans 13 orders of magnitude
MAX_SECONDS = 1e9  # a delay's mean (about 30 years)
MAX_ROUNDS_SPAN = _availability.MAX_ROUNDS_SPAN  # a stretch or a day, in rounds


class RateCfg(_Strict):
    rate: float = Rate


class DelayCfg(_Strict):
    dist: Literal["lognormal", "exponential", "constant", "uniform"] = "lognormal"
    mean: float = Field(default=2.0, ge=0.0, le=MAX_SECONDS)
    sigma: float = Field(default=0.5, ge=0.0, le=MAX_SIGMA)


class StragglerCfg(_Strict):
    fraction: float = Rate
    delay_s: DelayCfg = DelayCfg()


class PartialWorkCfg(_Strict):
    """Completeness (docs/fault-models.md): in each round each client, with probability
    ``fraction``, finishes only the share ``work`` of its local work."""

    fraction: float = Rate
    work: float = Field(default=1.0, gt=0.0, le=1.0)


class SamplingCfg(_Strict):
    """Client sampling and selection (docs/fault-models.md), for horizontal methods: each
    round the server asks at most round(``fraction`` x clients) of them (at least one),
    chosen by ``rule`` (:mod:`raymvc.selection`; the rule's own parameters sit beside it);
    not a fault."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)
    fraction: float = Field(default=1.0, gt=0.0, le=1.0, description="the most a round asks, as a share of the clients")
    rule: str = Field(default="uniform", description="which clients: uniform, deadline, power_of_choice, or "
                                                     "module.path:ClassName of your own")

    @model_validator(mode="after")
    def _rule(self) -> SamplingCfg:
        _own_params(_selection.get_rule, self.rule, self.params())
        return self

    def params(self) -> dict:
        """The rule's own parameters (every key besides ``fraction`` and ``rule``)."""
        return dict(self.model_extra or {})


class StaleCfg(_Strict):
    """Stale replies (docs/fault-models.md): a client that does not answer a round has its
    last reply handed to the method's ``step`` in its place, with its age in rounds
    (``replies.ages``), while it is at most ``max_age`` rounds old. Only for methods that
    declare they use old replies (``raymvc params METHOD`` says)."""

    max_age: int = Field(default=1, ge=1, le=1000)


class AsyncCfg(_Strict):
    """Asynchronous buffered rounds (docs/fault-models.md): the server steps as soon as
    ``buffer`` updates have arrived on the virtual clock, each with its staleness (how many
    steps older than the server's model the model it was trained on is); a client whose
    update was taken gets the new model when the step ends, the others keep training on
    the one they have. Updates more than ``max_staleness`` steps old are discarded. No deadline
    applies to a buffered step; ``faults.deadline_s`` still bounds the synchronous rounds (a
    final model, which pre-empts the work in flight). Only for methods that declare they
    take updates this way (``raymvc params METHOD`` says)."""

    buffer: int = Field(ge=1, strict=True, description="updates the server waits for before each step")
    max_staleness: int = Field(default=10, ge=0, le=1000, description="older updates are discarded, not used")


class CrashCfg(_Strict):
    client: int = Field(ge=0)
    at_round: int = Field(ge=0)


class DropCfg(_Strict):
    client: int = Field(ge=0)
    at_round: int = Field(ge=0)


class OwnAvailability(_Strict):
    """``faults.availability`` naming a model of one's own (``model: module.path:ClassName``,
    see :mod:`raymvc.availability`): its parameters are checked by the model's ``Config``."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)
    model: str

    @model_validator(mode="after")
    def _known(self) -> OwnAvailability:
        _own_params(_availability.get_model, self.model, self.model_dump())
        return self


def _own_params(lookup, name: str, params: dict) -> None:
    """Check ``params`` with the ``Config`` of the class ``lookup(name)`` finds: a ValueError
    of one line (the first problem) for an unknown class or a bad parameter."""
    try:
        cls = lookup(name)
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None
    try:
        cls.Config(**params)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ValueError(f"{where + ': ' if where else ''}{first['msg']}") from None


def _availability_tag(v: Any) -> str | None:
    """Which model's parameters a ``faults.availability`` mapping holds: a built-in name, or
    ``own`` for an import path."""
    m = v.get("model") if isinstance(v, dict) else getattr(v, "model", None)
    if not isinstance(m, str):
        return None
    if m in _availability.REGISTRY:
        return m
    return "own" if _availability.is_import_path(m) else None


AVAILABILITY_MODELS = {**{n: c.Config for n, c in _availability.REGISTRY.items()}, "own": OwnAvailability}
Availability = Annotated[
    typing.Union[tuple(Annotated[c, Tag(n)] for n, c in AVAILABILITY_MODELS.items())],  # noqa: UP007
    Discriminator(_availability_tag)]
MAX_TRACE_BYTES = 50_000_000


_TRACES: dict[tuple, dict[int, np.ndarray]] = {}  # parsed trace files, by (path, size, mtime)


def read_trace(path: Path) -> dict[int, np.ndarray]:
    """A trace file: a header ``client,start_s,end_s``, then one interval a line when that
    client is available (``start_s <= t < end_s``, seconds). Blank lines are skipped.
    Returns each client's intervals as a ``(k, 2)`` array (read-only; parsed once per file
    version and process). Raises ValueError naming the file and line."""
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    st = path.stat()
    if st.st_size > MAX_TRACE_BYTES:
        raise ValueError(f"{path}: more than {MAX_TRACE_BYTES} bytes")
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _TRACES:
        out = _fast_trace(path)
        if out is None:  # something is off: the line-by-line reader names it (or agrees)
            try:
                lines = path.read_text().splitlines()
            except UnicodeDecodeError:
                raise ValueError(f"{path}: not a text file") from None
            out = {c: np.asarray(v, dtype=np.float64).reshape(-1, 2)
                   for c, v in _read_trace_lines(path, lines).items()}
        for a in out.values():
            a.flags.writeable = False
        _TRACES.clear()  # one file at a time is all a process needs
        _TRACES[key] = out
    return _TRACES[key]


def _fast_trace(path: Path) -> dict[int, np.ndarray] | None:
    """The intervals of a well-formed trace, read by numpy's parser in one pass over the file;
    None if the header or any line is not ``integer,number,number`` with finite start < end
    (the line reader then names it)."""
    try:
        with open(path, encoding="utf-8") as fh:
            header = fh.readline()
    except (OSError, ValueError):
        return None
    if [x.strip() for x in header.split(",")] != ["client", "start_s", "end_s"]:
        return None
    try:
        rows = np.loadtxt(path, delimiter=",", skiprows=1, comments=None, ndmin=1,
                          dtype=[("c", np.int64), ("s", np.float64), ("e", np.float64)])
    except (ValueError, OverflowError):
        return None
    c, span = rows["c"], np.stack([rows["s"], rows["e"]], axis=1) if len(rows) else np.zeros((0, 2))
    if (c < 0).any() or not (np.isfinite(span).all() and (span[:, 0] < span[:, 1]).all()):
        return None
    order = np.argsort(c, kind="stable")
    c, span = c[order], span[order]
    cuts = np.flatnonzero(np.diff(c)) + 1
    return {int(g[0]): s for g, s in zip(np.split(c, cuts), np.split(span, cuts)) if len(g)}


def _read_trace_lines(path: Path, lines: list[str]) -> dict[int, list[tuple[float, float]]]:
    """A trace file: a header ``client,start_s,end_s``, then one interval a line when that
    client is available (``start_s <= t < end_s``, seconds). Blank lines are skipped.
    Raises ValueError naming the file and line."""
    if not lines or [x.strip() for x in lines[0].split(",")] != ["client", "start_s", "end_s"]:
        raise ValueError(f"{path} line 1: the header must be client,start_s,end_s")
    out: dict[int, list[tuple[float, float]]] = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = [x.strip() for x in line.split(",")]
        where = f"{path} line {n}"
        if len(cells) != 3:
            raise ValueError(f"{where}: expected 3 values (client,start_s,end_s), got {len(cells)}")
        try:
            client = int(cells[0])
        except ValueError:
            raise ValueError(f"{where}: client must be an integer, got {short(cells[0])}") from None
        try:
            start, end = float(cells[1]), float(cells[2])
        except ValueError:
            raise ValueError(f"{where}: start_s and end_s must be numbers, got {short(cells[1])}, "
                             f"{short(cells[2])}") from None
        if client < 0 or not (math.isfinite(start) and math.isfinite(end)) or not start < end:
            raise ValueError(f"{where}: need client >= 0 and finite start_s < end_s, got {short(line.strip())}")
        out.setdefault(client, []).append((start, end))
    return out


class FaultsCfg(_Strict):
    """``faults``: every key's description is what ``raymvc list`` shows (docs/fault-models.md)."""

    availability: Availability | None = Field(default=None, description=(
        "{model: NAME, ...}: which clients are there in a round, instead of dropout.rate; the models below, "
        "or module.path:ClassName of your own"))
    dropout: RateCfg = Field(default=RateCfg(), description="{rate: P}: chance that a client misses a round "
                                                            "(per client and round, whatever the round holds)")
    disconnect: RateCfg = Field(default=RateCfg(), description="{rate: P}: share of clients offline for the whole run")
    drop: list[DropCfg] = Field(default=[], description="[{client: C, at_round: R}]: the client misses round R "
                                                        "(a scheduled dropout)")
    crash: list[CrashCfg] = Field(default=[], description="[{client: C, at_round: R}]: the client's actor is "
                                                          "killed at round R")
    stragglers: StragglerCfg = Field(default=StragglerCfg(), description="share of slow clients and their delay "
                                                                         "distribution (virtual seconds)")
    partial_work: PartialWorkCfg | None = Field(default=None, description=(
        "{fraction: F, work: W}: per client and round, with chance F it does only W of its local work "
        "(raymvc params METHOD says which methods honour it)"))
    stale_replies: StaleCfg | None = Field(default=None, description=(
        "{max_age: A}: a missing client's last reply, with its age, stands in for it (methods that use old replies)"))
    sampling: SamplingCfg | None = Field(default=None, description=(
        "{fraction: F, rule: R}: the server asks at most F of the clients each round, chosen by the rule below; "
        "the rest are not_sampled (horizontal methods; no fault)"))
    asynchronous: AsyncCfg | None = Field(default=None, description=(
        "{buffer: K, max_staleness: S}: the server steps once K updates arrived (methods that take them; no fault)"))
    deadline_s: float | None = Field(default=None, gt=0.0, description="round deadline on the virtual clock; later "
                                                                         "replies count as late")
    min_clients: int = Field(default=1, ge=0, description="fewest replies a round needs; fewer ends the run as "
                                                          "failed (0: the method decides)")
    inference_round: bool = Field(default=False, description=(
        "true: after the last round the final model goes to every available client, metered (horizontal methods "
        "whose clients label their rows)"))

    @model_validator(mode="after")
    def _one_availability(self) -> FaultsCfg:
        if self.availability is not None and self.dropout.rate > 0:
            raise ValueError("give faults.dropout.rate or faults.availability, not both "
                             "(faults.availability.model: iid is the same as dropout.rate)")
        return self


class NetworkCfg(_Strict):
    latency_ms: float = Field(default=0.0, ge=0.0)
    bandwidth_mbps: float | None = Field(default=None, gt=0.0)


class DeviceDraw(_Strict):
    """A device quantity drawn once per client: lognormal with this mean (``sigma`` is the
    underlying normal's), or uniform in [0, 2 x mean]."""

    dist: Literal["lognormal", "uniform"] = "lognormal"
    mean: float = Field(gt=0.0, le=1e12)
    sigma: float = Field(default=0.5, ge=0.0, le=MAX_SIGMA)


Positive = Annotated[float, Field(gt=0.0)]
DEVICE_QUANTITIES = ("speed", "up_mbps", "down_mbps", "latency_ms")


class DeviceClass(_Strict):
    """One named class of a device profile file (docs/fault-models.md, "Device profiles")."""

    speed: float = Field(gt=0.0, description="compute speed; 1 does a round's nominal work in base_compute_s")
    up_mbps: float = Field(gt=0.0, description="uplink, Mbit/s")
    down_mbps: float = Field(gt=0.0, description="downlink, Mbit/s")
    latency_ms: float = Field(ge=0.0, description="one-way latency of each message, ms")


MAX_PROFILE_BYTES = 1_000_000


def read_profile(path: Path) -> dict[str, DeviceClass]:
    """A device profile file: a YAML mapping ``class name -> {speed, up_mbps, down_mbps,
    latency_ms}``. Raises ValueError naming the file and the key."""
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    if path.stat().st_size > MAX_PROFILE_BYTES:
        raise ValueError(f"{path}: more than {MAX_PROFILE_BYTES} bytes")
    try:
        raw = safe_yaml_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {_yaml_problem(e)}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a mapping of device classes (name: {{speed, up_mbps, down_mbps, "
                         f"latency_ms}}), got {short(raw)}")
    out = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError(f"{path}: {short(name)}: a class name is letters, digits, '.', '_' or '-'")
        extra = [k for k in entry if k not in DeviceClass.model_fields] if isinstance(entry, dict) else []
        if extra:  # before a missing key: a misspelt key is what is wrong
            bad = str(extra[0])[:40]
            raise ValueError(f"{path}: {name}.{bad}: {unknown_key_message(bad, sorted(DeviceClass.model_fields))}")
        try:
            out[name] = DeviceClass(**entry) if isinstance(entry, dict) else DeviceClass.model_validate(entry)
        except ValidationError as e:
            raise ValueError(_format(str(path), e, prefix=(name,), model=DeviceClass)) from None
        except TypeError as e:  # a key that is not a string
            raise ValueError(f"{path}: {name}: {e}") from None
    return out


class DevicesCfg(_Strict):
    """Per-client device profiles on the virtual clock (docs/fault-models.md, "Device profiles").

    Each quantity is a number (every client alike) or a distribution drawn once per
    client; a quantity left out takes ``network``'s value (``speed``: 1). Or name device
    classes of a ``profile`` file and the share of clients in each (``classes``).
    """

    base_compute_s: float = Field(default=1.0, ge=0.0, description="virtual compute seconds of a round's work "
                                                                   "at speed 1")
    by_samples: bool = Field(default=False, description="scale a client's compute by its samples / the mean")
    speed: Positive | DeviceDraw | None = None
    up_mbps: Positive | DeviceDraw | None = None
    down_mbps: Positive | DeviceDraw | None = None
    latency_ms: Annotated[float, Field(ge=0.0)] | DeviceDraw | None = None
    profile: str | None = Field(default=None, description="a YAML file of device classes, relative to the "
                                                          "scenario file")
    classes: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] | None = Field(
        default=None, description="class -> share of the clients (shares sum to 1)")

    @field_validator("classes")
    @classmethod
    def _shares(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and (not v or abs(sum(v.values()) - 1.0) > 1e-6):
            raise ValueError(f"the shares must sum to 1, got {sum(v.values()):g}")
        return v

    @model_validator(mode="after")
    def _one_way(self) -> DevicesCfg:
        if (self.profile is None) != (self.classes is None):
            raise ValueError("give devices.profile and devices.classes together (classes: name -> share)")
        given = [q for q in DEVICE_QUANTITIES if getattr(self, q) is not None]
        if self.profile is not None and given:
            raise ValueError(f"{given[0]} comes from the profile's classes; leave it out or drop devices.profile")
        return self


class RuntimeCfg(_Strict):
    backend: Literal["ray", "local"] = "ray"
    address: str | None = None
    client_cpus: Annotated[float, Field(gt=0.0)] | Literal["auto"] = Field(
        default=0.5, description="CPUs reserved per client actor; auto: the cluster's free CPUs shared among the "
                                 "actors (at least 0.05, at most 1 each)")
    server_cpus: float = Field(default=0.5, ge=0.0)
    client_gpus: float = Field(default=0.0, ge=0.0, description="GPUs reserved per client actor (fractions "
                                                                "share one GPU); with params.device: auto the "
                                                                "deep methods train on it")
    server_gpus: float = Field(default=0.0, ge=0.0, description="GPUs reserved for the server actor")
    num_cpus: int | None = Field(default=None, ge=1, le=1 << 16)
    # at most ~11.6 days: a longer wait overflows the timers underneath (threading's TIMEOUT_MAX)
    reply_timeout_s: float = Field(default=600.0, gt=0.0, le=1e6)
    threads: int = Field(default=1, ge=1, le=1024)  # per process; a native pool of 10^5 threads crashes it
    checkpoint: bool = False  # save every party's state after each round (raymvc run --resume)
    evict_after: int = Field(default=3, ge=1)  # consecutive reply timeouts before a client is evicted
    clients_per_actor: int = Field(default=1, ge=1, le=1_000_000)  # logical clients hosted by one Ray actor
    placement: Literal["default", "spread"] = "default"  # spread: client actors over the cluster's nodes
    placement_timeout_s: float = Field(default=60.0, gt=0.0)  # waiting for the cluster to place the actors
    score_every: int = Field(default=0, ge=0, description="score the model as it stands after every N-th round "
                                                          "(rounds.jsonl 'scores'; off the record: nothing metered, "
                                                          "timed or faulted, the same result); 0: off")


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    method: str
    params: dict[str, Any] = {}
    data: DataCfg
    channel: ChannelCfg = ChannelCfg()
    faults: FaultsCfg = FaultsCfg()
    network: NetworkCfg = NetworkCfg()
    devices: DevicesCfg | None = None  # per-client speed and links on the virtual clock (docs/fault-models.md)
    runtime: RuntimeCfg = RuntimeCfg()
    seed: int = Field(default=0, ge=0, le=2**32 - 1)  # the range scikit-learn's random_state takes

    # where the file lives; relative data paths resolve against it
    source: str | None = Field(default=None, exclude=True)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v) or ".." in v:
            raise ValueError("must be 1-80 letters, digits, '.', '_' or '-' (starting with a letter or digit, "
                             f"no '..'): it names the run folder; got {short(v)}")
        return v

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        from .protocols import get

        try:
            get(v)
        except KeyError as e:
            raise ValueError(str(e).strip("'\"")) from None
        return v

    def data_path(self) -> Path | list[Path] | None:
        """``data.path`` resolved relative to the scenario file (a list stays a list)."""
        if self.data.path is None:
            return None

        def resolve(s: str) -> Path:
            p = Path(s).expanduser()
            return Path(self.source).parent / p if not p.is_absolute() and self.source else p

        if isinstance(self.data.path, list):
            return [resolve(s) for s in self.data.path]
        return resolve(self.data.path)

    def trace_path(self) -> Path | None:
        """``faults.availability.path`` of the trace model, resolved relative to the scenario file."""
        a = self.faults.availability
        if a is None or a.model != "trace":
            return None
        p = Path(a.path).expanduser()
        return Path(self.source).parent / p if not p.is_absolute() and self.source else p

    def availability_trace(self) -> dict[int, np.ndarray] | None:
        """The intervals of ``faults.availability: {model: trace}``, or None for another model;
        a bad file raises ScenarioError."""
        p = self.trace_path()
        if p is None:
            return None
        try:
            return read_trace(p)
        except ValueError as e:
            where = f"{self.source}: " if self.source else ""
            raise self.blame(ScenarioError(f"{where}faults.availability.path: {e}")) from None

    def profile_path(self) -> Path | None:
        """``devices.profile`` resolved relative to the scenario file."""
        if self.devices is None or self.devices.profile is None:
            return None
        p = Path(self.devices.profile).expanduser()
        return Path(self.source).parent / p if not p.is_absolute() and self.source else p

    def device_classes(self) -> dict[str, DeviceClass] | None:
        """The classes of ``devices.profile`` that ``devices.classes`` names, or None without
        a profile; a bad file or an unknown class raises ScenarioError."""
        p = self.profile_path()
        if p is None:
            return None
        where = f"{self.source}: " if self.source else ""
        try:
            known = read_profile(p)
        except ValueError as e:
            raise self.blame(ScenarioError(f"{where}devices.profile: {e}")) from None
        for name in self.devices.classes:
            if name not in known:
                raise self.blame(ScenarioError(f"{where}devices.classes.{name[:40]}: not a class of {p} "
                                               f"(classes: {', '.join(sorted(known))})"))
        return {name: known[name] for name in self.devices.classes}

    def data_files(self) -> list[Path]:
        """Every file ``data.path`` reads (a folder's tables included), for the fingerprint."""
        from .data.tables import table_files

        p = self.data_path()
        paths = p if isinstance(p, list) else ([] if p is None else [p])
        out = []
        for q in paths:
            out.extend(table_files(q) if q.is_dir() else [q])
        return out

    def protocol_config(self):
        """The method's validated config object (raises ScenarioError)."""
        from .protocols import get

        proto = get(self.method)
        try:
            return proto.config(**self.params)
        except ValidationError as e:
            raise ScenarioError(_format(self.source, e, prefix=("params",), model=proto.config,
                                        overrides=self._overrides)) from None

    # the overrides this scenario was built with, key -> value (to blame them in errors)
    _overrides: dict = {}

    def blame(self, err: ScenarioError) -> ScenarioError:
        """Re-attribute an error phrased against the file to the --set that caused it."""
        return ScenarioError(blame_override(str(err), self.source, self._overrides))

    def to_yaml(self) -> str:
        d = self.model_dump(mode="json")
        if self.data.path is not None:  # resolved, so the copy in a run folder still finds the file
            p = self.data_path()
            d["data"]["path"] = [str(q.resolve()) for q in p] if isinstance(p, list) else str(p.resolve())
        if self.trace_path() is not None:  # resolved too
            d["faults"]["availability"]["path"] = str(self.trace_path().resolve())
        if self.devices is None:  # no key: a scenario without devices reads (and fingerprints) as before
            del d["devices"]
        elif self.profile_path() is not None:
            d["devices"]["profile"] = str(self.profile_path().resolve())
        if not d["runtime"]["score_every"]:  # likewise
            del d["runtime"]["score_every"]
        return yaml.safe_dump(d, sort_keys=False)


# ---------------------------------------------------------------------------
def _model_in(annotation) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``X``, ``X | None`` or ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated, list, tuple):
        for arg in typing.get_args(annotation):
            m = _model_in(arg)
            if m is not None:
                return m
    return None


def valid_keys(model: type[BaseModel] | None, path: list) -> list[str] | None:
    """The keys accepted at ``path`` (a location below ``model``), or None if unknown."""
    for i, part in enumerate(path):
        if model is None:
            return None
        if isinstance(part, int) or str(part).isdigit():
            continue
        if i and path[i - 1] == "availability" and part in AVAILABILITY_MODELS:  # the model's tag
            model = AVAILABILITY_MODELS[part]
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        model = _model_in(field.annotation)
    if model is None:
        return None
    return sorted((f.alias or n) for n, f in model.model_fields.items() if not f.exclude)


def unknown_key_message(bad: str, valid: list[str] | None) -> str:
    if not valid:
        return "unknown key"
    close = difflib.get_close_matches(bad, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (valid keys: {', '.join(valid)})"


def blame_override(text: str, source: str | None, overrides: Mapping[str, Any] | None) -> str:
    """``FILE: key: msg`` -> ``--set key=value: key: msg`` when an override set that key."""
    if not overrides:
        return text
    rest = text[len(source) + 2:] if source and text.startswith(f"{source}: ") else text
    key = rest.split(": ", 1)[0]
    items = list(overrides.items())[::-1]
    for okey, value in items:
        if key == okey or key.startswith(okey + ".") or okey.startswith(key + "."):
            return f"--set {show_override(okey, value)}: {rest}"
    if key == "data" or key.startswith("data."):  # a problem of data given on the command line
        for okey, value in items:
            if okey in ("data.path", "data.dataset"):
                return f"--set {show_override(okey, value)}: {rest}"
    return text


_BRANCHES = {"int", "list[int]", "constrained-float", "DeviceDraw"}  # union branch names pydantic puts in a location


def _format(source: str | None, err: ValidationError, prefix: tuple = (), model=None, overrides=()) -> str:
    errors = err.errors()
    e = errors[0]
    if isinstance(e.get("input"), dict) and e["type"] in ("float_type", "float_parsing"):
        # a mapping where a number or a mapping may stand (a device quantity): its own problem, not "a number"
        e = next((x for x in errors[1:] if len(x["loc"]) > len(e["loc"])), e)
    raw_loc = [x for x in e["loc"] if not str(x).startswith("function-")]
    loc = [str(x) for x in (*prefix, *raw_loc)]
    # pydantic adds the union/literal branch name to the location; drop it
    loc = [x if len(x) <= 40 else x[:37] + "..." for x in loc if x not in _BRANCHES]
    # faults.availability.<tag>.key -> faults.availability.key
    loc = [x for i, x in enumerate(loc) if not (i and loc[i - 1] == "availability" and x in AVAILABILITY_MODELS)]
    typ = e["type"]
    if typ in ("union_tag_invalid", "union_tag_not_found"):  # the key that picks the kind (model: ...)
        loc.append("model" if e["ctx"]["discriminator"] == "_availability_tag()" else e["ctx"]["discriminator"].strip("'"))
    key = ".".join(loc) or "(top level)"
    if typ == "union_tag_not_found" and e["ctx"]["discriminator"] == "_availability_tag()":
        m = e["input"].get("model") if isinstance(e["input"], dict) else None
        msg = ("required key is missing" if m is None else
               f"unknown value {short(m)} (valid: {', '.join(_availability.REGISTRY)}, or module.path:ClassName "
               "of your own)")
    elif typ == "union_tag_invalid":
        msg = f"unknown value {short(e['ctx']['tag'])} (valid: {e['ctx']['expected_tags'].replace(chr(39), '')})"
    elif typ == "union_tag_not_found":
        msg = "required key is missing"
    elif typ == "extra_forbidden":
        within = [x for x in raw_loc[:-1] if str(x) not in _BRANCHES]
        msg = unknown_key_message(str(raw_loc[-1])[:200], valid_keys(model or Scenario, within))
    elif typ == "missing":
        msg = "required key is missing"
    elif typ in ("model_type", "dict_type"):  # a value where a mapping belongs: name its keys, not a class
        within = [str(x) for x in raw_loc if str(x) not in _BRANCHES]
        try:
            keys = valid_keys(model or Scenario, within) or []
        except Exception:  # noqa: BLE001 -- the plain message is still right
            keys = []
        msg = f"expected a mapping of its keys{' (' + ', '.join(keys) + ')' if keys else ''}, got {short(e['input'])}"
        if len(keys) == 1 and not isinstance(e["input"], dict):
            msg += f"; did you mean {key}.{keys[0]}?"
    else:
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        msg = msg[0].lower() + msg[1:]
        if "input" in e and typ not in {"value_error", "model_type", "dict_type"}:
            msg += f", got {short(e['input'])}"
    where = f"{source}: " if source else ""
    return blame_override(f"{where}{key}: {msg}", source, overrides)


def _set_path(raw: dict, dotted: str, value: Any, source: str | None) -> None:
    keys = dotted.split(".")
    node = raw
    for i, k in enumerate(keys[:-1]):
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(f"--set {dotted}=...: {'.'.join(keys[: i + 1])}: cannot set a key inside a "
                                f"{type(nxt).__name__}")
        node = nxt
    node[keys[-1]] = value


def _apply_override(raw: dict, key: str, value: Any, source: str | None) -> None:
    """Set one override; a data source given on the command line replaces the other one."""
    if key == "data.path" and isinstance(value, str):
        p = Path(value).expanduser()
        value = str(p if p.is_absolute() else Path(os.getcwd()) / p)  # command line: relative to here
    _set_path(raw, key, value, source)
    data = raw.get("data")
    if isinstance(data, dict) and value is not None:
        if key == "data.path":
            data.pop("dataset", None)
        elif key == "data.dataset":
            data.pop("path", None)


def parse_override(text: str) -> tuple[str, Any]:
    """``'faults.dropout.rate=0.2'`` -> ``('faults.dropout.rate', 0.2)`` (value parsed as YAML)."""
    if "=" not in text:
        raise ScenarioError(f"--set {text}: expected key.path=value")
    key, val = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ScenarioError(f"--set {text}: bad key path {key!r}")
    try:
        value = safe_yaml_load(val) if val.strip() else None
    except yaml.YAMLError as e:
        raise ScenarioError(f"--set {key}: value is not valid YAML ({_yaml_problem(e)})") from None
    return key, value


def parse_sets(items: Iterable[str]) -> dict[str, Any]:
    """``--set`` strings (``"key.path=yaml"``) as overrides, key -> value, parsed once; a
    key given twice keeps its last value."""
    return merge_overrides(*(dict([parse_override(item)]) for item in items))


def as_overrides(overrides: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """Overrides as key -> value: a mapping (its keys checked), or ``--set`` strings (parsed)."""
    if overrides is None:
        return {}
    if isinstance(overrides, str):
        raise ScenarioError(f"overrides: a mapping of key -> value or a list of key=value strings, got {overrides!r}")
    if not isinstance(overrides, Mapping):
        return parse_sets(overrides)
    for key in overrides:
        if not isinstance(key, str) or not key.strip() or any(not part for part in key.strip().split(".")):
            raise ScenarioError(f"overrides: bad key path {short(key)}")
    return {k.strip(): _plain(v) for k, v in overrides.items()}


def _plain(value: Any) -> Any:
    """A value as YAML would give it: a path-like (``pathlib.Path``) becomes its text, also
    inside mappings and lists, so every override can be shown and fingerprinted."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def merge_overrides(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """Several sets of overrides as one, applied in order: a key given again takes its
    last value and its last place."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out.pop(key, None)
            out[key] = value
    return out


def show_override(key: str, value: Any) -> str:
    """An override as its ``--set`` text: ``faults.dropout.rate=0.2`` (mappings keep their order)."""
    if value is None:
        return f"{key}=null"
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False, allow_unicode=True)
    return f"{key}={text.strip().removesuffix('...').strip()}"


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return problem


def load_scenario(path: str | Path, overrides: Mapping[str, Any] | Iterable[str] | None = None) -> Scenario:
    """Read, override and validate a scenario file; every error is a ScenarioError.
    ``overrides``: key -> value (``{"faults.dropout.rate": 0.2}``), applied in order; a list
    of ``--set`` strings is parsed first."""
    path = Path(path)
    src = str(path)
    try:
        if not path.is_file():
            raise ScenarioError(f"{src}: file not found")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ScenarioError(f"{src}: {size} bytes; a scenario file may have at most {MAX_FILE_BYTES}")
        raw = safe_yaml_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{src}: invalid YAML: {_yaml_problem(e)}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{src}: not a text file") from None
    except OSError as e:
        raise ScenarioError(f"{src}: cannot read ({e.strerror or e})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{src}: the top level must be a mapping of keys, got {type(raw).__name__}")
    from .protocols import add_search_path

    add_search_path(path.parent)  # a method module beside the file is found, as data.path is
    return scenario_from_dict(raw, source=src, overrides=overrides)


def _check_split_options(sc: Scenario) -> None:
    """Options that only one kind of split uses are errors on the other kind, not silently ignored."""
    from .protocols import get

    kind = sc.data.partition or get(sc.method).partition
    where = f"{sc.source}: " if sc.source else ""
    if kind == "horizontal":
        if sc.data.missing.rate > 0:
            raise sc.blame(ScenarioError(f"{where}data.missing.rate: missing views apply to vertical splits; "
                                         f"this is a horizontal split ({sc.method}), so set it to 0"))
        if sc.data.unaligned > 0:
            raise sc.blame(ScenarioError(f"{where}data.unaligned: unaligned rows apply to vertical splits; "
                                         f"this is a horizontal split ({sc.method}), so set it to 0"))
    elif sc.data.heterogeneity > 0 or sc.data.dirichlet_alpha is not None:
        key = "data.heterogeneity" if sc.data.heterogeneity > 0 else "data.dirichlet_alpha"
        raise sc.blame(ScenarioError(f"{where}{key}: label and quantity skew apply to horizontal splits; "
                                     f"this is a vertical split ({sc.method})"))


def _drop_other_methods_params(raw: dict, file_method, file_params: Mapping, overrides: Mapping, source) -> None:
    """A ``method`` override (``--set method=X``, a grid of methods) starts from X's own
    defaults: the file's ``params``, written for its own method, are dropped -- even where a
    name is shared, since its value was chosen for the other method -- except those the
    overrides set again; a warning names what was dropped."""
    import warnings

    if "params" in overrides:  # the overrides give the whole params block
        return
    again = {k.split(".", 2)[1] for k in overrides if k.startswith("params.")}
    params = raw.get("params") if isinstance(raw.get("params"), dict) else {}
    raw["params"] = {k: v for k, v in params.items() if k in again}
    dropped = sorted(str(k) for k in file_params if k not in again)
    if dropped:
        where = f"{source}: " if source else ""
        warnings.warn(f"{where}method {raw.get('method')!r} replaces {file_method!r}: the file's params for "
                      f"{file_method!r} are not carried over ({', '.join(dropped)}); {raw.get('method')!r} starts "
                      "from its own defaults", ScenarioWarning, stacklevel=3)


def scenario_from_dict(raw: dict, source: str | None = None, overrides: Mapping[str, Any] | Iterable[str] | None = None,
                       values: Mapping[str, Any] | None = None) -> Scenario:
    """A validated :class:`Scenario` from a raw mapping. ``overrides``: key -> value, as
    ``--set`` applies them (a data source replaces the other, a relative ``data.path`` is
    taken from the working folder, errors name the override); ``values``: key -> value set
    as they are, before the overrides."""
    raw = copy.deepcopy(raw)
    for key, value in (values or {}).items():
        _set_path(raw, key, copy.deepcopy(value), source)
    overrides = as_overrides(overrides)
    file_method, file_params = raw.get("method"), raw.get("params")
    for key, value in overrides.items():
        try:
            _apply_override(raw, key, copy.deepcopy(value), source)
        except ScenarioError as e:
            raise ScenarioError(str(e).replace(f"--set {key}=...", f"--set {show_override(key, value)}", 1)) from None
    if "method" in overrides and raw.get("method") != file_method and isinstance(file_params, Mapping):
        _drop_other_methods_params(raw, file_method, file_params, overrides, source)
    raw.pop("source", None)
    try:
        sc = Scenario(**raw, source=source)
    except ValidationError as e:
        raise ScenarioError(_format(source, e, overrides=overrides)) from None
    except TypeError as e:  # e.g. a key that is not a string
        where = f"{source}: " if source else ""
        raise ScenarioError(f"{where}(top level): {e}") from None
    sc._overrides = overrides
    sc.protocol_config()
    _check_split_options(sc)
    p = sc.data_path()
    for q in (p if isinstance(p, list) else [] if p is None else [p]):
        if not (q.is_file() or (q.is_dir() and not isinstance(p, list))):
            where = f"{source}: " if source else ""
            raise ScenarioError(blame_override(f"{where}data.path: file not found: {q}", source, overrides))
    sc.availability_trace()  # a trace file is read and checked now
    sc.device_classes()  # so is a device profile
    if sc.data.label_column is not None and p is None:
        where = f"{source}: " if source else ""
        raise ScenarioError(blame_override(f"{where}data.label_column: applies to .csv/.tsv data (data.path)",
                                           source, overrides))
    return sc
