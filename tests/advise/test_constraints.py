"""Constraints judged with their intervals: pass, fail with its margin, not distinguishable, not measured."""
from __future__ import annotations

import pytest

from variantlab.advise.constraints import (FAIL, PASS, UNDECIDED, UNMEASURED, Constraint, constraints_of, judge,
                                           range_coverage)
from variantlab.advise.objectives import Scenarios
from variantlab.suite import Requirements

from tests.advise.comparisons import SCENARIOS, comparison, est, row, three_variants

LIMIT = Constraint("max_e2el_s.p95", "E2EL p95", "single-stream.e2el_p95", "<=", 0.5, "s")


@pytest.mark.parametrize("cell, status", [
    (est(0.40, 0.38, 0.42), PASS),
    (est(0.60, 0.55, 0.65), FAIL),
    (est(0.48, 0.45, 0.52), UNDECIDED),     # the interval straddles the limit: neither pass nor fail
    (est(0.50), PASS),                      # exact figure on the limit meets it
    (est(0.51), FAIL),
    (None, UNMEASURED),
    (est(None), UNMEASURED),
])
def test_a_limit_is_judged_on_the_whole_interval(cell, status):
    assert judge(LIMIT, cell).status == status


def test_a_miss_says_by_how_much():
    j = judge(LIMIT, est(0.60, 0.55, 0.65))
    assert j.miss == pytest.approx(0.2)
    assert "20.0% past the limit" in j.text() and "600.00 ms" in j.text()
    low = Constraint("min_accuracy_retention", "retention", "grading.accuracy_retention", ">=", 0.98, "ratio")
    assert judge(low, est(0.90, 0.85, 0.94, unit="ratio")).miss == pytest.approx(0.08 / 0.98)
    assert judge(low, est(0.99, 0.97, 1.0, unit="ratio")).status == UNDECIDED


def test_a_length_the_deployment_must_serve_fails_when_the_variant_has_no_figure_there():
    runs = Constraint("sequence_length.decode", "Decode @2048", "sweep.decode_2048", "runs", 0.0, "s")
    failed = judge(runs, est(None))
    assert failed.status == FAIL and failed.miss is None and "fails runs" in failed.text()
    assert judge(runs, est(0.01, 0.009, 0.011)).status == PASS


def test_requirements_become_constraints_on_the_runs_rows():
    c = three_variants()
    req = Requirements(min_accuracy_retention=0.97, max_e2el_s={"p95": 0.08}, min_output_throughput=200,
                       max_model_size_mib=1.5, max_kld=0.1)
    cons = {k.name: k for k in constraints_of(req, c, Scenarios.of(SCENARIOS, req))}
    assert cons["max_e2el_s.p95"].row_key == "single-stream.e2el_p95"
    assert cons["min_output_throughput"].row_key == "offline.output_throughput"
    assert cons["max_model_size_mib"].limit == 1.5 * 2**20
    assert cons["max_kld"].row_key is None          # this run scored nothing: judged "not measured"


def _sweep_comparison(decode_2048_int4=None):
    cells = lambda v: {"bf16": est(v, v * 0.9, v * 1.1), "int4": est(v * 2, v * 1.8, v * 2.2)}
    rows = [row(f"sweep.{p}_{n}", "s", True, cells(0.01 * n / 128)) for n in (128, 512, 2048)
            for p in ("prefill", "decode")]
    if decode_2048_int4 is not None:
        rows[-1] = row("sweep.decode_2048", "s", True, {"bf16": est(0.16, 0.15, 0.17), "int4": decode_2048_int4})
    return comparison(rows, ("bf16", "int4"))


def test_a_sequence_range_judges_every_swept_length_inside_it():
    c = _sweep_comparison()
    scen = Scenarios.of([{"type": "length-sweep", "name": "sweep"}])
    req = Requirements(sequence_length={"min": 256, "max": 2048}, max_tpot_s={"p50": 0.1})
    cons = constraints_of(req, c, scen)
    assert [k.row_key for k in cons if k.name == "max_tpot_s.p50"] == [None]   # no single-stream scenario here
    assert [k.row_key for k in cons if k.name == "sequence_length.max_tpot_s"] == ["sweep.decode_512",
                                                                                 "sweep.decode_2048"]
    assert [k.row_key for k in cons if k.op == "runs"] == ["sweep.prefill_512", "sweep.prefill_2048"]
    assert range_coverage(req, c, scen) is None
    wider = Requirements(sequence_length={"min": 128, "max": 8192})
    assert "nothing between 2048 and 8192" in range_coverage(wider, c, scen)
    assert "no length sweep" in range_coverage(wider, c, Scenarios.of(SCENARIOS))


def test_a_miss_many_times_the_limit_says_so_in_times():
    kld = Constraint("max_kld", "KLD mean", "scoring.kld_mean", "<=", 0.01, "nats")
    assert judge(kld, est(3.46, unit="nats")).text().endswith("346× the limit")


def test_a_minimum_missed_by_everything_says_how_far_short_not_times_the_limit():
    retention = Constraint("min_accuracy_retention", "Accuracy retention", "grading.accuracy_retention", ">=", 0.97, "")
    text = judge(retention, est(0.0, unit="")).text()
    assert text.endswith("100.0% short of the limit") and "×" not in text
