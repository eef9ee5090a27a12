"""Tests for measure/rounds.py: hierarchical estimates, paired round deltas, and their calibration.

The calibration tests simulate the failure that interleaved rounds exist to fix: a shared machine
whose speed drifts between rounds. They are deterministic (fixed seeds) and assert rates, never
wall-clock times.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from variantlab.measure import rounds as rd
from variantlab.measure import stats
from variantlab.measure.order_stats import quantile_interval, student_t_quantile
from variantlab.measure.rounds import ONE_ROUND_METHOD, estimate_rounds, paired_delta
from variantlab.measure.stats import Delta, Estimate, relative_delta


def lognormal_rounds(seed: int, sizes, shifts=None, sigma: float = 0.4) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shifts = shifts if shifts is not None else [0.0] * len(sizes)
    return [np.exp(s + rng.normal(0.0, sigma, size=m)) for s, m in zip(shifts, sizes)]


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.union1d(a, b)
    cdf = lambda d: np.searchsorted(np.sort(d), grid, side="right") / d.size  # noqa: E731
    return float(np.max(np.abs(cdf(a) - cdf(b))))


# --------------------------------------------------------------------------- estimate_rounds

def test_estimate_rounds_empty_and_single_sample():
    assert estimate_rounds([], "s") == Estimate(None, None, None, 0, None, "s", rounds=0,
                                                problem="no samples")
    assert estimate_rounds([[], None], "s").value is None
    one = estimate_rounds([[], [2.5], None], "s")
    assert (one.value, one.low, one.high, one.n, one.rounds, one.method) == (
        2.5, None, None, 1, 1, "single sample")
    assert one.round_cv is None and one.problem is None


def test_one_round_quantile_uses_order_statistics():
    xs = lognormal_rounds(0, [100])[0]
    e = estimate_rounds([xs], "ms")
    assert e.value == stats.median(xs) and e.n == 100 and e.rounds == 1
    assert (e.low, e.high) == quantile_interval(xs, 50)
    assert e.method == "order statistics" and e.round_cv is None and e.problem is None
    assert e.cv == pytest.approx(stats.coefficient_of_variation(xs))
    p95 = estimate_rounds([xs], "ms", stats.quantile(95))
    assert (p95.low, p95.high) == quantile_interval(xs, 95)


def test_too_few_samples_for_a_tail_quantile_gives_a_problem_not_an_interval():
    xs = lognormal_rounds(1, [80])[0]
    e = estimate_rounds([xs], "ms", stats.quantile(99), sample_name="requests")
    assert e.value == pytest.approx(np.percentile(xs, 99))
    assert e.low is None and e.high is None and e.method == ""
    assert e.problem == "too few requests for p99 (80 pooled; 368 needed for a 95% interval)"
    split = estimate_rounds([xs[:40], xs[40:]], "ms", stats.quantile(99))
    assert split.problem == "too few samples for p99 (80 pooled; 368 needed for a 95% interval)"
    assert split.rounds == 2 and split.round_cv is not None
    # Five per-process values (cold starts): no 95% interval for their median exists.
    cold = estimate_rounds([[1.0], [1.1], [0.9], [1.2], [1.0]], "s")
    assert cold.value == 1.0 and cold.low is None
    assert cold.problem == "too few samples for the median (5 pooled; 6 needed for a 95% interval)"
    assert estimate_rounds([[1.0], [1.1], [0.9], [1.2], [1.0]], "s", stats.mean).low is not None


def test_one_round_mean_is_the_plain_bootstrap():
    xs = lognormal_rounds(2, [60])[0]
    e = estimate_rounds([xs], "s", stats.mean)
    old = stats.estimate(xs, "s", stats.mean)
    assert (e.value, e.low, e.high, e.n, e.cv) == (old.value, old.low, old.high, old.n, old.cv)
    assert e.method == old.method == "bootstrap"


def test_several_rounds_hierarchical_and_deterministic():
    rs = lognormal_rounds(3, [200, 150, 220, 180, 200], shifts=[0.0, 0.05, -0.05, 0.1, 0.0])
    e = estimate_rounds(rs, "ms")
    pooled = np.concatenate(rs)
    assert e.value == stats.median(pooled) and e.n == pooled.size and e.rounds == 5
    assert e.method == "hierarchical bootstrap and t over 5 rounds"
    per_round = [stats.median(r) for r in rs]
    assert e.round_cv == pytest.approx(np.std(per_round, ddof=1) / np.mean(per_round))
    assert e.low < e.value < e.high
    os_low, os_high = quantile_interval(pooled, 50)
    assert e.low <= os_low and os_high <= e.high          # the hull holds the pooled interval
    assert e == estimate_rounds(rs, "ms")
    half = student_t_quantile(0.975, 4) * np.std(per_round, ddof=1) / np.sqrt(5)
    assert e.low <= np.mean(per_round) - half and np.mean(per_round) + half <= e.high   # and the t-interval
    assert estimate_rounds([*rs, None, []], "ms") == e     # empty rounds do not count


def test_rounds_that_disagree_widen_the_interval():
    # The same samples, once as five rounds whose levels differ (a drifting machine) and once as
    # one round: only the round structure can show that the level itself is uncertain.
    rs = lognormal_rounds(4, [200] * 5, shifts=[0.0, 0.15, -0.1, 0.2, -0.05], sigma=0.3)
    pooled = np.concatenate(rs)
    for statistic in (stats.median, stats.quantile(90), stats.mean):
        apart = estimate_rounds(rs, "ms", statistic)
        together = estimate_rounds([pooled], "ms", statistic)
        assert apart.value == together.value
        assert apart.high - apart.low > 2.0 * (together.high - together.low), statistic
        assert apart.round_cv > 0.05 and together.round_cv is None


def test_rounds_that_agree_give_about_the_one_round_interval():
    rs = lognormal_rounds(5, [300] * 6)
    apart = estimate_rounds(rs, "ms", stats.mean)
    together = estimate_rounds([np.concatenate(rs)], "ms", stats.mean)
    ratio = (apart.high - apart.low) / (together.high - together.low)
    assert 0.6 < ratio < 1.4


def test_estimate_rounds_rejects_nan_and_bad_arguments():
    with pytest.raises(ValueError, match="NaN"):
        estimate_rounds([[1.0, 2.0], [float("nan")]], "s")
    with pytest.raises(ValueError, match="confidence"):
        estimate_rounds([[1.0, 2.0]], "s", confidence=0.0)


# --------------------------------------------------------------------------- fast paths

@pytest.mark.parametrize("q", [50.0, 90.0, 99.0, 3.0])
def test_fast_hierarchical_quantile_matches_resampling_reference(q):
    rs = lognormal_rounds(6, [7, 30, 12, 50, 1], shifts=[0.0, 0.2, -0.1, 0.3, 0.0], sigma=0.5)
    fast = rd._hierarchical_quantile(rs, q, 20000, np.random.default_rng(0))
    naive = rd._hierarchical_by_resampling(rs, lambda x: float(np.percentile(x, q)), 4000,
                                           np.random.default_rng(1))
    # KS critical value at 0.1% for 20000 vs 4000 draws is about 0.034.
    assert ks_distance(fast, naive) < 0.035
    assert fast.std() == pytest.approx(naive.std(), rel=0.06)


def test_fast_hierarchical_quantile_handles_ties():
    rs = [np.array([1.0, 1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0]), np.array([1.0, 3.0, 3.0])]
    fast = rd._hierarchical_quantile(rs, 50.0, 20000, np.random.default_rng(0))
    naive = rd._hierarchical_by_resampling(rs, stats.median, 4000, np.random.default_rng(1))
    assert ks_distance(fast, naive) < 0.035


def test_hierarchical_mean_matches_resampling_reference_both_ways():
    exact = lognormal_rounds(7, [40, 90, 25], shifts=[0.0, 0.2, -0.1], sigma=0.6)
    big = lognormal_rounds(8, [rd.NORMAL_MEAN_MIN + 500] * 4, shifts=[0.0, 0.02, -0.02, 0.03])
    # KS critical values at 0.1%: about 0.034 against 4000 reference draws, 0.07 against 800.
    for rs, n_naive, bound in ((exact, 4000, 0.035), (big, 800, 0.07)):
        fast = rd._hierarchical_mean(rs, 20000, np.random.default_rng(0))
        naive = rd._hierarchical_by_resampling(rs, stats.mean, n_naive, np.random.default_rng(1))
        assert ks_distance(fast, naive) < bound
        assert fast.std() == pytest.approx(naive.std(), rel=0.1)


# --------------------------------------------------------------------------- paired_delta

def test_paired_delta_by_hand():
    # Round medians 1, 2, 4 against 1.1, 2.2, 4.4: every ratio is 1.1, so the spread is 0.
    base = [[1.0, 0.5, 1.5], [2.0], [4.0, 4.0]]
    var = [[1.1, 0.2, 9.0], [2.2], [4.4, 4.4]]
    d = paired_delta(base, var, stats.median)
    assert d.pct == pytest.approx(10.0) and d.low == pytest.approx(10.0)
    assert d.significant is True and d.rounds == 3 and d.method == "paired over 3 rounds"
    # Ratios 1.0, 1.2, 1.1 (per-process values, so mean = median per round): a t on 2 df.
    d = paired_delta([[10.0], [10.0], [10.0]], [[10.0], [12.0], [11.0]], stats.mean)
    logs = np.log([1.0, 1.2, 1.1])
    half = student_t_quantile(0.975, 2) * np.std(logs, ddof=1) / math.sqrt(3)
    assert d.pct == pytest.approx(math.expm1(logs.mean()) * 100)
    assert d.low == pytest.approx(math.expm1(logs.mean() - half) * 100)
    assert d.high == pytest.approx(math.expm1(logs.mean() + half) * 100)
    assert d.low < 0.0 < d.high and d.significant is False
    assert d.label().endswith("(n.s.)")


def test_paired_delta_skips_rounds_missing_on_either_side():
    b = [[10.0], None, [], [10.0], [0.0], [10.0]]
    v = [[11.0], [11.0], [11.0], [12.0], [11.0]]   # shorter: round 5 has no variant
    d = paired_delta(b, v, stats.mean)
    # Usable: rounds 0 and 3 (round 4's baseline is 0).
    assert d.rounds == 2 and d.pct == pytest.approx((math.sqrt(1.1 * 1.2) - 1) * 100)
    assert paired_delta([None, []], [[1.0], [2.0]]) == Delta(
        None, None, None, None, problem="no round measured both variants")
    none = paired_delta([[0.0]], [[1.0]], stats.mean)
    assert none.pct is None and none.problem


def test_paired_delta_with_one_round_falls_back_to_the_request_bootstrap():
    rs = lognormal_rounds(9, [50, 50], shifts=[0.0, 0.1])
    d = paired_delta([rs[0]], [rs[1]])
    old = relative_delta(rs[0], rs[1])
    assert (d.pct, d.low, d.high) == (old.pct, old.low, old.high)
    assert d.significant is None                  # an interval, but drift is not controlled: no verdict
    assert d.method == ONE_ROUND_METHOD and d.rounds == 1
    single = paired_delta([[2.0]], [[3.0]], stats.mean)
    assert single == Delta(50.0, None, None, None, method="single sample", rounds=1)


def test_paired_delta_refuses_tail_quantiles_from_too_few_samples():
    rs = lognormal_rounds(10, [32] * 10)
    base, var = rs[:5], rs[5:]
    d = paired_delta(base, var, stats.quantile(99), sample_name="requests")
    pb, pv = np.concatenate(base), np.concatenate(var)
    expected = (np.percentile(pv, 99) - np.percentile(pb, 99)) / np.percentile(pb, 99) * 100
    assert d.pct == pytest.approx(expected)
    assert (d.low, d.high, d.significant, d.rounds, d.method) == (None, None, None, 5, "pooled")
    assert d.problem == "too few requests for p99 (160 pooled; 368 needed for a 95% interval)"
    assert d.label() == f"{d.pct:+.1f}%"
    # Enough for p95 (72): the paired interval is given.
    assert paired_delta(base, var, stats.quantile(95)).low is not None


def test_paired_delta_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        paired_delta([[1.0], [float("nan")]], [[1.0], [1.0]])


samples = st.lists(st.floats(0.1, 100.0), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None)
@given(st.lists(samples, min_size=1, max_size=6), st.sampled_from([50.0, 90.0, 10.0]))
def test_quantile_estimates_hold_their_value(rounds, q):
    e = estimate_rounds(rounds, "s", stats.quantile(q), resamples=200)
    pooled = np.concatenate([np.asarray(r) for r in rounds])
    assert e.value == pytest.approx(np.percentile(pooled, q)) and e.n == pooled.size
    assert e.rounds == len(rounds)
    if e.low is None:
        assert e.problem or e.method == "single sample"
    else:
        assert e.low <= e.value <= e.high
        os_low, os_high = quantile_interval(pooled, q)
        assert e.low <= os_low and os_high <= e.high


ratios = st.lists(st.floats(0.5, 2.0), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(ratios, ratios), min_size=2, max_size=6))
def test_paired_delta_is_antisymmetric_on_the_log_scale(pairs):
    # Swapping the variants negates every log ratio: the interval mirrors on the log scale.
    base, var = [b for b, _ in pairs], [v for _, v in pairs]
    forward, backward = paired_delta(base, var, stats.mean), paired_delta(var, base, stats.mean)
    log = lambda pct: math.log1p(pct / 100.0)  # noqa: E731
    assert log(backward.pct) == pytest.approx(-log(forward.pct), rel=1e-6, abs=1e-12)
    assert log(backward.low) == pytest.approx(-log(forward.high), rel=1e-6, abs=1e-12)
    assert log(backward.high) == pytest.approx(-log(forward.low), rel=1e-6, abs=1e-12)
    assert backward.significant == forward.significant


# --------------------------------------------------------------------------- calibration

def simulate(rng, effect: float, rounds: int, requests: int = 32, drift: float = 0.3,
             unshared: float = 0.05, request_sd: float = 0.3):
    """Per-request latencies of a baseline and a variant measured in the same rounds.

    log latency = round drift shared by both variants (the machine's state in that round)
    + unshared per-(round, variant) noise + per-request noise; the variant adds log(effect).
    """
    shared = rng.normal(0.0, drift, size=rounds)
    def side(shift):
        return [np.exp(shift + shared[i] + rng.normal(0.0, unshared)
                       + rng.normal(0.0, request_sd, size=requests)) for i in range(rounds)]
    return side(0.0), side(math.log(effect))


def test_paired_rounds_control_false_positives_that_one_round_does_not():
    rng = np.random.default_rng(12)
    sims = 1000
    paired = one_round = 0
    for _ in range(sims):
        base, var = simulate(rng, 1.0, rounds=5)
        paired += bool(paired_delta(base, var).significant)
        # One round each, measured at different times: each side carries its own drift.
        b1, = simulate(rng, 1.0, rounds=1)[0]
        v1, = simulate(rng, 1.0, rounds=1)[1]
        d1 = paired_delta([b1], [v1], resamples=500)
        assert d1.method == ONE_ROUND_METHOD
        one_round += bool(d1.low > 0.0 or d1.high < 0.0)   # what a verdict on that interval would say
    assert paired / sims <= 0.06            # nominal 0.05
    assert one_round / sims >= 0.4          # drift read as a difference (about 0.65 here)


def test_paired_rounds_detect_a_real_difference():
    rng = np.random.default_rng(13)
    sims = 500
    found = 0
    for _ in range(sims):
        base, var = simulate(rng, 1.2, rounds=5, unshared=0.03)
        d = paired_delta(base, var)
        found += bool(d.significant and d.low > 0.0)
    assert found / sims >= 0.8


def test_one_value_per_round_intervals_cover_their_confidence_with_few_rounds():
    """Cold start and peak memory have one value per round: over 5 rounds a percentile bootstrap alone
    covered about 84%; with the t-interval's hull it must hold 95% (to simulation error)."""
    rng = np.random.default_rng(11)
    hits = boot_hits = 0
    sims = 800
    for k in range(sims):
        values = rng.normal(10.0, 1.0, size=5)
        e = estimate_rounds([[v] for v in values], "s", stats.mean, resamples=400, seed=k)
        hits += e.low <= 10.0 <= e.high
        lo, hi = np.percentile([rng.choice(values, 5).mean() for _ in range(400)], [2.5, 97.5])
        boot_hits += lo <= 10.0 <= hi
    assert hits / sims >= 0.93
    assert boot_hits / sims < 0.90          # what the bootstrap alone gave: the reason for the hull


# --------------------------------------------------------------------------- unpaired_delta

def test_unpaired_delta_of_a_run_against_itself_always_straddles_zero():
    rng = np.random.default_rng(0)
    runs = [list(rng.lognormal(0, 0.2, 30) * (1 + 0.05 * rng.standard_normal())) for _ in range(4)]
    d = rd.unpaired_delta(runs, runs)
    assert d.pct == 0.0 and d.low < 0 < d.high and d.significant is False
    assert d.method == "unpaired over 4 and 4 rounds" and d.rounds == 4


def test_unpaired_delta_covers_welchs_interval_on_log_round_statistics():
    a = [[1.0, 1.1, 0.9], [1.2, 1.3, 1.1], [0.95, 1.0, 1.05]]
    b = [[1.5, 1.6, 1.4], [1.45, 1.5, 1.55]]
    d = rd.unpaired_delta(a, b, stats.median)
    la, lb = np.log([1.0, 1.2, 1.0]), np.log([1.5, 1.5])
    va, vb = la.var(ddof=1) / 3, lb.var(ddof=1) / 2
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 1)
    half = student_t_quantile(0.975, df) * math.sqrt(va + vb)
    diff = lb.mean() - la.mean()
    assert d.low <= math.expm1(diff - half) * 100 + 1e-9 and d.high >= math.expm1(diff + half) * 100 - 1e-9
    assert d.pct == pytest.approx(100 * (1.5 / 1.05 - 1))      # pooled medians, not the per-round ones


