"""The recommendation: which variant meets the requirements, the Pareto front, and the near misses.

`recommend` is a pure function of a comparison, the suite's scenarios and its requirements:
1. every requirement becomes a constraint on a row, judged per variant with its interval
   (advise/constraints.py): a variant passes when every constraint passes, fails when one fails,
   and is "not distinguishable" when none fails but one straddles its limit;
2. among the variants that pass, the objective picks (one metric, or weighted log ratios to the
   baseline); a runner-up whose interval overlaps the pick's is named as tied;
3. when nothing passes, it still answers: the closest variant (the smallest worst miss) and the
   binding constraint (the one most variants miss);
4. the Pareto front over the suite's dimensions (accuracy, latency, throughput, and memory or size
   when the requirements speak of them), judged with intervals (advise/pareto.py);
5. when the pick rests on thin evidence (one round, a deciding difference not shown significant, no
   accuracy data), caveats that lead the lines and say what would settle it (advise/evidence.py).
Variants that failed to run are listed apart with their reason; so are those the run never measured (it
was interrupted, or ended, before them: analysis.NOT_MEASURED_INTERRUPTED, NOT_REACHED), which are not
considered and not called failures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..measure.analysis import never_measured
from ..report.format import fmt_value
from .constraints import FAIL, PASS, UNDECIDED, UNMEASURED, Constraint, Judgement, constraints_of, judge, range_coverage
from .evidence import Caveat, Decision, caveats
from .objectives import MetricRef, Scenarios, find_row, metric_ref, objective_weights
from .pareto import Dimension, better, pareto_front
from .presets import expand

DEFAULT_OBJECTIVE = "e2el_p95"
NOT_RUN = "failed to run"
NOT_MEASURED = "not measured"        # the run never got to it: no verdict, and no failure
RETENTION = MetricRef("retention", "accuracy", (("grading", "accuracy_retention", False),), "accuracy retention")
KLD = MetricRef("kld", "accuracy", (("scoring", "kld_mean", True),), "KLD")


@dataclass(frozen=True)
class Recommendation:
    baseline: str
    requirements: dict                      # as expanded from the preset, in the suite's own words
    constraints: tuple[Constraint, ...]
    judgements: dict[str, tuple[Judgement, ...]]   # variant → one per constraint
    verdicts: dict[str, str]      # variant → pass | fail | not distinguishable | failed to run | not measured
    objective: dict[str, float]             # metric name → weight
    dimensions: tuple[Dimension, ...]
    points: dict[str, dict[str, tuple]]     # variant → dimension key → (value, low, high)
    front: tuple[str, ...]
    pick: str | None
    reason: str
    closest: str | None = None              # when nothing passes
    binding: str | None = None              # the constraint most variants miss, in words
    failed: dict[str, str] = field(default_factory=dict)   # variants that did not run → why
    notes: tuple[str, ...] = ()
    caveats: tuple[Caveat, ...] = ()        # how thin the evidence under the pick is; they lead the lines
    not_measured: dict[str, str] = field(default_factory=dict)   # variants the run never got to → why

    def names(self, verdict: str) -> list[str]:
        return [n for n, v in self.verdicts.items() if v == verdict]

    def lines(self) -> list[str]:
        """The recommendation as the terminal prints it; a pick on thin evidence says so first."""
        out = []
        if self.caveats:
            out.append(f"caution: the pick {self.pick} rests on thin evidence: "
                       + "; ".join(c.text for c in self.caveats))
        out.append(f"requirements: {describe_requirements(self)}")
        out.append(f"pick: {self.pick} — {self.reason}" if self.pick else f"no pick — {self.reason}")
        if self.names(PASS):
            out.append(f"meet every requirement: {', '.join(self.names(PASS))}")
        for verdict, head in ((UNDECIDED, "undecided"), (FAIL, "miss")):
            for n in self.names(verdict):
                worst = [j.text() for j in self.judgements[n] if j.status == verdict
                         or (verdict == UNDECIDED and j.status == UNMEASURED and j.constraint.row_key is not None)]
                out.append(f"{head}: {n}: " + "; ".join(worst))
        for n, why in self.failed.items():
            out.append(f"failed to run: {n}: {why}")
        for n, why in self.not_measured.items():
            out.append(f"not measured: {n}: {why}")
        dims = ", ".join(d.label for d in self.dimensions)
        out.append(f"Pareto front over {dims}: {', '.join(self.front) or '—'}")
        out += [f"note: {n}" for n in self.notes]
        return out

    def to_json(self) -> dict:
        return {"schema": "variantlab.recommendation/1", "baseline": self.baseline,
                "requirements": self.requirements, "constraints": [c.to_json() for c in self.constraints],
                "judgements": {n: [j.to_json() for j in js] for n, js in self.judgements.items()},
                "verdicts": self.verdicts, "objective": self.objective,
                "dimensions": [d.to_json() for d in self.dimensions],
                "points": {n: {k: list(v) for k, v in p.items()} for n, p in self.points.items()},
                "front": list(self.front), "pick": self.pick, "reason": self.reason, "closest": self.closest,
                "binding": self.binding, "failed": self.failed, "not_measured": self.not_measured,
                "notes": list(self.notes),
                "caveats": [c.to_json() for c in self.caveats], "lines": self.lines()}


def describe_requirements(rec: Recommendation) -> str:
    parts = [c.text() for c in rec.constraints] or ["none (no constraint given)"]
    preset = rec.requirements.get("preset")
    weights = ", ".join(f"{metric_ref(k).label} ×{w:g}" for k, w in rec.objective.items())
    return (f"preset {preset}: " if preset else "") + "; ".join(parts) + f"; objective: {weights}"


# ------------------------------------------------------------------ the decision

def recommend(comparison, scenarios: list[dict], requirements, suite_path: str | None = None) -> Recommendation:
    """The recommendation for `comparison` under `requirements` (suite.Requirements; its preset expanded here).
    `scenarios`: the suite's scenario specs as dicts (type, name), to know which rows are latency and throughput;
    `suite_path`: the suite file, for the command a caveat names (`variantlab bench SUITE --rounds 5`)."""
    req = expand(requirements)
    where = Scenarios.of(scenarios, req)
    weights = objective_weights(req.objective or DEFAULT_OBJECTIVE)
    constraints = constraints_of(req, comparison, where)
    ran = [n for n in comparison.variants if comparison.status.get(n) == "ok"]
    unmeasured = {n: comparison.reasons.get(n) or comparison.status[n] for n in comparison.variants
                  if never_measured(comparison.status.get(n))}
    failed = {n: f"{comparison.status.get(n)}: {comparison.reasons.get(n) or 'no reason recorded'}"
              for n in comparison.variants if n not in ran and n not in unmeasured}
    rows = {r.key: r for r in comparison.rows}
    judgements = {n: tuple(judge(c, rows[c.row_key].cells.get(n) if c.row_key else None) for c in constraints)
                  for n in ran}
    verdicts = ({n: _verdict(judgements[n]) for n in ran} | {n: NOT_RUN for n in failed}
                | {n: NOT_MEASURED for n in unmeasured})
    objective = _Objective(comparison, where, weights)
    dims = _dimensions(comparison, where, req, weights)
    points = {n: p for n in ran if (p := _point(rows, dims, n))}
    front = tuple(pareto_front(points, dims))
    notes = _notes(constraints, judgements, objective, coverage=range_coverage(req, comparison, where))
    passing = [n for n in ran if verdicts[n] == PASS]
    closest = binding = None
    thin: tuple[Caveat, ...] = ()
    if passing:
        pick = objective.best(passing)
        reason = _pick_reason(pick, passing, constraints, objective, comparison.baseline)
        others = [n for n in passing if n != pick]
        thin = caveats(comparison, Decision(
            pick, objective.best(others) if others else None, objective.rows,
            tuple(rows[c.row_key] for c in constraints if c.row_key is not None),
            find_row(comparison, RETENTION, where)[0], find_row(comparison, KLD, where)[0], suite_path))
    else:
        pick = None
        closest, binding, reason = _nearest(ran, judgements, verdicts, objective, failed, unmeasured)
    return Recommendation(comparison.baseline, req.model_dump(exclude_none=True, exclude={"slo"}), tuple(constraints),
                          judgements, verdicts, weights, tuple(dims), points, front, pick, reason, closest, binding,
                          failed, tuple(notes), thin, unmeasured)


def _verdict(judgements) -> str:
    """fail if one fails; not distinguishable if one straddles its limit, or the variant has no figure on a row
    the run has (it cannot be said to pass); else pass. A row the whole run lacks is a note, not a verdict."""
    statuses = {j.status for j in judgements if j.status != UNMEASURED or j.constraint.row_key is not None}
    return FAIL if FAIL in statuses else UNDECIDED if statuses & {UNDECIDED, UNMEASURED} else PASS


class _Objective:
    """Scores variants on the objective: one metric ranks by its value; weights add log ratios to the baseline."""

    def __init__(self, comparison, where: Scenarios, weights: dict[str, float]):
        self.comparison, self.weights = comparison, weights
        self.rows = {}
        for name in weights:
            row, lower = find_row(comparison, metric_ref(name), where)
            self.rows[name] = (row, lower)

    @property
    def missing(self) -> list[str]:
        return [n for n, (row, _) in self.rows.items() if row is None]

    def _value(self, name: str, variant: str) -> float | None:
        row, _ = self.rows[name]
        cell = row.cells.get(variant) if row is not None else None
        return cell.value if cell is not None and cell.value is not None and math.isfinite(cell.value) else None

    def score(self, variant: str) -> float | None:
        """Higher is better: Σ weight × ln(reference ÷ value) (lower is better) or ln(value ÷ reference)."""
        total, used = 0.0, 0
        for name, w in self.weights.items():
            row, lower = self.rows[name]
            x = self._value(name, variant)
            ref = self._value(name, self.comparison.baseline)
            if ref is None:   # the baseline lacks it: any common reference ranks the same way
                ref = next((v for n in self.comparison.variants if (v := self._value(name, n)) is not None), None)
            if x is None or ref is None:
                continue
            ratio = max(x, 1e-12) / max(ref, 1e-12)
            total += w * (-math.log(ratio) if lower else math.log(ratio))
            used += 1
        return total if used else None

    def best(self, names: list[str]) -> str:
        """The highest score; scores within 0.1% count as equal, and the earlier in the suite's order wins."""
        scored = [(s, n) for n in names if (s := self.score(n)) is not None]
        if not scored:
            return names[0]
        top = max(s for s, _ in scored)
        return next(n for s, n in scored if s >= top - 1e-3)

    def tied_with(self, pick: str, others: list[str]) -> list[str]:
        """Others that no metric of the objective tells apart from the pick: against the baseline, by the
        paired delta's verdict; between two variants, by their intervals."""
        baseline = self.comparison.baseline
        tied = []
        for n in others:
            if n == pick:
                continue
            apart = False
            for name, (row, lower) in self.rows.items():
                a, b = (row.cells.get(pick), row.cells.get(n)) if row is not None else (None, None)
                if a is None or b is None or a.value is None or b.value is None:
                    continue
                other = n if pick == baseline else pick if n == baseline else None
                d = row.deltas.get(other) if other is not None else None
                if d is not None and d.significant is not None:
                    apart = apart or bool(d.significant)
                elif better((a.value, a.low, a.high), (b.value, b.low, b.high), lower) or \
                        better((b.value, b.low, b.high), (a.value, a.low, a.high), lower):
                    apart = True
            if not apart:
                tied.append(n)
        return tied

    def describe(self, variant: str, baseline: str) -> str:
        """"E2EL p95 [single-stream] 38.0% [31.0, 44.0] below bf16", per metric of the objective."""
        parts = []
        for name, (row, lower) in self.rows.items():
            if row is None:
                continue
            cell = row.cells.get(variant)
            value = fmt_value(cell.value, row.unit) if cell is not None else "—"
            d = row.deltas.get(variant)
            if variant == baseline:
                parts.append(f"{row.label} {value} (the baseline)")
            elif d is not None and d.pct is not None:
                parts.append(f"{row.label} {value}, {_delta_words(d, baseline)}")
            else:
                parts.append(f"{row.label} {value}")
        return "; ".join(parts)


