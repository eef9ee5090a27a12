"""The machine's measured ceilings: what a figure is compared against.

A single-stream decode step must read every weight (and the KV cache) once per token, so its
ceiling is the rate at which this process can read memory. `read_bandwidth` measures that: a pass
over a buffer far larger than the caches (a sum, or our GEMV where it runs: the faster), with the
threads torch uses now. `copy_bandwidth` (read + write bytes of a copy ÷ time) is the figure
DESIGN.md quotes. Both are measured, not quoted: on a
shared machine they move with the load, so a worker measures them in the same round as its decode.
"""
from __future__ import annotations

import time

BUFFER_BYTES = 128 * 2**20   # far past any L3: what DRAM gives


def _best(fn, repeats: int) -> float:
    fn()                       # first touch and warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(nbytes: int = BUFFER_BYTES, repeats: int = 3) -> float:
    """GB/s this process reads memory at: the best of `repeats` passes over `nbytes`, each either a
    torch sum or, where our kernels run, our fp32 GEMV streaming the buffer as a [N, 1024] matrix
    (the way a decode step reads its weights; torch's sum read 42 GB/s here where the GEMV read 50+,
    so the sum alone would put decode above 100% of its ceiling)."""
    import torch
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    best = _best(buf.sum, repeats)
    from .variants import kernels
    if kernels.available() and buf.numel() % 1024 == 0:
        w, x = buf.view(-1, 1024), torch.ones(1, 1024)
        best = min(best, _best(lambda: kernels.fp32_mm(x, w), repeats))
    return nbytes / best / 1e9


def copy_bandwidth(nbytes: int = BUFFER_BYTES, repeats: int = 3) -> float:
    """GB/s of a copy of `nbytes`, counting read + write (DESIGN.md's "copy bandwidth")."""
    import torch
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best(lambda: dst.copy_(src), repeats) / 1e9
