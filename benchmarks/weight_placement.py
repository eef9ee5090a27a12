"""Where the weights lie, and how fast decode reads them: one artifact, three placements, one process, interleaved.

  mapped  the artifact's model.safetensors memory-mapped (safetensors' safe_open), as load_artifact did before
          the arena: 4 KiB page-cache pages
  torch   the same tensors copied into torch's own allocations (anonymous memory, 4 KiB pages)
  arena   as the engine now runs: read into one 2 MiB-aligned mapping madvised MADV_HUGEPAGE and settled
          (variants/weight_arena.py)

Each placement gets a TorchEngine with our decode step over the same weights; the rounds alternate the order
(A B C, C B A, ...) so that the host's drift lands on all three. Printed: TPOT median per placement (one
request of --tokens new tokens after a 64-token prompt, each round), the ratios to the arena, the arena's
huge pages, and that all three decode the same tokens.

    python benchmarks/weight_placement.py ARTIFACT_DIR [--rounds 6] [--tokens 128] [--threads 2]

ARTIFACT_DIR: a variant built with `variantlab build` (or a bench's runs/*/variants/NAME/artifact). The mapped
placement swaps in the file's tensors where a parameter or buffer has the file's name, shape and dtype; a
module that repacks its weights at load (int4 on our kernels) keeps its repacked ones in torch memory there.
Never part of the test suite.
"""
from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from safetensors import safe_open

    from variantlab.backends import torch_engine
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.measure.metrics import tpot
    from variantlab.variants import build as variants

    built = variants.load(args.artifact, "cpu")
    engines = {"arena": torch_engine.TorchEngine(built.model, built.tokenizer, "cpu", "placement")}
    settled = engines["arena"].settled
    torch_model = copy.deepcopy(built.model)          # fresh torch allocations
    mapped_model = copy.deepcopy(built.model)
    swapped = 0
    with safe_open(str(args.artifact / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for name, t in (*mapped_model.named_parameters(), *mapped_model.named_buffers()):
            if name in names:
                m = f.get_tensor(name)
                if m.shape == t.shape and m.dtype == t.dtype:
                    t.data = m
                    swapped += t.numel() * t.element_size()
    real_settle = torch_engine.settle
    torch_engine.settle = lambda model: None           # these two keep their placement
    try:
        engines["torch"] = torch_engine.TorchEngine(torch_model, built.tokenizer, "cpu", "placement")
        engines["mapped"] = torch_engine.TorchEngine(mapped_model, built.tokenizer, "cpu", "placement")
    finally:
        torch_engine.settle = real_settle
    ids = tuple(range(1, 65))

    def run(engine) -> tuple[float, tuple[int, ...]]:
        req = GenerationRequest("p", prompt_ids=ids, max_new_tokens=args.tokens, stop_on_eos=False)
        (rec,) = run_requests(engine, [req])
        return tpot([rec])[0], rec.token_ids

    names = list(engines)
    with torch.inference_mode():
        tokens = {k: run(e)[1] for k, e in engines.items()}   # warm-up, and the tokens each decodes
        got: dict[str, list[float]] = {k: [] for k in names}
        for r in range(args.rounds):
            for k in (names if r % 2 == 0 else names[::-1]):
                got[k].append(run(engines[k])[0])
    arena = statistics.median(got["arena"])
    print(f"{args.artifact} | {args.threads} threads | {args.rounds} rounds, order alternating | 64-token prompt, "
          f"{args.tokens} new tokens | mapped: {swapped / 2**20:.0f} MiB swapped in from the file")
    print(f"arena: {settled.summary if settled else 'not settled (no CPU weights)'}")
    for k in names:
        m = statistics.median(got[k])
        print(f"{k:7} TPOT median {m * 1e3:7.3f} ms  [{min(got[k]) * 1e3:.3f}, {max(got[k]) * 1e3:.3f}]  "
              f"÷ arena {m / arena:.3f}")
    print(f"same tokens in all three: {len(set(tokens.values())) == 1}")


if __name__ == "__main__":
    main()
