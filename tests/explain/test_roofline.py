"""The roofline of a decode token (roofline.py): costs by hand, verdicts, bad input, a real model's shape."""
from __future__ import annotations

import math

import pytest

from variantlab.explain.roofline import ModelShape, StepCost, decode_cost, model_shape, roofline

SHAPE = ModelShape(weight_bytes=230_000_000, linear_params=113_000_000, layers=16, heads=12, kv_heads=4,
                   head_dim=64, kv_bytes_per_element=2)


def test_a_decode_token_reads_its_weights_and_cache_and_does_two_flops_a_weight():
    cost = decode_cost(SHAPE, context=100)
    assert cost.bytes == 230_000_000 + 2 * 16 * 4 * 64 * 100 * 2           # K and V of 4 heads, bf16
    assert cost.flops == 2 * 113_000_000 + 4 * 16 * 12 * 64 * 100           # q·Kᵀ and p·V of 12 heads
    assert decode_cost(SHAPE, 0).bytes == SHAPE.weight_bytes


def test_the_verdict_names_the_ceiling_that_sets_the_floor_or_says_overhead():
    cost = StepCost(bytes=50e6, flops=1e9)                                  # 1 ms at 50 GB/s, 1 ms at 1 TFLOP/s
    mem = roofline(cost, seconds=1.25e-3, read_gbps=50, peak_tflops=0.5)    # compute floor 2 ms > step: a bad peak
    assert mem.bound == "compute" and mem.fraction_of_floor == pytest.approx(1.6)
    r = roofline(cost, seconds=1.25e-3, read_gbps=50, peak_tflops=10)
    assert (r.bound, r.verdict) == ("memory", "memory-bound") and r.fraction_of_floor == pytest.approx(0.8)
    assert r.achieved_gbps == pytest.approx(40) and r.achieved_tflops == pytest.approx(0.8)
    slow = roofline(cost, seconds=4e-3, read_gbps=50, peak_tflops=None)       # memory only: 25% of its floor
    assert slow.verdict == "overhead-bound" and slow.fraction_of_floor == pytest.approx(0.25)
    assert slow.line().startswith("overhead-bound: 25% of the memory floor")


@pytest.mark.parametrize("seconds,gbps", [(0, 50), (-1, 50), (math.nan, 50), (1e-3, 0), (1e-3, math.inf)])
def test_no_figure_from_a_zero_or_nan_time_or_ceiling(seconds, gbps):
    with pytest.raises(ValueError):
        roofline(StepCost(1, 1), seconds, gbps, 1.0)
    with pytest.raises(ValueError):
        decode_cost(SHAPE, -1)


@pytest.mark.model
def test_a_built_variant_gives_its_shape(tiny_model_dir):
    from variantlab.variants.build import VariantDefinition, build
    from variantlab.variants.recipe import decode_weight_bytes
    for recipe in ("bf16", "int4"):
        built = build(tiny_model_dir, VariantDefinition(recipe, recipe, {"group_size": 32} if recipe == "int4" else {}),
                      "cpu")
        shape = model_shape(built.model, decode_weight_bytes(built.model))
        cfg = built.model.config
        per_layer = 4 * cfg.hidden_size ** 2 + 3 * cfg.hidden_size * cfg.intermediate_size
        assert shape.linear_params == cfg.num_hidden_layers * per_layer + cfg.hidden_size * cfg.vocab_size
        assert (shape.layers, shape.heads, shape.kv_heads, shape.kv_bytes_per_element) == (2, 2, 2, 2)
        assert shape.weight_bytes == decode_weight_bytes(built.model)


def test_per_token_decode_cost_shares_the_weights_over_the_batch():
    from variantlab.explain.roofline import ModelShape, decode_cost, per_token_decode_cost
    shape = ModelShape(weight_bytes=1000, linear_params=400, layers=2, heads=4, kv_heads=2, head_dim=8,
                       kv_bytes_per_element=2)
    one = decode_cost(shape, 10)
    assert per_token_decode_cost(shape, 10, 1) == one
    four = per_token_decode_cost(shape, 10, 4)
    assert four.bytes == 250 + (one.bytes - 1000) and four.flops == one.flops
    with pytest.raises(ValueError):
        per_token_decode_cost(shape, 10, 0)


def test_per_token_prefill_cost():
    from variantlab.explain.roofline import ModelShape, per_token_prefill_cost
    shape = ModelShape(weight_bytes=1000, linear_params=400, layers=2, heads=4, kv_heads=2, head_dim=8,
                       kv_bytes_per_element=2)
    c = per_token_prefill_cost(shape, 10, 2)
    assert c.bytes == 1000 / 20 + 2 * 2 * 2 * 8 * 2                 # weights once a pass; K and V written once
    assert c.flops == 2 * 400 + 4 * 2 * 4 * 8 * 11 / 2             # causal: (T + 1) / 2 positions on average
    with pytest.raises(ValueError):
        per_token_prefill_cost(shape, 0, 1)
