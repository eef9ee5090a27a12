"""Comparing two stored runs, variant by variant and row by row: `variantlab compare RUN_A RUN_B`.

pyperf's compare_to is the model: a ratio B/A, its interval, then "1.23x slower" or "not
significant". Variants are matched by name and rows by key; a variant or a row that only one run
has is listed as such, a variant that failed or was not measured in either run with its status. Each
row of each variant present in both runs is judged by its kind:
- rows measured every round ("samples", "process": latencies, throughput, cold start, memory):
  the ratio of the statistic pooled over each run's rounds, with rounds.unpaired_delta's interval.
  Two runs share no round, so nothing cancels between them: each run's statistic is resampled on
  its own (rounds, then samples within them) and the interval widened to Welch's t over the
  per-round statistics. A verdict needs the whole interval outside the noise band 1 ± noise,
  noise being the larger of the two runs' round-to-round CV of the row for that variant and never
  under MIN_EFFECT: drift between two runs made minutes apart (an A/A comparison) must clear both
  what the samples allow and what each run's own rounds showed. A timing row must also clear the
  machine's own change between the runs: the B/A of a fixed yardstick that every measurement runs
  (trackers/machine.py; `machine_drift`), in either direction. Whole minutes of these
  shared machines run 1.5x slower than others, and no round of one run can cancel that in the
  other. One round in either run: no verdict.
- rows measured once ("fact", "versus": sizes, bits per weight, accuracy, KLD) are deterministic:
  the exact ratio and "same", "changed", "better" or "worse", no interval.
Before any of it, the runs' environments must agree on environment.KEY_FIELDS, or the comparison
is refused (forced: the differences are kept as warnings). `regressions` is the CI gate.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Mapping, Sequence

from ..environment import KEY_FIELDS, key_fingerprint, other_differences
from ..errors import VariantlabError
from ..measure.analysis import Comparison, Row, RowRounds
from ..measure.rounds import estimate_rounds, unpaired_delta
from ..measure.stats import Estimate
from ..measure.tracker import MetricDef

SCHEMA = "variantlab.compare/1"
CONFIDENCE = 0.95
MIN_EFFECT = 0.01
"""The noise band is never narrower than ±1%: pyperf's rule that a smaller change is not worth a word."""
EXACT_TOLERANCE = 1e-9
"""Rows measured once are "same" within this relative difference (floating-point round-off, no more)."""
SAMPLED = ("samples", "process")
CHANGED = ("faster", "slower", "better", "worse", "changed")
WORSE = ("slower", "worse")
RULE = ("a verdict needs the whole 95% interval of B/A outside 1 ± noise (noise: the larger round-to-round "
        f"variation of the row in the two runs, at least {MIN_EFFECT:.0%}, and for timing rows at least the machine's "
        "own change between the runs, by its yardstick); rows measured once compare exactly")


class IncomparableRuns(VariantlabError):
    """Two runs measured in environments that differ on a key field (environment.KEY_FIELDS)."""


# ------------------------------------------------------------------ records of a comparison

@dataclass(frozen=True)
class MetricChange:
    key: str                        # the row's key, "single-stream.tpot_p50"
    label: str
    unit: str
    kind: str
    lower_is_better: bool | None
    headline: int | None
    a: Estimate | None
    b: Estimate | None
    ratio: float | None             # B / A; None when a side has no value or A is 0
    low: float | None               # the ratio's interval (rows measured every round)
    high: float | None
    verdict: str                    # faster slower better worse changed | same | not significant | no verdict
    noise: float | None = None      # the band the interval had to clear
    reason: str | None = None       # why not significant, or why no verdict
    method: str = ""
    notes: tuple[str, ...] = ()     # samples dropped, labels that differ

    @property
    def worse_by(self) -> float | None:
        """How far the metric moved in its worse direction with a verdict (0.12: 12% worse; inf from a
        zero A); None when it did not get worse, or has no direction."""
        if self.verdict not in WORSE or self.lower_is_better is None:
            return None
        if self.ratio is None:
            return math.inf
        return self.ratio - 1.0 if self.lower_is_better else 1.0 - self.ratio

    def verdict_text(self) -> str:
        """"1.23x slower", "+12.0% worse", "same", "not significant", "no verdict"."""
        if self.verdict not in CHANGED or self.ratio is None or self.ratio <= 0:
            return self.verdict
        if self.verdict in ("faster", "slower"):
            return f"{max(self.ratio, 1 / self.ratio):.2f}x {self.verdict}"
        return f"{100 * (self.ratio - 1):+.1f}% {self.verdict}"

    def to_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("a", "b", "notes")}
        out |= {"a": self.a.to_json() if self.a else None, "b": self.b.to_json() if self.b else None,
                "notes": list(self.notes), "verdict_text": self.verdict_text(),
                "significant": (None if self.verdict == "no verdict" or self.method == "exact"
                                else self.verdict in CHANGED)}
        return _finite(out)


