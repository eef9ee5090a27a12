"""An emulated AVX-512 CPU for the kernels this host cannot run: bochscpu's Sapphire Rapids model (AVX-512 F/BW/VL,
BF16, VNNI), in long mode, with no OS. `Machine(library)` loads a shared library's bytes (never dlopen: its code
must not run on this CPU) into memory of its own; `call(name, *args)` runs one of its functions on the emulated
core, the arguments in registers and on the stack as the System V ABI puts them (integers and pointers only), and
returns when the function returns. Buffers (`put`, `take`) lie in an arena that the emulated core sees at the
same addresses as this process, so a pointer means the same on both sides.

What it cannot do, and says so: run code that calls out of the library (no dynamic linking is done: such a call
lands on an unmapped page, reported with the function it came from), or that runs past `MAX_SECONDS`."""
from __future__ import annotations

import ctypes
import mmap
import struct
import subprocess
from pathlib import Path

import torch

PAGE = 4096
ARENA_BYTES = 64 << 20
STACK_BYTES = 256 << 10
RETURN_TO = 0xDEAD_0000           # never mapped: the function's `ret` lands here, a page fault we expect
FIRST_PAGE_AT = 0x1000_0000       # the first guest-physical page; each page mapped, tables included, takes the next
MAX_SECONDS = 120.0
# bochscpu's cpu.model choices, by index (its names cannot be looked up: the enum's choice strings are not C
# strings in 0.4.0); Machine.features() reads the model's CPUID, so a wrong index fails loudly.
SAPPHIRE_RAPIDS = 30
# (leaf, subleaf, register: eax ebx ecx edx = 0 1 2 3, bit, name): _build.py's AVX-512 flags, as CPUID has them
CPUID_FEATURES = [(7, 0, 1, 16, "avx512f"), (7, 0, 1, 30, "avx512bw"), (7, 0, 1, 31, "avx512vl"),
                  (7, 0, 2, 11, "avx512_vnni"), (7, 1, 0, 5, "avx512_bf16")]
EXCEPTIONS = {0: "divide error", 6: "invalid opcode (an instruction this model lacks)", 13: "general protection",
              14: "page fault (memory outside the library and its buffers)", 17: "alignment check",
              19: "SIMD floating-point"}

# Ours beside bochscpu: glibc 2.38's two C23 names its wheel needs (import_bochscpu), and a watchdog. bochscpu's run
# holds the GIL, so no Python thread can stop it: a thread of this library sets its kill bit from the deadline on.
_HELPERS = r"""
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
unsigned long long __isoc23_strtoull(const char* s, char** end, int base) { return strtoull(s, end, base); }
int __isoc23_sscanf(const char* s, const char* fmt, ...) {
  va_list ap; va_start(ap, fmt); int r = vsscanf(s, fmt, ap); va_end(ap); return r;
}
static pthread_t watcher;
static volatile int watching;
static double deadline_s;
static void (*kill_cpu)(unsigned);
static void* watch(void* unused) {   /* past the deadline, sets the kill bit every tick until the run returns:
                                       the emulated core may overwrite one setting with its own */
  const struct timespec tick = {0, 10 * 1000 * 1000};
  for (double waited = 0; watching && waited < deadline_s; waited += 0.01) nanosleep(&tick, 0);
  while (watching) {
    kill_cpu(0);
    nanosleep(&tick, 0);
  }
  return unused;
}
void vke_watch(void (*kill)(unsigned), double seconds) {
  kill_cpu = kill; deadline_s = seconds; watching = 1;
  pthread_create(&watcher, 0, watch, 0);
}
void vke_unwatch(void) { watching = 0; pthread_join(watcher, 0); }
"""


def _helpers(workdir: Path) -> ctypes.CDLL:
    src, lib = workdir / "vke_helpers.c", workdir / "vke_helpers.so"
    if not lib.exists():
        src.write_text(_HELPERS)
        subprocess.run(["cc", "-O2", "-fPIC", "-shared", str(src), "-o", str(lib), "-lpthread"], check=True,
                       timeout=120)
    helpers = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    helpers.vke_watch.argtypes, helpers.vke_watch.restype = [ctypes.c_void_p, ctypes.c_double], None
    helpers.vke_unwatch.argtypes, helpers.vke_unwatch.restype = [], None
    return helpers


