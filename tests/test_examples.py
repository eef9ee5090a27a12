"""Every shipped example suite loads and plans: its models, recipes, attention and dataset check out."""
from __future__ import annotations

from pathlib import Path

import pytest

from variantlab.measure.plan import plan_suite_file

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_suite_plans(path):
    plan = plan_suite_file(path)
    assert plan.variants and plan.samples
    assert plan.variants[0].name == plan.suite.baseline_name


def test_standard_vs_flash_maps_the_analysis_vocabulary():
    plan = plan_suite_file(Path(__file__).resolve().parents[1] / "examples" / "standard-vs-flash.yaml")
    by_name = {v.name: v.definition for v in plan.variants}
    assert (by_name["standard"].recipe, by_name["standard"].attention) == ("int8", "gqa:2")
    assert by_name["standard"].options == {"compute_dtype": "fp16"}
    assert (by_name["flash"].recipe, by_name["flash"].attention) == ("w4a8", "linear")
    assert by_name["flash"].options == {"group_size": 32}
