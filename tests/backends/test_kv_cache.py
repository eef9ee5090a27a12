"""Preallocated KV caches (backends/kv_cache.py) and the engine's fast path against its reference.

The reference is the same engine with transformers' growing DynamicCache (`static_cache=False`):
greedy output must be equal token for token, for every recipe and attention kind, alone and in
batches, and after a cache was reused (its stale contents must never be read)."""
from __future__ import annotations

import copy

import pytest
import torch

from variantlab.backends.base import GenerationRequest, run_requests
from variantlab.backends.kv_cache import KVCaches, rewind, static_cache_fits
from variantlab.backends.torch_engine import TorchEngine

pytestmark = pytest.mark.model

PROMPTS = ["Q: hi\nA:", "a: 1\nQ: What is the a?\nA:",
           "order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA:"]


def tokens(engine, prompts, n=10):
    reqs = [GenerationRequest(f"r{i}", prompt=p, max_new_tokens=n, stop_on_eos=False) for i, p in enumerate(prompts)]
    return [r.token_ids for r in run_requests(engine, reqs)]


def test_a_cache_is_reused_by_batch_and_bucket_and_rewound(tiny_lm):
    model, _ = tiny_lm
    caches = KVCaches(model, bucket=64, keep=2)
    assert caches.static and caches.length_for(1) == 64 and caches.length_for(65) == 128
    a = caches.acquire(1, 30)
    assert caches.acquire(1, 60) is a                  # same batch, same bucket: the same tensors
    assert caches.acquire(2, 30) is not a
    caches.acquire(1, 100)                             # a third shape: the least recently used goes
    assert caches.acquire(2, 30) is not a and len(caches._pool) == 2


def test_rewind_empties_a_cache_without_zeroing_it(tiny_lm):
    model, tok = tiny_lm
    engine = TorchEngine(model, tok, "cpu")
    tokens(engine, PROMPTS[:1])
    (cache,) = engine.caches._pool.values()
    assert int(cache.get_seq_length()) > 0
    before = cache.layers[0].keys.clone()
    rewind(cache)
    assert int(cache.get_seq_length()) == 0 and torch.equal(cache.layers[0].keys, before)


def test_a_reused_cache_never_reads_what_the_last_request_left(tiny_lm):
    model, tok = tiny_lm
    fresh = [tokens(TorchEngine(model, tok, "cpu"), [p]) for p in PROMPTS]
    engine = TorchEngine(model, tok, "cpu")
    tokens(engine, [PROMPTS[2]], n=40)                 # fills the bucket past what the others use
    assert [tokens(engine, [p]) for p in reversed(PROMPTS)] == list(reversed(fresh))


@pytest.mark.parametrize("recipe", ["fp32", "bf16", "int8", "int4", "w8a8", "w4a8"])
@pytest.mark.parametrize("attention", [None, "gqa:1", "linear", "sliding:8"])
def test_the_fast_path_equals_the_reference_for_every_recipe_and_attention_kind(tiny_model_dir, recipe, attention):
    """The same variant (our kernels where they run) with the static cache and with the growing one.
    Ours against aten is tests/variants/test_decode_kernels.py's."""
    from variantlab.variants.build import VariantDefinition, build
    options = {"group_size": 32} if recipe in ("int4", "w4a8") else {}
    built = build(tiny_model_dir, VariantDefinition("v", recipe, options, attention), "cpu")
    fast = TorchEngine(built.model, built.tokenizer, "cpu")
    ref = TorchEngine(built.model, built.tokenizer, "cpu", static_cache=False)
    assert fast.caches.static == (attention in (None, "gqa:1"))   # linear and sliding keep their own layers
    assert tokens(fast, PROMPTS) == tokens(ref, PROMPTS)          # a left-padded batch
    assert [tokens(fast, [p]) for p in PROMPTS] == [tokens(ref, [p]) for p in PROMPTS]


def test_a_native_sliding_window_works_with_the_static_cache(tiny_model_dir):
    """Mistral's own sliding window (transformers' static sliding layers), across the window's edge."""
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                             sliding_window=16, initializer_range=0.5)).eval()
    assert static_cache_fits(model)
    fast, ref = TorchEngine(model, tok, "cpu"), TorchEngine(copy.deepcopy(model), tok, "cpu", static_cache=False)
    assert tokens(fast, PROMPTS, n=30) == tokens(ref, PROMPTS, n=30)
    assert [tokens(fast, [p], n=30) for p in PROMPTS] == [tokens(ref, [p], n=30) for p in PROMPTS]


@pytest.mark.slow
def test_the_compiled_decode_step_equals_the_reference(tiny_lm):
    model, tok = tiny_lm
    compiled = TorchEngine(model, tok, "cpu", compile_step=True)
    ref = TorchEngine(model, tok, "cpu", static_cache=False)
    assert compiled._decode is not compiled._forward
    assert tokens(compiled, PROMPTS) == tokens(ref, PROMPTS)
    assert tokens(compiled, PROMPTS[:1]) == tokens(ref, PROMPTS[:1])


@pytest.mark.slow
def test_two_compiled_engines_never_share_a_graph(tiny_model_dir):
    """Guards on the model's modules are skipped, so each engine compiles a code object of its own: a
    second variant in the same process (here int8 after fp32, other module types) gets its own graph.
    fp32 activations: inductor keeps fused bf16 intermediates in fp32, which can flip a near-tie in bf16."""
    from variantlab.variants.build import VariantDefinition, build
    for recipe, options in (("fp32", {}), ("int8", {"compute_dtype": "fp32"})):
        built = build(tiny_model_dir, VariantDefinition(recipe, recipe, options), "cpu")
        compiled = TorchEngine(built.model, built.tokenizer, "cpu", compile_step=True)
        ref = TorchEngine(built.model, built.tokenizer, "cpu", static_cache=False)
        assert tokens(compiled, PROMPTS[:1]) == tokens(ref, PROMPTS[:1]), recipe
