"""The per-variant attention-error row measures the attention path the built model really runs.

`model_attention_error` on the tiny random Llama and on the shipped reference model, converted by
`apply_attention` (sdpa, gqa, linear, sliding) and cast to fp32/bf16/fp16: the error is tiny in fp32
and larger in bf16; linear attention with its state in fp16 overflows at long lengths and says so;
quantized projections change nothing (they are isolated); and attention functions registered on the
model — one that returns NaN past 1,024 tokens, one that takes its softmax in fp16 — are what the row
reports, which a reimplementation of the kernel could not see. No timing is asserted.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import variantlab

from variantlab.variants.attention import apply_attention
from variantlab.variants.attention_stability import StabilityRow, attention_module, model_attention_error
from variantlab.variants.recipe import cast_parameters


pytestmark = pytest.mark.model

MODEL_DIR = Path(variantlab.__file__).parent / "models" / "tiny_structured"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def variant(model, spec: str, dtype: str, **options):
    m = copy.deepcopy(model)
    apply_attention(m, spec, options or None)
    cast_parameters(m, DTYPES[dtype])  # what the dtype recipes do
    return m.eval()


def errors(model, spec: str, lengths, **options) -> dict[str, list[StabilityRow]]:
    return {d: model_attention_error(variant(model, spec, d, **options), lengths) for d in DTYPES}


@pytest.fixture(scope="module")
def reference_model():
    if not (MODEL_DIR / "model.safetensors").is_file():
        pytest.skip("the reference model builtin:tiny-structured has not been trained")
    from variantlab.models.loading import load_causal_lm
    return load_causal_lm(MODEL_DIR, torch.float32, "cpu")[0]


# ------------------------------------------------------------------------------------ every kind, every dtype

@pytest.mark.parametrize("spec", ["sdpa", "gqa:1", "linear", "sliding:16"])
def test_tiny_model_error_is_tiny_in_fp32_and_larger_in_bf16(tiny_lm, spec):
    rows = errors(tiny_lm[0], spec, (64, 300))
    for d, mine in rows.items():
        assert [(r.dtype, r.length, r.status) for r in mine] == [(d, 64, "ok"), (d, 300, "ok")]
    for fp32, bf16, fp16 in zip(rows["fp32"], rows["bf16"], rows["fp16"]):
        assert 0 < fp32.rel_error < 1e-5     # > 0: the reference really ran in float64
        assert 1e-4 < bf16.rel_error < 2e-2
        assert fp32.rel_error < fp16.rel_error < bf16.rel_error
    assert all(r.to_json()["rel_error"] == r.rel_error for mine in rows.values() for r in mine)


@pytest.mark.parametrize("spec", ["sdpa", "gqa:2", "linear", "sliding:256"])
def test_reference_model_error_is_tiny_in_fp32_and_larger_in_bf16(reference_model, spec):
    rows = errors(reference_model, spec, (512,))
    fp32, bf16, fp16 = (rows[d][0] for d in DTYPES)
    assert fp32.status == bf16.status == fp16.status == "ok"
    assert 0 < fp32.rel_error < 1e-5 < fp16.rel_error < bf16.rel_error < 2e-2


def test_linear_state_in_fp16_overflows_at_long_lengths_and_is_reported(reference_model):
    # head_dim 32, unit-scale keys: the normaliser phi(q)·z ~ 32 · 1.3^2 · T passes fp16's 65504 by ~1,300 tokens
    model_state = model_attention_error(variant(reference_model, "linear", "fp16", linear_state_dtype="model"),
                                        (512, 2048))
    assert [r.status for r in model_state] == ["ok", "overflow"]
    assert model_state[1].rel_error > 1e-2 and model_state[1].flagged
    assert "state in model dtype" in model_state[0].variant
    fp32_state = model_attention_error(variant(reference_model, "linear", "fp16"), (2048,))[0]
    assert fp32_state.status == "ok" and fp32_state.rel_error < 1e-3


def test_tiny_model_linear_state_in_fp16_overflows(tiny_lm):
    # head_dim 16: the normaliser passes 65504 later, by ~2,500 tokens
    rows = model_attention_error(variant(tiny_lm[0], "linear", "fp16", linear_state_dtype="model"), (256, 4096))
    assert [r.status for r in rows] == ["ok", "overflow"]


# ------------------------------------------------------------------------------------ the path the model runs

def nan_past_1024(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa, except that it returns NaN for sequences longer than 1,024 tokens."""
    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if query.shape[-2] > 1024:
        out = out.clone()
        out[0, -1, 0, 0] = math.nan
    return out, weights


