"""Requirements as constraints on rows of a comparison, each judged with its interval.

A constraint is a row, a direction (≤ or ≥) and a limit. It is judged on a variant's cell:
- "pass" when the whole interval meets the limit (an exact figure: the value does);
- "fail" when the whole interval misses it, with the margin (how far the value is from the limit);
- "not distinguishable" when the interval straddles the limit: this run cannot tell, and saying
  pass or fail would be a guess;
- "not measured" when the row or the cell is missing (the run did not measure it, or it failed).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..report.format import fmt_value
from .objectives import MetricRef, Scenarios, find_row, metric_ref

PASS, FAIL, UNDECIDED, UNMEASURED = "pass", "fail", "not distinguishable", "not measured"
MIB = 2 ** 20


@dataclass(frozen=True)
class Constraint:
    name: str              # the requirement field it comes from: "max_e2el_s.p95"
    label: str             # "E2EL p95 [single-stream]"
    row_key: str | None    # None: the run has no such row
    op: str                # "<=", ">=", or "runs" (the variant must have a figure: a length it must serve)
    limit: float
    unit: str

    def text(self) -> str:
        if self.op == "runs":
            return f"runs: {self.label}"
        return f"{self.label} {'≤' if self.op == '<=' else '≥'} {fmt_value(self.limit, self.unit)}"

    def to_json(self) -> dict:
        return {"name": self.name, "label": self.label, "row": self.row_key, "op": self.op, "limit": self.limit,
                "unit": self.unit, "text": self.text()}


@dataclass(frozen=True)
class Judgement:
    constraint: Constraint
    status: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    miss: float | None = None        # fail: how far past the limit, as a fraction of the limit (0.12: 12%);
                                     # None when there is no figure to measure it by (it did not run there)
    why: str | None = None           # not measured: why

    def text(self) -> str:
        c = self.constraint
        v = fmt_value(self.value, c.unit)
        interval = (f" [{fmt_value(self.low, c.unit)}, {fmt_value(self.high, c.unit)}]"
                    if self.low is not None and self.high is not None else "")
        if self.status == FAIL and self.value is None:
            return f"fails {c.text()}: {self.why}"
        if self.status == FAIL:
            past = "" if self.miss is None else (f", {100 * self.miss:.1f}% short of the limit" if c.op == ">="
                                                 else f", {100 * self.miss:.1f}% past the limit" if self.miss < 1
                                                 else f", {1 + self.miss:.3g}× the limit")
            return f"misses {c.text()}: {v}{interval}{past}"
        if self.status == UNDECIDED:
            return f"{c.text()} is not distinguishable: {v}{interval} straddles the limit"
        if self.status == UNMEASURED:
            return f"{c.text()} not measured: {self.why}"
        return f"meets {c.text()}: {v}{interval}"

    def to_json(self) -> dict:
        return {"constraint": self.constraint.to_json(), "status": self.status, "value": self.value, "low": self.low,
                "high": self.high, "miss": self.miss, "why": self.why, "text": self.text()}


def judge(c: Constraint, cell) -> Judgement:
    """One variant's cell (an analysis Estimate, or None) against one constraint."""
    if c.row_key is None:
        return Judgement(c, UNMEASURED, why="this run has no such row")
    if cell is None or cell.value is None:
        why = cell.problem if cell is not None and cell.problem else "no value"
        if c.op == "runs":   # a length the deployment must serve, and the variant has no figure there
            return Judgement(c, FAIL, why=why)
        return Judgement(c, UNMEASURED, why=why)
    if c.op == "runs":
        return Judgement(c, PASS, cell.value, cell.low, cell.high)
    value, low, high = cell.value, cell.low, cell.high
    has_interval = low is not None and high is not None
    lo, hi = (low, high) if has_interval else (value, value)
    meets = (lambda x: x <= c.limit) if c.op == "<=" else (lambda x: x >= c.limit)
    if meets(lo) and meets(hi):
        return Judgement(c, PASS, value, low, high)
    if not meets(lo) and not meets(hi):
        miss = abs(value - c.limit) / abs(c.limit) if c.limit else None
        return Judgement(c, FAIL, value, low, high, miss=miss)
    return Judgement(c, UNDECIDED, value, low, high)


