"""Our decode attention kernel under a transformers model's SDPA attention.

At decode, transformers' SDPA runs one query position per sequence against the whole static cache:
on this CPU, 75 µs a layer in bf16 and 15 µs in fp32 (12 heads × 128 positions × 64), most of a
small model's non-matmul time. Our `decode_attention` (variants/kernels) reads only the positions
the mask keeps and takes 9 µs at either dtype.

`use_decode_attention(model)` registers "variantlab_decode" in transformers' AttentionInterface
(with SDPA's own mask function, so every mask is built exactly as for SDPA) and sets it on a model
whose attention is "sdpa". Each call with one query position, no softcapping, sliding window or
attention sinks, and a boolean mask (or none) runs ours; every other call goes to transformers'
`sdpa_attention_forward` unchanged (prefill, scoring, Gemma 2's softcapping). Artifacts record the
model's attention as "sdpa" (`saved_implementation`): the swap is this machine's, made at load.
"""
from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import kernels as vk

IMPLEMENTATION = "variantlab_decode"
REPLACES = "sdpa"
LABEL_OF = "variantlab decode_attention at one query position ({})"   # ends as decode_kernels.SUFFIX
LABEL = LABEL_OF.format(vk.ISA_NAME)
LABELS = tuple(LABEL_OF.format(isa.name) for isa in vk.ISAS)
_UNSUPPORTED_KWARGS = ("sliding_window", "softcap", "s_aux", "sinks")


def _ours_can_run(query, key, value, attention_mask, dropout, kwargs) -> bool:
    """The call is one our kernel computes exactly as SDPA would; anything else goes to SDPA."""
    if query.shape[2] != 1 or dropout or query.device.type != "cpu":
        return False
    if query.dtype not in (torch.float32, torch.bfloat16) or key.dtype != query.dtype or value.dtype != key.dtype:
        return False
    if (query.shape[-1] > 256 or query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride() != key.stride()
            or value.shape != key.shape or query.shape[1] % key.shape[1]):
        return False
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED_KWARGS):
        return False
    return attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.dim() == 4
                                      and attention_mask.shape[1] == 1 and attention_mask.shape[2] == 1
                                      and attention_mask.shape[0] in (1, query.shape[0])
                                      and attention_mask.shape[3] <= key.shape[2])


def decode_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                             is_causal=None, **kwargs):
    """AttentionInterface entry: ours at one query position (module docstring), SDPA otherwise."""
    if (not _ours_can_run(query, key, value, attention_mask, dropout, kwargs)
            or getattr(module, "attn_logit_softcapping", None)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    keep = None
    if attention_mask is not None:
        keep = attention_mask[:, 0, 0, :].expand(query.shape[0], -1)   # a mask for every row (stride 0 if shared)
        if keep.shape[-1] != key.shape[2]:   # a mask shorter than the cache: the rest is unused cache
            keep = torch.nn.functional.pad(keep, (0, key.shape[2] - keep.shape[-1]))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return vk.decode_attention(query, key, value, keep, float(scale)), None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(IMPLEMENTATION, decode_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def use_decode_attention(model) -> tuple[str, ...]:
    """Swap the model's "sdpa" attention for ours where our kernels run and its activations are fp32 or
    bf16 (ours takes no fp16); the label, or nothing."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != REPLACES or not vk.available():
        return ()
    if getattr(model, "dtype", None) not in (torch.float32, torch.bfloat16):
        return ()
    register()
    config._attn_implementation = IMPLEMENTATION
    return (LABEL,)


def saved_implementation(name: str | None) -> str | None:
    """The attention implementation an artifact records: SDPA for ours (made again at load)."""
    return REPLACES if name == IMPLEMENTATION else name
