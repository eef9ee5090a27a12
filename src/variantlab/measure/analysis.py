"""From stored records to the comparison table: every tracker's rows, with deltas against the baseline.

Pure: `analyse` takes the plan's trackers, the build and measurement records and a way to fetch
blobs, and returns a `Comparison`; the reports and the store only render or save it. It never
looks at a tracker's name: each tracker lists its rows (`MetricDef`) and how to read their samples
from one round's output, and the row's kind says how it is judged (measure/tracker.py):
- samples: value and interval by a hierarchical bootstrap over rounds then samples; delta from
  per-round paired ratios (measure/rounds.py);
- process: one value per round, the same way (one round: a single sample, no verdict);
- fact: measured once; a plain percent change and no verdict;
- versus: the tracker's `compare` against the baseline.
A row whose metric says two figures cannot be compared (`MetricDef.comparable`: perplexities over
texts that two tokenizers split differently) gives that variant no delta, only the reason.
The baseline's round-to-round spread is the machine's noise: a row whose delta is smaller than it
says so in plain words.
A variant's status is "ok" when some round measured it, else its failure's status ("failed",
"unsupported", with the reason), else — no record says it failed, the run never measured it —
NOT_MEASURED_INTERRUPTED when the run was interrupted (or its bench killed) and NOT_REACHED otherwise:
neither is a failure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .build_summary import BuildSummary
from .rounds import RESOLVE_PCT, Spread, estimate_rounds, paired_delta, process_spread
from .stats import Delta, Estimate, exact_delta
from .tracker import NOT_MEASURED, MetricDef, Problem

NOT_COMPARABLE = "not comparable"   # the method of a delta withheld: the two figures measure different things
NOT_MEASURED_INTERRUPTED = "not measured (interrupted)"   # no record: the run was interrupted before it
NOT_REACHED = "not reached"                                # no record: the run ended before it
UNMEASURED = (NOT_MEASURED_INTERRUPTED, NOT_REACHED)


def never_measured(status: str | None) -> bool:
    """Whether a variant's status says the run never got to measure it: not measured, but not failed either."""
    return status in UNMEASURED


