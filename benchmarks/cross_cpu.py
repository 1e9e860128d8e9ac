"""Deep cells whose labels moved with the CPU, rerun with pinned arithmetic and recorded per CPU.

Each cell (a study's run at one grid point and seed, or a shipped scenario at a seed) runs
in process, in a fresh process, with pinned arithmetic; its labels hash, ACC, CPU model
and arithmetic block are appended to ``benchmarks/cross_cpu.jsonl``, one line per run.
``benchmarks/cross_cpu.md`` is then rewritten from every line: per cell, the hash each
kind of CPU gave and whether they agree. A machine of a CPU kind not in the file yet adds
the check the file still lacks:

    python benchmarks/cross_cpu.py                  # every cell (about 20 min on 2 cores)
    python benchmarks/cross_cpu.py --only 1,3       # some cells
    python benchmarks/cross_cpu.py --render         # rewrite the page from the file alone
    python benchmarks/cross_cpu.py --mkl-branch AVX2   # MKL sent to another branch after the pin

Each line names the commit it ran at: a machine of the other CPU kind checks that commit out
(``git worktree add ../xcpu COMMIT``) and runs the cells there, so that both kinds compare
one code version.

``--mkl-branch`` stands in, on one machine, for what another CPU vendor does to MKL (its
branches give other bits on Intel and AMD): raymvc pins, then MKL is sent to the given
branch before torch loads. A cell whose labels stay those of its pinned run on the same CPU
kind and code version does not depend on MKL's branch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSONL = ROOT / "benchmarks" / "cross_cpu.jsonl"
MD = ROOT / "benchmarks" / "cross_cpu.md"
# id -> (what, scenario file, overrides): the first two are the cells whose labels moved between an
# Intel Xeon and an AMD EPYC before arithmetic was pinned; the others are deep cells of the same kinds
CELLS = {
    "1": ("robustness-data-remedy: FedDMVC, rate 0.0, seed 703", "studies/robustness-data-remedy.yaml",
          {"run": "feddmvc", "point": {"faults.availability.rate": 0.0}, "seed": 703}),
    "2": ("robustness-async-mnist: buffered CCFC, stragglers 0.4, seed 700", "studies/robustness-async-mnist.yaml",
          {"run": "ccfc-async", "point": {"faults.stragglers.fraction": 0.4}, "seed": 700}),
    "3": ("hw-feddmvc-partial.yaml (δ 0.5), seed 703", "scenarios/hw-feddmvc-partial.yaml", {"seed": 703}),
    "4": ("hw-fcuif-missing.yaml, seed 0", "scenarios/hw-fcuif-missing.yaml", {"seed": 0}),
    "5": ("robustness-data-attribution: FCUIF, rate 0.5, seed 700", "studies/robustness-data-attribution.yaml",
          {"run": "fcuif", "point": {}, "seed": 700}),
}

RUNNER = """
import json, os, sys
from pathlib import Path
import raymvc
if os.environ.get("RAYMVC_XCPU_MKL"):  # --mkl-branch: after the pin, before torch loads
    os.environ["MKL_CBWR"] = os.environ["RAYMVC_XCPU_MKL"]
from raymvc.scenario import load_scenario, merge_overrides
from raymvc.study.files import is_study_file, load_study
from raymvc.driver import run_scenario

path, spec, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
if is_study_file(path):
    st = load_study(path)
    run = st.labels()[spec["run"]]
    over = merge_overrides({**run.set, "name": run.id}, spec["point"], {"seed": spec["seed"]})
    sc = load_scenario(st.scenario_path(run), over)
else:
    sc = load_scenario(path, {"seed": spec["seed"]})
sc = sc.model_copy(update={"runtime": sc.runtime.model_copy(update={"backend": "local"})})
s = run_scenario(sc, out, progress=lambda line: None)
print(json.dumps({"status": s["status"], "acc": s["metrics"]["acc"], "arithmetic": s["arithmetic"],
                  "platform": s["platform"], "code_version": s["code_version"], "wall_s": s["timing"]["wall_s"]}))
"""


def run_cell(cid: str, tmp: Path, mkl_branch: str | None = None) -> dict:
    what, path, spec = CELLS[cid]
    out = tmp / f"cell{cid}"
    env = {k: v for k, v in os.environ.items() if k != "RAYMVC_XCPU_MKL"}
    if mkl_branch:
        env["RAYMVC_XCPU_MKL"] = mkl_branch
    done = subprocess.run([sys.executable, "-c", RUNNER, str(ROOT / path), json.dumps(spec), str(out)],
                          capture_output=True, text=True, cwd=ROOT, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"cell {cid} failed: {done.stderr.strip().splitlines()[-1:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {"cell": cid, "what": what, "labels_sha256": hashlib.sha256((out / "labels.csv").read_bytes()).hexdigest(),
            "cpu": got["platform"].get("cpu") or "?", "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "commit": _commit(), **({"mkl_branch": mkl_branch} if mkl_branch else {}), **got}


def _commit() -> str:
    """The checkout's commit (``+`` where its files differ from it): the other CPU kind checks
    out this commit to compare at one code version."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, check=False).stdout.strip()

    head = git("rev-parse", "HEAD")
    return head + ("+" if head and git("status", "--porcelain", "--untracked-files=no") else "") if head else "?"


