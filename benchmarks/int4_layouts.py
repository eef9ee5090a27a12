"""int4 on our int4_digits_mm (w4a8's packed layout) against int4 on aten's _weight_int4pack_mm_for_cpu, one model.

Issue 25 moved `int4` (W4A16) from aten's kernel to ours where our kernels run. This prints, for the same
weights built both ways (ours as a variant is built here; aten's as it is built where our kernels do not
run), interleaved A B A B in this process with 2 threads: decode TPOT of one request (our decode step on
both), prefill time of one 64-token prompt, and offline tokens/s of a batch of 16 (transformers' forward at
16 rows, so the layouts' kernels at M = 16) — the three places the kernel runs:

    python benchmarks/int4_layouts.py [--model DIR] [--reps 5] [--group-size 32]

Without --model: the random-weight 115M Llama of decode_vs_llamacpp.py (seed 0), made in a temporary folder.
Never part of the test suite.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.variants import kernels
    from variantlab.variants.build import VariantDefinition, build

    if not kernels.status().available:
        raise SystemExit(f"our kernels do not run here: {kernels.status().reason}")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            sys.path.insert(0, str(Path(__file__).parent))
            from decode_vs_llamacpp import make_checkpoint
            model_dir = make_checkpoint(Path(tmp) / "checkpoint", 0)
        definition = VariantDefinition("int4", "int4", {"group_size": args.group_size})
        ours = build(model_dir, definition, "cpu")
        with kernels.switched_off("built as where our kernels do not run"):
            aten = build(model_dir, definition, "cpu")
    engines = {"ours (int4_digits_mm)": TorchEngine(ours.model, ours.tokenizer, "cpu", "a"),
               "aten (_weight_int4pack_mm_for_cpu)": TorchEngine(aten.model, aten.tokenizer, "cpu", "b")}
    one = [GenerationRequest("one", prompt_ids=tuple(range(10, 74)), max_new_tokens=48, stop_on_eos=False)]
    batch = [GenerationRequest(f"b{i}", prompt_ids=tuple(range(10 + i, 60 + i)), max_new_tokens=32,
                               stop_on_eos=False) for i in range(16)]
    got: dict[str, dict[str, list[float]]] = {name: {"tpot": [], "prefill": [], "offline": []} for name in engines}
    with torch.inference_mode():
        for name, engine in engines.items():      # warm-up
            run_requests(engine, one)
            run_requests(engine, batch[:2])
        for rep in range(args.reps):
            for name, engine in (list(engines.items()) if rep % 2 == 0 else list(engines.items())[::-1]):
                r = run_requests(engine, one)[0]
                got[name]["tpot"].append((r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1))
                got[name]["prefill"].append(r.token_times[0] - r.send_time)
                t = time.perf_counter()
                recs = run_requests(engine, batch)
                got[name]["offline"].append(sum(x.tokens_out for x in recs) / (time.perf_counter() - t))
    print(f"model {args.model or 'random-weight 115M Llama (seed 0)'}, int4 g{args.group_size}, {args.threads} "
          f"threads, {args.reps} interleaved reps (medians)")
    for name, m in got.items():
        print(f"  {name:36} decode TPOT {1e3 * statistics.median(m['tpot']):6.2f} ms   prefill of 64 tokens "
              f"{1e3 * statistics.median(m['prefill']):6.1f} ms   offline batch 16 {statistics.median(m['offline']):6.1f} tok/s")


if __name__ == "__main__":
    main()
