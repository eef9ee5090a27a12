"""A pick on thin evidence says so in its first line, with what would settle it (advise/evidence.py): one round,
a deciding difference not shown significant, no accuracy data; on hand-built comparisons."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from variantlab.advise.recommend import recommend
from variantlab.measure.analysis import Comparison
from variantlab.measure.runner import BenchResult
from variantlab.report.html import recommendation_html
from variantlab.report.markdown import report_markdown
from variantlab.suite import Requirements

from tests.advise.comparisons import SCENARIOS, comparison, delta, est, row, three_variants


def _rounds(c: Comparison, n: int) -> Comparison:
    return replace(c, rounds={v: {"ok": n, "failed": 0} for v in c.variants})


def _rec(c, suite_path=None, **req):
    return recommend(c, SCENARIOS, Requirements(**req), suite_path)


def codes(rec) -> list[str]:
    return [c.code for c in rec.caveats]


# ------------------------------------------------------------------ one round

def test_a_pick_measured_in_one_round_says_so_first_with_the_command_that_settles_it():
    rec = _rec(_rounds(three_variants(), 1), "suites/my suite.yaml", min_accuracy_retention=0.9, objective="latency")
    assert rec.pick == "int8" and codes(rec) == ["single_round"]
    first = rec.lines()[0]
    assert first.startswith("caution: the pick int8 rests on thin evidence: measured in 1 round, so "
                            "its differences in E2EL p95 [single-stream] have intervals but no verdict")
    assert "run `variantlab bench 'suites/my suite.yaml' --rounds 5` to get verdicts" in first
    assert rec.lines()[1].startswith("requirements: ") and rec.lines()[2].startswith("pick: int8")


def test_more_rounds_or_a_pick_on_facts_alone_carry_no_round_caveat():
    assert _rec(_rounds(three_variants(), 3), min_accuracy_retention=0.9, objective="latency").caveats == ()
    # model size and accuracy retention are measured once per variant: rounds do not bear on them
    rec = _rec(_rounds(three_variants(), 1), min_accuracy_retention=0.85, objective="size")
    assert rec.pick == "int4" and rec.caveats == () and rec.lines()[0].startswith("requirements: ")


# ------------------------------------------------------------------ not significant

def _two(bf16_delta, rounds=2) -> Comparison:
    """fp32 (the baseline) and bf16, both at full retention; bf16's p95 the lower point, by `bf16_delta`."""
    rows = [row("grading.accuracy_retention", "ratio", False,
                {"fp32": est(1.0, 1.0, 1.0, "ratio"), "bf16": est(1.0, 0.9, 1.1, "ratio")}, kind="versus",
                label="Accuracy retention"),
            row("single-stream.e2el_p95", "s", True, {"fp32": est(0.060, 0.040, 0.100), "bf16": est(0.050, 0.030,
                                                                                                       0.200)},
                {"fp32": None, "bf16": bf16_delta}, label="E2EL p95 [single-stream]")]
    return _rounds(comparison(rows, ("fp32", "bf16")), rounds)


def test_a_pick_whose_deciding_difference_is_not_significant_says_so_and_asks_for_more_rounds():
    rec = _rec(_two(delta(-16.7, -60.0, 90.0, False)), "s.yaml", objective="latency")
    assert rec.pick == "bf16" and codes(rec) == ["not_significant"]
    assert rec.lines()[0] == (
        "caution: the pick bf16 rests on thin evidence: the deciding difference, E2EL p95 [single-stream] -16.7% "
        "[-60.0, +90.0] for bf16 against fp32, is not significant: more rounds can settle it "
        "(`variantlab bench s.yaml --rounds 5`)")
    rec = _rec(_rounds(_two(delta(-16.7, -60.0, 90.0, False)), 5), "s.yaml", objective="latency")
    assert "--rounds 10" in rec.caveats[0].text                          # twice the rounds it had


def test_the_issues_case_one_round_and_a_delta_that_spans_zero_gets_both_caveats():
    # "+103.4% … not significant" and one round: the interval spans 0, and there is no verdict at all
    rec = _rec(_two(delta(103.4, -20.0, 230.0, None), rounds=1), objective="latency")
    assert rec.pick == "bf16" and codes(rec) == ["single_round", "not_significant"]
    assert "+103.4% [-20.0, +230.0] for bf16 against fp32, is not significant" in rec.lines()[0]
    assert "`variantlab bench SUITE.yaml --rounds 5`" in rec.lines()[0]   # no suite file known: its placeholder


