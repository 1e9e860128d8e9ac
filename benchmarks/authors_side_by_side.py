"""raymvc's FedDMVC / FCUIF beside the authors' released code, on the same split at the same budget.

    python benchmarks/authors_side_by_side.py --harness DIR [--settings fully,b] [--seeds 700-702]
    python benchmarks/authors_side_by_side.py --harness DIR --only theirs --settings pf-fully
    python benchmarks/authors_side_by_side.py --table          # only rebuild the page from the saved results

The authors' code (GitHub 5Martina5/FCUIF, commit 04ecd3d6, built on Flower 0.17) is not part
of this repository. ``--harness DIR`` names a folder that holds it with a ``driver.py`` that runs
it without Flower on the split raymvc makes (``benchmarks/authors_side_by_side.md`` says how to
lay it out, with the edits made to their files). For each setting and seed the script runs

* ours: ``raymvc.run`` of the setting's scenario, in process, one thread, with ``seed`` set;
* theirs: ``python DIR/driver.py --scenario ... --seed N`` with the same budget (the scenario's
  ``params``: epochs, widths, batch, learning rate) and their label-based choices replaced by
  label-free ones (the driver's defaults: anchor client 0, imputation kept or dropped by a
  silhouette score),

and keeps each run's scores and wall time in ``benchmarks/authors/results.json`` (a run already
there is not run again). The page ``benchmarks/authors_side_by_side.md`` is rebuilt from that file.
Seeds 700-702 were declared (with the second-data studies) before any run; seeds 703-704, for five
seeds in every HW setting, were declared here (``DECLARED_SEEDS``) before any run of theirs or ours
on them. Nothing is chosen here.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raymvc.scenario import load_scenario  # noqa: E402

RESULTS = REPO / "benchmarks" / "authors" / "results.json"
PAGE = REPO / "benchmarks" / "authors_side_by_side.md"
DECLARED_SEEDS = (700, 701, 702, 703, 704)
HW_ONLY_SEEDS = (703, 704)  # declared for the HW settings alone

# setting id -> (label, scenario, --set overrides, driver flags)
SETTINGS: dict[str, tuple[str, str, dict, list[str]]] = {
    "fully": ("FedDMVC fully (HW)", "scenarios/hw-feddmvc.yaml", {}, []),
    "partial": ("FedDMVC partially (HW)", "scenarios/hw-feddmvc-partial.yaml", {}, []),
    "a": ("FCUIF (a) unaligned 0.5 (HW)", "scenarios/hw-fcuif-unaligned.yaml", {}, ["--unaligned-mode", "real"]),
    "b": ("FCUIF (b) missing 0.5 (HW)", "scenarios/hw-fcuif-missing.yaml", {}, []),
    "c": ("FCUIF (c) both (HW)", "scenarios/hw-fcuif-both.yaml", {}, ["--unaligned-mode", "real"]),
    "pf-fully": ("FedDMVC, ProteinFold Per0.9", "scenarios/proteinfold-feddmvc.yaml", {}, []),
    "pf-b": ("FCUIF, ProteinFold Per0.5", "scenarios/proteinfold-fcuif.yaml", {}, []),
    "nm-fully": ("FedDMVC, Noisy MNIST", "scenarios/noisy-mnist-feddmvc.yaml", {}, []),
    "nm-b": ("FCUIF (b), Noisy MNIST", "scenarios/noisy-mnist-fcuif-missing.yaml", {}, []),
}


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


# the authors' budget (FCUIF's Sec. 4.1), as the paper-budget studies set it on the scenarios
PAPER_BUDGET = {"params.pretrain_epochs": 500, "params.finetune_epochs": 300,
                "params.hidden": [500, 500, 2000], "params.batch_size": 256}
BUDGETS = {"scenario": {}, "paper": PAPER_BUDGET}


def budget_flags(scenario: str, budget: dict | None = None) -> list[str]:
    """The driver's budget flags from the scenario's params (what ours runs with), with
    ``budget``'s overrides applied."""
    p = load_scenario(REPO / scenario, overrides=budget or {}).protocol_config()
    return ["--pretrain-epochs", str(p.pretrain_epochs), "--local-epochs", str(p.finetune_epochs),
            "--rounds", str(p.rounds), "--hidden", ",".join(str(h) for h in p.hidden),
            "--batch", str(p.batch_size), "--lr", repr(p.lr)]


