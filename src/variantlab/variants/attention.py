"""Attention recipes: one checkpoint, four attention mechanisms, each with its cache cost stated.

    sdpa               the model's own softmax attention through torch's scaled_dot_product_attention
    gqa:<kv_heads>     grouped-query attention made from the checkpoint: the key and value projection
                       heads of each group are mean-pooled (Ainslie et al. 2023, "GQA", section 2.2);
                       kv_heads = the checkpoint's K/V head count is the identity
    linear             causal linear attention, phi = elu + 1 (Katharopoulos et al. 2020); a state of
                       constant size instead of a KV cache (attention_linear.py)
    sliding:<window>   softmax over the last `window` tokens; a rolling KV cache that never holds more
                       than `window` tokens (attention_sliding.py)

The analysis this project answers (docs/recipes.md, Attention) quotes thresholds — standard attention below 512
tokens, GQA to 2048, linear above, sliding window for real time. These recipes exist so that the
thresholds are measured instead (benchmarks/attention_scaling.py, attention_stability.py).

Seam: `parse_attention("gqa:4")` → `AttentionSpec`; `apply_attention(model, spec, options)` converts a
loaded model in place and returns JSON-ready facts (kind, heads, KV-cache bytes per token and per
sequence, state bytes, kernels, notes). It runs after loading and before a quantization recipe's
`apply`, so gqa's pooled projections are what gets quantized. sdpa and gqa keep transformers' own
attention code (its "sdpa" implementation, which passes enable_gqa or packs the query heads instead
of repeating K/V where the kernel allows); linear and sliding swap the attention modules
(attention_module.py) and work with an unmodified DynamicCache decode loop, batched or not.

Families (`FAMILIES`, torch-free: the planning process checks a variant against config.json with
`check_attention_for`, and `apply_attention` runs the same check on the loaded model):

    Llama, Mistral, Qwen2, Gemma, Gemma3   separate q/k/v projections (Gemma3: q/k norms): every kind
    Gemma2                                 the same, but no sdpa (soft-capped logits): gqa keeps its eager
                                           attention, sliding soft-caps as it does
    Phi-3                                  fused qkv_proj: gqa pools the K and V rows inside it; every kind
    GPT-2, GPT-NeoX                        fused projections that hold as many K/V heads as query heads:
                                           sdpa, linear, sliding, and gqa:<heads> (the identity) only

Anything else is refused with RecipeError naming the model class, except `sdpa`, which transformers
decides at build time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, ValidationError

from ..errors import RecipeError
from ..spec_model import SpecModel

ACCEPTED = "sdpa | gqa:<kv_heads> | linear | sliding:<window>"


@dataclass(frozen=True)
class Family:
    """One architecture's attention as variantlab converts it."""

    architecture: str    # the model class (config.json `architectures[0]`)
    attention: str       # its attention module's class
    layout: str          # how its projections hold q, k, v: a key of attention_module.LAYOUTS
    heads_key: str = "num_attention_heads"   # config.json's query head count
    no_pool: str = ""    # why gqa cannot pool its K/V heads ("": it can)
    no_sdpa: str = ""    # why transformers cannot run its softmax through sdpa ("": it can)


_FUSED_EQUAL = "and its config has no key/value head count, so it cannot hold fewer K/V heads than query heads"
FAMILIES: dict[str, Family] = {f.architecture: f for f in (
    Family("LlamaForCausalLM", "LlamaAttention", "separate"),
    Family("MistralForCausalLM", "MistralAttention", "separate"),
    Family("Qwen2ForCausalLM", "Qwen2Attention", "separate"),
    Family("GemmaForCausalLM", "GemmaAttention", "separate"),
    Family("Gemma2ForCausalLM", "Gemma2Attention", "separate",
           no_sdpa="transformers has no sdpa path for its soft-capped attention logits"),
    Family("Gemma3ForCausalLM", "Gemma3Attention", "separate"),
    Family("Phi3ForCausalLM", "Phi3Attention", "fused"),
    Family("GPT2LMHeadModel", "GPT2Attention", "gpt2", heads_key="n_head",
           no_pool=f"its fused c_attn splits into three hidden-wide parts {_FUSED_EQUAL}"),
    Family("GPTNeoXForCausalLM", "GPTNeoXAttention", "interleaved",
           no_pool=f"its fused query_key_value interleaves q, k and v per head {_FUSED_EQUAL}"),
)}
SUPPORTED_MODELS = ", ".join(FAMILIES)