@dataclass(frozen=True)
class Row:
    key: str                          # "<tracker>.<metric>", e.g. "single-stream.tpot_p50"
    label: str
    unit: str
    lower_is_better: bool | None
    kind: str
    cells: dict[str, Estimate | None]
    deltas: dict[str, Delta | None]
    headline: int | None = None
    checks_stability: bool = False
    is_timing: bool = False
    noise: float | None = None        # the baseline's round-to-round CV for this row
    warnings: tuple[str, ...] = ()
    note: str | None = None           # what the figure covers, in words

    def to_json(self) -> dict:
        return {"key": self.key, "label": self.label, "unit": self.unit, "lower_is_better": self.lower_is_better,
                "kind": self.kind, "headline": self.headline, "checks_stability": self.checks_stability,
                "is_timing": self.is_timing, "noise": self.noise, "warnings": list(self.warnings), "note": self.note,
                "cells": {k: (v.to_json() if v else None) for k, v in self.cells.items()},
                "deltas": {k: (v.to_json() if v else None) for k, v in self.deltas.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "Row":
        return cls(d["key"], d["label"], d["unit"], d["lower_is_better"], d["kind"],
                   {k: (Estimate.from_json(v) if v else None) for k, v in d["cells"].items()},
                   {k: (Delta.from_json(v) if v else None) for k, v in d["deltas"].items()},
                   d.get("headline"), d.get("checks_stability", False), d.get("is_timing", False), d.get("noise"),
                   tuple(d.get("warnings", ())), d.get("note"))


@dataclass(frozen=True)
class Comparison:
    baseline: str
    variants: tuple[str, ...]
    status: dict[str, str]
    reasons: dict[str, str | None]
    rows: tuple[Row, ...]
    warnings: tuple[str, ...] = ()                           # the run's own; each row carries its noise warnings
    builds: dict[str, BuildSummary] = field(default_factory=dict)   # per variant: recipe, kernels, notes, build
    rounds: dict[str, dict] = field(default_factory=dict)   # per variant: {"ok": n, "failed": n}

    def __post_init__(self) -> None:   # builds given as the JSON's dicts are read into their record
        object.__setattr__(self, "builds", {v: b if isinstance(b, BuildSummary) else BuildSummary.model_validate(b)
                                            for v, b in self.builds.items()})

    def row(self, key: str) -> Row:
        """The row `key` ("single-stream.tpot_p50"), or the one row whose key ends in ".key" ("tpot_p50")."""
        exact = [r for r in self.rows if r.key == key]
        found = exact or [r for r in self.rows if r.key.endswith("." + key)]
        if len(found) != 1:
            raise KeyError(f"{key!r} names {len(found)} rows" + (f": {[r.key for r in found]}" if found else ""))
        return found[0]

    def to_json(self) -> dict:
        return {"baseline": self.baseline, "variants": list(self.variants), "status": self.status,
                "reasons": self.reasons, "rows": [r.to_json() for r in self.rows], "warnings": list(self.warnings),
                "builds": {v: b.to_json() for v, b in self.builds.items()}, "rounds": self.rounds}

    @classmethod
    def from_json(cls, d: dict) -> "Comparison":
        return cls(d["baseline"], tuple(d["variants"]), d["status"], d["reasons"],
                   tuple(Row.from_json(r) for r in d["rows"]), tuple(d.get("warnings", ())),
                   d.get("builds") or {}, d.get("rounds", {}))


# ------------------------------------------------------------------ gathering

@dataclass
class _Variant:
    status: str | None = None                 # None until a record speaks of it
    reason: str | None = None
    outputs: dict[int, dict] = field(default_factory=dict)   # round → tracker name → output
    once: dict = field(default_factory=dict)                  # tracker name → output of its once round
    failed_rounds: list[str] = field(default_factory=list)
    device: str | None = None
    kernels: tuple[str, ...] | None = None     # what its measurements ran
    notes: tuple[str, ...] | None = None


def _gather(trackers, names, builds, records, interrupted: bool = False) -> dict[str, _Variant]:
    by_name = {t.name: t for t in trackers}
    out = {n: _Variant() for n in names}
    built = {b.variant for b in builds if b.status == "ok"}
    for b in builds:
        if b.variant in out and b.status != "ok":
            out[b.variant].status = b.status
            out[b.variant].reason = f"build: {b.reason}"
    for rec in records:
        v = out.get(rec.variant)
        if v is None:
            continue
        if rec.status != "ok":
            v.failed_rounds.append(f"round {rec.round + 1}: {rec.reason}")
            if not v.outputs:
                v.status, v.reason = rec.status, rec.reason
            continue
        v.status, v.reason, v.device = "ok", None, rec.device
        v.kernels, v.notes = v.kernels or rec.kernels, v.notes or rec.notes
        parsed = {}
        for o in rec.outputs:
            tracker = by_name.get(o.name)
            if tracker is not None:
                parsed[o.name] = (Problem(o.error if o.error.startswith(NOT_MEASURED) else f"{o.name} failed: {o.error}")
                                  if o.error is not None else tracker.output_model.model_validate(o.data))
        v.outputs[rec.round] = parsed
        if rec.ran_once:
            v.once.update({k: p for k, p in parsed.items() if by_name[k].once})
    for n, v in out.items():
        if v.status is None:
            v.status, v.reason = _unmeasured(n in built, interrupted)
    return out


def _unmeasured(built: bool, interrupted: bool) -> tuple[str, str]:
    """The status and reason of a variant no record speaks of: the run stopped before its build or its rounds."""
    how = "was interrupted" if interrupted else "ended"
    return (NOT_MEASURED_INTERRUPTED if interrupted else NOT_REACHED,
            f"built, but the run {how} before any of its rounds" if built else f"the run {how} before its build")


def _round_samples(d: MetricDef, v: _Variant, tracker_name: str) -> tuple[dict[int, list[float]], str | None]:
    """round → finite samples of metric d, and a problem (a Problem from the tracker, or non-finite values)."""
    rounds: dict[int, list[float]] = {}
    problem = None
    for r, outs in sorted(v.outputs.items()):
        o = outs.get(tracker_name)
        if o is None:
            continue
        xs = _samples(d, o)
        if isinstance(xs, Problem):
            problem = problem or xs.text
            continue
        finite = [float(x) for x in xs if math.isfinite(float(x))]
        if len(finite) != len(xs):
            problem = problem or f"{len(xs) - len(finite)} non-finite values in round {r + 1}"
        if finite:
            rounds[r] = finite
    return rounds, problem


@dataclass(frozen=True)
class RowRounds:
    """One row's samples by round for every measured variant: what its value and interval come from."""

    key: str                                    # "<tracker>.<metric>", as Row.key
    metric: MetricDef
    rounds: dict[str, dict[int, list[float]]]   # variant → round → its finite samples
    problems: dict[str, str]                    # variant → why samples are missing or were dropped


def round_samples(trackers: Sequence, names: Sequence[str], builds: Sequence,
                  records: Sequence) -> dict[str, RowRounds]:
    """Per row key of the kinds measured every round ("samples", "process"): each measured variant's
    finite samples by round, gathered as `analyse` gathers them (advise/compare.py resamples them)."""
    data = _gather(trackers, tuple(names), builds, records)
    out = {}
    for t in trackers:
        for d in t.metrics():
            if d.kind not in ("samples", "process"):
                continue
            rounds, problems = {}, {}
            for n, v in data.items():
                if v.status == "ok":
                    rounds[n], problem = _round_samples(d, v, t.name)
                    if problem:
                        problems[n] = problem
            out[f"{t.name}.{d.key}"] = RowRounds(f"{t.name}.{d.key}", d, rounds, problems)
    return out


def _samples(d: MetricDef, output) -> Sequence[float] | Problem:
    """d's samples from one output; a failed tracker's output, or arithmetic that overflows, is a Problem."""
    if isinstance(output, Problem):
        return output
    try:
        return d.samples(output)
    except ArithmeticError as e:
        return Problem(f"cannot be computed ({type(e).__name__}: {e})")


def _problem(unit: str, text: str) -> Estimate:
    return Estimate(value=None, low=None, high=None, n=0, cv=None, unit=unit, problem=text)


# ------------------------------------------------------------------ the table

def analyse(trackers: Sequence, names: Sequence[str], baseline: str, builds: Sequence, records: Sequence,
            blobs: Callable[[str], bytes], *, extra_warnings: Sequence[str] = (),
            interrupted: bool = False) -> Comparison:
    """Rows of every tracker's metrics for every variant; deltas against `baseline`. `interrupted`: the run
    did not end (interrupted, or its bench killed), so a variant it has no record of reads
    NOT_MEASURED_INTERRUPTED; else NOT_REACHED."""
    names = tuple(names)
    data = _gather(trackers, names, builds, records, interrupted)
    ok = [n for n in names if data[n].status == "ok"]
    base = data[baseline] if baseline in ok else None
    rows, warnings = [], list(extra_warnings)
    for t in trackers:
        versus = _versus(t, data, ok, base, blobs)
        for d in t.metrics():
            rows.append(_row(t, d, names, ok, data, baseline, base, versus))
        for n in ok:
            once = data[n].once.get(t.name)
            if isinstance(once, Problem):
                warnings.append(f"{n}: {once.text}")
            elif once is not None:
                warnings += t.warnings(n, once)
            if not t.once:   # a scenario that failed in a round; the round's other trackers kept their results
                for r, outs in sorted(data[n].outputs.items()):
                    out = outs.get(t.name)
                    if isinstance(out, Problem):
                        warnings.append(f"{n}: {out.text} (round {r + 1})")
                    elif out is not None:
                        warnings += [f"{w} (round {r + 1})" for w in t.warnings(n, out)]
    if ok and max(len(data[n].outputs) for n in ok) == 1:
        warnings.append("one round: timing deltas carry the machine's drift between one variant's process and the "
                        "next, so they get intervals but no verdict (with rounds: 5 they do)")
    for n in names:
        v = data[n]
        if v.status == "ok" and v.failed_rounds:
            warnings.append(f"{n} failed in {len(v.failed_rounds)} round(s), measured from the others: "
                            + "; ".join(v.failed_rounds))
    rounds = {n: {"ok": len(data[n].outputs), "failed": len(data[n].failed_rounds)} for n in names}
    return Comparison(baseline, names, {n: data[n].status for n in names}, {n: data[n].reason for n in names},
                      tuple(rows), tuple(dict.fromkeys(warnings)), _builds(builds, data), rounds)


def _versus(t, data, ok, base, blobs) -> dict[str, dict]:
    """variant → the tracker's comparison with the baseline (the baseline against itself included)."""
    if base is None or t.name not in base.once:
        return {}
    out = {}
    theirs = base.once[t.name]
    for n in ok:
        mine = data[n].once.get(t.name)
        if mine is None:
            continue
        failed = next((o for o in (mine, theirs) if isinstance(o, Problem)), None)
        try:
            out[n] = ({d.key: failed for d in t.metrics()} if failed else t.compare(theirs, mine, blobs))
        except (ValueError, ArithmeticError) as e:   # e.g. NaN log-probs the tracker did not flag
            out[n] = {d.key: Problem(f"cannot be computed ({type(e).__name__}: {e})") for d in t.metrics()}
    return out


def _row(t, d: MetricDef, names, ok, data, baseline: str, base, versus) -> Row:
    cells: dict[str, Estimate | None] = {}
    deltas: dict[str, Delta | None] = {}
    per_round: dict[str, dict[int, list[float]]] = {}
    for n in names:
        if n not in ok:
            cells[n] = deltas[n] = None
            continue
        cells[n], per_round[n] = _cell(t, d, data[n], versus.get(n, {}))
    spread = _spread(d, {n: per_round[n] for n in names if n in per_round}) if d.kind != "fact" else None
    for n in names:
        deltas[n] = None
        if n == baseline or n not in ok or baseline not in ok or not d.with_delta or d.kind == "versus":
            continue
        if cells[n] is None or cells[n].value is None or cells[baseline] is None or cells[baseline].value is None:
            continue
        why = _incomparable(t, d, base, data[n])
        if why is not None:    # no figure of change between figures that do not measure the same thing
            deltas[n] = Delta(None, None, None, None, NOT_COMPARABLE, problem=why)
        elif d.kind == "fact":
            deltas[n] = exact_delta(cells[baseline].value, cells[n].value) if cells[baseline].value else None
        else:
            rounds = sorted(set(per_round[baseline]) | set(per_round[n]))
            deltas[n] = paired_delta([per_round[baseline].get(r) for r in rounds],
                                     [per_round[n].get(r) for r in rounds], d.statistic, sample_name=d.sample_name,
                                     spread=spread)
    key = f"{t.name}.{d.key}"
    label = d.label
    noise = cells.get(baseline).round_cv if cells.get(baseline) is not None and d.is_timing else None
    unstable = [f"{n} {100 * (e.round_cv if e.rounds >= 2 else e.cv):.0f}%" for n, e in cells.items()
                if d.checks_stability and e is not None and e.unstable]
    warnings = _noise_warnings(label, baseline, noise, deltas) + (_resolution_warnings(label, spread, deltas)
                                                                  if d.is_timing else [])
    if unstable:
        warnings.append(f"{label} is unstable (it varied over 10% {'from round to round' if len(per_round.get(baseline, {})) >= 2 else 'across its samples'}): "
                        + ", ".join(unstable))
    return Row(key, label, d.unit, d.lower_is_better, d.kind, cells, deltas, d.headline, d.checks_stability,
               d.is_timing, noise, tuple(warnings), _note(t, d, data, [baseline, *ok]))


def _incomparable(t, d: MetricDef, base: _Variant, v: _Variant) -> str | None:
    """Why the variant's figure cannot be set against the baseline's, by the metric's own rule (a once tracker's
    `comparable`: perplexities of texts split into other tokens), or None."""
    if d.comparable is None:
        return None
    mine, theirs = v.once.get(t.name), base.once.get(t.name)
    if mine is None or theirs is None or isinstance(mine, Problem) or isinstance(theirs, Problem):
        return None
    why = d.comparable(theirs, mine)
    return why.text if why is not None else None


def _cell(t, d: MetricDef, v: _Variant, versus: dict) -> tuple[Estimate | None, dict[int, list[float]]]:
    if d.kind == "versus":
        value = versus.get(d.key)
        if value is None:
            return None, {}
        if isinstance(value, Problem):
            return _problem(d.unit, value.text), {}
        if isinstance(value, Estimate):    # the tracker gave an interval of its own (paired over samples)
            ok = value.value is not None and math.isfinite(value.value)
            return (value if ok else _problem(d.unit, f"{value.value} (not finite)")), {}
        if not math.isfinite(float(value)):
            return _problem(d.unit, f"{float(value)} (not finite)"), {}
        return Estimate(value=float(value), low=None, high=None, n=1, cv=None, unit=d.unit, method="exact"), {}
    if d.kind == "fact":
        once = v.once.get(t.name)
        if once is None:
            return None, {}
        xs = _samples(d, once)
        if isinstance(xs, Problem):
            return _problem(d.unit, xs.text), {}
        if not xs:
            return None, {}
        x = float(xs[0])
        if not math.isfinite(x):
            return _problem(d.unit, f"{x} (not finite)"), {}
        return Estimate(value=x, low=None, high=None, n=1, cv=None, unit=d.unit, method="exact"), {}
    rounds, problem = _round_samples(d, v, t.name)
    if not rounds:
        return (_problem(d.unit, problem) if problem else None), rounds
    est = estimate_rounds(list(rounds.values()), d.unit, d.statistic, sample_name=d.sample_name)
    if problem and est.problem is None:
        est = Estimate(**{**est.to_json(), "problem": problem})
    return est, rounds


def _note(t, d: MetricDef, data, names) -> str | None:
    """The row's note, from the first output of the first of `names` (baseline first) that has one."""
    if d.note is None:
        return None
    for n in names:
        v = data.get(n)
        outs = [o[t.name] for _, o in sorted(v.outputs.items())
                if t.name in o and not isinstance(o[t.name], Problem)] if v else []
        if outs:
            return d.note(outs[0])
    return None


def _spread(d: MetricDef, per_round: dict[str, dict[int, list[float]]]) -> Spread | None:
    """The row's process-to-process spread over every variant measured (rounds.process_spread), from each round's
    statistic; None where a round's samples give none (too few for it, none at all)."""
    stats: dict[str, dict[int, float]] = {}
    for n, rounds in per_round.items():
        stats[n] = {}
        for r, xs in rounds.items():
            if xs:
                try:
                    stats[n][r] = float(d.statistic(xs))
                except ValueError:
                    continue
    return process_spread(stats)


def _resolution_warnings(label: str, spread: Spread | None, deltas: dict) -> list[str]:
    """Plain words when the run's rounds cannot tell a RESOLVE_PCT change from its processes' spread: how small a
    change they do tell, and how many rounds would tell RESOLVE_PCT."""
    rounds = max((dl.rounds for dl in deltas.values() if dl is not None and dl.rounds >= 2), default=0)
    if spread is None or not rounds or spread.smallest_resolved_pct(rounds) <= RESOLVE_PCT:
        return []
    need = spread.rounds_to_resolve()
    more = f"about {need} rounds would tell {RESOLVE_PCT:g}%" if need else f"no practical number of rounds tells {RESOLVE_PCT:g}%"
    return [f"{label}: {rounds} rounds cannot tell a change under {spread.smallest_resolved_pct(rounds):.0f}% from how "
            f"far a process strays here ({spread.pct:.1f}%, over {spread.variants} variants and {spread.rounds} "
            f"rounds); {more}"]


def _noise_warnings(label: str, baseline: str, noise: float | None, deltas: dict) -> list[str]:
    """Plain words for each delta smaller than the baseline's round-to-round variation."""
    if noise is None:
        return []
    small = [(n, d) for n, d in deltas.items() if d is not None and d.pct is not None and abs(d.pct) < 100 * noise]
    out = []
    for judged, end in ((False, "this run cannot tell them apart — more rounds or a quieter machine can"),
                        (True, "pairing within rounds still tells them apart")):
        names = [f"{n} ({d.pct:+.1f}%)" for n, d in small if bool(d.significant) == judged]
        if names:
            out.append(f"{label}: {', '.join(names)} differ{'s' if len(names) == 1 else ''} from {baseline} by less "
                       f"than this machine's noise ({baseline} varied {100 * noise:.1f}% from round to round); {end}")
    return out


def _builds(builds, data) -> dict[str, BuildSummary]:
    """What ran per variant: recipe, kernels and notes (from its facts), and its build."""
    out = {}
    for b in builds:
        v = data.get(b.variant)
        facts = b.facts
        out[b.variant] = BuildSummary(
            recipe=facts and facts.recipe, dtype=facts and facts.dtype,
            attention=facts.attention.attention if facts and facts.attention else None,
            kernels=(v.kernels if v and v.kernels else None) or (facts.kernels if facts else ()),
            notes=(v.notes if v and v.notes else None) or (facts.notes if facts else ()),
            build_s=b.timings.get("build_s"), reused=b.reused, not_reused=tuple(b.not_reused),
            artifact=artifact_line(b), device=v.device if v else None,
            runtime=facts.extra.get("runtime", "torch") if facts else None)
    return out


def artifact_line(b) -> str | None:
    """Where a variant's artifact came from, in words, when an artifacts folder was offered: reused
    (it was verified against its hashes before, see variants/artifact_content.py) or rebuilt, and why."""
    if b.reused:
        return f"artifact reused from {b.artifact_dir} (hashes verified)"
    if not b.not_reused:
        return None
    why = "; ".join(b.not_reused)
    if b.status == "ok":
        return f"artifact rebuilt into {b.artifact_dir}, not reused: {why}"
    return f"artifact not reused ({why}), and its build did not succeed"
