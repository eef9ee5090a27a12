"""Long-sequence numerical stability of each attention kernel: relative error against float64.

The analysis blamed linear attention for "long-sequence instability". Whether that is the kernel,
the dtype or the accumulator is a measurement: for each attention variant, random q, k, v (unit
normal, a fixed seed) go through the variant's own kernel once in float64 (the reference) and once
in each dtype under test (inputs rounded to it first, as a model in that dtype would have them); the
relative error is ||out - ref|| / ||ref|| over the whole output. A non-finite output is reported as
"nan" or "inf", not as a number; a linear attention whose state or normaliser phi(q)·z overflowed while
the output stayed finite (an infinite normaliser silently turns outputs into 0) is "overflow", with
its error; an error over `threshold` is flagged.

Kernels are the ones the recipes run (attention_sliding.py, attention_linear.py): softmax attention
(sdpa, gqa:<k>) through blocks of scaled_dot_product_attention with a causal band as wide as the
sequence, sliding:<w> with its window, linear with its state in fp32 or in the model dtype.
Pure: no model, no clock; `bench` and benchmarks/attention_stability.py call it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .attention import AttentionOptions, AttentionSpec, parse_attention

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class StabilityVariant:
    label: str
    spec: AttentionSpec
    options: AttentionOptions = AttentionOptions()


@dataclass(frozen=True)
class StabilityRow:
    variant: str
    dtype: str
    length: int
    rel_error: float          # nan when the output was not finite
    status: str               # "ok" | "flagged" | "nan" | "inf" | "overflow"

    @property
    def flagged(self) -> bool:
        return self.status != "ok"

    def to_json(self) -> dict:
        err = None if math.isnan(self.rel_error) else self.rel_error
        return {"variant": self.variant, "dtype": self.dtype, "length": self.length, "rel_error": err,
                "status": self.status}


def default_variants(heads: int = 4, window: int = 512) -> list[StabilityVariant]:
    model_state = AttentionOptions(linear_state_dtype="model")
    return [StabilityVariant("sdpa", parse_attention("sdpa")),
            StabilityVariant(f"gqa:{max(1, heads // 2)}", parse_attention(f"gqa:{max(1, heads // 2)}")),
            StabilityVariant(f"sliding:{window}", parse_attention(f"sliding:{window}")),
            StabilityVariant("linear (state fp32)", parse_attention("linear")),
            StabilityVariant("linear (state in model dtype)", parse_attention("linear"), model_state)]


def run_kernel(variant: StabilityVariant, q, k, v):
    """(output, intermediates finite?): the variant's attention of q (B, H, T, D) over k, v (B, Hkv, T, D),
    computed in q's dtype."""
    from .attention_linear import linear_attention_chunked, normaliser
    from .attention_sliding import sliding_attention

    spec, t = variant.spec, q.shape[-2]
    scale = q.shape[-1] ** -0.5
    if spec.kind == "linear":
        import torch
        acc = q.dtype if (variant.options.linear_state_dtype == "model" or q.dtype == torch.float64) else torch.float32
        out, state = linear_attention_chunked(q, k, v, chunk=variant.options.linear_chunk, acc_dtype=acc)
        den = normaliser(q, k, acc_dtype=acc)
        return out, all(bool(torch.isfinite(x).all()) for x in (*state, den))
    window = spec.window if spec.kind == "sliding" else t
    return sliding_attention(q, k, v, window, scale), True


def relative_error(out, ref) -> tuple[float, str]:
    import torch
    out = out.to(torch.float64)
    if torch.isnan(out).any():
        return math.nan, "nan"
    if torch.isinf(out).any():
        return math.nan, "inf"
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300)), "ok"


def attention_stability(variants: Sequence[StabilityVariant] | None = None,
                        lengths: Sequence[int] = (128, 512, 1024, 2048, 4096),
                        dtypes: Sequence[str] = ("fp32", "bf16", "fp16"), *, heads: int = 4, head_dim: int = 64,
                        threshold: float = 1e-2, seed: int = 0, device: str = "cpu") -> list[StabilityRow]:
    """One row per (variant, dtype, length): relative error of the variant against its float64 self."""
    import torch

    variants = list(variants) if variants is not None else default_variants(heads)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"unknown dtype {bad[0]!r}; accepted: {', '.join(DTYPES)}")
    rows = []
    for t in lengths:
        gen = torch.Generator().manual_seed(seed + t)
        q = torch.randn(1, heads, t, head_dim, generator=gen, dtype=torch.float64).to(device)
        kv = torch.randn(2, 1, heads, t, head_dim, generator=gen, dtype=torch.float64).to(device)
        for variant in variants:
            k, v = kv
            if variant.spec.kind == "gqa":  # its own K/V heads: the first kv_heads of the draw
                if heads % variant.spec.kv_heads:
                    raise ValueError(f"{variant.label}: kv_heads must divide heads={heads}")
                k, v = k[:, :variant.spec.kv_heads], v[:, :variant.spec.kv_heads]
            ref = run_kernel(variant, q, k, v)[0]
            for name in dtypes:
                dt = getattr(torch, DTYPES[name])
                out, finite = run_kernel(variant, q.to(dt), k.to(dt), v.to(dt))
                err, status = relative_error(out, ref)
                if status == "ok" and not finite:
                    status = "overflow"
                elif status == "ok" and err > threshold:
                    status = "flagged"
                rows.append(StabilityRow(variant.label, name, t, err, status))
    return rows
