"""Our CPU kernels for decode-shaped matmuls (M = 1..8 activation rows), where aten's fall short.

Measured on the build machine (benchmarks/decode_kernels.py has the figures and the command): at
M = 1, aten's bf16 linear, int8 `_weight_int8pack_mm` and int4 `_weight_int4pack_mm_for_cpu` read
their weights well below the machine's memory bandwidth; these AVX-512 kernels (gemv_avx512.cpp,
one file, built on first use by _build.py) read at it.

| op (torch.ops.variantlab_kernels.*) | weights it reads                 | activations | replaces at M ≤ 8 |
|-------------------------------------|----------------------------------|-------------|-------------------|
| bf16_mm(x, w)                       | bf16 [N, K] (the nn.Linear's)    | bf16        | aten::linear      |
| int8_mm(x, q, s)                    | int8 [N, K] + s [N]              | bf16, fp32  | _weight_int8pack_mm |
| int4_mm(x, p, sz, gs, N)            | packing.pack_int4_bf16 + sz      | bf16, fp32  | _weight_int4pack_mm_for_cpu |
| w8a8_mm(x, q, s)                    | int8 [N, K] + s [N]              | int8/token  | torch._int_mm     |
| w4a8_mm(x, p, sz, gs, N)            | packing.pack_int4_vnni + sz      | int8/token  | G × torch._int_mm |

Each op equals its reference in packing.py (plain PyTorch, fp32 from the dequantized weight) up to
fp32 summation order; tests/variants/test_kernels.py checks it on odd shapes. `status()` says
whether they run here and, if not, why (no AVX-512 BF16/VNNI, no compiler, switched off): callers
then keep aten, and say so in their notes.
"""
from __future__ import annotations

import torch

from ._build import KernelStatus, load
from .packing import pack_int4_bf16, pack_int4_vnni, pack_scales_zeros

MAX_ROWS = 8  # the kernels' M; above it they loop over chunks of 8 rows, re-reading the weight

__all__ = ["KernelStatus", "status", "available", "bf16_mm", "int8_mm", "int4_mm", "w8a8_mm", "w4a8_mm",
           "pack_int4_bf16", "pack_int4_vnni", "pack_scales_zeros", "MAX_ROWS"]


def status() -> KernelStatus:
    return load()


def available() -> bool:
    return load().available


def _ops():
    st = load()
    if not st.available:
        raise RuntimeError(st.reason)
    return torch.ops.variantlab_kernels


def bf16_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x bf16 [M, K] @ w bf16 [N, K]ᵀ → bf16 [M, N]."""
    return _ops().bf16_mm(x, w)


def int8_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (q int8 [N, K] · scales [N])ᵀ → x.dtype [M, N]; float activations."""
    return _ops().int8_mm(x, q, scales)


def int4_mm(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int,
            out_features: int) -> torch.Tensor:
    """x [M, K] @ int4 group-wise weights (pack_int4_bf16, pack_scales_zeros)ᵀ → x.dtype [M, N]."""
    return _ops().int4_mm(x, packed, scales_zeros, group_size, out_features)


def w8a8_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Per-token int8 quantized x [M, K] @ (q int8 [N, K] · scales [N])ᵀ → x.dtype [M, N]."""
    return _ops().w8a8_mm(x, q, scales)


def w4a8_mm(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int,
            out_features: int) -> torch.Tensor:
    """Per-token int8 quantized x [M, K] @ int4 group-wise weights (pack_int4_vnni, pack_scales_zeros)ᵀ."""
    return _ops().w4a8_mm(x, packed, scales_zeros, group_size, out_features)
