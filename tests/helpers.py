"""Small helpers the fault and device tests share (imported as ``helpers``)."""

from __future__ import annotations

import json
from pathlib import Path

from raymvc.cli import main
from raymvc.driver import run_scenario
from raymvc.scenario import load_scenario


def run_rounds(path: Path, out: Path, *overrides: str) -> list[dict]:
    """Run a scenario file in process (it must finish) and return its round records."""
    s = run_scenario(load_scenario(path, list(overrides)), out, progress=lambda line: None)
    assert s["status"] in ("completed", "degraded"), s.get("error")
    return [json.loads(x) for x in (Path(s["out_dir"]) / "rounds.jsonl").read_text().splitlines()]


def stopped_then_resumed(path: Path, out: Path, after_round: int) -> list[dict]:
    """Run a scenario file in process with checkpoints, stop it once round ``after_round`` is
    recorded, resume it with ``raymvc run --resume`` and return the round records of both parts."""
    sc = load_scenario(path, ["runtime.checkpoint=true"])

    def stop(record):
        if record["round"] == after_round:
            raise KeyboardInterrupt

    assert run_scenario(sc, out, progress=lambda line: None, on_round=stop)["status"] == "interrupted"
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    return [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]


def validate_fails_in_one_line(path: Path, capsys, expected: str) -> None:
    """``raymvc validate path`` exits 2 with one line naming the file and saying ``expected``."""
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith(f"error: {path}: "), err
    assert expected in err, err


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS`` with a test identity; its output, stripped."""
    import subprocess

    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=raymvc tests", "-c", "user.email=tests@raymvc",
                           "-c", "commit.gpgsign=false", *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit_all(root: Path) -> str:
    """Commit everything under ``root`` (made a git checkout if it is none); returns HEAD.
    A study's seeds come before its runs: only rows swept from a commit enter its page."""
    if not (root / ".git").exists():
        git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "--allow-empty", "-m", "declare")
    return git(root, "rev-parse", "HEAD")
