"""The analysis's two tables of guesses, filled with a run's measurements.

- The selection matrix: for each preset, the variant the measurements pick (advise/recommend.py),
  its accuracy loss (1 − retention, with its interval; or KLD when the run graded nothing) and its
  speedup against the run's baseline in each timed scenario, beside the analysis's guessed scheme,
  loss and speedup. Speedup = baseline time ÷ variant time, from the row's paired delta.
- The attention guideline: from a length sweep, per phase (prefill, per-token decode), which attention
  kind is fastest at each swept length, and where each variant with another attention than the
  baseline's crosses it (its first length from which it is faster, significantly, to the end). It is
  judged against a variant of its own recipe with the baseline's attention when the run has one (the
  difference is then attention's alone; by the two cells' intervals), else against the baseline.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..measure.build_summary import BuildSummary
from ..measure.scenarios import SCENARIOS
from .constraints import swept_lengths
from .objectives import Scenarios
from .presets import PRESETS
from .recommend import recommend

# the row that stands for "how long it takes" in each timed scenario type
SCENARIO_TIME_ROW = {kind: cls.time_row for kind, cls in SCENARIOS.items() if cls.time_row}   # type → its time row
ANALYSIS_GUIDELINE = ("short (<512 tokens): standard attention; medium (512–2048): GQA; long (>2048): linear; "
                      "real-time: sliding window")


@dataclass(frozen=True)
class MatrixRow:
    preset: str
    pick: str | None
    why_none: str | None
    loss: str                       # "0.0% [0.0, 1.6]" or "KLD 0.003"
    speedups: dict[str, str]        # scenario → "1.42× [1.30, 1.55]"
    analysis: tuple[str, str, str]  # scheme, loss, speedup as guessed

    def line(self) -> str:
        """"balanced: int8 — accuracy loss 1.6% [0.0, 4.7]; speedup single-stream 1.42× [1.30, 1.55], …"."""
        guess = ", ".join(x for x in self.analysis if x)
        if self.pick is None:
            return f"{self.preset}: none passes ({self.why_none}) (analysis: {guess})"
        speed = ", ".join(f"{sc} {x}" for sc, x in self.speedups.items()) or "no timed scenario"
        return f"{self.preset}: {self.pick} — accuracy loss {self.loss}; speedup {speed} (analysis: {guess})"

    def to_json(self) -> dict:
        return {"preset": self.preset, "pick": self.pick, "why_none": self.why_none, "accuracy_loss": self.loss,
                "speedup": self.speedups, "analysis": dict(zip(("scheme", "accuracy_loss", "speedup"), self.analysis))}


def selection_matrix(comparison, scenarios: list[dict]) -> list[MatrixRow]:
    """One row per preset: what this run's measurements pick under it."""
    from ..suite import Requirements
    timed = [(s.get("name") or s["type"], SCENARIO_TIME_ROW[s["type"]]) for s in scenarios
             if s["type"] in SCENARIO_TIME_ROW]
    rows = {r.key: r for r in comparison.rows}
    out = []
    for name, preset in PRESETS.items():
        rec = recommend(comparison, scenarios, Requirements(preset=name))
        pick = rec.pick
        speedups = {sc: _speedup(rows.get(f"{sc}.{key}"), pick, comparison.baseline) for sc, key in timed}
        why_none = None if pick else (f"closest: {rec.closest}; binding: {rec.binding}" if rec.closest
                                      else rec.reason)
        out.append(MatrixRow(name, pick, why_none, _loss(rows, pick),
                             speedups, (preset.analysis_scheme, preset.analysis_loss, preset.analysis_speedup)))
    return out


def _loss(rows, pick: str | None) -> str:
    if pick is None:
        return "—"
    r = rows.get("grading.accuracy_retention")
    cell = r.cells.get(pick) if r is not None else None
    if cell is not None and cell.value is not None:
        text = f"{100 * (1 - cell.value):.1f}%"
        if cell.low is not None and cell.high is not None:
            text += f" [{100 * (1 - cell.high):.1f}, {100 * (1 - cell.low):.1f}]"
        return text
    k = rows.get("scoring.kld_mean")
    cell = k.cells.get(pick) if k is not None else None
    return f"KLD {cell.value:.3g}" if cell is not None and cell.value is not None else "not measured"


def _speedup(row, pick: str | None, baseline: str) -> str:
    if row is None or pick is None:
        return "—"
    if pick == baseline:
        return "1× (the baseline)"
    d = row.deltas.get(pick)
    if d is None or d.pct is None or d.pct <= -100:
        return "—"
    text = f"{1 / (1 + d.pct / 100):.2f}×"
    if d.significant is False:   # its interval spans 1×: the figure is a guess, and says so
        return text + " n.s."
    if d.low is not None and d.high is not None and d.high > -100:   # a time ratio's interval, inverted
        upper = f"{1 / (1 + d.low / 100):.2f}" if d.low > -100 else "∞"
        text += f" [{1 / (1 + d.high / 100):.2f}, {upper}]"
    return text


