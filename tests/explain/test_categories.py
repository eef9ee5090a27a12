"""Operator categories: the table's rules (unit), and every operator that every recipe, attention kind
and kernel path really runs under torch.profiler lands in a named category, never "other" (model)."""
from __future__ import annotations

import pytest

from variantlab.explain import categories as C
from variantlab.explain.categories import categorize, name_category


@pytest.mark.parametrize("name, category", [
    ("aten::addmm", C.GEMM), ("aten::mm", C.GEMM), ("aten::linear", C.GEMM), ("aten::_int_mm", C.GEMM),
    ("aten::_weight_int8pack_mm", C.GEMM), ("aten::_weight_int4pack_mm_for_cpu", C.GEMM),
    ("variantlab_kernels::w4a8_mm", C.GEMM), ("variantlab_kernels::decode_attention", C.ATTENTION),
    ("variantlab_kernels::embedding", C.MEMORY), ("variantlab_kernels::argmax", C.SAMPLING),
    ("variantlab_kernels::decode_next", C.OVERHEAD),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", C.ATTENTION), ("aten::softmax", C.ATTENTION),
    ("aten::quantize_per_tensor", C.QUANT), ("aten::_convert_weight_to_int4pack_for_cpu", C.QUANT),
    ("aten::layer_norm", C.NORM), ("aten::rms_norm", C.NORM), ("aten::silu", C.ELEMENTWISE),
    ("aten::add", C.ELEMENTWISE), ("aten::copy_", C.MEMORY), ("aten::index_copy_", C.MEMORY),
    ("aten::empty_strided", C.MEMORY), ("aten::argmax", C.SAMPLING),
    ("## Call CompiledFxGraph fabc123 ##", C.COMPILED), ("Torch-Compiled Region: 0/0", C.OVERHEAD),
    ("TorchDynamo Cache Lookup", C.OVERHEAD), ("AOTDispatcher Runtime Wrapper Prologue", C.OVERHEAD),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", C.GEMM), ("Memcpy DtoH (Device -> Pinned)", C.MEMORY),
    ("llama.cpp::llama_decode", C.RUNTIME), ("aten::frobnicate", C.OTHER),
])
def test_names(name, category):
    assert name_category(name) == category


def test_another_runtimes_step_stays_its_own_category_in_any_region():
    assert categorize("llama.cpp::llama_decode", C.ATTENTION_REGION) == C.RUNTIME


def test_a_name_must_match_whole():
    assert name_category("aten::mm_extra_thing") != C.GEMM   # fullmatch, not a prefix


@pytest.mark.parametrize("name, region, category", [
    ("aten::mul", C.QUANT_LINEAR, C.QUANT),            # dequantizing inside a quantized linear
    ("aten::copy_", C.QUANT_LINEAR, C.QUANT),
    ("variantlab_kernels::int8_mm", C.QUANT_LINEAR, C.GEMM),   # its matmul stays GEMM
    ("aten::mul", C.NORM_REGION, C.NORM),
    ("aten::mul", C.ATTENTION_REGION, C.ATTENTION),    # rotary, scores
    ("aten::index_copy_", C.ATTENTION_REGION, C.ATTENTION),   # the KV cache's write
    ("aten::argmax", C.ATTENTION_REGION, C.SAMPLING),
    ("aten::mul", C.LINEAR, C.ELEMENTWISE),
    ("aten::mul", None, C.ELEMENTWISE),
    ("aten::frobnicate", C.QUANT_LINEAR, C.OTHER),     # an unknown op is never hidden by its region
])
def test_regions(name, region, category):
    assert categorize(name, region) == category


def test_marks():
    assert C.is_mark(C.PHASE_MARK + "decode") and C.is_mark(C.REGION_MARK + "norm::LlamaRMSNorm")
    assert not C.is_mark("aten::mm")
    assert C.region_from_mark(C.REGION_MARK + "quantized linear::W4A8") == C.QUANT_LINEAR
    assert C.region_from_mark(C.PHASE_MARK + "decode") is None


def test_every_category_is_described():
    assert set(C.DESCRIPTIONS) == set(C.CATEGORIES)


# --- real profiler output of every recipe --------------------------------------------------------------