def run_ours(setting: str, seed: int, extra: dict) -> dict:
    import raymvc

    _, scenario, sets, _ = SETTINGS[setting]
    overrides = {**sets, **extra, "seed": seed, "runtime.backend": "local", "runtime.threads": 1}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = raymvc.run(str(REPO / scenario), overrides=overrides, out=Path(tmp) / "run", progress=False)
        m = res.metrics
        labels = (Path(tmp) / "run" / "labels.csv").read_bytes() if m is not None else b""
    if m is None:  # no labels came back: say why rather than stop the comparison
        raise SystemExit(f"ours/{setting}/{seed}: the run ended {res.status.value} ({res.summary.get('error')})")
    return {"acc": m["acc"], "nmi": m["nmi"], "ari": m["ari"], "wall_s": time.perf_counter() - t0,
            **provenance(res.summary), "labels_sha256": __import__("hashlib").sha256(labels).hexdigest()}


def provenance(summary=None) -> dict:
    """What a row of results.json ran at: the commit, raymvc's code version (ours), the
    platform and the arithmetic mode."""
    from raymvc.results.provenance import platform_text

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"commit": head or "unknown"}
    if summary is not None:
        out.update(code_version=summary.get("code_version"), platform=platform_text(summary.get("platform")),
                   arithmetic=(summary.get("arithmetic") or {}).get("mode"))
    return out


