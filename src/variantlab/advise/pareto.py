"""The Pareto front over several metrics, with intervals.

A variant dominates another when it is distinguishably better on at least one dimension (their
intervals do not overlap, or exact figures differ) and distinguishably worse on none. So two
variants whose latencies overlap are not told apart on latency, and a noisy run leaves more
variants on the front rather than pushing one off on a guess. A dimension a variant lacks (not
measured) is left out of its comparisons.
"""
from __future__ import annotations

from dataclasses import dataclass

Interval = tuple[float, float | None, float | None]   # value, low, high
EXACT_TOLERANCE = 0.005   # exact figures (sizes, KLD) closer than 0.5% are not told apart: a header's bytes


@dataclass(frozen=True)
class Dimension:
    key: str               # the comparison row
    label: str
    lower_is_better: bool
    family: str = ""

    def to_json(self) -> dict:
        return {"key": self.key, "label": self.label, "lower_is_better": self.lower_is_better, "family": self.family}


def _bounds(x: Interval) -> tuple[float, float]:
    value, low, high = x
    return (low, high) if low is not None and high is not None else (value, value)


def better(a: Interval, b: Interval, lower_is_better: bool) -> bool:
    """True when a is better than b beyond both intervals (exact figures: by more than EXACT_TOLERANCE)."""
    if a[1] is None and b[1] is None:
        gap = (b[0] - a[0]) if lower_is_better else (a[0] - b[0])
        return gap > EXACT_TOLERANCE * max(abs(a[0]), abs(b[0]))
    a_lo, a_hi = _bounds(a)
    b_lo, b_hi = _bounds(b)
    return a_hi < b_lo if lower_is_better else a_lo > b_hi


def dominates(a: dict[str, Interval], b: dict[str, Interval], dims: list[Dimension]) -> bool:
    shared = [d for d in dims if d.key in a and d.key in b]
    if any(better(b[d.key], a[d.key], d.lower_is_better) for d in shared):
        return False
    return any(better(a[d.key], b[d.key], d.lower_is_better) for d in shared)


def pareto_front(points: dict[str, dict[str, Interval]], dims: list[Dimension]) -> list[str]:
    """The names no other point dominates, in the order given."""
    return [n for n, p in points.items() if not any(dominates(q, p, dims) for m, q in points.items() if m != n)]


def dominated_by(points: dict[str, dict[str, Interval]], dims: list[Dimension]) -> dict[str, list[str]]:
    """name → the points that dominate it (empty for the front)."""
    return {n: [m for m, q in points.items() if m != n and dominates(q, p, dims)] for n, p in points.items()}
