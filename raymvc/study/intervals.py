"""Intervals for what a study compares: a mean over seeds, a difference of two runs on the
same seeds, the share of a drop one cause accounts for, and a count of seeds in one mode.

A mean over seeds and a difference paired over seeds use Student's t interval: with the
five or ten seeds of a study a percentile bootstrap covers far less than 95% (about 80% at
five seeds; at two it is the range of the two values), while the t interval is exact for
normal spreads and wide where it should be. The share of a drop (a ratio of three means)
has no such closed form and uses a percentile bootstrap over seeds resampled together
(``scipy.stats.bootstrap``, 9,999 resamples, a fixed generator so a page is the same each
time it is written): read it as a rough guide at five seeds. Counts use Wilson's score
interval (``scipy.stats.binomtest``). With fewer than two seeds there is no interval
(``None``). :func:`verdict` turns an interval into the words a generated sentence may use:
"above" or "below" only where the interval excludes zero, "too few seeds to say" without
one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

LEVEL = 0.95
RESAMPLES = 9_999
SEED = 0  # the bootstrap's own generator: a page regenerates identically


def _bootstrap(samples: tuple[np.ndarray, ...], statistic, paired: bool) -> tuple[float, float] | None:
    from scipy.stats import bootstrap

    n = len(samples[0])
    if n < 2:
        return None
    if all(np.ptp(s) == 0 for s in samples):  # no spread: every resample gives the same value
        value = float(statistic(*samples, axis=-1))
        return value, value
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples of tiny seed sets warn; the interval stands
        res = bootstrap(samples, statistic, n_resamples=RESAMPLES, confidence_level=LEVEL, method="percentile",
                        paired=paired, vectorized=True, random_state=np.random.default_rng(SEED))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return lo, hi


def _mean(x, axis=-1):
    return np.mean(x, axis=axis)


def mean_ci(xs: Sequence[float]) -> tuple[float, float] | None:
    """Student's t 95% interval of the mean of ``xs`` (one value per seed)."""
    from scipy.stats import t

    x = np.asarray([v for v in xs if v is not None], dtype=float)
    if len(x) < 2:
        return None
    m, s = float(x.mean()), float(x.std(ddof=1))
    if s == 0:
        return m, m
    half = float(t.ppf(0.5 + LEVEL / 2, len(x) - 1)) * s / math.sqrt(len(x))
    return m - half, m + half


def paired_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """Student's t 95% interval of the mean of ``a - b`` over seeds both have (same order)."""
    return mean_ci(list(np.asarray(a, dtype=float) - np.asarray(b, dtype=float)))


def share_ci(a: Sequence[float], b: Sequence[float], c: Sequence[float]) -> tuple[float, float] | None:
    """The 95% interval of ``(mean a - mean b) / (mean a - mean c)`` with seeds resampled
    together (the three runs share their seeds); ``None`` where a resample divides by zero
    too often to say."""
    arrays = tuple(np.asarray(v, dtype=float) for v in (a, b, c))

    def share(x, y, z, axis=-1):
        mx, my, mz = (np.mean(v, axis=axis) for v in (x, y, z))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(mx != mz, (mx - my) / np.where(mx != mz, mx - mz, 1.0), np.nan)

    return _bootstrap(arrays, share, paired=True)


def wilson(k: int, n: int) -> tuple[float, float] | None:
    """Wilson's 95% interval for a share of ``k`` in ``n`` (``None`` for ``n == 0``)."""
    from scipy.stats import binomtest

    if n <= 0:
        return None
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=LEVEL, method="wilson")
    return float(ci.low), float(ci.high)


TOO_FEW = "too few seeds to say"


def verdict(ci: tuple[float, float] | None, above: str = "above", below: str = "below",
            neither: str = "within noise") -> str:
    """``above`` where the interval lies above zero, ``below`` where under it, ``neither``
    where it holds zero, and :data:`TOO_FEW` without an interval."""
    if ci is None:
        return TOO_FEW
    lo, hi = ci
    return above if lo > 0 else below if hi < 0 else neither


def ci_text(ci: tuple[float, float] | None, digits: int = 3, percent: bool = False) -> str:
    """``95% CI 0.850 to 0.915`` (``percent``: ``95% CI 12% to 77%``); ``no interval`` for None."""
    if ci is None:
        return "no interval (fewer than 2 seeds)"
    if percent:
        return f"95% CI {100 * ci[0]:.0f}% to {100 * ci[1]:.0f}%"
    return f"95% CI {ci[0]:.{digits}f} to {ci[1]:.{digits}f}"


__all__ = ["mean_ci", "paired_ci", "share_ci", "wilson", "verdict", "ci_text", "LEVEL"]
