"""What each profiled operator is doing: the categories a difference is attributed to, as data.

An operator is categorised by its name (`OP_PATTERNS`: the first pattern that matches wins) and
by the module it ran in (`REGIONS`), because a name alone cannot say why an op ran: an `aten::mul`
inside a quantized linear is dequantization, inside an RMSNorm it is normalization, inside an
attention module (outside its projections) it is attention, and anywhere else it is elementwise
work. The profiling worker marks each module's forward as a region (explain/profiling.py); the
innermost region an op ran in decides with its name (`categorize`).

Framework overhead is mostly not a pattern: it is the time of a phase that no operator covers
(Python, module calls, the decode loop), computed in explain/attribution.py; the ranges
torch.compile's runtime records around a compiled step (guards, wrappers) are charged to it too. "other" is where an operator no
pattern knows would land; tests/explain/test_categories.py profiles every recipe and attention kind
on a real model and fails if any operator does.
"""
from __future__ import annotations

import re

GEMM = "GEMM"
QUANT = "quantize/dequantize/pack"
ATTENTION = "attention"
NORM = "normalization"
ELEMENTWISE = "activation/elementwise"
MEMORY = "memory copy/layout"
SAMPLING = "sampling"
COMPILED = "compiled graph (fused kernels)"
OVERHEAD = "framework overhead"
OTHER = "other"
RUNTIME = "another runtime's graph (not broken down)"

CATEGORIES = (GEMM, QUANT, ATTENTION, NORM, ELEMENTWISE, MEMORY, SAMPLING, COMPILED, RUNTIME, OVERHEAD, OTHER)

DESCRIPTIONS = {
    GEMM: "matrix multiplies: dense, weight-only quantized (fused dequantize), int8×int8, ours or aten's",
    QUANT: "quantizing activations, dequantizing or unpacking weights, and the rest of a quantized linear",
    ATTENTION: "scores, softmax, the KV cache's reads and writes, rotary embedding: everything in an "
               "attention module outside its projections",
    NORM: "RMSNorm, LayerNorm",
    ELEMENTWISE: "activations (SiLU, GELU), residual adds, gating multiplies",
    MEMORY: "copies, casts, views, concatenation, allocation, embedding lookups",
    SAMPLING: "choosing the next token (argmax) and reading it back",
    COMPILED: "graphs torch.compile fused: one call covers what eager runs as many ops",
    OVERHEAD: "time no operator covers: Python, module calls, the decode loop; a compiled step's guards and wrappers",
    RUNTIME: "time inside another runtime's own step (llama.cpp's llama_decode: its matmuls, attention and norms "
             "run in ggml's graph, which llama-cpp-python does not time per operator)",
    OTHER: "operators no pattern knows (explain/categories.py)",
}

