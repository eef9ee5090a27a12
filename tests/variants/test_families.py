"""The families users bring, each on a tiny random checkpoint generated here (hidden 64, 2 layers, 4 heads,
the session's tokenizer), through every quantized recipe and every attention kind:

    gpt2     GPT2LMHeadModel: Conv1D projections (weight [in, out]), fused c_attn, tied LM head, no rotary
    phi3     Phi3ForCausalLM: fused qkv_proj and gate_up_proj, partial rotary (0.5), 2 K/V heads
    gemma    GemmaForCausalLM: scaled embeddings (× sqrt(hidden)), tied LM head, head_dim 16
    gemma2   Gemma2ForCausalLM: soft-capped attention and final logits, sliding/full layers, no sdpa
    gemma3   Gemma3ForCausalLM: q/k norms per head, sliding/full layers with their own rotary bases
    neox     GPTNeoXForCausalLM: fused query_key_value interleaved per head, parallel residual, rotary 0.25

For each: the variant runs a forward and a short greedy generation, whose KV-cached decode equals greedy
decoding without a cache (the naive reference); quantized layers are all swapped; `dequant: python`
agrees with the kernel path; the artifact loads back bit-identical; gqa:<its K/V heads> is the identity and
sliding with a window longer than the sequence is full attention, while a pooled gqa, a short window and
linear attention change the outputs; what cannot work is refused in one line naming the model class, in
the planning process (config.json only) and at build time.

These run with our decode kernels switched off (the `aten_only` fixture): KV-cached decode then
computes what the naive reference computes up to aten's own rounding. Ours against aten on every
family is tests/variants/test_decode_kernels.py's.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml
from conftest import FAMILIES
from torch import nn
from transformers.pytorch_utils import Conv1D

from variantlab.errors import RecipeError
from variantlab.variants import artifact as art
from variantlab.variants.kernel_linear import KernelLinear
from variantlab.variants import quant_linear as ql
from variantlab.variants.attention import apply_attention, check_attention_for
from variantlab.variants.build import VariantDefinition, build

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("aten_only")]

QUANT = {  # case: (recipe, options); int4 and w4a8 at the default group_size 64
    "int8": ("int8", {}),
    "w8a8": ("w8a8", {}),
    "int4": ("int4", {}),
    "w4a8": ("w4a8", {}),
    "mixed": ("mixed", {"calibration_samples": 4, "sensitivity_samples": 2, "max_calibration_tokens": 24}),
    # 4 or 16 bits: some layers stay the model's own (GPT-2's a Conv1D beside quantized ones)
    "mixed-4-16": ("mixed", {"calibration_samples": 4, "sensitivity_samples": 2, "max_calibration_tokens": 24,
                             "candidates": [4, 16]}),
    "int8-embeddings-head": ("int8", {"quantize_embeddings": True, "quantize_lm_head": True}),
}
KV_HEADS = {"gpt2": 4, "phi3": 2, "gemma": 2, "gemma2": 2, "gemma3": 2, "neox": 4}
POOLS = {"phi3", "gemma", "gemma2", "gemma3"}          # gqa:1 pools K/V heads; gpt2 and neox refuse it
PROMPT_LEN, NEW_TOKENS = 9, 4


@pytest.fixture(scope="module")
def family_models(family_dirs):
    """family → (model, tokenizer) loaded in fp32; copy.deepcopy before changing one."""
    from variantlab.models.loading import load_causal_lm
    return {f: load_causal_lm(d, torch.float32, "cpu") for f, d in family_dirs.items()}


def _ids(vocab: int, n: int = PROMPT_LEN, batch: int = 1, seed: int = 0):
    return torch.randint(3, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits.float()


def greedy(model, ids, n: int = NEW_TOKENS) -> list[int]:
    """KV-cached greedy decode (prefill, then one token a step), checked against the naive reference:
    greedy without a cache, the whole sequence each step. Returns the new tokens."""
    from transformers import DynamicCache
    cache, out = DynamicCache(), []
    with torch.inference_mode():
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        for _ in range(n):
            out.append(int(logits[0, -1].argmax()))
            logits = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True).logits
    naive, seq = [], ids
    for _ in range(n):
        naive.append(int(_logits(model, seq)[0, -1].argmax()))
        seq = torch.cat([seq, torch.tensor([[naive[-1]]])], dim=1)
    assert out == naive
    return out


def _unswapped(model) -> list[str]:
    """Names of the plain nn.Linear / Conv1D layers left (KernelLinear: an nn.Linear on our decode GEMV)."""
    return [n for n, m in model.named_modules() if type(m) in (nn.Linear, KernelLinear, Conv1D)]


def _round_trip(built, source, out_dir) -> None:
    """Save `built` as an artifact, load it back: the same modules, state and outputs, bit for bit."""
    model = built.model
    art.save_artifact(model, built.tokenizer, built.facts, built.definition.recipe, built.definition.options,
                      source, out_dir, attention=built.definition.attention_json)
    loaded, _, _ = art.load_artifact(out_dir, "cpu")
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(t.dtype == theirs[k].dtype and torch.equal(t, theirs[k]) for k, t in mine.items())
    ids = _ids(model.config.vocab_size, 7, batch=3, seed=1)  # M >= 4 rows: the batched kernel paths too
    for x in (ids[:1, :1], ids):
        assert torch.equal(_logits(model, x), _logits(loaded, x))


# ------------------------------------------------------------------------------------ quantized recipes

@pytest.mark.parametrize("case", list(QUANT))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_quantized_recipe_builds_runs_and_round_trips(family_dirs, tmp_path, family, case):
    recipe, options = QUANT[case]
    src = family_dirs[family]
    built = build(src, VariantDefinition(case, recipe, options), "cpu")
    model = built.model
    left = _unswapped(model)
    if recipe == "mixed":   # the plan's 16-bit layers stay the model's own (GPT-2's stay Conv1D)
        plan = built.facts.extra["plan"]
        assert sorted(left) == sorted([n for n, b in plan.items() if b == 16] + ["lm_head"])
        if case == "mixed-4-16":
            assert set(plan.values()) == {4, 16}
    else:
        assert left == ([] if options.get("quantize_lm_head") else ["lm_head"])
    if options.get("quantize_embeddings"):
        assert isinstance(model.get_input_embeddings(), ql.Int8Embedding)
    assert len(greedy(model, _ids(model.config.vocab_size))) == NEW_TOKENS
    _python_path_agrees(src, case, recipe, options, built)
    _round_trip(built, src, tmp_path / "artifact")


def _python_path_agrees(src, case, recipe, options, built) -> None:
    """`dequant: python` (the naive reference) against the kernel path: in fp32 where the recipe allows it
    (bf16 rounding of the two orders of operations would hide a real difference), mixed in bf16."""
    if recipe != "mixed":
        options = options | {"compute_dtype": "fp32"}
        built = build(src, VariantDefinition(case, recipe, options), "cpu")
    python = build(src, VariantDefinition(case, recipe, options | {"dequant": "python"}), "cpu")
    assert python.facts.kernels[0].startswith("python dequant")
    x = _ids(built.model.config.vocab_size, 12, batch=2)
    fast, ref = _logits(built.model, x), _logits(python.model, x)
    if recipe == "mixed":
        assert python.facts.extra["plan"] == built.facts.extra["plan"]
    if recipe in ("int8", "int4"):
        torch.testing.assert_close(fast, ref, rtol=1e-3, atol=1e-3)
    else:  # w8a8, w4a8: a last-bit difference upstream can flip an activation's int8 rounding downstream;
        #    mixed: bf16 rounds the two orders of operations apart by a few units in the last place
        assert (fast - ref).abs().max() <= 0.05 * ref.abs().max()
        assert (fast.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_gpt2_conv1d_is_quantized_as_the_linear_it_equals(family_models):
    model, _ = family_models["gpt2"]
    conv = model.transformer.h[0].attn.c_attn                         # fused q|k|v, weight [64, 192]
    linear = ql.as_linear(conv)
    assert (linear.in_features, linear.out_features) == (64, 192)
    assert torch.equal(linear.weight, conv.weight.t()) and linear.weight.is_contiguous()
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(linear(x), conv(x))
        direct, via = ql.Int8WeightOnly(conv, torch.float32), ql.Int8WeightOnly(linear, torch.float32)
        assert torch.equal(direct.qweight, via.qweight) and torch.equal(direct.scales, via.scales)
        torch.testing.assert_close(direct(x), conv(x), rtol=0.05, atol=0.05)


def test_a_scaled_embedding_is_quantized_with_its_scale(family_models):
    """Gemma multiplies its embedding rows by sqrt(hidden) in forward; the int8 table holds the scaled rows."""
    from variantlab.variants.registry import get_recipe, parse_options
    model, _ = family_models["gemma"]
    model = copy.deepcopy(model)
    ids = _ids(model.config.vocab_size, 6)
    with torch.no_grad():
        want = model.get_input_embeddings()(ids)
    assert want.abs().max() > 2 * model.get_input_embeddings().weight.abs().max()  # the scale is there
    recipe = get_recipe("int8")
    recipe.apply(model, parse_options(recipe, {"quantize_embeddings": True, "compute_dtype": "fp32"}), "cpu")
    with torch.no_grad():
        got = model.get_input_embeddings()(ids)
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())


# ------------------------------------------------------------------------------------ attention kinds

def _kinds(family: str) -> list[str]:
    kv = KV_HEADS[family]
    return ["sdpa", f"gqa:{kv}", "gqa:1", "linear", "sliding:64", "sliding:3"]


def _refused(family: str, spec: str) -> bool:
    return (spec == "gqa:1" and family not in POOLS) or (spec == "sdpa" and family == "gemma2")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_attention_kind_runs_and_keeps_or_changes_outputs_as_it_should(family_models, family_dirs, family):
    base, _ = family_models[family]
    config = json.loads((family_dirs[family] / "config.json").read_text())
    ids = _ids(base.config.vocab_size, 24, batch=2)
    ref = _logits(base, ids)
    for spec in _kinds(family):
        if _refused(family, spec):
            continue
        check_attention_for(config, spec)   # the planning process lets it through
        model = copy.deepcopy(base)
        facts = apply_attention(model, spec)
        out = _logits(model, ids)
        assert len(greedy(model, ids[:1, :PROMPT_LEN])) == NEW_TOKENS, spec
        same = spec in ("sdpa", f"gqa:{KV_HEADS[family]}", "sliding:64")
        if spec.startswith("gqa:") and same:
            assert torch.equal(out, ref), spec                          # the identity, exactly
        elif same:
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=spec)
        else:
            assert (out - ref).abs().max() > 1e-2, spec                 # pooled, windowed, linear: another model
        assert facts["kv_heads"] == (1 if spec == "gqa:1" else KV_HEADS[family])


def test_phi3_gqa_pools_the_key_and_value_rows_inside_the_fused_projection(family_models):
    model, _ = family_models["phi3"]
    pooled = copy.deepcopy(model)
    apply_attention(pooled, "gqa:1")
    for old, new in zip(model.model.layers, pooled.model.layers):
        w0, w1 = old.self_attn.qkv_proj.weight, new.self_attn.qkv_proj.weight   # rows [q 64 | k 32 | v 32]
        assert w1.shape == (64 + 16 + 16, 64)
        assert torch.equal(w1[:64], w0[:64])
        torch.testing.assert_close(w1[64:80], w0[64:96].view(2, 16, 64).mean(0))
        torch.testing.assert_close(w1[80:], w0[96:].view(2, 16, 64).mean(0))
        assert new.self_attn.num_key_value_heads == 1 and new.self_attn.num_key_value_groups == 4
    assert pooled.config.num_key_value_heads == 1


def test_gemma2_sliding_computes_what_its_own_soft_capped_window_computes(family_models):
    """Every layer a Gemma2 sliding layer of window 5 (transformers' eager, soft-capped) = our sliding:5."""
    from transformers import Gemma2ForCausalLM
    base, _ = family_models["gemma2"]
    cfg = copy.deepcopy(base.config)
    cfg.sliding_window, cfg.layer_types = 5, ["sliding_attention"] * 2
    native = Gemma2ForCausalLM(cfg).eval()
    native.load_state_dict(base.state_dict())
    ours = copy.deepcopy(native)
    facts = apply_attention(ours, "sliding:5")
    assert any("soft-capped at 50" in n for n in facts["notes"])
    ids = _ids(cfg.vocab_size, 20, batch=2)
    assert (_logits(native, ids) - _logits(base, ids)).abs().max() > 1e-2
    torch.testing.assert_close(_logits(ours, ids), _logits(native, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "phi3", "neox"])
@pytest.mark.parametrize("spec", ["linear", "sliding:3"])
def test_fused_layouts_left_padded_batch_matches_each_row_alone(family_models, family, spec):
    model, _ = family_models[family]
    model = copy.deepcopy(model)
    apply_attention(model, spec)
    ids = _ids(model.config.vocab_size, 10, batch=2, seed=2)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        batch = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(batch[1, 4:], _logits(model, ids[1:, 4:])[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(batch[0], _logits(model, ids[:1])[0], rtol=1e-4, atol=1e-4)


ATTENTION_THEN_QUANT = [("gqa", "int4"), ("linear", "w8a8"), ("sliding:3", "w4a8"), ("sdpa", "int8")]


@pytest.mark.parametrize("kind,recipe", ATTENTION_THEN_QUANT, ids=[f"{k}+{r}" for k, r in ATTENTION_THEN_QUANT])
@pytest.mark.parametrize("family", FAMILIES)
def test_an_attention_conversion_then_a_recipe_builds_runs_and_round_trips(family_dirs, tmp_path, family, kind,
                                                                          recipe):
    spec = (f"gqa:{1 if family in POOLS else KV_HEADS[family]}" if kind == "gqa"
            else "gqa:2" if kind == "sdpa" and family == "gemma2" else kind)   # gemma2 has no sdpa
    built = build(family_dirs[family], VariantDefinition(f"{kind}-{recipe}", recipe, {}, spec), "cpu")
    assert _unswapped(built.model) == ["lm_head"]
    assert built.facts.attention.attention == spec
    assert len(greedy(built.model, _ids(built.model.config.vocab_size))) == NEW_TOKENS
    _round_trip(built, family_dirs[family], tmp_path / "artifact")


# ------------------------------------------------------------------------------------ refusals

REFUSED = [("gpt2", "gqa:2", "GPT2LMHeadModel", "gqa:4 (the identity)"),
           ("neox", "gqa:1", "GPTNeoXForCausalLM", "gqa:4 (the identity)"),
           ("gemma2", "sdpa", "Gemma2ForCausalLM", "gqa:<kv_heads> | linear | sliding:<window>")]


@pytest.mark.parametrize("family,spec,cls,accepted", REFUSED, ids=[f"{f}-{s}" for f, s, _, _ in REFUSED])
def test_what_cannot_work_is_refused_in_one_line_while_planning_and_building(family_models, family_dirs, tmp_path,
                                                                             family, spec, cls, accepted):
    from variantlab.measure.plan import plan_suite_file
    suite = {"name": "t", "model": str(family_dirs[family]),
             "variants": [{"name": "base", "recipe": "fp32"}, {"name": "v", "recipe": "int8", "attention": spec}],
             "workload": {"dataset": {"generator": "structured", "n": 2, "seed": 0}, "max_new_tokens": 2,
                          "scenarios": [{"type": "single-stream", "requests": 1, "warmup": 0}]}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    with pytest.raises(RecipeError) as planned:
        plan_suite_file(tmp_path / "suite.yaml")
    model = copy.deepcopy(family_models[family][0])
    with pytest.raises(RecipeError) as building:
        apply_attention(model, spec)
    for e in (planned.value, building.value):
        line = str(e)
        assert "\n" not in line and cls in e.detail and f"'{spec}'" in e.detail and accepted in e.accepted
    assert planned.value.field == "variants[1].attention"
    assert model.config._attn_implementation == family_models[family][0].config._attn_implementation  # untouched


def test_an_architecture_variantlab_does_not_convert_is_refused_but_sdpa_passes():
    config = {"architectures": ["BloomForCausalLM"], "n_head": 4}
    for spec in ("gqa:2", "linear", "sliding:8"):
        with pytest.raises(RecipeError) as e:
            check_attention_for(config, spec, field="variants[0].attention")
        assert "BloomForCausalLM" in e.value.detail and "Phi3ForCausalLM" in e.value.detail
        assert "\n" not in str(e.value)
    check_attention_for(config, "sdpa")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_attention_error_is_measured_through_each_familys_own_projections(family_models, family):
    """Fused projections (Phi-3's qkv_proj, GPT-2's c_attn, GPT-NeoX's per-head query_key_value) are
    filled in the layout each forward splits: fp32 attention then errs by rounding only (a wrong split
    would mix q, k and v, or heads, and still run), for the model's own attention and a converted one."""
    from variantlab.variants.attention_stability import model_attention_error
    base, _ = family_models[family]
    for spec in ("sdpa", "sliding:3") if family != "gemma2" else ("sliding:3",):
        model = copy.deepcopy(base)
        apply_attention(model, spec)
        rows = model_attention_error(model, (16, 40))
        assert [r.status for r in rows] == ["ok", "ok"], (spec, rows)
        assert all(r.rel_error < 1e-5 for r in rows), (spec, rows)
