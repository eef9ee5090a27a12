"""The HTML report (report/html.py, report/charts.py) on hand-built comparisons: every row in the table,
every chart drawn from the comparison's own figures or left out with a reason, points that cannot be
drawn (failed variants, problem, None and NaN cells) skipped and named, the recommendation's lines and
front, and a page that references nothing on the network."""
from __future__ import annotations

import math
import re

import pytest

from variantlab.measure.analysis import Comparison, Row
from variantlab.measure.stats import Delta, Estimate
from variantlab.report.charts import (accuracy_row, all_charts, explain_chart, front_of, latency_row, length_chart,
                                      percentile_charts, point, throughput_chart, tradeoff_chart)
from variantlab.report.html import NO_REQUIREMENTS, RunPage, recommendation_html, report_html, table_html

NAMES = ("base", "lin-int8", "half", "broken")
SCENARIOS = ({"type": "single-stream", "name": None, "requests": 8},
             {"type": "offline", "name": None, "batch_size": 16},
             {"type": "length-sweep", "name": None, "lengths": [128, 2048]})


def est(value, unit="s", low=None, high=None, problem=None) -> Estimate:
    if value is not None and low is None and unit == "s":
        low, high = value * 0.9, value * 1.1
    return Estimate(value=value, low=low, high=high, n=0 if value is None else 20, cv=0.01, unit=unit,
                    problem=problem)


def delta(pct, significant=True) -> Delta:
    return Delta(pct=pct, low=pct - 2, high=pct + 2, significant=significant, method="paired over 3 rounds",
                 rounds=3)


def row(key, label, unit, lower, kind, cells: dict, deltas=None, **kw) -> Row:
    return Row(key, label, unit, lower, kind, {n: cells.get(n) for n in NAMES},
               {n: (deltas or {}).get(n) for n in NAMES}, **kw)


def ok3(base, lin, half, unit="s", **kw) -> dict:
    return {"base": est(base, unit, **kw), "lin-int8": est(lin, unit, **kw), "half": est(half, unit, **kw)}


def comparison(rows=None) -> Comparison:
    """base, lin-int8 and half measured, broken failed; half's E2EL p95 is NaN, lin-int8's TTFT p99 a problem."""
    rows = rows if rows is not None else full_rows()
    return Comparison("base", NAMES, {"base": "ok", "lin-int8": "ok", "half": "ok", "broken": "failed"},
                      {"base": None, "lin-int8": None, "half": None, "broken": "build: out of memory"}, tuple(rows),
                      ("one round: no verdict",),
                      {"base": build("fp32"), "lin-int8": build("int8", "linear"), "half": build("bf16")})


def build(recipe: str, attention: str = "model's own") -> dict:
    return {"recipe": recipe, "dtype": "bf16", "attention": attention, "kernels": ["aten::mm"], "notes": [],
            "build_s": 0.5, "reused": False, "not_reused": [], "device": "cpu"}