# (pattern, category): matched against the whole operator name, first match wins. CPU operators are
# "namespace::name"; CUDA kernels have their own names (the last GEMM and memory lines).
OP_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"variantlab_kernels::decode_attention", ATTENTION),
    (r"variantlab_kernels::\w+_mm", GEMM),
    # the parts of variantlab's decode step (variants/kernels/decode_step.cpp), each a range of its own
    (r"variantlab_kernels::(rotary_embedding|cache_write)", ATTENTION),
    (r"variantlab_kernels::rms_norm", NORM),
    (r"variantlab_kernels::(silu_mul|residual_add)", ELEMENTWISE),
    (r"variantlab_kernels::embedding", MEMORY),
    (r"variantlab_kernels::argmax", SAMPLING),
    (r"variantlab_kernels::(decode_layers|decode_next|decode_run)", OVERHEAD),   # their own time: the glue
    (r"aten::(_?scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*|_?softmax|_safe_softmax)",
     ATTENTION),
    (r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum|mv|addmv|dot|_int_mm|_addmm_activation|_scaled_mm|"
     r"_weight_int8pack_mm|_weight_int4pack_mm\w*|_dyn_quant_matmul_4bit)", GEMM),
    (r"aten::(quantize\w*|dequantize\w*|_convert_weight_to_int4pack\w*|_dyn_quant_pack\w*|"
     r"fake_quantize\w*|_fake_quantize\w*|q_\w+|int_repr)", QUANT),
    (r"aten::(native_|_fused_)?(layer_norm|rms_norm|group_norm|batch_norm)\w*", NORM),
    (r"aten::(argmax|argmin|topk|sort|multinomial|_local_scalar_dense|item|is_nonzero)", SAMPLING),
    (r"aten::(copy_|_copy_from\w*|_to_copy|to|type_as|contiguous|clone|cat|stack|index_copy_?|index_put_?|_index_put_impl_|"
     r"index_select|index|embedding|gather|scatter_?|slice|select|narrow|view|_unsafe_view|reshape|"
     r"_reshape_alias|view_as|transpose|permute|expand|expand_as|unsqueeze|squeeze|as_strided_?|t|numpy_T|split|"
     r"split_with_sizes|chunk|unbind|flatten|unflatten|movedim|empty|empty_strided|empty_like|zeros|zeros_like|"
     r"ones|ones_like|full|full_like|new_\w+|arange|fill_|zero_|resize_|detach_?|alias|lift_fresh|"
     r"resolve_conj|resolve_neg|pad|constant_pad_nd|roll|flip|repeat|repeat_interleave|result_type|"
     r"_has_compatible_shallow_copy_type|masked_select|nonzero|set_|tensor_split|diagonal|triu|tril|"
     r"_to_dense|to_dense|align_to|_unique2?|unique\w*|scalar_tensor|lift)", MEMORY),
    (r"aten::(dropout|feature_dropout|silu|silu_|gelu|gelu_|relu|relu_|tanh|tanh_|sigmoid|softplus|elu|leaky_relu|hardswish|"
     r"add|add_|sub|sub_|rsub|mul|mul_|div|div_|pow|pow_|rsqrt|sqrt|exp|exp_|log|log_|neg|abs|clamp|clamp_|"
     r"clamp_min|clamp_max|round|round_|trunc|where|masked_fill_?|cos|sin|mean|sum|amax|amin|max|min|"
     r"maximum|minimum|addcmul_?|addcdiv_?|cumsum|cumsum_|cumprod|eq|ne|lt|le|gt|ge|logical_\w+|"
     r"bitwise_\w+|__\w+__|floor|floor_divide|ceil|sign|reciprocal|lerp_?|any|all|isnan|isinf|isfinite|"
     r"nan_to_num|_foreach_\w+|remainder|fmod|erf|square|norm|linalg_vector_norm|var|std|prod|"
     r"outer|baddbmm_|exp2|log_softmax|_log_softmax|one_hot|bucketize|searchsorted)", ELEMENTWISE),
    (r".*(CompiledFxGraph|cpp_fused|triton_|inductor).*", COMPILED),
    (r"llama\.cpp::\w+", RUNTIME),        # the llama.cpp backend's own marks (backends/llamacpp.py `op_range`)
    (r"(Torch-Compiled Region|TorchDynamo|Pregraph bytecode|AOTDispatcher|Compiled Function|"
     r"CompiledFunction).*", OVERHEAD),   # the compiled step's guards and wrappers
    (r"(?i).*(gemm|gemv|cutlass|cublas|xmma|wgmma|sm\d+_.*mma|flash_fwd|fmha).*", GEMM),
    (r"(?i).*(memcpy|memset).*", MEMORY),
)
_COMPILED = [(re.compile(p), c) for p, c in OP_PATTERNS]

# Regions: the modules the profiling worker marks (explain/profiling.py `region_kind`), and how the
# innermost one an operator ran in turns its name category into the category it is charged to.
LINEAR, QUANT_LINEAR, NORM_REGION, ATTENTION_REGION = "linear", "quantized linear", "norm", "attention"
REGIONS = (LINEAR, QUANT_LINEAR, NORM_REGION, ATTENTION_REGION)
REGION_MARK = "variantlab::region::"     # record_function names: REGION_MARK + kind + "::" + module class
PHASE_MARK = "variantlab::phase::"


def name_category(name: str) -> str:
    """The category an operator's name alone gives (OTHER when no pattern matches)."""
    for pattern, category in _COMPILED:
        if pattern.fullmatch(name):
            return category
    return OTHER


def categorize(name: str, region: str | None) -> str:
    """The category an operator named `name` is charged to, when it ran in the innermost region `region`
    (one of REGIONS, or None outside every marked module)."""
    by_name = name_category(name)
    if by_name in (COMPILED, RUNTIME, OVERHEAD, OTHER):
        return by_name
    if region == QUANT_LINEAR:       # the matmul stays GEMM; the rest is the price of quantization
        return GEMM if by_name == GEMM else QUANT
    if region == NORM_REGION:
        return NORM
    if region == ATTENTION_REGION:   # projections are linear regions nested inside, so they never land here
        return ATTENTION if by_name in (GEMM, ELEMENTWISE, MEMORY, ATTENTION) else by_name
    return by_name


def is_mark(name: str) -> bool:
    """A record_function of ours (a phase or a region), not an operator."""
    return name.startswith("variantlab::")


def region_from_mark(name: str) -> str | None:
    """The region kind of a region mark's name, else None."""
    if not name.startswith(REGION_MARK):
        return None
    return name[len(REGION_MARK):].split("::", 1)[0]
