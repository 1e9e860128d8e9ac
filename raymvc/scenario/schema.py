"""The scenario's schema: the typed :class:`Scenario` and its sections, nothing that reads
or parses files (an actor imports this alone; :mod:`.load` reads YAML and applies overrides).

Data paths: a ``data.path`` written in the YAML resolves against the YAML file's folder;
one given with ``--set`` resolves against the current directory and replaces a built-in
``data.dataset`` (and ``--set data.dataset=...`` replaces a ``data.path``). ``name`` becomes
a folder name, so it may hold only letters, digits, ``.``, ``_`` and ``-``.
"""

from __future__ import annotations

import copy
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from .. import availability as _availability
from .. import kinds as _kinds
from .. import selection as _selection
from ..text import short
from .errors import ScenarioError, blame_override, format_error

MAX_SYNTHETIC_VALUES = 100_000_000  # synthetic data: n_samples x total dims (800 MB of float64)
MAX_VIEWS = 10_000  # synthetic views (each one array, and one client of a vertical split)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


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


MAX_SIGMA = _kinds.MAX_SIGMA  # a lognormal's sigma: e^(10 x 3) already spans 13 orders of magnitude
MAX_SECONDS = _kinds.MAX_SECONDS  # a delay's mean (about 30 years)
MAX_ROUNDS_SPAN = _availability.MAX_ROUNDS_SPAN  # a stretch or a day, in rounds


class RateCfg(_Strict):
    rate: float = Rate


DelayCfg = _kinds.DelayCfg
# faults.stragglers: the built-in fault kind's own key, its parameters the kind's (raymvc.kinds)
StragglerCfg = _kinds.Stragglers.Config


# faults.partial_work: the built-in fault kind's own key, its parameters the kind's (raymvc.kinds)
PartialWorkCfg = _kinds.PartialWork.Config


class SamplingCfg(_Strict):
    """Client sampling and selection (docs/fault-models.md), for horizontal methods: each
    round the server asks at most round(``fraction`` x clients) of them (at least one),
    chosen by ``rule`` (:mod:`raymvc.selection`; the rule's own parameters sit beside it);
    not a fault."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
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


class KindEntry(_Strict):
    """One entry of ``faults.kinds``: ``kind`` (a built-in name of :mod:`raymvc.kinds` or
    ``module.path:ClassName``) and the kind's parameters beside it, checked by its ``Config``."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    kind: str = Field(description=f"the kind: {', '.join(_kinds.REGISTRY)}, or module.path:ClassName of your own")

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k != "kind"}

    @model_validator(mode="after")
    def _known(self) -> KindEntry:
        _own_params(_kinds.get_kind, self.kind, self.params())
        return self


# faults.crash, faults.drop: lists of (client, round), the parameter ``at`` of the built-in kinds
CrashCfg = DropCfg = _kinds.ClientRound
# faults.disconnect: the built-in fault kind's own key, its parameters the kind's (raymvc.kinds)
DisconnectCfg = _kinds.Disconnect.Config


class OwnAvailability(_Strict):
    """``faults.availability`` naming a model of one's own (``model: module.path:ClassName``,
    see :mod:`raymvc.availability`): its parameters are checked by the model's ``Config``."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
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


class FaultsCfg(_Strict):
    """``faults``: every key's description is what ``raymvc list`` shows (docs/fault-models.md)."""

    availability: Availability | None = Field(default=None, description=(
        "{model: NAME, ...}: which clients are there in a round, instead of dropout.rate; the models below, "
        "or module.path:ClassName of your own"))
    dropout: RateCfg = Field(default=RateCfg(), description="{rate: P}: chance that a client misses a round "
                                                            "(per client and round, whatever the round holds)")
    disconnect: DisconnectCfg = Field(default=DisconnectCfg(), description=(
        "{rate: P}: share of clients offline for the whole run; the fault kind disconnect"))
    drop: list[DropCfg] = Field(default=[], description="[{client: C, at_round: R}]: the client misses round R "
                                                        "(a scheduled dropout); the fault kind drop")
    crash: list[CrashCfg] = Field(default=[], description="[{client: C, at_round: R}]: the client's actor is "
                                                          "killed at round R; the fault kind crash")
    stragglers: StragglerCfg = Field(default=StragglerCfg(), description=(
        "{fraction: F, delay_s: {dist, mean, sigma}}: share of slow clients and the delay of each of their replies "
        "(virtual seconds); the fault kind stragglers"))
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
    kinds: list[KindEntry] = Field(default=[], description=(
        f"[{{kind: K, ...}}]: device behaviours of raymvc.kinds ({', '.join(_kinds.REGISTRY)}) or of your own "
        "(module:Class); each may take a client away, delay its reply, cut its work and add to the round's record"))

    @model_validator(mode="after")
    def _one_availability(self) -> FaultsCfg:
        if self.availability is not None and self.dropout.rate > 0:
            raise ValueError("give faults.dropout.rate or faults.availability, not both "
                             "(faults.availability.model: iid is the same as dropout.rate)")
        return self

    @model_validator(mode="after")
    def _each_kind_once(self) -> FaultsCfg:
        """A built-in kind switched on by its own key and listed in ``kinds`` would act twice."""
        listed = {e.kind for e in self.kinds}
        for cls in _kinds.REGISTRY.values():
            cfg = _kinds.shorthand_config(cls, self)
            if cls.name in listed and cfg is not None and cls.switched_on(cfg):
                raise ValueError(f"give faults.{cls.shorthand} or faults.kinds: [{{kind: {cls.name}, ...}}], not "
                                 "both (the kind would act twice)")
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
    central: bool = Field(default=False, description=(
        "true: the centralised reference -- the pooled data at one party, no faults (a horizontal method's rows; "
        "a vertical method's views side by side, aligned and complete; method: kmeans and fcm always run so)"))

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
        from ..protocols import get

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

    def profile_path(self) -> Path | None:
        """``devices.profile`` resolved relative to the scenario file."""
        if self.devices is None or self.devices.profile is None:
            return None
        p = Path(self.devices.profile).expanduser()
        return Path(self.source).parent / p if not p.is_absolute() and self.source else p

    def data_files(self) -> list[Path]:
        """Every file ``data.path`` reads (a folder's tables included), for the fingerprint."""
        from ..data.tables import table_files

        p = self.data_path()
        paths = p if isinstance(p, list) else ([] if p is None else [p])
        out = []
        for q in paths:
            out.extend(table_files(q) if q.is_dir() else [q])
        return out

    def protocol_config(self):
        """The method's validated config object (raises ScenarioError). Validated once: asked
        again for the same method and params (the run spec asks after loading did), the same
        object comes back."""
        from ..protocols import get

        held = self._method_config
        if held is not None and held[0] == self.method and held[1] == self.params:
            return held[2]
        proto = get(self.method)
        try:
            cfg = proto.config(**self.params)
        except ValidationError as e:
            raise ScenarioError(format_error(self.source, e, prefix=("params",), model=proto.config,
                                        overrides=self._overrides)) from None
        self._method_config = (self.method, copy.deepcopy(self.params), cfg)
        return cfg

    # (method, params, config) that protocol_config validated last
    _method_config: tuple | None = None

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
        if not d["faults"]["kinds"]:  # likewise
            del d["faults"]["kinds"]
        if not d["central"]:  # likewise
            del d["central"]
        return yaml.safe_dump(d, sort_keys=False)
