"""variantlab's decode step: every decoder layer of a Llama-family model in one call to our kernels.

transformers' eager forward runs a decode step as some forty aten ops and a dozen Python module calls per
layer; on a 2-core CPU that costs as much as the matmuls of a 100M-parameter model, and more than all of a
4-bit one's (benchmarks/engine_step.py). `DecodeStep` runs the same step as one C++ call over the same
weights and transformers' own static KV cache (kernels/decode_step.cpp, which says what it computes), with
the embedding lookup, rotary cos/sin, final norm, LM head and greedy choice around it from the model's own
modules. The prefill, scoring and any batch above 8 rows stay on transformers' forward.

It runs where `unsupported(model)` is None: a Llama, Mistral or Qwen2 decoder (RMSNorm, SiLU MLP, rotary
attention over a static cache, biases allowed, tied embeddings allowed), fp32 or bf16 activations, on a CPU
where our kernels run, and every linear one whose kernel it calls: fp32/bf16 (nn.Linear, KernelLinear), int8, int4,
w8a8 or w4a8 (quant_linear.py, kernel path). Anything else keeps transformers' forward, and the reason is
the engine's note. In fp32 its tokens are transformers' (tests/variants/test_decode_step.py).
"""
from __future__ import annotations

import torch
from torch import nn

from . import kernels as vk

LABEL = f"variantlab decode step (every decoder layer in one C++ call, {vk.ISA_NAME})"
FAMILIES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")
ATTENTIONS = ("sdpa", "eager", "variantlab_decode")   # implementations that read transformers' own cache
MAX_ROWS = 8
DENSE, INT8, INT4, W8A8, W4A8, INT4_DIGITS = range(6)
PROJECTIONS = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
               ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))
_EMPTY = torch.empty(0)


def linear_kind(module: nn.Module, dtype: torch.dtype) -> tuple[tuple[int, int, int, int], tuple] | str:
    """(kind, group size, out features, rows) and (a, b, bias, aux) for the C++ step, or why this linear cannot run
    in it. rows: up to how many activation rows our kernel runs it (kernels.OURS_UP_TO); above, aten's."""
    from .kernel_linear import KernelLinear
    from .quant_linear import W4A8 as W4A8Module
    from .quant_linear import W8A8 as W8A8Module
    from .quant_linear import Int4WeightOnly, Int8WeightOnly

    name = type(module).__name__
    bias = getattr(module, "bias", None)
    bias = _EMPTY if bias is None else bias.detach()
    if bias.numel() and bias.dtype != dtype:
        return f"{name}'s bias is {bias.dtype}, the activations {dtype}"
    if isinstance(module, KernelLinear) or type(module) is nn.Linear:
        w = module.weight.detach()
        if w.dtype != dtype or not w.is_contiguous():
            return f"a {w.dtype} linear under {dtype} activations"
        rows = vk.rows_up_to("fp32_mm" if dtype == torch.float32 else "bf16_mm", w.shape[1])
        return (DENSE, 0, w.shape[0], min(rows, MAX_ROWS)), (w, _EMPTY, bias, _EMPTY)
    if not hasattr(module, "path") or module.path != "kernel" or module.device_type != "cpu" or module.dtype != dtype:
        return f"{name} (path {getattr(module, 'path', '?')}, {getattr(module, 'dtype', '?')}) has no kernel here"
    if isinstance(module, Int8WeightOnly):
        sums = module.qweight.sum(1, dtype=torch.int32)   # each row's Σ q, once: the VNNI kernels never sum them
        rows = min(vk.rows_up_to(module.OURS_OP[dtype], module.in_features), MAX_ROWS)
        return (INT8, 0, module.out_features, rows), (module.qweight, module.scales, bias, sums)
    if isinstance(module, W8A8Module):
        sums = module.qweight.sum(1, dtype=torch.int32)
        return (W8A8, 0, module.out_features, MAX_ROWS), (module.qweight, module.scales, bias, sums)
    if getattr(module, "k_pad", 0):
        return f"{name} pads in_features {module.in_features} to its group size"
    if isinstance(module, Int4WeightOnly) and "scales_zeros" in module._buffers:
        return ((INT4_DIGITS, module.group_size, module.out_features, MAX_ROWS),
                (module.packed, module.scales_zeros, bias, _EMPTY))
    if isinstance(module, Int4WeightOnly):
        return ((INT4, module.group_size, module.out_features, 0),
                (module.packed, module.scales_and_zeros, bias, _EMPTY))
    if isinstance(module, W4A8Module) and "packed" in module._buffers:
        return ((W4A8, module.group_size, module.out_features, MAX_ROWS),
                (module.packed, module.scales_zeros, bias, _EMPTY))
    return f"{name} has no kernel in the decode step"


