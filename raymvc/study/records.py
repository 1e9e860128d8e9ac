"""Cell records that verify themselves: which rows of ``studies/results/<study>.csv`` may
enter a mean, and whether each row's numbers are the ones its labels give.

A study's record keeps one row per cell (its sweep.csv row, the commits it ran at, a
SHA-256 of its ``labels.csv``); beside it, ``<study>.labels`` keeps each row's labels in a
compact form (:func:`encode_labels`). :func:`check_record` then decides, row by row:

* **recomputed** -- the labels are kept: their hash and every score the row states
  (ACC, NMI, ARI and the ``metric.*`` columns) are computed again from them and the cell's
  data set; a row whose numbers differ is **refused** (it enters nothing);
* **admitted or apart by commit** -- a row made at or after the commit that declares its
  study's seeds enters the means; one made before it, from an uncommitted file, at a commit
  this checkout does not hold, or with no commit recorded is listed apart with the reason,
  unless ``studies/legacy.yaml`` names its study as legacy with a reason *and* the row
  stands unchanged in the record as it was before records named their commits
  (:data:`LEGACY_FILE`);
* a row whose seed or cell the study file no longer declares is listed apart too.

``raymvc verify studies`` runs this over a folder of study files; the repository's page
generator runs it before it writes a page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..results.folder import ResultsError, read_file, short_value, write_file
from ..results.status import FINISHED
from ..safeio import SafeReadError, csv_rows
from ..scenario import ScenarioError
from .declared import NOT_RECORDED, checkout_root, commit_status, file_at, last_commit
from .files import Study, load_study

RECORD_DIR = "results"  # studies/results/<study>.csv (+ .labels)
LABELS_SUFFIX = ".labels"
LEGACY_FILE = "legacy.yaml"
MAX_RECORD = 512 << 20  # bytes of a record or labels file read back
MAX_LABELS = 10_000_000  # labels one row may hold
SCORE_COLUMNS = ("acc", "nmi", "ari", "metric.fscore", "metric.purity", "metric.kappa")
ADMITTED = "after"

# why a row is apart (commit_status values, and this module's own)
REASONS = {
    "before": "ran before the commit that declares the study's seeds",
    "uncommitted": "ran from a study file no commit held",
    "unknown": "ran at a commit this checkout does not hold",
    NOT_RECORDED: "no commit recorded (and not a legacy row of this study)",
    "seed": "its seed or grid point is no longer one the study file declares",
    "refused": "its numbers differ from those its stored labels give",
    "scenario": "a scenario or side file its run names changed after it ran",
}


# -- labels, compactly ------------------------------------------------------------------------
def encode_labels(labels) -> str:
    """``u1:`` or ``u2:``/``u4:`` + base64 of the zlib-compressed labels + 1 (so -1, "no
    label", is 0) in the smallest unsigned type that holds them."""
    y = np.asarray(labels, dtype=np.int64).ravel() + 1
    if y.size and y.min() < 0:
        raise ValueError("labels below -1")
    top = int(y.max()) if y.size else 0
    kind = "u1" if top < 1 << 8 else "u2" if top < 1 << 16 else "u4"
    return f"{kind}:{y.size}:" + base64.b64encode(zlib.compress(y.astype(kind).tobytes(), 9)).decode("ascii")


def decode_labels(text: str) -> np.ndarray:
    """The labels :func:`encode_labels` wrote; a ``ValueError`` (one line) for anything else,
    never more than :data:`MAX_LABELS` labels decompressed."""
    kind, _, rest = str(text).partition(":")
    count, _, body = rest.partition(":")
    if kind not in ("u1", "u2", "u4") or not count.isdigit() or int(count) > MAX_LABELS:
        raise ValueError("not a labels code (want u1|u2|u4:COUNT:BASE64)")
    n, width = int(count), int(kind[1])
    try:
        raw = base64.b64decode(body.encode("ascii"), validate=True)
        d = zlib.decompressobj()
        data = d.decompress(raw, n * width + 1)
    except (binascii.Error, zlib.error, UnicodeEncodeError):
        raise ValueError("labels code is corrupt") from None
    if len(data) != n * width or d.unconsumed_tail or not d.eof:
        raise ValueError(f"labels code does not hold {n} labels")
    return np.frombuffer(data, dtype=kind).astype(np.int64) - 1


def labels_sha256(labels) -> str:
    """The SHA-256 of the ``labels.csv`` a run with these labels writes."""
    y = np.asarray(labels, dtype=np.int64).ravel().tolist()
    text = "sample,cluster\n" + "".join(f"{i},{c}\n" for i, c in enumerate(y))
    return hashlib.sha256(text.encode()).hexdigest()


def labels_path(record: Path) -> Path:
    return record.with_suffix(LABELS_SUFFIX)


def read_labels_store(path: Path) -> dict[tuple[str, str], str]:
    """``(cell digest, fingerprint) -> labels code`` from a ``.labels`` file (empty: no file)."""
    if not path.is_file() and not path.is_symlink():
        return {}
    try:
        text = read_file(path, limit=MAX_RECORD).decode("utf-8")
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: not UTF-8 text") from None
    out = {}
    for i, line in enumerate(text.splitlines()):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split(" ")
        if len(parts) != 3:
            raise ResultsError(f"{path}: line {i + 1}: want 'CELL FINGERPRINT CODE'")
        out[(parts[0], parts[1])] = parts[2]
    return out


def write_labels_store(path: Path, codes: dict[tuple[str, str], str]) -> Path:
    lines = ["# cell fingerprint labels (raymvc.study.records.encode_labels): one line per record row"]
    lines += [f"{c} {f} {code}" for (c, f), code in sorted(codes.items())]
    return write_file(path, "\n".join(lines) + "\n")


# -- which rows are this study's cells --------------------------------------------------------
def point_key(point: dict, text: bool = False) -> tuple:
    """A grid point as a hashable key; ``text``: its values are already as sweep.csv writes them."""
    return tuple((k, v if text else short_value(v)) for k, v in sorted(point.items()))


def cell_digests(study: Study) -> dict[tuple, str]:
    """Each cell the study file declares (as :func:`row_cell` keys it) -> its
    :meth:`~raymvc.study.files.Study.cell_digest`."""
    out = {}
    for _, _, run in study.entries():
        for point in study.points():
            for seed in study.run_seeds(run):
                out[(run.id, point_key(point), str(seed))] = study.cell_digest(run, point, seed)
    return out


def row_cell(row: dict, study: Study) -> tuple:
    """(run id, grid point as sweep.csv writes it, seed): one cell of a study."""
    return row["scenario"], point_key({k: row.get(k, "") for k in study.spec.grid}, text=True), str(row["seed"])


def read_record(path: Path, study: Study) -> list[dict]:
    """The record's rows that name ``study`` (a record copied from another study has none)."""
    try:
        rows = csv_rows(read_file(path, limit=MAX_RECORD), what=str(path), required=("study", "scenario", "seed", "status"))
    except SafeReadError as e:
        raise ResultsError(str(e)) from None
    return [r for r in rows if r.get("study") == study.name]


# -- legacy rows --------------------------------------------------------------------------------
def read_legacy(studies_dir: Path) -> dict:
    """``studies/results/legacy.yaml``: ``{"scheme_commit": HASH, "studies": {name: reason}}``
    (empty: no file). Kept beside the records, not in the study files, whose last commit
    declares their seeds."""
    import yaml

    path = studies_dir / RECORD_DIR / LEGACY_FILE
    if not path.is_file():
        return {}
    try:
        doc = yaml.safe_load(read_file(path, limit=1 << 20).decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path}: not YAML ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(doc, dict) or set(doc) - {"scheme_commit", "labels_commit", "studies"}:
        raise ScenarioError(f"{path}: want the keys scheme_commit, labels_commit and studies")
    commit, studies = doc.get("scheme_commit"), doc.get("studies") or {}
    labels = doc.get("labels_commit")
    if labels is not None and not (isinstance(labels, str) and re.fullmatch(r"[0-9a-f]{40}", labels)):
        raise ScenarioError(f"{path}: labels_commit: a full commit hash")
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit) or not isinstance(studies, dict):
        raise ScenarioError(f"{path}: scheme_commit: a full commit hash; studies: name -> reason")
    for name, reason in studies.items():
        if not isinstance(reason, str) or len(reason.strip()) < 20:
            raise ScenarioError(f"{path}: studies.{name}: give the reason in a sentence")
    return {"scheme_commit": commit, "labels_commit": labels,
            "studies": {str(k): v.strip() for k, v in studies.items()}}