def run_theirs(harness: Path, setting: str, seed: int, budget: dict | None = None) -> dict:
    _, scenario, sets, flags = SETTINGS[setting]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(harness / "driver.py"), "--scenario", str(REPO / scenario), "--seed", str(seed),
               *budget_flags(scenario, budget), *flags, "--threads", "1", "--out", str(out), "--quiet",
               *[f"--set={k}={v}" for k, v in sets.items()]]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=harness, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
        wall = time.perf_counter() - t0
        d = json.loads(out.read_text())
    f = d["final"]
    return {"acc": f["acc"], "nmi": f["nmi"], "ari": f["ari"], "wall_s": wall,
            "label_based_report": d.get("authors_label_based_final (LABEL-BASED)"), **provenance()}


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def save(results: dict) -> None:
    """Merge ``results`` into the file (another invocation may be running other settings)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    merged = {**load(), **results}
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    tmp.replace(RESULTS)


def key(impl: str, setting: str, seed: int, variant: str = "") -> str:
    return f"{impl}/{setting}/{seed}" + (f"/{variant}" if variant else "")


def _mean_std(xs: list[float]) -> str:
    import numpy as np

    if not xs:
        return "-"
    a = np.asarray(xs, dtype=float)
    return f"{a.mean():.3f} ± {a.std(ddof=1):.3f}" if len(a) > 1 else f"{a[0]:.3f}"


# ours with one setting changed, each a column of the table
# (results.json also keeps "l1" runs, params.server_norm: l1, made before the loss and initialisation
# changes of the same code version as the other columns: not comparable, so not shown)
VARIANTS = {"torch": {"params.init": "torch"}, "l1": {"params.server_norm": "l1"}}
METHOD_SETTINGS = {"feddmvc": ("fully", "partial", "pf-fully", "nm-fully"), "fcuif": ("a", "b", "c", "pf-b", "nm-b")}


def _secs(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.0f}" if xs else "-"


def _same_runs(results: dict, setting: str, seeds: list[int]) -> str | None:
    """The earlier setting whose "theirs" runs are these, score for score at every seed (their
    code runs FedDMVC partially and FCUIF (b) as one), or None."""
    mine = [results.get(key("theirs", setting, s)) for s in seeds]
    if not all(mine):
        return None
    for other in SETTINGS:
        if other == setting:
            return None
        theirs = [results.get(key("theirs", other, s)) for s in seeds]
        if all(theirs) and all((a["acc"], a["nmi"]) == (b["acc"], b["nmi"]) for a, b in zip(mine, theirs)):
            return other
    return None


def _difference(ours: list, theirs: list) -> str:
    """Ours minus theirs, paired over the seeds both ran, with its bootstrap interval and the
    word it allows."""
    from raymvc.study.intervals import ci_text, paired_ci, verdict

    pairs = [(o["acc"], t["acc"]) for o, t in zip(ours, theirs) if o and t]
    if len(pairs) < 2:
        return "-"
    ci = paired_ci([o for o, _ in pairs], [t for _, t in pairs])
    mean = sum(o - t for o, t in pairs) / len(pairs)
    return f"{mean:+.3f} ({ci_text(ci)}; {verdict(ci, 'ours above', 'theirs above', 'within noise')})"


def table(results: dict, settings: tuple[str, ...] | None = None) -> str:
    rows = ["| setting | seeds | ours ACC | ours NMI | ours s a run | ours + `init: torch` ACC | theirs ACC | "
            "theirs NMI | theirs s a run | ours - theirs ACC, paired over seeds | "
            "ACC per seed (ours / torch / theirs) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for setting, (label, *_rest) in SETTINGS.items():
        if settings is not None and setting not in settings:
            continue
        seeds = sorted({int(k.split("/")[2]) for k in results if k.split("/")[1] == setting})
        if not seeds:
            continue
        get = {(impl, v): [results.get(key(impl, setting, s, v)) for s in seeds]
               for impl, v in (("ours", ""), ("ours", "torch"), ("theirs", ""))}

        def col(impl, v, m, get=get):
            return [r[m] for r in get[(impl, v)] if r]

        per_seed = " · ".join(
            f"{s}: " + " / ".join(f"{r['acc']:.3f}" if r else "-" for r in (get[("ours", "")][i], get[("ours", "torch")][i],
                                                                           get[("theirs", "")][i]))
            for i, s in enumerate(seeds))
        same = _same_runs(results, setting, seeds)
        theirs = (f"{_mean_std(col('theirs', '', 'acc'))} (the runs of {SETTINGS[same][0]}: one run of their code)"
                  if same else _mean_std(col('theirs', '', 'acc')))
        rows.append(f"| {label} | {','.join(map(str, seeds))} | {_mean_std(col('ours', '', 'acc'))} | "
                    f"{_mean_std(col('ours', '', 'nmi'))} | {_secs(col('ours', '', 'wall_s'))} | "
                    f"{_mean_std(col('ours', 'torch', 'acc'))} | {theirs} | "
                    f"{_mean_std(col('theirs', '', 'nmi'))} | {_secs(col('theirs', '', 'wall_s'))} | "
                    f"{_difference(get[('ours', '')], get[('theirs', '')])} | {per_seed} |")
    return "\n".join(rows)


# ours at the authors' budget is a study's record (the paper-budget studies), theirs is this script's
PAPER_BUDGET_STUDIES = {"fully": ("feddmvc-paper-budget", "fully"), "b": ("fcuif-paper-budget", "fcuif-b")}


def _study_rows(study: str, run: str) -> dict[int, dict]:
    """Finished cells (completed or degraded) of a study's committed records, by seed."""
    path = REPO / "studies" / "results" / f"{study}.csv"
    if not path.is_file():
        return {}
    with path.open(newline="") as fh:
        return {int(r["seed"]): r for r in csv.DictReader(fh)
                if r["scenario"] == run and r["status"] in ("completed", "degraded")}