def render() -> str:
    from raymvc.results.provenance import cpu_kind

    rows = [json.loads(line) for line in JSONL.read_text().splitlines() if line.strip()] if JSONL.is_file() else []
    by_cell: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_cell[r["cell"]].append(r)
    lines = ["# The same labels on another CPU: deep cells with pinned arithmetic", "",
             "Written by `python benchmarks/cross_cpu.py` from `benchmarks/cross_cpu.jsonl` (one line per run). "
             "Each cell ran in process with pinned arithmetic (`raymvc.arithmetic`; docs/reproducibility.md). "
             "Cells 1 and 2 gave other labels on an Intel Xeon and an AMD EPYC before the pin. Rows dated before "
             "2026-12-08 ran the torch methods' products on MKL, whose products differ between the two vendors "
             "(benchmarks/cross_cpu_ops.md); later rows run them on OpenBLAS. `MKL <branch>` rows sent MKL to that "
             "branch after the pin (`--mkl-branch`).", "",
             "| cell | what | CPU | code version | pinned | ACC | labels (SHA-256, first 16) |", "|---|---|---|---|---|---|---|"]
    verdicts = []
    for cid in sorted(by_cell, key=int):
        runs = by_cell[cid]
        for r in runs:
            how = f"MKL {r['mkl_branch']}" if r.get("mkl_branch") else "yes" if r["arithmetic"].get("pinned") else "no"
            lines.append(f"| {cid} | {r['what']} | {r['cpu']} | {r['code_version'][:17]} | "
                         f"{how} | {r['acc']:.4f} | {r['labels_sha256'][:16]} |")
        pinned = [r for r in runs if r["arithmetic"].get("pinned") and not r.get("mkl_branch")]
        for m in (r for r in runs if r.get("mkl_branch")):
            ref = {p["labels_sha256"] for p in pinned
                   if p["code_version"] == m["code_version"] and cpu_kind(p["cpu"]) == cpu_kind(m["cpu"])}
            verdicts.append(f"- cell {cid}, MKL sent to {m['mkl_branch']} after the pin on {cpu_kind(m['cpu']) or m['cpu']}: "
                            + ("no pinned run of that code version on that CPU kind to compare." if not ref else
                               "the pinned run's labels: MKL's branch does not reach them." if m["labels_sha256"] in ref
                               else "other labels than the pinned run: MKL's branch moves them."))
        kinds: dict[str, set] = defaultdict(set)
        for r in pinned:
            kinds[cpu_kind(r["cpu"]) or r["cpu"]].add(r["labels_sha256"])
        hashes = {h for hs in kinds.values() for h in hs}
        versions = {r["code_version"] for r in pinned}
        if len(kinds) < 2:
            verdicts.append(f"- cell {cid}: only {', '.join(sorted(kinds)) or 'no pinned run'} so far ({len(pinned)} "
                            f"pinned run(s), {len(hashes)} labels hash(es)); a machine of the other kind checks it.")
        elif len(hashes) == 1:
            verdicts.append(f"- cell {cid}: {', '.join(sorted(kinds))}: the same labels"
                            + ("" if len(versions) == 1 else f" (over {len(versions)} code versions)") + ".")
        else:
            same_method = len({v.partition("-")[2] for v in versions}) == 1
            verdicts.append(f"- cell {cid}: {', '.join(sorted(kinds))}: {len(hashes)} labels hashes: "
                            + ("NOT portable." if len(versions) == 1 else
                               "inconclusive, the runs differ in code version too (the method's code is the same, "
                               "the engine's differs); rerun both at one commit." if same_method else
                               "inconclusive, the runs differ in code version too; rerun both at one commit."))
        if pinned and len(kinds) >= 2:  # where the kinds ran other code, what the newest code has so far
            latest = pinned[-1]["code_version"]
            at = {cpu_kind(r["cpu"]) or r["cpu"] for r in pinned if r["code_version"] == latest}
            if len(at) < 2:
                commit = pinned[-1].get("commit")
                verdicts.append(f"- cell {cid} at the newest code version ({latest[:17]}): only {', '.join(sorted(at))} "
                                "so far; a machine of the other kind checks it"
                                + (f" at commit {commit[:12]}." if commit else "."))
    lines += ["", *verdicts, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(CELLS), help="comma-separated cell ids")
    ap.add_argument("--render", action="store_true", help="only rewrite the page from the jsonl file")
    ap.add_argument("--mkl-branch", default=None, metavar="BRANCH",
                    help="send MKL to this branch (MKL_CBWR) after the pin: does a cell depend on MKL's branch?")
    args = ap.parse_args(argv)
    if os.environ.get("RAYMVC_ARITHMETIC", "pinned").strip().lower() not in ("", "pinned"):
        raise SystemExit("RAYMVC_ARITHMETIC: this check is of pinned arithmetic; unset it")
    if not args.render:
        ids = [c.strip() for c in args.only.split(",") if c.strip()]
        bad = [c for c in ids if c not in CELLS]
        if bad:
            raise SystemExit(f"--only: unknown cell(s) {', '.join(bad)} (known: {', '.join(CELLS)})")
        with tempfile.TemporaryDirectory(prefix="xcpu-") as tmp:
            for cid in ids:
                r = run_cell(cid, Path(tmp), args.mkl_branch)
                print(f"cell {cid}: {r['acc']:.4f} {r['labels_sha256'][:16]} ({r['wall_s']:.0f} s, {r['cpu']})",
                      file=sys.stderr, flush=True)
                with JSONL.open("a") as f:
                    f.write(json.dumps(r, sort_keys=True) + "\n")
    MD.write_text(render())
    print(MD.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