LEGACY_SAME = ("scenario", "seed", "status", "fingerprint", "labels_sha256", "acc", "nmi", "ari", "mb")


def _legacy_rows(root: Path | None, legacy: dict, record: Path, study: Study) -> set[tuple] | None:
    """The rows of ``study``'s record as it stood before records named commits (the parent of
    ``scheme_commit``), as keys of :data:`LEGACY_SAME`; None where git cannot say."""
    if root is None or not legacy:
        return None
    try:
        rel = record.resolve().relative_to(root).as_posix()
    except ValueError:
        return None
    text = file_at(root, legacy["scheme_commit"] + "^", rel)
    if text is None:
        return None
    try:
        rows = csv_rows(text, what=rel)
    except SafeReadError:
        return None
    return {tuple(r.get(k, "") for k in LEGACY_SAME) for r in rows if r.get("study", study.name) == study.name}


# -- recomputing a row's numbers ----------------------------------------------------------------
class _Scorer:
    """The scores a cell's labels give, with each cell's data loaded once per scenario."""

    def __init__(self, study: Study):
        self.study = study
        self.runs = study.labels()
        self.cache: dict[tuple, Any] = {}

    def scores(self, row: dict, labels: np.ndarray) -> dict[str, float]:
        from ..data.prepare import prepare
        from ..protocols import get
        from ..results.outcome import final_scores
        from ..scenario import load_scenario, merge_overrides

        run = self.runs[row["scenario"]]
        point = {k: row.get(k, "") for k in self.study.spec.grid}
        point = next((p for p in self.study.points() if point_key(p) == point_key(point, text=True)), None)
        if point is None:
            raise ValueError("its grid point is not the study's")
        key = (run.id, point_key(point), row["seed"])
        if key not in self.cache:
            over = merge_overrides({**run.set, "name": run.id}, point, {"seed": int(row["seed"])})
            sc = load_scenario(self.study.scenario_path(run), over)
            ds, _ = prepare(sc, machine=False)  # the data and its split, not whether this machine could run it
            self.cache = {key: (sc, ds)}  # one data set held at a time
        sc, ds = self.cache[key]
        if len(labels) != ds.n_samples:
            raise ValueError(f"{len(labels)} labels for {ds.n_samples} samples")
        metrics, _ = final_scores(sc, ds, get(sc.method), labels)
        return metrics or {}