def full_rows() -> list[Row]:
    rows = [row("grading.accuracy_retention", "Accuracy retention (vs baseline)", "ratio", False, "versus",
                ok3(1.0, 0.5, 1.0, "ratio"), headline=1),
            row("scoring.kld_mean", "KLD mean (vs baseline)", "nats", True, "versus", ok3(0.0, 8.0, 0.01, "nats"))]
    for key, values in (("e2el_p50", (4e-3, 3e-3, 4e-3)), ("e2el_p90", (5e-3, 4e-3, 5e-3)),
                        ("e2el_p95", (6e-3, 5e-3, math.nan)), ("e2el_p99", (7e-3, 6e-3, 7e-3)),
                        ("ttft_p50", (2e-3, 1e-3, 2e-3)), ("ttft_p95", (2.5e-3, 1.5e-3, 2.5e-3)),
                        ("ttft_p99", (3e-3, None, 3e-3)), ("tpot_p50", (7e-4, 6e-4, 7e-4)),
                        ("tpot_p95", (8e-4, 7e-4, 8e-4))):
        cells = ok3(*values)
        if values[1] is None:
            cells["lin-int8"] = est(None, problem="too few requests for p99 (3 pooled; 368 needed)")
        if values[2] is not None and math.isnan(values[2]):
            cells["half"] = Estimate(value=math.nan, low=None, high=None, n=3, cv=None, unit="s")
        rows.append(row(f"single-stream.{key}", f"{key.upper()} [single-stream]", "s", True, "samples", cells,
                        {"lin-int8": delta(-20.0), "half": delta(0.5, False)}, is_timing=True))
    rows += [row("single-stream.output_throughput", "Output throughput [single-stream]", "tok/s", False, "samples",
                 ok3(500.0, 600.0, 550.0, "tok/s")),
             row("offline.output_throughput", "Output throughput [offline]", "tok/s", False, "samples",
                 ok3(1000.0, 700.0, None, "tok/s"), {"lin-int8": delta(-30.0)}, headline=7),
             row("length-sweep.prefill_128", "Prefill @128 tokens", "s", True, "samples", ok3(2e-3, 3e-3, 2e-3)),
             row("length-sweep.decode_128", "Decode per token @128", "s", True, "samples", ok3(7e-4, 9e-4, 7e-4)),
             row("length-sweep.prefill_2048", "Prefill @2048 tokens", "s", True, "samples", ok3(5e-2, 3e-2, 4e-2)),
             row("length-sweep.decode_2048", "Decode per token @2048", "s", True, "samples",
                 {"base": est(1.5e-3), "lin-int8": est(9e-4), "half": None}),
             row("facts.model_size", "Model size (weights as stored)", "B", True, "fact",
                 ok3(4e6, 1e6, 2e6, "B")),
             row("cold_start.compile", "Cold start: compile", "s", True, "process", {})]   # a row nobody has
    return rows


EXPLANATION = {"a": "base", "b": "lin-int8", "phases": [
    {"scenario": "single-stream", "phase": "decode", "difference_s_per_token": 2e-4, "categories": [
        {"category": "GEMM", "difference": 1.5e-4}, {"category": "attention", "difference": 0.7e-4},
        {"category": "sampling", "difference": None}]},
    {"scenario": "single-stream", "phase": "prefill", "difference_s_per_token": -1e-4, "categories": [
        {"category": "GEMM", "difference": -1e-4}]}]}

REC = {"pick": "lin-int8", "reason": "the lowest E2EL p95", "front": ["lin-int8", "base"],
       "dimensions": [{"key": "grading.accuracy_retention", "label": "Accuracy retention", "lower_is_better": False},
                      {"key": "single-stream.e2el_p95", "label": "E2EL p95", "lower_is_better": True}],
       "lines": ["requirements: accuracy retention ≥ 0.4", "pick: lin-int8 — the lowest E2EL p95 <fast>",
                 "Pareto front over Accuracy retention, E2EL p95: lin-int8, base"]}


def page(c=None, **kw) -> RunPage:
    kw = {"scenarios": SCENARIOS, "samples": 8, "attention": {"base": "model's own", "lin-int8": "linear",
                                                              "half": "model's own"},
          "explanations": (EXPLANATION,), "about": ("run r1 (done)",), "run_id": "r1"} | kw
    return RunPage(c or comparison(), "variantlab report: demo", **kw)


def charts_by_key(**kw):
    p = page(**kw)
    return {ch.key: ch for ch in all_charts(p.comparison, scenarios=p.scenarios, samples=p.samples,
                                            attention=p.attention, explanations=p.explanations)}


# --------------------------------------------------------------------------- the table

def test_the_table_has_every_row_with_a_value_intervals_deltas_and_the_failed_variant():
    text = table_html(comparison())
    assert text.count("<tr") == 1 + 18 + 6        # header, rows with some value, one group row per tracker
    assert "Cold start: compile" not in text       # no variant has it
    assert "4.00 ms [3.60 ms, 4.40 ms]" in text    # value [low, high]
    assert "-20.0% [-22.0, -18.0]" in text and "+0.5% [-1.5, +2.5] (n.s.)" in text
    assert 'class="num better"' in text and 'class="num same"' in text
    assert text.count('class="failed"') == 18 and "build: out of memory" in text
    assert "too few requests for p99 (3 pooled; 368 needed)" in text