def test_unpaired_delta_finds_a_clear_shift():
    rng = np.random.default_rng(1)
    a = [list(rng.normal(1.0, 0.01, 20)) for _ in range(3)]
    b = [list(rng.normal(1.3, 0.01, 20)) for _ in range(3)]
    d = rd.unpaired_delta(a, b)
    assert d.significant is True and 25 < d.low < d.pct < d.high < 35


def test_unpaired_delta_gives_no_interval_without_round_noise_or_positive_statistics():
    one = rd.unpaired_delta([[1.0, 2.0]], [[1.0, 2.0], [1.5, 2.5]])
    assert one.significant is None and one.low is None and "one round in A" in one.problem and one.pct is not None
    assert rd.unpaired_delta([], [[1.0]]).pct is None
    negative = rd.unpaired_delta([[-1.0, 1.0], [-1.0, 2.0]], [[1.0], [2.0]], stats.mean)
    assert negative.low is None and "not positive" in negative.problem
    few = rd.unpaired_delta([[1.0] * 5, [1.0] * 5], [[1.0] * 5, [1.0] * 5], stats.quantile(99), sample_name="requests")
    assert few.low is None and "too few requests for p99" in few.problem
    with pytest.raises(ValueError):
        rd.unpaired_delta([[1.0, float("nan")]], [[1.0]])


