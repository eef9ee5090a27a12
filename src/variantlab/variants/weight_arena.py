"""Where a CPU model's weights live while it decodes: one private mapping of 2 MiB pages (the "arena").

Decoding reads every weight once a token, a stream of hundreds of MB. In 4 KiB pages that stream crosses a
page every 4 KiB: a TLB miss and a page walk each time, and the hardware prefetchers stop at every page
boundary. Measured on a 2-core AMD EPYC (115M-parameter Llama, fp32, our decode step, 2 threads, the three
placements in one process, interleaved): weights memory-mapped from the artifact's file 13.9 ms a token;
in torch's own allocations 12.6; in one 2 MiB-aligned mapping madvised MADV_HUGEPAGE 10.2 (int4 g32: 2.88,
2.87, 2.54). So the engine settles a model's CPU weights into an arena before its first token, the same way
whether the model was just built or loaded from its artifact, so that every instrument measures the same
placement.

Linux gives a madvised mapping huge pages when transparent huge pages are `always` or `madvise`
(/sys/kernel/mm/transparent_hugepage/enabled); with `never`, or where the kernel has no 2 MiB pages to give,
the arena is plain anonymous memory and the record says how much of it is in huge pages.

`settle` moves one storage at a time, drops the old one at once and hands the freed memory back to the kernel
every 32 MiB, so the resident set peaks at the weights plus the largest tensor and 32 MiB, not twice the
weights. Tensors that share a storage (tied embeddings, views) keep
sharing it; every holder of a tensor sees the move (`tensor.data` is swapped in place).
"""
from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass
from pathlib import Path

HUGE_PAGE = 2 << 20     # bytes: x86-64's transparent huge page
SLOT = 64               # bytes: each storage starts on a cache line (AVX-512's widest aligned load)
TRIM_EVERY = 32 << 20   # bytes freed between two returns of the C heap's free memory to the kernel
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class Settled:
    """What `settle` did: bytes moved into the arena, how many of them the kernel holds in 2 MiB pages
    (None where it cannot be read), and the machine's THP setting."""
    moved_bytes: int
    huge_bytes: int | None
    thp: str

    @property
    def summary(self) -> str:
        mib = self.moved_bytes / 2**20
        if self.huge_bytes is None:
            return f"weights in one anonymous mapping ({mib:.0f} MiB; its huge pages unreadable here)"
        return (f"weights in one anonymous mapping: {self.huge_bytes / 2**20:.0f} of {mib:.0f} MiB in 2 MiB "
                f"pages (transparent huge pages: {self.thp})")


def settle(model) -> Settled | None:
    """Move every CPU parameter and buffer of `model` into one new arena; None when there is nothing on the
    CPU to move."""
    import torch

    storages: dict[int, list] = {}
    for t in (*model.parameters(), *model.buffers()):
        if t is not None and t.device.type == "cpu" and t.numel():
            storages.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    if not storages:
        return None
    sizes = {ptr: _rounded(ts[0].untyped_storage().nbytes()) for ptr, ts in storages.items()}
    total = _rounded(sum(sizes.values()), HUGE_PAGE)
    arena = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = (-_address(arena)) % HUGE_PAGE         # the first 2 MiB boundary inside the mapping
    if hasattr(mmap, "MADV_HUGEPAGE"):
        arena.madvise(mmap.MADV_HUGEPAGE, start, total)
    whole = torch.frombuffer(arena, dtype=torch.uint8)   # its storage keeps the mapping alive
    storage = whole.untyped_storage()
    at, freed = start, 0
    for ptr, ts in storages.items():
        old = ts[0].untyped_storage()
        whole[at:at + old.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(old))
        for t in ts:
            size = t.element_size()
            t.data = torch.empty(0, dtype=t.dtype).set_(storage, at // size + t.storage_offset(), t.shape, t.stride())
        freed += old.nbytes()
        del old                                    # the last reference: the old storage is freed here
        at += sizes[ptr]
        if freed >= TRIM_EVERY:
            freed = _trim()
    _trim()
    return Settled(at - start, huge_bytes(_address(arena) + start, at - start), thp_setting())


def huge_bytes(address: int, length: int) -> int | None:
    """Bytes of [address, address + length) that this process holds in transparent huge pages
    (/proc/self/smaps, AnonHugePages of the mappings that overlap it); None where smaps cannot be read."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    found, inside = 0, False
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < address + length and address < hi
        elif inside and head == "AnonHugePages:":
            found += int(line.split()[1]) * 1024
    return min(found, length)


def thp_setting() -> str:
    """The machine's transparent-huge-page mode (the bracketed word of its sysfs file), or 'unknown'."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()


def _trim() -> int:
    """Hand the C heap's free memory back to the kernel (glibc's malloc_trim; nothing elsewhere): glibc keeps
    freed blocks under its mmap threshold (which rises to 32 MiB) in its heap, where the resident set still
    counts them. Returns 0, the bytes freed since."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc(0)
    return 0


_libc = None


def _address(arena: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(arena))


def _rounded(n: int, to: int = SLOT) -> int:
    return -(-n // to) * to
