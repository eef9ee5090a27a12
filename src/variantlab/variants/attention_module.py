"""Module replacement for the attention kinds transformers has no kernel for (linear and sliding: those whose
`swaps_modules`, variants/attention_kinds.py).

Each attention module of a supported family (attention.FAMILIES) gets a subclass of its own class
whose `forward` projects and rotates exactly as the original, then hands q, k, v to a cache layer of
ours (`RollingKVLayer`, `LinearStateLayer`) that keeps the decode state and computes the attention.
The module keeps its name, its children and its weights, so a quantization recipe applied afterwards
still finds `...self_attn.q_proj` (or `qkv_proj`, `c_attn`, ...) and swaps it, and the state dict is
unchanged.

Where the families differ is in `LAYOUTS`: how q, k, v come out of the projections, and which
projection maps the heads back.

    separate      q_proj, k_proj, v_proj, o_proj: Llama, Mistral, Qwen2, Gemma 1-3 (Gemma3 normalises
                  each q and k head first: q_norm, k_norm)
    fused         Phi-3: qkv_proj's rows are [q (H·D) | k (Hkv·D) | v (Hkv·D)], then o_proj
    interleaved   GPT-NeoX: query_key_value's rows are, per head, [q | k | v] (D each), then dense
    gpt2          GPT-2: c_attn (a Conv1D) gives [q | k | v], hidden-wide each, then c_proj; no rotary
                  (positions are learned embeddings added to the input)

Rotary embeddings may cover the first part of each head only (partial rotary: GPT-NeoX's rotary_pct,
Phi-3's partial_rotary_factor): the width of cos/sin says how much, as in transformers. Gemma2's
logit soft-capping is passed to the sliding kernel (`softcap`).

How this fits the unmodified KV-cached loop (backends/torch_engine.py), which passes a plain
`DynamicCache()` and, for batches, a left-padded 2-D attention mask and position ids:

- the cache: each swapped module puts its own layer object at its index in `past_key_values.layers`
  the first time it runs (replacing a layer that holds nothing yet). Our layers answer
  `get_seq_length()` with the number of tokens seen, from which transformers derives positions when
  none are given, and never grow past their window (sliding) or at all (linear).
- the mask: the model's `config._attn_implementation` is set to "variantlab", registered in
  transformers' AttentionInterface and AttentionMaskInterface. Its mask function hands the 2-D
  padding mask to the layers unchanged (None without padding), instead of a 4-D causal mask sized for
  a full cache; our layers build their own causal/window masks from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


IMPLEMENTATION = "variantlab"


@dataclass(frozen=True)
class AttentionRuntime:
    """What a swapped module needs at run time; one per model. `layer_type`: the cache layer class its kind
    keeps state in (variants/attention_kinds.py), made from this runtime by its `for_runtime`."""

    kind: str                     # the kind's name, for messages
    layer_type: type
    window: int | None = None
    chunk: int = 64
    acc_dtype: torch.dtype | None = torch.float32  # linear state; None: the model's dtype

    def new_layer(self):
        return self.layer_type.for_runtime(self)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first cos.shape[-1] dims of each head (all of them unless the rotary is partial)."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, keep = x[..., :r], x[..., r:]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, keep), dim=-1)


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, T, heads · D) → (B, heads, T, D)."""
    return x.view(*x.shape[:2], -1, head_dim).transpose(1, 2)


@dataclass(frozen=True)
class Layout:
    """How one family's attention module computes q, k, v (B, H|Hkv, T, D) before rotary, and its output."""

    qkv: Callable          # (module, hidden_states) → q, k, v
    out: Callable          # (module, (B, T, H · Dv)) → (B, T, hidden)
    rotary: bool = True


def _separate(m, x):
    q, k, v = (_heads(p(x), m.head_dim) for p in (m.q_proj, m.k_proj, m.v_proj))
    if hasattr(m, "q_norm"):  # Gemma3: RMSNorm of each head, before rotary
        q, k = m.q_norm(q), m.k_norm(k)
    return q, k, v


def _fused(m, x):
    q_rows, kv_rows = m.config.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    return (_heads(t, m.head_dim) for t in m.qkv_proj(x).split([q_rows, kv_rows, kv_rows], dim=-1))


def _interleaved(m, x):
    return _heads(m.query_key_value(x), 3 * m.head_size).chunk(3, dim=-1)