@dataclass(frozen=True)
class VariantChange:
    name: str
    status_a: str | None            # "ok", "failed", "not reached", ...; None: the variant is not in run A
    status_b: str | None
    reason_a: str | None = None
    reason_b: str | None = None
    metrics: tuple[MetricChange, ...] = ()
    only_in_a: tuple[str, ...] = ()  # labels of the rows only run A measured for it
    only_in_b: tuple[str, ...] = ()

    @property
    def compared(self) -> bool:
        return self.status_a == "ok" and self.status_b == "ok"

    def to_json(self) -> dict:
        return {"name": self.name, "a": _side(self.status_a, self.reason_a), "b": _side(self.status_b, self.reason_b),
                "metrics": [m.to_json() for m in self.metrics], "only_in_a": list(self.only_in_a),
                "only_in_b": list(self.only_in_b)}


@dataclass(frozen=True)
class MachineDrift:
    """How much faster or slower the machine itself ran in run B than in run A: the yardstick's B/A
    (trackers/machine.py), pooled over every variant's measurements. `band` is what a timing row's
    interval must clear besides the runs' own noise: the farthest change either yardstick's interval
    allows, either way (1.5x slower or faster: 0.5). Its interval, not its point: a yardstick of 1.017
    [0.934, 1.089] cannot rule out that the machine ran 8.9% slower, and two quickstart runs minutes
    apart measured fp16's throughput 5.1% apart with round-to-round CVs of 1.5% (a false "1.05x slower"
    when the band was the point's 1.7%). A band, not a correction: a variant whose time does not follow
    the yardstick (memory-bound work, when the machine lost CPU, not bandwidth) would be called faster if
    its ratio were divided by the yardstick's, so only a change beyond the machine's own is called."""

    ratios: dict[str, tuple[float, float | None, float | None]]   # yardstick row label → (B/A, low, high)
    band: float | None                        # None: a run lacks the yardstick (or it had one round)
    text: str

    def to_json(self) -> dict:
        return {"ratios": {k: list(v) for k, v in self.ratios.items()}, "band": self.band, "text": self.text}


@dataclass(frozen=True)
class RunComparison:
    a: dict                                   # run, suite, status
    b: dict
    variants: tuple[VariantChange, ...]
    environment: tuple[str, ...] = ()         # key fields that differ (compared anyway: forced)
    notes: tuple[str, ...] = ()               # other differences: environment, workload, run status
    confidence: float = CONFIDENCE
    machine: MachineDrift | None = None

    def to_json(self, threshold: float | None = None) -> dict:
        gate = None if threshold is None else {"threshold_pct": round(100 * threshold, 9),
                                               "regressions": regressions(self, threshold)}
        if gate is not None:
            gate["failed"] = bool(gate["regressions"])
        return {"schema": SCHEMA, "a": self.a, "b": self.b, "confidence": self.confidence, "rule": RULE,
                "environment": {"differences": list(self.environment), "notes": list(self.notes)},
                "machine": self.machine.to_json() if self.machine else None,
                "variants": [v.to_json() for v in self.variants], "gate": gate}


def _side(status: str | None, reason: str | None) -> dict | None:
    return None if status is None else {"status": status, "reason": reason}


