"""A file held in the page cache as a file read from disk is: what a GGUF we just wrote needs before llama.cpp
maps it.

llama.cpp memory-maps its GGUF and reads the weights straight from the page cache, so how the kernel holds
that file's pages is part of its decode speed. On Linux 6.x with large-folio filesystems (ext4 here), a file
*read* from disk comes into the cache in large folios, which a mapping can then map with 2 MiB entries (smaps
`FilePmdMapped`); a file just *written* stays in the 4 KiB pages it was written in until the kernel drops them.
Measured here (2026-12-06, the 2-core EPYC, Linux 6.18, 115M F32 GGUF, fresh llama.cpp workers, interleaved):
the GGUF as our build had just written it mapped 0 MiB of its 438 with 2 MiB entries; a copy of it, dropped
from the cache and read once, 392-396 MiB; TPOT 15.5 against 14.8 ms. So a GGUF built in the bench was
measured slower than the same file would be after a reboot or on a user's server: a weakened peer.

`as_read_from_disk` writes the file back, drops its pages and reads it through once, so that the cache holds it
as a read from disk leaves it and the first measurement does not pay a disk read. `settle_files` does so for
every file of every variant before a run's rounds (measure/runner.py): the torch artifacts too, which are read
(not mapped) into the weight arena, so that no variant's load stage reads a file just written, or half
evicted, where another's reads one the cache holds whole (issue 50). Elsewhere than Linux it does
nothing (posix_fadvise missing): there the cache's layout is left as it is.
"""
from __future__ import annotations

import os
from pathlib import Path

CHUNK = 8 << 20     # bytes a read asks for: a multiple of any readahead window


def as_read_from_disk(path: str | Path, digest=None) -> bool:
    """Drop `path` from the page cache and read it through once; whether it could (False where the platform has
    no posix_fadvise, and nothing was read). digest: a hashlib object that the bytes read are fed to, so that a
    caller who needs the file's hash does not read it a second time."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)                                         # dirty pages are not dropped: write them first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := os.readv(fd, [buf]):
            if digest is not None:
                digest.update(view[:n])
    finally:
        os.close(fd)
    return True


def settle_files(paths) -> tuple[int, int]:
    """as_read_from_disk for every regular file under `paths` (files, or folders walked), each file once:
    (files settled, their bytes); (0, 0) where the platform cannot (no posix_fadvise)."""
    seen: set[Path] = set()
    files = size = 0
    for p in map(Path, paths):
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            f = f.resolve()
            if f in seen or not f.is_file():
                continue
            seen.add(f)
            if not as_read_from_disk(f):
                return 0, 0
            files, size = files + 1, size + f.stat().st_size
    return files, size
