"""The attention seam (variants/attention.py): parsing, options, refusals and the facts it reports,
checked against the bytes a real cache holds after a prefill."""
from __future__ import annotations

import copy

import pytest
import torch

from variantlab.errors import RecipeError
from variantlab.variants.attention import (ACCEPTED, AttentionOptions, AttentionSpec, apply_attention,
                                           kv_cache_bytes_per_sequence, parse_attention, parse_attention_options)
from variantlab.variants.attention_module import cache_bytes

pytestmark = pytest.mark.model

LAYERS, HEADS, KV, HIDDEN = 2, 4, 4, 32
HEAD_DIM = HIDDEN // HEADS


@pytest.mark.parametrize("text,spec", [
    ("sdpa", AttentionSpec("sdpa")), (" Linear ", AttentionSpec("linear")),
    ("gqa:4", AttentionSpec("gqa", kv_heads=4)), ("gqa : 2", AttentionSpec("gqa", kv_heads=2)),
    ("sliding:4096", AttentionSpec("sliding", window=4096)),
])
def test_parse_accepts_the_four_forms_and_round_trips(text, spec):
    assert parse_attention(text) == spec
    assert parse_attention(str(spec)) == spec
    assert parse_attention(spec) is spec


@pytest.mark.parametrize("text,why", [
    ("flash", "unknown attention 'flash'"), ("gqa", "needs its number: gqa:<kv_heads>"),
    ("sliding", "sliding:<window>"), ("gqa:0", "positive integer"), ("sliding:-3", "positive integer"),
    ("gqa:two", "unknown attention"), ("linear:4", "unknown attention"), (4, "must be a string"),
])
def test_parse_refuses_bad_strings_listing_the_accepted_forms(text, why):
    with pytest.raises(RecipeError) as e:
        parse_attention(text, file="suite.yaml", field="variants[1].attention")
    assert why in e.value.detail
    assert e.value.accepted == ACCEPTED == "sdpa | gqa:<kv_heads> | linear | sliding:<window>"
    assert e.value.one_line().startswith("suite.yaml: variants[1].attention:")


def test_options_are_validated_with_a_typed_error():
    assert parse_attention_options(None) == AttentionOptions()
    assert parse_attention_options({"linear_state_dtype": "model"}).linear_state_dtype == "model"
    with pytest.raises(RecipeError, match="linear_state_dtype"):
        parse_attention_options({"linear_state_dtype": "fp8"})
    with pytest.raises(RecipeError, match="attention option 'chunk'"):
        parse_attention_options({"chunk": 4})


def _llama(kv=KV, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=kv, max_position_embeddings=256)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().to(dtype)


@pytest.fixture(scope="module")
def llama():
    return _llama()


PER_TOKEN_FP32 = 2 * LAYERS * KV * HEAD_DIM * 4


@pytest.mark.parametrize("spec,per_token,window,state", [
    ("sdpa", PER_TOKEN_FP32, None, 0),
    ("gqa:2", PER_TOKEN_FP32 // 2, None, 0),
    ("sliding:16", PER_TOKEN_FP32, 16, 0),
    ("linear", 0, None, LAYERS * KV * (HEAD_DIM * HEAD_DIM + HEAD_DIM) * 4),
])
def test_facts_state_cache_bytes(llama, spec, per_token, window, state):
    facts = apply_attention(copy.deepcopy(llama), spec)
    assert facts["attention"] == spec and facts["kind"] == spec.split(":")[0]
    assert (facts["kv_cache_bytes_per_token"], facts["window"], facts["state_bytes_per_sequence"]) == \
        (per_token, window, state)
    assert facts["kv_heads"] == (2 if spec == "gqa:2" else KV) and facts["heads"] == HEADS
    assert facts["kernels"] and isinstance(facts["notes"], tuple)
    for n, b in facts["kv_cache_bytes_per_sequence"].items():
        assert b == kv_cache_bytes_per_sequence(facts, int(n))
    long = kv_cache_bytes_per_sequence(facts, 8192)
    assert long == (per_token * min(8192, window or 8192) + state)
    assert kv_cache_bytes_per_sequence(facts, 8192, batch=3) == 3 * long
    import json
    json.dumps(facts.to_json())  # goes into the worker's JSON result as it is


def test_linear_state_in_model_dtype_is_reported():
    facts = apply_attention(_llama(dtype=torch.bfloat16), "linear", {"linear_state_dtype": "model"})
    assert facts["state_bytes_per_sequence"] == LAYERS * KV * (HEAD_DIM * HEAD_DIM + HEAD_DIM) * 2
    assert facts["linear_state_dtype"] == "model" and any("bf16" in n for n in facts["notes"])


@pytest.mark.parametrize("spec", ["sdpa", "gqa:2", "gqa:1", "sliding:5", "sliding:64", "linear"])
def test_facts_equal_the_bytes_a_real_cache_holds(llama, spec):
    from transformers import DynamicCache
    model = copy.deepcopy(llama)
    facts = apply_attention(model, spec)
    for n in (3, 20):
        cache = DynamicCache()
        with torch.inference_mode():
            model(input_ids=torch.arange(n)[None] % 64, past_key_values=cache, use_cache=True)
        assert cache_bytes(cache) == kv_cache_bytes_per_sequence(facts, n)


def test_refuses_a_model_whose_attention_cannot_be_swapped():
    from transformers import OPTConfig, OPTForCausalLM
    opt = OPTForCausalLM(OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32))
    for spec in ("gqa:2", "linear", "sliding:8"):
        with pytest.raises(RecipeError) as e:
            apply_attention(opt, spec)
        assert "OPTForCausalLM" in e.value.detail and "LlamaForCausalLM" in e.value.detail
        assert "attention: sdpa" in e.value.accepted


def test_refuses_a_second_attention_recipe(llama):
    model = copy.deepcopy(llama)
    apply_attention(model, "linear")
    with pytest.raises(RecipeError, match="already converted"):
        apply_attention(model, "sliding:4")


@pytest.mark.parametrize("kv_heads,accepted", [(3, "gqa:1 | gqa:2 | gqa:4"), (8, "gqa:1 | gqa:2 | gqa:4")])
def test_gqa_refuses_a_head_count_that_does_not_divide(llama, kv_heads, accepted):
    model = copy.deepcopy(llama)
    model.set_attn_implementation("eager")
    with pytest.raises(RecipeError) as e:
        apply_attention(model, f"gqa:{kv_heads}")
    assert "4 key/value heads" in e.value.detail and e.value.accepted == accepted
    assert model.config._attn_implementation == "eager"  # refused before anything changed
    assert model.config.num_key_value_heads == KV


def test_gqa_refuses_quantized_projections(llama):
    from variantlab.variants.registry import get_recipe, parse_options
    model = copy.deepcopy(llama)
    recipe = get_recipe("int8")
    recipe.apply(model, parse_options(recipe, {"dequant": "python"}), "cpu")
    with pytest.raises(RecipeError, match="before quantization"):
        apply_attention(model, "gqa:2")
