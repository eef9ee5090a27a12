"""Attention recipes on tiny random Llama, Mistral and Qwen2 models, through a real KV-cached loop.

- gqa with kv_heads = the checkpoint's is the identity; fewer heads are the mean of each group.
- sliding with a window as long as the sequence is full attention; with a shorter one it computes
  what Mistral's own sliding window computes.
- every variant decodes (prefill, then one token at a time with past_key_values, as
  backends/torch_engine.py does) the logits its own full prefill gives at the same positions, also in
  left-padded batches with an attention mask and position ids, and TorchEngine gives each request of
  a batch what it gives that request alone, for every variant.
"""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from variantlab.variants.attention import apply_attention

pytestmark = pytest.mark.model

VOCAB = 64
VARIANTS = [("sdpa", {}), ("gqa:2", {}), ("gqa:1", {}), ("sliding:5", {}), ("sliding:64", {}),
            ("linear", {"linear_chunk": 4}), ("linear", {})]
IDS = [f"{s}{'-chunk4' if o else ''}" for s, o in VARIANTS]


def tiny(family: str, kv_heads: int = 2, **extra):
    import transformers as tf
    cls = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[family]
    config = getattr(tf, f"{cls}Config")(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=256, **extra)
    if family == "mistral":
        config.sliding_window = extra.get("sliding_window")
    torch.manual_seed(0)
    return getattr(tf, f"{cls}ForCausalLM")(config).eval()


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2"])
def family_model(request):
    return request.param, tiny(request.param)


def tokens(n, batch=1, seed=0):
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def logits(model, ids, **kw):
    with torch.inference_mode():
        return model(input_ids=ids, **kw).logits.float()


def converted(model, spec, options=None):
    m = copy.deepcopy(model)
    apply_attention(m, spec, options)
    return m


# ------------------------------------------------------------------------------------ gqa and sliding

@pytest.mark.parametrize("family,kv", [("llama", 4), ("mistral", 2), ("qwen2", 2)])
def test_gqa_with_every_kv_head_kept_equals_the_original(family, kv):
    model = tiny(family, kv_heads=kv)
    ids = tokens(24, batch=2)
    torch.testing.assert_close(logits(converted(model, f"gqa:{kv}"), ids), logits(model, ids), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_gqa_pools_key_and_value_heads_by_group_mean(family):
    model = tiny(family, kv_heads=4)
    m = converted(model, "gqa:2")
    for old, new in zip(model.model.layers, m.model.layers):
        for name in ("k_proj", "v_proj"):
            w0, w1 = getattr(old.self_attn, name), getattr(new.self_attn, name)
            torch.testing.assert_close(w1.weight, w0.weight.view(2, 2, 8, 32).mean(1).reshape(16, 32))
            if w0.bias is not None:  # qwen2 has K/V biases
                torch.testing.assert_close(w1.bias, w0.bias.view(2, 2, 8).mean(1).reshape(16))
        assert new.self_attn.num_key_value_groups == 2
    assert m.config.num_key_value_heads == 2
    assert torch.isfinite(logits(m, tokens(10))).all()


@pytest.mark.parametrize("window", [24, 100])
def test_sliding_with_a_window_at_least_the_length_equals_full_attention(family_model, window):
    _, model = family_model
    ids = tokens(24, batch=2)
    torch.testing.assert_close(logits(converted(model, f"sliding:{window}"), ids), logits(model, ids),
                               rtol=1e-5, atol=1e-4)


def test_sliding_on_llama_computes_what_mistral_own_window_computes():
    native = tiny("mistral", kv_heads=2, sliding_window=6)   # transformers' own sliding mask
    ours = converted(native, "sliding:6")
    ids = tokens(30, batch=2)
    assert not torch.allclose(logits(native, ids), logits(tiny("mistral", kv_heads=2), ids), atol=1e-2)
    torch.testing.assert_close(logits(ours, ids), logits(native, ids), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------------ decode == prefill

def cached_loop(model, ids, prefill: int, mask=None):
    """torch_engine's loop, teacher-forced: prefill `prefill` tokens, then one token per forward."""
    cache = DynamicCache()
    kw = {}
    if mask is not None:
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        kw = {"attention_mask": mask[:, :prefill], "position_ids": pos[:, :prefill]}
    with torch.inference_mode():
        out = [model(input_ids=ids[:, :prefill], past_key_values=cache, use_cache=True, **kw).logits]
        for t in range(prefill, ids.shape[1]):
            if mask is not None:
                kw = {"attention_mask": mask[:, :t + 1], "position_ids": pos[:, t:t + 1]}
            out.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True, **kw).logits)
    return torch.cat(out, dim=1).float(), cache


