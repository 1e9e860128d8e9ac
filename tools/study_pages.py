"""Write studies/<paper>.md (and README's results table) from the studies' sweep folders.

A study whose sweep folder is here also gets its cell record rewritten
(studies/results/<study>.csv: each cell's metrics, code version and a hash of its labels);
a study without one is written from that record, so pages regenerate without run folders.

    python tools/study_pages.py                      # sweep folders under runs/studies/
    python tools/study_pages.py --runs /data/studies # or elsewhere
    python tools/study_pages.py --runs /data/studies --also /data/gpu-studies  # cells from another machine

Run each study first: ``raymvc sweep studies/<name>.yaml --backend local --jobs 2``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # raymvc_reports lives in the checkout, not in the installed package

from raymvc.results.folder import ResultsError  # noqa: E402
from raymvc.scenario import ScenarioError  # noqa: E402
from raymvc_reports.pages import write_pages  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", default=str(ROOT / "studies"), help="folder of study files (default: studies/)")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "studies"),
                    help="folder holding one sweep folder per study, named after it (default: runs/studies/)")
    ap.add_argument("--also", action="append", default=[], metavar="DIR",
                    help="another folder of sweep folders whose cells join the main ones (e.g. a study's "
                         "CUDA spread swept on a GPU machine with --only); repeatable")
    ap.add_argument("--readme", default=str(ROOT / "README.md"), help="README whose results table to rewrite")
    args = ap.parse_args(argv)
    try:
        written = write_pages(Path(args.studies), Path(args.runs), Path(args.readme), [Path(a) for a in args.also],
                              log=lambda m: print(m, file=sys.stderr))
    except (ScenarioError, ResultsError) as e:
        print(f"study_pages: {e}", file=sys.stderr)
        return 2
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
