"""Module replacement for the attention kinds transformers has no kernel for: linear and sliding.

Each attention module of a supported family (Llama, Mistral, Qwen2: the same q/k/v/o projections and
RoPE) gets a subclass of its own class whose `forward` projects and rotates exactly as the original,
then hands q, k, v to a cache layer of ours (`RollingKVLayer`, `LinearStateLayer`) that keeps the
decode state and computes the attention. The module keeps its name, its children and its weights, so
a quantization recipe applied afterwards still finds `...self_attn.q_proj` and swaps it, and the
state dict is unchanged.

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

import torch

from .attention_linear import LinearStateLayer
from .attention_sliding import RollingKVLayer

IMPLEMENTATION = "variantlab"
SWAPPABLE = ("LlamaAttention", "MistralAttention", "Qwen2Attention")


@dataclass(frozen=True)
class AttentionRuntime:
    """What a swapped module needs at run time; one per model."""

    kind: str                     # "linear" | "sliding"
    window: int | None = None
    chunk: int = 64
    acc_dtype: torch.dtype | None = torch.float32  # linear state; None: the model's dtype

    def new_layer(self):
        if self.kind == "sliding":
            return RollingKVLayer(self.window)
        return LinearStateLayer(self.chunk, self.acc_dtype)

    @property
    def layer_type(self) -> type:
        return RollingKVLayer if self.kind == "sliding" else LinearStateLayer


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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
    """Mixed in before the model's attention class; `variantlab_runtime` set on each instance."""

    variantlab_runtime: AttentionRuntime

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                **kwargs):
        b, t, _ = hidden_states.shape
        shape = (b, t, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)   # (B, H, T, D)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)   # (B, Hkv, T, D)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = (x.unsqueeze(1) for x in position_embeddings)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        valid = _new_token_validity(attention_mask, b, t)
        runtime = self.variantlab_runtime
        layer = (_cache_layer(past_key_values, self.layer_idx, runtime) if past_key_values is not None
                 else runtime.new_layer())
        out = layer.attend(q, k, v, valid, self.scaling)               # (B, H, T, Dv)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), None


_CLASSES: dict[type, type] = {}


def swapped_class(base: type) -> type:
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Variantlab{base.__name__}", (SwappedAttention, base), {"__module__": __name__})
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


def swap(model, modules, runtime: AttentionRuntime) -> None:
    register()
    for m in modules:
        m.__class__ = swapped_class(type(m))
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
