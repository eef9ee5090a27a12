"""Compile our CPU kernels on first use (JIT, cached per build) or say why they cannot run here.

`pip install -e .` stays two commands: nothing is compiled at install. The kernels come in one source per
instruction set, the same API (vk.h) and the same packed layouts: gemv_avx512.cpp (AVX-512 F/BW/VL/BF16/VNNI)
and gemv_avx2.cpp (AVX2 + FMA + F16C); the library links the first of ISAS whose instruction sets the CPU has
(`ISA`), with ops.cpp (the torch ops) and decode_step.cpp (the decode step over them).

The first `load()` in a process checks, in order, that kernels are not switched off (VARIANTLAB_KERNELS=0),
that the CPU has an instruction set we have a source for (a build for one it lacks would die with an illegal
instruction, so this is checked before compiling), and that a C++ compiler and ninja exist; then
_cache.build_or_load loads the library from its keyed folder ($VARIANTLAB_CACHE/kernels or
~/.cache/variantlab/kernels, one folder per source, flags, torch install and compiler: two installs never
rebuild over each other), building it there first when none is (a lock whose holder died is free at once;
a live build is waited for, saying so, up to WAIT_S). Any failure leaves `KernelStatus.available` False
with the reason, and callers keep aten.

The commands that time things (bench, build, serve, explain) call `kernels.prepare` first, in their
own process, so the one build happens there and their workers only load it.

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
from typing import Callable

import torch

from . import _cache
from ._cache import Extension

HERE = Path(__file__).parent
STEP_SOURCE = HERE / "decode_step.cpp"   # the decode step over the kernels
OPS_SOURCE = HERE / "ops.cpp"            # the kernels as torch ops
HEADERS = (HERE / "vk.h", HERE / "common.h")
SWITCH = "VARIANTLAB_KERNELS"  # "0": never compile or use our kernels (aten everywhere)
OFF = "our CPU kernels are off:"   # how every reason they do not run here begins
WAIT_S = _cache.DEFAULT_WAIT_S   # the longest a process waits for another's live build, then runs aten


@dataclass(frozen=True)
class Isa:
    """One instruction set we have kernels for: its source, the CPU flags it needs and the compiler's."""

    name: str                      # in labels: "AVX-512", "AVX2"
    int_label: str                 # how its integer dot products run, in labels: "AVX-512 VNNI"
    source: Path
    cpu_flags: tuple[str, ...]     # as /proc/cpuinfo spells them
    cflags: tuple[str, ...]

    def extension(self) -> Extension:
        return Extension("variantlab_kernels", (self.source, STEP_SOURCE, OPS_SOURCE), self.cflags, ("-fopenmp",),
                         title=f"variantlab's CPU kernels ({self.name})", expected_s=35, headers=HEADERS)


