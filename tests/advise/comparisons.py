"""Comparisons built by hand for the advise tests: rows as a real run names them."""
from __future__ import annotations

from variantlab.measure.analysis import Comparison, Row
from variantlab.measure.stats import Delta, Estimate

SCENARIOS = [{"type": "single-stream"}, {"type": "offline", "batch_size": 16}]


def est(value, low=None, high=None, unit="s"):
    return Estimate(value=value, low=low, high=high, n=10 if low is not None else 1, cv=None, unit=unit,
                    method="test" if low is not None else "exact")


def delta(pct, low=None, high=None, significant=None):
    return Delta(pct, low, high, significant, "test")


def row(key, unit, lower, cells, deltas=None, kind="samples", label=None):
    return Row(key, label or key, unit, lower, kind, cells, deltas or {n: None for n in cells})


def comparison(rows, variants=None, status=None, baseline=None, builds=None) -> Comparison:
    variants = variants or tuple(rows[0].cells)
    status = status or {n: "ok" for n in variants}
    return Comparison(baseline or variants[0], tuple(variants), status, {n: None if s == "ok" else "it broke"
                                                                         for n, s in status.items()},
                      tuple(rows), builds=builds or {})


def three_variants(retention=None, e2el=None, throughput=None, size=None, status=None):
    """bf16 (the baseline), int8 and int4 with the figures given per variant as (value, low, high)."""
    retention = retention or {"bf16": (1.0, 1.0, 1.0), "int8": (0.98, 0.95, 1.0), "int4": (0.90, 0.85, 0.94)}
    e2el = e2el or {"bf16": (0.100, 0.095, 0.105), "int8": (0.060, 0.057, 0.063), "int4": (0.050, 0.047, 0.053)}
    throughput = throughput or {"bf16": (900.0, 880.0, 920.0), "int8": (300.0, 290.0, 310.0),
                                "int4": (250.0, 240.0, 260.0)}
    size = size or {"bf16": 2_000_000.0, "int8": 1_000_000.0, "int4": 500_000.0}

    def pct(table, n):
        b, v = table["bf16"][0], table[n][0]
        return delta(100 * (v - b) / b, 100 * (v - b) / b - 3, 100 * (v - b) / b + 3, True) if n != "bf16" else None

    rows = [
        row("grading.accuracy_retention", "ratio", False, {n: est(*x, unit="ratio") for n, x in retention.items()},
            kind="versus", label="Accuracy retention"),
        row("single-stream.e2el_p50", "s", True, {n: est(*(0.8 * v for v in x)) for n, x in e2el.items()},
            {n: pct(e2el, n) for n in e2el}, label="E2EL p50 [single-stream]"),
        row("single-stream.e2el_p95", "s", True, {n: est(*x) for n, x in e2el.items()},
            {n: pct(e2el, n) for n in e2el}, label="E2EL p95 [single-stream]"),
        row("offline.output_throughput", "tok/s", False, {n: est(*x, unit="tok/s") for n, x in throughput.items()},
            {n: pct(throughput, n) for n in throughput}, label="Output throughput [offline]"),
        row("facts.model_size", "B", True, {n: est(x, unit="B") for n, x in size.items()}, kind="fact",
            label="Model size"),
    ]
    return comparison(rows, ("bf16", "int8", "int4"), status=status)