# --------------------------------------------------------------------------- process spread (issue 50)

def test_process_spread_of_two_variants_is_the_pairs_own_spread():
    # With two variants the two-way residual is half a paired log ratio's deviation: sqrt(2) sd is the
    # sample sd of the log ratios, on R - 1 degrees of freedom.
    a = {0: 1.0, 1: 2.0, 2: 4.0, 3: 1.5}
    b = {0: 1.1, 1: 1.9, 2: 4.6, 3: 1.5}
    sp = rd.process_spread({"a": a, "b": b})
    logs = np.log([b[r] / a[r] for r in range(4)])
    assert sp.df == 3 and (sp.variants, sp.rounds) == (2, 4)
    assert math.sqrt(2) * sp.sd == pytest.approx(np.std(logs, ddof=1))
    # A variant's level and a round's drift are not spread: only what strays from both is.
    level = {"a": 1.0, "b": 1.5, "c": 0.7}
    drift = {0: 1.0, 1: 3.0, 2: 0.5}
    sp = rd.process_spread({v: {r: x * d for r, d in drift.items()} for v, x in level.items()})
    assert sp is None or sp.sd < 1e-12


def test_process_spread_needs_two_variants_over_two_common_rounds():
    assert rd.process_spread({"a": {0: 1.0, 1: 2.0}}) is None
    assert rd.process_spread({"a": {0: 1.0}, "b": {0: 1.2}}) is None
    assert rd.process_spread({"a": {0: 1.0, 1: 1.1}, "b": {2: 1.0, 3: 1.3}}) is None      # no round in common
    # a variant with one usable round is left out; the others still give it
    sp = rd.process_spread({"a": {0: 1.0, 1: 1.1, 2: 0.9}, "b": {0: 1.0, 1: 1.2, 2: 1.0}, "c": {0: 1.0, 1: -1.0}})
    assert sp is not None and sp.variants == 2 and sp.rounds == 3


