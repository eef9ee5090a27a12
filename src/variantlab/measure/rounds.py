"""Statistics over interleaved rounds: hierarchical estimates, paired round deltas, round spread.

Owns the shape `rounds: list[list[float]]`: each variant is measured in R fresh processes
(rounds), the variant order rotating each round, and a timing metric arrives as the samples of
each round (per-request latencies, per-pass wall times, or one per-process value such as a cold
start). Requests within a round share that round's machine state, so they are not independent
draws, and this module never treats them as such when rounds exist:

- estimate_rounds: the statistic of the pooled samples with a hierarchical (two-stage) bootstrap
  interval: resample rounds with replacement, then samples within each drawn round (Davison &
  Hinkley, "Bootstrap Methods and their Application", 1997, sec. 3.8; Field & Welsh, "Bootstrapping
  clustered data", JRSS B 69, 2007). For quantiles the interval is widened to cover the
  distribution-free order-statistic interval of the pooled samples (measure/order_stats.py), which
  the bootstrap cannot reach in the tails with few samples.
- paired_delta: the change of a variant over the baseline from per-round ratios of the statistic,
  a paired t-interval on log ratios (Student 1908; any text on paired designs), so that drift
  both variants shared in a round cancels.
- unpaired_delta: the change between two runs, whose rounds are not paired (advise/compare.py):
  each run's statistic resampled by the hierarchical bootstrap, independently, widened by Welch's
  t-interval on the log per-round statistics.

Quantile statistics (median, stats.quantile(q)) take a fast path in the hierarchical bootstrap:
no resample is materialised. Each resample's pooled sample is a multinomial draw over the globally
sorted atoms; the rank we need is found by descending a binary tree over that sorted order, at
each node splitting every drawn round's count between the halves with one binomial draw (the
counts of a multinomial in a sub-range, given the count in the range, are binomial). That costs
R log2(N) binomial draws per resample instead of N draws; 10 rounds x 20k samples x 2000
resamples take about 0.1 s. The lower and upper order statistics that numpy's linear
interpolation needs share their draws until their paths part, so they come from the same
resample. _hierarchical_by_resampling is the naive reference the fast paths are tested against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import zip_longest
from typing import Sequence

import numpy as np

from .order_stats import min_samples_for_quantile, quantile_interval, student_t_quantile
from .stats import (_CHUNK_ELEMENTS, Delta, Estimate, Statistic, _as_sample,
                    _check_bootstrap_args, _interval, _pct, bootstrap_ci,
                    coefficient_of_variation, mean, median, quantile_of, relative_delta)

Rounds = Sequence[Sequence[float] | None]
"""Per round, the samples measured in it; None (or empty) for a round that produced nothing."""

NORMAL_MEAN_MIN = 2000
"""Rounds of at least this many samples have the within-round stage of the hierarchical bootstrap
of a mean (see _hierarchical_mean), and the deal of a round's samples (_permuted_mean_interval), drawn from its
normal approximation; smaller ones exactly."""

ONE_ROUND_METHOD = "one round: requests bootstrapped; drift between variants not controlled, so no verdict"


# --------------------------------------------------------------------------- helpers

def _round_arrays(rounds: Rounds, what: str) -> list[np.ndarray | None]:
    """Each round as a checked 1-D float64 array (None stays None); raises on NaN/inf."""
    return [None if r is None else _as_sample(r, f"{what} round {i}") for i, r in enumerate(rounds)]


def _statistic_name(statistic: Statistic, q: float) -> str:
    return "the median" if statistic is median or statistic is np.median else f"p{q:g}"


def _too_few(statistic: Statistic, q: float, n: int, confidence: float, sample_name: str) -> str | None:
    """Why a quantile of n pooled samples gets no interval, or None when it can have one."""
    name = _statistic_name(statistic, q)
    try:
        need = min_samples_for_quantile(q, confidence)
    except ValueError:
        return f"no distribution-free interval exists for {name}"
    if n >= need:
        return None
    return (f"too few {sample_name} for {name} ({n} pooled; {need} needed for a "
            f"{confidence * 100:g}% interval)")


# --------------------------------------------------------------------------- hierarchical bootstrap

def _hierarchical_by_resampling(rounds: list[np.ndarray], statistic: Statistic, resamples: int,
                                rng: np.random.Generator) -> np.ndarray:
    """Naive reference: draw R rounds with replacement, resample each, pool, apply statistic."""
    r = len(rounds)
    out = np.empty(resamples, dtype=np.float64)
    for b in range(resamples):
        drawn = rng.integers(0, r, size=r)
        pooled = np.concatenate([rounds[j][rng.integers(0, rounds[j].size, size=rounds[j].size)]
                                 for j in drawn])
        out[b] = statistic(pooled)
    return out


def _hierarchical_mean(rounds: list[np.ndarray], resamples: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Resampled pooled means: per round, all the within-round resample sums it is drawn for.

    Rounds below NORMAL_MEAN_MIN samples are resampled exactly (int32 index draws, in chunks of
    bounded memory). For larger rounds the within-round resample sum is drawn from the normal law
    with its exact bootstrap mean and variance (m mean_j and m var_j, var_j with ddof=0): exact
    resampling would cost m draws per slot (4e8 for 10 rounds x 20k x 2000 resamples, seconds),
    while the skewness this neglects, that of a mean of m draws, is skew_j / sqrt(m): 0.14 for a
    lognormal of sigma 1 at m = 2000. The between-round stage stays exact.
    """
    r = len(rounds)
    sizes = np.array([a.size for a in rounds], dtype=np.int64)
    drawn = rng.integers(0, r, size=(resamples, r))
    sums = np.empty((resamples, r), dtype=np.float64)
    for j, a in enumerate(rounds):
        where = np.nonzero(drawn == j)
        count, m = where[0].size, a.size
        if m >= NORMAL_MEAN_MIN:
            sums[where] = rng.normal(m * a.mean(), math.sqrt(m * a.var()), size=count)
            continue
        out = np.empty(count, dtype=np.float64)
        rows = max(1, _CHUNK_ELEMENTS // m)
        for start in range(0, count, rows):
            stop = min(count, start + rows)
            out[start:stop] = a[rng.integers(0, m, size=(stop - start, m), dtype=np.int32)].sum(axis=1)
        sums[where] = out
    return sums.sum(axis=1) / sizes[drawn].sum(axis=1)


def _hierarchical_quantile(rounds: list[np.ndarray], q: float, resamples: int,
                           rng: np.random.Generator) -> np.ndarray:
    """Resampled pooled q-quantiles (numpy's linear method), without materialising a resample.

    Shapes: B resamples, R rounds (one slot per drawn round), N pooled atoms. keys holds, for
    every atom, round * (N + 1) + its position in the global sort, sorted; so the number of
    round-j atoms among global positions [0, x) is searchsorted(keys, j (N+1) + x) - offset_j.
    """
    r = len(rounds)
    sizes = np.array([a.size for a in rounds], dtype=np.int64)
    flat = np.concatenate(rounds)
    n = flat.size
    order = np.argsort(flat, kind="stable")
    values = flat[order]
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64)
    round_of = np.repeat(np.arange(r, dtype=np.int64), sizes)
    keys = np.sort(round_of * (n + 1) + position)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))

    drawn = rng.integers(0, r, size=(resamples, r))               # (B, R) round of each slot
    key_base = drawn * (n + 1)
    key_off = offsets[drawn]
    counts = sizes[drawn]                                         # (B, R) draws per slot
    total = counts.sum(axis=1)                                    # (B,) pooled resample size
    h = (total - 1) * (q / 100.0)
    rank_lo = np.floor(h).astype(np.int64)
    frac = h - rank_lo
    rank_hi = np.minimum(rank_lo + 1, total - 1)

    def below(x: np.ndarray) -> np.ndarray:                       # (B,) positions -> (B, R) counts
        return np.searchsorted(keys, key_base + x[:, None]) - key_off

    # Two descents, for the lower and the upper rank. A state is the node [lo, hi) of global
    # positions, the per-slot counts inside it (c, (B, R)), the per-slot atoms below lo and hi
    # (pre_lo, pre_hi, (B, R)) and the rank still sought inside the node.
    states = [dict(lo=np.zeros(resamples, np.int64), hi=np.full(resamples, n, np.int64),
                   c=counts.copy(), pre_lo=np.zeros((resamples, r), np.int64),
                   pre_hi=sizes[drawn], rank=rank) for rank in (rank_lo, rank_hi)]
    for _ in range(max(1, math.ceil(math.log2(n)))):
        lower, upper = states
        apart = (lower["lo"] != upper["lo"]) | (lower["hi"] != upper["hi"])
        for st in states:
            st["mid"] = (st["lo"] + st["hi"]) // 2                # a node of one atom: mid = lo
            st["pre_mid"] = below(st["mid"])
            atoms = st["pre_hi"] - st["pre_lo"]
            st["p"] = np.divide(st["pre_mid"] - st["pre_lo"], atoms, out=np.zeros(atoms.shape),
                                where=atoms > 0)
        lower["left"] = rng.binomial(lower["c"], lower["p"])
        upper["left"] = lower["left"].copy()                     # shared node: shared draws
        if np.any(apart):
            upper["left"][apart] = rng.binomial(upper["c"][apart], upper["p"][apart])
        for st in states:
            in_left = st["left"].sum(axis=1)
            go_left = st["rank"] < in_left
            gl = go_left[:, None]
            st["c"] = np.where(gl, st["left"], st["c"] - st["left"])
            st["pre_lo"] = np.where(gl, st["pre_lo"], st["pre_mid"])
            st["pre_hi"] = np.where(gl, st["pre_mid"], st["pre_hi"])
            st["rank"] = np.where(go_left, st["rank"], st["rank"] - in_left)
            st["lo"] = np.where(go_left, st["lo"], st["mid"])
            st["hi"] = np.where(go_left, st["mid"], st["hi"])
    low, high = values[states[0]["lo"]], values[states[1]["lo"]]
    return low + frac * (high - low)


