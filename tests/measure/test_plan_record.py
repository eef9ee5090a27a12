"""measure/plan_record.py: a stored plan is a typed payload whose JSON is the plan's own (Plan.to_json), and a
plan of format 1 is upgraded to today's shape."""
from __future__ import annotations

import json

import yaml

from variantlab.measure.plan import plan_suite_file
from variantlab.measure.plan_record import FORMAT, PlanRecord, upgrade_plan


def test_a_plan_reads_typed_and_writes_back_its_own_json(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "t", "model": "builtin:tiny-structured",
                                     "variants": [{"name": "fp32"}, {"name": "bf16", "recipe": "bf16"}],
                                     "workload": {"dataset": {"generator": "structured", "n": 2}, "max_new_tokens": 2,
                                                  "scenarios": [{"type": "single-stream", "requests": 1}]}}))
    stored = json.loads(json.dumps(plan_suite_file(suite).to_json()))
    plan = PlanRecord.model_validate(stored)
    assert plan.baseline == "fp32" and [v["name"] for v in plan.variants] == ["fp32", "bf16"]
    assert plan.variant("bf16")["recipe"] == "bf16" and plan.variant("nothing") is None
    assert plan.samples == 2 and plan.trackers and plan.skip_bad_lines is False
    assert plan.to_json() == stored and "skip_bad_lines" not in plan.to_json()


def test_a_format_1_plan_names_its_backend():
    old = {"rounds": 1, "variants": [{"name": "a", "endpoint": None}, {"name": "b", "endpoint": {"base_url": "u"}}]}
    assert FORMAT == 2
    a, b = upgrade_plan(old, 1)["variants"]
    assert (a["backend"], b["backend"], b["backend_config"]) == ("torch", "openai", {"base_url": "u"})
    assert upgrade_plan(old, FORMAT) == old
