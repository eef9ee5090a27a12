"""Sliding-window attention: each token sees itself and the `window - 1` tokens before it.

Mistral's convention (transformers' `sliding_window_overlay`: key > query - window), so `sliding:W`
on a Llama computes what a Mistral checkpoint with `sliding_window: W` computes.

- `sliding_attention`: softmax attention of the last T of N contiguous keys, block by block: a block
  of queries sees only its band of keys, so a prefill of T tokens costs O(T · (block + window)),
  not O(T^2). Each block is one `scaled_dot_product_attention` call with a boolean band mask.
- `sliding_attention_naive`: the whole T × N score matrix, masked; the reference.
- `RollingKVLayer`: the decode cache. It holds at most `window` keys/values per sequence: it grows by
  concatenation until it is full, then becomes a ring buffer where token p lives in slot p % window
  and a new token overwrites, in place, the one that has just left its window. Softmax does not care
  in which order keys sit (RoPE was applied before caching), so decode attends the ring as it is.

Soft-capping (Gemma2's attn_logit_softcapping): `softcap` caps each logit at ±softcap with
cap · tanh(score / cap) before the softmax, as transformers' eager Gemma2 does; sdpa cannot, so those
blocks compute their scores explicitly (`softcapped`).

Padding: `key_valid` (B, N) marks real tokens; a padded query still sees itself, so that no row of
the mask is empty (some kernels return NaN for an empty row).
Shapes: q (B, H, T, D); k, v (B, Hkv, N, D); Hkv divides H (grouped K/V heads run with enable_gqa).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import CacheLayerMixin

MIN_BLOCK = 256


def sdpa(q, k, v, mask, scale, softcap: float | None = None):
    """scaled_dot_product_attention with grouped K/V heads and a boolean mask (True = attend) or None;
    with `softcap`, the same attention of capped logits, computed explicitly."""
    if softcap is not None:
        return softcapped(q, k, v, mask, scale, softcap)
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)


def softcapped(q, k, v, mask, scale, softcap: float):
    """softmax(cap · tanh(q kᵀ · scale / cap), masked) v, the softmax in fp32 (transformers' eager Gemma2)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = torch.tanh((q @ k.transpose(-1, -2)) * scale / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def _band(q_pos, k_pos, window, key_valid, lo, hi):
    """Boolean mask (1 or B, 1, Tq, Nk): causal, within the window, real keys (or the query itself)."""
    qi, kj = q_pos[:, None], k_pos[None, :]
    allowed = (kj <= qi) & (qi - kj < window)
    if key_valid is None:
        return allowed[None, None]
    return (allowed & (key_valid[:, None, lo:hi] | (kj == qi)))[:, None]


def sliding_attention(q, k, v, window: int, scale: float, key_valid=None, block: int | None = None,
                      softcap: float | None = None):
    """Outputs (B, H, T, Dv) of the queries at key positions N-T .. N-1."""
    t, n = q.shape[-2], k.shape[-2]
    if t == 1 and key_valid is None:  # one decode step: the last `window` keys, every one allowed; no mask
        lo = max(0, n - window)
        return sdpa(q, k[:, :, lo:], v[:, :, lo:], None, scale, softcap)
    offset = n - t
    block = block or max(window, MIN_BLOCK)
    pos = torch.arange(n, device=q.device)
    outs = []
    for r0 in range(0, t, block):
        r1 = min(t, r0 + block)
        lo, hi = max(0, offset + r0 - window + 1), offset + r1
        mask = _band(pos[offset + r0:offset + r1], pos[lo:hi], window, key_valid, lo, hi)
        outs.append(sdpa(q[:, :, r0:r1], k[:, :, lo:hi], v[:, :, lo:hi], mask, scale, softcap))
    return torch.cat(outs, dim=2)


def sliding_attention_naive(q, k, v, window: int, scale: float, key_valid=None, softcap: float | None = None):
    """The whole score matrix at once, in the inputs' dtype: O(T · N) memory; the reference."""
    t, n = q.shape[-2], k.shape[-2]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    pos = torch.arange(n, device=q.device)
    mask = _band(pos[n - t:], pos, window, key_valid, 0, n)
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class RollingKVLayer(CacheLayerMixin):
    """One layer's keys/values of the last `window` tokens; `get_seq_length` counts every token seen."""

    is_sliding = True
    is_croppable = False

    @classmethod
    def for_runtime(cls, runtime) -> "RollingKVLayer":
        return cls(runtime.window)

    def __init__(self, window: int):
        super().__init__()
        self.window = window
        self.seen = 0
        self.valid = None  # (B, slots) bool, or None when no token was padding

    def lazy_initialization(self, key_states, value_states) -> None:
        self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("a rolling sliding-window layer is filled by its attention module (attend())")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        kept = min(self.seen, self.window - 1)
        return kept + query_length, self.seen - kept

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.window

    def reset(self) -> None:
        self.keys = self.values = self.valid = None
        self.seen, self.is_initialized = 0, False

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.valid) if t is not None)

    def attend(self, q, k, v, key_valid, scale: float, softcap: float | None = None) -> torch.Tensor:
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        if key_valid is not None and self.valid is None:
            self.valid = torch.ones(k.shape[0], self.keys.shape[-2], dtype=torch.bool, device=k.device)
        if q.shape[-2] == 1 and self.keys.shape[-2] == self.window:
            return self._decode_in_place(q, k, v, key_valid, scale, softcap)
        keys, values, valid = self._ordered()
        keys, values = torch.cat([keys, k], dim=-2), torch.cat([values, v], dim=-2)
        if valid is not None:
            valid = torch.cat([valid, key_valid if key_valid is not None else valid.new_ones(k.shape[0], k.shape[-2])],
                              dim=-1)
        out = sliding_attention(q, keys, values, self.window, scale, valid, softcap=softcap)
        self.seen += q.shape[-2]
        self._store(keys, values, valid)
        return out

    def _decode_in_place(self, q, k, v, key_valid, scale, softcap=None):
        """A full ring: the new token overwrites the slot of the token that just left the window."""
        slot = self.seen % self.window
        self.keys[:, :, slot] = k[:, :, 0]
        self.values[:, :, slot] = v[:, :, 0]
        mask = None
        if self.valid is not None:
            self.valid[:, slot] = True if key_valid is None else key_valid[:, 0]
            mask = self.valid.clone()
            mask[:, slot] = True
            mask = mask[:, None, None, :]
        self.seen += 1
        return sdpa(q, self.keys, self.values, mask, scale, softcap)

    def _ordered(self):
        """Cached keys, values, validity, oldest first (contiguous positions seen - slots .. seen - 1)."""
        if self.keys.shape[-2] < self.window:
            return self.keys, self.values, self.valid
        shift = -(self.seen % self.window)
        roll = lambda t, dim: torch.roll(t, shift, dims=dim) if t is not None else None  # noqa: E731
        return roll(self.keys, -2), roll(self.values, -2), roll(self.valid, -1)

    def _store(self, keys, values, valid):
        """Keep the last min(window, N) tokens, token p in slot p % window once the ring is full."""
        keep = min(self.window, keys.shape[-2])
        shift = (self.seen - keep) % self.window if keep == self.window else 0

        def cut(t, dim):
            if t is None:
                return None
            t = t.narrow(dim, t.shape[dim] - keep, keep)
            return (torch.roll(t, shift, dims=dim) if shift else t).contiguous()  # roll copies even at 0
        self.keys, self.values, self.valid = cut(keys, -2), cut(values, -2), cut(valid, -1)
