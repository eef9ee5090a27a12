"""Presets expand into requirements a user can read and override."""
from __future__ import annotations

import pytest
import yaml

from variantlab.advise.objectives import check_objective, metric_ref
from variantlab.advise.presets import PRESETS, expand, preset_yaml
from variantlab.suite import Requirements


def test_every_preset_is_a_valid_requirements_block_and_prints_as_one():
    assert set(PRESETS) == {"high-precision", "balanced", "resource-constrained", "extreme-compression", "real-time"}
    for name in PRESETS:
        block = yaml.safe_load(preset_yaml(name))["requirements"]
        assert Requirements.model_validate(block).preset == name
        assert expand(Requirements.model_validate(block)) == expand(Requirements(preset=name))


def test_a_field_the_suite_sets_overrides_the_presets():
    r = expand(Requirements(preset="balanced", min_accuracy_retention=0.5))
    assert r.min_accuracy_retention == 0.5 and r.objective == {"e2el_p95": 1.0, "throughput": 1.0}
    assert expand(Requirements(preset="extreme-compression")).min_accuracy_retention == 0.85


def test_objectives_name_metrics_or_weights():
    assert metric_ref("latency").name == "e2el_p95"
    assert metric_ref("tpot_p99").family == "latency"
    check_objective({"throughput": 1, "size": 0.5})
    for bad in ("fastest", {"throughput": 0}, {}):
        with pytest.raises(ValueError):
            check_objective(bad)