def _same(recorded: str, computed: float | None) -> bool:
    try:
        x = float(recorded)
    except (TypeError, ValueError):
        return computed is None
    if computed is None or not math.isfinite(x):
        return False
    return abs(x - computed) <= 1e-9 * max(1.0, abs(x))


SCORE_RANGE = {"ari": (-1.0, 1.0), "metric.kappa": (-1.0, 1.0)}  # the others lie in [0, 1]


def out_of_range(row: dict) -> str | None:
    """Why a row's stated scores cannot be scores (not finite, or outside their range), or None."""
    for col in SCORE_COLUMNS:
        text = row.get(col)
        if text in (None, ""):
            continue
        try:
            x = float(text)
        except ValueError:
            return f"{col} {str(text)[:20]!r} is not a number"
        lo, hi = SCORE_RANGE.get(col, (0.0, 1.0))
        if not (math.isfinite(x) and lo <= x <= hi):
            return f"{col} {str(text)[:20]} is not a score (outside [{lo:g}, {hi:g}])"
    return None


class Unverifiable(Exception):
    """A row's stored labels could not be scored on this machine (its data set is not here):
    nothing is known against the row, and nothing for it."""


def recompute(row: dict, code: str, scorer: _Scorer) -> str | None:
    """None when the row's labels hash and scores are those its stored labels give, else why not."""
    try:
        labels = decode_labels(code)
    except ValueError as e:
        return f"stored labels unreadable ({e})"
    if labels_sha256(labels) != row.get("labels_sha256"):
        return "labels_sha256 is not the hash of its stored labels"
    if row.get("status") not in FINISHED:
        return None
    try:
        got = scorer.scores(row, labels)
    except (ScenarioError, ValueError, OSError) as e:
        raise Unverifiable(f"its labels cannot be scored here ({str(e).splitlines()[0][:160]})") from None
    for col in SCORE_COLUMNS:
        name = col.removeprefix("metric.")
        if col in row and row[col] != "" and not _same(row[col], got.get(name)):
            return f"{col} {row[col]} recorded, {got.get(name)!r} from its labels"
    return None


