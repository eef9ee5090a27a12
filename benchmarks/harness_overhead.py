"""Harness overhead: per-token time through the single-stream scenario vs a bare decode loop.

Both run in this process on the same model and prompts, interleaved round by round (ABBA order)
so that machine noise and warm caches favour neither. Stop tokens are switched off in the backend so that both loops
generate exactly --tokens tokens per prompt (the harness code path is unchanged: the stop check
runs against an empty set). The bare loop is the same KV-cached greedy loop with nothing else:
no records, no clock per token.

Per-token time = (last token time - first token time) / (tokens - 1), i.e. TPOT.

    python benchmarks/harness_overhead.py [--model DIR] [--rounds 15] [--tokens 64]

Goal (issue 2): ratio at most 1.01.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from variantlab.backends.torch_backend import TorchBackend
from variantlab.measure.metrics import tpot
from variantlab.measure.scenarios import SingleStream
from variantlab.data.structured import generate_samples
from variantlab.models.loading import load_causal_lm, resolve_model_path


@torch.inference_mode()
def bare_per_token(model, tokenizer, prompt: str, n_tokens: int) -> float:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    cache = DynamicCache()
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    nxt.item()
    t0 = time.perf_counter()
    for _ in range(n_tokens - 1):
        logits = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        nxt.item()
    return (time.perf_counter() - t0) / (n_tokens - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-structured")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    model, tok = load_causal_lm(Path(path), torch.float32, "cpu")
    backend = TorchBackend(model, tok, "cpu", "bench")
    backend.stop_ids = frozenset()
    samples = generate_samples(args.prompts, 0)
    scenario = SingleStream(requests=len(samples), warmup=0)
    for s in samples:  # warm-up both paths
        bare_per_token(model, tok, s["prompt"], 8)
        backend.generate("w", s["prompt"], 8)
    harness, bare = [], []
    for r in range(args.rounds):  # ABBA order: neither loop always runs first (caches, frequency)
        for which in (("harness", "bare") if r % 2 == 0 else ("bare", "harness")):
            if which == "harness":
                (p,) = scenario.run(backend, samples, args.tokens)
                harness += tpot(p.records)
            else:
                bare += [bare_per_token(model, tok, s["prompt"], args.tokens) for s in samples]
    h, b = statistics.median(harness), statistics.median(bare)
    print(f"model {path} | threads {torch.get_num_threads()} | {args.rounds} rounds x {len(samples)} prompts "
          f"x {args.tokens} tokens")
    print(f"per-token time, single-stream scenario (median TPOT): {h * 1e3:.4f} ms")
    print(f"per-token time, bare decode loop (median):           {b * 1e3:.4f} ms")
    print(f"ratio harness / bare: {h / b:.4f}  (mean-based: {statistics.mean(harness) / statistics.mean(bare):.4f};"
          f" goal <= 1.01)")


if __name__ == "__main__":
    main()
