"""variants/page_cache.py: a file dropped from the page cache and read through once, left whole and resident."""
from __future__ import annotations

import ctypes
import mmap
import os
import sys

import pytest

from variantlab.variants import page_cache

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and posix_fadvise: Linux")


def resident_pages(path) -> tuple[int, int]:
    """(pages of `path` in the page cache, pages in all), by mincore over a private mapping of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        start = ctypes.c_char.from_buffer(m)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec)
        del start                                   # the mapping closes only once nothing points into it
    finally:
        m.close()
    if rc != 0:
        pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
    return sum(v & 1 for v in vec), pages


def dropped(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@linux
def test_the_file_is_read_through_and_left_resident_and_unchanged(tmp_path):
    path = tmp_path / "model.gguf"
    data = os.urandom(3 * page_cache.CHUNK // 2 + 12345)       # more than one read, and a partial last page
    path.write_bytes(data)
    dropped(path)
    before, pages = resident_pages(path)
    if before == pages:
        pytest.skip("this filesystem keeps a file's pages after POSIX_FADV_DONTNEED (tmpfs): nothing to show")
    assert page_cache.as_read_from_disk(path) is True
    assert resident_pages(path) == (pages, pages)
    assert path.read_bytes() == data


def test_without_posix_fadvise_it_leaves_the_cache_alone(tmp_path, monkeypatch):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" * 10)
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    assert page_cache.as_read_from_disk(path) is False
    assert path.read_bytes() == b"GGUF" * 10


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="reads nothing without posix_fadvise")
def test_the_bytes_read_feed_a_digest_so_a_caller_hashes_the_file_in_the_same_pass(tmp_path):
    import hashlib
    path = tmp_path / "model.gguf"
    data = os.urandom(2 * page_cache.CHUNK + 777)               # two whole reads and a short last one
    path.write_bytes(data)
    digest = hashlib.sha256()
    assert page_cache.as_read_from_disk(path, digest) is True
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()


def test_settle_files_reads_every_file_of_the_folders_once(tmp_path):
    """Before a run's rounds every variant's files are read from disk once (measure/runner.py), a file two
    variants share counted once."""
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "sub").mkdir(parents=True)
    b.mkdir()
    (a / "model.safetensors").write_bytes(b"x" * 5000)
    (a / "sub" / "tokenizer.json").write_bytes(b"{}")
    (b / "model.gguf").write_bytes(b"y" * 100)
    files, size = page_cache.settle_files([a, b, b / "model.gguf", tmp_path / "missing"])
    assert (files, size) == (3, 5102)
    assert (a / "model.safetensors").read_bytes() == b"x" * 5000     # unchanged


def test_settle_files_does_nothing_without_posix_fadvise(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"z")
    monkeypatch.delattr(os, "posix_fadvise")
    assert page_cache.settle_files([tmp_path]) == (0, 0)
