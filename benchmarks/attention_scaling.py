"""Where each attention recipe wins on this machine: prefill time and per-token decode time by length.

The analysis's guideline (standard attention below 512 tokens, GQA to 2048, linear above) is a
claim about crossovers; this script measures them. One model (a random-weight Llama built from a
config by default, or --model DIR), one attention recipe at a time (variants/attention.py, applied to
a fresh copy), and at each length L:

- prefill: one forward of L tokens into a fresh DynamicCache, as backends/torch_engine.py runs it
  (median of --repeats; the first call per recipe is a warm-up);
- decode: --decode-tokens single-token forwards after that prefill, median per token;
- KV-cache (or linear state) bytes one sequence holds at L, from the recipe's facts.

Then, for every recipe against sdpa, the lengths where it turns faster or slower (interpolated
between measured lengths, log-log), for prefill and for decode separately; ratios within ±5% of 1
are reported as ties, not as wins.

    python benchmarks/attention_scaling.py [--quick] [--lengths 128,512,2048,8192]
        [--recipes sdpa,gqa:1,linear,sliding:512] [--decode-tokens 16] [--repeats 3] [--threads 1]
        [--model DIR] [--dtype fp32|bf16|fp16]

Default lengths 128, 512, 2048, 8192, and 32768 when this machine's free memory fits it (an
estimate, printed); --quick: 128, 512, 2048, one repeat, 4 decode tokens. One thread by default
(a shared 2-core machine makes two threads fight). Numbers come from one
run on a possibly busy machine: re-run before quoting them; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import time

import torch
from transformers import DynamicCache

from variantlab.report.format import fmt_value
from variantlab.variants.attention import apply_attention, kv_cache_bytes_per_sequence

DEFAULT_CONFIG = dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=65536,
                      rope_theta=500000.0)
TIE = 0.05  # ratios within ±5% of 1 are reported as ties
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_model(path: str | None, dtype):
    if path:
        from transformers import AutoModelForCausalLM
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**DEFAULT_CONFIG)).eval().to(dtype)


def estimated_peak_bytes(config, length: int, elt: int) -> int:
    """A rough upper bound on a prefill's memory: weights aside, activations, logits and the KV cache."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = 2 * config.num_hidden_layers * (config.num_key_value_heads or config.num_attention_heads) \
        * (h // config.num_attention_heads)
    return length * (8 * h + 3 * i + v + kv) * max(elt, 4) * 2


