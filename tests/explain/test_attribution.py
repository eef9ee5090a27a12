"""Attribution of B − A to categories: sums, shares, ordering and the cases that could mislead (unit)."""
from __future__ import annotations

import pytest

from variantlab.explain import categories as C
from variantlab.explain.attribution import NEAR_ZERO, attribute, phase_times
from variantlab.measure.trackers.profile import OpTime, PhaseProfile, ProfiledRun


def op(name, category, seconds, calls=1, region=None):
    return OpTime(name=name, category=category, region=region, self_s=seconds, calls=calls)


def phase(plain, runs, tokens=10):
    """runs: [(profiled seconds, [ops])]"""
    return PhaseProfile(phase="decode", tokens=tokens, plain_s=tuple(plain),
                        profiled=tuple(ProfiledRun(seconds=s, ops=tuple(ops)) for s, ops in runs))


A = phase([1.0, 1.2], [(1.5, [op("aten::mm", C.GEMM, 0.6, 20), op("aten::add", C.ELEMENTWISE, 0.1, 20)])])
B = phase([3.0, 3.1], [(3.6, [op("variantlab_kernels::w4a8_mm", C.GEMM, 1.0, 20),
                              op("aten::mul", C.QUANT, 1.2, 40, C.QUANT_LINEAR),
                              op("aten::add", C.ELEMENTWISE, 0.1, 20)])])


def test_categories_sum_to_the_plain_time_and_shares_to_one():
    a, b = phase_times([A]), phase_times([B])
    assert a.plain == pytest.approx(0.1) and b.plain == pytest.approx(0.3)      # fastest run, per token
    assert a.overhead == pytest.approx(0.03) and b.overhead == pytest.approx(0.07)
    p = attribute("single-stream", "decode", a, b)
    assert sum(r.a for r in p.rows) == pytest.approx(a.plain)
    assert sum(r.b for r in p.rows) == pytest.approx(b.plain)
    assert p.diff == pytest.approx(0.2)
    assert sum(r.share for r in p.rows) == pytest.approx(1.0)
    assert [r.category for r in p.rows][:2] == [C.QUANT, C.GEMM]              # largest contribution first
    quant = p.rows[0]
    assert quant.share == pytest.approx(0.12 / 0.2)
    assert quant.top_op == "aten::mul" and quant.top_op_calls == (0.0, 4.0)   # calls a token
    assert p.accounted() == (3, pytest.approx(1.0))   # quant 60%, gemm 20%, overhead 20%


def test_accounted_stops_at_the_target():
    p = attribute("s", "decode", phase_times([A]), phase_times([B]))
    k, share = p.accounted(0.5)
    assert k == 1 and share == pytest.approx(0.6)


def test_fastest_runs_are_used_over_rounds():
    slow = phase([5.0], [(9.0, [op("aten::mm", C.GEMM, 8.0, 20)])])
    t = phase_times([slow, A])
    assert t.plain == pytest.approx(0.1)
    assert t.ops[("aten::mm", C.GEMM)].seconds == pytest.approx(0.06)         # from the fastest profiled run
    assert t.runs == 3 and t.disturbance == pytest.approx(1.2 / 1.0 - 1)


def test_ops_slower_than_the_plain_phase_clamp_overhead_and_say_so():
    hot = phase([0.5], [(1.5, [op("aten::mm", C.GEMM, 0.8, 20)])])
    t = phase_times([hot])
    assert t.clamped and t.overhead == 0.0 and t.total == pytest.approx(0.08)
    p = attribute("s", "decode", t, phase_times([B]))
    assert any("longer under the profiler" in n for n in p.notes)


def test_a_near_zero_difference_gets_no_shares():
    p = attribute("s", "decode", phase_times([A]), phase_times([A]))
    assert p.near_zero and all(r.share is None for r in p.rows)
    assert any(f"{NEAR_ZERO:.0%}" in n for n in p.notes)


def test_b_faster_sorts_the_largest_saving_first():
    p = attribute("s", "decode", phase_times([B]), phase_times([A]))
    assert p.diff < 0 and p.rows[0].category == C.QUANT and p.rows[0].share == pytest.approx(0.6)


def test_token_counts_must_agree_and_runs_must_be_finite():
    with pytest.raises(ValueError, match="token counts"):
        phase_times([A, phase([1.0], [(1.0, [])], tokens=11)])
    with pytest.raises(ValueError, match="finite"):
        phase_times([phase([float("nan")], [(1.0, [])])])
    with pytest.raises(ValueError):
        phase_times([])


def test_other_is_flagged():
    odd = phase([1.0], [(1.0, [op("aten::frobnicate", C.OTHER, 0.5)])])
    p = attribute("s", "decode", phase_times([A]), phase_times([odd]))
    assert any("matched no category" in n for n in p.notes)
