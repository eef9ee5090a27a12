"""An explanation from recorded profiles (unit): phases matched, the roofline placed, the run's figures quoted,
a worker that ran far off the run's own timing flagged, and the words a user reads."""
from __future__ import annotations

import json

import pytest

from variantlab.explain import categories as C
from variantlab.explain.render import explanation_blocks, explanation_markdown, headline
from variantlab.explain.run import explain_profiles, finite
from variantlab.measure.analysis import Comparison, Row
from variantlab.measure.stats import Estimate
from variantlab.measure.trackers.profile import Counters, OpTime, PhaseProfile, ProfiledRun, ProfileOutput, \
    WorkloadProfile

SHAPE = {"weight_bytes": 2_000_000, "linear_params": 1_000_000, "layers": 4, "heads": 4, "kv_heads": 4,
         "head_dim": 16, "kv_bytes_per_element": 2}
CEILINGS = {"read_gbps": 40.0, "matmul_tflops": {"bf16": 0.5, "fp32": 0.2}, "int8_tops": 0.9}


def profile(recipe, decode_ops, decode_plain, counters_reason="perf stat: <not supported>"):
    def phase(name, ops, plain, tokens):
        return PhaseProfile(phase=name, tokens=tokens, plain_s=(plain, plain * 1.05),
                            profiled=(ProfiledRun(seconds=plain * 1.3, ops=tuple(
                                OpTime(name=n, category=c, region=None, self_s=s, calls=k) for n, c, s, k in ops)),))
    w = WorkloadProfile(scenario="single-stream", batch=1, requests=4, prompt_tokens=200, new_tokens=24,
                        mean_prompt_tokens=50.0,
                        phases=(phase("prefill", [("aten::mm", C.GEMM, 0.05, 28)], 0.1, 200),
                                phase("decode", decode_ops, decode_plain, 92)),
                        counters=Counters(reason=counters_reason, counts={}, tokens=96))
    return ProfileOutput(device="cpu", recipe=recipe, dtype="bf16", ceilings=CEILINGS, compiled=False,
                         marked_modules=20, shape=SHAPE, kernels=("k",), workloads=(w,))


BF16 = profile("bf16", [("aten::mm", C.GEMM, 0.06, 28 * 92)], 0.092)
W4A8 = profile("w4a8", [("variantlab_kernels::w4a8_mm", C.GEMM, 0.05, 28 * 92),
                        ("aten::mul", C.QUANT, 0.08, 56 * 92)], 0.184)


def comparison(tpot_bf16, tpot_w4a8):
    def cell(v):
        return Estimate(v, None, None, 10, None, "s")
    row = Row("single-stream.tpot_p50", "TPOT p50", "s", True, "samples",
              {"bf16": cell(tpot_bf16), "w4a8": cell(tpot_w4a8)}, {"bf16": None, "w4a8": None}, headline=5,
              is_timing=True)
    return Comparison("bf16", ("bf16", "w4a8"), {"bf16": "ok", "w4a8": "ok"}, {"bf16": None, "w4a8": None}, (row,))


def test_explanation_of_recorded_profiles():
    e = explain_profiles("bf16", "w4a8", {"bf16": [BF16], "w4a8": [W4A8]}, run_id="r1",
                         comparison=comparison(0.001, 0.002))
    decode = next(p for p in e.phases if p.phase == "decode")
    assert decode.a.plain == pytest.approx(0.001) and decode.b.plain == pytest.approx(0.002)
    assert decode.rows[0].category == C.QUANT and decode.rows[0].share == pytest.approx(0.87, abs=0.01)
    line = headline(decode, "bf16", "w4a8")
    assert line.startswith("single-stream · decode: w4a8 2.000 ms/token against bf16 1.000: +1.000 ms/token (+100%)")
    assert "of it in quantize/dequantize/pack (aten::mul: 0 → 56 calls a token)" in line
    assert e.measured["single-stream/decode"] == ("TPOT p50: bf16 1.00 ms, w4a8 2.00 ms (+100% of bf16)",)
    assert not e.warnings
    places = {(r.variant, r.phase): r for r in e.rooflines}
    assert places[("bf16", "decode")].place.verdict in ("memory-bound", "compute-bound", "overhead-bound")
    assert places[("bf16", "decode")].cost.bytes > SHAPE["weight_bytes"]          # + the KV cache
    assert e.counters["bf16"]["single-stream"]["reason"].startswith("perf stat")
    text = explanation_markdown(e, ops=True)
    assert "## single-stream · decode" in text and "| quantize/dequantize/pack |" in text
    assert "unavailable: perf stat" in text and "calls a token" in text
    json.dumps(finite(e.to_json()), allow_nan=False)


def test_a_worker_far_off_the_runs_timing_is_flagged():
    e = explain_profiles("bf16", "w4a8", {"bf16": [BF16], "w4a8": [W4A8]}, comparison=comparison(0.0002, 0.002))
    assert len(e.warnings) == 1 and "bf16's decode ran at 5.00×" in e.warnings[0]
    assert any("Warning: bf16's decode" in b.text for b in explanation_blocks(e) if hasattr(b, "text"))


def test_counted_hardware_events_are_per_token():
    counted = profile("bf16", [("aten::mm", C.GEMM, 0.06, 28 * 92)], 0.092, counters_reason=None)
    counted = counted.model_copy(update={"workloads": (counted.workloads[0].model_copy(update={
        "counters": Counters(reason=None, counts={"instructions:u": 9600.0}, tokens=96)}),)})
    e = explain_profiles("bf16", "w4a8", {"bf16": [counted], "w4a8": [W4A8]})
    assert e.counters["bf16"]["single-stream"] == {"reason": None, "per_token": {"instructions:u": 100.0}}
    assert "instructions 100 a token" in explanation_markdown(e)


def test_finite_replaces_nan_and_infinity():
    assert finite({"a": [1.0, float("nan")], "b": float("inf"), "c": "x"}) == {"a": [1.0, None], "b": None, "c": "x"}