def constraints_of(requirements, comparison, scenarios: Scenarios) -> list[Constraint]:
    """Every limit the (expanded) requirements set, tied to the comparison's rows."""
    r = requirements
    out: list[Constraint] = []

    def add(name: str, ref: MetricRef, op: str, limit: float, unit_scale: float = 1.0) -> None:
        row, _ = find_row(comparison, ref, scenarios)
        label = row.label if row is not None else ref.label
        unit = row.unit if row is not None else ""
        out.append(Constraint(name, label, row.key if row is not None else None, op, limit * unit_scale, unit))

    if r.min_task_accuracy is not None:
        add("min_task_accuracy", _ref("task accuracy", "accuracy", "grading", "task_accuracy", False), ">=",
            r.min_task_accuracy)
    if r.min_accuracy_retention is not None:
        add("min_accuracy_retention", _ref("accuracy retention", "accuracy", "grading", "accuracy_retention", False),
            ">=", r.min_accuracy_retention)
    if r.max_kld is not None:
        add("max_kld", _ref("KLD mean", "accuracy", "scoring", "kld_mean", True), "<=", r.max_kld)
    if r.max_ppl_ratio is not None:
        add("max_ppl_ratio", _ref("PPL ratio", "accuracy", "scoring", "ppl_ratio", True), "<=", r.max_ppl_ratio)
    for field, metric in (("max_e2el_s", "e2el"), ("max_ttft_s", "ttft"), ("max_tpot_s", "tpot")):
        for pct, limit in (getattr(r, field) or {}).items():
            add(f"{field}.{pct}", metric_ref(f"{metric}_{pct}"), "<=", limit)
    if r.min_output_throughput is not None:
        add("min_output_throughput", metric_ref("throughput"), ">=", r.min_output_throughput)
    if r.min_goodput is not None:
        add("min_goodput", metric_ref("goodput"), ">=", r.min_goodput)
    if r.max_peak_memory_mib is not None:
        add("max_peak_memory_mib", metric_ref("memory"), "<=", r.max_peak_memory_mib, MIB)
    if r.max_model_size_mib is not None:
        add("max_model_size_mib", metric_ref("size"), "<=", r.max_model_size_mib, MIB)
    if r.sequence_length is not None:
        out += _length_constraints(r, comparison, scenarios)
    return out


def _ref(name: str, family: str, where: str, suffix: str, lower: bool) -> MetricRef:
    return MetricRef(suffix, family, ((where, suffix, lower),), name)


def swept_lengths(comparison, scenario: str) -> list[int]:
    """The prompt lengths a length-sweep scenario measured, from its row keys."""
    prefix = f"{scenario}.prefill_"
    return sorted(int(r.key[len(prefix):]) for r in comparison.rows if r.key.startswith(prefix))


def _length_constraints(r, comparison, scenarios: Scenarios) -> list[Constraint]:
    """Inside the sequence-length range: each swept length must be measured, and the TTFT and TPOT limits
    (their tightest percentile) hold for its prefill and per-token decode time."""
    rng = r.sequence_length
    keys = {row.key: row for row in comparison.rows}
    ttft = min((r.max_ttft_s or {}).values(), default=None)
    tpot = min((r.max_tpot_s or {}).values(), default=None)
    out = []
    for sweep in scenarios.lengths:
        for n in (n for n in swept_lengths(comparison, sweep) if rng.min <= n <= rng.max):
            for phase, limit, field in (("prefill", ttft, "max_ttft_s"), ("decode", tpot, "max_tpot_s")):
                row = keys[f"{sweep}.{phase}_{n}"]
                if limit is not None:
                    out.append(Constraint(f"sequence_length.{field}", row.label, row.key, "<=", limit, "s"))
                else:   # no limit: it must at least run at that length
                    out.append(Constraint(f"sequence_length.{phase}", row.label, row.key, "runs", 0.0, "s"))
    return out


def range_coverage(r, comparison, scenarios: Scenarios) -> str | None:
    """A note when the run's length sweep does not reach the range the requirements ask for."""
    rng = r.sequence_length
    if rng is None:
        return None
    swept = sorted({n for s in scenarios.lengths for n in swept_lengths(comparison, s)})
    if not swept:
        return (f"sequence_length {rng.min}–{rng.max}: this run has no length sweep, so no variant was measured "
                "across the range (add a length-sweep scenario)")
    inside = [n for n in swept if rng.min <= n <= rng.max]
    if not inside or max(swept) < rng.max:
        return (f"sequence_length {rng.min}–{rng.max}: the length sweep measured {', '.join(map(str, swept))} tokens; "
                f"{'none inside the range' if not inside else f'nothing between {max(inside)} and {rng.max}'}")
    return None
