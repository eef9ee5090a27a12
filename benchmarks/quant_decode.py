"""Whole-model single-stream decode speed of each recipe on a 100M+ parameter Llama (random weights).

The model is built from a config (no checkpoint needed): hidden 768, 16 layers, 12 heads,
intermediate 2048, vocabulary 1024 (the shipped tokenizer's) — 113M parameters. For each recipe
a fresh copy is built with the same seed, converted, and decoded greedily through the engine's
KV-cached loop (backends/torch_engine.py, one request at a time, as single-stream runs it), with no
stop rules (EOS off, no stop strings), --tokens tokens per prompt. Prints tokens/s (1 / median TPOT),
the ratio to fp32, and the bytes of weights each token reads (GB/s achieved beside tokens/s).

    python benchmarks/quant_decode.py [--tokens 32] [--prompts 3] [--recipes fp32,bf16,int8,int4,w8a8,w4a8]

Goal (issue 3): int4 at least 2.5x fp32 on this CPU.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from variantlab.backends.base import GenerationRequest, run_requests
from variantlab.backends.torch_engine import TorchEngine
from variantlab.data.structured import generate_samples
from variantlab.measure.metrics import tpot
from variantlab.models.loading import BUILTIN_MODELS
from variantlab.variants.decode_kernels import with_decode_kernels
from variantlab.variants.registry import get_recipe, parse_options

CONFIG = dict(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=12,
              intermediate_size=2048, vocab_size=1024, max_position_embeddings=1024,
              bos_token_id=0, eos_token_id=1, pad_token_id=2)


def build(recipe_name: str, options: dict):
    recipe = get_recipe(recipe_name)
    opts = parse_options(recipe, options)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(recipe.load_dtype(opts)).eval()
    t0 = time.perf_counter()
    facts = with_decode_kernels(model, recipe.apply(model, opts, "cpu"))   # as variants.build does
    return model, facts, time.perf_counter() - t0


def request(request_id: str, prompt: str, tokens: int) -> GenerationRequest:
    """Exactly `tokens` tokens: no stop rules (random weights may emit EOS or a newline)."""
    return GenerationRequest(request_id, prompt=prompt, max_new_tokens=tokens, stop_on_eos=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--recipes", default="fp32,bf16,int8,int4,w8a8,w4a8")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(BUILTIN_MODELS["tiny-structured"])
    prompts = generate_samples(args.prompts, 0)
    rows = []
    for name in args.recipes.split(","):
        model, facts, build_s = build(name, {})
        engine = TorchEngine(model, tok, "cpu", "bench")
        run_requests(engine, [request("warm", prompts[0]["prompt"], 4)])
        records = [rec for i, s in enumerate(prompts)
                   for rec in run_requests(engine, [request(str(i), s["prompt"], args.tokens)])]
        per_token = statistics.median(tpot(records))
        rows.append((name, facts, per_token, build_s, facts.kernels))
        del model, engine
        gc.collect()
    params = rows[0][1].parameters
    print(f"Llama {params / 1e6:.0f}M parameters, {torch.get_num_threads()} threads, "
          f"{args.prompts} prompts x {args.tokens} tokens, single-stream greedy decode")
    base = next((r[2] for r in rows if r[0] == "fp32"), rows[0][2])
    print(f"{'recipe':8} {'bits/w':>6} {'tok/s':>8} {'x fp32':>7} {'GB/s':>6} {'build s':>7}  kernels")
    for name, facts, per_token, build_s, kernels in rows:
        gbs = facts.extra.get("resident_bytes", facts.weight_bytes) / per_token / 1e9   # what the kernel reads
        print(f"{name:8} {facts.bits_per_weight:6.2f} {1 / per_token:8.2f} {base / per_token:7.2f} {gbs:6.1f} "
              f"{build_s:7.1f}  {', '.join(kernels)}")


if __name__ == "__main__":
    main()
