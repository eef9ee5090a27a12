"""Build time of the `mixed` recipe on a random-weight ~150M-parameter Llama, split by phase.

The checkpoint is made here from a config (hidden 768, 12 layers, 12 heads, intermediate 2048,
vocabulary 32000, untied head: 134M parameters, 84 decoder linears), saved with `save_pretrained`
in a temporary directory beside the shipped reference model's tokenizer, loaded in bf16 as a
build would, and built once with the calibration texts passed through `BuildContext` (16 structured
samples, seed 1234, as the suite would pass its workload). Prints the seconds of each phase
(capture, sensitivity, search), the forward passes and suffix runs, the plan and the measured KLD.

    python benchmarks/mixed_build.py [--threads 2] [--max-kld 0.003] [--old]

The pre-bisection implementation (commit 0f4efdf: one full forward per layer × width for
sensitivity, then a walk of one full forward per step from an additive prediction) cost
1 + 84 × 2 + walk forwards, the walk 1 to 169 of them (likely: from the prediction to the boundary
this run finds, plus one); the script prints those counts times the seconds of one measured
search pass here, labelled as an estimate. --old runs that
implementation on the same checkpoint instead (read from git; several minutes on 2 cores).

Random weights (initializer_range 0.02) give near-uniform next-token distributions, so KLDs are
small: every layer at 4 bits measures about 1e-2 here. The default --max-kld 0.003 lies inside
that range so that the search has something to decide (the recipe's default, 0.01, would put
almost everything at 4 bits). One run on a possibly busy machine: re-run before quoting figures.

On a 2-core machine that other processes share, libgomp's default spin-waiting makes 2-thread
forwards up to ~20x slower than on a quiet machine (a thread spins at a barrier while its partner
waits for a core); `OMP_WAIT_POLICY=PASSIVE python benchmarks/mixed_build.py` avoids most of it.
The script prints the policy and the load average beside the figures.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from variantlab.data.structured import generate_samples
from variantlab.models.loading import BUILTIN_MODELS, load_causal_lm
from variantlab.variants.recipe import BuildContext
from variantlab.variants.registry import get_recipe, parse_options

CONFIG = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
              intermediate_size=2048, vocab_size=32000, max_position_embeddings=1024,
              tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
OLD_COMMIT = "0f4efdf"  # the last commit with the walk


def make_checkpoint(directory: Path) -> Path:
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(directory)
    AutoTokenizer.from_pretrained(BUILTIN_MODELS["tiny-structured"]).save_pretrained(directory)
    return directory


def old_recipe():
    """The pre-bisection MixedRecipe, loaded from git beside the package (its relative imports resolve)."""
    repo = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "-C", str(repo), "show", f"{OLD_COMMIT}:src/variantlab/variants/mixed.py"],
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("variantlab.variants._mixed_old", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "variantlab.variants"
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{OLD_COMMIT}:mixed.py", "exec"), module.__dict__)
    return module.MixedRecipe()


def build(path: Path, recipe, options: dict, context: BuildContext | None):
    opts = parse_options(get_recipe("mixed"), options)
    model, tok = load_causal_lm(path, recipe.load_dtype(opts), "cpu")
    t0 = time.perf_counter()
    facts = recipe.apply(model, opts, "cpu", context) if context is not None else recipe.apply(model, opts, "cpu")
    return facts, time.perf_counter() - t0, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-kld", type=float, default=0.003)
    ap.add_argument("--calibration-samples", type=int, default=16)
    ap.add_argument("--sensitivity-samples", type=int, default=4)
    ap.add_argument("--old", action="store_true", help=f"also run the implementation of {OLD_COMMIT}")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    options = {"max_kld": args.max_kld, "calibration_samples": args.calibration_samples,
               "sensitivity_samples": args.sensitivity_samples}
    texts = tuple(f"{s['prompt']} {s['answer']}" for s in generate_samples(args.calibration_samples, 1234))
    with tempfile.TemporaryDirectory() as d:
        path = make_checkpoint(Path(d))
        tok = AutoTokenizer.from_pretrained(path)
        load = os.getloadavg()[0]
        facts, seconds, _ = build(path, get_recipe("mixed"), options, BuildContext(tok, texts))
        e, cost, search = facts.extra, facts.extra["cost"], facts.extra["search"]
        linears = len(e["plan"])
        print(f"load average {os.getloadavg()[0]:.2f} (start {load:.2f}); "
              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
        print(f"model: {facts.parameters / 1e6:.1f}M parameters, {linears} decoder linears, "
              f"{torch.get_num_threads()} threads, calibration {e['calibration_samples']} texts "
              f"({e['calibration_positions']} positions, source {e['calibration_source']}), "
              f"sensitivity on {e['sensitivity_samples']}")
        print(f"mixed (bisection): {seconds:.1f} s = capture {cost['capture_seconds']:.1f} + sensitivity "
              f"{cost['sensitivity_seconds']:.1f} + search {cost['search_seconds']:.1f}")
        print(f"  forwards: {cost['passes']} full passes (1 capture + {search['passes']} search) + "
              f"{cost['suffix_runs']} suffix runs over {cost['suffix_layers']} decoder layers "
              f"(= {cost['suffix_layers'] / cost['decoder_layers']:.1f} decoders' worth, on "
              f"{e['sensitivity_samples']}/{e['calibration_samples']} texts)")
        print(f"  plan: {e['bits_histogram']} bits → {facts.bits_per_weight:.2f} bits/weight; "
              f"KLD {e['final_kld']:.3g} ≤ {e['max_kld']:g}; steps {search['steps']}, taken {search['taken']} "
              f"(additive prediction {search['predicted']})")
        print("  probes (prefix: KLD): " + ", ".join(f"{k}: {v:.3g}" for k, v in search["probes"]))
        per_pass = cost["search_seconds"] / max(search["passes"], 1)
        walk = 1 + abs(search["taken"] - search["predicted"]) + 1  # from its prediction to this boundary
        old = {"fewest": 1 + 2 * linears + 1, "likely": 1 + 2 * linears + walk,
               "most": 1 + 2 * linears + search["steps"] + 1}
        print(f"old walk, ESTIMATE (full passes × {per_pass:.2f} s, one measured search pass here): "
              + ", ".join(f"{k} {n} passes ≈ {n * per_pass:.0f} s" for k, n in old.items())
              + f" (likely: a walk of {walk} from the additive prediction to the boundary found here)")
        if args.old:
            old_facts, old_seconds, _ = build(path, old_recipe(), options, None)
            o = old_facts.extra
            print(f"old walk, MEASURED: {old_seconds:.1f} s, {1 + 2 * linears + o['search']['passes']} passes "
                  f"(walk {o['search']['passes']}); plan {o['bits_histogram']} → "
                  f"{old_facts.bits_per_weight:.2f} bits/weight, KLD {o['final_kld']:.3g}")
            print(f"speed-up: {old_seconds / seconds:.1f}x")


if __name__ == "__main__":
    main()