def _delta_words(d, baseline: str) -> str:
    """"38.0% [31.0, 44.0] below bf16"; an interval that spans 0: "-11.2% [-22.9, +2.2] against bf16, not significant"."""
    has = d.low is not None and d.high is not None
    if has and (d.low < 0) != (d.high < 0):
        return f"{d.pct:+.1f}% [{d.low:+.1f}, {d.high:+.1f}] against {baseline}, not significant"
    interval = f" [{min(abs(d.low), abs(d.high)):.1f}, {max(abs(d.low), abs(d.high)):.1f}]" if has else ""
    ns = ", not significant" if d.significant is False else ""
    return f"{abs(d.pct):.1f}%{interval} {'below' if d.pct < 0 else 'above'} {baseline}{ns}"


def _pick_reason(pick: str, passing: list[str], constraints, objective: _Objective, baseline: str) -> str:
    met = "meets " + ", ".join(c.text() for c in constraints) if constraints else "no constraint given"
    single = len(objective.weights) == 1
    what = (f"the {'lowest' if objective.rows[next(iter(objective.weights))][1] else 'highest'} "
            f"{metric_ref(next(iter(objective.weights))).label}" if single else "the best weighted objective")
    among = f"among the {len(passing)} that pass" if len(passing) > 1 else "the only one that passes"
    reason = f"{met}; {what} {among}: {objective.describe(pick, baseline)}"
    if objective.missing:
        reason += f" (this run has no row for {', '.join(objective.missing)}; ranked on the rest)"
    tied = objective.tied_with(pick, passing)
    if tied:
        reason += (f". This run does not tell it apart on the objective from {', '.join(tied)}, so "
                   f"{'they are' if len(tied) > 1 else 'it is'} as good a choice here")
    return reason


