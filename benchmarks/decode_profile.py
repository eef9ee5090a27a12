"""Where a decode token's time goes: torch.profiler over one single-stream request of the engine.

The model is engine_decode.py's random-weight 115M Llama. The engine (eager, or --compile) decodes
--new-tokens tokens after a --prompt-tokens prompt, twice as warm-up (and compilation), then once
under torch.profiler (CPU activity). Prints the decode tok/s of an unprofiled run, then the operators
by self CPU time with each one's milliseconds per decode step (prefill included, spread over the
steps: it is one call of each operator per layer) and its calls per step. The operators' sum is
below the step time by what no operator covers (Python between them).

    python benchmarks/decode_profile.py --recipe int4 [--compile] [--rows 14] [--threads 2]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from variantlab.backends.base import GenerationRequest, run_requests
from variantlab.backends.torch_engine import TorchEngine
from variantlab.measure.metrics import tpot
from variantlab.variants.build import VariantDefinition, build

from engine_decode import OPTIONS, make_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="bf16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=14)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ids = tuple([0] + [3 + (7 * i) % 1000 for i in range(args.prompt_tokens - 1)])
    with tempfile.TemporaryDirectory(prefix="decode-profile-") as tmp:
        built = build(make_checkpoint(Path(tmp) / "llama"),
                      VariantDefinition(args.recipe, args.recipe, OPTIONS.get(args.recipe, {})), "cpu")
    engine = TorchEngine(built.model, built.tokenizer, "cpu", compile_step=args.compile)

    def run():
        req = GenerationRequest("p", prompt_ids=ids, max_new_tokens=args.new_tokens, stop_on_eos=False)
        return run_requests(engine, [req])[0]

    with torch.inference_mode():
        run(), run()
        step_s = tpot([run()])[0]
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
    steps = args.new_tokens - 1
    print(f"{args.recipe}{' compiled' if args.compile else ''}: {1 / step_s:.1f} tok/s, "
          f"{step_s * 1e3:.2f} ms a decode step; kernels: {', '.join(built.facts.kernels)}")
    print(f"{'operator':58} {'ms/step':>8} {'calls/step':>10}")
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:args.rows]
    for e in rows:
        print(f"{e.key[:58]:58} {e.self_cpu_time_total / 1e3 / steps:8.3f} {e.count / steps:10.1f}")


if __name__ == "__main__":
    main()
