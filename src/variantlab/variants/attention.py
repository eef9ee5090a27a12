"""Attention recipes: one checkpoint, four attention mechanisms, each with its cache cost stated.

    sdpa               the model's own softmax attention through torch's scaled_dot_product_attention
    gqa:<kv_heads>     grouped-query attention made from the checkpoint: the key and value projection
                       heads of each group are mean-pooled (Ainslie et al. 2023, "GQA", section 2.2);
                       kv_heads = the checkpoint's K/V head count is the identity
    linear             causal linear attention, phi = elu + 1 (Katharopoulos et al. 2020); a state of
                       constant size instead of a KV cache (attention_linear.py)
    sliding:<window>   softmax over the last `window` tokens; a rolling KV cache that never holds more
                       than `window` tokens (attention_sliding.py)

The analysis this project answers (DESIGN.md) quotes thresholds — standard attention below 512
tokens, GQA to 2048, linear above, sliding window for real time. These recipes exist so that the
thresholds are measured instead (benchmarks/attention_scaling.py, attention_stability.py).

Seam: `parse_attention("gqa:4")` → `AttentionSpec`; `apply_attention(model, spec, options)` converts a
loaded model in place and returns JSON-ready facts (kind, heads, KV-cache bytes per token and per
sequence, state bytes, kernels, notes). It runs after loading and before a quantization recipe's
`apply`, so gqa's pooled projections are what gets quantized. sdpa and gqa keep transformers' own
attention code (its "sdpa" implementation, which passes enable_gqa or packs the query heads instead
of repeating K/V where the kernel allows); linear and sliding swap the attention modules
(attention_module.py) and work with an unmodified DynamicCache decode loop, batched or not.
Supported: Llama, Mistral and Qwen2 checkpoints; others are refused with RecipeError.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import RecipeError

ACCEPTED = "sdpa | gqa:<kv_heads> | linear | sliding:<window>"
SUPPORTED_MODELS = "Llama, Mistral and Qwen2 checkpoints (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)"
REPORT_LENGTHS = (128, 512, 2048, 8192, 32768)
_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


@dataclass(frozen=True)
class AttentionSpec:
    kind: Literal["sdpa", "gqa", "linear", "sliding"]
    kv_heads: int | None = None   # gqa only
    window: int | None = None     # sliding only

    def __str__(self) -> str:
        arg = self.kv_heads if self.kind == "gqa" else self.window if self.kind == "sliding" else None
        return self.kind if arg is None else f"{self.kind}:{arg}"


class AttentionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    linear_state_dtype: Literal["fp32", "model"] = Field(
        "fp32", description="linear: accumulate the state in fp32, or in the model's dtype (shows the instability)")
    linear_chunk: int = Field(64, ge=1, le=4096, description="linear: tokens per chunk of the parallel prefill form")


def parse_attention(text, *, file: str | None = None, field: str | None = None) -> AttentionSpec:
    """'sdpa' | 'gqa:<kv_heads>' | 'linear' | 'sliding:<window>' → AttentionSpec (an AttentionSpec passes)."""
    if isinstance(text, AttentionSpec):
        return text
    bad = lambda why: RecipeError(why, file=file, field=field, accepted=ACCEPTED)  # noqa: E731
    if not isinstance(text, str):
        raise bad(f"attention must be a string, got {type(text).__name__} {text!r}")
    s = text.strip().lower()
    if s in ("sdpa", "linear"):
        return AttentionSpec(s)
    m = re.fullmatch(r"(gqa|sliding)\s*:\s*(-?\d+)", s)
    if m is None:
        if s in ("gqa", "sliding"):
            raise bad(f"attention '{text}' needs its number: {s}:<{'kv_heads' if s == 'gqa' else 'window'}>")
        raise bad(f"unknown attention '{text}'")
    kind, n = m.group(1), int(m.group(2))
    if n < 1:
        raise bad(f"attention '{text}': the number must be a positive integer")
    return AttentionSpec("gqa", kv_heads=n) if kind == "gqa" else AttentionSpec("sliding", window=n)


def parse_attention_options(options, *, file: str | None = None, field: str | None = None) -> AttentionOptions:
    if isinstance(options, AttentionOptions):
        return options
    try:
        return AttentionOptions.model_validate(options or {})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise RecipeError(f"{err['msg']} for attention option '{loc}'", file=file, field=field,
                          accepted=", ".join(AttentionOptions.model_fields)) from None


# ---------------------------------------------------------------------------------------------- apply

def apply_attention(model, spec, options=None) -> dict:
    """Convert `model` in place to the attention `spec`; return facts about the result (JSON-ready)."""
    from . import attention_module  # torch and transformers: kept out of the parent process that parses suites

    spec, options = parse_attention(spec), parse_attention_options(options)
    modules = _attention_modules(model, spec)
    notes: list[str] = []
    if spec.kind == "gqa":
        _check_gqa(model, modules, spec.kv_heads)  # refuse before changing anything
    if spec.kind in ("sdpa", "gqa"):
        _set_sdpa(model)
    if spec.kind == "gqa":
        notes += _convert_to_gqa(model, modules, spec.kv_heads)
    elif spec.kind in ("linear", "sliding"):
        acc = None if options.linear_state_dtype == "model" else _torch_dtype("float32")
        runtime = attention_module.AttentionRuntime(spec.kind, spec.window, options.linear_chunk, acc)
        attention_module.swap(model, modules, runtime)
    return _facts(model, spec, options, notes + _native_window_notes(model, spec))


def _attention_modules(model, spec: AttentionSpec) -> list:
    """The decoder's attention modules; RecipeError when this model's cannot be converted."""
    from torch import nn

    from . import attention_module

    found = [m for m in model.modules() if isinstance(m, nn.Module) and type(m).__name__.endswith("Attention")]
    done = [m for m in found if isinstance(m, attention_module.SwappedAttention)]
    if done:
        raise RecipeError(f"the attention of {type(model).__name__} was already converted "
                          f"({type(done[0]).__name__}); apply one attention recipe to a freshly loaded model",
                          field="attention", accepted=ACCEPTED)
    names = sorted({type(m).__name__ for m in found})
    if spec.kind == "sdpa":
        return found
    if not found or any(n not in attention_module.SWAPPABLE for n in names):
        what = f"its attention modules are {', '.join(names)}" if names else "no attention module was found"
        raise RecipeError(f"attention '{spec}' cannot be applied to {type(model).__name__}: {what}, and variantlab "
                          f"converts only {', '.join(attention_module.SWAPPABLE)}", field="attention",
                          accepted=f"{SUPPORTED_MODELS}; or attention: sdpa")
    return found


def _set_sdpa(model) -> None:
    if model.config._attn_implementation == "sdpa":
        return
    try:
        model.set_attn_implementation("sdpa")
    except (ValueError, ImportError) as e:
        raise RecipeError(f"{type(model).__name__} cannot run its attention through scaled_dot_product_attention: "
                          f"{str(e).splitlines()[0]}", field="attention", accepted=SUPPORTED_MODELS) from None
    if model.config._attn_implementation != "sdpa":
        raise RecipeError(f"{type(model).__name__} does not support switching its attention to sdpa "
                          f"(it stays '{model.config._attn_implementation}')", field="attention",
                          accepted=SUPPORTED_MODELS)


def _kv_heads(cfg) -> int:
    return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


def _check_gqa(model, modules, kv_heads: int) -> None:
    from torch import nn

    heads, old = model.config.num_attention_heads, _kv_heads(model.config)
    divisors = [d for d in range(1, old + 1) if old % d == 0]
    if kv_heads not in divisors:
        raise RecipeError(f"gqa:{kv_heads} cannot be made from {type(model).__name__}'s {old} key/value heads "
                          f"({heads} query heads): mean-pooling needs kv_heads to divide {old}", field="attention",
                          accepted="gqa:" + " | gqa:".join(map(str, divisors)))
    for m in modules:
        for name in ("k_proj", "v_proj"):
            lin = getattr(m, name)
            if type(lin) is not nn.Linear:
                raise RecipeError(f"{name} of {type(m).__name__} is {type(lin).__name__}, not nn.Linear: apply the "
                                  "attention recipe before quantization", field="attention", accepted=ACCEPTED)


def _convert_to_gqa(model, modules, kv_heads: int) -> list[str]:
    """Mean-pool each group of consecutive K/V heads into one; update config and every module."""
    import torch
    from torch import nn

    cfg = model.config
    heads, old = cfg.num_attention_heads, _kv_heads(cfg)
    if kv_heads == old:
        return [f"gqa:{kv_heads} is the checkpoint's own head layout: nothing pooled"]
    pool = old // kv_heads
    for m in modules:
        for name in ("k_proj", "v_proj"):
            lin = getattr(m, name)
            w = lin.weight.detach().float().view(kv_heads, pool, -1, lin.in_features).mean(1)
            new = nn.Linear(lin.in_features, w.shape[0] * w.shape[1], bias=lin.bias is not None,
                            device=lin.weight.device, dtype=lin.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(w.reshape(-1, lin.in_features))
                if lin.bias is not None:
                    new.bias.copy_(lin.bias.detach().float().view(kv_heads, pool, -1).mean(1).reshape(-1))
            setattr(m, name, new)
        m.num_key_value_groups = heads // kv_heads
        if hasattr(m, "num_key_value_heads"):
            m.num_key_value_heads = kv_heads
    cfg.num_key_value_heads = kv_heads
    return [f"mean-pooled {old} key/value heads into {kv_heads} (groups of {pool}), without retraining: "
            "expect a quality loss; measure it against the baseline"]


def _native_window_notes(model, spec: AttentionSpec) -> list[str]:
    cfg = model.config
    native = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or []
    uses = native is not None and (getattr(cfg, "model_type", "") == "mistral" or "sliding_attention" in types)
    if not uses:
        return []
    if spec.kind in ("sdpa", "gqa"):
        return [f"the checkpoint's own sliding_window={native} applies to attention, but a DynamicCache() made "
                "without the config keeps every token: cache bytes are reported for the full length"]
    return [f"the checkpoint's own sliding_window={native} is replaced by attention '{spec}'"]


# ---------------------------------------------------------------------------------------------- facts

def _torch_dtype(name: str):
    import torch
    return getattr(torch, name)


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    return _DTYPE_NAMES.get(name, name)


def _facts(model, spec: AttentionSpec, options: AttentionOptions, notes: list[str]) -> dict:
    cfg = model.config
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    kv_heads = _kv_heads(cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    dtype = (emb.weight.dtype if hasattr(emb, "weight") else emb.dtype) if emb is not None \
        else next(model.parameters()).dtype  # the compute dtype
    elt = dtype.itemsize
    per_token, state, window = 2 * layers * kv_heads * head_dim * elt, 0, None
    if spec.kind == "sliding":
        window = spec.window
        notes = notes + ["padded batches add one byte per cached token and layer (the padding mask)"]
    if spec.kind == "linear":
        acc = dtype if options.linear_state_dtype == "model" else _torch_dtype("float32")
        state = layers * kv_heads * (head_dim * head_dim + head_dim) * acc.itemsize
        per_token = 0
        notes = notes + [f"state accumulated in {_dtype_name(acc)}", "linear attention replaces softmax without "
                         "retraining: outputs differ from the checkpoint's; measure accuracy before using it"]
    kernels = {
        "sdpa": ["torch.nn.functional.scaled_dot_product_attention (transformers 'sdpa')"],
        "gqa": ["torch.nn.functional.scaled_dot_product_attention (transformers 'sdpa', enable_gqa or packed "
                "query heads where the kernel allows, else repeated K/V)"],
        "linear": [f"ours: chunked parallel form (chunk {options.linear_chunk}) for prefill, recurrent state for "
                   "decode (torch matmul)"],
        "sliding": ["ours: banded scaled_dot_product_attention per block of queries; rolling KV cache"],
    }[spec.kind]
    facts = {"attention": str(spec), "kind": spec.kind, "implementation": cfg._attn_implementation,
             "layers": layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
             "cache_dtype": _dtype_name(dtype), "window": window,
             "kv_cache_bytes_per_token": per_token, "state_bytes_per_sequence": state,
             "linear_state_dtype": options.linear_state_dtype if spec.kind == "linear" else None,
             "kernels": kernels, "notes": notes}
    facts["kv_cache_bytes_max"] = (per_token * window + state if window else state if spec.kind == "linear" else None)
    facts["kv_cache_bytes_per_sequence"] = {str(n): kv_cache_bytes_per_sequence(facts, n) for n in REPORT_LENGTHS}
    return facts


def attention_facts(model) -> dict:
    """Facts of the model's own attention, unconverted (the same keys as apply_attention's)."""
    return _facts(model, parse_attention("sdpa"), parse_attention_options(None), []) | {
        "attention": "model's own", "implementation": model.config._attn_implementation}


def kv_cache_bytes_per_sequence(facts: dict, seq_len: int, batch: int = 1) -> int:
    """Bytes of KV cache (or linear state) one sequence of `seq_len` tokens holds, from `apply_attention`'s facts."""
    tokens = seq_len if facts.get("window") is None else min(seq_len, facts["window"])
    return batch * (facts["kv_cache_bytes_per_token"] * tokens + facts["state_bytes_per_sequence"])
