"""Unit and calibration tests for measure/order_stats.py, against scipy as the reference."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from variantlab.measure import stats
from variantlab.measure.order_stats import (binom_cdf, binom_sf, min_samples_for_quantile,
                                            order_statistic_ranks, quantile_interval,
                                            regularized_beta, student_t_quantile)

TOL = 1e-12  # slack for comparing our tail sums with scipy's at the alpha/2 boundary


# --------------------------------------------------------------------------- binomial

@pytest.mark.parametrize("n", [1, 5, 37, 1000, 10**5, 10**6])
@pytest.mark.parametrize("p", [1e-6, 0.01, 0.3, 0.5, 0.95, 0.99])
def test_binomial_cdf_and_sf_match_scipy(n, p):
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    ks = sorted({0, 1, n - 1, n, *(int(mean + z * sd) for z in (-8, -3, -1.96, -1, 0, 1, 1.96, 3, 8))})
    for k in (k for k in ks if 0 <= k <= n):
        for ours, ref in ((binom_cdf(k, n, p), sps.binom.cdf(k, n, p)),
                          (binom_sf(k, n, p), sps.binom.sf(k - 1, n, p))):
            if ref > 1e-30:
                assert ours == pytest.approx(ref, rel=1e-8), (k, n, p)
            else:
                assert ours < 1e-25


def test_binomial_edges():
    assert binom_cdf(-1, 10, 0.5) == 0.0 and binom_cdf(10, 10, 0.5) == 1.0
    assert binom_sf(0, 10, 0.5) == 1.0 and binom_sf(11, 10, 0.5) == 0.0
    assert binom_cdf(0, 10, 0.5) == pytest.approx(2.0**-10, rel=1e-14)
    assert binom_sf(10, 10, 0.5) == pytest.approx(2.0**-10, rel=1e-14)
    assert binom_cdf(3, 10, 0.0) == 1.0 and binom_sf(3, 10, 1.0) == 1.0
    with pytest.raises(ValueError):
        binom_cdf(1, -1, 0.5)
    with pytest.raises(ValueError):
        binom_cdf(1, 10, 1.5)


# --------------------------------------------------------------------------- ranks

def _cases():
    for q in (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9):
        need = min_samples_for_quantile(q)
        for n in sorted({1, 2, 5, 6, 10, 31, 32, 50, 100, 367, 368, 1000, 4000,
                         need - 1, need, need + 1, 2 * need, 3 * need + 1, 10 * need}):
            if n >= 1:
                yield n, q


@pytest.mark.parametrize("confidence", [0.90, 0.95, 0.99])
def test_order_statistic_ranks_cover_with_equal_tails_and_are_shortest(confidence):
    tail = (1 - confidence) / 2
    checked = 0
    for n, q in _cases():
        p = q / 100
        ranks = order_statistic_ranks(n, q, confidence)
        possible = (1 - p) ** n <= tail and p**n <= tail
        assert (ranks is not None) == possible, (n, q)
        assert (ranks is not None) == (n >= min_samples_for_quantile(q, confidence)), (n, q)
        if ranks is None:
            continue
        l, u = ranks
        assert 1 <= l < u <= n
        below = sps.binom.cdf(l - 1, n, p)          # P(B <= l - 1): X_(l) above the quantile
        above = sps.binom.sf(u - 1, n, p)           # P(B >= u): X_(u) below the quantile
        assert below <= tail + TOL and above <= tail + TOL, (n, q, l, u)
        assert 1 - below - above >= confidence - TOL
        # Shortest under the tail constraint: moving either end inwards breaks its tail.
        assert sps.binom.cdf(l, n, p) > tail - TOL
        assert sps.binom.sf(u - 2, n, p) > tail - TOL
        checked += 1
    assert checked > 70


def test_order_statistic_ranks_for_large_n_use_the_normal_window():
    l, u = order_statistic_ranks(10**6, 99)
    assert sps.binom.cdf(l - 1, 10**6, 0.99) <= 0.025 < sps.binom.cdf(l, 10**6, 0.99)
    assert sps.binom.sf(u - 1, 10**6, 0.99) <= 0.025 < sps.binom.sf(u - 2, 10**6, 0.99)


def test_extreme_quantiles_have_no_interval():
    assert order_statistic_ranks(10**4, 0) is None
    assert order_statistic_ranks(10**4, 100) is None
    with pytest.raises(ValueError, match="p100"):
        min_samples_for_quantile(100)
    with pytest.raises(ValueError, match="0..100"):
        order_statistic_ranks(10, 101)
    with pytest.raises(ValueError, match="confidence"):
        order_statistic_ranks(10, 50, confidence=1.0)


def test_min_samples_for_quantile():
    # Upper tail alone for p99: 1 - P(B <= n-1) = 0.99^n must fall to 0.025; 0.99^367 = 0.02501.
    assert 0.99**367 > 0.025 >= 0.99**368
    assert min_samples_for_quantile(99) == 368
    assert min_samples_for_quantile(95) == 72
    assert min_samples_for_quantile(90) == 36
    assert min_samples_for_quantile(50) == 6
    assert min_samples_for_quantile(5) == 72           # symmetric in q <-> 100 - q
    assert min_samples_for_quantile(50, confidence=0.99) == 8   # 0.5^8 = 0.0039 <= 0.005
    assert min_samples_for_quantile(99.9) == 3688


def test_quantile_interval_picks_the_ranked_values():
    xs = [5.0, 1.0, 4.0, 2.0, 6.0, 3.0]
    assert order_statistic_ranks(6, 50) == (1, 6)
    assert quantile_interval(xs, 50) == (1.0, 6.0)
    assert quantile_interval(xs[:5], 50) is None
    ys = np.random.default_rng(0).permutation(np.arange(1.0, 33.0))  # 1..32 shuffled
    l, u = order_statistic_ranks(32, 50)
    assert quantile_interval(ys, 50) == (float(l), float(u))
    assert quantile_interval(ys, 99) is None
    with pytest.raises(ValueError, match="NaN"):
        quantile_interval([1.0, float("inf")] * 5, 50)


# --------------------------------------------------------------------------- Student t

def test_student_t_quantile_matches_scipy():
    ps = [0.501, 0.51, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95, 0.975, 0.99, 0.995, 0.999]
    worst = 0.0
    for df in [*range(1, 201), 1.5, 2.5, 3.7, 1000.0]:
        for p in ps:
            ours, ref = student_t_quantile(p, df), sps.t.ppf(p, df)
            worst = max(worst, abs(ours - ref) / abs(ref))
            assert student_t_quantile(1 - p, df) == -ours
    assert worst < 1e-9


def test_student_t_quantile_closed_forms_and_errors():
    assert student_t_quantile(0.975, 1) == pytest.approx(12.706204736174705, rel=1e-13)
    assert student_t_quantile(0.975, 2) == pytest.approx(4.302652729749464, rel=1e-13)
    assert student_t_quantile(0.5, 7) == 0.0
    with pytest.raises(ValueError, match="df"):
        student_t_quantile(0.9, 0.5)
    with pytest.raises(ValueError, match="p must"):
        student_t_quantile(1.0, 5)


def test_regularized_beta_matches_scipy():
    from scipy.special import betainc
    for a, b in ((0.5, 0.5), (2.0, 0.5), (50.0, 0.5), (0.5, 100.0), (3.0, 7.0)):
        for x in (1e-6, 0.01, 0.3, 0.5, 0.9, 0.999999):
            assert regularized_beta(x, a, b) == pytest.approx(betainc(a, b, x), rel=1e-11, abs=1e-300)


# --------------------------------------------------------------------------- calibration

def _coverage(n: int, q: float, sims: int, seed: int) -> float:
    """Share of simulated lognormal samples whose order-statistic interval holds the true q-th
    percentile, exp(sigma z_q)."""
    sigma = 0.8
    truth = math.exp(sigma * sps.norm.ppf(q / 100))
    xs = np.sort(np.random.default_rng(seed).lognormal(0.0, sigma, size=(sims, n)), axis=1)
    l, u = order_statistic_ranks(n, q)
    return float(np.mean((xs[:, l - 1] <= truth) & (truth <= xs[:, u - 1])))


def test_order_statistic_intervals_cover_at_least_as_promised():
    assert _coverage(30, 50, 4000, seed=1) >= 0.94
    assert _coverage(100, 95, 4000, seed=2) >= 0.94
    assert _coverage(400, 99, 2000, seed=3) >= 0.94


def test_percentile_bootstrap_undercovers_p99_with_32_samples():
    # The motivation for order statistics: the bootstrap's p99 never exceeds the sample maximum,
    # which lies below the true p99 with probability 0.99^32 = 0.72.
    sigma = 0.8
    truth = math.exp(sigma * sps.norm.ppf(0.99))
    rng = np.random.default_rng(4)
    p99 = stats.quantile(99)
    hits = 0
    for i in range(1000):
        low, high = stats.bootstrap_ci(rng.lognormal(0.0, sigma, size=32), p99, resamples=500, seed=i)
        hits += low <= truth <= high
    assert hits / 1000 < 0.45          # about 0.3; order statistics give no interval here instead
    assert order_statistic_ranks(32, 99) is None
