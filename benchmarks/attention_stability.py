"""Long-sequence numerical stability of each attention kernel, in fp32, bf16 and fp16.

The analysis blamed linear attention for "long-sequence instability"; an earlier run of this script
found that linear attention accumulated in fp16 overflowed by 1,024 tokens while fp32 stayed at 1e-7. This prints, for
each attention variant (sdpa, gqa, sliding, linear with its state in fp32 and in the model dtype),
the relative error of its output against the same kernel in float64 at growing lengths: NaN/inf are
named as such, a linear attention whose state or normaliser overflowed while its output stayed finite (outputs
silently become 0) is marked '∞', and an
error above --threshold is flagged. The computation is the package's pure
function variants.attention_stability.attention_stability (a kernel study: the package's kernels,
no model); see its docstring for the method.

--model also prints what each variant's measured row reports: model_attention_error on that model
converted to each attention kind and cast to each dtype — the attention path the built model really
runs (its own module and attention function, projections isolated), not the kernels above.

    python benchmarks/attention_stability.py [--quick] [--lengths 128,512,1024,2048,4096,8192]
        [--dtypes fp32,bf16,fp16] [--heads 4] [--head-dim 64] [--window 512] [--threshold 1e-2]
        [--model builtin:tiny-structured]

--quick: lengths 128, 512, 1024, 2048 and 2 heads. Errors depend on the random inputs (unit normal,
fixed seed) and on the kernels torch picks on this machine; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import math

import torch

from variantlab.variants.attention_stability import attention_stability, default_variants, model_attention_error


def cell(row) -> str:
    if row.status in ("nan", "inf"):
        return f"{row.status.upper():>9} !"
    if row.status == "overflow":
        return f"{row.rel_error:7.1e} ∞!"
    return f"{row.rel_error:9.1e}" + (" !" if row.status == "flagged" else "  ")


def model_rows(spec: str, lengths, dtypes, window: int, threshold: float) -> None:
    """model_attention_error of the model converted to each attention kind, in each dtype."""
    import copy

    from variantlab.models.loading import load_causal_lm, resolve_model_path
    from variantlab.variants.attention import apply_attention
    from variantlab.variants.recipe import cast_parameters

    model = load_causal_lm(resolve_model_path(spec), torch.float32, "cpu")[0].eval()
    kv = max(1, model.config.num_key_value_heads // 2)
    kinds = [("sdpa", {}), (f"gqa:{kv}", {}), (f"sliding:{window}", {}), ("linear", {}),
             ("linear", {"linear_state_dtype": "model"})]
    dts = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    print(f"\n{spec}: the model's own attention path (first layer, projections isolated) against float64")
    for dtype in dtypes:
        print(f"\n{dtype:>30} | " + " | ".join(f"{n:>11}" for n in lengths))
        for attn, options in kinds:
            m = copy.deepcopy(model)
            apply_attention(m, attn, options)
            cast_parameters(m, dts[dtype])
            rows = model_attention_error(m, lengths, threshold=threshold)
            name = attn + (" (state in model dtype)" if options else " (state fp32)" if attn == "linear" else "")
            print(f"{name:>30} | " + " | ".join(f"{cell(r):>11}" for r in rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["fp32", "bf16", "fp16"])
    p.add_argument("--heads", type=int)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--threshold", type=float, default=1e-2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", help="also measure this model's own attention path: builtin:NAME or a directory")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    lengths = a.lengths or ([128, 512, 1024, 2048] if a.quick else [128, 512, 1024, 2048, 4096, 8192])
    heads = a.heads or (2 if a.quick else 4)
    variants = default_variants(heads, a.window)
    rows = attention_stability(variants, lengths, a.dtypes, heads=heads, head_dim=a.head_dim,
                               threshold=a.threshold)
    by = {(r.variant, r.dtype, r.length): r for r in rows}
    print(f"relative error against float64 (||out - ref|| / ||ref||), {heads} heads × head_dim {a.head_dim}, "
          f"unit-normal q/k/v; '!' = over {a.threshold:g} or not finite; '∞' = linear state/normaliser overflowed")
    for dtype in a.dtypes:
        print(f"\n{dtype:>30} | " + " | ".join(f"{n:>11}" for n in lengths))
        for v in variants:
            print(f"{v.label:>30} | " + " | ".join(f"{cell(by[v.label, dtype, n]):>11}" for n in lengths))
    flagged = [r for r in rows if r.flagged]
    print()
    if not flagged:
        print("no variant exceeded the threshold")
    for label in dict.fromkeys(r.variant for r in flagged):
        for dtype in a.dtypes:
            mine = [r for r in flagged if r.variant == label and r.dtype == dtype]
            if mine:
                first = min(mine, key=lambda r: r.length)
                err = f"error {first.rel_error:.2g}"
                what = {"flagged": err, "overflow": f"state or normaliser overflowed to inf; {err}"}.get(
                    first.status, first.status)
                print(f"flagged: {label} in {dtype} from {first.length} tokens ({what})")
    if "fp32" in a.dtypes:
        worst = max((r.rel_error for r in rows if r.dtype == "fp32" and not math.isnan(r.rel_error)), default=math.nan)
        print(f"largest fp32 error of any variant: {worst:.1e}")
    if a.model:
        model_rows(a.model, lengths, a.dtypes, a.window, a.threshold)


if __name__ == "__main__":
    main()
