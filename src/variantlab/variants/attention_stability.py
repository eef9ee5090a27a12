"""Long-sequence numerical stability of attention: relative error against float64.

The analysis blamed linear attention for "long-sequence instability". Whether that is the kernel,
the dtype or the accumulator is a measurement, made two ways here:

`model_attention_error(model, lengths)` — the per-variant row "Attention rel. error vs fp64". It
measures the attention the built model really runs, not a reimplementation of it: the first decoder
layer's attention module *as it is* (its class and forward, the attention function its config
registers — transformers' sdpa/eager/any registered one — or, for a module swapped by
attention_module.py, its linear/sliding cache layer and kernel), with the projections taken out:

1. the arguments: the model runs a single-stream prefill of T tokens (input ids, a fresh
   DynamicCache, as backends/torch_engine.py does) and a forward pre-hook on the attention module
   records what its forward receives — the attention mask (or None, for is_causal), the rotary
   cos/sin, the position ids and any other keyword — then stops the model there (the embeddings,
   rotary table, mask and first input norm run; no attention or MLP does);
2. the projections: a shallow copy of the module gets q/k/v projections (or the fused one of Phi-3,
   GPT-2 or GPT-NeoX, filled in the layout its forward splits) that return fixed random
   q, k, v (unit normal, a fixed seed, the module's head counts and head_dim; drawn in float64 and
   rounded to the model's dtype, as a model in that dtype would have them; the reference gets the
   same rounded values, so only the attention's own arithmetic is counted) and an identity o_proj,
   so quantized projections (int kernels have no float64 form) and their error stay out of it;
3. the computation: that copy's own forward runs twice on the recorded arguments, once in the
   model's compute dtype and once in float64 (the same rotary cos/sin and mask values, upcast), each
   with a fresh DynamicCache; error = ||out - ref|| / ||ref|| over the whole output.

Nothing dispatches on an attention kind: whatever the module's forward calls is what runs. The one
adjustment the reference needs is for an accumulator fixed by configuration rather than by the
inputs' dtype: a swapped module's `variantlab_runtime.acc_dtype` (linear's state in fp32) is set to
follow the inputs, so the reference accumulates in float64 too. A function that hard-codes a
precision (transformers' eager softmax in fp32) keeps it in the reference, whose own error is then
~1e-7: fp32 rows of such a function read at most that much low.

`attention_stability(variants, lengths, dtypes)` — a kernel study without a model (kernels ×
dtypes × lengths), for benchmarks/attention_stability.py: random q, k, v through the package's
kernels (torch's causal scaled_dot_product_attention for sdpa/gqa, attention_sliding.py's banded
kernel for sliding:<w>, attention_linear.py's chunked form with its state in fp32 or in the model
dtype), once in float64 on unrounded inputs and once in each dtype (so it also counts the rounding
of q, k, v to that dtype).

Statuses, both ways: a non-finite output is "nan" or "inf", not a number; "overflow" when the output
stayed finite but a linear attention's state or normaliser did not (an infinite normaliser silently
turns outputs into 0): in the model path, a non-finite tensor held by the cache layer after the call,
or an output row exactly 0 where the float64 row is not; "flagged" over `threshold`; else "ok".
Pure: no clock, no state kept; the model is left as it was (the hook is removed, the module is not
mutated).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Sequence

from .attention import AttentionOptions, AttentionSpec, parse_attention
from .attention_kinds import attention_kind

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
    computed in q's dtype, by its kind's kernel (variants/attention_kinds.py)."""
    return attention_kind(variant.spec.kind).run_kernel(variant.spec, variant.options, q, k, v)


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
            try:
                k, v = attention_kind(variant.spec.kind).reference_kv(variant.spec, k, v)   # e.g. gqa's own heads
            except ValueError as e:
                raise ValueError(f"{variant.label}: {str(e).partition(': ')[2] or e}") from None
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


# ---------------------------------------------------------------------------------- the model's own path

