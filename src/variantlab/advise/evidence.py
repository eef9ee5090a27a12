"""How thin the evidence under a pick is: the caveats a recommendation leads with, each saying what would settle it.

A pick can rest on
- one round (`single_round`): the timed rows it read were measured in one fresh process per variant, so
  their differences carry the drift from one process to the next and get intervals but no verdict;
  more rounds settle it (`--resume` cannot add rounds: it finishes a run as it was planned);
- a difference not shown significant (`not_significant`): on no metric of the objective is the pick better
  than the runner-up (the best other variant that passes) beyond the interval. Against the baseline that is
  the paired delta's interval; between two other variants, their own intervals. More rounds settle it;
- no accuracy (`no_accuracy`): the pick, if it is not the baseline, has no accuracy retention. Either the run
  graded no answers, or retention cannot be computed (the baseline answered no sample right, as an
  untrained or random-weight model does). KLD says only how close the next-token distributions stay.
  Graded samples with answers settle it.
Pure: a comparison and what the recommendation read in, frozen `Caveat`s out.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..measure.analysis import Comparison, Row
from ..report.format import fmt_estimate, fmt_value
from .pareto import better

SINGLE_ROUND, NOT_SIGNIFICANT, NO_ACCURACY = "single_round", "not_significant", "no_accuracy"
ROUNDS_FOR_VERDICTS = 5      # what analysis's one-round warning asks for
TIMED_KINDS = ("samples", "process")


@dataclass(frozen=True)
class Caveat:
    code: str        # single_round | not_significant | no_accuracy
    text: str        # one line, no semicolon: what is thin, then what would settle it

    def to_json(self) -> dict:
        return {"code": self.code, "text": self.text}


@dataclass(frozen=True)
class Decision:
    """What a pick was decided on, as recommend found it."""

    pick: str
    runner_up: str | None                   # the best other variant that passes (None: the pick alone passes)
    objective: dict[str, tuple[Row | None, bool | None]]   # metric name → (its row, lower is better)
    constraint_rows: tuple[Row, ...]        # the rows the requirements read
    retention: Row | None = None            # the accuracy retention row, None when the run has none
    kld: Row | None = None                  # the KLD mean row, None when the run has none
    suite_path: str | None = None           # the suite file the run came from, for the command that settles it


def caveats(comparison: Comparison, decision: Decision) -> tuple[Caveat, ...]:
    """The caveats of `decision` on `comparison`, in the order: rounds, significance, accuracy."""
    found = [_single_round(comparison, decision), _not_significant(comparison, decision),
             _no_accuracy(comparison, decision)]
    return tuple(c for c in found if c is not None)


def _bench(d: Decision, rounds: int) -> str:
    suite = shlex.quote(d.suite_path) if d.suite_path else "SUITE.yaml"
    return f"`variantlab bench {suite} --rounds {rounds}`"


def _rounds(comparison: Comparison) -> int | None:
    """The fewest rounds any measured variant got; None when the comparison does not say (stored before it did)."""
    got = [comparison.rounds[n].get("ok", 0) for n in comparison.variants
           if comparison.status.get(n) == "ok" and n in comparison.rounds]
    return min(got) if got else None


def _single_round(comparison: Comparison, d: Decision) -> Caveat | None:
    rounds = _rounds(comparison)
    read = [row for row, _ in d.objective.values() if row is not None] + list(d.constraint_rows)
    timed = list(dict.fromkeys(r.label for r in read if r.kind in TIMED_KINDS))
    if rounds is None or rounds >= 2 or not timed:
        return None
    which = " and ".join(filter(None, (", ".join(timed[:-1]), timed[-1])))
    return Caveat(SINGLE_ROUND, f"measured in {rounds} round, so its differences in {which} have intervals but no "
                                f"verdict (the drift from one process to the next is not controlled): run "
                                f"{_bench(d, ROUNDS_FOR_VERDICTS)} to get verdicts")


def _shown_better(row: Row, lower: bool, pick: str, other: str, baseline: str) -> bool | None:
    """Whether `pick` is better than `other` on `row` beyond the interval; None when one has no figure."""
    a, b = row.cells.get(pick), row.cells.get(other)
    if a is None or b is None or a.value is None or b.value is None:
        return None
    if baseline in (pick, other):
        v = pick if other == baseline else other
        delta = row.deltas.get(v)
        if delta is not None and delta.pct is not None and delta.low is not None and delta.high is not None:
            if delta.significant is False:
                return False
            v_better = delta.high < 0 if lower else delta.low > 0
            v_worse = delta.low > 0 if lower else delta.high < 0
            return v_better if v == pick else v_worse
    return better((a.value, a.low, a.high), (b.value, b.low, b.high), lower)


def _difference(row: Row, pick: str, other: str, baseline: str) -> str:
    """"E2EL p95 [single-stream] +103.4% [-20.0, +230.0] for bf16 against fp32", or the two figures."""
    if baseline in (pick, other):
        v = pick if other == baseline else other
        delta = row.deltas.get(v)
        if delta is not None and delta.pct is not None:
            interval = (f" [{delta.low:+.1f}, {delta.high:+.1f}]"
                        if delta.low is not None and delta.high is not None else "")
            who = f"{v} against {baseline}" if v == pick else f"{v} against the pick, {baseline}"
            return f"{row.label} {delta.pct:+.1f}%{interval} for {who}"
    return (f"{row.label} {fmt_estimate(row.cells[pick], check_stability=False)} for {pick} against "
            f"{fmt_estimate(row.cells[other], check_stability=False)} for {other}")


def _not_significant(comparison: Comparison, d: Decision) -> Caveat | None:
    if d.runner_up is None:
        return None
    judged = [(row, _shown_better(row, lower, d.pick, d.runner_up, comparison.baseline))
              for row, lower in d.objective.values() if row is not None]
    judged = [(row, shown) for row, shown in judged if shown is not None]
    if not judged or any(shown for _, shown in judged):
        return None
    rounds = _rounds(comparison)
    more = max(ROUNDS_FOR_VERDICTS, 2 * rounds) if rounds else ROUNDS_FOR_VERDICTS
    diffs = " and ".join(_difference(row, d.pick, d.runner_up, comparison.baseline) for row, _ in judged)
    return Caveat(NOT_SIGNIFICANT, f"the deciding difference, {diffs}, is not significant: more rounds can settle "
                                   f"it ({_bench(d, more)})")


def _no_accuracy(comparison: Comparison, d: Decision) -> Caveat | None:
    if d.pick == comparison.baseline:
        return None          # the reference keeps its own accuracy by definition
    kld = d.kld.cells.get(d.pick) if d.kld is not None else None
    proxy = (f" (only KLD {fmt_value(kld.value, kld.unit)} against {comparison.baseline}, which says how close its "
             f"next-token distributions stay, not whether its answers are right)"
             if kld is not None and kld.value is not None else "")
    if d.retention is None:
        return Caveat(NO_ACCURACY, f"no accuracy data: this run graded no answers (workload.accuracy.graded: 0)"
                                   f"{proxy}: grade samples with answers (workload.accuracy.graded above 0, over a "
                                   f"dataset whose samples carry an 'answer') to know what {d.pick} loses")
    cell = d.retention.cells.get(d.pick)
    if cell is not None and cell.value is not None:
        return None
    why = (cell.problem if cell is not None else None) or "not measured"
    return Caveat(NO_ACCURACY, f"no accuracy data: accuracy retention cannot be computed for {d.pick} ({why})"
                               f"{proxy}: grade samples with answers the baseline gets right (a trained checkpoint, "
                               f"and workload.dataset.path: a JSONL of prompt and answer) to know what it loses")
