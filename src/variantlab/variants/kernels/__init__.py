"""Our CPU kernels for decode-shaped matmuls (M = 1..8 activation rows), where aten's fall short.

Measured on the build machine (benchmarks/decode_kernels.py has the figures and the command): at
M = 1, aten's bf16 linear, int8 `_weight_int8pack_mm` and int4 `_weight_int4pack_mm_for_cpu` read
their weights well below the machine's memory bandwidth; these kernels read at it. They come in one
C++ source per instruction set, the same API (vk.h) and layouts: gemv_avx512.cpp (AVX-512 BF16 + VNNI)
and gemv_avx2.cpp (AVX2 + FMA: llama.cpp's sign trick, maddubs, where VNNI would run); _build.py
builds the one this CPU runs on first use (`ISA`). Up to how many rows each replaces aten's is the
instruction set's (`UP_TO`, below): on AVX2 aten's bf16 and int8 matmuls have no vector kernels, so ours
replace them at more rows, some at every size.

| op (torch.ops.variantlab_kernels.*) | weights it reads                 | activations | replaces at M ≤ 8 |
|-------------------------------------|----------------------------------|-------------|-------------------|
| fp32_mm(x, w)                       | fp32 [N, K] (the nn.Linear's)    | fp32        | aten::linear      |
| bf16_mm(x, w)                       | bf16 [N, K] (the nn.Linear's)    | bf16        | aten::linear      |
| int8_mm(x, q, s)                    | int8 [N, K] + s [N]              | fp32        | _weight_int8pack_mm |
| int8_digits_mm(x, q, s)             | int8 [N, K] + s [N]              | bf16: 2 int8 digits a value | _weight_int8pack_mm |
| int4_mm(x, p, sz, gs, N)            | packing.pack_int4_bf16 + sz      | bf16, fp32  | _weight_int4pack_mm_for_cpu |
| int4_digits_mm(x, p, sz, gs, N)     | packing.pack_int4_vnni + sz      | bf16: 2 int8 digits a value | _weight_int4pack_mm_for_cpu |
| w8a8_mm(x, q, s)                    | int8 [N, K] + s [N]              | int8/token  | torch._int_mm     |
| w4a8_mm(x, p, sz, gs, N)            | packing.pack_int4_vnni + sz      | int8/token  | G × torch._int_mm |
| decode_attention(q, k, v, keep, sc) | the KV cache [B, Hkv, L, D]      | fp32, bf16  | SDPA at q_len 1   |

Each op equals its reference in packing.py (plain PyTorch, fp32 from the dequantized weight) up to
fp32 summation order; tests/variants/test_kernels.py checks it on odd shapes. `status()` says
whether they run here and, if not, why (neither AVX-512 BF16/VNNI nor AVX2/FMA, no compiler, switched off): callers
then keep aten, and say so in their notes. `prepare(say)` is status() for the commands that time
things: called first, in their own process, it makes the one build there (_cache.py keeps it), so
that their workers only load it.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from ._build import ISA, ISA_NAME, ISAS, OFF, KernelStatus, load
from ._cache import to_stderr
from .packing import pack_int4_bf16, pack_int4_vnni, pack_scales_zeros

MAX_ROWS = 8  # the kernels' M; above it they loop over chunks of 8 rows, re-reading the weight

# Up to how many activation rows each op beats aten's, per instruction set, at any K and with K ≤ SMALL_K, so
# that callers use it (benchmarks/decode_kernels.py, 2 threads, cold weights, 768x768, 768x2048, 2048x768 and
# 4096²). EVERY: at every M (ours loops over chunks of MAX_ROWS rows; the weight is read once a chunk).
# AVX-512: fp32_mm 1.2-5.3x at every M ≤ 8; bf16_mm 1.3-3x up to M = 4, at M = 8 2.0-2.2x with K = 768 but
# 0.70-0.85x with K ≥ 2048; int8_mm 1.0-1.19x at M = 1, at M = 2-8 1.13x with K = 768 but 0.74-0.89x with
# K ≥ 2048; w8a8_mm 1.2-2.75x at every M ≤ 8.
# AVX2 (2026-12-06, session measurements of each op against aten's at M = 2-512): fp32_mm and bf16_mm 1.4-2.6x
# at M = 1 and 4, where aten's bf16 matmul has no vector kernel (oneDNN's bf16 needs AVX-512: 1-3 ms for a
# 768x2048 layer at M = 8-16); aten's _weight_int8pack_mm and torch._int_mm have none either (0.44-0.54 s for
# 512 rows of a 768x2048 or 2048x768 layer with fp32 x, 0.42-0.48 s): int8_mm (fp32 x) 13-37x and w8a8_mm
# 25-44x at every M; with bf16 x int8pack is vectorised: int8_digits_mm 0.93-2.1x at M = 2-8, 0.70-0.92x at 512.
# w4a8_mm beats aten's at every M on both (its caller uses it at any size).
SMALL_K = 1024
EVERY = 1 << 62
UP_TO = {"AVX-512": {"fp32_mm": (8, 8), "bf16_mm": (4, 8), "int8_mm": (1, 8), "int8_digits_mm": (1, 8),
                     "w8a8_mm": (8, 8)},
         "AVX2": {"fp32_mm": (8, 8), "bf16_mm": (8, 8), "int8_mm": (EVERY, EVERY), "int8_digits_mm": (8, 8),
                  "w8a8_mm": (EVERY, EVERY)}}
OURS_UP_TO = UP_TO.get(ISA_NAME, UP_TO["AVX-512"])   # this CPU's (no ISA: our kernels never run)


def rows_up_to(op: str, k: int) -> int:
    """The most activation rows of `k` features at which `op` beats aten's here (OURS_UP_TO)."""
    any_k, small_k = OURS_UP_TO[op]
    return small_k if k <= SMALL_K else any_k


