"""Compile gemv_avx512.cpp on first use (JIT, cached) or say why it cannot run here.

`pip install -e .` stays two commands: nothing is compiled at install. The first `load()` in a
process checks, in order, that kernels are not switched off (VARIANTLAB_KERNELS=0), that the CPU has
every instruction set the source is compiled for (a build on a CPU without them would die with an
illegal instruction, so this is checked before compiling), and that a C++ compiler and ninja exist;
then torch.utils.cpp_extension.load builds the library into the user's torch extensions folder
(~/.cache/torch_extensions, or TORCH_EXTENSIONS_DIR) or reuses the build there when the source and
flags are unchanged (a file lock makes concurrent first uses wait for one build). Any failure leaves
`KernelStatus.available` False with the reason, and callers keep aten.

The library registers its ops as torch.ops.variantlab_kernels.* (TORCH_LIBRARY, not pybind), with
fake (meta) implementations registered here, so torch.compile traces through them.
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("gemv_avx512.cpp")
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni")
CFLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni"]
SWITCH = "VARIANTLAB_KERNELS"  # "0": never compile or use our kernels (aten everywhere)


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    reason: str            # why not, or what was loaded
    load_s: float = 0.0    # compile (first use) or load time in this process


def cpu_flags() -> set[str]:
    from ...device_facts import this_cpu
    return set(this_cpu()[1])


def missing_requirement(flags: set[str] | None = None) -> str | None:
    """Why the kernels cannot be built or run here, or None."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"switched off ({SWITCH}=0)"
    if platform.machine() not in ("x86_64", "AMD64") or platform.system() != "Linux":
        return f"needs x86-64 Linux (this is {platform.system()} {platform.machine()})"
    missing = [f for f in CPU_FLAGS if f not in (cpu_flags() if flags is None else flags)]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx} not on PATH)"
    try:
        from torch.utils.cpp_extension import verify_ninja_availability
        verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install ninja)"
    return None


@functools.cache
def load() -> KernelStatus:
    """Build or load the library once per process; never raises."""
    reason = missing_requirement()
    if reason:
        return KernelStatus(False, f"our AVX-512 kernels are off: {reason}; aten runs instead")
    t0 = time.perf_counter()
    try:
        from torch.utils import cpp_extension
        cpp_extension.load(name="variantlab_kernels", sources=[str(SOURCE)], extra_cflags=CFLAGS,
                           extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        _register_fakes()
    except Exception as exc:  # a compiler error, a missing header: fall back, say why
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return KernelStatus(False, f"our AVX-512 kernels failed to build ({first}); aten runs instead",
                            time.perf_counter() - t0)
    return KernelStatus(True, "variantlab AVX-512 decode kernels", time.perf_counter() - t0)


def _register_fakes() -> None:
    """Shapes and dtypes only, for torch.compile / meta tensors."""
    lib = "variantlab_kernels::"

    def plain(x, w, *scales):
        return x.new_empty(x.shape[0], w.shape[0])

    def int4(x, packed, scales_zeros, group_size, out_features):
        return x.new_empty(x.shape[0], out_features)

    for name in ("fp32_mm", "bf16_mm", "int8_mm", "w8a8_mm"):
        torch.library.register_fake(lib + name, plain)
    for name in ("int4_mm", "w4a8_mm"):
        torch.library.register_fake(lib + name, int4)

    def attention(q, k, v, keep, scale):
        return q.new_empty(q.shape[0], 1, q.shape[1], q.shape[3])

    torch.library.register_fake(lib + "decode_attention", attention)
