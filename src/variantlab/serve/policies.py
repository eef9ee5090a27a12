"""Batch policies: which variant admits how many waiting requests, decided every engine iteration.

- `single`: one request at a time, in one variant: the baseline every other policy is measured against.
- `static`: a fixed batch. When the variant is idle it waits until `batch_size` requests are queued or
  the oldest has waited `max_wait_s`, then runs them together to the end; nobody joins a running batch.
- `adaptive`: continuous batching that keeps a TPOT SLO and switches variant with load. From each
  variant's decode-step time measured at each batch size on this machine, and its prefill cost (a fixed
  part a call and a part a token; serve/calibrate.py), at the current demand (running + waiting requests)
  and the requests' recent shape (prompt and output tokens) it admits into the variant that finishes the
  most requests a second among batch sizes whose step time stays within the SLO; weight-only int4 wins
  while the batch is small and bf16 or w8a8 past the crossover, wherever this machine puts it (on the
  reference model the crossover is in prefill, on a 115M Llama in the decode step). A measured feedback
  loop then holds the SLO: when the variant's recent step times pass it, its batch cap shrinks by a
  quarter, and when they stay under 80% of it with requests waiting, it grows by one. Newcomers' prefill is
  budgeted per iteration to what the SLO leaves after the running rows' decode step, at the measured
  prefill cost per token (chunked prefill, as Sarathi-Serve does), so a burst of arrivals delays the
  newcomers' first token rather than every running request's next one — until the oldest waiting request
  has used half its TTFT SLO: then the waiting requests are prefilled whole, in one group, as a static
  batch would be (under load, a budget held for TPOT alone starved admission: 3.8 req/s of goodput at
  80 req/s against static's 44). Under load it holds newcomers briefly, up to HOLD of the TTFT SLO, so
  that they are prefilled as one group rather than each alone: a prefill call's fixed cost dominates a
  small model's (`_holds`); past capacity the engine sheds newcomers by its TTFT SLO (serve/shedding.py).
  A switch needs
  the new variant to win by 15% for PATIENCE decisions in a row over at least PATIENCE_S (no flapping
  between variants whose measured steps differ by noise), and is returned with
  its reason (the engine logs and counts it). The lane switched away from drains: its running
  requests finish where they started.
Variants that fail the suite's accuracy floor are never given to a policy (serve/variants.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

PATIENCE = 4            # decisions in a row a new variant must win before the policy switches to it …
PATIENCE_S = 0.5        # … spanning at least this long (decisions come every few ms)
MARGIN = 1.15           # … by at least this much throughput (calibration varies ~10% run to run)
HEADROOM = 0.8          # the step-time budget is this share of the TPOT SLO (prefill chunks run between steps)
FEEDBACK_STEPS = 16     # decode steps the feedback loop judges at a time, each set taken under the current cap
MIN_PREFILL_TOKENS = 32 # an iteration's prefill budget never goes below this: newcomers always advance
URGENT = 0.5            # a waiting request past this share of the TTFT SLO lifts the prefill budget
HOLD = 0.25             # newcomers may be held for grouping up to this share of the TTFT SLO …
HOLD_LOAD = 0.2         # … when prefilling each arrival alone would spend this share of the engine on fixed costs


@dataclass(frozen=True)
class LaneView:
    name: str
    running: int
    prefilling: int
    max_rows: int
    recent_step_s: tuple[float, ...] = ()
    steps: int = 0                 # decode steps run so far
    recent_interval_s: tuple[float, ...] = ()   # between consecutive steps: what a running row waits for a token

    @property
    def busy(self) -> bool:
        return self.running + self.prefilling > 0


@dataclass(frozen=True)
class LoadView:
    now: float
    waiting: int                 # requests queued
    unpinned: int                # … of which the policy may place (the rest named a variant)
    oldest_wait_s: float
    lanes: dict[str, LaneView]
    arrival_rate: float = 0.0    # requests/s arriving lately (the engine's recent submits)
    waiting_tokens: int = 0      # prompt tokens of the unpinned waiting requests
    prompt_tokens: float | None = None   # mean prompt tokens a recent request was prefilled with (padding included)
    output_tokens: float | None = None   # mean output tokens of the recently finished requests

    @property
    def running(self) -> int:
        return sum(v.running + v.prefilling for v in self.lanes.values())


@dataclass(frozen=True)
class Decision:
    admit: dict[str, int]        # lane → how many unpinned waiting requests it takes now
    switch: dict | None = None   # {"from", "to", "reason", "demand"} when the admitting variant changed
    prefill_tokens: dict[str, int] = field(default_factory=dict)   # lane → prefill tokens this iteration at most


class Policy(Protocol):
    name: str

    def decide(self, view: LoadView) -> Decision: ...

    def deadline(self, view: LoadView) -> float | None:
        """When to look again with no new arrival (a static batch's wait), on the engine's clock; None: never."""

    def admits_pinned(self, lane: LaneView) -> bool:
        """Whether a request that names this variant may join it now."""


@dataclass
class SinglePolicy:
    variant: str
    name: str = "single"

    def decide(self, view: LoadView) -> Decision:
        return Decision({self.variant: 0 if view.running else 1})

    def deadline(self, view: LoadView) -> float | None:
        return None

    def admits_pinned(self, lane: LaneView) -> bool:
        return not lane.busy


@dataclass
class StaticPolicy:
    variant: str
    batch_size: int = 8
    max_wait_s: float = 0.05
    name: str = "static"

    def decide(self, view: LoadView) -> Decision:
        lane = view.lanes[self.variant]
        ready = view.unpinned >= self.batch_size or view.oldest_wait_s >= self.max_wait_s
        return Decision({self.variant: self.batch_size if ready and not lane.busy else 0})

    def deadline(self, view: LoadView) -> float | None:
        return view.now + max(0.0, self.max_wait_s - view.oldest_wait_s)

    def admits_pinned(self, lane: LaneView) -> bool:
        return not lane.busy


@dataclass(frozen=True)
class StepCost:
    """A variant's decode-step seconds at measured batch sizes; between them, linear interpolation."""

    variant: str
    seconds: dict[int, float]
    prefill_s_per_token: float | None = None    # prefill time per prompt token …
    prefill_fixed_s: float = 0.0                # … on top of a fixed time per prefill call

    def at(self, batch: int) -> float:
        sizes = sorted(self.seconds)
        if batch <= sizes[0]:
            return self.seconds[sizes[0]]
        if batch >= sizes[-1]:   # past the last measured size: grow in proportion
            return self.seconds[sizes[-1]] * batch / sizes[-1]
        hi = next(s for s in sizes if s >= batch)
        lo = max(s for s in sizes if s <= batch)
        if hi == lo:
            return self.seconds[lo]
        w = (batch - lo) / (hi - lo)
        return self.seconds[lo] * (1 - w) + self.seconds[hi] * w

    def cap(self, budget_s: float | None, max_rows: int) -> int:
        """The largest batch whose step fits the budget (at least 1)."""
        if budget_s is None:
            return max_rows
        fits = [b for b in range(1, max_rows + 1) if self.at(b) <= budget_s]
        return max(fits) if fits else 1

    def to_json(self) -> dict:
        return {"variant": self.variant, "seconds": {str(k): v for k, v in sorted(self.seconds.items())},
                "prefill_s_per_token": self.prefill_s_per_token, "prefill_fixed_s": self.prefill_fixed_s}


@dataclass
class AdaptivePolicy:
    costs: dict[str, StepCost]               # every variant it may use → its measured step times
    tpot_slo_s: float | None = None
    ttft_slo_s: float | None = None          # when the oldest waiting request nears it, admission comes first
    max_rows: int = 32
    name: str = "adaptive"
    current: str | None = None
    caps: dict[str, int] = field(default_factory=dict)
    _streak: tuple[str | None, int, float] = (None, 0, 0.0)   # (challenger, decisions in a row, since when)
    _adjusted_at: dict[str, int] = field(default_factory=dict)   # lane → its step count at the last cap change
    prefill_scale: dict[str, float] = field(default_factory=dict)  # lane → share of the computed prefill budget
    _scaled_at: dict[str, int] = field(default_factory=dict)
    shape: tuple[float | None, float | None] = (None, None)   # (prompt tokens as prefilled, output tokens) a request
    planned_caps: dict[str, int] = field(default_factory=dict)  # the caps from calibration: what variants rank by

    def __post_init__(self) -> None:
        if not self.costs:
            raise ValueError("the adaptive policy needs at least one variant")
        budget = None if self.tpot_slo_s is None else self.tpot_slo_s * HEADROOM
        for name, cost in self.costs.items():
            self.caps.setdefault(name, cost.cap(budget, self.max_rows))
        self.planned_caps = dict(self.caps)
        if self.current is None:
            self.current = max(self.costs, key=lambda n: self.throughput(n, 1))

    def keep(self, tpot_slo_s: float | None, ttft_slo_s: float | None) -> None:
        """Keep these SLOs from now on (a server scenario learns them after the engine is built): the TTFT
        SLO as given, and a TPOT SLO (when one is given) with every variant's cap planned again for it."""
        self.ttft_slo_s = ttft_slo_s
        if tpot_slo_s is not None:
            self.tpot_slo_s = tpot_slo_s
            self.caps = {n: c.cap(tpot_slo_s * HEADROOM, self.max_rows) for n, c in self.costs.items()}
            self.planned_caps = dict(self.caps)

    def throughput(self, name: str, demand: int) -> float:
        """Requests/s `name` would finish at this demand, its batch b = the demand within its planned cap
        (from calibration: the feedback loop's cuts answer this machine's load, which would slow any variant
        alike, so ranking by them would let one transient cut switch variant), from its measured costs and
        the requests seen lately (`shape`: P prompt tokens a request as prefilled, padding included; O
        output tokens a request). Each iteration steps b rows and, in steady state, admits
        g = b / O newcomers in min(1, g) prefill calls, so T = step(b) + min(1, g) × fixed + g × P × per
        token, and the rate is g / T. On the reference model weight-only int4's prefill call costs less
        than bf16's (2.8 against 5.0 ms) and its tokens more (23 against 11 µs), so the two are even one
        request at a time and bf16 wins a busy lane: a crossover in prefill, not in the decode step.
        Before any request is seen (or with no prefill costs measured) the rate is decode tokens/s,
        b / step(b)."""
        b = max(1, min(demand, self.planned_caps[name]))
        cost = self.costs[name]
        prompt, output = self.shape
        if prompt is None or output is None or cost.prefill_s_per_token is None:
            return b / cost.at(b)
        g = b / max(1.0, output)
        return g / (cost.at(b) + min(1.0, g) * cost.prefill_fixed_s + g * prompt * cost.prefill_s_per_token)

    def decide(self, view: LoadView) -> Decision:
        self._feedback(view)
        if view.prompt_tokens is not None and view.output_tokens is not None:
            self.shape = (view.prompt_tokens, view.output_tokens)
        demand = max(1, view.running + view.unpinned)
        best = max(self.costs, key=lambda n: (self.throughput(n, demand), n == self.current))
        switch = None
        if best != self.current and self.throughput(best, demand) >= MARGIN * self.throughput(self.current, demand):
            challenger, streak, since = self._streak
            self._streak = (best, streak + 1, since) if challenger == best else (best, 1, view.now)
            if self._streak[1] >= PATIENCE and view.now - self._streak[2] >= PATIENCE_S:
                switch = self._switch(best, demand)
        else:
            self._streak = (None, 0, 0.0)
        lane = view.lanes[self.current]
        room = self.caps[self.current] - lane.running - lane.prefilling
        budget = self.prefill_budget(view)
        if room > 0 and self._holds(view, lane, room, budget.get(self.current)):
            room = 0
        return Decision({self.current: max(0, room)}, switch, budget)

    def _holds(self, view: LoadView, lane: LaneView, room: int, tokens: int | None) -> bool:
        """Whether to hold the waiting newcomers a little longer so that they are prefilled as one group.
        A prefill call costs a fixed part whatever its size (5 ms of the reference model's 6 ms for one
        90-token prompt, measured), so under load, prefilling each arrival alone as soon as it comes spends
        the engine on fixed costs (at 120 req/s: 61% of the engine thread in prefill, groups of one) while
        each of those calls also delays the running rows' next token. So, while rows run and arrivals would
        spend HOLD_LOAD or more of the engine on fixed costs alone (arrival rate × fixed cost), newcomers
        wait until their group fills the iteration's prefill budget or the lane's room, or the oldest has
        waited HOLD of the TTFT SLO. An idle lane, a light load or no TTFT SLO: admitted at once."""
        if self.ttft_slo_s is None or not lane.running or not view.unpinned:
            return False
        if view.arrival_rate * self.costs[self.current].prefill_fixed_s < HOLD_LOAD:
            return False
        if view.unpinned >= room or (tokens is not None and view.waiting_tokens >= tokens):
            return False
        return view.oldest_wait_s < HOLD * self.ttft_slo_s

    def prefill_budget(self, view: LoadView) -> dict[str, int]:
        """Per lane, the prefill tokens one iteration may run so that its running rows' next token still
        lands within the SLO: (HEADROOM × SLO − the decode steps of every busy lane − a prefill call's fixed
        cost) ÷ its cost per token (Sarathi-style), each measured. Never below the tokens whose cost equals
        the fixed cost (smaller chunks would spend more on overhead than on prompts), nor MIN_PREFILL_TOKENS."""
        if self.tpot_slo_s is None:
            return {}
        if self.ttft_slo_s is not None and view.oldest_wait_s > URGENT * self.ttft_slo_s:
            return {}    # newcomers about to miss their TTFT: prefill them whole, in one group (running rows wait)
        stepping = sum(self._step_s(n, v) for n, v in view.lanes.items() if v.running and n in self.costs)
        left = HEADROOM * self.tpot_slo_s - stepping
        out = {}
        for name, cost in self.costs.items():
            if cost.prefill_s_per_token:
                scale = self._interval_feedback(view.lanes[name]) if name in view.lanes else 1.0
                floor = max(MIN_PREFILL_TOKENS, int(cost.prefill_fixed_s / cost.prefill_s_per_token))
                out[name] = max(floor, int(scale * (left - cost.prefill_fixed_s) / cost.prefill_s_per_token))
        return out

    def _interval_feedback(self, lane: LaneView) -> float:
        """The share of the computed prefill budget a lane gets, held to what running rows really wait: the
        p90 of the last FEEDBACK_STEPS intervals between its steps past the SLO cuts it by 30%; under 70% of
        the SLO raises it by 20% (up to the whole budget). Judged once per FEEDBACK_STEPS steps."""
        scale = self.prefill_scale.get(lane.name, 1.0)
        recent = sorted(lane.recent_interval_s[-FEEDBACK_STEPS:])
        if len(recent) < FEEDBACK_STEPS or lane.steps - self._scaled_at.get(lane.name, 0) < FEEDBACK_STEPS:
            return scale
        p90 = recent[math.ceil(0.9 * len(recent)) - 1]
        if p90 > HEADROOM * self.tpot_slo_s:
            scale = max(0.05, scale * 0.7)
        elif p90 < 0.6 * self.tpot_slo_s:
            scale = min(1.0, scale * 1.2)
        self.prefill_scale[lane.name], self._scaled_at[lane.name] = scale, lane.steps
        return scale

    def _step_s(self, name: str, lane: LaneView) -> float:
        """A lane's decode step now: the median of its recent steps when it has them, else its calibration."""
        recent = sorted(lane.recent_step_s[-FEEDBACK_STEPS:])
        return recent[len(recent) // 2] if recent else self.costs[name].at(lane.running)

    def _switch(self, best: str, demand: int) -> dict:
        old = self.current
        b_old, b_new = (max(1, min(demand, self.planned_caps[n])) for n in (old, best))
        unit = "tok/s" if self.shape[0] is None or self.shape[1] is None else "req/s"
        seen = "" if unit == "tok/s" else (f" (requests of {self.shape[0]:.0f} prompt tokens as prefilled, "
                                           f"{self.shape[1]:.1f} output tokens)")
        reason = (f"demand {demand}: {best} at batch {b_new} gives {self.throughput(best, demand):,.0f} {unit} "
                  f"({1e3 * self.costs[best].at(b_new):.2f} ms a step), {old} at batch {b_old} "
                  f"{self.throughput(old, demand):,.0f} {unit} ({1e3 * self.costs[old].at(b_old):.2f} ms a step)"
                  + seen)
        self.current, self._streak = best, (None, 0, 0.0)
        return {"from": old, "to": best, "reason": reason, "demand": demand}

    def _feedback(self, view: LoadView) -> None:
        """Hold the SLO on what the steps really take: shrink the cap by a quarter when the recent p90 step
        passes it, grow by one when it stays under HEADROOM of it and requests wait."""
        if self.tpot_slo_s is None:
            return
        lane = view.lanes[self.current]
        if lane.steps - self._adjusted_at.get(lane.name, 0) < FEEDBACK_STEPS:   # judge steps taken under the cap
            return
        recent = sorted(lane.recent_step_s[-FEEDBACK_STEPS:])
        if len(recent) < FEEDBACK_STEPS:
            return
        p90 = recent[math.ceil(0.9 * len(recent)) - 1]
        cap = self.caps[self.current]
        if p90 > self.tpot_slo_s:
            self.caps[self.current] = max(1, math.floor(cap * 0.75))
        elif p90 < HEADROOM * self.tpot_slo_s and view.waiting and lane.running >= cap:
            self.caps[self.current] = min(self.max_rows, cap + 1)
        else:
            return
        self._adjusted_at[lane.name] = lane.steps

    def deadline(self, view: LoadView) -> float | None:
        return None

    def admits_pinned(self, lane: LaneView) -> bool:
        return lane.running + lane.prefilling < self.caps.get(lane.name, lane.max_rows)


POLICIES = ("single", "static", "adaptive")
