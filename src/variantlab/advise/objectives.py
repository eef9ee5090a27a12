"""What a requirement or an objective reads: named metrics mapped to rows of a comparison.

A name is what a user writes (`objective: throughput`, `e2el_p95`); a `MetricRef` says which row it
is (the latency scenario's `e2el_p95`, the throughput scenario's `output_throughput`, `facts.model_size`),
whether lower is better, and which family of the Pareto front it belongs to. Which scenario is "the
latency scenario" is the suite's choice (`requirements.scenario`), by default its first single-stream
or server scenario; the throughput scenario is by default its first offline one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

LATENCY = re.compile(r"^(e2el|ttft|tpot|itl)_(p50|p90|p95|p99|mean)$")


def _types(role: str) -> tuple[str, ...]:
    """The scenario types that declare `role` (measure/scenarios: each scenario says what it measures)."""
    from ..measure.scenarios import SCENARIOS
    return tuple(kind for kind, cls in SCENARIOS.items() if cls.role == role)


LATENCY_SCENARIO_TYPES = _types("latency")          # single-stream, server
THROUGHPUT_SCENARIO_TYPES = _types("throughput")    # offline


@dataclass(frozen=True)
class MetricRef:
    name: str                     # what the user wrote: "e2el_p95", "throughput", "size"
    family: str                   # accuracy | latency | throughput | memory | size | cold_start
    candidates: tuple[tuple[str, str, bool], ...]   # (where, row suffix, lower is better), first found wins
    label: str


_FIXED = {
    "throughput": MetricRef("throughput", "throughput", (("throughput", "output_throughput", False),), "output throughput"),
    "goodput": MetricRef("goodput", "throughput", (("latency", "goodput", False),), "goodput"),
    "memory": MetricRef("memory", "memory", (("memory", "process_peak", True),), "peak memory"),
    "size": MetricRef("size", "size", (("facts", "model_size", True),), "model size"),
    "accuracy": MetricRef("accuracy", "accuracy", (("grading", "accuracy_retention", False),
                                                   ("grading", "task_accuracy", False),
                                                   ("scoring", "kld_mean", True)), "accuracy"),
    "cold_start": MetricRef("cold_start", "cold_start", (("cold_start", "total", True),), "cold start"),
}
ALIASES = {"latency": "e2el_p95"}
NAMES = (*ALIASES, "e2el_p95", "ttft_p95", "tpot_p50", *_FIXED)


def metric_ref(name: str) -> MetricRef:
    """The metric a requirement or objective names; ValueError listing the accepted names."""
    name = ALIASES.get(name, name)
    if name in _FIXED:
        return _FIXED[name]
    m = LATENCY.match(name)
    if m:
        label = f"{m.group(1).upper()} {m.group(2)}"
        return MetricRef(name, "latency", (("latency", name, True),), label)
    raise ValueError(f"unknown objective {name!r}; accepted: {' | '.join(NAMES)}, any of e2el/ttft/tpot/itl_"
                     "p50/p90/p95/p99/mean, or weights such as {throughput: 1, size: 0.5}")


def check_objective(objective) -> None:
    """ValueError unless `objective` is one metric name or a mapping of names to positive weights."""
    if isinstance(objective, str):
        metric_ref(objective)
        return
    if not objective:
        raise ValueError("objective weights cannot be empty")
    for name, w in objective.items():
        metric_ref(name)
        if not (w > 0):
            raise ValueError(f"the weight of {name!r} must be above 0, got {w}")


def objective_weights(objective) -> dict[str, float]:
    """{metric name: weight}; one name is weight 1."""
    return {objective: 1.0} if isinstance(objective, str) else dict(objective)


@dataclass(frozen=True)
class Scenarios:
    """Which scenario the latency and throughput rows come from (None: the run has no such scenario)."""

    latency: str | None
    throughput: str | None
    lengths: tuple[str, ...] = ()     # length-sweep scenarios

    @classmethod
    def of(cls, scenarios: list[dict], requirements=None) -> "Scenarios":
        """From the suite's scenario specs (dicts with type and name) and the requirements' choices."""
        named = [(s.get("name") or s["type"], s["type"]) for s in scenarios]

        def first(types):
            return next((n for n, t in named if t in types), None)
        latency = getattr(requirements, "scenario", None) or first(LATENCY_SCENARIO_TYPES)
        throughput = getattr(requirements, "throughput_scenario", None) or first(THROUGHPUT_SCENARIO_TYPES)
        return cls(latency, throughput or latency, tuple(n for n, t in named if t in _types("sweep")))

    def where(self, place: str) -> str | None:
        return {"latency": self.latency, "throughput": self.throughput}.get(place, place)


def find_row(comparison, ref: MetricRef, scenarios: Scenarios):
    """(row, lower_is_better) for `ref` in `comparison`, or (None, None) when the run has no such row."""
    keys = {r.key: r for r in comparison.rows}
    for place, suffix, lower in ref.candidates:
        prefix = scenarios.where(place)
        if prefix is not None and f"{prefix}.{suffix}" in keys:
            return keys[f"{prefix}.{suffix}"], lower
    return None, None
