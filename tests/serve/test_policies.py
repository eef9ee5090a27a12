"""Batch policies (serve/policies.py) as pure decisions on load views: no model, no clock."""
from __future__ import annotations

from variantlab.serve.policies import (MARGIN, PATIENCE, AdaptivePolicy, LaneView, LoadView, SinglePolicy, StaticPolicy,
                                       StepCost)

# the shape our engine measures on the CPU: weight-only int4 is faster at one row and far slower at a few dozen
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


# ---------------------------------------------------------------- holding newcomers to prefill them together

COSTLY_CALLS = StepCost("bf16", BF16.seconds, prefill_s_per_token=1e-5, prefill_fixed_s=0.005)


def busy(waiting=1, oldest=0.01, rate=100.0, tokens=90, running=4, prefilling=0) -> LoadView:
    return LoadView(10.0, waiting, waiting, oldest, {"bf16": LaneView("bf16", running, prefilling, 32)}, rate,
                    tokens * waiting)


def test_under_load_newcomers_are_held_until_their_group_fills_or_the_hold_ends():
    p = AdaptivePolicy({"bf16": COSTLY_CALLS}, tpot_slo_s=0.025, ttft_slo_s=0.1, max_rows=32)
    assert p.decide(busy(oldest=0.01)).admit == {"bf16": 0}                  # 100 req/s × 5 ms: held
    assert p.decide(busy(oldest=0.026)).admit == {"bf16": 28}                # past HOLD × 100 ms: admitted
    budget = p.decide(busy()).prefill_tokens["bf16"]
    assert p.decide(busy(waiting=budget // 90 + 1)).admit == {"bf16": 28}    # a full group: admitted
    assert p.decide(busy(waiting=28)).admit == {"bf16": 28}                  # as many as the lane has room for


def test_nothing_is_held_on_an_idle_lane_a_light_load_or_without_a_ttft_slo():
    p = AdaptivePolicy({"bf16": COSTLY_CALLS}, tpot_slo_s=0.025, ttft_slo_s=0.1, max_rows=32)
    assert p.decide(busy(running=0)).admit == {"bf16": 32}                   # nobody to share a prefill with
    assert p.decide(busy(rate=20.0)).admit == {"bf16": 28}                   # 20 req/s × 5 ms = 10% < HOLD_LOAD
    q = AdaptivePolicy({"bf16": COSTLY_CALLS}, tpot_slo_s=0.025, max_rows=32)
    assert q.decide(busy()).admit == {"bf16": 28}
    cheap = AdaptivePolicy({"bf16": StepCost("bf16", BF16.seconds, 1e-5, 0.0)}, tpot_slo_s=0.025, ttft_slo_s=0.1)
    assert cheap.decide(busy()).admit == {"bf16": 28}                        # calls with no fixed cost: no gain


def test_a_prefill_crossover_switches_variant_with_load():
    """The reference model's costs as measured here (serve/calibrate.py, 2026-12-02): int4's decode step is
    no slower than bf16's, its prefill call cheaper (2.8 against 5.0 ms) and its prompt tokens dearer (23
    against 11 µs). For requests of ~124 prompt tokens as prefilled and 3.5 output tokens the two finish
    as many one at a time (within the switching margin), and bf16 43% more on a busy lane: a crossover
    that decode tokens/s alone gets the wrong way round."""
    int4 = StepCost("int4", {1: 0.00244, 8: 0.00296, 16: 0.0036, 32: 0.00435}, 22.7e-6, 0.00284)
    bf16 = StepCost("bf16", {1: 0.00235, 8: 0.00309, 16: 0.00472, 32: 0.00555}, 11.0e-6, 0.00502)
    p = AdaptivePolicy({"int4": int4, "bf16": bf16}, tpot_slo_s=0.025, max_rows=32, current="int4")
    shaped = dict(prompt_tokens=124.0, output_tokens=3.5)

    def look(demand, now):
        lanes = {"int4": LaneView("int4", min(demand, 32), 0, 32), "bf16": LaneView("bf16", 0, 0, 32)}
        return p.decide(LoadView(now, 0, 0, 0.0, lanes, **shaped))

    assert all(look(1, 10.0 + 0.2 * i).switch is None for i in range(2 * PATIENCE))
    assert p.current == "int4" and 1 / MARGIN < p.throughput("int4", 1) / p.throughput("bf16", 1) < MARGIN
    switches = [look(32, 12.0 + 0.2 * i).switch for i in range(PATIENCE)]
    assert switches[-1] is not None and switches[-1]["to"] == "bf16" and "req/s" in switches[-1]["reason"]
    assert "124 prompt tokens" in switches[-1]["reason"]
    assert p.throughput("bf16", 32) > 1.15 * p.throughput("int4", 32)
    unshaped = AdaptivePolicy({"int4": int4, "bf16": bf16}, tpot_slo_s=0.025, max_rows=32)
    assert unshaped.throughput("int4", 32) > unshaped.throughput("bf16", 32)   # decode alone: int4 looks faster


def test_keep_plans_every_cap_again_for_a_new_tpot_slo():
    """A server scenario learns its SLOs after the engine is built (measure/scenarios/server.py)."""
    p = AdaptivePolicy({"int4": INT4, "bf16": BF16}, max_rows=32)
    assert p.caps == {"int4": 32, "bf16": 32} and p.ttft_slo_s is None
    p.keep(0.01, 0.1)
    assert p.caps == p.planned_caps == {"int4": INT4.cap(0.008, 32), "bf16": BF16.cap(0.008, 32)}
    assert p.tpot_slo_s == 0.01 and p.ttft_slo_s == 0.1
    p.keep(None, None)                                  # no TPOT SLO: the caps stay as planned
    assert p.caps["int4"] == 10 and p.ttft_slo_s is None