def _hierarchical_distribution(rounds: list[np.ndarray], statistic: Statistic, resamples: int,
                               rng: np.random.Generator) -> np.ndarray:
    q = quantile_of(statistic)
    if q is not None:
        return _hierarchical_quantile(rounds, q, resamples, rng)
    if statistic is mean or statistic is np.mean:
        return _hierarchical_mean(rounds, resamples, rng)
    return _hierarchical_by_resampling(rounds, statistic, resamples, rng)


# --------------------------------------------------------------------------- estimates

def estimate_rounds(rounds: Rounds, unit: str, statistic: Statistic = median, *,
                    confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
                    sample_name: str = "samples") -> Estimate:
    """statistic of the pooled samples of every round, with an interval that respects rounds.

    value, n and cv are those of the pooled samples; rounds counts the non-empty rounds and
    round_cv is the coefficient of variation of the per-round statistic (None below two rounds).
    The interval:
    - no samples: value None (problem "no samples"); one sample in all: no interval ("single
      sample");
    - one round, a quantile statistic (median, quantile(q)): the order-statistic interval
      ("order statistics"); any other statistic: the percentile bootstrap ("bootstrap");
    - two rounds or more: the hull of the hierarchical percentile bootstrap, the t-interval of the
      per-round statistics' mean ("hierarchical bootstrap and t over R rounds": the bootstrap alone
      covers too little with few rounds) and, for quantiles, the pooled order-statistic interval.
    A quantile whose pooled count is below min_samples_for_quantile gets no interval, and problem
    says so, e.g. "too few requests for p99 (80 pooled; 368 needed for a 95% interval)"
    (sample_name names the samples in that text). Deterministic for a seed; raises ValueError on
    NaN/inf samples (filter failed measurements first).
    """
    _check_bootstrap_args(confidence, resamples)
    arrays = [a for a in _round_arrays(rounds, "estimate_rounds") if a is not None and a.size]
    if not arrays:
        return Estimate(value=None, low=None, high=None, n=0, cv=None, unit=unit, rounds=0,
                        problem="no samples")
    pooled = np.concatenate(arrays)
    r = len(arrays)
    per_round = [float(statistic(a)) for a in arrays]
    base = dict(value=float(statistic(pooled)), n=int(pooled.size),
                cv=coefficient_of_variation(pooled), unit=unit, rounds=r,
                round_cv=coefficient_of_variation(per_round) if r >= 2 else None)
    if pooled.size == 1:
        return Estimate(low=None, high=None, method="single sample", **base)
    q = quantile_of(statistic)
    if q is not None:
        problem = _too_few(statistic, q, pooled.size, confidence, sample_name)
        if problem is not None:
            return Estimate(low=None, high=None, problem=problem, **base)
        os_low, os_high = quantile_interval(pooled, q, confidence)
        if r == 1:
            return Estimate(low=os_low, high=os_high, method="order statistics", **base)
    elif r == 1:
        low, high = bootstrap_ci(pooled, statistic, confidence, resamples, seed)
        return Estimate(low=low, high=high, method="bootstrap", **base)
    rng = np.random.default_rng(seed)
    low, high = _interval(_hierarchical_distribution(arrays, statistic, resamples, rng), confidence)
    if q is not None:
        low, high = min(low, os_low), max(high, os_high)
    # A percentile bootstrap over 2-6 rounds is too narrow (the reason paired_delta uses t): with one
    # value per round it covered 84% in simulation. The t-interval of the per-round statistics'
    # mean bounds it from outside, so that the hull holds its confidence with few rounds too.
    t_low, t_high = _t_interval(per_round, confidence)
    low, high = min(low, t_low), max(high, t_high)
    return Estimate(low=low, high=high, method=f"hierarchical bootstrap and t over {r} rounds", **base)


