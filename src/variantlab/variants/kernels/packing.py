"""Layouts our decode kernels read, and the plain-PyTorch reference of each kernel: pure functions.

The kernels (gemv_avx512.cpp) read:

- fp32_mm, bf16_mm, int8_mm, w8a8_mm: the tensors the modules already hold (nn.Linear's bf16 weight [N, K];
  int8 q [N, K] with scales [N], quant_packing's per-channel format). No packing.
- int4_mm: `pack_int4_bf16(q)`: N padded to a multiple of 16 with zero rows, then per block of 16
  rows, per 4 input columns, 32 bytes: byte 2i = q[i, 4c] | q[i, 4c+2] << 4,
  byte 2i+1 = q[i, 4c+1] | q[i, 4c+3] << 4 (row i of the block). Widened to 16-bit words, word pair
  (2i, 2i+1) is row i's pair of columns: one lane of `_mm512_dpbf16_ps` against a broadcast x pair.
- w4a8_mm: `pack_int4_vnni(q)`: per block of 16 rows, per 8 columns, 64 bytes:
  byte 4i + j = q[i, 8c + j] | q[i, 8c + 4 + j] << 4: the 4 bytes of lane i are row i's 4 columns,
  one lane of `_mm512_dpbusd_epi32` against a broadcast quad of int8 activations.
- both int4 kernels: `pack_scales_zeros(s, z)`: [N/16, G, 2, 16], the 16 scales then the 16 zeros of
  a block's group g in one 64-byte line (bf16) next to the weights that use them. w4a8_mm and
  int4_digits_mm also read symmetric int4 (z = 0): `pack_scales_zeros(s, None)`, [N/16, G, 16], the
  scales alone (their size tells the kernel which), 4.5 bits a weight at group 32 where both are 5.

q, s, z are quant_packing's int4 convention: w = (q − 8)·s + z, q ∈ [0, 15], s, z [N, G]. Packing is
lossless (`unpack_*` invert it; the tests check), so an artifact can keep quant_packing's portable
form (nibbles [N, K/2] + s, z [N, G]) and a module packs at load for the kernel this machine runs.

The references compute in fp32 from the dequantized weight (no bf16 rounding of w), then round to
the activation's dtype: what each kernel computes up to fp32 summation order.
"""
from __future__ import annotations

import torch

from .. import quant_packing as qp

BLOCK = 16  # output rows per packed block: one fp32 zmm of outputs


def padded_rows(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _blocks(q: torch.Tensor, cols: int) -> torch.Tensor:
    """q [N, K] in [0, 15] → uint8 [N16/16, K/cols, 16, cols] (zero rows pad N)."""
    n, k = q.shape
    if k % cols:
        raise ValueError(f"in_features {k} must be a multiple of {cols} for this layout")
    q = torch.nn.functional.pad(q.to(torch.uint8), (0, 0, 0, padded_rows(n) - n))
    return q.reshape(-1, BLOCK, k // cols, cols).transpose(1, 2)


def pack_int4_bf16(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] in [0, 15] → uint8 [N16/16, K·8] (int4_mm's layout, module docstring)."""
    b = _blocks(q, 4)
    pairs = torch.stack((b[..., 0] | b[..., 2] << 4, b[..., 1] | b[..., 3] << 4), dim=-1)  # [nb, K/4, 16, 2]
    return pairs.reshape(b.shape[0], -1).contiguous()


def unpack_int4_bf16(p: torch.Tensor, n: int) -> torch.Tensor:
    nb = p.shape[0]
    pairs = p.reshape(nb, -1, BLOCK, 2)
    cols = torch.stack((pairs[..., 0] & 15, pairs[..., 1] & 15, pairs[..., 0] >> 4, pairs[..., 1] >> 4), dim=-1)
    return cols.transpose(1, 2).reshape(nb * BLOCK, -1)[:n]


def pack_int4_vnni(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] in [0, 15] → uint8 [N16/16, K·8] (w4a8_mm's layout, module docstring)."""
    b = _blocks(q, 8)
    return (b[..., :4] | b[..., 4:] << 4).reshape(b.shape[0], -1).contiguous()  # [nb, K/8, 16, 4] flattened


def unpack_int4_vnni(p: torch.Tensor, n: int) -> torch.Tensor:
    nb = p.shape[0]
    quads = p.reshape(nb, -1, BLOCK, 4)
    return torch.cat((quads & 15, quads >> 4), dim=-1).transpose(1, 2).reshape(nb * BLOCK, -1)[:n]


def pack_scales_zeros(s: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
    """s, z [N, G] → [N16/16, G, 2, 16] in their dtype (padded rows: 0, so they contribute 0); z None (symmetric
    int4): s alone, [N16/16, G, 16]."""
    n, g = s.shape
    pad = padded_rows(n) - n
    sz = torch.stack((s,) if z is None else (s, z), dim=0)           # [2 or 1, N, G]
    sz = torch.nn.functional.pad(sz, (0, 0, 0, pad))                  # [., N16, G]
    sz = sz.reshape(sz.shape[0], -1, BLOCK, g).permute(1, 3, 0, 2)   # [nb, G, ., 16]
    return (sz if z is not None else sz[:, :, 0]).contiguous()


def unpack_scales_zeros(sz: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of pack_scales_zeros: (s, z) [n, G]; z is zeros for the scales alone."""
    if sz.dim() == 3:
        sz = torch.stack((sz, torch.zeros_like(sz)), dim=2)
    nb, g = sz.shape[:2]
    flat = sz.permute(2, 0, 3, 1).reshape(2, nb * BLOCK, g)
    return flat[0, :n], flat[1, :n]


# --- references: what each kernel computes, in plain PyTorch ------------------------------------

def _out(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.float() @ w.float().t()).to(x.dtype)


def fp32_mm_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _out(x, w)


def bf16_mm_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _out(x, w)


def int8_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return _out(x, qp.dequantize_int8_per_channel(q, s, torch.float32))


def int4_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    return _out(x, qp.dequantize_int4_groupwise(q, s, z, group_size, torch.float32))


def activation_digits(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] as two int8 digits per value on a per-row scale: (hi, lo, a) with x ≈ a·(hi + lo/256), as
    int8_digits_mm holds its activations (a = max|x| / 127; both digits rounded half to even, in [−127, 127])."""
    xf = x.float()
    a = (xf.abs().amax(dim=-1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    v = xf / a
    hi = torch.round(v).clamp(-127, 127)
    lo = torch.round((v - hi) * 256).clamp(-127, 127)
    return hi, lo, a


def int8_digits_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    hi, lo, a = activation_digits(x)
    qd = q.double().t()
    return (((hi.double() @ qd) + (lo.double() @ qd) / 256) * a.double() * s.double()).to(x.dtype)


def int4_digits_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor,
                             group_size: int) -> torch.Tensor:
    hi, lo, a = activation_digits(x)
    w = qp.dequantize_int4_groupwise(q, s, z, group_size, torch.float64).t()
    return (((hi.double() @ w) + (lo.double() @ w) / 256) * a.double()).to(x.dtype)


def w8a8_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    xq, a = qp.quantize_int8_per_token(x)
    acc = xq.to(torch.int32) @ q.to(torch.int32).t()  # exact
    return (acc * a * s.float()).to(x.dtype)


def w4a8_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    xq, a = qp.quantize_int8_per_token(x)
    w = qp.dequantize_int4_groupwise(q, s, z, group_size, torch.float64)
    return ((xq.double() @ w.t()) * a.double()).to(x.dtype)