def test_a_difference_shown_beyond_its_interval_carries_no_caveat():
    assert _rec(_two(delta(-16.7, -30.0, -5.0, True)), objective="latency").caveats == ()
    # int4 against int8: neither is the baseline, and their intervals do not overlap
    assert _rec(three_variants(), objective="latency").pick == "int4"
    assert _rec(three_variants(), objective="latency").caveats == ()


def test_a_tie_between_two_other_variants_is_told_by_their_intervals():
    c = three_variants(e2el={"bf16": (0.10, 0.09, 0.11), "int8": (0.06, 0.05, 0.07), "int4": (0.058, 0.05, 0.07)})
    rec = _rec(c, objective="e2el_p95")
    assert rec.pick == "int4" and codes(rec) == ["not_significant"]
    assert ("the deciding difference, E2EL p95 [single-stream] 58.00 ms [50.00 ms, 70.00 ms] for int4 against "
            "60.00 ms [50.00 ms, 70.00 ms] for int8, is not significant") in rec.lines()[0]


def test_a_pick_that_is_the_only_one_to_pass_rests_on_the_constraints_not_on_a_difference():
    rec = _rec(_two(delta(-16.7, -60.0, 90.0, False)), objective="latency", max_e2el_s={"p95": 0.15})
    assert rec.verdicts == {"fp32": "pass", "bf16": "not distinguishable"}   # bf16's [30, 200] ms straddles 150
    assert rec.pick == "fp32" and rec.caveats == ()


# ------------------------------------------------------------------ no accuracy

def _no_retention(why: str | None, kld=True) -> Comparison:
    c = three_variants()
    rows = [r for r in c.rows if r.key != "grading.accuracy_retention"]
    if why is not None:
        rows.insert(0, row("grading.accuracy_retention", "ratio", False,
                           {n: replace(est(None, unit="ratio"), problem=why) for n in c.variants}, kind="versus",
                           label="Accuracy retention"))
    if kld:
        kld_mean = {"bf16": est(0.0, unit="nats"), "int8": est(0.0012, unit="nats"), "int4": est(0.02, unit="nats")}
        rows.append(row("scoring.kld_mean", "nats", True, kld_mean, kind="versus", label="KLD mean (vs baseline)"))
    return replace(c, rows=tuple(rows))


def test_a_pick_with_no_accuracy_retention_says_why_and_what_would_settle_it():
    rec = _rec(_no_retention("the baseline answered no sample correctly"), objective="latency")
    assert rec.pick == "int4" and codes(rec) == ["no_accuracy"]
    assert rec.lines()[0] == (
        "caution: the pick int4 rests on thin evidence: no accuracy data: accuracy retention cannot be computed for "
        "int4 (the baseline answered no sample correctly) (only KLD 0.02 against bf16, which says how close its "
        "next-token distributions stay, not whether its answers are right): grade samples with answers the baseline "
        "gets right (a trained checkpoint, and workload.dataset.path: a JSONL of prompt and answer) to know what it "
        "loses")


def test_a_run_that_graded_nothing_says_so():
    rec = _rec(_no_retention(None, kld=False), objective="latency")
    assert codes(rec) == ["no_accuracy"]
    assert "no accuracy data: this run graded no answers (workload.accuracy.graded: 0): grade samples with " \
           "answers" in rec.lines()[0]


def test_the_baseline_as_the_pick_needs_no_accuracy_caveat():
    rec = _rec(_no_retention("the baseline answered no sample correctly"), objective="throughput")
    assert rec.pick == "bf16" and rec.caveats == ()


# ------------------------------------------------------------------ where it shows

def test_the_caveats_lead_the_json_report_md_and_the_html_page():
    rec = _rec(_no_retention("the baseline answered no sample correctly"), objective="latency")
    data = json.loads(json.dumps(rec.to_json(), allow_nan=False))
    assert [c["code"] for c in data["caveats"]] == ["no_accuracy"]
    assert data["caveats"][0]["text"].startswith("no accuracy data: accuracy retention cannot be computed")
    assert data["lines"][0].startswith("caution: the pick int4 rests on thin evidence: no accuracy data")
    result = BenchResult("r1", "s", Path("."), Path("s.sqlite"), {"rounds": 1}, three_variants(), recommendation=rec)
    section = report_markdown(result).split("## Recommendation\n\n", 1)[1]
    assert section.startswith("- caution: the pick int4 rests on thin evidence: no accuracy data")
    assert recommendation_html(data).startswith('<div class="recommendation">caution: the pick int4 rests on thin')
