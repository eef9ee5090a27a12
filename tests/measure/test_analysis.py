"""From worker results to the comparison table (bench/analysis.py), on hand-built results.

Token times are multiples of 1/8 s so that every latency and median below is exact in binary.
The result dicts have the shape measure/worker.py::run_measurement returns.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from variantlab.measure.analysis import (METRICS, Comparison, accuracy_facts, compare_variants,
                                       distribution_facts)
from variantlab.measure.records import RequestRecord, ScenarioPass


def record(rid: str, send: float, ttft: float, tpot: float, n_tokens: int, text: str = "",
           error: str | None = None) -> RequestRecord:
    times = tuple(send + ttft + k * tpot for k in range(n_tokens))
    return RequestRecord(rid, send, times[-1] if times else send + ttft, times, 10, text, error)


def single_stream(ttfts, tpot=0.25, n_tokens=5) -> ScenarioPass:
    """One pass of requests 100 s apart: E2EL = ttft + (n_tokens - 1) * tpot."""
    recs = tuple(record(str(i), 100.0 * i, t, tpot, n_tokens) for i, t in enumerate(ttfts))
    return ScenarioPass("single-stream", 0.0, 100.0 * len(ttfts), recs)


def offline(walls, texts=("a", "b")) -> list[ScenarioPass]:
    passes = []
    for k, wall in enumerate(walls):
        start = 1000.0 * k
        recs = tuple(record(str(i), start, 0.5, 0.25, 3, text) for i, text in enumerate(texts))
        passes.append(ScenarioPass("offline", start, start + wall, recs))
    return passes


def result(ttfts=(0.5, 0.75, 1.0, 1.25, 1.5), tpot=0.25, walls=(4.0, 4.5, 5.0), weight_bytes=1000,
           tokenizer_id="tok-a", **extra) -> dict:
    return {
        "status": "ok", "reason": None, "device": "cpu",
        "facts": {"recipe": "fp32", "dtype": "fp32", "parameters": 250, "weight_bytes": weight_bytes,
                  "bits_per_weight": 8 * weight_bytes / 250, "kernels": [], "notes": [], "extra": {}},
        "tokenizer_id": tokenizer_id,
        "cold_start": {"import_s": 1.0, "load_s": 2.0, "first_token_s": 0.5, "total_s": 3.5},
        "memory": {"peak_bytes": 2_000_000, "total_bytes": 8_000_000, "utilization_pct": 25.0,
                   "kind": "process peak RSS (getrusage)"},
        "passes": {"single-stream": [single_stream(ttfts, tpot).to_json()],
                   "offline": [p.to_json() for p in offline(walls)]},
        "accuracy": None,
    } | extra


FAILED = {"status": "failed", "reason": "RuntimeError: out of memory"}


def cell(c: Comparison, key: str, name: str):
    return c.row(key).cells[name]


# --------------------------------------------------------------------------- the table
# compare_variants bootstraps every row, so one comparison is built per module and shared:
#   base    the baseline
#   same    identical timings, half the weight bytes, half the task accuracy
#   slow    every latency doubled, and a tokenizer of its own (as the runner marks it)
#   broken  failed in its worker

SLOW_TTFTS = (1.0, 1.5, 2.0, 2.5, 3.0)


@pytest.fixture(scope="module")
def comparison() -> Comparison:
    return compare_variants({
        "base": result(task_accuracy=0.8, kld_mean=0.0, top1_agreement=1.0),
        "same": result(weight_bytes=500, task_accuracy=0.4, kld_mean=0.25, top1_agreement=0.9,
                       accuracy_retention=0.5),
        "slow": result(ttfts=SLOW_TTFTS, tpot=0.5, tokenizer_id="tok-b",
                       not_comparable="tokenizer tok-b differs from the baseline's tok-a"),
        "broken": FAILED,
    }, "base")


def test_latency_rows_have_the_exact_medians(comparison):
    c = comparison
    # E2EL = ttft + 4 * 0.25 = [1.5, 1.75, 2.0, 2.25, 2.5]; TTFT median 1.0; TPOT exactly 0.25
    assert cell(c, "e2el_p50", "base").value == 2.0
    assert cell(c, "e2el_p50", "base").n == 5
    assert cell(c, "e2el_p95", "base").value == pytest.approx(2.45)   # 1.5 + 0.95 * 4 * 0.25
    assert cell(c, "ttft_p50", "base").value == 1.0
    assert cell(c, "tpot_p50", "base").value == 0.25
    assert cell(c, "single_task_latency", "base").value == 4.5
    assert cell(c, "single_task_latency", "base").n == 3
    assert cell(c, "model_size", "base").value == 1000
    assert cell(c, "cold_start_total", "base").value == 3.5
    assert cell(c, "peak_memory", "base").value == 2_000_000
    assert cell(c, "memory_utilization", "base").value == 25.0
    # 2 requests x 3 tokens per pass / wall time; the median pass is the 4.5 s one
    assert cell(c, "output_throughput", "base").value == pytest.approx(6 / 4.5)
    # facts that were never measured give empty cells, not zeros
    assert cell(c, "ppl_ratio", "base") is None and cell(c, "bits_per_byte", "base") is None


def test_every_metric_has_a_row_and_the_rows_are_labelled_with_their_scenario(comparison):
    c = comparison
    assert [r.key for r in c.rows] == [d.key for d in METRICS] + ["attention_error"]  # no sweep: no sweep rows
    assert c.row("e2el_p50").label.endswith("[single-stream]")
    assert c.row("single_task_latency").label.endswith("[offline]")
    assert c.row("e2el_p50").lower_is_better is True and c.row("output_throughput").lower_is_better is False


def test_baseline_delta_is_none(comparison):
    for row in comparison.rows:
        assert row.deltas["base"] is None


def test_clearly_slower_variant_has_a_significant_positive_e2el_delta(comparison):
    c = comparison
    assert cell(c, "e2el_p50", "slow").value == 4.0
    d = c.row("e2el_p50").deltas["slow"]
    assert d.pct == pytest.approx(100.0)
    assert d.significant is True and d.low > 0
    assert c.row("tpot_p50").deltas["slow"].pct == pytest.approx(100.0)


def test_identical_distributions_are_not_significant(comparison):
    for key in ("e2el_p50", "ttft_p50", "single_task_latency"):
        d = comparison.row(key).deltas["same"]
        assert d.pct == 0.0 and d.significant is False and d.low <= 0 <= d.high
        assert "(n.s.)" in d.label()


def test_failed_variant_has_empty_cells_and_keeps_its_status_and_reason(comparison):
    c = comparison
    assert c.variants == ("base", "same", "slow", "broken")
    assert c.status == {"base": "ok", "same": "ok", "slow": "ok", "broken": "failed"}
    assert c.reasons["broken"] == "RuntimeError: out of memory" and c.reasons["base"] is None
    for row in c.rows:
        assert row.cells["broken"] is None and row.deltas["broken"] is None


def test_failed_baseline_gives_cells_but_no_deltas():
    c = compare_variants({"base": FAILED, "other": result()}, "base")
    assert cell(c, "e2el_p50", "other").value == 2.0
    assert all(row.deltas["other"] is None for row in c.rows)


def test_model_size_has_an_exact_delta(comparison):
    d = comparison.row("model_size").deltas["same"]
    assert d.pct == -50.0 and d.low is None and d.high is None and d.significant is True
    assert comparison.row("bits_per_weight").deltas["same"].pct == -50.0
    assert comparison.row("model_size").deltas["slow"].significant is False


def test_unstable_repeated_measurements_are_warned_about(comparison):
    # Offline pass wall times 4.0, 4.5, 5.0 s: coefficient of variation 0.5 / 4.5, over 10%.
    assert any(w.startswith("Single-task latency") and "base 11%" in w for w in comparison.warnings)
    # Per-request E2EL differs by prompt by design: its spread is no instability.
    assert not any("E2EL" in w for w in comparison.warnings)
    steady = result(walls=(4.0, 4.0, 4.0))
    assert not any("Single-task latency" in w for w in compare_variants({"base": steady}, "base").warnings)


def test_different_tokenizers_put_a_not_comparable_note_on_the_kld_row(comparison):
    c = comparison
    assert c.tokenizers == {"base": "tok-a", "same": "tok-a", "slow": "tok-b", "broken": None}
    note = c.row("kld_mean").note
    assert note is not None and "slow" in note and "not comparable" in note and "tok-b" in note
    assert "same" not in note
    assert cell(c, "kld_mean", "slow") is None
    assert c.row("top1_agreement").note == note
    assert c.row("e2el_p50").note is None


def test_accuracy_rows_come_from_the_enriched_result(comparison):
    c = comparison
    assert cell(c, "task_accuracy", "same").value == 0.4
    assert c.row("task_accuracy").deltas["same"].pct == -50.0
    assert cell(c, "kld_mean", "same").value == 0.25
    assert c.row("kld_mean").deltas["same"] is None   # the baseline's KLD is 0: no percentage
    assert cell(c, "accuracy_retention", "same").value == 0.5


def test_comparison_round_trips_through_json(comparison):
    back = Comparison.from_json(json.loads(json.dumps(comparison.to_json())))
    assert back == comparison
    assert back.row("e2el_p50").deltas["slow"] == comparison.row("e2el_p50").deltas["slow"]


# --------------------------------------------------------------------------- accuracy facts

SAMPLES = [{"id": "a", "prompt": "p", "answer": "x1"}, {"id": "b", "prompt": "p", "answer": "y2"},
           {"id": "c", "prompt": "p", "answer": "z3"}, {"id": "d", "prompt": "p", "answer": "w4"}]


def with_offline(records) -> dict:
    return {"status": "ok",
            "passes": {"offline": [ScenarioPass("offline", 0.0, 1.0, tuple(records)).to_json()]}}


def test_accuracy_facts_grade_exact_match_by_request_id():
    # Records out of sample order: grading by position would give 1/4, by id 3/4.
    recs = [record("d", 0, 0.5, 0.25, 2, " w4 "), record("c", 0, 0.5, 0.25, 2, "z3"),
            record("a", 0, 0.5, 0.25, 2, "x1"), record("b", 0, 0.5, 0.25, 2, "nope")]
    facts = accuracy_facts(with_offline(recs), SAMPLES)
    assert facts["graded"] == 4 and facts["task_accuracy"] == 0.75


def test_accuracy_facts_skip_failed_unknown_and_repeated_requests():
    recs = [record("a", 0, 0.5, 0.25, 2, "x1"), record("b", 0, 0.5, 0.25, 2, "y2", error="timeout"),
            record("zz", 0, 0.5, 0.25, 2, "x1"), record("a", 0, 0.5, 0.25, 2, "wrong")]
    facts = accuracy_facts(with_offline(recs), SAMPLES)
    assert facts["graded"] == 1 and facts["task_accuracy"] == 1.0


def test_accuracy_facts_fall_back_to_single_stream_records():
    r = {"status": "ok", "passes": {"single-stream": [ScenarioPass(
        "single-stream", 0.0, 1.0, (record("b", 0, 0.5, 0.25, 2, "y2"),)).to_json()]}}
    assert accuracy_facts(r, SAMPLES) == {"graded": 1, "task_accuracy": 1.0}


def test_accuracy_facts_without_records_grade_nothing():
    assert accuracy_facts({"status": "ok", "passes": {}}, SAMPLES) == {"graded": 0}


def test_accuracy_facts_give_bits_per_byte_and_perplexity():
    r = with_offline([]) | {"accuracy": {"nll_nats": 100 * math.log(2.0), "n_bytes": 50, "positions": 25}}
    facts = accuracy_facts(r, SAMPLES)
    assert facts["bits_per_byte"] == pytest.approx(2.0)
    assert facts["ppl"] == pytest.approx(math.exp(100 * math.log(2.0) / 25))   # = 16


# --------------------------------------------------------------------------- distributions

def logprobs(rows: list[list[float]]) -> np.ndarray:
    a = np.asarray(rows, dtype=np.float64)
    return (a - np.log(np.exp(a).sum(axis=1, keepdims=True))).astype(np.float32)


def test_distribution_facts_of_identical_distributions():
    lp = logprobs([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    t = np.array([2, 0])
    facts = distribution_facts(lp, t, lp.copy(), t.copy())
    assert facts["kld_mean"] == pytest.approx(0.0, abs=1e-7) and facts["top1_agreement"] == 1.0


def test_distribution_facts_by_hand():
    base = np.log(np.array([[0.5, 0.5], [0.9, 0.1]], dtype=np.float32))
    var = np.log(np.array([[0.5, 0.5], [0.1, 0.9]], dtype=np.float32))
    t = np.array([0, 0])
    facts = distribution_facts(base, t, var, t)
    kl = 0.9 * math.log(9) + 0.1 * math.log(1 / 9)   # second position; the first is 0
    assert facts["kld_mean"] == pytest.approx(kl / 2, rel=1e-5)
    assert facts["top1_agreement"] == 0.5


def test_distribution_facts_refuse_different_tokenisations():
    lp = logprobs([[0.0, 1.0], [1.0, 0.0]])
    assert "not_comparable" in distribution_facts(lp, np.array([0, 1]), lp, np.array([1, 1]))
    assert "not_comparable" in distribution_facts(lp, np.array([0, 1]), lp[:1], np.array([0]))
