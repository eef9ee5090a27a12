"""Quantize, dequantize and pack weight tensors: pure functions, no modules, no model.

Shapes follow nn.Linear: a weight is [N, K] (out_features, in_features); a group is `group_size`
consecutive input columns of one output row; G = K / group_size.

Conventions (the ones torch's kernels expect, checked against a dequantized reference in
tests/variants/test_quant_packing.py):

- int8 symmetric, per output channel: w ≈ q · s[n], q ∈ [-127, 127] (−128 unused, so that the
  grid is symmetric), s = amax(|w[n]|) / 127. `aten::_weight_int8pack_mm(x, q[N,K], s[N])`.
- int8 symmetric, per token (activations, computed at run time): x ≈ q · a[m], a = amax(|x[m]|)/127.
- int4 asymmetric, group-wise: w ≈ (q − 8) · s[n,g] + z[n,g], q ∈ [0, 15]. z is the value at the
  grid's midpoint (min + 8·s), which is the convention of aten's tinygemm kernels
  (`_weight_int4pack_mm[_for_cpu]`: scales_and_zeros is [G, N, 2], [..., 0] = s, [..., 1] = z).
  The more common "q · s + min" convention gives wrong results with those kernels.
- int4 symmetric, group-wise (`symmetric=True`): the same grid with z = 0, w ≈ (q − 8) · s[n,g], s =
  m / −8 where m is the group's value of largest magnitude, sign kept (llama.cpp's Q4_0: m lands on
  q = 0 exactly, and the grid's 16 levels are all used). Stored without zeros: 4 + 16/group_size bits
  a weight in bf16, Q4_0's 4.5 at group 32.

Scales and zeros are rounded to their storage dtype (the compute dtype, bf16 by default) *before*
q is chosen, so q is the best grid point for the parameters actually stored. A zero range (an
all-zero or constant group/row) gets the smallest normal scale of the storage dtype, a power of
two: nothing divides by zero, no NaN/inf, and an all-zero group round-trips exactly.
"""
from __future__ import annotations

import torch

INT8_MAX = 127
INT4_LEVELS = 15  # q ∈ [0, 15]
INT4_MID = 8


def _min_scale(dtype: torch.dtype) -> float:
    # smallest normal number of the storage dtype (2**-126 for fp32/bf16, 2**-14 for fp16)
    return torch.finfo(dtype).tiny


# --- int8, symmetric -------------------------------------------------------------------------