def ours_beats_aten(op: str, rows: int, k: int) -> bool:
    """Whether `op` on `rows` activation rows of `k` features is faster than aten's here (OURS_UP_TO)."""
    return rows <= rows_up_to(op, k)


def rows_label(op: str) -> str:
    """Where the callers use `op`, in words: 'bf16_mm at ≤ 4 rows (≤ 8 with K ≤ 1024)', 'w8a8_mm at every M'."""
    any_k, small_k = OURS_UP_TO[op]
    rows = "every M" if any_k >= EVERY else "1 row" if any_k == 1 else f"≤ {any_k} rows"
    small = "every M" if small_k >= EVERY else f"≤ {small_k}"
    return f"{op} at {rows}" + (f" ({small} with K ≤ {SMALL_K})" if small_k != any_k else "")

__all__ = ["ISA", "ISA_NAME", "ISAS", "OFF", "KernelStatus", "status", "prepare", "available", "fp32_mm", "bf16_mm", "int8_mm", "int8_digits_mm",
           "int4_mm", "int4_digits_mm", "w8a8_mm",
           "w4a8_mm", "decode_attention", "switched_off", "pack_int4_bf16", "pack_int4_vnni", "pack_scales_zeros",
           "MAX_ROWS", "EVERY", "UP_TO", "OURS_UP_TO", "rows_up_to", "ours_beats_aten", "rows_label"]


_status: KernelStatus | None = None   # a plain global, not functools.cache: torch.compile traces reads of it


def status(say: Callable[[str], None] | None = None, *, retry_failed: bool = True) -> KernelStatus:
    """Whether our kernels run here (built or loaded on first call, once per process) and, if not, why.
    `say` hears what a build or a wait for another process's build is doing (default: stderr);
    `retry_failed` False (a measuring worker): a build that failed before is not tried again."""
    global _status
    if _status is None:
        _status = load(say, retry_failed=retry_failed)
    return _status


def prepare(say: Callable[[str], None] | None = None, device: str = "cpu") -> KernelStatus | None:
    """status(), for a command about to time things on `device` (None off the CPU: nothing to do): a build
    happens now, in this process, and `say` (default: stderr) hears it, before and after, or the wait for
    another process's; nothing when the kernels load or cannot run here."""
    if device.split(":")[0] != "cpu" and (device != "auto" or torch.cuda.is_available()):
        return None
    first = _status is None
    st = status(say)
    say = say or to_stderr
    if not first:
        return st
    if st.available and st.action != "loaded":
        again = f" (the build of {', '.join(st.interrupted)} was interrupted)" if st.interrupted else ""
        say(f"{st.action} variantlab's CPU kernels{again} in {st.load_s:.1f} s; workers load them from {st.library}")
    elif st.available and st.waited_s:
        say(f"variantlab's CPU kernels: built by another process (waited {st.waited_s:.0f} s); loaded")
    elif st.waited_s:
        say(st.reason)
    return st


@contextlib.contextmanager
def switched_off(why: str = "switched off"):
    """Inside, our kernels count as unavailable (status() says `why`; callers take aten's path, and a
    W4A8 built inside holds the group-major layout): for side-by-side comparisons with aten's."""
    global _status
    saved = status()
    _status = KernelStatus(False, f"{OFF} {why}; aten runs instead")
    try:
        yield
    finally:
        _status = saved


def available() -> bool:
    return (_status or status()).available


def _ops():
    st = _status or status()
    if not st.available:
        raise RuntimeError(st.reason)
    return torch.ops.variantlab_kernels


def fp32_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x fp32 [M, K] @ w fp32 [N, K]ᵀ → fp32 [M, N]."""
    return _ops().fp32_mm(x, w)


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


def int8_digits_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (q int8 [N, K] · scales [N])ᵀ → x.dtype [M, N], x held as two int8 digits a value on a per-row
    scale (16-bit fixed point, packing.activation_digits) and multiplied with VNNI: int8 weight-only at decode."""
    return _ops().int8_digits_mm(x, q, scales)


def int4_digits_mm(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int,
                   out_features: int) -> torch.Tensor:
    """x [M, K] as two int8 digits a value @ int4 group-wise weights (pack_int4_vnni, pack_scales_zeros)ᵀ, VNNI:
    int4 weight-only with bf16 activations (packing.int4_digits_mm_reference)."""
    return _ops().int4_digits_mm(x, packed, scales_zeros, group_size, out_features)


def w8a8_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Per-token int8 quantized x [M, K] @ (q int8 [N, K] · scales [N])ᵀ → x.dtype [M, N]."""
    return _ops().w8a8_mm(x, q, scales)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """softmax(q·Kᵀ·scale)·V for one query position: q [B, H, 1, D], k, v [B, Hkv, L, D], keep bool
    [B, L] or None (all) → [B, 1, H, D] in q's dtype. Masked positions are skipped, never read."""
    return _ops().decode_attention(q, k, v, keep, scale)


def w4a8_mm(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int,
            out_features: int) -> torch.Tensor:
    """Per-token int8 quantized x [M, K] @ int4 group-wise weights (pack_int4_vnni, pack_scales_zeros)ᵀ."""
    return _ops().w4a8_mm(x, packed, scales_zeros, group_size, out_features)
