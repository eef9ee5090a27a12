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
from types import SimpleNamespace
from typing import Literal

from pydantic import Field, ValidationError

from ..errors import RecipeError
from ..spec_model import SpecModel
from .attention_kinds import TRANSFORMERS_SDPA, accepted, attention_kind, attention_kinds
from .attention_kinds import dtype_name as _dtype_name
from .facts import AttentionFacts

ACCEPTED = accepted()   # the built-in kinds as written; errors call accepted(), which holds any registered since


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
    kind = attention_kind(spec.kind)
    if family is None:
        if kind.needs_family:
            free = " | ".join(k.written() for k in attention_kinds() if not k.needs_family)
            raise bad(f"variantlab converts the attention of {SUPPORTED_MODELS} only",
                      f"one of those architectures; or attention: {free}, or none (the model's own)")
        return
    kind.check_config(spec, config, family, bad)


REPORT_LENGTHS = (128, 512, 2048, 8192, 32768)


@dataclass(frozen=True)
class AttentionSpec:
    kind: str                     # a registered kind's name (variants/attention_kinds.py)
    kv_heads: int | None = None   # the number of a kind whose arg is kv_heads (gqa)
    window: int | None = None     # the number of a kind whose arg is window (sliding)

    def __str__(self) -> str:
        kind = attention_kind(self.kind)
        arg = getattr(self, kind.arg) if kind is not None and kind.arg else None
        return self.kind if arg is None else f"{self.kind}:{arg}"


class AttentionOptions(SpecModel):
    linear_state_dtype: Literal["fp32", "model"] = Field(
        "fp32", description="linear: accumulate the state in fp32, or in the model's dtype (shows the instability)")
    linear_chunk: int = Field(64, ge=1, le=4096, description="linear: tokens per chunk of the parallel prefill form")


def parse_attention(text, *, file: str | None = None, field: str | None = None) -> AttentionSpec:
    """A registered kind as a suite writes it ('sdpa' | 'gqa:<kv_heads>' | 'linear' | 'sliding:<window>') →
    AttentionSpec (an AttentionSpec passes)."""
    if isinstance(text, AttentionSpec):
        return text
    bad = lambda why: RecipeError(why, file=file, field=field, accepted=accepted())  # noqa: E731
    if not isinstance(text, str):
        raise bad(f"attention must be a string, got {type(text).__name__} {text!r}")
    s = text.strip().lower()
    name, colon, number = (part.strip() for part in s.partition(":"))
    kind = attention_kind(name)
    if kind is None or (colon and not kind.arg) or (kind.arg and not re.fullmatch(r"-?\d+", number)):
        if kind is not None and kind.arg and not colon:
            raise bad(f"attention '{text}' needs its number: {kind.written()}")
        raise bad(f"unknown attention '{text}'")
    if not kind.arg:
        return AttentionSpec(kind.name)
    if len(number) > 9:   # int() of 5,000 digits raised ValueError; no model has a billion heads or positions
        raise bad(f"attention '{name}:{number[:12]}…': the number has {len(number)} digits")
    n = int(number)
    if n < 1:
        raise bad(f"attention '{text}': the number must be a positive integer")
    return AttentionSpec(kind.name, **{kind.arg: n})


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

def apply_attention(model, spec, options=None) -> AttentionFacts:
    """Convert `model` in place to the attention `spec`; return facts about the result."""
    spec, options = parse_attention(spec), parse_attention_options(options)
    family = FAMILIES.get(type(model).__name__)
    check_attention_for(model.config.to_dict(), spec, architecture=type(model).__name__, field="attention")
    modules = _attention_modules(model, spec, family)
    notes = attention_kind(spec.kind).apply(model, modules, spec, options, family, _HELPERS)
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
                          field="attention", accepted=accepted())
    if not attention_kind(spec.kind).needs_family:
        return found
    names = sorted({type(m).__name__ for m in found})
    if not found or names != [family.attention]:  # a family's model holding modules it should not
        what = f"its attention modules are {', '.join(names)}" if names else "no attention module was found"
        raise RecipeError(f"attention '{spec}' cannot be applied to {type(model).__name__}: {what}, and variantlab "
                          f"converts {family.attention} only", field="attention",
                          accepted=f"a {family.architecture} as transformers builds it; or attention: sdpa")
    return found


def _set_sdpa(model) -> None:
    if model.config._attn_implementation == TRANSFORMERS_SDPA:
        return
    accepted = "linear | sliding:<window>, or none (the model's own attention)"
    try:
        model.set_attn_implementation(TRANSFORMERS_SDPA)
    except (ValueError, ImportError) as e:
        raise RecipeError(f"{type(model).__name__} cannot run its attention through scaled_dot_product_attention: "
                          f"{str(e).splitlines()[0]}", field="attention", accepted=accepted) from None
    if model.config._attn_implementation != TRANSFORMERS_SDPA:
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
                                  "attention recipe before quantization", field="attention", accepted=accepted())


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


def _native_window_notes(model, spec: AttentionSpec) -> list[str]:
    cfg = model.config
    native = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or []
    uses = native is not None and (getattr(cfg, "model_type", "") in ("mistral", "phi3")
                                   or "sliding_attention" in types)
    if not uses:
        return []
    return [attention_kind(spec.kind).native_window_note(native, spec)]


# ---------------------------------------------------------------------------------------------- facts

def _facts(model, spec: AttentionSpec, options: AttentionOptions, notes: list[str]) -> AttentionFacts:
    cfg = model.config
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    kv_heads = _kv_heads(cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    dtype = (emb.weight.dtype if hasattr(emb, "weight") else emb.dtype) if emb is not None \
        else next(model.parameters()).dtype  # the compute dtype
    kind = attention_kind(spec.kind)
    cost = kind.cache(spec, options, layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
    per_token, state, window = cost.per_token, cost.state, cost.window
    notes = notes + list(cost.notes)
    facts = {"attention": str(spec), "kind": spec.kind, "implementation": cfg._attn_implementation,
             "layers": layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
             "cache_dtype": _dtype_name(dtype), "window": window,
             "kv_cache_bytes_per_token": per_token, "state_bytes_per_sequence": state,
             "linear_state_dtype": kind.state_dtype(options),
             "kernels": kind.kernels(cfg, options), "notes": notes}
    # a window bounds the cache; a kind with no per-token cache holds its state alone; else it grows
    facts["kv_cache_bytes_max"] = per_token * window + state if window else state if per_token == 0 else None
    facts = AttentionFacts.model_validate(facts)
    return facts.replace(kv_cache_bytes_per_sequence={str(n): facts.cache_bytes(n) for n in REPORT_LENGTHS})


def attention_facts(model) -> AttentionFacts:
    """Facts of the model's own attention, unconverted (the same fields as apply_attention's)."""
    return _facts(model, parse_attention("sdpa"), parse_attention_options(None), []).replace(
        attention="model's own", implementation=model.config._attn_implementation)


def kv_cache_bytes_per_sequence(facts: AttentionFacts, seq_len: int, batch: int = 1) -> int:
    """Bytes of KV cache (or linear state) one sequence of `seq_len` tokens holds, from `apply_attention`'s facts."""
    return facts.cache_bytes(seq_len, batch)


# what a kind's apply may call here (variants/attention_kinds.py): transformers' sdpa switch and gqa's pooling
_HELPERS = SimpleNamespace(set_sdpa=_set_sdpa, check_gqa=_check_gqa, convert_to_gqa=_convert_to_gqa)