# -- one study ------------------------------------------------------------------------------
@dataclass
class RecordCheck:
    """One study's record, sorted: ``admitted`` rows enter means, tables and sentences;
    ``apart`` rows are listed with their reason (a key of :data:`REASONS`); ``refused``:
    rows whose numbers differ from their stored labels (also in ``apart``, with the
    detail); ``recomputed``: admitted rows whose numbers were computed again from their
    labels; ``legacy``: admitted rows without commits, by the legacy file's leave;
    ``rows``: all of them, once per cell (what a rewritten record keeps)."""

    study: Study
    rows: list[dict] = field(default_factory=list)  # every row of the study's cells, once per cell
    admitted: list[dict] = field(default_factory=list)
    apart: list[tuple[dict, str, str]] = field(default_factory=list)  # row, reason key, detail
    recomputed: int = 0
    legacy: int = 0
    legacy_reason: str = ""
    foreign: int = 0
    unverifiable: list[tuple[dict, str]] = field(default_factory=list)  # labels kept, but not scorable here

    @property
    def refused(self) -> list[tuple[dict, str, str]]:
        return [a for a in self.apart if a[1] == "refused"]

    def apart_counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for _, why, _ in self.apart:
            out[why] += 1
        return dict(out)


class _SinceRun:
    """Whether the files a study's run names are, now, what a row ran from: the run's
    scenario file compared as YAML without its ``runtime`` block (where the run's parts are
    placed and for how long it waits: nothing a result depends on) and without comments,
    and every side file the run's settings name (a ``*.path`` value) byte for byte. The
    study file's commit does not cover them, and a row's cell digest names a scenario file,
    not what it holds."""

    def __init__(self, root: Path | None):
        self.root = root
        self._cache: dict[tuple[str, str], bool] = {}

    def since(self, study: Study, run, head: str) -> str:
        """Empty when nothing changed (or no checkout or commit can tell), else which file did."""
        if self.root is None or not head:
            return ""
        scenario = Path(study.scenario_path(run)).resolve()
        files = [(scenario, True)]
        files += [((scenario.parent / v).resolve(), False) for k, v in run.set.items()
                  if k.endswith(".path") and isinstance(v, str)]
        for path, is_scenario in files:
            try:
                rel = path.relative_to(self.root.resolve()).as_posix()
            except ValueError:
                continue  # outside the checkout: no commit to compare with
            key = (rel, head)
            if key not in self._cache:
                self._cache[key] = self._differs(path, rel, head, is_scenario)
            if self._cache[key]:
                return f"{rel} is not what it was at {head[:7]}, where the row ran"
        return ""

    def _differs(self, path: Path, rel: str, head: str, is_scenario: bool) -> bool:
        import yaml

        then = file_at(self.root, head, rel)
        try:
            now = path.read_text() if path.is_file() else None
        except OSError:
            now = None
        if then is None or now is None:
            return then != now
        if not is_scenario:
            return then != now
        try:
            a, b = yaml.safe_load(then), yaml.safe_load(now)
        except yaml.YAMLError:
            return then != now
        if isinstance(a, dict) and isinstance(b, dict):
            a, b = ({k: v for k, v in d.items() if k != "runtime"} for d in (a, b))
        return a != b