def _t_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """mean ± t(n-1) · s / sqrt(n) of `values` (n >= 2)."""
    a = np.asarray(values, dtype=np.float64)
    m, sd = float(a.mean()), float(a.std(ddof=1))
    half = student_t_quantile((1 + confidence) / 2, a.size - 1) * sd / math.sqrt(a.size)
    return m - half, m + half


def _welch_interval(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float]:
    """Welch's interval of mean(y) - mean(x) (both of size >= 2; df by Welch-Satterthwaite)."""
    vx, vy = float(x.var(ddof=1)) / x.size, float(y.var(ddof=1)) / y.size
    d = float(y.mean() - x.mean())
    if vx + vy == 0.0:
        return d, d
    df = (vx + vy) ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1))
    half = student_t_quantile((1 + confidence) / 2, max(1.0, df)) * math.sqrt(vx + vy)
    return d - half, d + half


# --------------------------------------------------------------------------- process-to-process spread

RESOLVE_PCT = 15.0
"""The difference a run's rounds should be able to tell from its process-to-process spread; a row whose rounds
cannot says so (analysis.py), and no delta that small is called significant there."""


@dataclass(frozen=True)
class Spread:
    """How far one fresh process's figure strays, on a row of a run: the standard deviation of the log per-round
    statistics left once each variant's own level and each round's drift (shared by the variants measured in that
    round) are taken out: the residual of the two-way additive model over every variant and round measured
    together (the randomized block design: Box, Hunter & Hunter, "Statistics for Experimenters", 2005, ch. 4).
    A paired ratio of two variants then strays by sqrt(2) sd a round. Pooled over every variant of the row it
    has (V - 1)(R - 1) degrees of freedom where one pair's own has R - 1: three variants over three rounds give
    it 4 where a pair has 2, so a pair that happened to agree closely in its few rounds no longer reads as more
    certain than the run's processes are."""

    sd: float          # of log per-round statistics, after variant and round effects
    df: int            # (variants - 1)(rounds - 1)
    variants: int
    rounds: int

    @property
    def pct(self) -> float:
        """sd as the percent change a process strays by."""
        return math.expm1(self.sd) * 100.0

    def half_width(self, rounds: int, confidence: float = 0.95) -> float:
        """The t half-width, in log units, of a paired ratio's mean over `rounds` rounds at this spread."""
        return _spread_half(self.sd, self.df, rounds, confidence)

    def smallest_resolved_pct(self, rounds: int, confidence: float = 0.95) -> float:
        """The smallest change, in %, that `rounds` rounds tell from this spread (the interval's half-width)."""
        return math.expm1(self.half_width(rounds, confidence)) * 100.0

    def rounds_to_resolve(self, pct: float = RESOLVE_PCT, confidence: float = 0.95, most: int = 1000) -> int | None:
        """The fewest rounds that would tell a `pct` change from this spread, with as many variants as now (None
        beyond `most`)."""
        return next((r for r in range(2, most + 1)
                     if math.expm1(_spread_half(self.sd, (self.variants - 1) * (r - 1), r, confidence)) * 100.0 <= pct),
                    None)


