"""Sweep progress lines: runs done of all, an estimate of the time left from the pace of the
runs finished here (reused runs took none), and a score also for unlabelled data."""

from __future__ import annotations

import io

from raymvc import progress


def test_the_time_left_comes_from_the_runs_finished_here(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    p = progress.SweepProgress(total=5, skipped=1, stream=out, live=False)  # one run reused: it took no time
    assert "left" not in p.counter()  # nothing finished here yet: no pace to go by
    now[0] = 160.0
    p.finished("a seed 0", {"status": "completed", "metrics": {"acc": 0.5}})
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("[sweep 2/5, completed 1, 60 s, about 3 min left]"), line  # 60 s a run, 3 to go
    now[0] = 170.0
    for i in range(3):
        p.finished(f"b seed {i}", {"status": "completed", "metrics": {"acc": 0.5}})
    assert "left" not in out.getvalue().splitlines()[-1]  # all done


def test_a_run_without_labels_shows_its_silhouette(monkeypatch):
    out = io.StringIO()
    p = progress.SweepProgress(total=2, stream=out, live=False)
    p.finished("x seed 0", {"status": "completed", "metrics": {"silhouette": 0.4321, "calinski_harabasz": 12.0}})
    assert "x seed 0: completed silhouette 0.4321" in out.getvalue()
    assert "about" in out.getvalue() and "s left" in out.getvalue()