# ------------------------------------------------------------------ attention

@dataclass(frozen=True)
class Crossover:
    variant: str
    attention: str
    phase: str                     # prefill | decode
    per_length: dict[int, str]     # length → "+12.0%" / "-40.1%" / "+3.0% n.s." against the baseline
    from_length: int | None        # faster (significantly) from here on; None: not within the sweep
    text: str

    def to_json(self) -> dict:
        return {"variant": self.variant, "attention": self.attention, "phase": self.phase,
                "per_length": {str(k): v for k, v in self.per_length.items()}, "from_length": self.from_length,
                "text": self.text}


def attention_of(comparison, name: str) -> str:
    return (comparison.builds.get(name) or BuildSummary()).attention or "sdpa"


def attention_guideline(comparison, scenarios: list[dict]) -> tuple[list[str], list[Crossover]]:
    """The fastest attention kind per swept length and phase, and each crossover against the baseline;
    ([], []) when the run has no length sweep."""
    sweeps = Scenarios.of(scenarios).lengths
    lines: list[str] = []
    crossovers: list[Crossover] = []
    rows = {r.key: r for r in comparison.rows}
    ran = [n for n in comparison.variants if comparison.status.get(n) == "ok"]
    base = comparison.baseline
    for sweep in sweeps:
        lengths = swept_lengths(comparison, sweep)
        for phase in ("prefill", "decode"):
            fastest = []
            for n in lengths:
                row = rows[f"{sweep}.{phase}_{n}"]
                timed = [(c.value, v) for v in ran if (c := row.cells.get(v)) is not None and c.value is not None]
                if timed:
                    value, v = min(timed)
                    fastest.append(f"{n}: {attention_of(comparison, v)} ({v})")
            if fastest:
                lines.append(f"fastest {phase} by length [{sweep}]: " + "; ".join(fastest))
            for v in ran:
                if v == base or attention_of(comparison, v) == attention_of(comparison, base):
                    continue
                ref = sibling(comparison, v, ran)
                crossovers.append(_crossover(rows, sweep, phase, lengths, v, ref, attention_of(comparison, v),
                                             attention_of(comparison, ref), paired=ref == base))
    lines += [c.text for c in crossovers]
    return lines, crossovers


def sibling(comparison, v: str, ran: list[str]) -> str:
    """What `v`'s attention is judged against: a variant of the same recipe and dtype with the baseline's
    attention when the run has one (so that the difference is attention's alone, not its quantization's),
    else the baseline."""
    base = comparison.baseline
    mine = comparison.builds.get(v) or BuildSummary()
    for other in [base] + [n for n in ran if n != base]:
        theirs = comparison.builds.get(other) or BuildSummary()
        if (other != v and attention_of(comparison, other) == attention_of(comparison, base)
                and (theirs.recipe, theirs.dtype) == (mine.recipe, mine.dtype)):
            return other
    return base


def _versus(row, v: str, ref: str, paired: bool) -> tuple[float | None, bool | None]:
    """(v against ref in %, whether it is a real difference): the paired delta against the baseline, else the
    two cells' intervals (a difference only when they do not overlap: unpaired, so conservative)."""
    if paired:
        d = row.deltas.get(v)
        return (None, None) if d is None or d.pct is None else (d.pct, d.significant)
    a, b = row.cells.get(v), row.cells.get(ref)
    if a is None or b is None or a.value is None or b.value is None or not b.value:
        return None, None
    pct = 100 * (a.value / b.value - 1)
    if None in (a.low, a.high, b.low, b.high):
        return pct, None
    return pct, bool(a.high < b.low or a.low > b.high)


def _crossover(rows, sweep: str, phase: str, lengths: list[int], v: str, base: str, kind: str,
               base_kind: str, paired: bool = True) -> Crossover:
    per_length, faster = {}, {}
    for n in lengths:
        pct, significant = _versus(rows[f"{sweep}.{phase}_{n}"], v, base, paired)
        if pct is None:
            per_length[n] = "—"
            faster[n] = False
            continue
        per_length[n] = f"{pct:+.1f}%" + (" n.s." if significant is False else "")
        faster[n] = pct < 0 and significant is not False
    start = None
    for i, n in enumerate(lengths):
        if all(faster[m] for m in lengths[i:]):
            start = n
            break
    where = ", ".join(f"{per_length[n]} @{n}" for n in lengths)
    if start == lengths[0]:
        verdict = "faster at every swept length"
    elif start is not None:
        before = lengths[lengths.index(start) - 1]
        verdict = f"faster from {start} tokens on (the crossover lies between {before} and {start})"
    else:
        verdict = "not faster at the longest swept length" if not faster[lengths[-1]] else "not faster throughout"
    same = "" if paired else ", the same recipe: attention's share alone"
    text = f"{v} ({kind}) {phase} against {base} ({base_kind}{same}): {where}: {verdict}"
    return Crossover(v, kind, phase, per_length, start, text)
