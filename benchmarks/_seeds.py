"""What the per-seed benchmark scripts (``feddmvc_hw.py``, ``fcuif_hw.py``) share: their
command line, one in-process run of a scenario at a seed, and mean ± std."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from raymvc.driver import run_scenario
from raymvc.scenario import load_scenario


def parser(doc: str, md: Path) -> argparse.ArgumentParser:
    """``--seeds``, ``--set``, ``--out`` and ``--md`` (default ``md``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="scenario override, as for `raymvc run --set` (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="where the run folders go (default: a temp folder)")
    ap.add_argument("--md", type=Path, default=md, help="table written here")
    return ap


def seeds_and_out(args, prefix: str) -> tuple[list[int], Path]:
    return [int(s) for s in args.seeds.split(",")], args.out or Path(tempfile.mkdtemp(prefix=prefix))


def run(path: Path, seed: int, overrides: list[str], run_dir: Path) -> dict:
    """One run in process; its metrics, MB, wall seconds and status (raises ScenarioError on bad input)."""
    sc = load_scenario(path, overrides=["runtime.backend=local", f"seed={seed}", *overrides])
    s = run_scenario(sc, run_dir, progress=lambda line: None)
    m = s["metrics"] or {}
    return {"seed": seed, "acc": m.get("acc", np.nan), "nmi": m.get("nmi", np.nan), "ari": m.get("ari", np.nan),
            "mb": s["communication"]["mb_total"], "wall": s["timing"]["wall_s"], "status": s["status"]}


def pm(a: np.ndarray, fmt: str = ".3f") -> str:
    return f"{a.mean():{fmt}} ± {a.std():{fmt}}"
