"""llama.cpp's decode from a GGUF just written against the same GGUF read from disk (variants/page_cache.py).

llama.cpp memory-maps its GGUF and reads the weights from the page cache. On Linux 6.x with a large-folio
filesystem, a file read from disk is cached in large folios that the mapping maps with 2 MiB entries (smaps
`FilePmdMapped`); a file just written stays in 4 KiB pages. The bench builds each GGUF just before measuring
it, so `build_gguf_artifact` now reads it back as from disk (`as_read_from_disk`); this script shows what that
is worth. For each pair it copies GGUF twice (a fresh write each time), settles one copy with
`as_read_from_disk`, loads each in a fresh worker (llama.cpp through our backend, as decode_vs_llamacpp.py
runs it), and measures TPOT; the two arms alternate which goes first.

    python benchmarks/gguf_page_cache.py GGUF --model CHECKPOINT_DIR [--pairs 6] [--threads 2]

GGUF: a GGUF of CHECKPOINT_DIR (its tokenizer gives the prompt ids), e.g. decode_vs_llamacpp.py --workdir's.
Prints each arm's median TPOT, the median of per-pair ratios read/written with their min and max, and how many
MiB of each mapping were mapped with 2 MiB entries. The copies go to a temporary folder beside GGUF (the same
filesystem). Never part of the test suite.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from decode_vs_llamacpp import Worker, _run_llama, prompt_ids  # noqa: E402

from variantlab.measure.metrics import tpot  # noqa: E402
from variantlab.variants.page_cache import as_read_from_disk  # noqa: E402

ARMS = ("written", "read from disk")


def pmd_mapped_mib(pid: int, path: Path) -> int:
    """MiB of the process's mappings of `path` mapped with 2 MiB entries (smaps FilePmdMapped)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 6:
                inside = line.rstrip().endswith(str(path))
            elif inside and head and head[0] == "FilePmdMapped:":
                total += int(head[1])
    return total // 1024


def measure(path: Path, model: Path, ids: list[int], threads: int, n: int = 64) -> tuple[float, int]:
    w = Worker(path.name, _run_llama, str(path), str(model), threads)
    try:
        w.run(ids, n)                                  # warm-up
        t = statistics.median(tpot([w.run(ids, n)])[0] for _ in range(4))
        return t, pmd_mapped_mib(w.proc.pid, path)
    finally:
        w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--model", type=Path, required=True, help="the checkpoint the GGUF was made from")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not args.gguf.is_file():
        ap.error(f"GGUF {args.gguf}: no such file (a GGUF of --model, e.g. one decode_vs_llamacpp.py --workdir kept)")
    if not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: no config.json (the checkpoint folder the GGUF was made from)")
    args.gguf = args.gguf.resolve()
    ids = prompt_ids(args.model, 64, 0)
    tpots: dict[str, list[float]] = {a: [] for a in ARMS}
    pmd: dict[str, list[int]] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory(prefix="gguf-page-cache-", dir=args.gguf.parent) as tmp:
        for i in range(args.pairs):
            for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
                copy = Path(tmp) / f"{arm.replace(' ', '-')}.gguf"
                shutil.copyfile(args.gguf, copy)      # a fresh write: in 4 KiB pages, as a build leaves it
                if arm == "read from disk":
                    as_read_from_disk(copy)
                t, mib = measure(copy, args.model, ids, args.threads)
                tpots[arm].append(t)
                pmd[arm].append(mib)
            print(f"  pair {i + 1}/{args.pairs} done", file=sys.stderr, flush=True)
    ratios = [r / w for r, w in zip(tpots["read from disk"], tpots["written"])]
    print(f"{args.gguf.name}: {args.pairs} interleaved pairs of fresh llama.cpp workers, {args.threads} threads, "
          f"64 prompt + 64 new tokens")
    for arm in ARMS:
        print(f"  {arm:15} TPOT median {1e3 * statistics.median(tpots[arm]):.2f} ms; mapped with 2 MiB entries: "
              f"{', '.join(map(str, pmd[arm]))} MiB")
    print(f"  read from disk / written, per pair: median {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}, {max(ratios):.3f}] (below 1: the read-back GGUF decodes faster)")


if __name__ == "__main__":
    main()
