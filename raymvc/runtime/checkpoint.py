"""Checkpoint files of a run folder (``runtime.checkpoint: true``), for ``raymvc run --resume``.

After every round the server node hands over its state, the protocol server's and each
live client's as codec frames (see :mod:`raymvc.runtime.state`); they are written to
``DIR/.checkpoint-<rounds>/`` and ``DIR/checkpoint.json`` is then replaced atomically to
point at that folder, so a run killed at any moment -- SIGKILL included -- leaves one
complete checkpoint. A run that ends normally removes its checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

POINTER = "checkpoint.json"


def save(out: Path, ck: dict, rounds_logged: int) -> None:
    folder = out / f".checkpoint-{rounds_logged}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / "node.bin").write_bytes(ck["node"])
    (folder / "server.bin").write_bytes(ck["server"])
    for cid, data in ck["clients"].items():
        (folder / f"client-{int(cid)}.bin").write_bytes(data)
    meta = {"folder": folder.name, "rounds_logged": rounds_logged, "clients": sorted(int(c) for c in ck["clients"])}
    tmp = out / (POINTER + ".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, out / POINTER)
    for old in out.glob(".checkpoint-*"):
        if old.name != folder.name:
            shutil.rmtree(old, ignore_errors=True)


def load(out: Path) -> tuple[dict, int]:
    """The last checkpoint of ``out`` and how many lines of ``rounds.jsonl`` it covers."""
    meta = json.loads((out / POINTER).read_text())
    folder = out / Path(meta["folder"]).name
    ck = {"node": (folder / "node.bin").read_bytes(), "server": (folder / "server.bin").read_bytes(),
          "clients": {c: (folder / f"client-{c}.bin").read_bytes() for c in meta["clients"]}}
    return ck, int(meta["rounds_logged"])


def exists(out: Path) -> bool:
    return (out / POINTER).is_file()


def clear(out: Path) -> None:
    (out / POINTER).unlink(missing_ok=True)
    for old in out.glob(".checkpoint-*"):
        shutil.rmtree(old, ignore_errors=True)
