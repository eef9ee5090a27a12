"""A CPU variant's cold start, by how its weights are loaded: fresh processes, interleaved A B C, C B A, ...

  mapped   as load_artifact did before the arena: model.safetensors memory-mapped (safetensors' safe_open),
           the engine leaving the weights where they lie (4 KiB page-cache pages, read by the first token)
  arena-1  read into one arena of 2 MiB pages (variants/weight_arena.py) by one thread
  arena    as the bench runs it now: the same, read by as many threads as decode uses

Each process runs the stages of the bench's torch worker (measure/backend_kinds/torch_kind.py) on the
artifact: import (everything loading needs) → tokenizer → load → engine and first token (a 64-token prompt,
one new token), each on the clock the process's start is read on. Printed: each stage's median per way, the
total's ratio to `mapped`, and the largest total per way. The page cache holds the file throughout (a warm
cache: the file is read once first), as in a bench whose build just wrote it.

    python benchmarks/cold_start.py ARTIFACT_DIR [--pairs 8] [--threads 2]

ARTIFACT_DIR: a variant built with `variantlab build` (or a bench's runs/*/variants/NAME/artifact).
Never part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

WAYS = ("mapped", "arena-1", "arena")
STAGES = ("import", "tokenizer", "load", "first_token", "total")

CHILD = r"""
import json, sys
from variantlab.measure.process import process_clock, process_start_time
t_start = process_start_time()
way, artifact, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
from variantlab.measure.backend_kinds.torch_kind import import_stage
import_stage(artifact)
import torch
from transformers import AutoTokenizer
from variantlab.backends import torch_engine
from variantlab.backends.base import GenerationRequest, run_requests
from variantlab.variants import artifact as art, build as variants
torch.set_num_threads(threads)
if way == "mapped":
    from safetensors import safe_open
    def mapped(path, threads=None):
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    art.read_safetensors = mapped
    torch_engine.settle = lambda model: None
elif way == "arena-1":
    real = art.read_safetensors
    art.read_safetensors = lambda path, threads=None: real(path, threads=1)
t_imported = process_clock()
tok = AutoTokenizer.from_pretrained(artifact, local_files_only=True)
t_tokenizer = process_clock()
built = variants.load(artifact, "cpu", tokenizer=tok)
t_loaded = process_clock()
engine = torch_engine.TorchEngine(built.model, built.tokenizer, "cpu", "cold-start")
with torch.inference_mode():
    run_requests(engine, [GenerationRequest("c", prompt_ids=tuple(range(1, 65)), max_new_tokens=1)])
t_first = process_clock()
print(json.dumps({"import": t_imported - t_start, "tokenizer": t_tokenizer - t_imported,
                  "load": t_loaded - t_tokenizer, "first_token": t_first - t_loaded, "total": t_first - t_start,
                  "weights": engine.settled.summary if engine.settled else "left where load put them"}))
"""


def one(way: str, artifact: Path, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, way, str(artifact), str(threads)], capture_output=True,
                         text=True, timeout=300)
    if out.returncode:
        sys.exit(f"{way}: the process failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    (args.artifact / "model.safetensors").read_bytes()      # the page cache holds it, for every way alike
    got: dict[str, list[dict]] = {w: [] for w in WAYS}
    for r in range(args.pairs):
        for w in (WAYS if r % 2 == 0 else WAYS[::-1]):
            got[w].append(one(w, args.artifact, args.threads))
    size = (args.artifact / "model.safetensors").stat().st_size
    print(f"{args.artifact} | {size / 2**20:.0f} MiB of weights | {args.threads} threads | {args.pairs} rounds, "
          "order alternating | medians in s")
    print(f"{'way':8} " + " ".join(f"{s:>11}" for s in STAGES) + "   ÷ mapped   largest total")
    base = statistics.median(g["total"] for g in got["mapped"])
    for w in WAYS:
        med = {s: statistics.median(g[s] for g in got[w]) for s in STAGES}
        print(f"{w:8} " + " ".join(f"{med[s]:11.3f}" for s in STAGES)
              + f"   {med['total'] / base:8.3f}   {max(g['total'] for g in got[w]):.3f}")
    for w in WAYS:
        print(f"{w}: {got[w][-1]['weights']}")


if __name__ == "__main__":
    main()