def _finite(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


# ------------------------------------------------------------------ judging one row

def _direction(lower_is_better: bool | None, timing: bool, up: bool) -> str:
    if lower_is_better is None:
        return "changed"
    worse = up == lower_is_better
    return ("slower" if worse else "faster") if timing else ("worse" if worse else "better")


def _finite_rounds(rounds: Mapping[int, Sequence[float]] | Sequence[Sequence[float] | None]
                   ) -> tuple[list[list[float]], int]:
    """Each non-empty round's finite samples (in round order), and how many non-finite ones were dropped."""
    items = [rounds[k] for k in sorted(rounds)] if isinstance(rounds, Mapping) else list(rounds)
    out, dropped = [], 0
    for xs in items:
        xs = [float(x) for x in (xs or ())]
        keep = [x for x in xs if math.isfinite(x)]
        dropped += len(xs) - len(keep)
        if keep:
            out.append(keep)
    return out, dropped


def judge_rounds(metric: MetricDef, a_rounds, b_rounds, *, key: str | None = None, confidence: float = CONFIDENCE,
                 resamples: int = 2000, seed: int = 0, estimates: tuple | None = None,
                 drift: float | None = None) -> MetricChange:
    """One row measured every round in run A and in run B (per round, its samples: a dict round →
    samples or a list of rounds): the ratio B/A, its unpaired interval, and the verdict (module doc).
    Non-finite samples are dropped, and a note says how many. `estimates`: each run's Estimate of
    these very samples when the caller has them (the runs' analysed cells), else made here."""
    a, dropped_a = _finite_rounds(a_rounds)
    b, dropped_b = _finite_rounds(b_rounds)
    notes = tuple(f"run {side}: {n} non-finite samples skipped" for side, n in (("A", dropped_a), ("B", dropped_b))
                  if n)
    est = estimates or [estimate_rounds(x, metric.unit, metric.statistic, confidence=confidence, resamples=resamples,
                                        seed=seed, sample_name=metric.sample_name) if x else None for x in (a, b)]
    delta = unpaired_delta(a, b, metric.statistic, confidence=confidence, resamples=resamples, seed=seed,
                           sample_name=metric.sample_name)
    common = dict(key=key or metric.key, label=metric.label, unit=metric.unit, kind=metric.kind,
                  lower_is_better=metric.lower_is_better, headline=metric.headline, a=est[0], b=est[1],
                  ratio=None if delta.pct is None else 1 + delta.pct / 100, method=delta.method, notes=notes)
    if delta.low is None or delta.high is None:
        return MetricChange(**common, low=None, high=None, verdict="no verdict", reason=delta.problem)
    noise = max([MIN_EFFECT] + [e.round_cv for e in est if e is not None and e.round_cv is not None])
    rounds_noise = noise
    if drift is not None and metric.is_timing:   # the machine's own change between the runs (machine_drift)
        noise = max(noise, drift)
    low, high = 1 + delta.low / 100, 1 + delta.high / 100
    up, down = low > 1 + noise, high < 1 / (1 + noise)
    if up or down:
        verdict, reason = _direction(metric.lower_is_better, metric.is_timing, up), None
    else:
        verdict = "not significant"
        reason = ("the interval includes 1" if low <= 1 <= high else
                  f"the interval clears 1 but not the noise band (±{100 * noise:.1f}%)" if noise == rounds_noise else
                  f"the interval clears 1 but not the machine's own change between the runs (±{100 * noise:.1f}%: "
                  "its yardstick)")
    return MetricChange(**common, low=low, high=high, verdict=verdict, noise=noise, reason=reason)


def judge_exact(row_a: Row, row_b: Row, variant: str) -> MetricChange:
    """One row measured once (a fact, or a comparison with the run's baseline): exact ratio and verdict."""
    ea, eb = row_a.cells.get(variant), row_b.cells.get(variant)
    common = dict(key=row_a.key, label=row_a.label, unit=row_a.unit, kind=row_a.kind,
                  lower_is_better=row_a.lower_is_better, headline=row_a.headline, a=ea, b=eb, low=None, high=None,
                  method="exact")
    missing = [f"run {side}: {e.problem if e is not None and e.problem else 'no value'}"
               for side, e in (("A", ea), ("B", eb)) if e is None or e.value is None]
    if missing:
        return MetricChange(**common, ratio=None, verdict="no verdict", reason="; ".join(missing))
    va, vb = ea.value, eb.value
    if va == vb or math.isclose(va, vb, rel_tol=EXACT_TOLERANCE):
        return MetricChange(**common, ratio=1.0, verdict="same")
    return MetricChange(**common, ratio=vb / va if va else None,
                        verdict=_direction(row_a.lower_is_better, False, vb > va))


# ------------------------------------------------------------------ two runs

@dataclass(frozen=True)
class RunData:
    """What comparing needs of one stored run (load_run reads it from a store)."""

    run_id: str
    suite: str
    status: str                          # done | interrupted | running
    environment: dict                    # the run's host fingerprint
    measured: tuple[dict, ...]           # the environment of each of its good measurements
    comparison: Comparison               # analysed afresh from its records
    samples: dict[str, RowRounds]        # row key → samples by round per variant
    workload: dict


def load_run(store, run_id: str) -> RunData:
    """A stored run, analysed afresh from its records (StoreError: unknown run, or another version's)."""
    from ..measure.runs import reanalyse
    from ..measure.stored_suite import workload_as_measured
    row = store.run(run_id)
    comparison, samples, records = reanalyse(store, row)
    measured = tuple(r.environment for r in records if r.status == "ok" and r.environment)
    return RunData(row.run_id, row.suite_name, row.status, row.environment, measured, comparison, samples,
                   workload_as_measured(row.suite))


def check_environments(a: RunData, b: RunData, force: bool = False) -> tuple[list[str], list[str]]:
    """(key fields that differ, other notes); IncomparableRuns when a key field differs, unless forced."""
    ka, kb = key_fingerprint(a.environment, a.measured), key_fingerprint(b.environment, b.measured)
    differ = [f"{f} {ka[f]} vs {kb[f]}" for f in KEY_FIELDS if None not in (ka[f], kb[f]) and ka[f] != kb[f]]
    if differ and not force:
        raise IncomparableRuns(f"runs {a.run_id} and {b.run_id} were measured in different environments: "
                               + "; ".join(differ), field="environment",
                               accepted="runs of one environment, or --force to compare them anyway")
    unknown = [f"{f} not recorded in run {'A' if ka[f] is None else 'B'}" for f in KEY_FIELDS
               if (ka[f] is None) != (kb[f] is None)]
    others = other_differences(a.environment, b.environment, a.measured, b.measured)
    return differ, unknown + ([f"environment differs (not a key field): {'; '.join(others)}"] if others else [])


def compare_runs(a: RunData, b: RunData, *, force: bool = False, seed: int = 0) -> RunComparison:
    """Every variant of either run, judged row by row where both runs measured it (module doc)."""
    differ, notes = check_environments(a, b, force)
    if a.workload != b.workload:
        keys = sorted(k for k in set(a.workload) | set(b.workload) if a.workload.get(k) != b.workload.get(k))
        notes.append(f"the workloads differ ({', '.join(keys)}): the rows may not measure the same thing")
    notes += [f"run {side} is {r.status}: compared what it measured" for side, r in (("A", a), ("B", b))
              if r.status != "done"]
    names = list(dict.fromkeys([*a.comparison.variants, *b.comparison.variants]))
    drift = machine_drift(a, b, seed)
    return RunComparison({"run": a.run_id, "suite": a.suite, "status": a.status},
                         {"run": b.run_id, "suite": b.suite, "status": b.status},
                         tuple(_variant(n, a, b, seed, drift.band) for n in names), tuple(differ), tuple(notes),
                         machine=drift)


YARDSTICK_ROWS = ("machine.small_ops", "machine.python")


def machine_drift(a: RunData, b: RunData, seed: int = 0) -> MachineDrift:
    """The yardstick's B/A in each run pair, every variant's measurements pooled as rounds of one machine."""
    ratios, reach = {}, []
    for key in YARDSTICK_ROWS:
        if key not in a.samples or key not in b.samples:
            continue
        metric = a.samples[key].metric
        pooled = [[list(xs) for v in r.samples[key].rounds.values() for xs in v.values() if xs] for r in (a, b)]
        delta = unpaired_delta(pooled[0], pooled[1], metric.statistic, seed=seed, sample_name=metric.sample_name)
        if delta.pct is None:
            continue
        ratio = 1 + delta.pct / 100
        low, high = (None, None) if delta.low is None else (1 + delta.low / 100, 1 + delta.high / 100)
        ratios[metric.label] = (ratio, low, high)
        if low is not None and low > 0:   # the farthest its interval lets the machine have moved, either way
            reach.append(max(max(x - 1, 1 / x - 1) for x in (low, ratio, high)))
    if not ratios:
        missing = " and ".join(side for side, r in (("A", a), ("B", b)) if not set(YARDSTICK_ROWS) & set(r.samples))
        return MachineDrift({}, None, f"no machine yardstick in run {missing or 'A or B'} (stored before runs had "
                                      "one): the machine's own change between the runs is not accounted for")
    band = max(reach) if reach else None
    parts = [f"{label.split(' (')[0].removeprefix('Machine yardstick: ')} {_r(r)}"
             + (f" [{_r(lo)}, {_r(hi)}]" if lo is not None else "") for label, (r, lo, hi) in ratios.items()]
    text = ("machine: the fixed yardstick (work that is not the variant) took B/A " + ", ".join(parts)
            + (f"; timing verdicts must also clear ±{100 * band:.1f}%" if band is not None else
               "; one round, so its change is not known"))
    return MachineDrift(ratios, band, text)


def _present(row: Row, name: str) -> bool:
    e = row.cells.get(name)
    return e is not None and (e.value is not None or bool(e.problem))


def _variant(name: str, a: RunData, b: RunData, seed: int, drift: float | None = None) -> VariantChange:
    sa, sb = a.comparison.status.get(name), b.comparison.status.get(name)
    ids = dict(name=name, status_a=sa, status_b=sb, reason_a=a.comparison.reasons.get(name),
               reason_b=b.comparison.reasons.get(name))
    if sa != "ok" or sb != "ok":
        return VariantChange(**ids)
    rows_a = {r.key: r for r in a.comparison.rows if _present(r, name)}
    rows_b = {r.key: r for r in b.comparison.rows if _present(r, name)}
    metrics = []
    for key, ra in rows_a.items():
        rb = rows_b.get(key)
        if rb is None:
            continue
        if ra.kind in SAMPLED and key in a.samples and key in b.samples:
            in_a, in_b = a.samples[key], b.samples[key]
            m = judge_rounds(in_a.metric, in_a.rounds.get(name, {}), in_b.rounds.get(name, {}), key=key, seed=seed,
                             estimates=(ra.cells[name], rb.cells[name]), drift=None if key in YARDSTICK_ROWS else drift)
            dropped = tuple(f"run {side}: {s.problems[name]}" for side, s in (("A", in_a), ("B", in_b))
                            if name in s.problems)
            m = replace(m, label=ra.label, notes=m.notes + dropped)
        else:
            m = judge_exact(ra, rb, name)
        if rb.label != ra.label:
            m = replace(m, notes=m.notes + (f"run B calls it {rb.label!r}",))
        metrics.append(m)
    return VariantChange(**ids, metrics=tuple(metrics),
                         only_in_a=tuple(r.label for k, r in rows_a.items() if k not in rows_b),
                         only_in_b=tuple(r.label for k, r in rows_b.items() if k not in rows_a))


def compare_stored(store_a, run_a: str, store_b, run_b: str, *, force: bool = False) -> RunComparison:
    """Run B of store_b against run A of store_a (the same store twice is fine)."""
    store_a.run(run_a), store_b.run(run_b)     # an unknown id is named before either run is analysed
    return compare_runs(load_run(store_a, run_a), load_run(store_b, run_b), force=force)


# ------------------------------------------------------------------ the gate

_PERCENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(%?)")


def parse_threshold(text: str) -> float:
    """--fail-on-regression's argument as a fraction: a percent, its sign optional ("5%" and "5" are
    both 0.05). A bare number between 0 and 1 ("0.05") is refused: a fraction or a percent? Write 5% or 0.05%."""
    accepted = "a percent such as 5% or 5 (below 1, with its sign: 0.5%)"
    m = _PERCENT.fullmatch(text.strip())
    if m is None:
        raise VariantlabError(f"{text!r} is not a percent", field="--fail-on-regression", accepted=accepted)
    value = float(m.group(1))
    if not m.group(2) and 0 < value < 1:
        raise VariantlabError(f"{text!r} is ambiguous (a fraction or a percent?)", field="--fail-on-regression",
                              accepted=accepted)
    return value / 100


def regressions(rc: RunComparison, threshold: float) -> list[str]:
    """What fails the gate: each metric worse in B by more than `threshold` (a fraction) with a verdict,
    and each variant that ran in A and has no figures in B (it failed there, or run B never measured it:
    its status says which)."""
    out = []
    for v in rc.variants:
        if v.status_a == "ok" and v.status_b not in (None, "ok"):
            out.append(f"{v.name}: ran in A, {v.status_b} in B ({v.reason_b or 'no reason given'})")
        for m in v.metrics:
            worse = m.worse_by
            if worse is not None and worse > threshold:
                out.append(f"{v.name} {m.label}: {m.verdict_text()} ({_ratio_text(m)})")
    return out


def threshold_text(threshold: float) -> str:
    return f"{100 * threshold:g}%"


# ------------------------------------------------------------------ rendering

def _r(x: float) -> str:
    return f"{x:.3f}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"


def _ratio_text(m: MetricChange) -> str:
    if m.ratio is None:
        return "—"
    if m.low is None or m.high is None:
        return _r(m.ratio) + (" exact" if m.method == "exact" else "")
    return f"{_r(m.ratio)} [{_r(m.low)}, {_r(m.high)}]"


def shown_metrics(v: VariantChange, all_rows: bool) -> list[MetricChange]:
    """Every row (all_rows), else the headline rows in their order and every other row that changed."""
    if all_rows:
        return list(v.metrics)
    head = sorted((m for m in v.metrics if m.headline is not None), key=lambda m: (m.headline, m.key))
    return head + [m for m in v.metrics if m.headline is None and m.verdict in CHANGED]


def _status(status: str | None, reason: str | None, side: str) -> str:
    if status is None:
        return f"not in run {side}"
    return f"{status} in run {side}" + (f" ({reason})" if status != "ok" and reason else "")


def blocks(rc: RunComparison, threshold: float | None = None, all_rows: bool = False) -> list:
    """The comparison as text and tables (explain.render's blocks, which the CLI prints)."""
    from ..explain.render import Table, Text
    from ..report.format import fmt_estimate
    out = [Text(f"run B {rc.b['run']} ({rc.b['suite']}) against run A {rc.a['run']} ({rc.a['suite']})", 1)]
    if rc.environment:
        out.append(Text("warning: the environments differ (compared anyway, --force): " + "; ".join(rc.environment)))
    out += [Text(f"note: {n}") for n in rc.notes]
    if rc.machine is not None:
        out.append(Text(rc.machine.text))
    for v in rc.variants:
        if not v.compared:
            out.append(Text(f"{v.name}: {_status(v.status_a, v.reason_a, 'A')}, {_status(v.status_b, v.reason_b, 'B')}"
                            " — not compared"))
            continue
        shown = shown_metrics(v, all_rows)
        out.append(Text(v.name, 2))
        out.append(Table(("metric", "A", "B", f"B/A [{100 * rc.confidence:g}% CI]", "verdict"),
                         tuple((m.label, fmt_estimate(m.a, False, False), fmt_estimate(m.b, False, False),
                                _ratio_text(m), m.verdict_text()) for m in shown)))
        out += [Text(f"  {m.label}: no verdict: {m.reason}") for m in shown if m.verdict == "no verdict" and m.reason]
        out += [Text(f"  {m.label}: {n}") for m in shown for n in m.notes]
        for side, labels in (("A", v.only_in_a), ("B", v.only_in_b)):
            if labels:
                out.append(Text(f"  measured only in run {side}: {', '.join(labels)}"))
    out.append(Text(RULE + ("" if all_rows else "; shown: headline rows and every row that changed "
                                                 "(--all: every row)")))
    if threshold is not None:
        found = regressions(rc, threshold)
        gate = f"--fail-on-regression {threshold_text(threshold)}"
        out.append(Text(f"{len(found)} regression(s) beyond {threshold_text(threshold)} ({gate}):" if found
                        else f"no regression beyond {threshold_text(threshold)} ({gate})"))
        out += [Text(f"  {r}") for r in found]
    return out
