"""Intervals for what the pages compare (raymvc.study.intervals) and the words they allow."""

from __future__ import annotations

import numpy as np
import pytest

from raymvc.study.intervals import ci_text, mean_ci, paired_ci, share_ci, verdict, wilson


def test_a_t_interval_covers_the_mean_and_narrows_with_more_seeds():
    rng = np.random.default_rng(1)
    few, many = rng.normal(0.8, 0.05, 5), rng.normal(0.8, 0.05, 50)
    lo, hi = mean_ci(few)
    assert lo < few.mean() < hi
    lo2, hi2 = mean_ci(many)
    assert hi2 - lo2 < hi - lo
    assert mean_ci([0.9]) is None and mean_ci([0.9, 0.9]) == (0.9, 0.9)
    lo3, hi3 = mean_ci([0.80, 0.90, 0.85])  # Student's t with 2 degrees of freedom: 4.30 standard errors
    assert (hi3 - lo3) / 2 == pytest.approx(4.303 * 0.05 / 3 ** 0.5, rel=1e-3)


def test_two_outcomes_on_five_seeds_leave_a_wide_interval():
    """FedDMVC-like: three seeds separate the digits, two merge them."""
    lo, hi = mean_ci([0.95, 0.82, 0.96, 0.83, 0.95])
    assert hi - lo > 0.08
    assert wilson(3, 5) == pytest.approx((0.231, 0.882), abs=1e-3)
    assert wilson(0, 5)[0] == 0 and wilson(5, 5)[1] == pytest.approx(1.0) and wilson(0, 0) is None


def test_paired_differences_decide_above_below_or_noise():
    a = [0.90, 0.85, 0.88, 0.91, 0.87]
    assert verdict(paired_ci(a, [x - 0.02 for x in a])) == "above"
    assert verdict(paired_ci(a, [x + 0.02 for x in a])) == "below"
    assert verdict(paired_ci(a, [0.89, 0.86, 0.87, 0.92, 0.86])) == "within noise"
    assert verdict(None) == "too few seeds to say"


def test_a_share_of_a_drop_resamples_seeds_together():
    a = [0.90, 0.88, 0.91, 0.89, 0.90]
    c = [0.70, 0.72, 0.65, 0.70, 0.71]
    b = [0.80, 0.80, 0.78, 0.80, 0.80]  # half of the drop, seed by seed
    lo, hi = share_ci(a, b, c)
    assert lo < 0.5 < hi and lo > 0.3 and hi < 0.7
    noisy = share_ci(a, [0.9, 0.7, 0.91, 0.7, 0.9], c)
    assert noisy[0] < 0.1 < noisy[1]  # one cause that helps at some seeds and not others: no verdict
    assert share_ci(a, b, c) == share_ci(a, b, c)  # a page regenerates identically
    assert ci_text((0.1234, 0.5678)) == "95% CI 0.123 to 0.568"
    assert ci_text((0.1234, 0.5678), percent=True) == "95% CI 12% to 57%"
    assert ci_text(None).startswith("no interval")