def test_cells_and_names_are_escaped():
    c = comparison([row("facts.model_size", "Size <b>", "B", True, "fact",
                        {"base": est(1.0, "B"), "lin-int8": est(None, "B", problem="<script>alert(1)</script>")})])
    text = table_html(c)
    assert "<script>" not in text and "&lt;script&gt;" in text and "Size &lt;b&gt;" in text


# --------------------------------------------------------------------------- the charts

def test_point_takes_finite_values_only():
    assert point(None) is None and point(est(None, problem="x")) is None
    assert point(Estimate(value=math.nan, low=None, high=None, n=1, cv=None, unit="s")) is None
    assert point(Estimate(value=1.0, low=math.nan, high=2.0, n=1, cv=None, unit="s")).low is None
    assert point(est(1.0)).high == pytest.approx(1.1)


def test_tradeoff_uses_retention_and_single_stream_p95_and_skips_nan_and_failed_points():
    c = comparison()
    assert accuracy_row(c).key == "grading.accuracy_retention"
    assert latency_row(c, SCENARIOS).key == "single-stream.e2el_p95"
    ch = tradeoff_chart(c, SCENARIOS)
    names = [t.name for t in ch.figure.data]
    assert names == ["base ★ front", "lin-int8 ★ front", "Pareto front"]   # half's p95 is NaN, broken failed
    assert any("half" in n and "not a finite number" in n for n in ch.notes)
    assert any("broken" in n and "out of memory" in n for n in ch.notes)
    base = ch.figure.data[0]
    assert base.x[0] == pytest.approx(6.0) and base.error_x.array[0] == pytest.approx(0.6)   # ms, from the interval


def test_tradeoff_falls_back_to_kld_and_another_latency_row():
    rows = [r for r in full_rows() if r.key not in ("grading.accuracy_retention", "single-stream.e2el_p95")]
    c = comparison(rows)
    assert accuracy_row(c).key == "scoring.kld_mean"
    assert latency_row(c, SCENARIOS).key == "single-stream.e2el_p50"
    ch = tradeoff_chart(c, SCENARIOS)
    assert "lower is better" in ch.figure.layout.yaxis.title.text
    assert {t.name for t in ch.figure.data} >= {"base ★ front", "lin-int8 ★ front"}


def test_the_front_comes_from_the_recommendation_and_the_pick_is_labelled():
    ch = tradeoff_chart(comparison(), SCENARIOS, front=["lin-int8"], pick="lin-int8", front_over=["E2EL p95"])
    traces = {t.name: t for t in ch.figure.data}
    assert set(traces) == {"base", "lin-int8 ★ front"}
    assert traces["lin-int8 ★ front"].marker.symbol == "diamond" and traces["base"].marker.symbol == "circle"
    assert traces["lin-int8 ★ front"].text[0] == "lin-int8 (pick)"
    assert "Pareto front from the recommendation (over E2EL p95): lin-int8" in ch.notes


def test_front_of_two_figures():
    from variantlab.report.charts import Point
    pts = {"a": (Point(1, None, None), Point(0.9, None, None)), "b": (Point(2, None, None), Point(1.0, None, None)),
           "c": (Point(3, None, None), Point(0.8, None, None))}
    assert front_of(pts, (True, False)) == ["a", "b"]          # c is slower and less accurate than both


def test_percentiles_per_scenario_skip_problem_and_nan_cells():
    (ch,) = percentile_charts(comparison())
    assert ch.key == "percentiles-single-stream"
    bars = [(t.name, list(t.x)) for t in ch.figure.data]
    assert ("base", ["p50", "p90", "p95", "p99"]) in bars and ("base", ["p50", "p95"]) in bars
    assert not any(n == "broken" for n, _ in bars)
    assert any("lin-int8 on TTFT_P99" in n and "too few requests" in n for n in ch.notes)
    assert any("half on E2EL_P95" in n for n in ch.notes)
    half_e2el = next(t for t in ch.figure.data if t.name == "half")
    assert half_e2el.y[2] is None                                     # the NaN bar is left empty