def _nearest(ran, judgements, verdicts, objective: _Objective, failed,
             unmeasured) -> tuple[str | None, str | None, str]:
    """Nothing passes: the closest variant, the binding constraint, and the sentence that says so."""
    if not ran:
        return None, None, "no variant ran: " + "; ".join(
            [f"{n} {why}" for n, why in failed.items()]
            + [f"{n} not measured ({why})" for n, why in unmeasured.items()])
    undecided = [n for n in ran if verdicts[n] == UNDECIDED]
    if undecided:
        closest = objective.best(undecided)
        open_ = [j for j in judgements[closest] if j.status == UNDECIDED
                 or (j.status == UNMEASURED and j.constraint.row_key is not None)]
        fix = ("more rounds or samples can decide" if any(j.status == UNDECIDED for j in open_)
               else "the run has no figure to judge it by")
        return closest, open_[0].constraint.text(), (
            f"no variant distinguishably meets every requirement. Closest: {closest}, which fails none, but "
            + "; ".join(j.text() for j in open_) + f" — {fix}")

    def miss(j) -> float:
        return j.miss if j.miss is not None else math.inf

    def worst_miss(n):
        return max((miss(j) for j in judgements[n] if j.status == FAIL), default=0.0)
    closest = min(ran, key=lambda n: (worst_miss(n), -(objective.score(n) or 0)))
    missed: dict[str, list] = {}
    for n in ran:
        for j in judgements[n]:
            if j.status == FAIL:
                missed.setdefault(j.constraint.text(), []).append(j)
    binding = max(missed, key=lambda c: (len(missed[c]), -min(miss(j) for j in missed[c])))
    by_closest = [j.text() for j in judgements[closest] if j.status == FAIL]
    return closest, binding, (
        f"no variant meets every requirement. Closest: {closest}, which " + "; ".join(by_closest)
        + f". The binding constraint is {binding}: {len(missed[binding])} of {len(ran)} variants miss it")