# How a family's attention module holds its projections: (layout, input projections, output projection).
# "separate": q, k, v each; "concat": one projection whose output is [q | k | v] along the features
# (Phi-3's qkv_proj, GPT-2's c_attn); "per_head": one whose output is, per head, [q_h | k_h | v_h]
# (GPT-NeoX's query_key_value).
_LAYOUTS = (("separate", ("q_proj", "k_proj", "v_proj"), "o_proj"),
            ("concat", ("qkv_proj",), "o_proj"),
            ("concat", ("c_attn",), "c_proj"),
            ("per_head", ("query_key_value",), "dense"))


def _status(out, ref, threshold: float, held_finite: bool, heads: int) -> tuple[float, str]:
    """relative_error's, then "overflow" (something held went non-finite, or rows silently zeroed), then the
    threshold. out, ref: (B, T, H * Dv) as the module's forward returns them (o_proj is the identity)."""
    import torch

    err, status = relative_error(out, ref)
    if status != "ok":
        return err, status
    rows, ref_rows = out.unflatten(-1, (heads, -1)), ref.unflatten(-1, (heads, -1))  # (B, T, H, Dv)
    zeroed = ((rows == 0).all(-1) & (ref_rows != 0).any(-1)).any()
    if not held_finite or bool(zeroed):
        return err, "overflow"
    return err, "flagged" if err > threshold else "ok"


def _layout(module):
    """The entry of _LAYOUTS whose projections `module` holds, or None."""
    return next((entry for entry in _LAYOUTS if all(n in module._modules for n in (*entry[1], entry[2]))), None)


def attention_module(model):
    """The first attention module with projections of a known layout (the first decoder layer's self-attention)."""
    for m in model.modules():
        if _layout(m) is not None:
            return m
    known = "; ".join(f"{', '.join(inputs)} and {out}" for _, inputs, out in _LAYOUTS)
    raise ValueError(f"{type(model).__name__} has no attention module with projections of a known layout ({known})")


def describe(module) -> str:
    """A label for the path `module` runs: its class and attention function, or its swapped runtime."""
    runtime = getattr(module, "variantlab_runtime", None)
    name = type(module).__name__
    if runtime is not None:
        from .attention import _dtype_name
        layer = type(runtime.new_layer()).__name__
        extra = (f"window {runtime.window}" if runtime.window is not None
                 else f"state {_dtype_name(runtime.acc_dtype) if runtime.acc_dtype else 'in model dtype'}")
        return f"{name} / {layer}.attend ({runtime.kind}, {extra})"
    impl = module.config._attn_implementation
    if impl in (None, "eager"):
        return f"{name} / eager_attention_forward"
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    fn = ALL_ATTENTION_FUNCTIONS.get(impl)
    return f"{name} / {getattr(fn, '__name__', impl)}"


class _Captured(Exception):
    def __init__(self, args, kwargs):
        super().__init__("attention arguments captured")
        self.args_, self.kwargs = args, kwargs


def _capture(model, module, t: int, device):
    """(args, kwargs) the module's forward receives in a single-stream prefill of t tokens; the model stops there."""
    import torch
    from transformers import DynamicCache

    def stop(_, args, kwargs):
        raise _Captured(args, kwargs)

    handle = module.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        model(input_ids=torch.zeros(1, t, dtype=torch.long, device=device), past_key_values=DynamicCache(),
              use_cache=True)
    except _Captured as c:
        return c.args_, c.kwargs
    finally:
        handle.remove()
    raise ValueError(f"{type(model).__name__}'s forward never called {type(module).__name__}")


@functools.cache
def _fixed_type() -> type:
    from torch import nn

    class FixedProjection(nn.Module):
        """Returns the same (B, T, heads * D) tensor whatever it is given."""

        def __init__(self, x):
            super().__init__()
            self.x = x

        def forward(self, hidden_states):
            return self.x
    return FixedProjection


def _heads(model, module) -> tuple[int, int, int]:
    """(query heads, key/value heads, head_dim) the module's forward works with."""
    cfg = getattr(module, "config", None) or model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(module, "head_dim", None) or module.head_size   # GPT-NeoX calls it head_size
    return heads, heads // getattr(module, "num_key_value_groups", 1), head_dim