def check_attention_for(config: dict, spec, *, architecture: str | None = None, file: str | None = None,
                        field: str | None = None) -> None:
    """Refuse, from a checkpoint's config.json alone (no torch), an attention kind its architecture cannot take.

    `architecture` defaults to config's `architectures[0]`. sdpa on an unknown architecture passes:
    transformers says at build time whether it has an sdpa path."""
    spec = parse_attention(spec, file=file, field=field)
    arch = architecture or (config.get("architectures") or ["(no architectures in config.json)"])[0]
    family = FAMILIES.get(arch)
    bad = lambda why, accepted: RecipeError(f"attention '{spec}' cannot be applied to {arch}: {why}",  # noqa: E731
                                            file=file, field=field, accepted=accepted)
    if family is None:
        if spec.kind != "sdpa":
            raise bad(f"variantlab converts the attention of {SUPPORTED_MODELS} only",
                      "one of those architectures; or attention: sdpa, or none (the model's own)")
        return
    kinds = "linear | sliding:<window>"
    if spec.kind == "sdpa" and (family.no_sdpa or config.get("attn_logit_softcapping") is not None):
        raise bad(family.no_sdpa or "its attention logits are soft-capped (attn_logit_softcapping), which "
                  "scaled_dot_product_attention cannot do", f"gqa:<kv_heads> | {kinds}; or none (the model's own)")
    if spec.kind == "gqa":
        heads = config.get(family.heads_key)
        old = config.get("num_key_value_heads") or heads
        if family.no_pool and spec.kv_heads != heads:
            raise bad(family.no_pool, f"gqa:{heads} (the identity) | {kinds}")
        if isinstance(old, int) and old % spec.kv_heads:
            divisors = [d for d in range(1, old + 1) if old % d == 0]
            raise bad(f"mean-pooling its {old} key/value heads needs kv_heads to divide {old}",
                      "gqa:" + " | gqa:".join(map(str, divisors)))


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


class AttentionOptions(SpecModel):
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
    if len(m.group(2)) > 9:   # int() of 5,000 digits raised ValueError; no model has a billion heads or positions
        raise bad(f"attention '{m.group(1)}:{m.group(2)[:12]}…': the number has {len(m.group(2))} digits")
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
    family = FAMILIES.get(type(model).__name__)
    check_attention_for(model.config.to_dict(), spec, architecture=type(model).__name__, field="attention")
    modules = _attention_modules(model, spec, family)
    notes: list[str] = []
    if spec.kind == "gqa":
        _check_gqa(modules, family)  # refuse before changing anything
    if spec.kind == "sdpa" or (spec.kind == "gqa" and not family.no_sdpa):
        _set_sdpa(model)
    elif spec.kind == "gqa":
        notes.append(f"{type(model).__name__} keeps its own '{model.config._attn_implementation}' attention "
                     f"(K/V repeated per group): {family.no_sdpa}")
    if spec.kind == "gqa":
        notes += _convert_to_gqa(model, modules, spec.kv_heads, family)
    elif spec.kind in ("linear", "sliding"):
        acc = None if options.linear_state_dtype == "model" else _torch_dtype("float32")
        runtime = attention_module.AttentionRuntime(spec.kind, spec.window, options.linear_chunk, acc)
        attention_module.swap(model, modules, runtime, family.layout)
        notes += _softcap_notes(model, spec)
    return _facts(model, spec, options, notes + _native_window_notes(model, spec))


def _attention_modules(model, spec: AttentionSpec, family: Family | None) -> list:
    """The decoder's attention modules; RecipeError when this model's cannot be converted."""
    from torch import nn

    from . import attention_module

    found = [m for m in model.modules() if isinstance(m, nn.Module) and type(m).__name__.endswith("Attention")]
    done = [m for m in found if isinstance(m, attention_module.SwappedAttention)]
    if done:
        raise RecipeError(f"the attention of {type(model).__name__} was already converted "
                          f"({type(done[0]).__name__}); apply one attention recipe to a freshly loaded model",
                          field="attention", accepted=ACCEPTED)
    if spec.kind == "sdpa":
        return found
    names = sorted({type(m).__name__ for m in found})
    if not found or names != [family.attention]:  # a family's model holding modules it should not
        what = f"its attention modules are {', '.join(names)}" if names else "no attention module was found"
        raise RecipeError(f"attention '{spec}' cannot be applied to {type(model).__name__}: {what}, and variantlab "
                          f"converts {family.attention} only", field="attention",
                          accepted=f"a {family.architecture} as transformers builds it; or attention: sdpa")
    return found


def _set_sdpa(model) -> None:
    if model.config._attn_implementation == "sdpa":
        return
    accepted = "linear | sliding:<window>, or none (the model's own attention)"
    try:
        model.set_attn_implementation("sdpa")
    except (ValueError, ImportError) as e:
        raise RecipeError(f"{type(model).__name__} cannot run its attention through scaled_dot_product_attention: "
                          f"{str(e).splitlines()[0]}", field="attention", accepted=accepted) from None
    if model.config._attn_implementation != "sdpa":
        raise RecipeError(f"{type(model).__name__} does not support switching its attention to sdpa "
                          f"(it stays '{model.config._attn_implementation}')", field="attention", accepted=accepted)