class DecodeStep:
    """`step(nxt, cache, mask, pos)` → next tokens (B, 1): TorchEngine's decode step, in one C++ call per step."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, tensors: list, ints: list[int]):
        self.model = model   # without a plan, its embedding, rotary, final norm and head are called at each step
        inner = model.model
        config = model.config
        self.dtype = dtype
        self.tensors, self.ints = tensors, ints
        attn = inner.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = attn.head_dim
        self.scale = float(attn.scaling)
        self.eps = float(inner.layers[0].input_layernorm.variance_epsilon)
        self.fallback = None     # transformers' step, for the calls this one does not take (set by the engine)
        self._lists: tuple = (None, None)
        self.plan = self._plan()   # the whole token in one call (decode_next), or None: decode_layers and modules
        self._bound = None         # the cache the plan is bound to
        self._rotary = None        # the rotary (cos, sin) tables, (positions, head_dim) each, for _bind

    @classmethod
    def for_model(cls, model: nn.Module) -> "DecodeStep | str":
        """The step for `model`, or one line saying why it cannot run it."""
        why = unsupported(model)
        if why:
            return why
        dtype = model.model.embed_tokens.weight.dtype if hasattr(model.model.embed_tokens, "weight") else \
            model.model.embed_tokens.dtype
        if dtype not in (torch.float32, torch.bfloat16):
            return f"its activations are {dtype} (the step takes fp32 or bf16)"
        tensors: list = []
        ints: list[int] = []
        for i, layer in enumerate(model.model.layers):
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                if norm.weight.dtype != dtype:
                    return f"layer {i}'s norm is {norm.weight.dtype} under {dtype} activations"
                tensors.append(norm.weight.detach())
            for parent, name in PROJECTIONS:
                got = linear_kind(getattr(getattr(layer, parent), name), dtype)
                if isinstance(got, str):
                    return f"layer {i} {parent}.{name}: {got}"
                ints.extend(got[0])
                tensors.extend(got[1])
        return cls(model, dtype, tensors, ints)

    def _plan(self):
        """decode_next's plan (kernels/decode_step.cpp: DecodePlan) where the embedding is a plain table, the final
        norm an RMSNorm, the head a linear the step runs and the rotary frequencies fixed (no dynamic or long RoPE,
        which change with the length); else None, and each step calls those modules around decode_layers."""
        inner, head = self.model.model, self.model.lm_head
        rope = getattr(inner.rotary_emb, "rope_type", None)
        if (type(inner.embed_tokens) is not nn.Embedding or inner.embed_tokens.weight.dtype != self.dtype
                or type(inner.norm).__name__ not in NORMS or inner.norm.weight.dtype != self.dtype
                or not isinstance(rope, str) or "dynamic" in rope or "longrope" in rope):
            return None
        got = linear_kind(head, self.dtype)
        if isinstance(got, str):
            return None
        (kind, group, n, rows), tensors = got
        return torch.classes.variantlab_kernels.DecodePlan(
            self.tensors, self.ints, inner.embed_tokens.weight.detach(), inner.norm.weight.detach(), list(tensors),
            [kind, group, n, rows], self.eps, float(inner.norm.variance_epsilon), self.heads, self.kv_heads,
            self.head_dim, self.scale)

    def _bind(self, cache) -> None:
        """The plan bound to `cache`: its layers' keys, values and counters, and the model's own rotary cos/sin
        of each of its positions (one call of the rotary module; each position's values are what a step's
        call would give: a product and a cos or sin per element). The table is made once for the longest cache
        so far and its first rows are handed to shorter ones: requests alternate between the engine's caches
        (one per length bucket), and making it anew took 85 of a rebinding's 130 us on the tiny model."""
        keys, values, counters = self._cache_lists(cache)
        length = keys[0].shape[2]
        if self._rotary is None or self._rotary[0].shape[0] < length:
            inner = self.model.model
            cos, sin = inner.rotary_emb(inner.embed_tokens.weight[:1], torch.arange(length).unsqueeze(0))  # (1, L, d)
            self._rotary = (cos[0].contiguous(), sin[0].contiguous())
        cos, sin = self._rotary
        self.plan.bind(keys, values, counters, cos[:length], sin[:length])
        self._bound = cache

    @staticmethod
    def runs(batch: int, cache) -> bool:
        """Whether this step takes a call of `batch` rows over `cache`: at most 8 rows, and a cache whose every
        layer is transformers' plain static layer, already written by the prefill."""
        from transformers.cache_utils import StaticLayer
        return batch <= MAX_ROWS and all(type(la) is StaticLayer and la.is_initialized for la in cache.layers)

    def _takes(self, batch: int, cache) -> bool:
        """`runs`, skipped for the cache whose lists are kept (it ran before)."""
        return self._lists[0] is cache or self.runs(batch, cache)

    def _cache_lists(self, cache) -> tuple[list, list, list]:
        if self._lists[0] is not cache:
            layers = cache.layers
            self._lists = (cache, ([la.keys for la in layers], [la.values for la in layers],
                                   [la.cumulative_length for la in layers]))
        return self._lists[1]

    def __call__(self, nxt: torch.Tensor, cache, mask, pos) -> torch.Tensor:
        batch = nxt.shape[0]
        if not self._takes(batch, cache):
            return self.fallback(nxt, cache, mask, pos)
        col = int(cache.layers[0].cumulative_length)
        length = col + 1
        keep = None if mask is None else mask[:, :length].bool()
        if self.plan is not None:
            if self._bound is not cache:
                self._bind(cache)
            return torch.ops.variantlab_kernels.decode_next(self.plan, nxt[:, 0], None if pos is None else pos[:, 0],
                                                            keep, col, length)
        model, inner = self.model, self.model.model
        h = inner.embed_tokens(nxt[:, 0]).contiguous()                                  # (B, D)
        positions = pos if pos is not None else torch.full((batch, 1), col, dtype=torch.long)
        cos, sin = inner.rotary_emb(h, positions)                                       # (B, 1, head_dim) each
        keys, values, counters = self._cache_lists(cache)
        torch.ops.variantlab_kernels.decode_layers(
            h, self.tensors, self.ints, keys, values, counters, cos.reshape(batch, -1).contiguous(),
            sin.reshape(batch, -1).contiguous(), keep, col, length, self.eps, self.heads, self.kv_heads,
            self.head_dim, self.scale)
        logits = model.lm_head(inner.norm(h))                                           # (B, V)
        return logits.argmax(-1, keepdim=True)

    def run(self, nxt: torch.Tensor, cache, steps: int, stop: torch.Tensor | None) -> tuple[list[int], list[float]] | None:
        """Up to `steps` greedy steps of one sequence in one C++ call (kernels/decode_step.cpp `decode_run`): the new
        tokens and the time.perf_counter() time each was chosen, ending with the first token whose `stop[id]` is
        true (bool [V]; None: none ends the call). None where only `__call__` runs: no plan, a batch, a cache the
        step does not take."""
        if self.plan is None or nxt.shape[0] != 1 or not self._takes(1, cache):
            return None
        if self._bound is not cache:
            self._bind(cache)
        tokens, times = torch.empty(steps, dtype=torch.long), torch.empty(steps, dtype=torch.float64)
        n = torch.ops.variantlab_kernels.decode_run(self.plan, nxt.view(1), stop, tokens, times)
        return tokens[:n].tolist(), times[:n].tolist()


