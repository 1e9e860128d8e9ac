"""The ``raymvc`` command with a gate after one round, for tests that act on a run in flight.

A test that signals, kills or takes a node from a running run does it while the run
waits at the gate, so the run cannot have ended (or not reached that round) when the
test acts, however fast or loaded the machine is:

    with GatedRun(["run", scenario, ...], at_round=1) as run:
        run.wait_ready()          # round 1 is on disk (and checkpointed, if asked for)
        os.kill(run.proc.pid, signal.SIGTERM)
        run.go()                  # the run carries on from the gate
    run.proc.returncode

As a script (what :class:`GatedRun` starts): ``python gated_run.py ROUND READY_FD GO_FD ARGS...``
runs ``raymvc ARGS...``; after the record of round ROUND has been handled, it writes one
line to READY_FD and waits for a byte (or end of file) on GO_FD (in a sweep, the first run
to reach that round only).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys


def _main() -> None:
    at, ready, go = (int(x) for x in sys.argv[1:4])
    from raymvc import cli, driver

    real = driver.run_scenario
    gate = {"open": False}  # a sweep's runs: only the first to reach the round waits there

    def gated(sc, out_dir=None, **kw):
        inner = kw.get("on_round")

        def on_round(record: dict) -> None:
            if inner is not None:
                inner(record)
            if record["round"] == at and not gate["open"]:
                gate["open"] = True
                os.write(ready, b"ready\n")
                os.read(go, 1)

        return real(sc, out_dir, **{**kw, "on_round": on_round})

    driver.run_scenario = gated  # what `raymvc run` and a sweep call
    sys.argv = ["raymvc", *sys.argv[4:]]
    cli.entry()


class GatedRun:
    """``raymvc ARGS`` in a child process, held at the gate after round ``at_round``."""

    def __init__(self, args: list[str], at_round: int, env: dict | None = None, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE):
        self._ready_r, ready_w = os.pipe()
        go_r, self._go_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, __file__, str(at_round), str(ready_w), str(go_r), *args],
                                     stdout=stdout, stderr=stderr, text=True, env=env, pass_fds=(ready_w, go_r))
        os.close(ready_w)
        os.close(go_r)

    def wait_ready(self, limit_s: float = 600.0) -> None:
        """Until the run is at the gate; fails if it ended first (a guard against hanging, not a timing bound)."""
        readable, _, _ = select.select([self._ready_r], [], [], limit_s)
        line = os.read(self._ready_r, 64) if readable else b""
        if line != b"ready\n":
            err = self.proc.stderr.read()[-3000:] if self.proc.poll() is not None and self.proc.stderr else ""
            raise AssertionError(f"the run never reached the gate (exit code {self.proc.poll()}): {err}")

    def go(self) -> None:
        self._close("_go_w")  # end of file: the gate opens

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd is not None:
            os.close(fd)
            setattr(self, name, None)

    def __enter__(self) -> GatedRun:
        return self

    def __exit__(self, *exc) -> None:
        self._close("_ready_r")
        self._close("_go_w")
        if exc[0] is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    _main()