def _twin(module, q, k, v, reference: bool):
    """A shallow copy of `module` whose projections return q, k, v (B, H|Hkv, T, D), in the layout its
    forward splits (_LAYOUTS), and whose output projection is the identity; the module is untouched."""
    import copy

    import torch
    from torch import nn

    twin = copy.copy(module)
    twin._modules = dict(module._modules)
    kind, inputs, output = _layout(module)
    rows = [x.transpose(1, 2) for x in (q, k, v)]                       # (B, T, H|Hkv, D) each
    if kind == "separate":
        fixed = [r.flatten(2) for r in rows]
    elif kind == "concat":
        fixed = [torch.cat([r.flatten(2) for r in rows], dim=-1)]
    else:                                                               # per head: [q_h | k_h | v_h]
        fixed = [torch.cat(rows, dim=-1).flatten(2)]
    for name, x in zip(inputs, fixed):
        setattr(twin, name, _fixed_type()(x))
    setattr(twin, output, nn.Identity())
    runtime = getattr(module, "variantlab_runtime", None)
    if reference and runtime is not None and getattr(runtime, "acc_dtype", None) is not None:
        twin.variantlab_runtime = dataclasses.replace(runtime, acc_dtype=None)  # accumulate in the inputs' float64
    return twin


def _held_finite(cache) -> bool:
    """Every floating tensor the cache's layers hold after the call (keys, values, linear state) is finite."""
    import torch

    for layer in getattr(cache, "layers", []):
        for value in vars(layer).values():
            for x in value if isinstance(value, (tuple, list)) else (value,):
                if torch.is_tensor(x) and x.is_floating_point() and not bool(torch.isfinite(x).all()):
                    return False
    return True


def _run(module, args, kwargs, q, k, v, dtype, reference: bool = False):
    """(output (B, T, H * Dv), cache held finite?) of the module's own forward on q, k, v in `dtype`."""
    import torch
    from transformers import DynamicCache

    args, kwargs = list(args), dict(kwargs)
    key = "hidden_states" if "hidden_states" in kwargs else None
    hidden = kwargs[key] if key else args[0]
    dummy = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device)  # only its shape is read
    if key:
        kwargs[key] = dummy
    else:
        args[0] = dummy
    if kwargs.get("position_embeddings") is not None:
        kwargs["position_embeddings"] = tuple(x.to(dtype) for x in kwargs["position_embeddings"])
    cache = DynamicCache()
    names = [n for n in ("past_key_values", "layer_past", "past_key_value") if n in kwargs]   # NeoX: layer_past
    for name in names or ["past_key_values"]:
        kwargs[name] = cache
    twin = _twin(module, q.to(dtype), k.to(dtype), v.to(dtype), reference)
    out = twin(*args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    return out, _held_finite(cache)


def model_attention_error(model, lengths: Sequence[int], *, threshold: float = 1e-2, seed: int = 0,
                          device=None, label: str | None = None) -> list[StabilityRow]:
    """One row per length: relative error of the model's own attention (first decoder layer, projections
    isolated) in its compute dtype against the same computation in float64. See the module docstring."""
    import torch

    from .attention import _dtype_name

    module = attention_module(model)
    if device is None:
        device = next(model.parameters()).device
    heads, kv_heads, head_dim = _heads(model, module)
    label = label or describe(module)
    rows = []
    with torch.inference_mode():
        for t in lengths:
            args, kwargs = _capture(model, module, t, device)
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            dtype = hidden.dtype
            gen = torch.Generator().manual_seed(seed + t)
            q = torch.randn(1, heads, t, head_dim, generator=gen, dtype=torch.float64).to(hidden.device)
            k, v = torch.randn(2, 1, kv_heads, t, head_dim, generator=gen, dtype=torch.float64).to(hidden.device)
            rounded = [x.to(dtype).to(torch.float64) for x in (q, k, v)]  # the reference sees the same inputs
            ref, _ = _run(module, args, kwargs, *rounded, torch.float64, reference=True)
            out, held_finite = _run(module, args, kwargs, q, k, v, dtype)
            err, status = _status(out, ref, threshold, held_finite, heads)
            rows.append(StabilityRow(label, _dtype_name(dtype), t, err, status))
    return rows
