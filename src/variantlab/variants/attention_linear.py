"""Causal linear attention (Katharopoulos et al., 2020, "Transformers are RNNs"), three forms.

    out_i = phi(q_i) · S_i / (phi(q_i) · z_i + eps),   S_i = sum_{j<=i} phi(k_j) v_j^T,   z_i = sum_{j<=i} phi(k_j)

with phi(x) = elu(x) + 1 (positive, so the normaliser never changes sign). The three forms compute
the same numbers and are tested against each other:

- `linear_attention_naive`: the quadratic form, A = phi(Q) phi(K)^T masked causally; the reference.
- `linear_attention_chunked`: the parallel form for prefill. The sequence is cut into chunks of C
  tokens; inside a chunk the quadratic form (C × C), across chunks the running state S (D × Dv)
  and z (D), summed over chunks with one exclusive cumsum. O(T·C·D + T·D·Dv), no Python loop.
- `linear_attention_recurrent`: one token at a time against a constant-size state: decode.

State dtype. S and z grow with the sequence (z ~ T · E[phi(k)] per dimension), so they are
accumulated in fp32 by default whatever the model dtype; `acc_dtype=model dtype` keeps them in
fp16/bf16 to show why not: in fp16 the normaliser passes 65504 after ~1,000 tokens of unit-scale
keys and the output becomes inf/NaN (docs/recipes.md, Attention; measured by benchmarks/attention_stability.py).

Grouped K/V heads (a GQA checkpoint) keep one state per K/V head, shared by its G query heads.
Shapes: q (B, H, T, D); k (B, Hkv, T, D); v (B, Hkv, T, Dv); key_valid (B, T) bool or None
(False = padding: the token adds nothing to the state). RoPE is applied before phi, by the caller.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import CacheLayerMixin

EPS = 1e-6


def feature_map(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


def _prepare(q, k, v, key_valid, acc_dtype):
    """phi-mapped, grouped inputs in acc_dtype: q (B, Hkv, G, T, D), k (B, Hkv, 1, T, D), v (B, Hkv, 1, T, Dv)."""
    b, h, t, d = q.shape
    hkv = k.shape[1]
    qf = feature_map(q.to(acc_dtype)).view(b, hkv, h // hkv, t, d)
    kf = feature_map(k.to(acc_dtype)).unsqueeze(2)
    vf = v.to(acc_dtype).unsqueeze(2)
    if key_valid is not None:  # padding contributes nothing (where, not multiply: 0 * inf is NaN)
        keep = key_valid[:, None, None, :, None]
        kf = torch.where(keep, kf, 0)
        vf = torch.where(keep, vf, 0)
    return qf, kf, vf


def _ungroup(out: torch.Tensor, dtype) -> torch.Tensor:
    b, hkv, g, t, dv = out.shape
    return out.reshape(b, hkv * g, t, dv).to(dtype)


def linear_attention_naive(q, k, v, key_valid=None, *, acc_dtype=torch.float32, eps: float = EPS):
    """The quadratic form: O(T^2) memory; the reference the fast forms are tested against."""
    qf, kf, vf = _prepare(q, k, v, key_valid, acc_dtype)
    t = q.shape[-2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    a = torch.where(causal, qf @ kf.transpose(-1, -2), 0)           # (B, Hkv, G, T, T)
    out = (a @ vf) / (a.sum(-1, keepdim=True) + eps)
    return _ungroup(out, q.dtype)


def empty_state(q, k, v, acc_dtype):
    """(S, z) of nothing seen: S (B, Hkv, 1, D, Dv), z (B, Hkv, 1, D)."""
    b, hkv, _, d = k.shape
    s = torch.zeros(b, hkv, 1, d, v.shape[-1], dtype=acc_dtype, device=q.device)
    return s, torch.zeros(b, hkv, 1, d, dtype=acc_dtype, device=q.device)


def linear_attention_chunked(q, k, v, key_valid=None, state=None, *, chunk: int = 64,
                             acc_dtype=torch.float32, eps: float = EPS):
    """The parallel form; returns (out (B, H, T, Dv), (S, z) after the last token)."""
    qf, kf, vf = _prepare(q, k, v, key_valid, acc_dtype)
    s0, z0 = state if state is not None else empty_state(q, k, v, acc_dtype)
    b, hkv, g, t, d = qf.shape
    dv = vf.shape[-1]
    n = -(-t // chunk)
    pad = n * chunk - t
    if pad:  # zero rows after phi: a zero key adds nothing, a zero query's output is dropped below
        qf, kf, vf = (F.pad(x, (0, 0, 0, pad)) for x in (qf, kf, vf))
    qc = qf.view(b, hkv, g, n, chunk, d)
    kc = kf.view(b, hkv, 1, n, chunk, d)
    vc = vf.view(b, hkv, 1, n, chunk, dv)
    kv = kc.transpose(-1, -2) @ vc                                   # (B, Hkv, 1, N, D, Dv) per chunk
    ks = kc.sum(-2)                                                  # (B, Hkv, 1, N, D)
    kv_cum, ks_cum = kv.cumsum(3), ks.cumsum(3)
    s_prev = s0.unsqueeze(3) + torch.cat([torch.zeros_like(kv[:, :, :, :1]), kv_cum[:, :, :, :-1]], 3)
    z_prev = z0.unsqueeze(3) + torch.cat([torch.zeros_like(ks[:, :, :, :1]), ks_cum[:, :, :, :-1]], 3)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    a = torch.where(causal, qc @ kc.transpose(-1, -2), 0)           # (B, Hkv, G, N, C, C)
    num = qc @ s_prev + a @ vc                                       # (B, Hkv, G, N, C, Dv)
    den = (qc * z_prev.unsqueeze(-2)).sum(-1) + a.sum(-1)            # (B, Hkv, G, N, C)
    out = (num / (den.unsqueeze(-1) + eps)).view(b, hkv, g, n * chunk, dv)[..., :t, :]
    return _ungroup(out, q.dtype), (s0 + kv_cum[:, :, :, -1], z0 + ks_cum[:, :, :, -1])


def linear_attention_recurrent(q, k, v, key_valid=None, state=None, *, acc_dtype=torch.float32,
                               eps: float = EPS):
    """One token at a time against the running state; returns (out, (S, z))."""
    qf, kf, vf = _prepare(q, k, v, key_valid, acc_dtype)
    s, z = state if state is not None else empty_state(q, k, v, acc_dtype)
    outs = []
    for i in range(qf.shape[-2]):
        kt, vt, qt = kf[..., i, :], vf[..., i, :], qf[..., i:i + 1, :]  # (B,Hkv,1,D) (B,Hkv,1,Dv) (B,Hkv,G,1,D)
        s = s + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        z = z + kt
        num = qt @ s                                                 # (B, Hkv, G, 1, Dv)
        den = qt @ z.unsqueeze(-1)                                   # (B, Hkv, G, 1, 1)
        outs.append(num / (den + eps))
    return _ungroup(torch.cat(outs, dim=-2), q.dtype), (s, z)


def normaliser(q, k, key_valid=None, *, acc_dtype=torch.float32) -> torch.Tensor:
    """phi(q_i) · z_i for every query (B, H, T), in acc_dtype as the recurrent form computes it; the
    stability check reads it to see whether the normaliser overflowed (the outputs then silently become 0)."""
    qf, kf, _ = _prepare(q, k, k[..., :1], key_valid, acc_dtype)
    z = kf.cumsum(-2)                                                # (B, Hkv, 1, T, D)
    den = (qf * z).sum(-1)                                           # (B, Hkv, G, T)
    return den.reshape(q.shape[0], q.shape[1], q.shape[2])


class LinearStateLayer(CacheLayerMixin):
    """One layer's decode state: S and z, constant size whatever the length, in the cache the model is given.

    Not a transformers LinearAttentionCacheLayerMixin on purpose: that type makes
    `Cache.get_seq_length()` raise, and the model derives positions from it. `get_seq_length` here is
    the number of tokens (padding included) folded into the state.
    """

    is_sliding = False
    is_croppable = False

    @classmethod
    def for_runtime(cls, runtime) -> "LinearStateLayer":
        return cls(runtime.chunk, runtime.acc_dtype)

    def __init__(self, chunk: int, acc_dtype=None):
        super().__init__()
        self.chunk = chunk
        self.acc_dtype = acc_dtype   # None: the model's dtype
        self.state = None            # (S, z)
        self.seen = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("a linear-attention layer keeps no keys/values: its attention module calls attend()")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, self.seen

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.state, self.seen, self.is_initialized = None, 0, False

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state) if self.state is not None else 0

    def attend(self, q, k, v, key_valid, scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
        """Fold this step's keys/values into the state; return the outputs of its queries. `scale` and
        `softcap` are unused: phi replaces the softmax (no logits to scale or cap), and its normaliser
        cancels any common scale of phi(q)."""
        acc = self.acc_dtype or q.dtype
        if q.shape[-2] == 1 and self.state is not None:
            out, self.state = linear_attention_recurrent(q, k, v, key_valid, self.state, acc_dtype=acc)
        else:
            out, self.state = linear_attention_chunked(q, k, v, key_valid, self.state, chunk=self.chunk,
                                                       acc_dtype=acc)
        self.is_initialized = True
        self.seen += q.shape[-2]
        return out