def test_spread_rounds_to_resolve_and_smallest_resolved_change():
    sp = rd.Spread(sd=0.14, df=4, variants=3, rounds=3)
    half = student_t_quantile(0.975, 4) * math.sqrt(2) * 0.14 / math.sqrt(3)
    assert sp.smallest_resolved_pct(3) == pytest.approx(math.expm1(half) * 100)
    need = sp.rounds_to_resolve(15.0)
    assert need is not None and need > 3
    assert sp.smallest_resolved_pct(need) > 0
    for r, ok in ((need - 1, False), (need, True)):   # the fewest rounds: one fewer does not resolve 15%
        df = 2 * (r - 1)
        h = student_t_quantile(0.975, df) * math.sqrt(2) * 0.14 / math.sqrt(r)
        assert (math.expm1(h) * 100 <= 15.0) is ok


def test_a_pair_whose_few_rounds_agreed_by_chance_reads_no_surer_than_the_runs_processes():
    # Issue 50: three rounds whose ratios happen to agree give a t-interval far narrower than the machine's
    # processes stray (here 15% a process, from every variant of the row): the spread widens it to n.s.
    base, var = [[10.0], [10.0], [10.0]], [[11.5], [11.6], [11.4]]
    alone = paired_delta(base, var, stats.mean)
    assert alone.significant is True
    sp = rd.Spread(sd=math.log(1.15), df=4, variants=3, rounds=3)
    d = paired_delta(base, var, stats.mean, spread=sp)
    assert d.significant is False and d.pct == pytest.approx(alone.pct)
    assert d.method == "paired over 3 rounds and the run's process spread"
    # a change far beyond the spread is still told
    big = paired_delta(base, [[30.0], [31.0], [29.0]], stats.mean, spread=sp)
    assert big.significant is True