def fp16_softmax(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Causal attention with its softmax in fp16 and no max-subtraction, for any input short of float64."""
    g = module.num_key_value_groups
    k, v = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    scores = (query @ k.transpose(-1, -2)) * scaling
    t = scores.shape[-1]
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=scores.device).tril(), -math.inf)
    e = scores.to(torch.float16 if query.dtype != torch.float64 else query.dtype).exp()
    return ((e / e.sum(-1, keepdim=True)).to(query.dtype) @ v).transpose(1, 2).contiguous(), None


@pytest.fixture
def registered():
    names = {"variantlab-test-nan": nan_past_1024, "variantlab-test-fp16-softmax": fp16_softmax}
    for name, fn in names.items():
        ALL_ATTENTION_FUNCTIONS[name] = fn
    yield list(names)
    for name in names:
        del ALL_ATTENTION_FUNCTIONS[name]


def test_a_broken_attention_function_registered_on_the_model_is_what_the_row_reports(reference_model, registered):
    lengths = (512, 2048)
    sdpa = model_attention_error(reference_model, lengths, threshold=1e-4)
    nan_model, half_model = (copy.deepcopy(reference_model) for _ in registered)
    nan_model.set_attn_implementation("variantlab-test-nan")
    half_model.set_attn_implementation("variantlab-test-fp16-softmax")
    nan_rows = model_attention_error(nan_model, lengths, threshold=1e-4)
    half_rows = model_attention_error(half_model, lengths, threshold=1e-4)
    assert [r.status for r in sdpa] == ["ok", "ok"] and sdpa[0].variant.endswith("sdpa_attention_forward")
    assert [r.status for r in nan_rows] == ["ok", "nan"] and nan_rows[0].variant.endswith("nan_past_1024")
    assert nan_rows[1].to_json()["rel_error"] is None
    assert [r.status for r in half_rows] == ["flagged", "flagged"]
    assert all(h.rel_error > 100 * s.rel_error for h, s in zip(half_rows, sdpa))


def test_eager_attention_is_measured_through_its_own_function(tiny_lm):
    m = copy.deepcopy(tiny_lm[0])
    m.set_attn_implementation("eager")
    rows = model_attention_error(m, (64,))
    assert rows[0].variant.endswith("eager_attention_forward") and rows[0].status == "ok"
    assert rows[0].rel_error < 1e-5


def test_quantized_projections_are_isolated(tiny_lm):
    from variantlab.variants.registry import get_recipe, parse_options

    plain = variant(tiny_lm[0], "gqa:1", "bf16")
    quantized = copy.deepcopy(plain)
    recipe = get_recipe("int8")
    recipe.apply(quantized, parse_options(recipe, {"compute_dtype": "bf16"}), "cpu")
    assert type(attention_module(quantized).q_proj).__name__ != "Linear"
    assert model_attention_error(quantized, (64, 300)) == model_attention_error(plain, (64, 300))


def test_the_model_is_left_as_it_was(tiny_lm):
    m = variant(tiny_lm[0], "sliding:16", "fp32")
    ids = torch.arange(40)[None] % 50
    with torch.inference_mode():
        before = m(input_ids=ids).logits
    module = attention_module(m)
    children = dict(module._modules)
    model_attention_error(m, (64,))
    assert dict(module._modules) == children and not module._forward_pre_hooks
    with torch.inference_mode():
        torch.testing.assert_close(m(input_ids=ids).logits, before, rtol=0, atol=0)


def test_rows_are_reproducible_and_labelled_by_the_caller(tiny_lm):
    m = variant(tiny_lm[0], "linear", "bf16")
    a = model_attention_error(m, (64,), seed=3, label="linear")
    assert a == model_attention_error(m, (64,), seed=3, label="linear")
    assert a[0].variant == "linear" and a[0].dtype == "bf16"
    assert a != model_attention_error(m, (64,), seed=4, label="linear")