def import_bochscpu(workdir: Path):
    """bochscpu, with its CPU model set to Sapphire Rapids (before the first Session makes the CPU), our helpers,
    and bochscpu's native library. Its 0.4.0 wheel says manylinux_2_28 but names two C23 symbols of glibc 2.38
    (__isoc23_strtoull, __isoc23_sscanf): on an older glibc the helpers, loaded first, supply them (on a newer
    one glibc's own are found first)."""
    helpers = _helpers(workdir)
    import bochscpu
    import bochscpu._bochscpu as native
    import bochscpu.memory
    so = ctypes.CDLL(native.__file__)
    so.sim_get_param_enum.restype = ctypes.c_void_p
    so.sim_get_param_enum.argtypes = [ctypes.c_char_p]
    model = so.sim_get_param_enum(b"cpu.model")
    set_index = so._ZN15bx_param_enum_c3setEl                  # bx_param_enum_c::set(Bit64s)
    set_index.argtypes, set_index.restype = [ctypes.c_void_p, ctypes.c_int64], None
    set_index(model, SAPPHIRE_RAPIDS)
    return bochscpu, helpers, so


def _load_segments(path: Path) -> tuple[list[tuple[int, int, int, int]], int]:
    """PT_LOAD segments of an ELF64 shared library: (file offset, address, file size, memory size), and the span."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path}: not an ELF64 file"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segments = []
    for i in range(phnum):
        kind, _, off, vaddr, _, filesz, memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if kind == 1:
            segments.append((off, vaddr, filesz, memsz))
    return segments, max(v + m for _, v, _, m in segments)


_NEXT_PAGE = [FIRST_PAGE_AT]


class EmulationError(RuntimeError):
    pass


class Machine:
    def __init__(self, library: Path, workdir: Path):
        self.bochs, self._helpers, native = import_bochscpu(workdir)
        self._kill = ctypes.cast(native.cpu_set_killbit, ctypes.c_void_p).value
        self._clear_kill = native.cpu_clear_killbit
        self._clear_kill.argtypes, self._clear_kill.restype = [ctypes.c_uint], None
        self.library = library
        self._maps: list[mmap.mmap] = []
        self._table = self.bochs.memory.PageMapLevel4Table()
        segments, span = _load_segments(library)
        self._code, self.base = self._mapped((span + PAGE - 1) // PAGE * PAGE)
        data = library.read_bytes()
        for off, vaddr, filesz, _ in segments:
            self._code[vaddr:vaddr + filesz] = data[off:off + filesz]
        self.symbols = self._symbols()
        self._arena, self._arena_at = self._mapped(ARENA_BYTES)
        self._used = 0
        self._cr3 = _NEXT_PAGE[0]                  # the page tables take guest-physical pages after the rest
        for hva, gpa in self._table.commit(self._cr3):
            self.bochs.memory.page_insert(gpa, hva)
            _NEXT_PAGE[0] = max(_NEXT_PAGE[0], gpa + PAGE)
        self.session = self.bochs.Session()
        self.session.missing_page_handler = self._missing

    def _mapped(self, size: int) -> tuple[mmap.mmap, int]:
        """Anonymous memory of this process, seen by the emulated core at the same virtual addresses."""
        m = mmap.mmap(-1, size)
        at = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self._maps.append(m)
        for va in range(at, at + size, PAGE):   # guest-physical pages are global to bochscpu: never reused
            page = _NEXT_PAGE[0]
            self.bochs.memory.page_insert(page, va)
            self._table.insert(va, page, 1)   # 1: present, writable
            _NEXT_PAGE[0] += PAGE
        return m, at

    def _symbols(self) -> dict[str, int]:
        out = subprocess.run(["nm", "-D", "--defined-only", str(self.library)], capture_output=True, text=True,
                             check=True, timeout=60).stdout
        return {name: self.base + int(addr, 16) for addr, _, name in (line.split() for line in out.splitlines())}

    @staticmethod
    def _missing(gpa: int):
        raise EmulationError(f"the emulated core read guest-physical {gpa:#x}, which nothing maps")

    # ---- buffers

    def reset(self):
        """Frees every buffer (the arena is reused by the next call)."""
        self._used = 0

    def alloc(self, nbytes: int) -> int:
        at = (self._used + 63) // 64 * 64
        if at + nbytes > ARENA_BYTES - STACK_BYTES:
            raise EmulationError(f"buffers need more than the arena's {ARENA_BYTES >> 20} MiB")
        self._used = at + nbytes
        self._arena[at:at + nbytes] = bytes(nbytes)
        return self._arena_at + at

    def put(self, t: torch.Tensor) -> int:
        """A copy of t (made contiguous) in the arena: its address."""
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        at = self.alloc(nbytes)
        ctypes.memmove(at, t.data_ptr(), nbytes)
        return at

    def take(self, at: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor copied out of the arena at `at`."""
        out = torch.empty(shape, dtype=dtype)
        ctypes.memmove(out.data_ptr(), at, out.numel() * out.element_size())
        return out

    # ---- calls

    def _where(self, rip: int) -> str:
        below = [(a, n) for n, a in self.symbols.items() if a <= rip]
        if not below or not self.base <= rip < self.base + len(self._code):
            return f"{rip:#x}, outside the library (a call out of it lands there: nothing is linked dynamically)"
        a, n = max(below)
        return f"{n}+{rip - a:#x}"

    def call(self, name: str, *args: int) -> None:
        if name not in self.symbols:
            raise EmulationError(f"{self.library.name} defines no {name}")
        stack_top = self._arena_at + ARENA_BYTES - 64
        stacked = args[6:]
        rsp = (stack_top - 8 * len(stacked)) // 16 * 16 - 8   # at entry rsp + 8 is 16-byte aligned (System V)
        frame = struct.pack("<Q", RETURN_TO) + b"".join(struct.pack("<q", a) for a in stacked)
        self._arena[rsp - self._arena_at:rsp - self._arena_at + len(frame)] = frame
        s = self.bochs.State()
        s.cr0 = 0x8005_0033            # PG, AM, WP, NE, ET, MP, PE
        s.cr4 = 0x0004_0620            # OSXSAVE, OSXMMEXCPT, OSFXSR, PAE
        s.efer = 0xD01                 # NXE, LMA, LME, SCE
        s.xcr0 = 0xE7                  # x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
        s.cr3 = self._cr3
        s.mxcsr = 0x1F80
        s.rflags = 0x2
        s.rsp, s.rip = rsp, self.symbols[name]
        for reg, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(s, reg, value & (2**64 - 1))
        code, data = self.bochs.Segment(), self.bochs.Segment()
        code.present, code.selector, code.base, code.limit, code.attr = True, 0x33, 0, 0xFFFF_FFFF, 0x22FB
        data.present, data.selector, data.base, data.limit, data.attr = True, 0x2B, 0, 0xFFFF_FFFF, 0xCF3
        s.cs, s.ds, s.ss, s.es, s.fs, s.gs = code, data, data, data, data, data
        self.session.cpu.state = s
        seen: dict[str, tuple[int, int, int, int]] = {}

        def exception(sess, cpu_id, vector, error_code):
            seen.setdefault("exception", (vector, error_code, sess.cpu.rip, sess.cpu.cr2))
            sess.stop()

        hook = self.bochs.Hook()
        hook.exception = exception
        self._clear_kill(0)
        self._helpers.vke_watch(self._kill, MAX_SECONDS)
        try:
            self.session.run([hook])
        finally:
            self._helpers.vke_unwatch()
            self._clear_kill(0)
        if "exception" not in seen:
            raise EmulationError(f"{name} did not return within {MAX_SECONDS:.0f} s of emulation")
        vector, error_code, rip, address = seen["exception"]
        if vector == 14 and rip == RETURN_TO:
            return
        what = EXCEPTIONS.get(vector, f"exception {vector}")
        if vector == 14:
            what += f" at address {address:#x}"
        raise EmulationError(f"{name}: {what} near {self._where(rip)} (error code {error_code:#x})")

    def features(self) -> set[str]:
        """What the emulated CPU's CPUID says of the features the AVX-512 kernels need (vke_cpuid, the harness)."""
        out = self.alloc(16)
        found = set()
        for leaf, sub, reg, bit, name in CPUID_FEATURES:
            self.call("vke_cpuid", leaf, sub, out)
            if int.from_bytes(self._arena[out - self._arena_at + 4 * reg:][:4], "little") >> bit & 1:
                found.add(name)
        return found
