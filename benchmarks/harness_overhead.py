"""Harness overhead: per-token time through the harness path vs a bare KV-cached greedy loop.

The harness path is what a single-stream scenario runs: `run_requests(engine, [request])` per
request, which takes one request through TorchEngine.collect with the scenario's stop rules on: EOS
and "\\n" (a token-id set); --stop adds stop strings (e.g. --stop '\\nQ:' also searches the rolling
text tail every token). It runs inside torch.inference_mode(), as the worker runs its scenarios (the
engine then skips its per-step toggle); --caller-mode normal measures a caller outside it.

collect has two loops, and each is measured against its own bare loop:
- native (where variantlab's decode step runs the model whole, the default): the tokens after the first in
  C++ calls (`DecodeStep.run`: the step, the read-back, the clock and a look-up in the stop rules' wake set
  per token; one call a request when an id set alone decides, as with "\\n"; with --stop a call returns at
  each token that might complete a stop string). Its bare loop is one such call with no stop rule: the ratio
  is what the rest of the harness adds.
- Python (`engine.native_loop = False`, and what a compiled step or transformers' forward always gets):
  per token the decode step, `.item()`, the clock, the stop rules and two appends. Its bare loop is the
  engine's own decode step and `.item()` per token, with no events, stop checks, records or clock.
The headline ratio (goal <= 1.01) is the native one where it runs, else the Python one; both are printed,
with the native loop's speed against the bare Python loop.

Every path must generate exactly --tokens tokens per prompt, so the stop rules must never fire: the
model's head gets a bias of -1e4 on every token that is EOS or holds a newline, and every stop
string must hold a newline (so none can occur). All paths run this same model, so the bias costs
them alike; the script checks that every harness request ran to --tokens ("length").

All run in this process on the same model and prompts, back to back per prompt, so that machine noise
and warm caches favour none: every prompt takes the paths in each cyclic order in turn (each path first,
second, ... equally often for each prompt: the first run after a change of prompt is the slowest, by up
to 2-3% on the tiny model, its cache of another length bucket). Per-token time = (last token time - first
token time) / (tokens - 1), i.e. TPOT, per request. A ratio is the median of the back-to-back pairs'
ratios (slow drift in the machine's load cancels within a pair), with a bootstrap 95% CI.

    python benchmarks/harness_overhead.py [--model DIR] [--rounds 15] [--tokens 64] [--prompts 4]
        [--threads N] [--clock wall|cpu] [--noop-tokens 2000]

--clock cpu times the Python paths by this thread's CPU time (the engine's clock injected), which other
processes on a shared machine disturb less; reading it is a system call (about 0.4 us) that the harness
makes once per token and the bare loop twice per request, so it overstates the ratio by about 0.001-0.002.
The native loop reads the wall clock (time.perf_counter's), so under --clock cpu it does not run.

Two more lines bound what the ratios can show. The noise floor: a second copy of the headline's bare loop
runs in the same rounds, and its ratio to the first (A/A) is what the machine's drift alone gives. The Python
harness's own work: both Python paths again with the decode step replaced by one that returns its input at
once (the model's prefill still runs), --noop-tokens tokens a request; the difference per token is the Python
that loop adds to every step, free of the memory-bound step's noise.

Goal (issues 2, 8 and 25): ratio at most 1.01.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from variantlab.backends.base import FINISH_LENGTH, GenerationRequest, run_requests
from variantlab.backends.torch_engine import TorchEngine
from variantlab.data.structured import generate_samples
from variantlab.models.loading import load_causal_lm, resolve_model_path

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


@torch.inference_mode()
def bare_per_token(engine: TorchEngine, ids: list[int], n_tokens: int, clock=time.perf_counter) -> float:
    """The engine's own decode step (`engine._decode`: our decode step, or transformers' forward where it does not
    run the model) over the engine's static cache, and `.item()`, per token, with nothing else: no events, stop
    checks or records."""
    model = engine.model
    cache = engine.caches.acquire(1, len(ids) + n_tokens)
    logits = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    nxt.item()
    t0 = clock()
    for _ in range(n_tokens - 1):
        nxt = engine._decode(nxt, cache, None, None)
        nxt.item()
    return (clock() - t0) / (n_tokens - 1)


@torch.inference_mode()
def bare_native_per_token(engine: TorchEngine, ids: list[int], n_tokens: int) -> float:
    """The native loop alone (`DecodeStep.run` with no stop rule) over the engine's static cache: TPOT from its
    own token times."""
    cache = engine.caches.acquire(1, len(ids) + n_tokens)
    logits = engine.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True,
                          logits_to_keep=1).logits
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    nxt.item()
    t0 = time.perf_counter()
    got = engine.step.run(nxt, cache, n_tokens - 1, None)
    if got is None:
        raise RuntimeError("the native loop does not run this model's cache")
    return (got[1][-1] - t0) / (n_tokens - 1)


def harness_per_token(engine: TorchEngine, prompt: str, n_tokens: int, stop: tuple[str, ...],
                      inference: bool = True) -> float:
    with torch.inference_mode(inference):
        (rec,) = run_requests(engine, [GenerationRequest("h", prompt=prompt, max_new_tokens=n_tokens, stop=stop)])
    if not rec.ok or rec.tokens_out != n_tokens or rec.finish_reason != FINISH_LENGTH:
        raise RuntimeError(f"the harness request ended early ({rec.tokens_out} tokens, {rec.finish_reason}, "
                           f"{rec.error}): the comparison needs both paths to generate {n_tokens} tokens")
    return (rec.end_time - rec.first_token_time) / (rec.tokens_out - 1)


def ban(model, token_ids) -> None:
    """Make `token_ids` never the greedy choice: the head gets a -1e4 bias on them."""
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True, dtype=old.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[sorted(token_ids)] = -1e4
    model.lm_head = head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-structured")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--noop-tokens", type=int, default=2000,
                    help="tokens a request when the decode step is a no-op (the harness's own work)")
    ap.add_argument("--stop", action="append", default=[],
                    help="another stop string for the harness path (must hold a newline); repeatable")
    ap.add_argument("--caller-mode", choices=("inference", "normal"), default="inference",
                    help="whether run_requests is called inside torch.inference_mode() (as the worker does)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="cpu: this thread's CPU time, which other processes on a shared machine disturb less")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    stop = ("\n", *(x.encode().decode("unicode_escape") for x in args.stop))
    if not all("\n" in x for x in stop):
        ap.error("every stop string must hold a newline, so that it never occurs")
    inference = args.caller_mode == "inference"
    path = resolve_model_path(args.model)
    model, tok = load_causal_lm(Path(path), torch.float32, "cpu")
    clock = CLOCKS[args.clock]
    engine = TorchEngine(model, tok, "cpu", "bench", clock=clock)
    ban(model, engine.eos_ids | engine.vocabulary.ids_containing("\n"))
    engine = TorchEngine(model, tok, "cpu", "bench", clock=clock)   # its decode step takes the head it has when made
    prompts = [s["prompt"] for s in generate_samples(args.prompts, 0)]
    prompt_ids = [engine.encode(p) for p in prompts]
    native = engine.step is not None and getattr(engine.step, "plan", None) is not None and args.clock == "wall"

    def harness(p, native_loop):
        engine.native_loop = native_loop
        return harness_per_token(engine, p, args.tokens, stop, inference)

    paths = {"harness python": lambda p, ids: harness(p, False),
             "bare python": lambda p, ids: bare_per_token(engine, ids, args.tokens, clock)}
    if native:
        paths.update({"harness native": lambda p, ids: harness(p, True),
                      "bare native": lambda p, ids: bare_native_per_token(engine, ids, args.tokens)})
    head = "native" if native else "python"
    paths[f"bare {head} again"] = paths[f"bare {head}"]
    for p, ids in zip(prompts, prompt_ids):  # warm up every path (and check the harness runs to --tokens)
        for run in paths.values():
            run(p, ids)
    names = list(paths)
    got: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):  # each path in each place equally often, for every prompt
        for i, (p, ids) in enumerate(zip(prompts, prompt_ids)):
            k = (r + i) % len(names)
            for name in names[k:] + names[:k]:
                got[name].append(paths[name](p, ids))
    engine.native_loop = True
    own = own_work(engine, prompts[0], prompt_ids[0], args.noop_tokens, stop, inference, clock)

    def ratio(a: str, b: str) -> str:
        pairs = [x / y for x, y in zip(got[a], got[b])]
        lo, hi = bootstrap_median_ci(pairs)
        return f"{statistics.median(pairs):.4f} (95% CI {lo:.4f}-{hi:.4f})"

    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"model {path} | threads {torch.get_num_threads()} | {args.rounds} rounds x {len(prompts)} prompts "
          f"x {args.tokens} tokens | clock {args.clock}")
    print(f"harness path: stop rules EOS, {', '.join(map(repr, stop))}; caller mode {args.caller_mode}")
    if not native:
        why = "--clock cpu" if engine.step is not None and engine.step.plan is not None else \
            (engine.step_note or "variantlab's decode step has no plan for this model")
        print(f"the native loop does not run here ({why}): the Python loop is the harness's path")
    for name in names[:-1]:
        print(f"per-token time, {name:<15} (median TPOT): {med[name] * 1e3:.4f} ms")
    n = len(got[names[0]])
    if native:
        print(f"ratio harness / bare, native loop, median of {n} back-to-back pairs: "
              f"{ratio('harness native', 'bare native')}; goal <= 1.01")
    print(f"ratio harness / bare, Python loop, median of {n} pairs: {ratio('harness python', 'bare python')}"
          + ("" if native else "; goal <= 1.01"))
    if native:
        print(f"native harness / Python bare loop (what the native loop saves), median of {n} pairs: "
              f"{ratio('harness native', 'bare python')}")
    print(f"noise floor, bare {head} again / bare {head} (A/A), median of {n} pairs: "
          f"{ratio(f'bare {head} again', f'bare {head}')}")
    print(f"the Python loop's own work, decode step a no-op ({args.noop_tokens} tokens, median of 9): "
          f"{own * 1e6:.2f} us a token = {own / med['bare python']:.4f} of the real step")


def own_work(engine: TorchEngine, prompt: str, ids: list[int], n_tokens: int, stop: tuple[str, ...],
             inference: bool, clock) -> float:
    """Per-token time of the Python harness loop minus the bare Python loop's, the engine's decode step replaced by
    one that returns its input (a token the ban leaves greedy, so the request runs to n_tokens): the Python alone."""
    real = engine._decode
    engine._decode = lambda nxt, cache, mask, pos: nxt   # (collect's native loop runs only when _decode is the step)
    try:
        diffs = [harness_per_token(engine, prompt, n_tokens, stop, inference)
                 - bare_per_token(engine, ids, n_tokens, clock) for _ in range(9)]
    finally:
        engine._decode = real
    return statistics.median(diffs)


def bootstrap_median_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


if __name__ == "__main__":
    main()
