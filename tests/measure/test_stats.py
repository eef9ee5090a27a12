"""Unit tests for measure/stats.py: exact summaries, bootstrap determinism, estimates and deltas."""
import json
import math

import numpy as np
import pytest

from variantlab.measure import stats
from variantlab.measure.stats import (UNSTABLE_CV, Delta, Estimate, bootstrap_ci, compare,
                                    estimate, exact_delta, relative_delta)


def with_cv(cv: float, n: int = 200, centre: float = 10.0, seed: int = 0) -> np.ndarray:
    """Samples whose coefficient of variation is exactly cv (up to rounding)."""
    r = np.random.default_rng(seed).normal(size=n)
    z = (r - r.mean()) / r.std(ddof=1)
    return centre * (1.0 + cv * z)


# --------------------------------------------------------------------------- summaries

def test_percentile_interpolates_linearly_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert stats.percentile(xs, 0) == 1.0
    assert stats.percentile(xs, 25) == pytest.approx(1.75)   # position 0.75 between 1 and 2
    assert stats.percentile(xs, 50) == pytest.approx(2.5)
    assert stats.percentile(xs, 90) == pytest.approx(3.7)
    assert stats.percentile(xs, 100) == 4.0
    for q in (1, 33.3, 99):
        assert stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError, match="0..100"):
        stats.percentile([1.0], 101)
    with pytest.raises(ValueError, match="empty"):
        stats.percentile([], 50)
    with pytest.raises(ValueError, match="NaN"):
        stats.median([1.0, float("nan")])


def test_median_mean_stdev_by_hand():
    xs = [2, 4, 4, 4, 5, 5, 7, 9]
    assert stats.median(xs) == 4.5
    assert stats.mean(xs) == 5.0
    assert stats.stdev(xs) == pytest.approx(math.sqrt(32 / 7))  # squared deviations sum to 32
    assert stats.median([3, 1, 2]) == 2.0
    assert stats.stdev([3.0]) == 0.0
    assert stats.stdev([]) == 0.0


def test_coefficient_of_variation():
    assert stats.coefficient_of_variation([2.0, 4.0]) == pytest.approx(math.sqrt(2) / 3)
    assert stats.coefficient_of_variation([5.0]) is None
    assert stats.coefficient_of_variation([-1.0, 1.0]) is None  # mean 0
    assert stats.coefficient_of_variation(with_cv(0.2)) == pytest.approx(0.2)


# --------------------------------------------------------------------------- bootstrap

def test_bootstrap_is_deterministic_for_a_seed_and_contains_the_median():
    xs = np.random.default_rng(1).lognormal(0.0, 0.5, size=300)
    ci = bootstrap_ci(xs, seed=7)
    assert ci == bootstrap_ci(xs, seed=7)
    assert ci != bootstrap_ci(xs, seed=8)
    assert ci[0] < stats.median(xs) < ci[1]
    wider = bootstrap_ci(xs, confidence=0.99, seed=7)
    assert wider[0] <= ci[0] and ci[1] <= wider[1]


@pytest.mark.parametrize("n", [2, 3, 8, 201])
def test_fast_median_bootstrap_matches_resampling_reference(n):
    # The order-statistic sampler must give the same distribution as resampling indices; the
    # lambda is not recognised as a median, so it takes the generic (naive) path.
    xs = np.random.default_rng(n).lognormal(0.0, 0.5, size=n)
    naive = lambda row: float(np.median(row))  # noqa: E731
    fast = stats._bootstrap_distribution(xs, stats.median, 20000, np.random.default_rng(0))
    slow = stats._bootstrap_distribution(xs, naive, 5000, np.random.default_rng(1))
    # Two-sample Kolmogorov-Smirnov distance (the distributions are discrete for small n, so
    # compare CDFs rather than percentiles, which jump at atoms).
    grid = np.union1d(fast, slow)
    cdf = lambda d: np.searchsorted(np.sort(d), grid, side="right") / d.size  # noqa: E731
    assert np.max(np.abs(cdf(fast) - cdf(slow))) < 0.035  # 0.1% critical value is about 0.031
    assert fast.std() == pytest.approx(slow.std(), rel=0.06)


