"""Checkpoint files of a run folder (``runtime.checkpoint: true``), for ``raymvc run --resume``.

After every round the server node hands over its state (its traffic ledger apart, as
columns), the protocol server's and each live client's as codec frames (see
:mod:`raymvc.runtime.state`); they are written to ``DIR/.checkpoint-<rounds>/`` and
``DIR/checkpoint.json`` is then replaced atomically to point at that folder, so a run
killed at any moment -- SIGKILL included -- leaves one complete checkpoint. A run that ends normally removes its checkpoints.

``checkpoint.json`` also records who wrote it -- the run's fingerprint (its resolved
scenario, data and trace files and code) and the code version -- the SHA-256 of every
file, of the ``rounds.jsonl`` lines it covers and of its own other fields: :func:`load`
refuses, with one line (:class:`CheckpointError`) and before anything changes, a
checkpoint of an edited scenario, other data or code, a changed file, or a link in place
of a file. The checksums catch corruption, not a person who can write the
run folder: such a person can rewrite the sums (and the run's results) too, so resume only
from folders you trust. What any checkpoint can set is limited all the same: the engine's
declared state and the protocol objects' own attributes, never their inputs (config,
shard, context) nor an attribute a fresh party lacks (:func:`raymvc.runtime.state.load_state`),
checked before anything in the folder changes.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..results.folder import ROUNDS_FILE, ResultsError, read_file, remove_entry, sha256_file, write_file
from ..safeio import SafeReadError, json_loads

POINTER = "checkpoint.json"
_FOLDER = re.compile(r"\.checkpoint-\d+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_POINTER_BYTES = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message is one line."""


def identity(fingerprint: str, version: str) -> dict:
    """What a resume must find unchanged: the run's fingerprint (the resolved scenario, the data
    and trace files, the code: :func:`raymvc.results.provenance.fingerprint`) and the code version alone
    (so the refusal can say which of the two moved)."""
    return {"fingerprint": fingerprint, "code_version": version}


def seal_sum(meta: dict) -> str:
    """The SHA-256 that `checkpoint.json` carries of its own other fields."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def save(out: Path, ck: dict, rounds_logged: int, who: dict, rounds_sha256: str) -> None:
    """Write checkpoint ``rounds_logged`` (the number of lines of ``rounds.jsonl`` it covers,
    whose SHA-256 is ``rounds_sha256``) of the run ``who`` (:func:`identity`)."""
    folder = out / f".checkpoint-{rounds_logged}"
    if folder.exists() or folder.is_symlink():
        remove_entry(folder)
    folder.mkdir()
    files = {"node.bin": ck["node"], "ledger.bin": ck["ledger"], "server.bin": ck["server"],
             **{f"client-{int(cid)}.bin": data for cid, data in ck["clients"].items()}}
    for name, data in files.items():
        write_file(folder / name, data)
    meta = {"folder": folder.name, "rounds_logged": rounds_logged, "rounds_sha256": rounds_sha256,
            "clients": sorted(int(c) for c in ck["clients"]), **who,
            "sha256": {name: sha256_file(data) for name, data in files.items()}}
    meta["meta_sha256"] = seal_sum(meta)
    write_file(out / POINTER, json.dumps(meta))
    for old in out.glob(".checkpoint-*"):
        if old.name != folder.name:
            try:
                remove_entry(old)
            except OSError:
                pass


def _meta(out: Path) -> dict:
    try:
        meta = json_loads(read_file(out / POINTER, limit=MAX_POINTER_BYTES), max_depth=3, what=POINTER)
    except ResultsError as e:
        raise CheckpointError(str(e)) from None
    except SafeReadError as e:
        raise CheckpointError(str(e).replace(f"{POINTER}: ", f"{POINTER}: corrupt, ", 1)) from None
    ok = (isinstance(meta, dict) and isinstance(meta.get("folder"), str) and _FOLDER.fullmatch(meta["folder"])
          and type(meta.get("rounds_logged")) is int and meta["rounds_logged"] >= 0
          and meta["folder"] == f".checkpoint-{meta['rounds_logged']}"
          and all(isinstance(meta.get(k), str) and _SHA256.fullmatch(meta[k]) for k in ("rounds_sha256", "meta_sha256"))
          and isinstance(meta.get("fingerprint"), str) and isinstance(meta.get("code_version"), str)
          and isinstance(meta.get("clients"), list) and all(type(c) is int and c >= 0 for c in meta["clients"])
          and isinstance(meta.get("sha256"), dict)
          and all(isinstance(v, str) and _SHA256.fullmatch(v) for v in meta["sha256"].values()))
    if not ok:
        raise CheckpointError(f"{POINTER}: corrupt (not a checkpoint description of this version of raymvc)")
    if meta["meta_sha256"] != seal_sum(meta):
        raise CheckpointError(f"{POINTER}: changed since the run wrote it (its own SHA-256 differs)")
    return meta


def load(out: Path, who: dict) -> tuple[dict, int]:
    """The last checkpoint of ``out`` and how many lines of ``rounds.jsonl`` it covers.

    ``who``: :func:`identity` of the run as it would resume now. A checkpoint of a run with
    another scenario, data, trace or code, a file that changed since it was written (the
    pointer, a state file, the rounds it covers), or a link is a :class:`CheckpointError`,
    raised before anything in the folder changes.
    """
    meta = _meta(out)
    if meta["code_version"] != who["code_version"]:
        raise CheckpointError("the checkpoint was written by another version of raymvc or of the method; "
                              "run the scenario again from the start")
    if meta["fingerprint"] != who["fingerprint"]:
        raise CheckpointError("the run's scenario.yaml, data or trace files changed since it started (fingerprint "
                              f"{who['fingerprint']}, the checkpoint's {meta['fingerprint'][:24]}); a resumed run "
                              "must be the run that stopped: run the edited scenario from the start")
    folder = out / meta["folder"]
    if folder.is_symlink() or not folder.is_dir():
        raise CheckpointError(f"{meta['folder']}: missing, or not a folder")
    names = ["node.bin", "ledger.bin", "server.bin", *(f"client-{c}.bin" for c in meta["clients"])]
    if sorted(meta["sha256"]) != sorted(names):
        raise CheckpointError(f"{POINTER}: its checksums do not name the checkpoint's files")
    try:
        lines = read_file(out / ROUNDS_FILE).splitlines(keepends=True) \
            if (out / ROUNDS_FILE).exists() or (out / ROUNDS_FILE).is_symlink() else []
    except ResultsError as e:
        raise CheckpointError(str(e)) from None
    logged = meta["rounds_logged"]
    if len(lines) < logged or hashlib.sha256(b"".join(lines[:logged])).hexdigest() != meta["rounds_sha256"]:
        raise CheckpointError(f"{ROUNDS_FILE}: its first {logged} rounds are not the ones the checkpoint covers "
                              "(the file or checkpoint.json changed since the run wrote them)")
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
    return ck, logged


def exists(out: Path) -> bool:
    return (out / POINTER).is_file() or (out / POINTER).is_symlink()


def clear(out: Path) -> None:
    for old in [out / POINTER, *out.glob(".checkpoint-*")]:
        try:
            remove_entry(old)
        except OSError:
            pass
