"""Statistics for benchmark samples: summaries, bootstrap intervals, estimates and deltas.

Owns the records every metric is reported in (Estimate, Delta, with their JSON form) and the
statistics of one set of samples. Samples measured in interleaved rounds (fresh processes) are
summarised by measure/rounds.py (hierarchical bootstrap, paired round deltas), which builds on
this module; distribution-free quantile intervals live in measure/order_stats.py.

docs/metrics.md, "Statistics": report medians with bootstrap confidence intervals, call a difference
real only when the intervals say so, and warn when a measurement is unstable (coefficient of
variation over 10%). Everything here is a pure function of its arguments; randomness comes only
from a seeded numpy Generator, so the same samples and seed always give the same interval.

The bootstrap is the percentile bootstrap (Efron & Tibshirani, "An Introduction to the
Bootstrap", ch. 13). For the median it does not materialise the resamples: the median of a
resample is an order statistic of the sorted sample, and the k-th order statistic of n uniform
draws is Beta(k, n + 1 - k) distributed, so each resampled median costs two Beta draws instead
of a partition of n values (10k samples x 2000 resamples in about a millisecond). The generic
path (any statistic) resamples indices and is the reference the fast path is tested against.

Comparisons follow pyperf: significance first, then a minimum effect, then an adjective
("1.23x faster", "not significant").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

UNSTABLE_CV = 0.10
"""Coefficient of variation above which a measurement is flagged unstable (docs/metrics.md, Statistics)."""

Statistic = Callable[[Sequence[float]], float]

_CHUNK_ELEMENTS = 1 << 22  # resampled values held at once on the generic path (32 MiB of float64)


# --------------------------------------------------------------------------- basic summaries

def _as_sample(xs: Sequence[float], what: str = "sample") -> np.ndarray:
    """A 1-D float64 copy of xs; raises ValueError on NaN/inf or on more than one dimension."""
    a = np.asarray(xs, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise ValueError(f"{what} contains NaN or inf; drop failed measurements before summarising")
    return a


def _nonempty(xs: Sequence[float], what: str) -> np.ndarray:
    a = _as_sample(xs)
    if a.size == 0:
        raise ValueError(f"{what} of an empty sample is undefined")
    return a


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (q in 0..100), linear interpolation between order statistics.

    Same as numpy's default method: position (n - 1) * q / 100 in the sorted sample.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    return float(np.percentile(_nonempty(xs, "percentile"), q))


def median(xs: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count)."""
    return float(np.median(_nonempty(xs, "median")))


def mean(xs: Sequence[float]) -> float:
    """The arithmetic mean."""
    return float(np.mean(_nonempty(xs, "mean")))


def stdev(xs: Sequence[float]) -> float:
    """The sample standard deviation (ddof=1); 0.0 for fewer than two values."""
    a = _as_sample(xs)
    return float(np.std(a, ddof=1)) if a.size >= 2 else 0.0


def coefficient_of_variation(xs: Sequence[float]) -> float | None:
    """stdev / |mean|; None for fewer than two values or a zero mean."""
    a = _as_sample(xs)
    if a.size < 2:
        return None
    m = float(np.mean(a))
    return None if m == 0.0 else float(np.std(a, ddof=1)) / abs(m)


# --------------------------------------------------------------------------- bootstrap

