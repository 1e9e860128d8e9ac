"""Checkpoint files of a run folder (``runtime.checkpoint: true``), for ``raymvc run --resume``.

After every round the server node hands over its state (its traffic ledger apart, as
columns), the protocol server's and each live client's as codec frames (see
:mod:`raymvc.runtime.state`); they are written to ``DIR/.checkpoint-<rounds>/`` and
``DIR/checkpoint.json`` is then replaced atomically to point at that folder, so a run
killed at any moment -- SIGKILL included -- leaves one complete checkpoint. A run that ends normally removes its checkpoints.

``checkpoint.json`` also records the code version that wrote it (a digest of raymvc's
sources and the method's modules) and the SHA-256 of every file: :func:`load` refuses a
checkpoint of other code, a changed file, or a link in place of a file, with one line
(:class:`CheckpointError`). The checksums catch corruption, not a person who can write the
run folder: such a person can rewrite the sums (and the run's results) too, so resume only
from folders you trust. What any checkpoint can set is limited all the same: the engine's
declared state and the protocol objects' own attributes, never their inputs (config,
shard, context) nor an attribute a fresh party lacks (:func:`raymvc.runtime.state.load_state`),
checked before anything in the folder changes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..results import ResultsError, _remove, read_file, sha256_file, write_file

POINTER = "checkpoint.json"
_FOLDER = re.compile(r"\.checkpoint-\d+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_POINTER_BYTES = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message is one line."""


def save(out: Path, ck: dict, rounds_logged: int, version: str) -> None:
    folder = out / f".checkpoint-{rounds_logged}"
    if folder.exists() or folder.is_symlink():
        _remove(folder)
    folder.mkdir()
    files = {"node.bin": ck["node"], "ledger.bin": ck["ledger"], "server.bin": ck["server"],
             **{f"client-{int(cid)}.bin": data for cid, data in ck["clients"].items()}}
    for name, data in files.items():
        write_file(folder / name, data)
    meta = {"folder": folder.name, "rounds_logged": rounds_logged, "clients": sorted(int(c) for c in ck["clients"]),
            "code_version": version, "sha256": {name: sha256_file(data) for name, data in files.items()}}
    write_file(out / POINTER, json.dumps(meta))
    for old in out.glob(".checkpoint-*"):
        if old.name != folder.name:
            try:
                _remove(old)
            except OSError:
                pass


def _meta(out: Path) -> dict:
    try:
        meta = json.loads(read_file(out / POINTER, limit=MAX_POINTER_BYTES))
    except ResultsError as e:
        raise CheckpointError(str(e)) from None
    except ValueError:
        raise CheckpointError(f"{POINTER}: corrupt (not valid JSON)") from None
    ok = (isinstance(meta, dict) and isinstance(meta.get("folder"), str) and _FOLDER.fullmatch(meta["folder"])
          and type(meta.get("rounds_logged")) is int and meta["rounds_logged"] >= 0
          and isinstance(meta.get("clients"), list) and all(type(c) is int and c >= 0 for c in meta["clients"])
          and isinstance(meta.get("sha256"), dict)
          and all(isinstance(v, str) and _SHA256.fullmatch(v) for v in meta["sha256"].values()))
    if not ok:
        raise CheckpointError(f"{POINTER}: corrupt (not a checkpoint description of this version of raymvc)")
    return meta


def load(out: Path, version: str) -> tuple[dict, int]:
    """The last checkpoint of ``out`` and how many lines of ``rounds.jsonl`` it covers.

    ``version``: :func:`raymvc.provenance.code_version` of the method; a checkpoint written by other code,
    a file that changed since it was written, or a link is a :class:`CheckpointError`.
    """
    meta = _meta(out)
    if meta.get("code_version") != version:
        raise CheckpointError("the checkpoint was written by another version of raymvc or of the method; "
                              "run the scenario again from the start")
    folder = out / meta["folder"]
    if folder.is_symlink() or not folder.is_dir():
        raise CheckpointError(f"{meta['folder']}: missing, or not a folder")
    names = ["node.bin", "ledger.bin", "server.bin", *(f"client-{c}.bin" for c in meta["clients"])]
    if sorted(meta["sha256"]) != sorted(names):
        raise CheckpointError(f"{POINTER}: its checksums do not name the checkpoint's files")
    data = {}
    for name in names:
        try:
            data[name] = read_file(folder / name)
        except ResultsError as e:
            raise CheckpointError(str(e)) from None
        if sha256_file(data[name]) != meta["sha256"][name]:
            raise CheckpointError(f"{meta['folder']}/{name}: changed since the run wrote it (its SHA-256 differs "
                                  f"from the one in {POINTER})")
    ck = {"node": data["node.bin"], "ledger": data["ledger.bin"], "server": data["server.bin"],
          "clients": {c: data[f"client-{c}.bin"] for c in meta["clients"]}}
    return ck, meta["rounds_logged"]


def exists(out: Path) -> bool:
    return (out / POINTER).is_file() or (out / POINTER).is_symlink()


def clear(out: Path) -> None:
    for old in [out / POINTER, *out.glob(".checkpoint-*")]:
        try:
            _remove(old)
        except OSError:
            pass