def fits(model, length: int) -> tuple[bool, str]:
    import psutil
    need = estimated_peak_bytes(model.config, length, next(model.parameters()).element_size())
    free = psutil.virtual_memory().available
    return need < 0.5 * free, f"needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def measure(model, length: int, decode_tokens: int, repeats: int) -> tuple[float, float]:
    """(median prefill seconds, median seconds per decoded token)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=gen).to(device)
    prefill, steps = [], []
    for _ in range(repeats):
        cache = DynamicCache()
        sync(device)
        t0 = time.perf_counter()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        prefill.append(time.perf_counter() - t0)
        for _ in range(decode_tokens):
            t0 = time.perf_counter()
            nxt = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            nxt.item()  # synchronises the device, as the backend's loop does
            steps.append(time.perf_counter() - t0)
    return statistics.median(prefill), statistics.median(steps) if steps else math.nan


def crossovers(lengths, ratios, tie: float = TIE) -> list[str]:
    """Where ratio (recipe / sdpa time) crosses 1, interpolated in log L and log ratio. Ratios within
    ±tie of 1 count as neither faster nor slower: one run on a shared machine cannot tell them apart."""
    pts = [(n, r) for n, r in zip(lengths, ratios) if r > 0 and math.isfinite(r)]
    if not pts:
        return ["not measured"]
    clear = [(n, r) for n, r in pts if abs(math.log(r)) > math.log1p(tie)]
    out = []
    for (n0, r0), (n1, r1) in zip(clear, clear[1:]):
        if (r0 < 1) != (r1 < 1):
            y0, y1 = math.log(r0), math.log(r1)
            at = math.exp(math.log(n0) + (math.log(n1) - math.log(n0)) * (-y0) / (y1 - y0))
            out.append(f"{'faster' if r1 < 1 else 'slower'} from ~{at:,.0f} tokens (between {n0} and {n1})")
    ties = [n for n, r in pts if (n, r) not in clear]
    if not out and clear:
        out.append(("faster" if clear[0][1] < 1 else "slower") + " wherever the difference exceeds "
                   f"{tie:.0%}")
    if ties:
        out.append(f"within ±{tie:.0%} of sdpa at L = {', '.join(map(str, ties))}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--recipes", type=lambda s: s.split(","))
    p.add_argument("--decode-tokens", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", help="a local Hugging Face Llama/Mistral/Qwen2 directory (default: random Llama)")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    base = build_model(a.model, DTYPES[a.dtype]).to(a.device)
    cfg = base.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
    recipes = a.recipes or ["sdpa", f"gqa:{max(1, kv // 4)}", "linear", "sliding:512"]
    if recipes[0] != "sdpa":
        recipes = ["sdpa"] + [r for r in recipes if r != "sdpa"]
    lengths = a.lengths or ([128, 512, 2048] if a.quick else [128, 512, 2048, 8192, 32768])
    decode_tokens = a.decode_tokens or (4 if a.quick else 16)
    repeats = a.repeats or (1 if a.quick else 3)
    kept = []
    for n in lengths:
        ok, why = fits(base, n)
        if ok or a.lengths:
            kept.append(n)
        else:
            print(f"skipping L={n}: {why}")
    lengths = kept
    params = sum(t.numel() for t in base.parameters())
    print(f"model: {a.model or 'random Llama'} ({params / 1e6:.1f}M parameters, {cfg.num_hidden_layers} layers, "
          f"hidden {cfg.hidden_size}, {heads} heads, {kv} K/V heads), {a.dtype}, {a.device}, "
          f"{torch.get_num_threads()} thread(s); {repeats} repeat(s), {decode_tokens} decode tokens")

    results = {}
    for spec in recipes:
        model = copy.deepcopy(base)
        facts = apply_attention(model, spec)
        measure(model, min(lengths), 1, 1)  # warm-up
        for n in lengths:
            pre, dec = measure(model, n, decode_tokens, repeats)
            results[spec, n] = (pre, dec, kv_cache_bytes_per_sequence(facts, n))
            print(f"  {spec:>12} L={n:>6}: prefill {pre * 1e3:9.1f} ms   decode {dec * 1e3:7.2f} ms/token   "
                  f"cache {fmt_value(results[spec, n][2], 'B')}", flush=True)
        del model

    print()
    print(f"{'L':>6} | " + " | ".join(f"{s:>26}" for s in recipes))
    print(f"{'':>6} | " + " | ".join(f"{'prefill ms (×sdpa)':>26}" for _ in recipes))
    for n in lengths:
        base_pre = results["sdpa", n][0]
        print(f"{n:>6} | " + " | ".join(f"{results[s, n][0] * 1e3:>17.1f} ({results[s, n][0] / base_pre:5.2f}×)"
                                          for s in recipes))
    print(f"{'':>6} | " + " | ".join(f"{'decode ms/token (×sdpa)':>26}" for _ in recipes))
    for n in lengths:
        base_dec = results["sdpa", n][1]
        print(f"{n:>6} | " + " | ".join(f"{results[s, n][1] * 1e3:>17.2f} ({results[s, n][1] / base_dec:5.2f}×)"
                                          for s in recipes))
    print(f"{'':>6} | " + " | ".join(f"{'cache bytes / sequence':>26}" for _ in recipes))
    for n in lengths:
        print(f"{n:>6} | " + " | ".join(f"{fmt_value(results[s, n][2], 'B'):>26}" for s in recipes))

    print("\nmeasured crossovers against sdpa:")
    for spec in recipes[1:]:
        for i, what in ((0, "prefill"), (1, "decode")):
            ratios = [results[spec, n][i] / results["sdpa", n][i] for n in lengths]
            print(f"  {spec:>12} {what:>7}: " + "; ".join(crossovers(lengths, ratios)))


if __name__ == "__main__":
    main()