def _spread_half(sd: float, df: int, rounds: int, confidence: float) -> float:
    return student_t_quantile((1.0 + confidence) / 2.0, df) * math.sqrt(2.0) * sd / math.sqrt(rounds)


def process_spread(per_round: dict[str, dict[int, float]]) -> Spread | None:
    """The Spread of a row from each variant's per-round statistic ({variant: {round: value}}), over the rounds in
    which every variant with two usable rounds or more measured a positive, finite value; None below two such
    variants or two such rounds, or when nothing strays (every residual 0)."""
    usable = {v: {r: x for r, x in rs.items() if x is not None and math.isfinite(x) and x > 0.0}
              for v, rs in per_round.items()}
    usable = {v: rs for v, rs in usable.items() if len(rs) >= 2}
    if len(usable) < 2:
        return None
    common = sorted(set.intersection(*(set(rs) for rs in usable.values())))
    if len(common) < 2:
        return None
    y = np.log(np.array([[rs[r] for r in common] for rs in usable.values()], dtype=np.float64))
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    v, r = y.shape
    df = (v - 1) * (r - 1)
    sd = math.sqrt(float((resid ** 2).sum()) / df)
    return Spread(sd, df, v, r) if sd > 0.0 else None


# --------------------------------------------------------------------------- paired deltas

