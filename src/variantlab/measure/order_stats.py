"""Distribution-free quantile intervals from order statistics, and the distributions they need.

Owns: the binomial CDF (exact, in log space), the ranks of the order statistics that bracket a
population quantile, the sample size a quantile needs before any such interval exists, and the
Student-t quantile used by the paired round delta (measure/rounds.py). Pure functions; numpy and
the standard library only at run time (scipy is the reference in the tests, never imported here).

Order statistics (Hahn & Meeker, "Statistical Intervals", 1991, sec. 5.2; Conover, "Practical
Nonparametric Statistics", 3rd ed., sec. 3.2): for n independent draws from any continuous
distribution, the number B of draws at or below the population q-th percentile x_p (p = q/100)
is Binomial(n, p). The interval [X_(l), X_(u)] between the l-th and u-th smallest draws misses
x_p below when X_(l) > x_p, i.e. B <= l - 1, and above when X_(u) < x_p, i.e. B >= u. So

    P(X_(l) <= x_p <= X_(u)) >= P(l <= B <= u - 1) = F(u - 1) - F(l - 1),   F the Binomial CDF,

whatever the distribution (equality for continuous ones; ties only make it larger). Unlike the
percentile bootstrap this does not undercover in the tails: with 32 draws a bootstrap interval for
p99 can reach no further than the sample maximum, which lies below p99 with probability 0.99^32.

Student-t quantile: closed forms for 1 and 2 degrees of freedom; otherwise Newton's method on the
t tail probability, written with the regularized incomplete beta function (continued fraction by
modified Lentz, Numerical Recipes 3rd ed. sec. 6.4), kept inside a shrinking bracket so that it
always converges.
"""
from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

import numpy as np

_WINDOW_SDS = 40.0
"""Half-width, in standard deviations, of the binomial support summed by binom_cdf. Outside
mean +- 40 sd (+ 50 terms) the binomial mass is below 1e-100 for every n and p (Chernoff bound;
the worst case is the Poisson-like regime n p ~ 1), so the windowed sums are exact to double
precision while costing O(sqrt(n)) terms, not O(n): n = 10^6 takes about 40k log-gamma calls."""


# --------------------------------------------------------------------------- binomial

@lru_cache(maxsize=16)  # a window holds up to ~40k floats twice; keep the cache small
def _binom_window(n: int, p: float) -> tuple[int, np.ndarray, np.ndarray]:
    """(k0, cdf, sf) over the window k0 .. k0 + len - 1 of Binomial(n, p)'s support.

    cdf[i] = P(B <= k0 + i) and sf[i] = P(B >= k0 + i), both summed from their own tail so that
    neither loses the small tail to cancellation. Each term is exp(log C(n, k) + k log p +
    (n - k) log(1 - p)), with log C(n, k) from math.lgamma.
    """
    sd = math.sqrt(n * p * (1.0 - p))
    k0 = max(0, int(math.floor(n * p - _WINDOW_SDS * sd)) - 50)
    k1 = min(n, int(math.ceil(n * p + _WINDOW_SDS * sd)) + 50)
    ks = range(k0, k1 + 1)
    lg_n1 = math.lgamma(n + 1)
    log_p, log_q = math.log(p), math.log1p(-p)
    log_pmf = np.array([lg_n1 - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p
                        + (n - k) * log_q for k in ks])
    pmf = np.exp(log_pmf)
    cdf = np.minimum(np.cumsum(pmf), 1.0)
    sf = np.minimum(np.cumsum(pmf[::-1])[::-1], 1.0)
    return k0, cdf, sf