def check_rows(study: Study, rows: list[dict], codes: dict[tuple[str, str], str], *, record: Path | None = None,
               legacy: dict | None = None, recompute_scores: bool = True) -> RecordCheck:
    """Sort ``rows`` (a record's, or a sweep's with its facts) as the module docstring says."""
    out = RecordCheck(study)
    runs, seeds = study.labels(), {str(s) for s in study.seeds()}
    ids = set(runs)
    digests = cell_digests(study)
    root = checkout_root(study.path)
    declared = last_commit(study.path, root) if root is not None else None
    legacy = legacy or {}
    labels_kept = legacy.get("labels_commit")  # records keep labels from this commit on
    reason = (legacy.get("studies") or {}).get(study.name)
    old = _legacy_rows(root, legacy, record, study) if (reason and record is not None) else None
    out.legacy_reason = reason or ""
    scorer = _Scorer(study)
    files_changed = _SinceRun(root)
    seen = set()
    for r in rows:
        if r.get("scenario") not in ids:  # a run the file no longer names: another study's row
            out.foreign += 1
            continue
        key = row_cell(r, study)
        declared_cell = str(r.get("seed")) in seeds and key in digests
        if declared_cell and (not r.get("cell") or r.get("cell") != digests.get(key)):
            out.foreign += 1  # another study's cell of the same name, or an edited one
            continue
        if key in seen:  # the first row of a cell wins (a sweep folder's before the earlier record's)
            continue
        seen.add(key)
        out.rows.append(r)
        if not declared_cell:
            out.apart.append((r, "seed", ""))
            continue
        bad = out_of_range(r)
        if bad is not None:
            out.apart.append((r, "refused", bad))
            continue
        code = codes.get((r.get("cell", ""), r.get("fingerprint", "")))
        checked = False
        if code is not None and recompute_scores:
            try:
                why = recompute(r, code, scorer)
            except Unverifiable as e:
                out.unverifiable.append((r, str(e)))
            else:
                if why is not None:
                    out.apart.append((r, "refused", why))
                    continue
                checked = True
        elif code is None and labels_kept and r.get("status") in FINISHED and \
                commit_status(root, labels_kept, r) == ADMITTED:  # made since records keep labels: they must be here
            out.apart.append((r, "refused", "its labels are not stored beside the record"))
            continue
        status = commit_status(root, declared, r)
        if status == NOT_RECORDED and old is not None and tuple(r.get(k, "") for k in LEGACY_SAME) in old:
            out.legacy += 1
        elif status != ADMITTED:
            out.apart.append((r, status if status in REASONS else "unknown", ""))
            continue
        else:
            changed = files_changed.since(study, runs[r["scenario"]], str(r.get("head_commit") or ""))
            if changed:
                out.apart.append((r, "scenario", changed))
                continue
        out.recomputed += checked
        out.admitted.append(r)
    return out


def check_record(study: Study, studies_dir: Path, legacy: dict | None = None) -> RecordCheck | None:
    """:func:`check_rows` over ``studies_dir/results/<study>.csv`` (None: no record)."""
    record = studies_dir / RECORD_DIR / f"{study.name}.csv"
    if not record.is_file():
        return None
    rows = read_record(record, study)
    codes = read_labels_store(labels_path(record))
    return check_rows(study, rows, codes, record=record, legacy=legacy if legacy is not None else read_legacy(studies_dir))


def verify_studies(studies_dir: Path, only: list[str] | None = None, say=print) -> int:
    """``raymvc verify STUDIES``: check every study's record; print one line per study and
    one per refused row. Returns 0 when no row is refused, else 1."""
    legacy = read_legacy(studies_dir)
    names = {p.stem for p in studies_dir.glob("*.yaml")}
    missing = sorted(set(only or ()) - names)
    if missing:
        raise ScenarioError(f"--only: no study file {missing[0]!r} in {studies_dir}")
    unknown = sorted(set(legacy.get("studies") or {}) - names)
    if unknown:
        raise ScenarioError(f"{studies_dir / RECORD_DIR / LEGACY_FILE}: studies.{unknown[0]}: no such study file")
    refused = 0
    for f in sorted(studies_dir.glob("*.yaml")):
        if only and f.stem not in only:
            continue
        st = load_study(f)
        res = check_record(st, studies_dir, legacy)
        if res is None:
            say(f"{st.name}: no record")
            continue
        counts = res.apart_counts()
        apart = ", ".join(f"{n} {REASONS[k]}" for k, n in sorted(counts.items()) if k != "refused")
        say(f"{st.name}: {len(res.admitted)} rows admitted ({res.recomputed} recomputed from their labels"
            + (f", {len(res.unverifiable)} with labels not scorable here" if res.unverifiable else "")
            + (f", {res.legacy} legacy" if res.legacy else "") + ")"
            + (f"; apart: {apart}" if apart else "") + (f"; {len(res.refused)} REFUSED" if res.refused else ""))
        for r, _, why in res.refused:
            say(f"  refused: {st.name} {r.get('scenario')} seed {r.get('seed')}: {why}")
        refused += len(res.refused)
    return 1 if refused else 0


__all__ = ["encode_labels", "decode_labels", "labels_sha256", "labels_path", "read_labels_store", "write_labels_store",
           "cell_digests", "row_cell", "point_key", "read_record", "read_legacy", "check_rows", "check_record",
           "verify_studies", "RecordCheck", "REASONS", "RECORD_DIR", "LEGACY_FILE"]