def test_throughput_against_batch_size_clamps_to_the_dataset_and_counts_single_stream_as_batch_1():
    ch = throughput_chart(comparison(), SCENARIOS, samples=8)
    traces = {t.name: t for t in ch.figure.data}
    assert list(traces["base"].x) == [1, 8] and list(traces["base"].y) == [500.0, 1000.0]
    assert list(traces["half"].x) == [1]                             # its offline cell is missing
    assert any("batch_size 16 but the dataset has 8 samples" in n for n in ch.notes)
    assert any(n.startswith("skipped half on Output throughput [offline]") for n in ch.notes)
    assert any("batch 1 is the single-stream scenario" in n for n in ch.notes)


def test_one_batch_size_is_still_a_chart():
    ch = throughput_chart(comparison(), [SCENARIOS[1]], samples=None)
    assert ch.figure is not None and [list(t.x) for t in ch.figure.data] == [[16], [16]]


def test_length_chart_lines_per_variant_dashed_by_attention_kind():
    ch = length_chart(comparison(), {"base": "model's own", "lin-int8": "linear", "half": "model's own"})
    traces = [t for t in ch.figure.data]
    dashes = {t.name: t.line.dash for t in traces}
    assert dashes["lin-int8 (linear)"] != dashes["base (model's own)"] == dashes["half (model's own)"]
    half_decode = [t for t in traces if t.name == "half (model's own)" and t.xaxis == "x2"][0]
    assert list(half_decode.x) == [128]                              # its @2048 cell is missing
    assert ch.figure.layout.xaxis.type == "log"


def test_explain_bars_stack_categories_per_pair_and_phase():
    ch = explain_chart([EXPLANATION])
    bars = {t.name: t for t in ch.figure.data if t.type == "bar"}
    assert set(bars) == {"GEMM", "attention"}
    assert list(bars["GEMM"].y) == pytest.approx([0.15, -0.1])       # ms/token
    assert ch.figure.layout.barmode == "relative"
    assert any("skipped sampling" in n for n in ch.notes)


def test_charts_the_run_has_no_data_for_are_left_out_with_a_reason():
    c = comparison([row("facts.model_size", "Model size", "B", True, "fact", ok3(4e6, 1e6, 2e6, "B"))])
    charts = {ch.key: ch for ch in all_charts(c)}
    assert all(ch.figure is None for ch in charts.values())
    assert charts["length"].notes == ("no length sweep in this run",)
    assert "no offline scenario" in charts["throughput"].notes[0]
    assert "no explanation" in charts["explain"].notes[0]
    assert "accuracy row" in charts["tradeoff"].notes[0] and "latency row" in charts["tradeoff"].notes[0]
    text = report_html(RunPage(c, "empty"))
    assert "left out: no length sweep in this run" in text
    assert "window.PlotlyConfig" not in text and "Plotly.newPlot" not in text   # no chart: no plotly.js either


def test_an_empty_comparison_renders():
    c = Comparison("base", ("base",), {"base": "failed"}, {"base": "build: boom"}, ())
    text = report_html(RunPage(c, "nothing"))
    assert "nothing was measured" in text and "base: failed — build: boom" in text


# --------------------------------------------------------------------------- the page

def test_recommendation_lines_or_no_requirements():
    assert NO_REQUIREMENTS in recommendation_html(None)
    text = recommendation_html(REC)
    assert "pick: lin-int8 — the lowest E2EL p95 &lt;fast&gt;" in text
    assert "the lowest E2EL p95" in recommendation_html({"pick": "x", "reason": "the lowest E2EL p95"})


def test_the_page_is_self_contained_with_plotly_inlined_once():
    text = report_html(page(), REC)
    assert text.count("<script>window.PlotlyConfig") == 1
    assert text.count("Plotly.newPlot(") == 5
    assert not re.search(r"<script[^>]*\ssrc=", text) and "<link" not in text and "@import" not in text
    assert not re.search(r"url\(\s*['\"]?https?:", text)
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert text.count('data-drawn="yes"') == 5
    assert "pick: lin-int8" in text and "lin-int8 ★ front" in text
    assert "skipped broken: failed — build: out of memory" in text


def test_report_without_recommendation_says_so_and_draws_its_own_front():
    text = report_html(page(), None)
    assert NO_REQUIREMENTS in text and "Pareto front of these two figures" in text
