"""Pinned arithmetic (raymvc.arithmetic): the libraries' code paths are fixed in every process
of a run, whatever the environment asks for, and the summary says how each run computed.

The cells run in fresh processes: a library chooses its path when it first computes, so a
process that already computed (this test process) cannot show it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raymvc import arithmetic

HERE = Path(__file__).resolve().parent
# each makes a library choose another path on this CPU, or another thread count
PERTURB = {"MKL_CBWR": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default",
           "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
# another set, for the Ray workers: two perturbed environments that give the same labels can only be pinned
PERTURB_RAY = {"MKL_CBWR": "AUTO", "MKL_DEBUG_CPU_TYPE": "5", "ATEN_CPU_CAPABILITY": "avx512",
               "NPY_ENABLE_CPU_FEATURES": "SSE SSE2 SSE3", "OMP_NUM_THREADS": "3"}
OURS = (*arithmetic.PINNED, *arithmetic.CLEARED, arithmetic.MODE_VAR, *PERTURB, *PERTURB_RAY)

# one float32 product on torch (MKL) and one float64 product on numpy (OpenBLAS), as exact bits
CHECKSUM = """
import sys
if sys.argv[1] == "raymvc":
    import raymvc  # noqa: F401  (pins before numpy and torch load)
import numpy as np, torch, json
from raymvc import arithmetic
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
a, b = torch.randn(300, 257, generator=g), torch.randn(257, 190, generator=g)
r = np.random.default_rng(0)
x, y = r.standard_normal((300, 257)), r.standard_normal((257, 190))
print(json.dumps({"torch": float((a @ b).double().sum()).hex(), "numpy": float((x @ y).sum()).hex(),
                  "arithmetic": arithmetic.describe()}))
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env.update(extra)
    return env


def _checksum(tmp_path, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECKSUM, "raymvc"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cells(tmp_path, backend: str, env: dict, name: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "arithmetic_cells.py"), backend, str(tmp_path / name)],
                          env=env, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the variables ------------------------------------------------------------------------
