"""The Pareto front with intervals: only distinguishable differences dominate."""
from __future__ import annotations

from variantlab.advise.pareto import Dimension, better, dominated_by, dominates, pareto_front

ACC = Dimension("acc", "accuracy", False)
LAT = Dimension("lat", "latency", True)


def test_better_needs_the_intervals_apart():
    assert better((1.0, 0.9, 1.1), (2.0, 1.9, 2.1), lower_is_better=True)
    assert not better((1.0, 0.9, 1.6), (2.0, 1.5, 2.1), lower_is_better=True)      # overlap: not told apart
    assert better((0.99, None, None), (0.90, None, None), lower_is_better=False)   # exact figures
    assert not better((1000.0, None, None), (1000.3, None, None), lower_is_better=True)  # within 0.5%: a header


def test_the_front_keeps_the_trade_offs_and_drops_the_dominated():
    points = {
        "bf16": {"acc": (1.0, 0.99, 1.0), "lat": (0.10, 0.09, 0.11)},
        "int8": {"acc": (0.97, 0.95, 0.98), "lat": (0.06, 0.05, 0.07)},     # faster, less accurate: a trade-off
        "slow": {"acc": (0.97, 0.95, 0.98), "lat": (0.20, 0.19, 0.21)},     # worse than bf16 on both
        "tie":  {"acc": (0.975, 0.95, 0.985), "lat": (0.065, 0.05, 0.08)},  # int8 within intervals: not dominated
    }
    assert pareto_front(points, [ACC, LAT]) == ["bf16", "int8", "tie"]
    assert dominated_by(points, [ACC, LAT])["slow"] == ["bf16", "int8", "tie"]
    assert not dominates(points["int8"], points["tie"], [ACC, LAT])


def test_a_dimension_a_variant_lacks_is_left_out_of_its_comparisons():
    points = {"a": {"acc": (1.0, None, None)}, "b": {"acc": (0.5, None, None), "lat": (0.1, 0.1, 0.1)}}
    assert pareto_front(points, [ACC, LAT]) == ["a"]