@pytest.mark.parametrize("spec,options", VARIANTS, ids=IDS)
def test_decode_matches_its_own_prefill(family_model, spec, options):
    _, model = family_model
    m = converted(model, spec, options)
    ids = tokens(20, batch=2)
    full = logits(m, ids)
    stepped, cache = cached_loop(m, ids, prefill=7)
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)
    assert torch.testing.assert_close(logits(m, ids, use_cache=False), full) is None
    if spec.startswith("sliding"):
        assert all(layer.keys.shape[-2] <= int(spec.split(":")[1]) for layer in cache.layers)


@pytest.mark.parametrize("spec,options", VARIANTS, ids=IDS)
def test_left_padded_batch_matches_each_sequence_alone(family_model, spec, options):
    """Rows of different lengths, left-padded; every real position's logits equal the row run alone."""
    _, model = family_model
    m = converted(model, spec, options)
    lengths, total, prefill = (16, 9, 12), 16, 12
    ids = tokens(total, batch=3, seed=1)
    mask = torch.zeros(3, total, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = 1
    padded = torch.where(mask.bool(), ids, 0)
    batch, _ = cached_loop(m, padded, prefill, mask)
    for b, n in enumerate(lengths):
        alone, _ = cached_loop(m, ids[b:b + 1, total - n:], prefill - (total - n))
        torch.testing.assert_close(batch[b, total - n:], alone[0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------ the real backend

PROMPTS = ["Q: hi\nA:", "a: 1\nQ: What is the a?\nA:",
           "order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA:"]


@pytest.mark.parametrize("spec,options", [("sdpa", {}), ("gqa:1", {}), ("sliding:4", {}),
                                          ("linear", {"linear_chunk": 4})], ids=["sdpa", "gqa1", "sliding4", "linear"])
def test_engine_batch_equals_one_at_a_time(tiny_lm, spec, options):
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine
    model, tok = tiny_lm
    engine = TorchEngine(converted(model, spec, options), tok, "cpu", "tok")
    requests = [GenerationRequest(f"r{i}", prompt=p, max_new_tokens=12, stop=("\n",)) for i, p in enumerate(PROMPTS)]
    singles = [run_requests(engine, [r])[0] for r in requests]
    batch = run_requests(engine, requests)
    for s, b in zip(singles, batch):
        assert (b.token_ids, b.output_text, b.tokens_in, b.finish_reason) == \
            (s.token_ids, s.output_text, s.tokens_in, s.finish_reason)
    # and the engine equals greedy decoding without a cache (the whole sequence each step)
    ids = tok(PROMPTS[2], return_tensors="pt").input_ids
    out = []
    for _ in range(singles[2].tokens_out):
        nxt = int(logits(engine.model, ids)[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    assert list(singles[2].token_ids) == out
    assert singles[2].output_text == tok.decode(out, skip_special_tokens=True).split("\n", 1)[0].strip()


@pytest.mark.parametrize("spec", ["gqa:1", "linear", "sliding:4"])
def test_quantization_applies_after_the_attention_recipe(spec):
    from variantlab.variants import quant_linear as ql
    from variantlab.variants.registry import get_recipe, parse_options
    model = converted(tiny("llama", kv_heads=2), spec)
    recipe = get_recipe("int8")
    recipe.apply(model, parse_options(recipe, {"dequant": "python"}), "cpu")
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.k_proj, ql.QuantLinear) and isinstance(attn.q_proj, ql.QuantLinear)
    ids = tokens(12)
    stepped, _ = cached_loop(model, ids, prefill=5)
    assert torch.isfinite(stepped).all()
    assert (stepped.argmax(-1) == logits(model, ids).argmax(-1)).float().mean() > 0.9