AVX512 = Isa("AVX-512", "AVX-512 VNNI", HERE / "gemv_avx512.cpp",
             ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"),
             ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni"))
AVX2 = Isa("AVX2", "AVX2 maddubs", HERE / "gemv_avx2.cpp", ("avx2", "fma", "f16c"),
           ("-O3", "-fopenmp", "-mavx2", "-mfma", "-mf16c"))
ISAS = (AVX512, AVX2)   # the first whose flags the CPU has is built


def cpu_flags() -> set[str]:
    from ...device_facts import this_cpu
    return set(this_cpu()[1])


def isa_for(flags: set[str], only: str | None = None) -> Isa | None:
    """The instruction set whose kernels a CPU with these flags runs, or None. `only` (an `ISA_SWITCH` value:
    "avx2", "avx-512") keeps that one alone: an AVX-512 host told "avx2" runs the AVX2 kernels, as an AVX2 host
    does; one told "avx-512" without those flags runs none."""
    chosen = ISAS if not only else tuple(isa for isa in ISAS if _isa_key(isa.name) == _isa_key(only))
    return next((isa for isa in chosen if set(isa.cpu_flags) <= flags), None)


def _isa_key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def forced_isa() -> str | None:
    """The instruction set `ISA_SWITCH` asks for, or None (unset: the best this CPU has)."""
    return os.environ.get(ISA_SWITCH, "").strip() or None


def unknown_isa() -> str | None:
    """Why `ISA_SWITCH`'s value names no instruction set we have kernels for (naming what it accepts), or None."""
    asked = forced_isa()
    if asked is None or _isa_key(asked) in {_isa_key(isa.name) for isa in ISAS}:
        return None
    return (f"{ISA_SWITCH}={asked!r} names no instruction set we have kernels for (accepted: "
            + ", ".join(isa.name.lower() for isa in ISAS) + ", or unset for the best this CPU has)")


ISA_SWITCH = "VARIANTLAB_ISA"   # "avx2": the AVX2 kernels on an AVX-512 host (what an AVX2 machine runs)
ISA = isa_for(cpu_flags(), forced_isa())   # this CPU's (None: neither)
ISA_NAME = ISA.name if ISA else "CPU"   # in labels
KERNELS = (ISA or AVX2).extension()


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    reason: str            # why not, or what was loaded
    load_s: float = 0.0    # compile (first use) or load time in this process, waiting included
    action: str = ""       # "loaded", "built" or "rebuilt" (an interrupted build was found); "" when not available
    library: str = ""      # the library's path
    waited_s: float = 0.0  # for another process's live build
    interrupted: tuple[str, ...] = ()   # the interrupted builds found: "pid 123"

    @property
    def built_here(self) -> bool:
        """This process compiled the library (or waited for another's build): time no measurement should hold."""
        return self.action in ("built", "rebuilt") or self.waited_s > 0


def missing_requirement(flags: set[str] | None = None) -> str | None:
    """Why the kernels cannot be built or run here, or None."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"switched off ({SWITCH}=0)"
    if platform.machine() not in ("x86_64", "AMD64") or platform.system() != "Linux":
        return f"needs x86-64 Linux (this is {platform.system()} {platform.machine()})"
    flags = cpu_flags() if flags is None else flags
    if unknown_isa():
        return unknown_isa()
    if forced_isa() and isa_for(flags, forced_isa()) is None:
        return f"{ISA_SWITCH}={forced_isa()} asks for kernels this CPU lacks the instructions of"
    if isa_for(flags) is None:
        missing = [f for f in AVX2.cpu_flags if f not in flags]
        return f"the CPU lacks {', '.join(missing)} (our kernels need AVX-512 with BF16 and VNNI, or AVX2 with FMA)"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx} not on PATH)"
    try:
        from torch.utils.cpp_extension import verify_ninja_availability
        verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install ninja)"
    return None


def load(say: Callable[[str], None] | None = None, *, retry_failed: bool = True) -> KernelStatus:
    """Build or load KERNELS (once per process: kernels.status caches it); never raises. `say` hears what a
    build or a wait is doing (default: stderr); `retry_failed` False: a build that failed before is not
    tried again (a measuring worker)."""
    reason = missing_requirement()
    if reason:
        return KernelStatus(False, f"{OFF} {reason}; aten runs instead")
    t0 = time.perf_counter()
    try:
        got = _cache.build_or_load(KERNELS, None, wait_s=WAIT_S, retry_failed=retry_failed,
                                   **({"say": say} if say else {}))
        if KERNELS.name == "variantlab_kernels":   # (the tests build small libraries of their own through here)
            _register_fakes()
    except _cache.WaitedTooLong as exc:
        return KernelStatus(False, f"our CPU kernels are off in this process: {exc}; aten runs instead",
                            time.perf_counter() - t0, waited_s=time.perf_counter() - t0)
    except Exception as exc:  # a compiler error, a missing header, an unwritable cache: fall back, say why
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return KernelStatus(False, f"our CPU kernels failed to build ({first}); aten runs instead",
                            time.perf_counter() - t0)
    return KernelStatus(True, f"variantlab {ISA_NAME} decode kernels", time.perf_counter() - t0, got.action,
                        str(got.library), got.waited_s, got.interrupted)


@functools.cache
def _register_fakes() -> None:
    """Shapes and dtypes only, for torch.compile / meta tensors (once per process)."""
    lib = "variantlab_kernels::"

    def plain(x, w, *scales):
        return x.new_empty(x.shape[0], w.shape[0])

    def int4(x, packed, scales_zeros, group_size, out_features):
        return x.new_empty(x.shape[0], out_features)

    for name in ("fp32_mm", "bf16_mm", "int8_mm", "int8_digits_mm", "w8a8_mm"):
        torch.library.register_fake(lib + name, plain)
    for name in ("int4_mm", "int4_digits_mm", "w4a8_mm"):
        torch.library.register_fake(lib + name, int4)

    def attention(q, k, v, keep, scale):
        return q.new_empty(q.shape[0], 1, q.shape[1], q.shape[3])

    torch.library.register_fake(lib + "decode_attention", attention)