def paper_budget_table(results: dict) -> str:
    """Both codes at the authors' budget (500 + 300 epochs, 500-500-2000, batch 256), seed by
    seed, beside the same seed at the scenario's budget."""
    rows = ["| setting | seed | ours ACC | ours min | theirs ACC | theirs min | shipped budget: ours / theirs ACC |",
            "|---|---|---|---|---|---|---|"]
    for setting, (study, run) in PAPER_BUDGET_STUDIES.items():
        ours = _study_rows(study, run)
        seeds = sorted(set(ours) | {int(k.split("/")[2]) for k in results
                                     if k.startswith(f"theirs/{setting}/") and k.endswith("/paper")})
        for seed in seeds:
            o, t = ours.get(seed), results.get(key("theirs", setting, seed, "paper"))
            cells = [SETTINGS[setting][0], str(seed), "-", "-", "-", "-"]
            if o:
                note = f" ({o['status']}: {o['late_replies']} late)" if o["status"] != "completed" else ""
                cells[2:4] = [f"{float(o['acc']):.3f}{note}", f"{float(o['wall']) / 60:.0f}"]
            if t:
                cells[4:6] = [f"{t['acc']:.3f}", f"{t['wall_s'] / 60:.0f}"]
            short = [results.get(key(impl, setting, seed)) for impl in ("ours", "theirs")]
            cells.append(" / ".join(f"{r['acc']:.3f}" if r else "-" for r in short))
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _replace_block(path: Path, body: str, name: str = "generated") -> None:
    """Put ``body`` between the table markers ``name`` of ``path`` (appended if it has none)."""
    text = path.read_text() if path.is_file() else ""
    start, end = f"<!-- table: {name} -->", "<!-- end table -->"
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text[text.index(start):]:
        i = text.index(start)
        text = text[:i] + block + text[text.index(end, i) + len(end):]
    else:
        text = text + "\n" + block + "\n"
    path.write_text(text)


def write_page(results: dict) -> None:
    """This script's page, and the same rows for each method in its study notes (the pages
    ``tools/study_pages.py`` builds take them from there)."""
    stamp = f"Updated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC."
    _replace_block(PAGE, f"{table(results)}\n\n{stamp}")
    _replace_block(PAGE, f"{paper_budget_table(results)}\n\n{stamp}", "paper budget")
    for method, settings in METHOD_SETTINGS.items():
        notes = REPO / "studies" / "notes" / f"{method}.md"
        if notes.is_file() and "<!-- table: generated -->" in notes.read_text():
            _replace_block(notes, f"{table(results, settings)}\n\nFrom `benchmarks/authors/results.json` "
                                  f"(`python benchmarks/authors_side_by_side.py --table`); {stamp}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", type=Path, help="folder with the authors' code and driver.py")
    ap.add_argument("--settings", default="fully,b", help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--seeds", default="700-702")
    ap.add_argument("--only", choices=("ours", *(f"ours-{v}" for v in VARIANTS), "theirs"), action="append",
                    help="run only these (repeatable); default ours and theirs")
    ap.add_argument("--budget", choices=tuple(BUDGETS), default="scenario",
                    help="scenario: the shipped scenario's budget (default); paper: the authors' "
                         "(500 + 300 epochs, 500-500-2000, batch 256), kept as variant 'paper'")
    ap.add_argument("--table", action="store_true", help="only rebuild the page from the saved results")
    args = ap.parse_args()
    results = load()
    if not args.table:
        kinds = args.only or ["ours", "theirs"]
        if "theirs" in kinds and not (args.harness and (args.harness / "driver.py").is_file()):
            sys.exit("error: --harness: a folder with driver.py is needed to run the authors' code")
        for setting in args.settings.split(","):
            if setting not in SETTINGS:
                sys.exit(f"error: --settings: unknown setting {setting!r}")
            for seed in parse_seeds(args.seeds):
                hw = SETTINGS[setting][1].startswith("scenarios/hw-")
                if seed not in DECLARED_SEEDS or (seed in HW_ONLY_SEEDS and not hw):
                    sys.exit(f"error: --seeds: {seed} was not declared for {setting} (DECLARED_SEEDS)")
                for kind in kinds:
                    impl, _, variant = kind.partition("-")
                    if args.budget != "scenario":
                        if variant:
                            sys.exit(f"error: --budget {args.budget}: run ours or theirs, not {kind}")
                        variant = args.budget
                    k = key(impl, setting, seed, variant)
                    if k in results:
                        continue
                    print(f"[side-by-side] {k} ...", flush=True)
                    if impl == "theirs":
                        results[k] = run_theirs(args.harness.resolve(), setting, seed, BUDGETS[args.budget])
                    else:
                        results[k] = run_ours(setting, seed, {**VARIANTS.get(variant, {}), **BUDGETS[args.budget]})
                    print(f"[side-by-side] {k}: ACC {results[k]['acc']:.3f}, {results[k]['wall_s']:.0f} s", flush=True)
                    save(results)
    write_page(results)
    print(table(results))


if __name__ == "__main__":
    main()
