"""Our decode GEMV under a model's plain nn.Linear layers.

On a CPU where our kernels run (variants/kernels: AVX-512 BF16 + VNNI or AVX2 + FMA, a C++ compiler),
`swap_linears(model)` makes every nn.Linear whose weight is fp32 or bf16 a `KernelLinear`: the same
module with the same parameters and state_dict (its class is swapped in place; nothing is copied),
whose calls with few activation rows (decode: one row per sequence; up to where ours beats aten,
`kernels.OURS_UP_TO`, per instruction set: 8 for fp32; bf16 4, or 8 with K ≤ 1024, on AVX-512, 8 on AVX2) go
to `fp32_mm` / `bf16_mm`, and whose larger calls (prefill, scoring) stay on aten::linear. Measured at M = 1
on the build machine (2 threads, cold weights; benchmarks/decode_kernels.py): aten's fp32 linear reads its
weight at 16-22 GB/s and its bf16 linear at 18-20 GB/s; ours at 39-45 and 35-52.

Where aten's bf16 matmul has no vector kernel (oneDNN's bf16 needs AVX-512: on an AVX2 CPU aten multiplies
bf16 in scalar code), a larger bf16 call widens x and the weight to fp32 and runs aten's fp32 linear, rounding
the result to bf16 as aten's bf16 linear does: 2-8x faster on the AVX2 EPYC at M = 16-512 (768x2048,
2048x768, 768x768; a 2026-12-06 session measurement), the same values up to fp32 summation order.

The quantized modules (variants/quant_linear.py) pick ours per call in the same way; they need no
swap. variants/decode_kernels.py puts all of ours under a built or loaded variant.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels as vk

FLOAT_OPS = {torch.float32: "fp32_mm", torch.bfloat16: "bf16_mm"}


@functools.cache
def aten_bf16_is_scalar() -> bool:
    """Whether aten's CPU bf16 matmul runs scalar code here: oneDNN, which vectorises it, reports no bf16 support
    (it needs AVX-512 or AVX-VNNI-2); an older torch without the query: False (aten's, as it is)."""
    try:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False


def widened_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """aten's bf16 linear, computed in fp32 and rounded to bf16 (module docstring)."""
    return F.linear(x.float(), w.float(), None if bias is None else bias.float()).to(x.dtype)


def rows_for_ours(op: str, x: torch.Tensor) -> bool:
    """Whether a call with activations x [..., K] has few enough rows for our `op`, on the CPU, with our
    kernels loaded."""
    k = x.shape[-1]
    return x.device.type == "cpu" and vk.ours_beats_aten(op, x.numel() // max(k, 1), k) and vk.available()


class KernelLinear(nn.Linear):
    """An nn.Linear whose decode-shaped calls run our fp32/bf16 GEMV (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype != w.dtype or w.dtype not in FLOAT_OPS or not rows_for_ours(FLOAT_OPS[w.dtype], x):
            if w.dtype == x.dtype == torch.bfloat16 and x.device.type == "cpu" and aten_bf16_is_scalar():
                return widened_linear(x, w, self.bias)
            return F.linear(x, w, self.bias)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()
        y = vk.fp32_mm(x2, w) if w.dtype == torch.float32 else vk.bf16_mm(x2, w)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)


def plain_class(module: nn.Module) -> type:
    """The module's class as a checkpoint knows it: nn.Linear for a KernelLinear (same state, same maths)."""
    return nn.Linear if isinstance(module, KernelLinear) else type(module)


def swap_linears(model: nn.Module) -> None:
    """Make the model's fp32/bf16 CPU nn.Linear layers KernelLinear, in place (our kernels must run here)."""
    for module in model.modules():
        if (type(module) is nn.Linear and module.weight.device.type == "cpu"
                and module.weight.dtype in FLOAT_OPS and module.weight.is_contiguous()):
            module.__class__ = KernelLinear