def _check_binom(n: int, p: float) -> None:
    if n < 0 or int(n) != n:
        raise ValueError(f"n must be a non-negative integer, got {n}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be within 0..1, got {p}")


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(B <= k) for B ~ Binomial(n, p), exact to double precision for n up to 10^6 and beyond.

    Log-space terms (math.lgamma) summed over the window of the support that carries any mass
    (_WINDOW_SDS), so the cost grows like sqrt(n).
    """
    _check_binom(n, p)
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p == 0.0 or p == 1.0:
        return 1.0 if p == 0.0 else 0.0
    k0, cdf, _ = _binom_window(int(n), float(p))
    if k < k0:
        return 0.0
    return float(cdf[min(k - k0, cdf.size - 1)])


def binom_sf(k: int, n: int, p: float) -> float:
    """P(B >= k) for B ~ Binomial(n, p), summed from the upper tail (no cancellation)."""
    _check_binom(n, p)
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p == 0.0 or p == 1.0:
        return 0.0 if p == 0.0 else 1.0
    k0, _, sf = _binom_window(int(n), float(p))
    if k < k0:
        return 1.0
    i = k - k0
    return float(sf[i]) if i < sf.size else 0.0


# --------------------------------------------------------------------------- quantile intervals

def _check_quantile_args(q: float, confidence: float) -> None:
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")


@lru_cache(maxsize=1024)
def _ranks(n: int, q: float, confidence: float) -> tuple[int, int] | None:
    p = q / 100.0
    tail = (1.0 - confidence) / 2.0
    if n < 1 or p <= 0.0 or p >= 1.0:
        return None
    # Lower rank: the largest l >= 1 with P(B <= l - 1) <= tail. F is increasing, so when even
    # l = 1 (P(B = 0) = (1 - p)^n) misses, no interval exists.
    if binom_cdf(0, n, p) > tail or binom_sf(n, n, p) > tail:
        return None
    k0, cdf, sf = _binom_window(n, p)
    # cdf[i] = F(k0 + i); l - 1 = the largest k with F(k) <= tail (k = -1 when none: F(-1) = 0).
    below = np.flatnonzero(cdf <= tail)
    lower_k = int(k0 + below[-1]) if below.size else max(k0 - 1, -1)
    # sf[i] = P(B >= k0 + i); u = the smallest k with P(B >= k) <= tail.
    above = np.flatnonzero(sf <= tail)
    u = int(k0 + above[0]) if above.size else n  # sf of the window's top is ~0: never empty
    return lower_k + 1, min(u, n)


def order_statistic_ranks(n: int, q: float, confidence: float = 0.95) -> tuple[int, int] | None:
    """1-based ranks (l, u) with P(X_(l) <= x_q <= X_(u)) >= confidence for any continuous law.

    x_q is the population q-th percentile (q in 0..100) and X_(i) the i-th smallest of n
    independent draws. Equal-tailed: each tail, P(B <= l - 1) and P(B >= u) with
    B ~ Binomial(n, q/100), is at most (1 - confidence)/2; and as short as possible under that
    (l as large and u as small as the tails allow). None when no such ranks exist, i.e. when
    n < min_samples_for_quantile(q, confidence), and always for q = 0 or 100 (a population's
    minimum or maximum has no distribution-free interval).
    """
    _check_quantile_args(q, confidence)
    if n < 0 or int(n) != n:
        raise ValueError(f"n must be a non-negative integer, got {n}")
    return _ranks(int(n), float(q), float(confidence))


def quantile_interval(xs, q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """[X_(l), X_(u)] for order_statistic_ranks(len(xs), q, confidence); None when n is too small.

    Raises ValueError on NaN/inf or a non-1-D sample, like the rest of measure/stats.
    """
    a = np.asarray(xs, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"sample must be one-dimensional, got shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise ValueError("sample contains NaN or inf; drop failed measurements before summarising")
    ranks = order_statistic_ranks(a.size, q, confidence)
    if ranks is None:
        return None
    l, u = ranks
    lo, hi = np.partition(a, (l - 1, u - 1))[[l - 1, u - 1]]
    return float(lo), float(hi)


def min_samples_for_quantile(q: float, confidence: float = 0.95) -> int:
    """The smallest n for which order_statistic_ranks(n, q, confidence) exists.

    The widest interval [X_(1), X_(n)] misses below with probability (1 - p)^n and above with
    p^n (p = q/100), so n is the least integer with max(p, 1 - p)^n <= (1 - confidence)/2:
    6 for the median, 36 for p90, 72 for p95, 368 for p99, 3688 for p99.9 at 95%.
    Raises ValueError for q = 0 or 100, which no n admits.
    """
    _check_quantile_args(q, confidence)
    p = q / 100.0
    if p <= 0.0 or p >= 1.0:
        raise ValueError(f"no sample size gives a distribution-free interval for p{q:g}")
    tail = (1.0 - confidence) / 2.0
    worst = max(p, 1.0 - p)
    n = max(1, math.ceil(math.log(tail) / math.log(worst)))
    while n > 1 and worst ** (n - 1) <= tail:  # guard the rounding of the logarithms
        n -= 1
    while worst ** n > tail:
        n += 1
    return n


# --------------------------------------------------------------------------- Student t

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; NR sec. 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def _ibeta(x: float, y: float, a: float, b: float) -> float:
    """I_x(a, b) given x and y = 1 - x, each passed exactly (neither is formed as 1 - other)."""
    if x <= 0.0 or y <= 0.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log(y))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, y) / b


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and x in [0, 1]."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be within 0..1, got {x}")
    return _ibeta(x, 1.0 - x, a, b)


def _t_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0: I_{df/(df+t^2)}(df/2, 1/2) / 2; accurate when it is small."""
    d = df + t * t
    return 0.5 * _ibeta(df / d, t * t / d, df / 2.0, 0.5)


