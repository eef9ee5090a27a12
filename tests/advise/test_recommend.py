"""The recommendation on hand-built comparisons: the pick and its reason, ties, near misses, nothing passing,
failed variants, the front; the selection matrix and the attention guideline."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from variantlab.advise.constraints import FAIL, PASS, UNDECIDED
from variantlab.advise.matrix import attention_guideline, selection_matrix
from variantlab.advise.recommend import (NOT_MEASURED, NOT_RUN, load_requirements, recommend, shown_suite_path,
                                         stored_requirements)
from variantlab.measure.analysis import NOT_MEASURED_INTERRUPTED, NOT_REACHED
from variantlab.errors import SuiteError
from variantlab.suite import Requirements

from tests.advise.comparisons import SCENARIOS, comparison, delta, est, row, three_variants


def _rec(c=None, **req):
    return recommend(c or three_variants(), SCENARIOS, Requirements(**req))


def test_the_pick_is_the_objectives_best_among_those_that_pass_with_its_reason():
    rec = _rec(min_accuracy_retention=0.9, objective="latency")
    assert rec.verdicts == {"bf16": PASS, "int8": PASS, "int4": UNDECIDED}     # int4's [0.85, 0.94] straddles 0.9
    assert rec.pick == "int8"
    assert "meets Accuracy retention ≥ 0.9000" in rec.reason
    assert "lowest E2EL p95 among the 2 that pass" in rec.reason
    assert "40.0% [37.0, 43.0] below bf16" in rec.reason
    assert any(line.startswith("undecided: int4") for line in rec.lines())


def test_each_variant_that_fails_says_which_constraint_and_by_how_much():
    rec = _rec(min_accuracy_retention=0.97, min_output_throughput=280)
    assert rec.verdicts["int4"] == FAIL
    misses = [line for line in rec.lines() if line.startswith("miss: int4")][0]
    assert "Accuracy retention ≥ 0.9700" in misses and "Output throughput [offline] ≥ 280.0 tok/s" in misses
    assert "10.7% short of the limit" in misses        # 250 tok/s against 280


def test_nothing_passes_still_names_the_closest_and_the_binding_constraint():
    rec = _rec(max_e2el_s={"p95": 0.01}, max_model_size_mib=1.0)
    assert rec.pick is None and rec.closest == "int4"   # the smallest worst miss (400% on latency)
    assert rec.binding == "E2EL p95 [single-stream] ≤ 10.00 ms"
    assert "3 of 3 variants miss it" in rec.reason
    assert rec.lines()[1].startswith("no pick — no variant meets every requirement. Closest: int4")


def test_when_only_intervals_stand_in_the_way_it_says_more_rounds_can_decide():
    rec = _rec(min_accuracy_retention=0.99, max_e2el_s={"p95": 0.07})
    assert rec.verdicts == {"bf16": FAIL, "int8": UNDECIDED, "int4": FAIL}
    assert rec.pick is None and rec.closest == "int8"
    assert "more rounds or samples can decide" in rec.reason


def test_a_tie_on_the_objective_is_said():
    c = three_variants(e2el={"bf16": (0.10, 0.09, 0.11), "int8": (0.06, 0.05, 0.07), "int4": (0.058, 0.05, 0.07)})
    rec = _rec(c, objective="e2el_p95")
    assert rec.pick == "int4" and "does not tell it apart on the objective from int8" in rec.reason


def test_weights_trade_metrics_off_by_their_log_ratios():
    # int8: latency 0.6× and throughput 0.33× of bf16; with throughput weighted heavily bf16 wins
    assert _rec(objective={"e2el_p95": 1, "throughput": 3}).pick == "bf16"
    assert _rec(objective={"e2el_p95": 3, "throughput": 1}).pick == "int4"


def test_a_variant_that_failed_to_run_is_listed_apart_and_never_picked():
    c = three_variants(status={"bf16": "ok", "int8": "ok", "int4": "failed"})
    rec = _rec(c, objective="latency")
    assert rec.verdicts["int4"] == NOT_RUN and rec.pick == "int8"
    assert "failed to run: int4: failed: it broke" in rec.lines()
    assert "int4" not in rec.front


def test_a_variant_the_run_never_measured_is_not_considered_nor_called_failed():
    """Issue 49: the run was interrupted before int4; it is said to be not measured, with why."""
    c = three_variants(status={"bf16": "ok", "int8": "ok", "int4": NOT_MEASURED_INTERRUPTED})
    c = replace(c, reasons=c.reasons | {"int4": "the run was interrupted before its build"})
    rec = _rec(c, objective="latency")
    assert rec.verdicts["int4"] == NOT_MEASURED and rec.pick == "int8" and "int4" not in rec.front
    assert rec.failed == {} and rec.not_measured == {"int4": "the run was interrupted before its build"}
    assert "not measured: int4: the run was interrupted before its build" in rec.lines()
    assert not any("fail" in line and "int4" in line for line in rec.lines())
    assert rec.to_json()["not_measured"] == rec.not_measured


def test_when_no_variant_was_measured_it_says_why_each_was_not():
    c = three_variants(status={"bf16": "failed", "int8": NOT_REACHED, "int4": NOT_REACHED})
    c = replace(c, reasons=c.reasons | {n: "the run ended before its build" for n in ("int8", "int4")})
    rec = _rec(c)
    assert rec.pick is None and rec.failed == {"bf16": "failed: it broke"}
    assert rec.reason == ("no variant ran: bf16 failed: it broke; int8 not measured (the run ended before its build); "
                          "int4 not measured (the run ended before its build)")


def test_the_front_and_the_json_are_finite_and_complete():
    rec = _rec(min_accuracy_retention=0.9)
    assert rec.front == ("bf16", "int8", "int4")        # each wins on one dimension beyond the intervals
    data = json.loads(json.dumps(rec.to_json(), allow_nan=False))
    assert data["schema"] == "variantlab.recommendation/1"
    assert [d["key"] for d in data["dimensions"]] == ["grading.accuracy_retention", "single-stream.e2el_p95",
                                                      "offline.output_throughput"]
    assert data["lines"] == rec.lines() and data["pick"] == "int8"


def test_a_constraint_the_run_cannot_judge_is_a_note_not_a_failure():
    rec = _rec(max_kld=0.05, objective="latency")
    assert rec.pick == "int4" and any("KLD" in n and "no such row" in n for n in rec.notes)


def test_no_rows_at_all_still_answers():
    c = comparison([row("facts.model_size", "B", True, {"a": est(1.0, unit="B"), "b": est(None, unit="B")},
                        kind="fact")], ("a", "b"))
    rec = recommend(c, SCENARIOS, Requirements())
    assert rec.pick == "a" and rec.lines()


def test_stored_requirements_of_older_runs_are_renamed():
    old = {"max_e2el_p95_s": 0.5, "max_ttft_p95_s": None, "max_peak_memory_mb": 1000, "max_kld": None, "slo": {}}
    new = Requirements.model_validate(stored_requirements(old))
    assert new.max_e2el_s == {"p95": 0.5} and new.max_peak_memory_mib == pytest.approx(953.67, rel=1e-4)


# ------------------------------------------------------------------ the matrix and the attention guideline

def test_the_selection_matrix_has_one_measured_row_per_preset():
    matrix = selection_matrix(three_variants(), SCENARIOS)
    by = {m.preset: m for m in matrix}
    assert by["extreme-compression"].pick == "int4"        # retention 0.90 ≥ 0.85; the smallest
    assert by["high-precision"].pick == "bf16"             # int8's 0.98 [0.95, 1.0] cannot show ≥ 0.99
    assert by["high-precision"].speedups["single-stream"] == "1× (the baseline)"
    assert by["extreme-compression"].loss == "10.0% [6.0, 15.0]"
    assert by["extreme-compression"].speedups["single-stream"].startswith("2.00×")
    assert "INT8 symmetric" in by["balanced"].line()


def _sweep():
    lengths = (128, 512, 2048)
    base = {128: 0.010, 512: 0.012, 2048: 0.020}
    lin = {128: 0.013, 512: 0.0121, 2048: 0.011}
    rows = []
    for n in lengths:
        pct = 100 * (lin[n] - base[n]) / base[n]
        sig = abs(pct) > 5
        for phase in ("prefill", "decode"):
            rows.append(row(f"length-sweep.{phase}_{n}", "s", True,
                            {"bf16": est(base[n], base[n] * 0.98, base[n] * 1.02),
                             "flash": est(lin[n], lin[n] * 0.98, lin[n] * 1.02)},
                            {"bf16": None, "flash": delta(pct, pct - 2, pct + 2, sig)}))
    builds = {"bf16": {"attention": "sdpa"}, "flash": {"attention": "linear"}}
    return comparison(rows, ("bf16", "flash"), builds=builds)


def test_the_attention_guideline_finds_the_crossover_length():
    lines, crossovers = attention_guideline(_sweep(), [{"type": "length-sweep"}])
    decode = [c for c in crossovers if c.phase == "decode"][0]
    assert decode.from_length == 2048 and "between 512 and 2048" in decode.text
    assert decode.per_length[512] == "+0.8% n.s."
    assert any(line.startswith("fastest decode by length [length-sweep]: 128: sdpa (bf16)") and
               "2048: linear (flash)" in line for line in lines)
    assert attention_guideline(three_variants(), SCENARIOS) == ([], [])


def test_attention_is_judged_against_its_own_recipe_when_the_run_has_it():
    """flash (w4a8 + linear) is 3x slower than bf16 at 2048 because of its quantization; against flash-quant
    (w4a8, the baseline's attention) linear attention is what makes it faster there."""
    times = {"bf16": {128: 0.010, 2048: 0.020}, "flash-quant": {128: 0.030, 2048: 0.080},
             "flash": {128: 0.031, 2048: 0.060}}
    rows = []
    for n in (128, 2048):
        cells = {v: est(t[n], t[n] * 0.97, t[n] * 1.03) for v, t in times.items()}
        deltas = {v: None if v == "bf16" else delta(100 * (t[n] / times["bf16"][n] - 1), 0, 0, True)
                  for v, t in times.items()}
        rows += [row(f"length-sweep.{phase}_{n}", "s", True, cells, deltas) for phase in ("prefill", "decode")]
    builds = {"bf16": {"attention": "sdpa", "recipe": "bf16", "dtype": "bf16"},
              "flash-quant": {"attention": "sdpa", "recipe": "w4a8", "dtype": "bf16"},
              "flash": {"attention": "linear", "recipe": "w4a8", "dtype": "bf16"}}
    c = comparison(rows, ("bf16", "flash-quant", "flash"), builds=builds)
    x = [c for c in attention_guideline(c, [{"type": "length-sweep"}])[1] if c.phase == "prefill"][0]
    assert "against flash-quant (sdpa, the same recipe" in x.text
    assert x.per_length == {128: "+3.3% n.s.", 2048: "-25.0%"} and x.from_length == 2048


def test_a_speedup_interval_that_reaches_minus_100_percent_is_open_ended():
    from variantlab.advise.matrix import _speedup
    r = row("single-stream.e2el_p50", "s", True, {"a": est(1.0), "b": est(0.5)}, {"a": None,
                                                                                 "b": delta(-50, -100, -10, True)})
    assert _speedup(r, "b", "a") == "2.00× [1.11, ∞]"


def test_a_figure_a_variant_lacks_on_a_row_the_run_has_blocks_a_pass():
    c = three_variants()
    rows = list(c.rows)
    rows[0] = row("grading.accuracy_retention", "ratio", False,
                  {"bf16": est(None, unit="ratio"), "int8": est(None, unit="ratio"), "int4": est(None, unit="ratio")},
                  kind="versus", label="Accuracy retention")
    c = comparison(rows, c.variants)
    rec = recommend(c, SCENARIOS, Requirements(min_accuracy_retention=0.9))
    assert rec.pick is None and set(rec.verdicts.values()) == {UNDECIDED}
    assert "the run has no figure to judge it by" in rec.reason
    assert [n for n in rec.notes if "not measured for any variant" in n]


# ---------------------------------------------------------------- requirements files

STORED_SUITE = {"model": "builtin:tiny-structured", "variants": [{"name": "fp32"}]}


def test_a_requirements_file_loads_with_or_without_its_block(tmp_path):
    path = tmp_path / "req.yaml"
    path.write_text("requirements:\n  max_kld: 0.1\n", encoding="utf-8")
    assert load_requirements(path, STORED_SUITE).max_kld == 0.1
    path.write_text("max_kld: 0.2\npreset: balanced\n", encoding="utf-8")
    assert load_requirements(path, STORED_SUITE).max_kld == 0.2


def test_a_key_given_twice_in_a_requirements_file_is_an_error_with_its_line(tmp_path):
    """yaml.safe_load kept the last max_kld silently; the suite's loader refuses it (issue 13)."""
    path = tmp_path / "req.yaml"
    path.write_text("max_kld: 0.1\nobjective: latency\nmax_kld: 5\n", encoding="utf-8")
    with pytest.raises(SuiteError) as caught:
        load_requirements(path, STORED_SUITE)
    text = str(caught.value)
    assert "\n" not in text and str(path) in text
    assert "the key 'max_kld' appears twice" in text and "line 3, column 1" in text


def test_a_malformed_requirements_file_says_where(tmp_path):
    path = tmp_path / "req.yaml"
    path.write_text("max_kld: [0.1\n", encoding="utf-8")
    with pytest.raises(SuiteError, match="malformed YAML") as caught:
        load_requirements(path, STORED_SUITE)
    assert caught.value.field.startswith("line ")


def test_a_caveats_suite_path_reads_the_same_from_bench_and_from_show(tmp_path, monkeypatch):
    """bench stores the suite's absolute path; the caveat's command names it relative to the working folder
    when it lies under it, whether it came from the command line (relative) or the store (absolute)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "suite.yaml").write_text("name: t\n")
    monkeypatch.chdir(tmp_path)
    assert shown_suite_path("a/suite.yaml") == shown_suite_path(tmp_path / "a" / "suite.yaml") == "a/suite.yaml"
    monkeypatch.chdir(tmp_path / "a")
    assert shown_suite_path(tmp_path / "a" / "suite.yaml") == "suite.yaml"
    elsewhere = tmp_path / "b"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert shown_suite_path(tmp_path / "a" / "suite.yaml") == str((tmp_path / "a" / "suite.yaml").resolve())
    assert shown_suite_path(tmp_path / "gone.yaml") is None and shown_suite_path(None) is None
