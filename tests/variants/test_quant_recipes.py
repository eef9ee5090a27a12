"""Quantization recipes on tiny random models: what `apply` swaps, what it keeps, what it reports,
what it refuses; and the analysis vocabulary (variants/quant.py)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from variantlab.errors import RecipeError, UnsupportedOnHardware
from variantlab.variants import kernels
from variantlab.variants import quant_linear as ql
from variantlab.variants.quant import recipe_from_analysis_vocabulary
from variantlab.variants.registry import RECIPES, get_recipe, parse_options

pytestmark = pytest.mark.model

QUANT = ["int8", "w8a8", "int4", "w4a8"]
VOCAB, HIDDEN, INTER = 128, 64, 128


def _llama(intermediate=INTER, seed=0, tie=False):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tie)  # the default init (0.02): wider ones amplify any noise chaotically
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def llama():
    model = _llama()
    ids = torch.randint(0, VOCAB, (4, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    return model, ids, logits


def _apply(model, name, **options):
    recipe = get_recipe(name)
    m = copy.deepcopy(model)
    facts = recipe.apply(m, parse_options(recipe, options), "cpu")
    return m, facts


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids).logits.float()


def _decoder_linears(model):
    return [n for n, m in model.named_modules() if n.startswith("model.layers.") and
            isinstance(m, (nn.Linear, ql.QuantLinear))]


@pytest.mark.parametrize("name", QUANT)
def test_apply_swaps_every_decoder_linear_and_keeps_head_and_embeddings(llama, name):
    base, ids, ref = llama
    model, facts = _apply(base, name)
    names = _decoder_linears(model)
    assert len(names) == 2 * 7
    assert all(isinstance(model.get_submodule(n), ql.QuantLinear) for n in names)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.bfloat16
    embed = model.model.embed_tokens
    assert isinstance(embed, nn.Embedding) and embed.weight.dtype == torch.bfloat16
    assert facts.recipe == name and facts.dtype == "bf16" and facts.extra["quantized_layers"] == 14
    assert "aten::mm (bf16)" in facts.kernels and any("lm_head" in n for n in facts.notes)
    out = _logits(model, ids)
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    rel = ((out - ref).norm() / ref.norm()).item()
    eight_bit = "4" not in name
    assert agree >= (0.95 if eight_bit else 0.85)  # bf16 alone: 1.0 here; measured int8 1.0, int4 0.94
    assert rel < (0.03 if eight_bit else 0.2)     # bf16 alone: 0.005; int8 0.008; int4 0.09


@pytest.mark.parametrize("name,kernel", [("int8", "aten::_weight_int8pack_mm"), ("w8a8", "aten::_int_mm"),
                                         ("int4", "aten::_weight_int4pack_mm_for_cpu"),
                                         ("w4a8", "ours: torch._int_mm per int4 group (int8 activations)")])
def test_facts_name_the_cpu_kernel(aten_only, llama, name, kernel):
    _, facts = _apply(llama[0], name)
    assert facts.kernels[0] == kernel


def _expected_bytes(model, per_linear):
    """bytes of every quantized decoder linear by `per_linear(n, k)` + bf16 for everything else."""
    total_params = sum(p.numel() for p in model.parameters())
    lin = [model.get_submodule(n) for n in _decoder_linears(model)]
    q_params = sum(m.in_features * m.out_features for m in lin)
    q_bytes = sum(per_linear(m.out_features, m.in_features) for m in lin)
    return total_params, q_params, q_bytes, q_bytes + 2 * (total_params - q_params)


@pytest.mark.parametrize("name,per_linear", [
    ("int8", lambda n, k: n * k + 2 * n),                       # int8 weight + bf16 scale per row
    ("w8a8", lambda n, k: n * k + 2 * n),
    ("int4", lambda n, k: n * k // 2 + 2 * 2 * n * (k // 64)),  # nibbles + bf16 scale and zero per group
    ("w4a8", lambda n, k: n * k // 2 + 2 * 2 * n * (k // 64)),  # stored packed too (resident: int8)
])
def test_facts_report_stored_bytes_and_bits_per_weight(llama, name, per_linear):
    params, q_params, q_bytes, total = _expected_bytes(llama[0], per_linear)
    _, facts = _apply(llama[0], name)
    assert facts.parameters == params
    assert facts.weight_bytes == total
    assert facts.bits_per_weight == pytest.approx(8 * total / params)
    assert facts.extra["quantized_bytes"] == q_bytes
    expected_bits = {"int8": 8.0, "w8a8": 8.0, "int4": 4.5, "w4a8": 4.5}[name]
    assert facts.extra["quantized_bits_per_weight"] == pytest.approx(expected_bits, abs=0.25)


def test_int4_g64_is_four_and_a_half_bits_and_python_path_also_packs(llama):
    for name in ("int4", "w4a8"):
        for dequant in ("kernel", "python"):
            _, facts = _apply(llama[0], name, dequant=dequant)
            assert facts.extra["quantized_bits_per_weight"] == 4.5, (name, dequant)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_w4a8_stores_packed_int4_and_holds_int8(aten_only, llama, group_size):
    """Stored (weight_bytes): 4 bits a weight + bf16 scale and zero per group, K padded to the group;
    resident: the same with one byte a weight instead of half (the kernel reads int8)."""
    def padded(k):
        return -(-k // group_size) * group_size

    base = llama[0]
    params, q_params, q_bytes, total = _expected_bytes(
        base, lambda n, k: n * padded(k) // 2 + 2 * 2 * n * (padded(k) // group_size))
    model, facts = _apply(base, "w4a8", group_size=group_size, pad_to_group=group_size > HIDDEN)
    assert facts.weight_bytes == total and facts.extra["quantized_bytes"] == q_bytes
    layers = [model.get_submodule(n) for n in _decoder_linears(model)]
    unpacked = sum(m.out_features * padded(m.in_features) // 2 for m in layers)
    assert facts.extra["resident_bytes"] == total + unpacked > facts.weight_bytes
    if group_size <= HIDDEN:  # no padding: exactly 4 + 32/group_size bits a quantized weight
        assert facts.extra["quantized_bits_per_weight"] == 4 + 32 / group_size
    _, python = _apply(base, "w4a8", group_size=group_size, pad_to_group=group_size > HIDDEN, dequant="python")
    assert python.weight_bytes == python.extra["resident_bytes"] == total  # stores and runs the packed form


# Options that fit the conftest model (in_features 32 and 64) and keep calibration short.
_TINY_OPTIONS = {"int4": {"group_size": 32}, "w4a8": {"group_size": 32},
                 "mixed": {"group_size": 32, "calibration_samples": 2}}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_reports_resident_bytes(tiny_model_dir, name):
    """facts.extra["resident_bytes"]: parameters and persistent buffers as they run (RoPE's inv_freq, which
    the config computes, is in neither figure). Equal to the stored bytes for every recipe but w4a8."""
    from variantlab.models.loading import load_causal_lm
    recipe = get_recipe(name)
    reason = recipe.unsupported_reason("cpu")
    if reason:
        pytest.skip(reason)
    options = parse_options(recipe, _TINY_OPTIONS.get(name, {}))
    model, _ = load_causal_lm(tiny_model_dir, recipe.load_dtype(options), "cpu")
    facts = recipe.apply(model, options, "cpu")
    tensors = [*model.parameters(), *(b for n, b in model.named_buffers() if "inv_freq" not in n)]
    assert facts.extra["resident_bytes"] == sum(t.numel() * t.element_size() for t in tensors)
    if name == "w4a8" and not kernels.available():   # int4 unpacked to int8 for torch._int_mm
        assert facts.extra["resident_bytes"] > facts.weight_bytes
    else:
        assert facts.extra["resident_bytes"] == facts.weight_bytes


@pytest.mark.parametrize("name", QUANT)
def test_python_dequant_gives_the_kernel_paths_outputs(llama, name):
    base, ids, _ = llama
    fast, _ = _apply(base, name, compute_dtype="fp32")
    slow, facts = _apply(base, name, compute_dtype="fp32", dequant="python")
    assert facts.kernels[0].startswith("python dequant")
    a, b = _logits(fast, ids), _logits(slow, ids)
    if name in ("int8", "int4"):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
    else:  # a last-bit difference upstream can flip an activation's int8 rounding downstream
        assert (a - b).abs().max() <= 0.01 * b.abs().max()
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.98


def test_quantize_lm_head_swaps_it_too(llama):
    model, facts = _apply(llama[0], "int8", quantize_lm_head=True)
    assert isinstance(model.lm_head, ql.Int8WeightOnly)
    assert facts.extra["quantized_layers"] == 15
    assert "aten::mm (bf16)" not in facts.kernels


def test_tied_head_quantized_is_noted():
    model = _llama(tie=True)
    facts = get_recipe("int8").apply(model, parse_options(get_recipe("int8"), {"quantize_lm_head": True}), "cpu")
    assert any("tied" in n for n in facts.notes)


def test_compute_dtype_sets_load_dtype_and_model_dtype(llama):
    recipe = get_recipe("int4")
    assert recipe.load_dtype(parse_options(recipe, {})) == torch.bfloat16
    assert recipe.load_dtype(parse_options(recipe, {"compute_dtype": "fp16"})) == torch.float16
    model, facts = _apply(llama[0], "int4", compute_dtype="fp32")
    assert facts.dtype == "fp32" and model.lm_head.weight.dtype == torch.float32


# --- refusals ----------------------------------------------------------------------------------

def test_sparse_is_unsupported_on_cpu_and_the_others_are_supported():
    reason = get_recipe("sparse").unsupported_reason("cpu")
    assert reason.startswith("unsupported on this hardware:") and "CUDA" in reason
    for name in QUANT:
        assert get_recipe(name).unsupported_reason("cpu") is None


def test_gpt2_conv1d_layers_are_quantized():  # every family and recipe: tests/variants/test_families.py
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    model, facts = _apply(model, "int8")
    assert isinstance(model.transformer.h[0].attn.c_attn, ql.Int8WeightOnly)
    assert (model.transformer.h[0].attn.c_attn.in_features, model.transformer.h[0].attn.c_attn.out_features) == (32, 96)
    assert facts.extra["quantized_layers"] == 4


class _HeadOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(16, 32), nn.Linear(32, 16, bias=False)

    def get_output_embeddings(self):
        return self.head


def test_a_model_with_nothing_to_quantize_is_refused():
    with pytest.raises(RecipeError, match="no quantizable layers.*besides the LM head"):
        _apply(_HeadOnly(), "int8")
    _, facts = _apply(_HeadOnly(), "int8", quantize_lm_head=True)
    assert facts.extra["quantized_layers"] == 1


def test_bad_group_size_names_the_layer_and_the_sizes_that_fit():
    model = _llama(intermediate=96)  # down_proj in_features 96: 64 and 128 do not divide it, 32 does
    with pytest.raises(RecipeError, match="group_size 64 does not divide in_features 96 of layer "
                                          "'model.layers.0.mlp.down_proj'") as e:
        _apply(model, "int4")
    assert "accepted: group_size 32 for this model" in str(e.value)
    _apply(model, "int4", group_size=32)


def test_pad_to_group_runs_a_model_no_group_size_divides(llama):
    model = _llama(intermediate=88)  # 88: none of 32/64/128 divides it
    ids = llama[1]
    with pytest.raises(RecipeError, match="none of 32 | 64 | 128 divides"):
        _apply(model, "w4a8")
    ref = _logits(model, ids)
    for name in ("int4", "w4a8"):
        q, facts = _apply(model, name, pad_to_group=True, compute_dtype="fp32")
        assert any("zero-padded" in n for n in facts.notes)
        assert (_logits(q, ids).argmax(-1) == ref.argmax(-1)).float().mean() >= 0.85


@pytest.mark.parametrize("options,match", [({"group_size": 48}, "group_size"),
                                           ({"bits": 3}, "bits"), ({"dequant": "triton"}, "dequant")])
def test_bad_options_are_recipe_errors(options, match):
    with pytest.raises(RecipeError, match=match):
        parse_options(get_recipe("int4"), options)


def test_group_size_is_not_an_option_of_per_channel_recipes():
    with pytest.raises(RecipeError, match="group_size"):
        parse_options(get_recipe("int8"), {"group_size": 64})


def test_every_quant_recipe_is_registered():
    assert {"int8", "w8a8", "int4", "w4a8", "sparse", "mixed"} <= set(RECIPES)


def test_unsupported_kernel_is_reported_not_crashed(llama, monkeypatch):
    from variantlab.variants import quant

    monkeypatch.setattr(quant, "_kernel_probe", lambda *a: "unsupported on this hardware: test")
    with pytest.raises(UnsupportedOnHardware, match="dequant: python runs anywhere"):
        _apply(llama[0], "int8")
    _apply(llama[0], "int8", dequant="python")


# --- worker-style: load in load_dtype, apply, KV-cached greedy decode -------------------------

def test_worker_style_build_and_decode(tiny_model_dir):
    from transformers import DynamicCache

    from variantlab.models.loading import load_causal_lm
    recipe = get_recipe("w4a8")
    options = parse_options(recipe, {"group_size": 32})  # the conftest model is 32 wide
    model, _ = load_causal_lm(tiny_model_dir, recipe.load_dtype(options), "cpu")
    facts = recipe.apply(model, options, "cpu")
    assert facts.extra["quantized_layers"] == 14
    ids = torch.tensor([[1, 5, 9, 11]])
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        for _ in range(5):
            nxt = out[:, -1].argmax(-1, keepdim=True)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
    assert torch.isfinite(out).all()


# --- the analysis's vocabulary -----------------------------------------------------------------

@pytest.mark.parametrize("words,expected", [
    (("int8", "fp16", "symmetric"), ("int8", {"compute_dtype": "fp16"})),
    (("int8", "bf16", None), ("int8", {})),
    (("int8", "int8", "symmetric"), ("w8a8", {})),
    (("int4", "fp16", "asymmetric"), ("int4", {"compute_dtype": "fp16"})),
    (("INT4", "bfloat16", "asymmetric"), ("int4", {})),
    (("int4", "int8", "asymmetric"), ("w4a8", {})),
    (("int4", "int8", None), ("w4a8", {})),
    (("int4", "int8", "symmetric"), ("w4a8", {"symmetric": True})),
    (("int4", "fp32", "symmetric"), ("int4", {"symmetric": True, "compute_dtype": "fp32"})),
    (("bf16", "bf16", None), ("bf16", {})),
])
def test_analysis_vocabulary_maps_to_recipes(words, expected):
    assert recipe_from_analysis_vocabulary(*words) == expected
    name, options = expected
    parse_options(get_recipe(name), options)  # and the result is a valid recipe + options


@pytest.mark.parametrize("words", [("int4", "int4", "asymmetric"), ("int8", "fp16", "asymmetric"),
                                   ("int8", "int8", "asymmetric"), ("fp8", "fp16", None), ("int8", "int16", None)])
def test_analysis_vocabulary_refuses_combinations_that_do_not_exist(words):
    with pytest.raises(RecipeError, match="no recipe for") as e:
        recipe_from_analysis_vocabulary(*words)
    assert "int4/int8 asymmetric or symmetric → w4a8" in str(e.value)


def _family(name: str):
    """A tiny random model of another transformers family whose linears are nn.Linear."""
    import transformers
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg_cls, model_cls = {"mistral": ("MistralConfig", "MistralForCausalLM"),
                          "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                          "phi3": ("Phi3Config", "Phi3ForCausalLM")}[name]
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**common)).eval()


@pytest.mark.parametrize("family", ["mistral", "qwen2", "phi3"])
@pytest.mark.parametrize("name", ["int8", "int4", "w8a8"])
def test_recipes_work_on_other_families(family, name):
    model = _family(family)
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    ref = _logits(model, ids)
    m, facts = _apply(model, name)
    assert _decoder_linears(m) and all(isinstance(m.get_submodule(n), ql.QuantLinear) for n in _decoder_linears(m))
    out = _logits(m, ids)
    assert torch.isfinite(out).all()
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.8, (family, name, agree)
    assert facts.bits_per_weight < 32


@pytest.mark.parametrize("dequant", ["kernel", "python"])
def test_quantize_embeddings_stores_int8_rows_and_keeps_outputs(llama, dequant):
    model, ids, logits = llama
    q, facts = _apply(model, "int8", quantize_embeddings=True, compute_dtype="fp32", dequant=dequant)
    emb = q.get_input_embeddings()
    assert isinstance(emb, ql.Int8Embedding) and emb.qweight.dtype == torch.int8
    plain, plain_facts = _apply(model, "int8", compute_dtype="fp32")
    assert facts.weight_bytes < plain_facts.weight_bytes  # the table went from 4 bytes a weight to ~1
    agree = (_logits(q, ids).argmax(-1) == logits.argmax(-1)).float().mean().item()
    assert agree >= 0.9
    assert any("embedding" in k for k in facts.kernels)


def test_quantize_embeddings_on_a_tied_model_says_it_split_the_tie_and_what_it_costs():
    """Issue 13: the head keeps its bf16 copy of the tied table and the int8 table comes beside it, so
    the variant grows against plain int8 (the tie kept); the facts say so, with the sizes."""
    tied = _llama(tie=True)
    split, facts = _apply(tied, "int8", quantize_embeddings=True)
    _, plain = _apply(tied, "int8")
    table = VOCAB * HIDDEN
    assert isinstance(split.get_input_embeddings(), ql.Int8Embedding) and split.lm_head.weight.dtype == torch.bfloat16
    assert facts.weight_bytes - plain.weight_bytes == table + VOCAB * 2   # int8 rows + a bf16 scale per row
    assert facts.extra["weight_bytes_with_tie_kept"] == plain.weight_bytes
    split_note = "split the LM head's tie to the input embeddings"
    note = next(n for n in facts.notes if split_note in n)
    assert f"bf16 copy ({2 * table / 2**20:.2f} MiB)" in note
    assert f"{facts.weight_bytes / 2**20:.2f} MiB against {plain.weight_bytes / 2**20:.2f} MiB" in note
    assert not any(split_note in n for n in plain.notes)
    _, untied = _apply(_llama(), "int8", quantize_embeddings=True)     # nothing to split: no such note
    assert not any(split_note in n for n in untied.notes) and "weight_bytes_with_tie_kept" not in untied.extra


def test_a_decode_step_reads_every_weight_but_the_embedding_table_a_lookup_needs(tiny_lm):
    import copy
    from variantlab.variants.recipe import decode_weight_bytes, resident_bytes
    model = copy.deepcopy(tiny_lm[0])
    emb = model.get_input_embeddings().weight
    row = emb.shape[1] * emb.element_size()
    assert decode_weight_bytes(model) == resident_bytes(model) - emb.numel() * emb.element_size() + row
    model.tie_weights() if model.config.tie_word_embeddings else setattr(model.lm_head, "weight", emb)
    assert decode_weight_bytes(model) == resident_bytes(model)     # a tied head reads the whole table