def runs_config(config: dict) -> bool:
    """Whether the step would run a checkpoint of this config.json here (family, SiLU, no sliding window, our
    kernels): what planning reads before choosing to compile (measure/auto_recipe.py)."""
    archs = config.get("architectures") or ()
    sliding = config.get("sliding_window") and config.get("use_sliding_window", True)
    layer_types = config.get("layer_types") or ()
    return (bool(archs) and archs[0] in FAMILIES and config.get("hidden_act", "silu") == "silu" and not sliding
            and all(t == "full_attention" for t in layer_types) and vk.available())


def unsupported(model: nn.Module) -> str | None:
    """Why `DecodeStep` cannot run `model` (one line), or None."""
    name = type(model).__name__
    if name not in FAMILIES:
        return f"{name} is not one of its families ({', '.join(FAMILIES)})"
    if not any(p.device.type == "cpu" for p in model.parameters()):
        return "the model is not on the CPU"
    st = vk.status()
    if not st.available:
        return st.reason
    config = model.config
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act}, not silu"
    if getattr(config, "_attn_implementation", None) not in ATTENTIONS:
        return f"attention {config._attn_implementation!r} keeps cache layers of its own"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or ())):
        return "some layers use sliding-window attention"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"its attention slides (a window of {config.sliding_window} positions)"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "norm", "rotary_emb", "layers")):
        return f"{name} lacks the Llama layout (embed_tokens, layers, norm, rotary_emb)"
    layer = inner.layers[0]
    if type(layer.input_layernorm).__name__ not in NORMS:
        return f"its norm is {type(layer.input_layernorm).__name__}"
    attn = layer.self_attn
    if attn.head_dim > 256 or attn.head_dim % 2:
        return f"head_dim {attn.head_dim} (the step takes even sizes up to 256)"
    if any(hasattr(attn, a) for a in ("q_norm", "k_norm")):
        return "its attention normalizes q and k"
    return None
