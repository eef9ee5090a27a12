"""Batch policies (serve/policies.py) as pure decisions on load views: no model, no clock."""
from __future__ import annotations

from variantlab.serve.policies import (PATIENCE, AdaptivePolicy, LaneView, LoadView, SinglePolicy, StaticPolicy,
                                       StepCost)

# DESIGN.md's shape: weight-only int4 is faster at one row and far slower at a few dozen
INT4 = StepCost("int4", {1: 0.0015, 4: 0.004, 16: 0.012, 32: 0.024})
BF16 = StepCost("bf16", {1: 0.0030, 4: 0.0032, 16: 0.004, 32: 0.006})


def view(waiting=0, oldest=0.0, now=10.0, **lanes) -> LoadView:
    return LoadView(now, waiting, waiting, oldest, {n: LaneView(n, *v) if isinstance(v, tuple) else v
                                                    for n, v in lanes.items()})


def test_single_admits_one_request_only_when_nothing_runs():
    p = SinglePolicy("v")
    assert p.decide(view(3, v=(0, 0, 32))).admit == {"v": 1}
    assert p.decide(view(3, v=(1, 0, 32))).admit == {"v": 0}
    assert p.decide(view(3, v=(0, 1, 32))).admit == {"v": 0}


def test_static_waits_for_a_full_batch_or_the_oldest_requests_deadline():
    p = StaticPolicy("v", batch_size=4, max_wait_s=0.05)
    assert p.decide(view(2, oldest=0.01, v=(0, 0, 32))).admit == {"v": 0}
    assert p.decide(view(4, oldest=0.01, v=(0, 0, 32))).admit == {"v": 4}
    assert p.decide(view(2, oldest=0.06, v=(0, 0, 32))).admit == {"v": 4}
    assert p.decide(view(9, oldest=0.5, v=(3, 0, 32))).admit == {"v": 0}        # nobody joins a running batch
    assert abs(p.deadline(view(2, oldest=0.01, v=(0, 0, 32))) - 10.04) < 1e-9


def test_step_cost_interpolates_and_caps_at_the_budget():
    assert INT4.at(1) == 0.0015 and abs(INT4.at(10) - 0.008) < 1e-12 and INT4.at(64) == 0.048
    assert INT4.cap(0.005, 32) == 5 and BF16.cap(None, 32) == 32 and INT4.cap(0.0001, 32) == 1


def test_adaptive_starts_on_the_fastest_single_stream_variant_and_switches_past_the_crossover():
    p = AdaptivePolicy({"int4": INT4, "bf16": BF16}, tpot_slo_s=0.05, max_rows=32)
    assert p.current == "int4"
    low = view(1, int4=(0, 0, 32), bf16=(0, 0, 32))
    assert p.decide(low).admit == {"int4": 32} and p.current == "int4"
    decisions = [p.decide(view(20, now=10.0 + 0.2 * i, int4=(8, 0, 32), bf16=(0, 0, 32))) for i in range(PATIENCE)]
    assert all(d.switch is None for d in decisions[:-1])                      # no flapping on one look
    switch = decisions[-1].switch
    assert switch["from"] == "int4" and switch["to"] == "bf16" and "demand 28" in switch["reason"]
    assert p.current == "bf16" and decisions[-1].admit == {"bf16": 32}
    # the old lane drains: it is given nothing more
    assert "int4" not in decisions[-1].admit


def test_a_challenger_must_keep_winning_for_half_a_second_before_a_switch():
    p = AdaptivePolicy({"int4": INT4, "bf16": BF16}, tpot_slo_s=0.05, max_rows=32)
    fast = [p.decide(view(20, now=10.0 + 0.001 * i, int4=(8, 0, 32), bf16=(0, 0, 32))) for i in range(50)]
    assert all(d.switch is None for d in fast) and p.current == "int4"        # 50 looks in 50 ms
    assert p.decide(view(20, now=10.6, int4=(8, 0, 32), bf16=(0, 0, 32))).switch["to"] == "bf16"


def test_adaptive_caps_the_batch_by_the_slo_then_by_what_the_steps_really_take():
    p = AdaptivePolicy({"int4": INT4}, tpot_slo_s=0.01, max_rows=32)
    assert p.caps["int4"] == 10                                               # 10 rows fit 0.8 × 10 ms
    slow = LaneView("int4", 10, 0, 32, (0.02,) * 16, steps=16)
    p.decide(view(5, int4=slow))
    assert p.caps["int4"] == 7                                                # a quarter off
    p.decide(view(5, int4=LaneView("int4", 7, 0, 32, (0.02,) * 16, steps=20)))
    assert p.caps["int4"] == 7                                                # waits for 16 steps under the new cap
    fast = LaneView("int4", 7, 0, 32, (0.001,) * 16, steps=40)
    p.decide(view(5, int4=fast))
    assert p.caps["int4"] == 8                                                # grows by one while requests wait


def test_the_prefill_budget_is_what_the_slo_leaves_after_the_running_rows_step():
    int4 = StepCost("int4", INT4.seconds, prefill_s_per_token=1e-5)
    p = AdaptivePolicy({"int4": int4}, tpot_slo_s=0.01, max_rows=32)
    d = p.decide(view(3, int4=(4, 0, 32)))                    # 4 rows step in 4 ms; 8 ms budget leaves 4 ms
    assert d.prefill_tokens == {"int4": 400}
    crowded = p.decide(view(3, int4=(32, 0, 32)))             # 24 ms steps: nothing left but the floor
    assert crowded.prefill_tokens == {"int4": 32}
    assert AdaptivePolicy({"int4": int4}).decide(view(3, int4=(4, 0, 32))).prefill_tokens == {}   # no SLO


def test_a_measured_step_above_a_larger_batchs_is_taken_as_noise():
    from variantlab.serve.calibrate import monotone, prefill_line
    assert monotone({1: 1.7, 2: 1.9, 16: 7.8, 32: 4.9}) == {1: 1.7, 2: 1.9, 16: 4.9, 32: 4.9}
    fixed, per_token = prefill_line({64: 0.0044 + 64e-5, 512: 0.0044 + 512e-5, 2048: 0.0044 + 2048e-5})
    assert abs(fixed - 0.0044) < 1e-9 and abs(per_token - 1e-5) < 1e-12


def test_requests_near_their_ttft_lift_the_prefill_budget():
    int4 = StepCost("int4", INT4.seconds, prefill_s_per_token=1e-5)
    p = AdaptivePolicy({"int4": int4}, tpot_slo_s=0.01, ttft_slo_s=0.1, max_rows=32)
    assert p.decide(view(3, oldest=0.01, int4=(4, 0, 32))).prefill_tokens == {"int4": 400}
    assert p.decide(view(3, oldest=0.06, int4=(4, 0, 32))).prefill_tokens == {}    # past half its TTFT