def test_bootstrap_of_the_mean_is_close_to_the_normal_interval():
    xs = np.random.default_rng(2).normal(10.0, 2.0, size=400)
    low, high = bootstrap_ci(xs, statistic=stats.mean)
    half = 1.96 * np.std(xs, ddof=1) / math.sqrt(xs.size)
    assert low == pytest.approx(xs.mean() - half, abs=0.1 * half)
    assert high == pytest.approx(xs.mean() + half, abs=0.1 * half)


def test_bootstrap_rejects_bad_arguments():
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_ci([1.0, 2.0], resamples=0)
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([])


# --------------------------------------------------------------------------- estimates

def test_estimate_of_many_samples():
    xs = with_cv(0.05, n=101)
    e = estimate(xs, "s")
    assert e.value == stats.median(xs)
    assert e.low < e.value < e.high
    assert (e.n, e.unit) == (101, "s")
    assert e.cv == pytest.approx(0.05)
    assert not e.unstable


def test_estimate_handles_empty_and_single_samples():
    assert estimate([], "s") == Estimate(value=None, low=None, high=None, n=0, cv=None, unit="s")
    one = estimate([3.5], "tokens/s")
    assert (one.value, one.low, one.high, one.n, one.cv) == (3.5, None, None, 1, None)
    assert one.method == "single sample" and estimate([1.0, 2.0], "s").method == "bootstrap"
    assert not one.unstable


def test_estimate_new_fields_default_to_one_round():
    e = Estimate(1.0, 0.9, 1.1, 10, 0.05, "s")
    assert (e.rounds, e.round_cv, e.problem, e.method) == (1, None, None, "")


def test_instability_flag_follows_the_design_threshold():
    assert UNSTABLE_CV == 0.10
    assert estimate(with_cv(0.2), "s").unstable
    assert not estimate(with_cv(0.01), "s").unstable
    assert not Estimate(1.0, 0.9, 1.1, 10, 0.10, "s").unstable  # strictly over 10%


def test_estimate_json_round_trip():
    e = estimate(with_cv(0.2), "ms")
    back = Estimate.from_json(json.loads(json.dumps(e.to_json())))
    assert back == e and back.unstable
    empty = estimate([], "ms")
    assert Estimate.from_json(json.loads(json.dumps(empty.to_json()))) == empty
    full = Estimate(2.0, None, None, 80, 0.3, "ms", rounds=5, round_cv=0.12,
                    problem="too few requests for p99 (80 pooled; 368 needed for a 95% interval)",
                    method="hierarchical bootstrap (5 rounds)")
    assert Estimate.from_json(json.loads(json.dumps(full.to_json()))) == full


def test_estimate_reads_json_written_before_rounds():
    old = {"value": 2.0, "low": 1.5, "high": 2.5, "n": 40, "cv": 0.2, "unit": "s"}
    assert Estimate.from_json(old) == Estimate(2.0, 1.5, 2.5, 40, 0.2, "s", rounds=1,
                                               round_cv=None, problem=None, method="")


# --------------------------------------------------------------------------- deltas

def test_delta_label():
    assert Delta(111.0, 98.2, 124.5, True).label() == "+111.0% [+98.2, +124.5]"
    assert Delta(-0.5, -2.0, 1.0, False).label() == "-0.5% [-2.0, +1.0] (n.s.)"
    assert Delta(5.0, None, None, None).label() == "+5.0%"
    assert Delta(None, None, None, None).label() == "n/a"
    # A problem without an interval shows the pct only, never a verdict.
    assert Delta(30.0, None, None, False, problem="too few requests for p99").label() == "+30.0%"
    assert Delta(30.0, None, None, None, problem="too few").label() == "+30.0%"
    assert Delta(-0.5, -2.0, 1.0, False, problem="x").label() == "-0.5% [-2.0, +1.0] (n.s.)"