def _gpt2(m, x):
    return (_heads(t, m.head_dim) for t in m.c_attn(x).split(m.split_size, dim=-1))


LAYOUTS = {
    "separate": Layout(_separate, lambda m, y: m.o_proj(y)),
    "fused": Layout(_fused, lambda m, y: m.o_proj(y)),
    "interleaved": Layout(_interleaved, lambda m, y: m.dense(y)),
    "gpt2": Layout(_gpt2, lambda m, y: m.resid_dropout(m.c_proj(y)), rotary=False),
}


def _new_token_validity(mask, batch: int, t: int):
    """(B, T) bool of this step's tokens (False = padding), or None for no padding information."""
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape[0] == batch and mask.shape[-1] >= t:
        return mask[:, -t:].bool()
    shape = tuple(mask.shape) if hasattr(mask, "shape") else type(mask).__name__
    raise ValueError(f"variantlab attention takes a 2-D padding mask (batch, tokens) or None; got {shape}. "
                     "Pass the tokenizer's attention_mask, not a prepared 4-D mask.")


def _cache_layer(cache, idx: int, runtime: AttentionRuntime):
    """This module's layer in the model's cache, put there on first use."""
    layers = cache.layers
    while len(layers) <= idx:
        layers.append(runtime.new_layer())
    layer = layers[idx]
    if isinstance(layer, runtime.layer_type):
        return layer
    if not getattr(layer, "is_initialized", False):
        layers[idx] = runtime.new_layer()
        return layers[idx]
    raise ValueError(f"cache layer {idx} already holds {type(layer).__name__} states; a model with "
                     f"'{runtime.kind}' attention needs a fresh cache (DynamicCache())")


class SwappedAttention:
    """Mixed in before the model's attention class; `variantlab_runtime` set on each instance, the
    family's `variantlab_layout` on the class."""

    variantlab_runtime: AttentionRuntime
    variantlab_layout: Layout

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                **kwargs):
        b, t, _ = hidden_states.shape
        layout = self.variantlab_layout
        q, k, v = layout.qkv(self, hidden_states)                      # (B, H, T, D), (B, Hkv, T, D) x2
        if layout.rotary:
            cos, sin = (x.unsqueeze(1) for x in position_embeddings)
            q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        valid = _new_token_validity(attention_mask, b, t)
        runtime = self.variantlab_runtime
        cache = past_key_values if past_key_values is not None else kwargs.get("layer_past")  # GPT-NeoX's name
        layer = _cache_layer(cache, self.layer_idx, runtime) if cache is not None else runtime.new_layer()
        cap = getattr(self, "attn_logit_softcapping", None)             # Gemma2
        out = layer.attend(q, k, v, valid, self.scaling, **({"softcap": cap} if cap is not None else {}))
        return layout.out(self, out.transpose(1, 2).reshape(b, t, -1)), None   # out: (B, H, T, Dv)


_CLASSES: dict[type, type] = {}


def swapped_class(base: type, layout: str) -> type:
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Variantlab{base.__name__}", (SwappedAttention, base),
                              {"__module__": __name__, "variantlab_layout": LAYOUTS[layout]})
    return _CLASSES[base]


def _padding_mask(batch_size=None, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, **kwargs):
    """AttentionMaskInterface entry: the 2-D padding mask as it came (bool), or None."""
    return attention_mask


def _not_swapped(module, *args, **kwargs):
    raise ValueError(f"{type(module).__name__} asked for the '{IMPLEMENTATION}' attention function, but only "
                     "modules swapped by variantlab.variants.attention.apply_attention can run it")


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(IMPLEMENTATION, _not_swapped)
    AttentionMaskInterface.register(IMPLEMENTATION, _padding_mask)


def swap(model, modules, runtime: AttentionRuntime, layout: str) -> None:
    register()
    for m in modules:
        m.__class__ = swapped_class(type(m), layout)
        m.variantlab_runtime = runtime
    model.config._attn_implementation = IMPLEMENTATION


def cache_bytes(cache) -> int:
    """Bytes a cache holds now: our layers' own count, or keys + values of transformers' layers."""
    total = 0
    for layer in getattr(cache, "layers", []):
        if hasattr(layer, "nbytes"):
            total += layer.nbytes()
        elif getattr(layer, "is_initialized", False):
            total += sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None)
    return total