def _kv_heads(cfg) -> int:
    return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


_POOLED = {"separate": ("k_proj", "v_proj"), "fused": ("qkv_proj",)}  # the projections gqa rewrites


def _check_gqa(modules, family: Family) -> None:
    """The projections gqa rewrites are still nn.Linear (the head count was checked by check_attention_for)."""
    from torch import nn

    for m in modules:
        for name in _POOLED.get(family.layout, ()):
            lin = getattr(m, name)
            if type(lin) is not nn.Linear:
                raise RecipeError(f"{name} of {type(m).__name__} is {type(lin).__name__}, not nn.Linear: apply the "
                                  "attention recipe before quantization", field="attention", accepted=ACCEPTED)


def _pooled(rows, kv_heads: int, pool: int):
    """Rows (or bias) of `kv_heads * pool` heads [Hkv·pool·D, ...] → the mean of each group of `pool`
    consecutive heads [Hkv·D, ...], in float32."""
    return rows.detach().float().reshape(kv_heads, pool, -1, *rows.shape[1:]).mean(1).reshape(-1, *rows.shape[1:])


def _linear_like(lin, rows, bias):
    """An nn.Linear like `lin` (device, dtype, in_features) holding `rows` [out, in] and `bias`."""
    import torch
    from torch import nn

    new = nn.Linear(lin.in_features, rows.shape[0], bias=bias is not None, device=lin.weight.device,
                    dtype=lin.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(rows)
        if bias is not None:
            new.bias.copy_(bias)
    return new


def _pool_projections(m, family: Family, kv_heads: int, pool: int, q_rows: int) -> None:
    """Rewrite module `m`'s K/V projection rows: separate k_proj/v_proj each pooled; Phi-3's fused
    qkv_proj [q (q_rows) | k | v] keeps its q rows and pools its k and v blocks."""
    import torch

    if family.layout == "separate":
        for name in ("k_proj", "v_proj"):
            lin = getattr(m, name)
            bias = None if lin.bias is None else _pooled(lin.bias, kv_heads, pool)
            setattr(m, name, _linear_like(lin, _pooled(lin.weight, kv_heads, pool), bias))
        return
    lin = m.qkv_proj
    kv_rows = (lin.out_features - q_rows) // 2

    def pooled(t):
        q, k, v = t.detach().split([q_rows, kv_rows, kv_rows])
        return torch.cat([q.float(), _pooled(k, kv_heads, pool), _pooled(v, kv_heads, pool)])
    m.qkv_proj = _linear_like(lin, pooled(lin.weight), None if lin.bias is None else pooled(lin.bias))


def _convert_to_gqa(model, modules, kv_heads: int, family: Family) -> list[str]:
    """Mean-pool each group of consecutive K/V heads into one; update config and every module."""
    cfg = model.config
    heads, old = cfg.num_attention_heads, _kv_heads(cfg)
    if kv_heads == old:
        return [f"gqa:{kv_heads} is the checkpoint's own head layout: nothing pooled"]
    pool = old // kv_heads
    for m in modules:
        _pool_projections(m, family, kv_heads, pool, heads * m.head_dim)
        m.num_key_value_groups = heads // kv_heads
        if hasattr(m, "num_key_value_heads"):
            m.num_key_value_heads = kv_heads
    cfg.num_key_value_heads = kv_heads
    return [f"mean-pooled {old} key/value heads into {kv_heads} (groups of {pool}), without retraining: "
            "expect a quality loss; measure it against the baseline"]


def _softcap_notes(model, spec: AttentionSpec) -> list[str]:
    cap = getattr(model.config, "attn_logit_softcapping", None)
    if cap is None:
        return []
    if spec.kind == "linear":
        return [f"the checkpoint soft-caps its attention logits at {cap:g}; linear attention has no logits to cap"]
    return [f"attention logits soft-capped at {cap:g} (tanh), as the checkpoint does: explicit scores, not the "
            "fused sdpa kernel"]


def _native_window_notes(model, spec: AttentionSpec) -> list[str]:
    cfg = model.config
    native = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or []
    uses = native is not None and (getattr(cfg, "model_type", "") in ("mistral", "phi3")
                                   or "sliding_attention" in types)
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
                "query heads where the kernel allows, else repeated K/V)" if cfg._attn_implementation == "sdpa"
                else f"transformers '{cfg._attn_implementation}' attention (K/V repeated per group)"],
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
