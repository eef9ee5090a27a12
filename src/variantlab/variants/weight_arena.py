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

An artifact is read straight into an arena (artifact.read_safetensors), so a loaded model's weights are
already there. `settle` moves the rest (a model just built, weights a module repacked at load) one storage at
a time, drops the old one at once and hands the freed memory back to the kernel every 32 MiB, so the
resident set peaks at the weights plus the largest tensor and 32 MiB, not twice the weights. Tensors that
share a storage (tied embeddings, views) keep sharing it; every holder of a tensor sees the move
(`tensor.data` is swapped in place). Then the pages of the arenas the model was in that no live tensor reads
go back to the kernel.
"""
from __future__ import annotations

import ctypes
import itertools
import mmap
import weakref
from dataclasses import dataclass
from pathlib import Path

HUGE_PAGE = 2 << 20     # bytes: x86-64's transparent huge page
SLOT = 64               # bytes: each storage starts on a cache line (AVX-512's widest aligned load)
TRIM_EVERY = 32 << 20   # bytes freed between two returns of the C heap's free memory to the kernel
PAGE = 4096
_LIVE: list[tuple] = []  # (mapping's address, first usable byte, end of the bytes asked for, weakref to the mmap)
#                           of each arena made here
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class Settled:
    """Where `settle` left the weights: their bytes, all in arenas, how many of them the kernel holds in 2 MiB
    pages (None where it cannot be read), and the machine's THP setting."""
    weight_bytes: int
    huge_bytes: int | None
    thp: str

    @property
    def summary(self) -> str:
        mib = self.weight_bytes / 2**20
        if self.huge_bytes is None:
            return f"weights in one anonymous mapping ({mib:.0f} MiB; its huge pages unreadable here)"
        return (f"weights in one anonymous mapping: {self.huge_bytes / 2**20:.0f} of {mib:.0f} MiB in 2 MiB "
                f"pages (transparent huge pages: {self.thp})")


def settle(model) -> Settled | None:
    """Every CPU parameter and buffer of `model` in an arena: those already in one (an artifact read by
    `read_safetensors`) stay, the rest move into one new arena; None when nothing of it is on the CPU. The
    parts of the arenas it was in that no live tensor uses any more (weights a module repacked at load) go
    back to the kernel."""
    import torch

    storages: dict[int, list] = {}
    for t in (*model.parameters(), *model.buffers()):
        if t is not None and t.device.type == "cpu" and t.numel():
            storages.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    if not storages:
        return None
    held = {ptr for ptr in storages if _arena_at(ptr) is not None}
    moving = {ptr: ts for ptr, ts in storages.items() if ptr not in held}
    if moving:
        _move(moving)
    tensors = [t for ts in storages.values() for t in ts]
    spans = _union(map(_span, tensors))
    for found in {_arena_at(ptr) for ptr in held}:
        if _gaps(spans, found[1], found[2]):
            _release_unused(found)
    size = sum(hi - lo for lo, hi in spans)
    arenas = [(lo, hi - lo) for lo, hi in {_arena_at(t.data_ptr())[1:3] for t in tensors}]
    huge = smaps_totals(arenas, "AnonHugePages")       # one read of smaps for every arena
    return Settled(size, None if huge is None else min(size, sum(map(min, huge, (n for _, n in arenas)))),
                   thp_setting())


def arena(nbytes: int):
    """(a uint8 tensor over a new arena, the offset of its first 2 MiB boundary): nbytes usable from there. The
    mapping lives as long as any tensor made from that one does."""
    import torch

    total = rounded(nbytes, HUGE_PAGE)
    mapping = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = _address(mapping)
    start = (-base) % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE, start, total)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)   # its storage keeps the mapping alive
    _LIVE[:] = [a for a in _LIVE if a[3]() is not None] + [(base, base + start, base + start + nbytes,
                                                            weakref.ref(mapping))]
    return whole, start


def _move(storages: dict[int, list]) -> None:
    """Copy each storage into one new arena and point its tensors there, one at a time (see the module)."""
    import torch

    sizes = {ptr: rounded(ts[0].untyped_storage().nbytes()) for ptr, ts in storages.items()}
    whole, at = arena(sum(sizes.values()))
    storage = whole.untyped_storage()
    freed = 0
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


def _release_unused(found) -> None:
    """Hand back the whole pages of an arena that no live tensor reads (found by the garbage collector's list
    of objects: every tensor, not just the model's, so nothing still used is ever dropped)."""
    import gc

    import torch

    base, lo, hi, ref = found
    mapping = ref()
    if mapping is None:
        return
    objects = gc.get_objects()
    kinds = _subclasses(torch.Tensor)
    tensors = itertools.compress(objects, map(kinds.__contains__, map(type, objects)))   # C loops: 390k objects
    used = _union(_span(t) for t in tensors if lo <= _data_ptr(t) < hi)
    for first, last in _gaps(used, lo, hi):
        mapping.madvise(mmap.MADV_DONTNEED, first - base, last - first)


def _subclasses(kind: type) -> set[type]:
    """`kind` and every class derived from it so far (tensors of any subclass: Parameter, a compile's fake ones)."""
    out = {kind}
    for sub in kind.__subclasses__():
        out |= _subclasses(sub)
    return out


def _gaps(used: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The whole pages of [lo, hi) that none of the `used` spans (sorted, disjoint: `_union`) touches."""
    out, edge = [], lo
    for a, b in [*((max(a, lo), min(b, hi)) for a, b in used if a < hi and b > lo), (hi, hi)]:
        first, last = rounded(edge, PAGE), (a // PAGE) * PAGE
        if last > first:
            out.append((first, last))
        edge = max(edge, b)
    return out


def _data_ptr(t) -> int:
    """A CPU tensor's address; -1 for any other (a compile's fake tensors have none)."""
    try:
        return t.data_ptr() if t.device.type == "cpu" else -1
    except RuntimeError:
        return -1


def _arena_at(address: int):
    """The live arena whose mapping holds `address` (from the mapping's own start: a storage made over the
    whole mapping starts there, before the first 2 MiB boundary), or None."""
    return next((a for a in _LIVE if a[0] <= address < a[2] and a[3]() is not None), None)


def _span(t) -> tuple[int, int]:
    """The bytes a tensor can read: from its first element to its last."""
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _union(spans) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def huge_bytes(address: int, length: int) -> int | None:
    """Bytes of [address, address + length) that this process holds in transparent huge pages; None where
    /proc/self/smaps cannot be read."""
    found = smaps_bytes(address, length, "AnonHugePages")
    return None if found is None else min(found, length)


def smaps_bytes(address: int, length: int, field: str) -> int | None:
    """One field (Rss, AnonHugePages, ...) of /proc/self/smaps summed over the mappings that overlap
    [address, address + length), in bytes; None where smaps cannot be read."""
    found = smaps_totals([(address, length)], field)
    return None if found is None else found[0]


def smaps_totals(spans: list[tuple[int, int]], field: str) -> list[int] | None:
    """`smaps_bytes` of each (address, length) span, from one read of /proc/self/smaps (25 ms here, with torch's
    libraries mapped); None where it cannot be read."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    found, inside, key = [0] * len(spans), [], f"{field}:"
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = [i for i, (a, n) in enumerate(spans) if lo < a + n and a < hi]
        elif inside and head == key:
            for i in inside:
                found[i] += int(line.split()[1]) * 1024
    return found


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


def rounded(n: int, to: int = SLOT) -> int:
    """n rounded up to a multiple of `to` (an arena's slot, by default)."""
    return -(-n // to) * to