def paired_delta(base_rounds: Rounds, var_rounds: Rounds, statistic: Statistic = median, *,
                 confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
                 sample_name: str = "samples", spread: Spread | None = None) -> Delta:
    """Percent change of the variant over the baseline from per-round paired ratios.

    base_rounds[i] and var_rounds[i] were measured in the same round i; a round where either side
    is None, empty or absent (lists of unequal length) is skipped, and so is one whose baseline
    statistic (or variant statistic, whose log is needed) is not finite and positive.
    With P >= 2 paired rounds, r_i = statistic(var_i) / statistic(base_i) and, on log r_i, mean m
    and sample sd s: the interval m +- t_{P-1,(1+confidence)/2} s / sqrt(P), so pct =
    (e^m - 1) 100 (the geometric mean of the round ratios) and low/high likewise; significant when
    the interval excludes 0; method "paired over P rounds". Why a t-interval and not a percentile
    bootstrap over rounds: with few rounds its distribution of the mean is too narrow (spread
    sqrt((P-1)/P) of the standard error, and no t tail), so identical variants are called
    different far more often than 1 - confidence (simulated at 95%: 25% of the time with 3
    rounds, 17% with 5, 11% with 8), which is the false positive this module exists to fix. The
    t-interval is exact for normal log ratios and robust for moderate departures.
    Two widenings keep it from being more confident than the data (issue 50: identical variants read as 15-75%
    apart, significantly):
    - `spread` (process_spread over every variant of the row): the interval is at least the one the run's
      process-to-process spread gives P rounds, t with its pooled degrees of freedom, so that a pair whose few
      rounds happened to agree reads no surer than the run's processes are (method "... and the run's process
      spread" when that is the wider);
    - the mean: the interval also covers one from dealing each round's samples out to the two sides again at
      random (_permuted_mean_interval), which carries the weight a few outlying samples have in a mean, as a
      percentile's order-statistic bounds do; a slow request or three cannot make a mean's delta significant
      while every percentile beside it is not.
    With one paired round: each side's samples bootstrapped independently, as relative_delta
    does, for the interval only: significant is None (method ONE_ROUND_METHOD: it cannot tell drift
    from a difference); with a single sample on a side, pct only (method "single sample").
    Quantile statistics whose pooled count on either side is below min_samples_for_quantile get
    the pct of the pooled statistics, no interval, significant None and a problem string.
    No usable round: everything None, with a problem string. Raises ValueError on NaN/inf.
    """
    _check_bootstrap_args(confidence, resamples)
    base = _round_arrays(base_rounds, "paired_delta baseline")
    var = _round_arrays(var_rounds, "paired_delta variant")
    both = [(b, v) for b, v in zip_longest(base, var)
            if b is not None and v is not None and b.size and v.size]
    if not both:
        return Delta(pct=None, low=None, high=None, significant=None,
                     problem="no round measured both variants")
    pairs = []
    for b, v in both:
        sb, sv = float(statistic(b)), float(statistic(v))
        if math.isfinite(sb) and math.isfinite(sv) and sb > 0.0 and sv > 0.0:
            pairs.append((b, v, sb, sv))
    if not pairs:
        return Delta(pct=None, low=None, high=None, significant=None,
                     problem="no round has a positive statistic on both sides")
    p = len(pairs)
    q = quantile_of(statistic)
    if q is not None:
        pooled_b = np.concatenate([b for b, _, _, _ in pairs])
        pooled_v = np.concatenate([v for _, v, _, _ in pairs])
        problem = _too_few(statistic, q, min(pooled_b.size, pooled_v.size), confidence,
                           sample_name)
        if problem is not None:
            return Delta(pct=_pct(float(statistic(pooled_b)), float(statistic(pooled_v))),
                         low=None, high=None, significant=None, method="pooled", rounds=p,
                         problem=problem)
    if p == 1:
        b, v, sb, sv = pairs[0]
        if b.size < 2 or v.size < 2:
            return Delta(pct=_pct(sb, sv), low=None, high=None, significant=None,
                         method="single sample", rounds=1)
        # The interval is kept for what it says about the requests, but no verdict: between variants
        # measured one after another it cannot tell drift from a difference (an A/A suite here was
        # called different in 48-64% of its timing comparisons with one round).
        d = relative_delta(b, v, statistic, confidence, resamples, seed)
        return replace(d, significant=None, method=ONE_ROUND_METHOD, rounds=1)
    logs = np.log(np.array([sv / sb for _, _, sb, sv in pairs]))
    m, s = float(np.mean(logs)), float(np.std(logs, ddof=1))
    half = student_t_quantile((1.0 + confidence) / 2.0, p - 1) * s / math.sqrt(p)
    method = f"paired over {p} rounds"
    if spread is not None and spread.half_width(p, confidence) > half:
        half, method = spread.half_width(p, confidence), method + " and the run's process spread"
    low, high = m - half, m + half
    tail = _permuted_mean_interval(pairs, confidence, resamples, seed) \
        if statistic is mean or statistic is np.mean else None
    if tail is not None and (tail[0] < low or tail[1] > high):
        low, high, method = min(low, tail[0]), max(high, tail[1]), method + " and its samples dealt within rounds"
    pct, low, high = (math.expm1(x) * 100.0 for x in (m, low, high))
    return Delta(pct=pct, low=low, high=high, significant=bool(low > 0.0 or high < 0.0), method=method, rounds=p)


