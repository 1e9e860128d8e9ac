"""FedDMVC / FCUIF on tuning seeds: what the server's labels score after every round, and what
other labellings of the final fused features would score -- to find where a run loses accuracy.

    python benchmarks/deep_init.py SCENARIO SEED [KEY=VALUE ...]   # one run, one line appended
    python benchmarks/deep_init.py --table                          # benchmarks/deep_init.md

A run goes in-process (``runtime.backend: local``); the server's fused features ``Z`` of the
last round are kept, and scored by k-means with 10 and 100 restarts on the raw blocks, on
each view's rows divided by their L1 norm (the authors' code) and on each view standardised;
``per_round`` is the ACC of the server's labels after each round (round 0: pretraining
only). Labels are read only to score. Results: ``benchmarks/deep_init.jsonl`` (one line a
run), rendered by ``--table``. Seeds >= 100 only: these are tuning runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "deep_init.jsonl"


def run(scenario: str, seed: int, sets: dict) -> dict:
    from sklearn.cluster import KMeans

    import raymvc.protocols.feddmvc as fd
    from raymvc import api
    from raymvc.driver.engine import prepare
    from raymvc.metrics import acc
    from raymvc.scenario import load_scenario

    if seed < 100:
        raise SystemExit("tuning runs use seeds >= 100")
    cap: dict = {"y": []}
    choose, step = fd.FedDMVCServer.choose_features, fd.FedDMVCServer.global_step

    def keep_features(self, imputed, raw, H, C, round):
        Z = choose(self, imputed, raw, H, C, round)
        cap.update(Z=Z.copy(), H=H.copy())
        return Z

    def keep_labels(self, round):
        step(self, round)
        cap["y"].append(self.y.copy())

    fd.FedDMVCServer.choose_features, fd.FedDMVCServer.global_step = keep_features, keep_labels
    import raymvc.protocols.fcuif as fc

    choose_fc = fc.FCUIFServer.choose_features  # FCUIF chooses between imputed and mean-filled features

    def keep_features_fc(self, imputed, raw, H, C, round):
        Z = choose_fc(self, imputed, raw, H, C, round)
        cap.update(Z=Z.copy(), H=H.copy())
        return Z

    fc.FCUIFServer.choose_features = keep_features_fc
    overrides = {"seed": seed, "runtime.backend": "local", **sets}
    t = time.perf_counter()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="deep-init-") as tmp:
        r = api.run(scenario, overrides=overrides, out=Path(tmp) / "run")
    wall = time.perf_counter() - t
    ds, _ = prepare(load_scenario(scenario, {"seed": seed}))
    y = np.asarray(ds.labels)
    Z, H = cap["Z"], cap["H"]
    d = Z.shape[1] // H.shape[1]
    cov = H.any(1)
    k = len(np.unique(y))

    def blocks(fn):
        return np.hstack([fn(Z[:, j * d:(j + 1) * d]) for j in range(H.shape[1])])

    feats = {"raw": Z, "l1": blocks(lambda B: B / np.maximum(np.abs(B).sum(1, keepdims=True), 1e-12)),
             "std": blocks(lambda B: (B - B[cov].mean(0)) / (B[cov].std() + 1e-12))}
    out = {"scenario": scenario, "seed": seed, "set": sets, "acc": round(float(r.metrics["acc"]), 4),
           "wall_s": round(wall), "per_round": [round(acc(y[cov], yy[cov]), 4) for yy in cap["y"]]}
    for name, F in feats.items():
        for n_init in (10, 100):
            out[f"km{n_init}_{name}"] = round(acc(y[cov], KMeans(k, n_init=n_init, random_state=0).fit(F[cov]).labels_), 4)
    return out


def table() -> str:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    lines = ["# FedDMVC and FCUIF on tuning seeds: ACC round by round, and other labellings of the last features",
             "", "- command: `python benchmarks/deep_init.py SCENARIO SEED [KEY=VALUE ...]`, then `--table`; every run "
             "in-process at the scenario's (shipped, shortened) budget",
             "- `per round`: the server's labels after each round (round 0: pretraining only); `k-means`: 100 restarts "
             "on the last round's fused features (raw / each view's rows L1-normalised / each view standardised)",
             "- seeds 100-102: tuning seeds (each method's pages say which seeds served which purpose)", "",
             "| scenario | seed | settings | ACC | per round | k-means raw / l1 / std | s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        sets = ", ".join(f"`{k}: {v}`" for k, v in r["set"].items()) or "defaults"
        lines.append(f"| {Path(r['scenario']).name} | {r['seed']} | {sets} | {r['acc']:.3f} | "
                     f"{' → '.join(f'{x:.3f}' for x in r['per_round'])} | "
                     f"{r['km100_raw']:.3f} / {r['km100_l1']:.3f} / {r['km100_std']:.3f} | {r['wall_s']} |")
    groups: dict = {}
    for r in rows:
        groups.setdefault((Path(r["scenario"]).name, json.dumps(r["set"], sort_keys=True)), []).append(r)
    lines += ["", "Mean over the seeds run, per scenario and settings:", "",
              "| scenario | settings | seeds | ACC | after pretraining (round 0) |", "|---|---|---|---|---|"]
    for (name, sets), rs in groups.items():
        label = ", ".join(f"`{k}: {v}`" for k, v in json.loads(sets).items()) or "defaults"
        lines.append(f"| {name} | {label} | {','.join(str(r['seed']) for r in rs)} | "
                     f"{np.mean([r['acc'] for r in rs]):.3f} | {np.mean([r['per_round'][0] for r in rs]):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--table"]:
        (HERE / "deep_init.md").write_text(table())
        return 0
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    sets = {}
    for kv in argv[2:]:
        key, _, value = kv.partition("=")
        try:
            sets[key] = json.loads(value)  # numbers, lists, true/false/null
        except json.JSONDecodeError:
            sets[key] = value  # a bare word (torch, xavier)
    out = run(argv[0], int(argv[1]), sets)
    with open(RESULTS, "a") as fh:
        fh.write(json.dumps(out) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