VARIANTS = [("fp32", {}, None), ("bf16", {}, None), ("fp16", {}, None), ("int8", {}, None), ("w8a8", {}, None),
            ("int4", {"group_size": 32}, None), ("w4a8", {"group_size": 32}, None),   # sparse: CUDA only (cuSPARSELt)
            ("mixed", {"group_size": 32, "calibration_samples": 4, "sensitivity_samples": 2}, None),
            ("int8", {"compute_dtype": "fp16", "quantize_embeddings": True, "quantize_lm_head": True}, None),
            ("fp32", {}, "gqa:1"), ("bf16", {}, "linear"), ("fp32", {}, "sliding:4")]


def _profile(path, recipe, options, attention, batch=2):
    import torch

    from variantlab.backends.base import GenerationRequest
    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.explain.profiling import profile_workload
    from variantlab.variants.build import VariantDefinition, build
    built = build(path, VariantDefinition("v", recipe, options, attention), "cpu",
                  calibration_texts=["order 12 total 3.50 paid"] * 8)
    engine = TorchEngine(built.model, built.tokenizer, "cpu")
    prompts = ["order 12 from ann", "invoice 7 total"]
    requests = [GenerationRequest(f"r{i}", prompt_ids=tuple(engine.encode(p)), max_new_tokens=4, stop_on_eos=False)
                for i, p in enumerate(prompts)]
    with torch.inference_mode():
        return profile_workload(engine, built.model, [requests[:1], requests[:batch]], reps=1, device="cpu",
                                profiled_reps=1)


def _categories(got) -> dict:
    seen = {}
    for run in got["profiled"]:
        for phase, ops in run["ops"].items():
            for (name, category, region) in ops:
                seen.setdefault(category, set()).add((phase, name, region))
    return seen


@pytest.mark.parametrize("recipe, options, attention", VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("kernels", ["ours", "aten"])
def test_every_operator_of_every_recipe_has_a_category(tiny_model_dir, monkeypatch, recipe, options, attention,
                                                       kernels):
    from tests.conftest import switch_off_our_kernels
    if kernels == "aten":
        switch_off_our_kernels(monkeypatch)
    got = _profile(tiny_model_dir, recipe, options, attention)
    seen = _categories(got)
    assert C.OTHER not in seen, f"uncategorised operators: {sorted(map(str, seen[C.OTHER]))}"
    assert C.GEMM in seen and C.ATTENTION in seen and C.NORM in seen
    assert got["marked_modules"] > 0
    if recipe in ("int8", "w8a8", "int4", "w4a8", "sparse", "mixed"):
        assert any(region == C.QUANT_LINEAR for ops in seen.values() for (_, _, region) in ops)
    for phase in ("prefill", "decode"):
        assert any(phase == p for ops in seen.values() for (p, _, _) in ops), phase


@pytest.mark.parametrize("family", ["gpt2", "phi3", "gemma", "gemma2", "gemma3", "neox"])
@pytest.mark.parametrize("recipe, attention", [("fp32", None), ("w8a8", None), ("bf16", "linear")])
def test_every_family_has_its_operators_categorised(family_dirs, family, recipe, attention):
    seen = _categories(_profile(family_dirs[family], recipe, {}, attention))
    assert C.OTHER not in seen, f"uncategorised operators: {sorted(map(str, seen[C.OTHER]))}"
    assert C.GEMM in seen and C.NORM in seen and C.ATTENTION in seen


def test_python_dequantization_is_charged_to_quantize(tiny_model_dir):
    """int8's python path dequantizes with aten ops (to, mul) inside the quantized linear: quantize/dequantize."""
    got = _profile(tiny_model_dir, "int8", {"dequant": "python"}, None)
    quant = _categories(got).get(C.QUANT, set())
    assert {name for (_, name, _) in quant} & {"aten::mul", "aten::to", "aten::_to_copy", "aten::copy_"}


@pytest.mark.slow
def test_a_compiled_decode_step_is_a_compiled_graph(tiny_model_dir):
    import torch

    from variantlab.backends.base import GenerationRequest
    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.explain.profiling import profile_workload
    from variantlab.variants.build import VariantDefinition, build
    built = build(tiny_model_dir, VariantDefinition("v", "fp32"), "cpu")
    engine = TorchEngine(built.model, built.tokenizer, "cpu", compile_step=True)
    req = GenerationRequest("r", prompt_ids=tuple(engine.encode("order 12")), max_new_tokens=4, stop_on_eos=False)
    with torch.inference_mode():
        got = profile_workload(engine, built.model, [[req]], reps=1, device="cpu", profiled_reps=1)
    decode = {c for (_, c, _) in got["profiled"][0]["ops"]["decode"]}
    assert C.COMPILED in decode and C.OTHER not in decode