def _permuted_mean_interval(pairs: list[tuple], confidence: float, resamples: int,
                            seed: int) -> tuple[float, float] | None:
    """An interval of log(pooled mean of the variant / pooled mean of the baseline) that carries the weight of the
    samples far out in the tail: the observed log ratio less the central `confidence` share of its distribution
    when, within each round, the two sides' samples are dealt out again at random (a permutation test within
    rounds, Fisher 1935; made an interval by the shift model). Three slow requests that all fell to one side are
    then what chance deals one time in eight, not a difference, as a tail percentile's order-statistic bounds
    already say. None when a round holds fewer than two samples on a side (one value a round: nothing to deal).
    The deal is drawn both ways round (each side first) and pooled, so that swapping the sides mirrors it."""
    if any(b.size < 2 or v.size < 2 for b, v, _, _ in pairs):
        return None
    n_b, n_v = sum(b.size for b, _, _, _ in pairs), sum(v.size for _, v, _, _ in pairs)
    observed = math.log((sum(float(v.sum()) for _, v, _, _ in pairs) / n_v)
                        / (sum(float(b.sum()) for b, _, _, _ in pairs) / n_b))

    def dealt(first: int) -> np.ndarray:   # log(mean of the rest / mean of the first) over the deals
        rng = np.random.default_rng(seed)
        head, tail = np.zeros(resamples), np.zeros(resamples)
        n_head = 0
        for b, v, _, _ in pairs:
            pooled = np.sort(np.concatenate([b, v]))
            k, n = (b.size if first == 0 else v.size), pooled.size
            n_head += k
            if n >= NORMAL_MEAN_MIN:   # a sum dealt without replacement: its exact mean and variance, normal
                total, sd = float(pooled.sum()), math.sqrt(k * pooled.var() * (n - k) / (n - 1))
                drawn = rng.normal(k * pooled.mean(), sd, size=resamples)
                head, tail = head + drawn, tail + (total - drawn)
                continue
            rows = max(1, _CHUNK_ELEMENTS // n)    # deals held at once: memory bounded
            for start in range(0, resamples, rows):
                stop = min(resamples, start + rows)
                deal = rng.permuted(np.tile(pooled, (stop - start, 1)), axis=1)
                head[start:stop] += deal[:, :k].sum(axis=1)
                tail[start:stop] += deal[:, k:].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log((tail / (n_b + n_v - n_head)) / (head / n_head))

    null = np.concatenate([dealt(0), -dealt(1)])
    null = null[np.isfinite(null)]
    if null.size == 0:
        return None
    q_low, q_high = _interval(null, confidence)
    return observed - q_high, observed - q_low


# --------------------------------------------------------------------------- unpaired deltas

def unpaired_delta(a_rounds: Rounds, b_rounds: Rounds, statistic: Statistic = median, *,
                   confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
                   sample_name: str = "samples") -> Delta:
    """Percent change of statistic(pooled B) over statistic(pooled A), A and B measured apart.

    Two runs made at different times share no round, so nothing cancels: each side's statistic
    is resampled on its own by the hierarchical bootstrap (rounds with replacement, then samples
    within each drawn round: estimate_rounds's), and the interval of log(B* / A*) is widened to
    cover Welch's t-interval on the difference of the mean log per-round statistics (Welch 1947),
    for the reason estimate_rounds takes the hull with its t-interval: a percentile bootstrap over
    2-6 rounds is too narrow. pct, low and high are (ratio - 1) x 100; significant when the
    interval excludes 0; method "unpaired over Ra and Rb rounds"; rounds is min(Ra, Rb).
    No interval (significant None, pct alone, a problem saying why) below two non-empty rounds on
    a side (round-to-round noise unknown), for a quantile with too few pooled samples on a side,
    or when a statistic is not positive (a ratio needs both sides positive). No samples on a side:
    everything None. Raises ValueError on NaN/inf (filter them first).
    """
    _check_bootstrap_args(confidence, resamples)
    a = [x for x in _round_arrays(a_rounds, "unpaired_delta A") if x is not None and x.size]
    b = [x for x in _round_arrays(b_rounds, "unpaired_delta B") if x is not None and x.size]
    if not a or not b:
        return Delta(pct=None, low=None, high=None, significant=None,
                     problem=f"no samples in {'A' if not a else 'B'}")
    pooled_a, pooled_b = np.concatenate(a), np.concatenate(b)
    sa, sb = float(statistic(pooled_a)), float(statistic(pooled_b))
    ra, rb = len(a), len(b)
    plain = dict(pct=_pct(sa, sb), low=None, high=None, significant=None, rounds=min(ra, rb))
    if min(ra, rb) < 2:
        side = " and ".join(s for s, r in (("A", ra), ("B", rb)) if r < 2)
        return Delta(**plain, method="pooled", problem=f"one round in {side}: its round-to-round noise is unknown")
    q = quantile_of(statistic)
    if q is not None:
        problem = _too_few(statistic, q, min(pooled_a.size, pooled_b.size), confidence, sample_name)
        if problem is not None:
            return Delta(**plain, method="pooled", problem=problem)
    per_a = np.array([statistic(x) for x in a], dtype=np.float64)
    per_b = np.array([statistic(x) for x in b], dtype=np.float64)
    if not (sa > 0.0 and sb > 0.0 and np.all(per_a > 0.0) and np.all(per_b > 0.0)):
        return Delta(**plain, method="pooled", problem="a statistic is not positive, so no ratio interval")
    rng = np.random.default_rng(seed)
    boot_a = _hierarchical_distribution(a, statistic, resamples, rng)
    boot_b = _hierarchical_distribution(b, statistic, resamples, rng)
    keep = (boot_a > 0.0) & (boot_b > 0.0)
    low, high = _welch_interval(np.log(per_a), np.log(per_b), confidence)
    if np.any(keep):
        b_low, b_high = _interval(np.log(boot_b[keep] / boot_a[keep]), confidence)
        low, high = min(low, b_low), max(high, b_high)
    low_pct, high_pct = math.expm1(low) * 100.0, math.expm1(high) * 100.0
    return Delta(pct=_pct(sa, sb), low=low_pct, high=high_pct, significant=bool(low_pct > 0.0 or high_pct < 0.0),
                 method=f"unpaired over {ra} and {rb} rounds", rounds=min(ra, rb))