def test_a_few_slow_requests_on_one_side_cannot_make_a_mean_significant():
    # Issue 50's run: one request far out in the tail in each of b's rounds moved its mean by 75% while every
    # percentile read n.s.; the mean's interval now carries what the tail weighs.
    rng = np.random.default_rng(1)
    a = [list(rng.normal(10, 1, 16)) for _ in range(3)]
    b = [list(rng.normal(10, 1, 16)) for _ in range(3)]
    for r, i in ((0, 3), (1, 5), (2, 7)):
        b[r][i] = 130.0
    old_t = np.log([np.mean(y) / np.mean(x) for x, y in zip(a, b)])
    half = student_t_quantile(0.975, 2) * np.std(old_t, ddof=1) / math.sqrt(3)
    assert old_t.mean() - half > 0          # the t over the rounds' means alone called it significant
    d = paired_delta(a, b, stats.mean)
    assert d.pct > 50 and d.significant is False and "dealt within rounds" in d.method
    assert paired_delta(a, b, stats.median).significant is False
    # a real shift of every request is still significant
    shifted = [[x * 1.3 for x in r] for r in a]
    assert paired_delta(a, shifted, stats.mean).significant is True


def test_identical_variants_are_called_different_at_most_at_the_nominal_rate_with_the_spread():
    # A/A simulation: three variants, three rounds; a round drifts, a process strays (10%, and one in four
    # runs 2x slower: a switching load), 16 requests a round. Pairs judged with the row's spread.
    rng = np.random.default_rng(5)
    called = judged = 0
    for _ in range(300):
        drift = rng.normal(0, 0.2, 3)
        data = {v: {r: list(np.exp(drift[r] + rng.normal(0, 0.1) + (math.log(2) if rng.random() < 0.25 else 0)
                                   + rng.normal(0, 0.05, 16))) for r in range(3)} for v in range(3)}
        sp = rd.process_spread({v: {r: stats.median(x) for r, x in rs.items()} for v, rs in data.items()})
        for v in (1, 2):
            d = paired_delta([data[0][r] for r in range(3)], [data[v][r] for r in range(3)], stats.median, spread=sp)
            called += bool(d.significant)
            judged += 1
    assert called / judged <= 0.05
