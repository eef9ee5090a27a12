"""What a decode token costs around its layers: the step's plan (the whole token in one call) against the same
step calling the model's modules around its layers, on one engine, interleaved.

variantlab's decode step runs every decoder layer in one C++ call (kernels/decode_step.cpp). Around it, each
token used to pay Python and aten for the embedding lookup, the rotary cos/sin, the final norm, the LM head, the
argmax, and the conversion of the step's lists of tensors (~30 a layer) to C++ at every call. With a plan
(DecodePlan, variants/decode_step.py) the weights' lists are handed over once per model, the cache's once per
cache, and the token is one call from its id to the next id. On a small model that fixed cost is a large
part of a token; on a 115M one it is a few percent: what separates ours from llama.cpp where both are fast.

For each shape and recipe: a random-weight model (decode_vs_llamacpp.SHAPES) built once, one engine, and per
round arm A (plan) and arm B (the step with its plan taken away: its modules around decode_layers) each decode
--requests prompts of --new-tokens tokens, in ABBA order; a round's figure is each arm's median TPOT, the ratio
B / A per round, then the median ratio [min, max] over the rounds. Both arms must choose the same tokens, as
greedy decoding over the same weights should (the rotary table, norm and head compute what the modules do); the
script says so, and stops if not.

    python benchmarks/decode_overhead.py [--shapes tiny,smollm-135m,115m] [--recipes fp32,int4,w4a8]
        [--rounds 8] [--requests 3] [--new-tokens 64] [--threads 2]

Never part of the test suite.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_vs_llamacpp import PAIRS, SHAPES, make_checkpoint, prompt_ids  # noqa: E402


def measure(model_dir: Path, recipe: str, options: dict, args) -> tuple[list[float], list[float]]:
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.measure.metrics import tpot
    from variantlab.variants.build import VariantDefinition, build

    built = build(str(model_dir), VariantDefinition(recipe, recipe, options), "cpu")
    engine = TorchEngine(built.model, built.tokenizer, "cpu", "decode-overhead")
    step = engine.step
    if step is None or step.plan is None:
        raise SystemExit(f"{recipe}: the decode step has no plan here ({engine.step_note or 'no plan'})")
    plan = step.plan
    ids = prompt_ids(model_dir, 64, 0)
    reqs = [GenerationRequest(f"r{i}", prompt_ids=tuple(ids[i:] + ids[:i]), max_new_tokens=args.new_tokens,
                              stop_on_eos=False) for i in range(args.requests)]

    def arm(with_plan: bool) -> tuple[float, list[tuple[int, ...]]]:
        step.plan = plan if with_plan else None
        recs = [run_requests(engine, [r])[0] for r in reqs]
        return statistics.median(tpot(recs)), [r.token_ids for r in recs]

    a, b = [], []
    with torch.inference_mode():
        _, want = arm(True)                    # warm-up, and the tokens both arms must choose
        _, got = arm(False)
        if got != want:
            raise SystemExit(f"{recipe}: the step without its plan chose other tokens than with it")
        for i in range(args.rounds):
            order = (True, False, False, True) if i % 2 == 0 else (False, True, True, False)
            got = {True: [], False: []}
            for with_plan in order:
                t, toks = arm(with_plan)
                if toks != want:
                    raise SystemExit(f"{recipe}: round {i}: the tokens changed")
                got[with_plan].append(t)
            a.append(statistics.median(got[True]))
            b.append(statistics.median(got[False]))
    step.plan = plan
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="tiny,smollm-135m,115m")
    ap.add_argument("--recipes", default="fp32,int4,w4a8")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    shapes, recipes = args.shapes.split(","), args.recipes.split(",")
    if set(shapes) - set(SHAPES):
        raise SystemExit(f"--shapes: unknown {sorted(set(shapes) - set(SHAPES))}; accepted: {', '.join(SHAPES)}")
    options = {p.recipe: dict(p.options) for p in reversed(PAIRS)}     # each recipe as its first pair builds it
    if set(recipes) - set(options):
        raise SystemExit(f"--recipes: unknown {sorted(set(recipes) - set(options))}; accepted: {', '.join(options)}")
    torch.set_num_threads(args.threads)
    print(f"{args.threads} threads, {args.requests} requests of {args.new_tokens} new tokens a round, {args.rounds} "
          f"rounds (ABBA); TPOT medians in ms; ratio = without plan / with plan per round: median [min, max]")
    print(f"{'shape':12} {'recipe':6} {'with plan':>9} {'without':>8} {'ratio [min, max]':>22}  tok/s with, without")
    with tempfile.TemporaryDirectory(prefix="decode-overhead-") as tmp:
        for shape in shapes:
            model_dir = make_checkpoint(Path(tmp) / shape, 0, shape)
            for recipe in recipes:
                a, b = measure(model_dir, recipe, options[recipe], args)
                ratios = [y / x for x, y in zip(a, b)]
                ma, mb = statistics.median(a), statistics.median(b)
                print(f"{shape:12} {recipe:6} {1e3 * ma:9.3f} {1e3 * mb:8.3f} {statistics.median(ratios):8.3f} "
                      f"[{min(ratios):.3f}, {max(ratios):.3f}]  {1 / ma:7.0f}, {1 / mb:7.0f}", flush=True)
    from variantlab.variants.decode_step import LABEL
    print(f"both arms chose the same tokens in every round; the step: {LABEL}")


if __name__ == "__main__":
    main()
