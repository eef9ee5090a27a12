"""The engine's decode, arm against arm, per recipe: single-stream tok/s and offline (batched) throughput.

Arms (each the same variant of the same random-weight Llama, in this one process):

    before     transformers' growing DynamicCache and aten's kernels (the engine as issue 9 found it,
               less its full-vocabulary logits)
    aten       the preallocated static cache, aten's kernels
    eager      the static cache and our decode kernels (variants/kernels: GEMV, int8/int4 matmuls and
               decode attention) under transformers' own modules: a variant's `compile: false`
    ours       the same kernels with every decoder layer in one C++ call (variants/decode_step.py): the
               engine as it ships, what a variant gets by default
    compiled   `eager` with the decode step compiled (torch.compile, inductor, static shapes): what
               `compile: true` runs (--compile to include it; its compile time is printed)

The model is benchmarks/decode_vs_llamacpp.py's (hidden 768, 16 layers, 12 heads, intermediate 2048,
the shipped 1k-token tokenizer: 115M parameters). The `aten` and `before` arms switch our kernels off
around their calls only (variants.kernels reports them unavailable; their variant was built so, with
plain nn.Linear layers and W4A8's group-major layout). Rounds interleave the arms, the order rotated
each round, so drift lands on every arm alike. Single-stream: one request of --prompt-tokens token ids
and --new-tokens new tokens; the figure is 1 / median TPOT over rounds (decode only). Offline: a batch
of --batch requests of the same lengths, all at once; the figure is generated tokens / wall time
(prefill included), median over rounds. Ratios are arm / `before`, per round, median [min, max].
The last column places each arm's single-stream decode on its roofline (explain/roofline.py): the bytes and
FLOPs a token must move and do at the mean context, against the read bandwidth and the matmul rate
(fp32, or bf16 for every other recipe) measured at the start; the verdict and the share of that
floor the arm reached.

    python benchmarks/engine_decode.py [--recipes fp32,bf16,int8,int4,w8a8,w4a8] [--rounds 5]
        [--batch 8] [--threads 2] [--compile]

Nothing here is asserted; the load average is printed: on a shared machine, re-run before quoting.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from variantlab.backends.base import GenerationRequest, run_requests
from variantlab.backends.torch_engine import TorchEngine
from variantlab.explain.roofline import decode_cost, model_shape, roofline
from variantlab.hardware import matmul_rate, read_bandwidth
from variantlab.measure.metrics import tpot
from variantlab.models.loading import BUILTIN_MODELS
from variantlab.variants import kernels as vk
from variantlab.variants.build import VariantDefinition, build
from variantlab.variants.recipe import decode_weight_bytes

CONFIG = dict(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=12,
              intermediate_size=2048, vocab_size=1024, max_position_embeddings=1024,
              bos_token_id=0, eos_token_id=1, pad_token_id=2)
OPTIONS = {"int4": {"group_size": 32}, "w4a8": {"group_size": 32}}


def make_checkpoint(folder: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(BUILTIN_MODELS["tiny-structured"]).save_pretrained(folder)
    return folder


class Arm:
    def __init__(self, name: str, engine: TorchEngine, kernels_off: bool):
        self.name, self.engine, self.kernels_off = name, engine, kernels_off
        self.single: list[float] = []     # tok/s per round
        self.offline: list[float] = []

    def context(self):
        return vk.switched_off("by the benchmark") if self.kernels_off else contextlib.nullcontext()

    def run(self, ids: list[int], n: int, batch: int) -> None:
        with self.context(), torch.inference_mode():
            one = run_requests(self.engine, [GenerationRequest("s", prompt_ids=tuple(ids), max_new_tokens=n,
                                                               stop_on_eos=False)])
            self.single.append(1 / statistics.median(tpot(one)))
            reqs = [GenerationRequest(f"b{i}", prompt_ids=tuple(ids), max_new_tokens=n, stop_on_eos=False)
                    for i in range(batch)]
            t0 = time.perf_counter()
            done = run_requests(self.engine, reqs)
            self.offline.append(sum(len(r.token_ids) for r in done) / (time.perf_counter() - t0))


def arms_for(recipe: str, model_dir: Path, with_compile: bool) -> list[Arm]:
    definition = VariantDefinition(recipe, recipe, OPTIONS.get(recipe, {}))
    with vk.switched_off("by the benchmark"):
        plain = build(model_dir, definition, "cpu")
    arms = [Arm("before", TorchEngine(plain.model, plain.tokenizer, "cpu", static_cache=False, decode_step=False),
                True),
            Arm("aten", TorchEngine(plain.model, plain.tokenizer, "cpu", decode_step=False), True)]
    ours = build(model_dir, definition, "cpu")
    arms.append(Arm("eager", TorchEngine(ours.model, ours.tokenizer, "cpu", decode_step=False), False))
    arms.append(Arm("ours", TorchEngine(ours.model, ours.tokenizer, "cpu"), False))
    if with_compile:
        arms.append(Arm("compiled", TorchEngine(ours.model, ours.tokenizer, "cpu", compile_step=True), False))
    return arms


def ratio(arm: Arm, base: Arm, attr: str) -> str:
    r = [a / b for a, b in zip(getattr(arm, attr), getattr(base, attr))]
    return f"{statistics.median(r):5.2f} [{min(r):.2f}, {max(r):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default="fp32,bf16,int8,int4,w8a8,w4a8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="add the compiled decode step as an arm")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    st = vk.status()
    print(f"our kernels: {st.reason}; torch {torch.__version__}, {args.threads} threads; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    read_gbps, peaks = read_bandwidth(), {d: matmul_rate(d) for d in ("fp32", "bf16")}
    print(f"ceilings: read {read_gbps:.1f} GB/s; matmul fp32 {peaks['fp32'] or 0:.2f}, "
          f"bf16 {peaks['bf16'] or 0:.2f} TFLOP/s")
    ids = [0] + [3 + (7 * i) % 1000 for i in range(args.prompt_tokens - 1)]
    with tempfile.TemporaryDirectory(prefix="engine-decode-") as tmp:
        model_dir = make_checkpoint(Path(tmp) / "llama")
        print(f"Llama 115M (random weights), prompt {args.prompt_tokens} tokens, {args.new_tokens} new; "
              f"offline batch {args.batch}; {args.rounds} rounds, arms interleaved and rotated")
        print(f"{'recipe':7} {'arm':9} {'1-stream tok/s':>14} {'x before':>18} {'offline tok/s':>14} {'x before':>18}"
              f"  single-stream roofline")
        for recipe in args.recipes.split(","):
            arms = arms_for(recipe, model_dir, args.compile)
            for arm in arms:                              # warm-up (and, for `compiled`, compilation)
                t0 = time.perf_counter()
                with arm.context(), torch.inference_mode():
                    run_requests(arm.engine, [GenerationRequest("w", prompt_ids=tuple(ids), max_new_tokens=4,
                                                                stop_on_eos=False)])
                    run_requests(arm.engine, [GenerationRequest(f"w{i}", prompt_ids=tuple(ids), max_new_tokens=4,
                                                                stop_on_eos=False) for i in range(args.batch)])
                if arm.name == "compiled":
                    print(f"  (compiling the decode step took {time.perf_counter() - t0:.0f} s)")
            for r in range(args.rounds):
                for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                    arm.run(ids, args.new_tokens, args.batch)
            base = arms[0]
            context = args.prompt_tokens + args.new_tokens / 2
            for arm in arms:
                tok_s = statistics.median(arm.single)
                shape = model_shape(arm.engine.model, decode_weight_bytes(arm.engine.model))
                place = roofline(decode_cost(shape, context), 1 / tok_s, read_gbps,
                                 peaks["fp32" if recipe == "fp32" else "bf16"])
                print(f"{recipe:7} {arm.name:9} {tok_s:14.1f} {ratio(arm, base, 'single'):>18} "
                      f"{statistics.median(arm.offline):14.1f} {ratio(arm, base, 'offline'):>18}  {place.line()}",
                      flush=True)
            del arms
            gc.collect()
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
