"""Attributing the difference between two variants' phase times to operator categories. Pure functions.

Input: the profiling tracker's outputs (measure/trackers/profile.py), one per fresh worker and
round, for variant A and variant B. Per workload and phase, each variant's time per token is its
fastest plain (unprofiled) run; each category's share of it is the self time of its operators in
its fastest profiled run, per token; framework overhead is what is left: plain time − the
operators' time. Categories therefore sum to the plain time, and the difference B − A splits
into per-category differences that sum to the whole.

How that can be wrong, and what is done about it:
- the profiler slows each operator a little (a few tenths of a µs a call here): operators' time is
  over-counted by that much and framework overhead under-counted; its total cost (profiled − plain)
  is reported beside every phase, never attributed;
- when the profiled operators alone take longer than the plain phase, overhead would go negative: it
  is clamped at zero and the phase carries a note;
- a difference within the noise has no cause to find: `NEAR_ZERO` of A's time or less says so;
- a shared machine disturbs single runs many-fold: the fastest of several runs (over rounds in
  fresh workers) is taken, and how far the median run was from it is kept (`disturbance`).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from .categories import CATEGORIES, OTHER, OVERHEAD

ACCOUNT_FOR = 0.90     # the largest categories are listed until they account for this share
NEAR_ZERO = 0.02       # a difference under 2% of A's time is called too small to attribute


@dataclass(frozen=True)
class OpStat:
    seconds: float       # per token
    calls: float         # per token


@dataclass(frozen=True)
class PhaseTimes:
    """One variant's phase on one workload, per token, over its rounds."""

    tokens: int
    plain: float                          # s per token, the fastest plain run
    profiled: float                       # s per token, the fastest profiled run (whose ops are below)
    ops: dict[tuple[str, str], OpStat]    # (op name, category) → per token
    runs: int                             # plain runs behind `plain`
    disturbance: float = 0.0              # the median plain run over the fastest, − 1

    @property
    def covered(self) -> float:
        return sum(o.seconds for o in self.ops.values())

    @property
    def overhead(self) -> float:
        return max(self.plain - self.covered, 0.0)

    @property
    def clamped(self) -> bool:
        return self.covered > self.plain

    def by_category(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for (_, category), o in self.ops.items():
            out[category] += o.seconds
        out[OVERHEAD] += self.overhead      # beside the operators charged to it (our decode step's glue, guards)
        return dict(out)

    @property
    def total(self) -> float:
        """What the categories sum to: the plain time, or the operators' time when that is larger."""
        return max(self.plain, self.covered)


def phase_times(phases: Sequence) -> PhaseTimes:
    """One variant's phase of one workload, from its PhaseProfiles of every round: the fastest plain run,
    and the operators of the fastest profiled run (on a shared machine a run can be disturbed many-fold
    by other processes; the fastest is the least disturbed, as timeit takes the minimum)."""
    if not phases:
        raise ValueError("no profiles to aggregate")
    tokens = phases[0].tokens
    if tokens < 1 or any(p.tokens != tokens for p in phases):
        raise ValueError(f"rounds profiled different token counts: {[p.tokens for p in phases]}")
    runs = [s / tokens for p in phases for s in p.plain_s if math.isfinite(s) and s > 0]
    profiled = [r for p in phases for r in p.profiled if math.isfinite(r.seconds) and r.seconds > 0]
    if not runs or not profiled:
        raise ValueError("no plain or no profiled run finished with a positive, finite time")
    best = min(profiled, key=lambda r: r.seconds)
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for op in best.ops:
        slot = sums[(op.name, op.category)]
        slot[0] += op.self_s
        slot[1] += op.calls
    fastest = min(runs)
    return PhaseTimes(tokens, fastest, best.seconds / tokens,
                      {k: OpStat(s / tokens, c / tokens) for k, (s, c) in sums.items()}, len(runs),
                      statistics.median(runs) / fastest - 1)


@dataclass(frozen=True)
class CategoryRow:
    category: str
    a: float                 # s per token
    b: float
    diff: float              # b − a
    share: float | None      # of the whole difference; None when the difference is near zero
    top_op: str | None = None          # the op that moved most within the category
    top_op_calls: tuple[float, float] | None = None   # its calls per token in A and B


@dataclass(frozen=True)
class OpRow:
    name: str
    category: str
    a: OpStat
    b: OpStat

    @property
    def diff(self) -> float:
        return self.b.seconds - self.a.seconds


@dataclass(frozen=True)
class PhaseAttribution:
    scenario: str
    phase: str
    a: PhaseTimes
    b: PhaseTimes
    rows: tuple[CategoryRow, ...]     # largest contribution to the difference first
    ops: tuple[OpRow, ...]            # largest |difference| first
    notes: tuple[str, ...] = field(default=())

    @property
    def diff(self) -> float:
        return self.b.total - self.a.total

    @property
    def near_zero(self) -> bool:
        return abs(self.diff) <= NEAR_ZERO * self.a.total

    def accounted(self, target: float = ACCOUNT_FOR) -> tuple[int, float]:
        """(k, share): the k largest categories account for `share` of the difference, the first k to reach target."""
        total = 0.0
        for k, row in enumerate(self.rows, 1):
            total += row.share or 0.0
            if total >= target:
                return k, total
        return len(self.rows), total


def attribute(scenario: str, phase: str, a: PhaseTimes, b: PhaseTimes) -> PhaseAttribution:
    """Split B − A (per token) into categories and operators."""
    ca, cb = a.by_category(), b.by_category()
    diff = b.total - a.total
    near_zero = abs(diff) <= NEAR_ZERO * a.total
    keys = set(a.ops) | set(b.ops)
    zero = OpStat(0.0, 0.0)
    ops = sorted((OpRow(n, c, a.ops.get((n, c), zero), b.ops.get((n, c), zero)) for n, c in keys),
                 key=lambda r: -abs(r.diff))
    rows = []
    for category in CATEGORIES:
        va, vb = ca.get(category, 0.0), cb.get(category, 0.0)
        if va == 0.0 and vb == 0.0:
            continue
        mine = [r for r in ops if r.category == category]
        top = max(mine, key=lambda r: r.diff * (1 if diff >= 0 else -1), default=None)
        rows.append(CategoryRow(category, va, vb, vb - va, None if near_zero else (vb - va) / diff,
                                top.name if top else None, (top.a.calls, top.b.calls) if top else None))
    sign = 1 if diff >= 0 else -1
    rows.sort(key=lambda r: -sign * r.diff)
    notes = []
    for name, t in (("A", a), ("B", b)):
        if t.clamped:
            notes.append(f"{name}'s operators took {t.covered / t.plain - 1:.0%} longer under the profiler than its "
                         "whole plain phase: framework overhead is shown as 0 and its total as the operators' time")
    if any(r.category == OTHER for r in rows):
        notes.append("some operators matched no category (explain/categories.py): they are counted as 'other'")
    if near_zero:
        notes.append(f"the difference is within {NEAR_ZERO:.0%} of A's time: too small to attribute")
    return PhaseAttribution(scenario, phase, a, b, tuple(rows), tuple(ops), tuple(notes))
