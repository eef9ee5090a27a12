"""variants/facts.py: VariantFacts and the AttentionFacts inside it are typed, and their JSON is the shape artifacts
and stored records have always had (the attention facts in extra.attention), so earlier ones read back."""
from __future__ import annotations

import copy

from variantlab.measure.wire import BuildRecord
from variantlab.variants.facts import AttentionFacts, VariantFacts

ATTENTION = {"attention": "sliding:16", "kind": "sliding", "implementation": "sdpa", "layers": 2, "heads": 4,
             "kv_heads": 2, "head_dim": 8, "cache_dtype": "float32", "window": 16, "kv_cache_bytes_per_token": 256,
             "state_bytes_per_sequence": 0, "linear_state_dtype": None, "kernels": ["banded sdpa"], "notes": [],
             "kv_cache_bytes_max": 4096, "kv_cache_bytes_per_sequence": {"128": 4096}}
# a variant's facts as an artifact's variant.json and a stored build record held them before they were typed
STORED = {"recipe": "int8", "dtype": "bf16", "parameters": 1000, "weight_bytes": 1200, "bits_per_weight": 9.6,
          "kernels": ["aten::_weight_int8pack_mm", "banded sdpa"], "notes": ["a note"],
          "extra": {"quantized_layers": 14, "attention": ATTENTION}}


def test_stored_facts_read_typed_and_write_back_the_same_json():
    facts = VariantFacts.model_validate(copy.deepcopy(STORED))
    assert isinstance(facts.attention, AttentionFacts) and facts.attention.window == 16
    assert "attention" not in facts.extra and facts.extra["quantized_layers"] == 14
    assert facts.to_json() == STORED and facts.kernels == tuple(STORED["kernels"])


def test_a_build_record_of_an_earlier_version_reads_back_with_typed_facts_and_the_same_json():
    record = {"version": 2, "kind": "build", "variant": "int8", "status": "ok", "reason": None, "artifact_dir": "/a",
              "reused": False, "not_reused": [], "facts": STORED, "bytes_on_disk": 1300, "timings": {"build_s": 1.0},
              "environment": {"torch": "2.13.0+cpu", "threads": 2}}
    r = BuildRecord.model_validate(copy.deepcopy(record))
    assert r.facts.attention.kv_cache_bytes_per_token == 256 and r.environment.threads == 2
    assert r.model_dump(mode="json") == record


def test_a_cache_of_a_window_stops_growing_at_the_window():
    a = AttentionFacts.model_validate(ATTENTION)
    assert a.cache_bytes(8) == 8 * 256 and a.cache_bytes(1000) == 16 * 256 and a.cache_bytes(1000, batch=3) == 3 * 16 * 256


def test_a_backend_that_builds_nothing_has_facts_without_a_size():
    facts = VariantFacts(recipe="endpoint", dtype=None, kernels=["served by http://127.0.0.1:9/v1"])
    assert facts.parameters is None and facts.attention is None and facts.to_json()["extra"] == {}
