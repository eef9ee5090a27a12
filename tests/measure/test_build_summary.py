"""A comparison's per-variant build summary is a typed, frozen record that writes the results JSON's `builds`
object as before and reads back a comparison stored by an earlier version."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.advise.comparisons import comparison, est, row
from variantlab.measure.analysis import Comparison
from variantlab.measure.build_summary import BuildSummary

ROWS = [row("tpot_p50", "s", True, {"a": est(1.0), "b": est(2.0)})]


def test_builds_given_as_dicts_become_records_read_by_attribute_and_by_key():
    c = comparison(ROWS, builds={"a": {"recipe": "int4", "kernels": ["k1"], "build_s": 1.5}})
    b = c.builds["a"]
    assert isinstance(b, BuildSummary) and b.kernels == ("k1",) and b["recipe"] == "int4"
    assert b.get("attention") is None and b.get("no such field", "x") == "x"
    with pytest.raises(KeyError):
        b["no such field"]
    with pytest.raises(ValidationError):       # frozen
        b.recipe = "fp32"


def test_the_json_is_the_builds_object_it_was_and_round_trips():
    c = comparison(ROWS, builds={"a": {"recipe": "int4", "kernels": ["k1"], "not_reused": ["x: why"]}})
    out = c.to_json()["builds"]["a"]
    assert out["kernels"] == ["k1"] and out["not_reused"] == ["x: why"] and out["reused"] is False
    assert set(out) == set(BuildSummary.model_fields)
    assert Comparison.from_json(c.to_json()) == c


def test_a_comparison_stored_before_a_field_existed_reads_back_and_says_so():
    old = comparison(ROWS, builds={"a": {"recipe": "int4"}}).to_json()
    del old["builds"]["a"]["artifact"]
    old["builds"]["a"]["retired_field"] = 1                # a field a later version dropped: ignored
    back = Comparison.from_json(old).builds["a"]
    assert back.artifact is None and "artifact" not in back.model_fields_set