def _bootstrap_quantile(sample: np.ndarray, q: float, resamples: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Resampled q-quantiles (numpy's linear method) without materialising any resample.

    A resample draws n indices uniformly from 0..n-1; index = floor(n * U) with U uniform on
    [0, 1), and floor is monotone, so the a-th smallest index is floor(n * U_(a)) where U_(a), the
    a-th order statistic of n uniforms, is Beta(a, n + 1 - a). Given U_(a), the other n - a
    uniforms above it are uniform on (U_(a), 1), so U_(a+1) = U_(a) + (1 - U_(a)) * Beta(1, n - a).
    The quantile interpolates between order statistics a and a + 1 (1-based), as numpy does.
    """
    xs = np.sort(sample)
    n = xs.size
    h = (n - 1) * q / 100.0
    lo = int(math.floor(h))
    frac = h - lo
    a = lo + 1                                    # 1-based rank of the lower order statistic
    u_a = rng.beta(a, n + 1 - a, size=resamples)
    lower = xs[np.minimum((u_a * n).astype(np.int64), n - 1)]
    if frac == 0.0 or a == n:
        return lower
    u_next = u_a + (1.0 - u_a) * rng.beta(1, n - a, size=resamples)
    upper = xs[np.minimum((u_next * n).astype(np.int64), n - 1)]
    return lower + frac * (upper - lower)


def _bootstrap_by_resampling(sample: np.ndarray, statistic: Statistic, resamples: int,
                             rng: np.random.Generator) -> np.ndarray:
    """Resampled statistics by drawing index resamples (in chunks that bound memory)."""
    n = sample.size
    rows = max(1, _CHUNK_ELEMENTS // n)
    index_dtype = np.int32 if n < 2**31 else np.int64  # int32 draws are several times faster
    out = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        boot = sample[rng.integers(0, n, size=(stop - start, n), dtype=index_dtype)]
        if statistic is mean or statistic is np.mean:
            out[start:stop] = boot.mean(axis=1)
        else:
            out[start:stop] = [statistic(row) for row in boot]
    return out


def quantile_of(statistic: Statistic) -> float | None:
    """The percentile (0..100) a statistic computes, or None when it is not a quantile.

    `median` (this module's or numpy's) is 50; a `quantile(q)` statistic is q.
    """
    if statistic is median or statistic is np.median:
        return 50.0
    q = getattr(statistic, "quantile", None)
    return None if q is None else float(q)


def quantile(q: float) -> Statistic:
    """The q-th percentile as a statistic; bootstraps take the fast order-statistic path for it."""
    def statistic(xs: Sequence[float]) -> float:
        return percentile(xs, q)
    statistic.quantile = q  # type: ignore[attr-defined]
    statistic.__name__ = f"p{q:g}"
    return statistic


def _bootstrap_distribution(sample: np.ndarray, statistic: Statistic, resamples: int,
                            rng: np.random.Generator) -> np.ndarray:
    q = quantile_of(statistic)
    if q is not None:
        return _bootstrap_quantile(sample, q, resamples, rng)
    return _bootstrap_by_resampling(sample, statistic, resamples, rng)


def _check_bootstrap_args(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")


def _interval(distribution: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(distribution, [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_ci(samples: Sequence[float], statistic: Statistic = median,
                 confidence: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval (low, high) of statistic(samples).

    Deterministic for a seed. `median` and `mean` (this module's or numpy's) are vectorised;
    any other statistic is called once per resample on a 1-D array.
    """
    _check_bootstrap_args(confidence, resamples)
    a = _nonempty(samples, "bootstrap_ci")
    rng = np.random.default_rng(seed)
    return _interval(_bootstrap_distribution(a, statistic, resamples, rng), confidence)


# --------------------------------------------------------------------------- estimates

@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval, sample count and spread.

    value is None for an empty sample. low and high are None when no interval can be given (one
    sample, or too few samples for a distribution-free interval of a tail quantile; problem says
    which). cv is the coefficient of variation of the raw (pooled) samples, None below two samples
    or for a zero mean. rounds is how many rounds (fresh processes) the samples came from, and
    round_cv the coefficient of variation of the per-round statistic across them (None below two
    rounds): a large round_cv with a small cv means the machine drifted between rounds. method
    says how the interval was made: "order statistics", "hierarchical bootstrap (5 rounds)",
    "bootstrap", "single sample" ("" in records written before methods were recorded).
    """

    value: float | None
    low: float | None
    high: float | None
    n: int
    cv: float | None
    unit: str
    rounds: int = 1
    round_cv: float | None = None
    problem: str | None = None
    method: str = ""

    @property
    def unstable(self) -> bool:
        """True when the measurement varies by more than UNSTABLE_CV (docs/metrics.md: warn over 10%): from round
        to round when there are rounds (per-request samples differ by prompt by design), else across
        the samples of its one round."""
        cv = self.round_cv if self.rounds >= 2 else self.cv
        return cv is not None and cv > UNSTABLE_CV

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Estimate":
        """Inverse of to_json; accepts records written before rounds/round_cv/problem/method."""
        return cls(value=d["value"], low=d["low"], high=d["high"], n=d["n"], cv=d["cv"],
                   unit=d["unit"], rounds=d.get("rounds", 1), round_cv=d.get("round_cv"),
                   problem=d.get("problem"), method=d.get("method", ""))


def estimate(samples: Sequence[float], unit: str, statistic: Statistic = median,
             confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Estimate:
    """statistic(samples) with a percentile-bootstrap interval when there are two samples or more.

    One set of samples, treated as independent; for samples from several rounds use
    rounds.estimate_rounds, which also gives tail quantiles a distribution-free interval.
    """
    a = _as_sample(samples)
    if a.size == 0:
        return Estimate(value=None, low=None, high=None, n=0, cv=None, unit=unit)
    value = float(statistic(a))
    if a.size < 2:
        return Estimate(value=value, low=None, high=None, n=1, cv=None, unit=unit,
                        method="single sample")
    low, high = bootstrap_ci(a, statistic, confidence, resamples, seed)
    return Estimate(value=value, low=low, high=high, n=int(a.size),
                    cv=coefficient_of_variation(a), unit=unit, method="bootstrap")


# --------------------------------------------------------------------------- deltas

@dataclass(frozen=True)
class Delta:
    """(variant - baseline) / baseline in %, with its confidence interval.

    pct is None when it cannot be computed (a baseline of 0, no samples). significant is True
    when the interval excludes 0, False when it does not, and None when there is no interval to
    tell (one sample on a side, too few samples for a tail quantile, or an exact fact, which has
    no verdict). method says how the interval was made ("paired over 5 rounds", "bootstrap",
    "exact", "single sample", ...); rounds is the number of paired rounds behind it (0 when the
    samples carried no round structure); problem says why no interval (or no pct) is given.
    """

    pct: float | None
    low: float | None
    high: float | None
    significant: bool | None
    method: str = ""
    rounds: int = 0
    problem: str | None = None

    def label(self) -> str:
        """E.g. "+111.0% [+98.2, +124.5]"; " (n.s.)" is appended when not significant.

        When problem is set and there is no interval, only the pct is shown ("+5.0%"): a missing
        interval is no evidence of "no difference".
        """
        if self.pct is None:
            return "n/a"
        text = f"{self.pct:+.1f}%"
        has_interval = self.low is not None and self.high is not None
        if has_interval:
            text += f" [{self.low:+.1f}, {self.high:+.1f}]"
        if self.significant is False and (has_interval or self.problem is None):
            text += " (n.s.)"
        return text

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Delta":
        """Inverse of to_json; accepts records written before method/rounds/problem."""
        return cls(pct=d["pct"], low=d["low"], high=d["high"], significant=d["significant"],
                   method=d.get("method", ""), rounds=d.get("rounds", 0),
                   problem=d.get("problem"))


def _pct(baseline: float, variant: float) -> float | None:
    return None if baseline == 0.0 else (variant - baseline) / baseline * 100.0


def relative_delta(baseline: Sequence[float], variant: Sequence[float],
                   statistic: Statistic = median, confidence: float = 0.95,
                   resamples: int = 2000, seed: int = 0) -> Delta:
    """Percent change of statistic(variant) over statistic(baseline), with a bootstrap interval.

    Both samples are resampled independently (one seeded generator, baseline first); the interval
    is the percentile interval of the resampled percent changes, and the change is significant
    when the interval excludes 0. Resamples whose baseline statistic is 0 are dropped.
    With one sample on a side only pct is given (significant None); with none on a side
    (every run failed) nothing is (all fields None).
    """
    _check_bootstrap_args(confidence, resamples)
    b = _as_sample(baseline, "relative_delta baseline")
    v = _as_sample(variant, "relative_delta variant")
    if b.size == 0 or v.size == 0:
        return Delta(pct=None, low=None, high=None, significant=None)
    pct = _pct(float(statistic(b)), float(statistic(v)))
    if pct is None or b.size < 2 or v.size < 2:
        return Delta(pct=pct, low=None, high=None, significant=None,
                     method="single sample" if pct is not None else "")
    rng = np.random.default_rng(seed)
    boot_b = _bootstrap_distribution(b, statistic, resamples, rng)
    boot_v = _bootstrap_distribution(v, statistic, resamples, rng)
    keep = boot_b != 0.0
    if not np.any(keep):
        return Delta(pct=pct, low=None, high=None, significant=None)
    boot_pct = (boot_v[keep] - boot_b[keep]) / boot_b[keep] * 100.0
    low, high = _interval(boot_pct, confidence)
    return Delta(pct=pct, low=low, high=high, significant=bool(low > 0.0 or high < 0.0),
                 method="bootstrap")


def exact_delta(baseline_value: float, variant_value: float) -> Delta:
    """Percent change between two deterministic facts (model size, accuracy on a fixed set).

    No interval and no verdict: the values are not samples, so there is nothing to be
    significant about (significant is None; the pct itself is the answer). pct is None when the
    baseline is 0. method is "exact".
    """
    return Delta(pct=_pct(float(baseline_value), float(variant_value)), low=None, high=None,
                 significant=None, method="exact")


def compare(baseline_samples: Sequence[float], variant_samples: Sequence[float],
            min_effect_pct: float = 1.0, lower_is_better: bool = True,
            statistic: Statistic = median, confidence: float = 0.95, resamples: int = 2000,
            seed: int = 0) -> str:
    """A pyperf-style verdict on the variant: "1.23x faster", "2.10x slower" or "not significant".

    Significance first (the bootstrap interval of the delta excludes 0; undecidable with fewer
    than two samples on a side counts as not significant), then a minimum effect (|delta| of at
    least min_effect_pct %), then the ratio. With lower_is_better (latencies) the ratio is
    baseline / variant; otherwise (rates such as tokens/s) variant / baseline. "not comparable"
    when a side is empty or a statistic is 0, so that no ratio exists.
    """
    delta = relative_delta(baseline_samples, variant_samples, statistic, confidence, resamples,
                           seed)
    if delta.pct is None:
        return "not comparable"
    if not delta.significant or abs(delta.pct) < min_effect_pct:
        return "not significant"
    base = float(statistic(_as_sample(baseline_samples)))
    var = float(statistic(_as_sample(variant_samples)))
    num, den = (base, var) if lower_is_better else (var, base)
    if num == 0.0 or den == 0.0:
        return "not comparable"
    ratio = num / den
    return f"{ratio:.2f}x faster" if ratio > 1.0 else f"{1.0 / ratio:.2f}x slower"