def test_pin_overrides_the_environment_keeps_a_machines_core_type_and_says_so():
    env = {"MKL_CBWR": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ATEN_CPU_CAPABILITY": "avx512",
           "NPY_ENABLE_CPU_FEATURES": "AVX2", "OPENBLAS_CORETYPE": "Zen", "PATH": "/bin"}
    done = arithmetic.pin(env)
    assert env["MKL_CBWR"] == "COMPATIBLE" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert "MKL_ENABLE_INSTRUCTIONS" not in env and "NPY_ENABLE_CPU_FEATURES" not in env  # both would choose again
    assert env["OPENBLAS_CORETYPE"] == "Zen" and done["kept"] == {"OPENBLAS_CORETYPE": "Zen"}  # the machine's own
    assert done["overridden"] == {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx512"}
    assert set(done["cleared"]) == {"MKL_ENABLE_INSTRUCTIONS", "NPY_ENABLE_CPU_FEATURES"} and env["PATH"] == "/bin"
    fresh: dict = {}
    arithmetic.pin(fresh)
    assert fresh["OPENBLAS_CORETYPE"] == "Haswell" and set(fresh) == set(arithmetic.PINNED)
    assert fresh["NPY_DISABLE_CPU_FEATURES"] == "X86_V4 AVX512_ICL AVX512_SPR"  # the names this numpy knows


def test_mode_comes_from_one_variable_and_a_bad_value_is_named():
    assert arithmetic.mode_from({}) == ("pinned", None)
    assert arithmetic.mode_from({arithmetic.MODE_VAR: " Native "}) == ("native", None)
    mode, error = arithmetic.mode_from({arithmetic.MODE_VAR: "fast"})
    assert error == "RAYMVC_ARITHMETIC: must be one of pinned, native, got 'fast'"


def test_ray_workers_get_the_drivers_mode():
    env = arithmetic.ray_runtime_env()["env_vars"]
    assert env[arithmetic.MODE_VAR] == arithmetic.mode()
    if arithmetic.mode() == "pinned":
        settings, kept = arithmetic.settings_for(os.environ)
        assert {k: env[k] for k in arithmetic.PINNED if k not in kept} == {k: v for k, v in settings.items() if k not in kept}


def test_a_run_is_pinned_only_if_every_process_was():
    good = {"mode": "pinned", "pinned": True, "settings": {"MKL_CBWR": "COMPATIBLE"}}
    bad = {"mode": "native", "pinned": False}
    block = arithmetic.combine({"driver": good, "server": good, "pool 0": bad})
    assert block["pinned"] is False and block["processes"] == 3 and block["differing"] == ["pool 0"]
    assert arithmetic.combine({"driver": good, "server": good})["pinned"] is True
    silent = arithmetic.combine({"driver": good, "server": good}, expected=3)  # a pool that never answered
    assert silent["pinned"] is False and silent["unreported"] == 1


def test_what_is_in_force_is_read_back_and_a_child_in_native_mode_gets_the_original_environment(monkeypatch):
    if arithmetic.mode() != "pinned":
        pytest.skip("this process runs native")
    assert arithmetic.describe()["pinned"]
    monkeypatch.setenv("MKL_CBWR", "AUTO")  # changed after the pin: the block must not say pinned
    assert arithmetic.describe()["pinned"] is False
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX512")
    assert arithmetic.describe()["pinned"] is False
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    original = arithmetic.original_environ()
    assert all(original.get(v) == arithmetic._state["original"][v] for v in arithmetic.PINNED)
    env = arithmetic.ray_runtime_env()["env_vars"]
    assert env["NPY_ENABLE_CPU_FEATURES"] == "" and all(k not in env for k in arithmetic._state["kept"])


def test_a_bad_mode_is_a_one_line_error_before_the_run(tmp_path):
    done = subprocess.run([sys.executable, "-m", "raymvc.cli", "validate", str(HERE.parent / "scenarios" / "hw-cefmc.yaml")],
                          env=_env(RAYMVC_ARITHMETIC="fast"), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: RAYMVC_ARITHMETIC: must be one of pinned, native, got 'fast'"
    assert "Traceback" not in done.stderr


# -- the bits ------------------------------------------------------------------------------
def test_the_pinned_setting_wins_over_variables_that_move_the_bits(tmp_path):
    native = _checksum(tmp_path, _env(RAYMVC_ARITHMETIC="native"))
    moved = _checksum(tmp_path, _env(RAYMVC_ARITHMETIC="native", MKL_CBWR="COMPATIBLE"))
    assert native["torch"] != moved["torch"]  # the variable bites: the test below could fail
    assert native["arithmetic"] == {"mode": "native", "pinned": False, "found": {},
                                    "torch_products": "torch's own", "reports": native["arithmetic"]["reports"]}
    pinned = _checksum(tmp_path, _env())
    perturbed = _checksum(tmp_path, _env(**PERTURB))
    assert (pinned["torch"], pinned["numpy"]) == (perturbed["torch"], perturbed["numpy"])
    assert pinned["arithmetic"]["pinned"] and perturbed["arithmetic"]["pinned"]
    assert perturbed["arithmetic"]["overridden"] == {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "default"}
    assert perturbed["arithmetic"]["cleared"] == {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


@pytest.fixture(scope="module")
def perturbed_in_process(tmp_path_factory):
    """FedDMVC, FCUIF, EFIMVC and CCFC cells, in process, pinned, under PERTURB."""
    return _cells(tmp_path_factory.mktemp("local"), "local", _env(**PERTURB), "local")


def test_deep_cells_in_process_are_pinned_over_the_variables(perturbed_in_process):
    for m, (_, block) in perturbed_in_process.items():
        assert block["mode"] == "pinned" and block["pinned"], m
        assert block["overridden"]["MKL_CBWR"] == "AVX2" and block["cleared"] == {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, m


def test_deep_cells_give_the_same_labels_on_ray_workers_of_another_perturbed_cluster(perturbed_in_process, tmp_path):
    """Ray is started (in the subprocess) from another perturbed environment before raymvc is
    imported, as a cluster someone else started: its workers have the perturbing variables,
    and each pins itself when it imports raymvc. The same labels as in process under the
    first set: two environments that pull the libraries two ways agree only if both are pinned."""
    on_ray = _cells(tmp_path, "ray", _env(**PERTURB_RAY), "ray")
    assert {m: v[0] for m, v in on_ray.items()} == {m: v[0] for m, v in perturbed_in_process.items()}
    for m, (_, block) in on_ray.items():
        assert block["pinned"] and block["processes"] >= 3 and not block["differing"], m


# a run on the Ray instance raymvc starts itself, under PERTURB: the job's runtime_env and the run's block
EMBEDDED = """
import json, os, sys
import raymvc
import ray
r = raymvc.run({"name": "embedded", "method": "kfed", "data": {"dataset": "digits", "partition": "horizontal",
                "n_clients": 3}, "runtime": {"backend": "ray", "client_cpus": 0.25}, "seed": 1},
               out=sys.argv[1], progress=False)
job = ray.get_runtime_context().runtime_env
print(json.dumps({"status": r.status, "arithmetic": r.summary["arithmetic"], "env_vars": job.get("env_vars") or {}}))
"""


def test_an_embedded_ray_pins_its_workers_through_the_drivers_environment_not_a_job_runtime_env(tmp_path):
    """The Ray instance a run starts inherits the driver's pinned environment: every process of
    the run is pinned under variables that would move the bits, and the job carries no
    ``runtime_env`` (one would keep Ray from handing the run its prestarted workers)."""
    done = subprocess.run([sys.executable, "-c", EMBEDDED, str(tmp_path / "run")], env=_env(**PERTURB),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["status"] == "completed"
    assert found["env_vars"] == {}
    block = found["arithmetic"]
    assert block["pinned"] and block["processes"] >= 3 and not block["differing"], block
    assert block["overridden"]["MKL_CBWR"] == "AVX2"  # the driver found the perturbing value and pinned over it


def _bench_module(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_kernel_probe_page_names_the_operation_that_differs_between_cpu_kinds(tmp_path, monkeypatch):
    """benchmarks/cross_cpu_ops.py: per operation, the hash each CPU kind gave; an operation
    whose bits differ between an Intel and an AMD probe is marked, one probed on one kind only
    says so, and an unpinned probe never counts."""
    import json

    mod = _bench_module("cross_cpu_ops")
    lines = [{"cpu": "Intel(R) Xeon(R) Processor", "date": "d", "platform": {"torch": "t"}, "arithmetic": {"pinned": True},
              "ops": {"sgemm": "aaa", "exp": "bbb", "conv": "ccc"}, "knobs": {"MKL_CBWR=AUTO": ["sgemm"]}},
             {"cpu": "AMD EPYC 9B14", "date": "d", "platform": {"torch": "t"}, "arithmetic": {"pinned": True},
              "ops": {"sgemm": "aaa", "exp": "zzz"}},
             {"cpu": "AMD EPYC 9B14", "date": "d", "platform": {}, "arithmetic": {"pinned": False},
              "ops": {"sgemm": "unpinned", "exp": "unpinned", "conv": "unpinned"}}]
    jsonl = tmp_path / "ops.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    monkeypatch.setattr(mod, "JSONL", jsonl)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in mod.render().splitlines() if line.startswith("| ")}
    assert rows["sgemm"].endswith("| same |") and "unpinned" not in rows["sgemm"]
    assert rows["exp"].endswith("| **differs** |")
    assert rows["conv"].endswith("| one CPU kind so far |")
    assert "| `MKL_CBWR=AUTO` | sgemm |" in mod.render()


def test_the_cross_cpu_page_calls_a_cell_not_portable_only_at_one_code_version(tmp_path, monkeypatch):
    import json

    mod = _bench_module("cross_cpu")

    def line(cell, cpu, version, digest):
        return {"cell": cell, "what": "w", "cpu": cpu, "code_version": version, "arithmetic": {"pinned": True},
                "acc": 0.5, "labels_sha256": digest}

    rows = [line("1", "AMD EPYC", "e1-m1", "a"), line("1", "Intel Xeon", "e1-m1", "b"),
            line("2", "AMD EPYC", "e1-m1", "a"), line("2", "Intel Xeon", "e2-m1", "b"),
            line("3", "AMD EPYC", "e1-m1", "a"), line("3", "Intel Xeon", "e2-m1", "a")]
    jsonl = tmp_path / "cells.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in rows))
    monkeypatch.setattr(mod, "JSONL", jsonl)
    page = mod.render()
    assert "- cell 1: AMD, Intel: 2 labels hashes: NOT portable." in page
    assert "- cell 2: AMD, Intel: 2 labels hashes: inconclusive" in page and "the method's code is the same" in page
    assert "- cell 3: AMD, Intel: the same labels (over 2 code versions)." in page
    assert "- cell 2 at the newest code version (e2-m1): only Intel so far" in page
    assert "- cell 1 at the newest code version" not in page  # both kinds ran it


def test_the_cross_cpu_page_says_whether_moving_mkls_branch_reaches_a_cells_labels(tmp_path, monkeypatch):
    import json

    mod = _bench_module("cross_cpu")

    def line(cell, digest, branch=None, version="e1-m1"):
        return {"cell": cell, "what": "w", "cpu": "AMD EPYC", "code_version": version, "acc": 0.5,
                "arithmetic": {"pinned": branch is None}, "labels_sha256": digest,
                **({"mkl_branch": branch} if branch else {})}

    rows = [line("1", "a"), line("1", "a", "AVX2"), line("2", "a"), line("2", "b", "AVX2"),
            line("3", "a"), line("3", "a", "AVX2", version="e2-m1")]
    jsonl = tmp_path / "cells.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in rows))
    monkeypatch.setattr(mod, "JSONL", jsonl)
    page = mod.render()
    assert "- cell 1, MKL sent to AVX2 after the pin on AMD: the pinned run's labels" in page
    assert "- cell 2, MKL sent to AVX2 after the pin on AMD: other labels than the pinned run" in page
    assert "- cell 3, MKL sent to AVX2 after the pin on AMD: no pinned run of that code version" in page
    assert "| 2 | w | AMD EPYC | e1-m1 | MKL AVX2 | 0.5000 | b |" in page
    # a moved run is not a pinned run of its CPU kind
    assert "- cell 2: only AMD so far (1 pinned run(s), 1 labels hash(es))" in page
