"""Seeds before runs: a study file's cells run only from a commit that holds the file.

A study file declares its seeds, grid and modes; a result means what its page says only
if they were fixed before the runs. So ``raymvc sweep studies/X.yaml`` runs a study only
when git tracks the study file and the scenario files it names, and none of them differs
from ``HEAD`` (staged or not). Each cell then records two commits in its
``summary.json`` (under ``study``), and the pages read them back from the cell records:

* ``seeds_commit`` -- the commit that last changed the study file
  (``git log -1 --format=%H -- FILE``): the one that declares its seeds;
* ``head_commit`` -- ``HEAD`` when the cell ran.

Outside a git checkout no commit can declare anything: the sweep is refused unless it is
given ``allow_uncommitted`` (``--allow-uncommitted``), and then both fields read
``uncommitted``; so they do for a checkout whose files differ from ``HEAD``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..scenario import ScenarioError

UNCOMMITTED = "uncommitted"  # a cell run with --allow-uncommitted
NOT_RECORDED = "not recorded"  # a cell record from before records named their commits
COMMIT_FIELDS = ("seeds_commit", "head_commit")
HOW = "commit the study file (its seeds, grid and modes) before running it"


@dataclass(frozen=True)
class Declared:
    """Where a study's cells run: its file (relative to the checkout where there is one),
    the commit that declares its seeds and ``HEAD``; both :data:`UNCOMMITTED` when the
    check was waived."""

    file: str
    seeds_commit: str
    head_commit: str

    def record(self) -> dict:
        """What each cell's ``summary.json`` keeps under ``study``."""
        return {"file": self.file, "seeds_commit": self.seeds_commit, "head_commit": self.head_commit}


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess | None:
    """``git -C cwd args`` (None where git is not installed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # the checkout at cwd, nothing else
    try:
        return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=60, env=env)
    except (FileNotFoundError, PermissionError):
        return None
    except subprocess.TimeoutExpired:
        raise ScenarioError(f"{cwd}: git did not answer within 60 s") from None


def checkout_root(path: str | Path) -> Path | None:
    """The root of the git checkout holding ``path``; None outside one or without git.
    A checkout git refuses to read (e.g. another user's) is a ScenarioError."""
    where = Path(path).resolve().parent
    got = _git(where, "rev-parse", "--show-toplevel")
    if got is None:
        return None
    if got.returncode != 0:
        err = got.stderr.strip()
        if "not a git repository" in err:
            return None
        raise ScenarioError(f"{path}: git cannot read its checkout ({(err.splitlines() or ['?'])[-1][:200]})")
    return Path(got.stdout.strip()).resolve()


def _inside(root: Path, path: str | Path) -> str | None:
    """``path`` relative to ``root`` (git's spelling), or None if it lies outside."""
    p = Path(path).resolve()
    return p.relative_to(root).as_posix() if p.is_relative_to(root) else None


def last_commit(path: str | Path, root: Path | None = None) -> str | None:
    """The commit that last changed ``path`` (full hash); None outside a checkout or if
    no commit holds it."""
    root = root or checkout_root(path)
    rel = _inside(root, path) if root is not None else None
    if rel is None:
        return None
    got = _git(root, "log", "-1", "--format=%H", "--", rel)
    if got is None or got.returncode != 0:
        return None
    return got.stdout.strip() or None


@functools.lru_cache(maxsize=256)
def file_at(root: Path, commit: str, rel: str) -> str | None:
    """The text of ``rel`` (relative to the checkout ``root``) at ``commit``; None where the
    checkout holds no such file or commit, or git is not installed."""
    got = _git(root, "show", f"{commit}:{rel}")
    return got.stdout if got is not None and got.returncode == 0 else None


@functools.lru_cache(maxsize=4096)  # a page asks once per cell; many cells share a commit
def is_ancestor(root: Path, older: str, newer: str) -> bool | None:
    """Whether commit ``older`` is ``newer`` or one of its ancestors; None when the
    checkout does not hold ``newer`` (a cell run at a commit made elsewhere)."""
    if older == newer:
        return True
    known = _git(root, "cat-file", "-e", f"{newer}^{{commit}}")
    if known is None or known.returncode != 0:
        return None
    got = _git(root, "merge-base", "--is-ancestor", older, newer)
    return None if got is None or got.returncode not in (0, 1) else got.returncode == 0


def check_committed(study: str | Path, scenarios: list[str | Path], allow_uncommitted: bool = False) -> Declared:
    """The commits a study's cells run at; a ScenarioError of one line naming the file and
    what to do when the study file or one of its ``scenarios`` is not committed unchanged
    (``allow_uncommitted``: run anyway, recorded as :data:`UNCOMMITTED`)."""
    root = checkout_root(study)
    if root is None:
        if allow_uncommitted:
            return Declared(str(study), UNCOMMITTED, UNCOMMITTED)
        raise ScenarioError(f"{study}: not in a git checkout, so no commit declares its seeds; {HOW} in a git "
                            "repository, or pass --allow-uncommitted (its records then say 'uncommitted')")
    rel = _inside(root, study)
    try:
        _check_files(root, study, rel, scenarios)
    except ScenarioError:
        if allow_uncommitted:
            return Declared(rel, UNCOMMITTED, UNCOMMITTED)
        raise
    seeds = last_commit(study, root)
    head = _git(root, "rev-parse", "HEAD")
    if not seeds or head is None or head.returncode != 0:  # tracked and unchanged, so both exist: git misbehaved
        raise ScenarioError(f"{study}: git names no commit that holds it; {HOW}")
    return Declared(rel, seeds, head.stdout.strip())


def _check_files(root: Path, study: str | Path, rel: str, scenarios: list[str | Path]) -> None:
    """Every file tracked and the same as in ``HEAD``, else one line naming the first that is not."""
    files = {rel: str(study)}
    for sc in dict.fromkeys(str(s) for s in scenarios):
        inside = _inside(root, sc)
        if inside is None:
            raise ScenarioError(f"{sc}: a scenario of {study}, lies outside its git checkout ({root}); "
                                "keep it in the checkout and commit it before running the study")
        files.setdefault(inside, sc)
    tracked = _git(root, "ls-files", "-z", "--", *files)
    changed = _git(root, "diff", "--name-only", "-z", "HEAD", "--", *files)
    if tracked is None or changed is None:
        raise ScenarioError(f"{study}: git is not installed, so no commit declares its seeds; {HOW}")
    known = set(tracked.stdout.split("\0")) if tracked.returncode == 0 else set()
    dirty = set(changed.stdout.split("\0")) if changed.returncode == 0 else set(files)  # no HEAD: nothing committed
    for path, shown in files.items():
        what = HOW if path == rel else f"commit it before running {study}"
        whose = "" if path == rel else f"a scenario of {study}, "
        if path not in known:
            raise ScenarioError(f"{shown}: {whose}not committed (git does not track it); {what}")
        if path in dirty:
            raise ScenarioError(f"{shown}: {whose}has uncommitted changes; {what}")


def commit_status(root: Path | None, declared: str | None, row: dict) -> str:
    """How a cell record stands to the commit that declares its study's seeds:
    ``after`` (ran at it or later), ``before``, ``uncommitted``, ``not recorded`` or
    ``unknown`` (ran at a commit this checkout does not hold, or no commit is known here)."""
    seeds, head = (str(row.get(k) or "") for k in COMMIT_FIELDS)
    if not seeds and not head:
        return NOT_RECORDED
    if UNCOMMITTED in (seeds, head):
        return UNCOMMITTED
    if not declared or root is None:
        return "unknown"
    ok = is_ancestor(root, declared, head)
    return "unknown" if ok is None else "after" if ok else "before"