# ------------------------------------------------------------------ the front

def _dimensions(comparison, where: Scenarios, req, weights) -> list[Dimension]:
    """Accuracy, the objective's latency (or p95 E2EL), throughput; memory, size and cold start when asked for."""
    asked = {metric_ref(n).family for n in weights}
    if req.max_peak_memory_mib is not None:
        asked.add("memory")
    if req.max_model_size_mib is not None:
        asked.add("size")
    latency = next((n for n in weights if metric_ref(n).family == "latency"), None)
    if latency is None:
        latency = next((f"{f[4:-2]}_{p}" for f in ("max_e2el_s", "max_ttft_s", "max_tpot_s")
                        for p in (getattr(req, f) or {})), DEFAULT_OBJECTIVE)
    wanted = ["accuracy", latency, "goodput" if "goodput" in weights else "throughput"]
    wanted += [f for f in ("memory", "size", "cold_start") if f in asked]
    dims = []
    for name in wanted:
        row, lower = find_row(comparison, metric_ref(name), where)
        if row is not None and all(d.key != row.key for d in dims):
            dims.append(Dimension(row.key, row.label, lower, metric_ref(name).family))
    return dims


def _point(rows, dims: list[Dimension], variant: str) -> dict[str, tuple]:
    out = {}
    for d in dims:
        cell = rows[d.key].cells.get(variant)
        if cell is not None and cell.value is not None and math.isfinite(cell.value):
            out[d.key] = (cell.value, cell.low, cell.high)
    return out