def _t_central(t: float, df: float) -> float:
    """P(|T| < t) for t >= 0: I_{t^2/(df+t^2)}(1/2, df/2); accurate when it is small (t near 0)."""
    d = df + t * t
    return _ibeta(t * t / d, df / d, 0.5, df / 2.0)


def _t_log_pdf_const(df: float) -> float:
    """log of the t density's normalising constant, Gamma((df+1)/2) / (sqrt(df pi) Gamma(df/2))."""
    return math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)


def student_t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df >= 1 degrees of freedom (df may be fractional).

    Tested against scipy.stats.t.ppf to 1e-9 relative for df 1..200 and p in 0.5..0.9999999.
    df = 1 (Cauchy) and df = 2 are closed forms. Otherwise Newton's method from the normal
    quantile, bisecting whenever a step leaves the bracket, on whichever probability is small at
    the root, so that no cancellation limits the accuracy: the tail P(T > t) = 1 - p for p >= 3/4,
    the central P(|T| < t) = 2p - 1 below (where t is near 0).
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be strictly between 0 and 1, got {p}")
    if not df >= 1.0 or math.isinf(df):
        raise ValueError(f"df must be a finite number >= 1, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    if df == 1.0:
        return math.tan(math.pi * (p - 0.5))
    if df == 2.0:
        return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))
    # residual(t) increases with t, and its derivative is sign * pdf(t) * scale.
    if p >= 0.75:
        residual = lambda t: (1.0 - p) - _t_tail(t, df)        # noqa: E731
        scale = 1.0
    else:
        residual = lambda t: _t_central(t, df) - (2.0 * p - 1.0)  # noqa: E731
        scale = 2.0
    const = _t_log_pdf_const(df)
    z = NormalDist().inv_cdf(p)
    lo, hi = 0.0, max(1.0, z)
    while residual(hi) < 0.0:              # grow the bracket until it holds the root
        lo, hi = hi, hi * 2.0
    t = min(max(z, lo), hi)
    for _ in range(400):
        f = residual(t)
        if f < 0.0:
            lo = t
        elif f > 0.0:
            hi = t
        else:
            return t
        slope = scale * math.exp(const - (df + 1.0) / 2.0 * math.log1p(t * t / df))
        nxt = t - f / slope if slope > 0.0 else math.inf
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - t) <= 1e-15 * max(1e-300, abs(nxt)) or hi - lo <= 1e-15 * hi:
            return nxt
        t = nxt
    return t