def quantize_int8_per_channel(w: torch.Tensor, scale_dtype: torch.dtype = torch.bfloat16):
    """w [N, K] → (q int8 [N, K], s [N] in scale_dtype); w ≈ q · s[:, None]."""
    w = w.detach().float()
    s = (w.abs().amax(dim=1) / INT8_MAX).clamp(min=_min_scale(scale_dtype)).to(scale_dtype)
    q = torch.round(w / s.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, s


def dequantize_int8_per_channel(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype = torch.float32):
    return q.to(dtype) * s.to(dtype)[:, None]


def quantize_int8_per_token(x: torch.Tensor):
    """x [M, K] float → (q int8 [M, K], a fp32 [M, 1]); x ≈ q · a. Dynamic (run-time) activation quantization."""
    xf = x.float()
    a = (xf.abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=_min_scale(torch.float32))
    q = torch.round(xf / a).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, a


def fake_quantize_int8_per_token(x: torch.Tensor) -> torch.Tensor:
    """x rounded to its per-token int8 grid, in x's dtype (the plain-PyTorch reference of the above)."""
    q, a = quantize_int8_per_token(x)
    return (q.float() * a).to(x.dtype)


# --- int4, asymmetric, group-wise ------------------------------------------------------------

def quantize_int4_groupwise(w: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16,
                            symmetric: bool = False):
    """w [N, K] → (q uint8 [N, K] in [0, 15], s [N, G], z [N, G] in scale_dtype); w ≈ (q − 8)·s + z.
    symmetric: z is 0 and s = m / −8, m the group's value of largest magnitude (module docstring)."""
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {k}")
    wg = w.detach().float().reshape(n, k // group_size, group_size)
    if symmetric:
        m = wg.gather(-1, wg.abs().argmax(dim=-1, keepdim=True)).squeeze(-1)
        d = m / -INT4_MID
        tiny = _min_scale(scale_dtype)
        s = torch.where(d.abs() < tiny, torch.full_like(d, tiny), d).to(scale_dtype)
        z = torch.zeros_like(s)
    else:
        lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
        s = ((hi - lo) / INT4_LEVELS).clamp(min=_min_scale(scale_dtype)).to(scale_dtype)
        z = (lo + INT4_MID * s.float()).to(scale_dtype)
    q = torch.round((wg - z.float()[..., None]) / s.float()[..., None]) + INT4_MID
    q = q.clamp(0, INT4_LEVELS).to(torch.uint8).reshape(n, k)
    return q, s, z


def dequantize_int4_groupwise(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group_size: int,
                              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(q [N, K] in [0, 15], s, z [N, G]) → w [N, K] in dtype, computed in dtype (as the python path does)."""
    n, k = q.shape
    qg = q.reshape(n, k // group_size, group_size).to(dtype) - INT4_MID
    return (qg * s.to(dtype)[..., None] + z.to(dtype)[..., None]).reshape(n, k)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] in [0, 15] → uint8 [N, K/2]; column 2j in the low nibble, 2j+1 in the high one."""
    q = q.to(torch.uint8)
    return (q[:, 1::2] << 4) | q[:, ::2]


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] → uint8 [N, K]; inverse of pack_nibbles."""
    return torch.stack((p & 0x0F, p >> 4), dim=-1).reshape(p.shape[0], -1)


def int4_group_major(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """q [N, K] in [0, 15] → int8 [G, N, group_size] in [-8, 7]: centred, one [N, gs] slab per group
    (the layout W4A8's kernel runs: its torch._int_mm operand for group g is slab g, transposed)."""
    n, k = q.shape
    return (q.to(torch.int8) - INT4_MID).reshape(n, k // group_size, group_size).transpose(0, 1).contiguous()


def int4_from_group_major(qg: torch.Tensor) -> torch.Tensor:
    """int8 [G, N, gs] in [-8, 7] → uint8 [N, G·gs] in [0, 15]; inverse of int4_group_major."""
    g, n, gs = qg.shape
    return (qg.transpose(0, 1).reshape(n, g * gs) + INT4_MID).to(torch.uint8)


def scales_and_zeros(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """s, z [N, G] → [G, N, 2], the layout of aten's tinygemm int4 kernels."""
    return torch.stack((s.t(), z.t()), dim=-1).contiguous()


def pack_int4_for_cpu(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] in [0, 15] → the opaque layout of aten::_weight_int4pack_mm_for_cpu (uint8 [N, K/2]).

    The CPU kernel needs N divisible by 16 and group_size ∈ {32, 64, 128, 256}."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)


def unpack_int4_from_cpu(packed: torch.Tensor, sz: torch.Tensor, group_size: int, n: int, k: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten's CPU int4 layout (pack_int4_for_cpu, scales_and_zeros) → (q [n, k] uint8 in [0, 15], s, z [n, G]):
    the weights read back through the kernel itself (the identity times W, exact in fp32), then each q solved
    from its group's scale and zero. Meta tensors give meta tensors of those shapes."""
    s, z = sz[:, :n, 0].t().contiguous(), sz[:, :n, 1].t().contiguous()
    if packed.is_meta:
        return torch.empty(n, k, dtype=torch.uint8, device="meta"), s, z
    eye = torch.eye(k, dtype=sz.dtype)
    w = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, group_size, sz).t()[:n].float()   # [n, k]
    g = k // group_size
    q = ((w.reshape(n, g, group_size) - z.float()[..., None]) / s.float()[..., None]).round() + INT4_MID
    return q.clamp(0, 15).reshape(n, k).to(torch.uint8), s, z


def pack_int4_for_cuda(q: torch.Tensor, inner_k_tiles: int = 8) -> torch.Tensor:
    """q [N, K] in [0, 15] → the tensor-core layout of aten::_weight_int4pack_mm (CUDA; untested here).

    Input is uint8 [N, K/2] with column 2j in the high nibble (gpt-fast's convention)."""
    q = q.to(torch.int32)
    return torch.ops.aten._convert_weight_to_int4pack(((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8).contiguous(),
                                                      inner_k_tiles)


# --- 2:4 semi-structured sparsity -----------------------------------------------------------

def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    """Keep the 2 largest-magnitude weights of every 4 consecutive input columns; zero the others."""
    n, k = w.shape
    wg = w.reshape(n, k // 4, 4)
    keep = wg.abs().topk(2, dim=-1).indices
    mask = torch.zeros_like(wg, dtype=torch.bool).scatter_(-1, keep, True)
    return (wg * mask).reshape(n, k)