def test_delta_json_round_trip():
    d = Delta(-52.0, -60.1, -40.3, True)
    assert Delta.from_json(json.loads(json.dumps(d.to_json()))) == d
    full = Delta(12.0, None, None, None, method="pooled", rounds=5, problem="too few")
    assert Delta.from_json(json.loads(json.dumps(full.to_json()))) == full
    old = {"pct": 5.0, "low": 1.0, "high": 9.0, "significant": True}
    assert Delta.from_json(old) == Delta(5.0, 1.0, 9.0, True, method="", rounds=0, problem=None)


def test_relative_delta_of_clearly_separated_samples_is_significant():
    rng = np.random.default_rng(3)
    baseline = 100.0 + rng.normal(0.0, 2.0, size=50)
    variant = 211.0 + rng.normal(0.0, 2.0, size=50)
    d = relative_delta(baseline, variant)
    expected = (stats.median(variant) - stats.median(baseline)) / stats.median(baseline) * 100
    assert d.pct == pytest.approx(expected)
    assert d.significant is True
    assert 100.0 < d.low < d.pct < d.high < 122.0
    assert d == relative_delta(baseline, variant)  # deterministic for the default seed


def test_relative_delta_of_identical_distributions_is_not_significant():
    xs = np.random.default_rng(4).normal(50.0, 5.0, size=60)
    same = relative_delta(xs, xs.copy())
    assert same.pct == 0.0
    assert same.low < 0.0 < same.high and same.significant is False
    rng = np.random.default_rng(5)
    drawn = relative_delta(rng.normal(50.0, 5.0, size=60), rng.normal(50.0, 5.0, size=60))
    assert drawn.significant is False
    assert drawn.label().endswith("(n.s.)")


def test_relative_delta_with_one_sample_or_zero_baseline():
    d = relative_delta([2.0], [3.0, 3.2, 2.8])
    assert d == Delta(pct=50.0, low=None, high=None, significant=None, method="single sample")
    assert relative_delta([0.0, 0.0, 0.0], [1.0, 2.0]).pct is None
    assert relative_delta([], [1.0, 2.0]) == Delta(None, None, None, None)  # every run failed
    assert compare([1.0, 2.0], []) == "not comparable"


def test_exact_delta_is_a_fact_without_a_verdict():
    # Two deterministic values differ or not; there is nothing to be significant about.
    assert exact_delta(100, 50) == Delta(pct=-50.0, low=None, high=None, significant=None,
                                         method="exact")
    assert exact_delta(0.8, 0.8) == Delta(pct=0.0, low=None, high=None, significant=None,
                                          method="exact")
    assert exact_delta(0, 5).pct is None and exact_delta(0, 5).significant is None
    assert exact_delta(100, 50).label() == "-50.0%"


def test_quantile_of_recognises_quantile_statistics():
    assert stats.quantile_of(stats.median) == 50.0 and stats.quantile_of(np.median) == 50.0
    assert stats.quantile_of(stats.quantile(99)) == 99.0
    assert stats.quantile_of(stats.mean) is None


def test_compare_says_faster_slower_or_not_significant():
    rng = np.random.default_rng(6)
    noise = rng.normal(0.0, 0.01, size=41)
    noise -= np.median(noise)  # medians exactly at the centres
    slow, fast = 2.0 + noise, 1.0 + noise
    assert compare(slow, fast) == "2.00x faster"
    assert compare(fast, slow) == "2.00x slower"
    assert compare(fast, fast.copy()) == "not significant"
    # Significant but below the minimum effect of 1%:
    tiny = 100.0 + noise
    assert relative_delta(tiny, tiny + 0.5).significant is True
    assert compare(tiny, tiny + 0.5) == "not significant"
    assert compare(tiny, tiny + 0.5, min_effect_pct=0.1) == "1.00x slower"
    # Rates: higher is better.
    assert compare(fast, slow, lower_is_better=False) == "2.00x faster"
    assert compare([1.0], [2.0]) == "not significant"  # cannot tell from one sample
