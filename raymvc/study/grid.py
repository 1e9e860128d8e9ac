"""A sweep's grid and seeds as the user writes them: parsed, bounded, named.

Shared by ``raymvc sweep`` (:mod:`raymvc.study.sweep`) and study files (:mod:`raymvc.study.files`).
"""

from __future__ import annotations

import re

import yaml

from ..scenario import ScenarioError, safe_yaml_load


def parse_grid(items: list[str]) -> list[tuple[str, list]]:
    """``['key=[v1, v2]', ...]`` -> ``[('key', [v1, v2]), ...]``.

    The part after ``=`` is one YAML list; without brackets it is read as if it had
    them (``key=0,0.1`` is ``key=[0, 0.1]``), so lists and mappings inside brackets keep
    their commas.
    """
    grid = []
    for item in items:
        if "=" not in item:
            raise ScenarioError(f"--grid {item}: expected key.path=[v1, v2, ...]")
        key, text = (part.strip() for part in item.split("=", 1))
        if not key or any(not p for p in key.split(".")):
            raise ScenarioError(f"--grid {item}: bad key path {key!r}")
        src = text if text.startswith("[") else f"[{text}]"
        try:
            values = safe_yaml_load(src)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ScenarioError(f"--grid {item}: {key}: values are not a valid YAML list ({problem})") from None
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"--grid {item}: {key}: expected a non-empty YAML list of values, e.g. {key}=[0, 0.1]")
        if key in {k for k, _ in grid}:
            raise ScenarioError(f"--grid {item}: {key}: given twice")
        grid.append((key, values))
    return grid


MAX_SEEDS = 10_000  # seeds in one sweep or study
MAX_CELLS = 100_000  # (scenario, grid point, seed) cells in one sweep or study


def parse_seeds(text: str, what: str = "--seeds") -> list[int]:
    """``'0,1,2'`` or ``'0-4'`` (or a mix) -> a list of seeds (at most :data:`MAX_SEEDS`);
    ``what`` names the option or key in errors."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ScenarioError(f"{what} {text}: a range runs from low to high, e.g. 0-4")
            if hi - lo + 1 + len(seeds) > MAX_SEEDS:
                raise ScenarioError(f"{what} {text}: more than {MAX_SEEDS} seeds")
            seeds.extend(range(lo, hi + 1))
        elif re.fullmatch(r"\d+", part):
            seeds.append(int(part))
        else:
            raise ScenarioError(f"{what} {text}: expected seeds like 0,1,2 or 0-4")
    if len(seeds) > MAX_SEEDS:
        raise ScenarioError(f"{what} {text}: more than {MAX_SEEDS} seeds")
    return list(dict.fromkeys(seeds))


def short_key(key: str) -> str:
    """``faults.dropout.rate`` -> ``dropout``; ``data.missing.rate`` -> ``missing``; ``seed`` -> ``seed``."""
    parts = key.split(".")
    if len(parts) >= 2 and parts[-1] in {"rate", "fraction", "value"}:
        return parts[-2]
    return parts[-1]


def slug(text: str) -> str:
    text = re.sub(r"[\s:{}\[\],'\"]+", "-", text)
    text = re.sub(r"[^A-Za-z0-9._=+-]", "", text)
    return re.sub(r"-{2,}", "-", text).strip("-") or "x"



def check_size(runs: int, grid_sizes: list[int], seeds: int) -> int:
    """The number of cells, or a ScenarioError past :data:`MAX_CELLS` (checked before any cell is built)."""
    n = runs * seeds
    for g in grid_sizes:
        n *= g
        if n > MAX_CELLS:
            break
    if n > MAX_CELLS:
        raise ScenarioError(f"the sweep has more than {MAX_CELLS} runs ({runs} scenario(s) x "
                            f"{' x '.join(map(str, grid_sizes)) or '1'} grid points x {seeds} seed(s)); "
                            "split it into smaller sweeps")
    return n