def _notes(constraints, judgements, objective: _Objective, coverage: str | None) -> list[str]:
    notes = [coverage] if coverage else []
    for c in constraints:
        if c.row_key is None:
            notes.append(f"{c.text()}: this run has no such row, so it was not judged")
    unmeasured: dict[tuple[str, str], list[str]] = {}
    for n, js in judgements.items():
        for j in js:
            if j.status == UNMEASURED and j.constraint.row_key is not None:
                unmeasured.setdefault((j.constraint.text(), j.why or ""), []).append(n)
    for (c, why), names in unmeasured.items():
        who = "any variant" if len(names) == len(judgements) > 1 else ", ".join(names)
        notes.append(f"{c}: not measured for {who} ({why}), so none of them can be said to meet it")
    if objective.missing:
        notes.append(f"the objective's {', '.join(objective.missing)} has no row in this run")
    return notes


# ------------------------------------------------------------------ a stored run

def load_requirements(path: str | Path, suite: dict):
    """A requirements file (YAML: the `requirements:` block, or its fields at the top level), validated
    against the run's own suite so that errors name the file and the field."""
    from ..errors import SuiteError
    from ..suite import parse_suite, parse_yaml
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SuiteError("no such requirements file", file=str(path), accepted="a YAML file of requirements") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"cannot read requirements: {type(e).__name__}", file=str(path),
                         accepted="a UTF-8 YAML mapping of requirements") from None
    data = parse_yaml(text, file=str(path))   # a key given twice is an error (line, column), as in a suite
    if isinstance(data, dict) and set(data) == {"requirements"}:
        data = data["requirements"]
    if not isinstance(data, dict):
        raise SuiteError("requirements must be a YAML mapping", file=str(path),
                         accepted="keys such as min_accuracy_retention, max_e2el_s, objective, preset")
    return parse_suite({**suite, "requirements": data}, file=str(path)).requirements


_RENAMED = {"max_e2el_p95_s": ("max_e2el_s", "p95"), "max_ttft_p95_s": ("max_ttft_s", "p95")}


def stored_requirements(d: dict) -> dict:
    """A stored suite's requirements in today's fields: unset (None) fields dropped, and the fields of runs
    stored before percentiles were keys (max_e2el_p95_s, max_peak_memory_mb) renamed."""
    out = {k: v for k, v in d.items() if v is not None and k not in _RENAMED and k != "max_peak_memory_mb"}
    for old, (new, pct) in _RENAMED.items():
        if d.get(old) is not None:
            out.setdefault(new, {})[pct] = d[old]
    if d.get("max_peak_memory_mb") is not None:
        out["max_peak_memory_mib"] = d["max_peak_memory_mb"] * 1e6 / 2**20
    return out


def recommend_stored(store, run_id: str, requirements_path: str | Path | None = None, preset: str | None = None):
    """The recommendation for a stored run: under its suite's requirements, a requirements file, or a preset."""
    from ..measure.runs import stored_comparison
    from ..suite import Requirements
    comparison, row = stored_comparison(store, run_id)
    suite = row.suite
    if requirements_path is not None:
        requirements = load_requirements(requirements_path, suite)
    else:
        requirements = Requirements.model_validate(stored_requirements(suite.get("requirements") or {}))
    if preset is not None:
        requirements = requirements.model_copy(update={"preset": preset})
    return recommend(comparison, run_scenarios(suite), requirements, shown_suite_path(row.suite_path)), comparison, row


def recommend_step(run, result):
    """The step after a run whose suite has requirements (measure/runner.AfterRun): the recommendation."""
    import dataclasses
    suite = run.plan.suite
    if not suite.requirements.given:
        return result
    return dataclasses.replace(result, recommendation=recommend(
        result.comparison, [sc.model_dump() for sc in suite.workload.scenarios], suite.requirements,
        shown_suite_path(run.plan.suite_path)))


def shown_suite_path(path: str | Path | None) -> str | None:
    """The suite file as a caveat's command names it: relative to the working folder when it lies under it,
    else absolute; None when there is no such file. `bench` and `show` both go through here, so a run's
    results.json and a later `show --format json` from the same folder say the same command."""
    if path is None or not Path(path).is_file():
        return None
    full = Path(path).resolve()
    try:
        return str(full.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(full)


def run_scenarios(suite: dict) -> list[dict]:
    """A stored suite's scenario specs (type, name, …)."""
    return (suite.get("workload") or {}).get("scenarios") or [{"type": "single-stream"}, {"type": "offline"}]
