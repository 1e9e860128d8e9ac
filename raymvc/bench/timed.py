"""Time a child process as a user meets it: until it has printed its answer, and until it ends."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Timed:
    answer: str  # stdout up to and including the line that ended the answer
    answer_s: float  # process start -> answer read
    process_s: float  # process start -> process ended

    @property
    def exit_s(self) -> float:
        return self.process_s - self.answer_s


def run_timed(cmd: list[str], *, last_line: Callable[[str], bool], cwd=None, env=None) -> Timed:
    """Run ``cmd``; its answer is stdout up to the first line for which ``last_line`` is true.
    A failed process (or one with no answer) raises RuntimeError with the end of its stderr."""
    with tempfile.TemporaryFile(mode="w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        answer = ""
        for line in proc.stdout:
            answer += line
            if last_line(line):
                break
        t_answer = time.perf_counter()
        proc.stdout.read()  # whatever follows (nothing, normally) until the process ends
        rc = proc.wait()
        t_end = time.perf_counter()
        if rc != 0 or not answer.strip():
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} ended with {rc}: {err.read()[-600:]}")
    return Timed(answer=answer, answer_s=t_answer - t0, process_s=t_end - t0)
