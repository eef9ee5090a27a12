"""Our llama.cpp backend (backends/llamacpp.py) against llama.cpp's own clock, on one GGUF, interleaved.

Three readings of the same decode, 2 threads, the same prompt ids, greedy, EOS ignored, in one process, A B A B:
  - our backend's TPOT (run_requests: the time between token events, what `variantlab bench` reports);
  - llama-cpp-python's `Llama.generate`, timed the same way (what benchmarks/decode_vs_llamacpp.py runs);
  - llama.cpp's own eval time per decoded token (`llama_perf_context` of the Llama's context).
Our backend must not be slower than llama.cpp's own count (it would weaken the peer), and the bench's TPOT of
the same variant should agree with ours here within the machine's noise.

    python benchmarks/llamacpp_backend_check.py ARTIFACT_DIR [--reps 5] [--new-tokens 32]

ARTIFACT_DIR: a `backend: llamacpp` variant's artifact (its model.gguf and the checkpoint's tokenizer files).
Never part of the test suite.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import llama_cpp
    from transformers import AutoTokenizer

    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.llamacpp import LlamaCppBackend
    from variantlab.backends.tokenized import TokenizerText, eos_ids
    from variantlab.variants.gguf_artifact import gguf_path

    path = str(gguf_path(args.artifact))
    tok = AutoTokenizer.from_pretrained(args.artifact)
    ids = list(range(10, 10 + args.prompt_tokens))
    n = args.new_tokens
    ours = LlamaCppBackend(path, TokenizerText(tok, eos_ids(tok)), threads=args.threads)
    llm = llama_cpp.Llama(model_path=path, n_ctx=4 * (len(ids) + n), n_batch=len(ids) + n, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    a, b = [], []
    for _ in range(args.reps):
        r = run_requests(ours, [GenerationRequest("x", prompt_ids=tuple(ids), max_new_tokens=n, stop_on_eos=False)])[0]
        a.append((r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1))
        llm.reset()
        times = []
        for _tok in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            times.append(time.perf_counter())
            if len(times) == n:
                break
        b.append((times[-1] - times[0]) / (n - 1))
    perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
    own = perf.t_eval_ms / max(perf.n_eval, 1) / 1e3
    print(f"{path}: {args.reps} interleaved reps, prompt {len(ids)} ids, {n} new tokens, {args.threads} threads")
    print(f"llama.cpp: {llama_cpp.llama_print_system_info().decode().strip()}")
    print(f"TPOT median: our backend {1e3 * statistics.median(a):.2f} ms, Llama.generate "
          f"{1e3 * statistics.median(b):.2f} ms; llama.cpp's own eval time per token {1e3 * own:.2f} ms "
          f"({perf.n_eval} evals)")
    print(f"ratios: ours / llama.cpp's own {statistics.median(a) / own:.3f}, Llama.generate / llama.cpp's own "
          f"{statistics.median(b) / own:.3f}")
    ours.close()


if __name__ == "__main__":
    main()
