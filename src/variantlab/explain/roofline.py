"""The roofline of a decode token: what it must move and compute, and what share of that floor a run reached.

Pure functions. A decode step of a dense transformer must read every weight once (as it is held:
int4 weights at their real bit width, scales included) and the KV cache up to its context, and
compute 2 FLOPs per weight plus its attention (q·Kᵀ and p·V: 4 · heads · head_dim FLOPs per cached
position per layer). The floor is the slower of moving those bytes at the machine's read bandwidth
and doing those FLOPs at its matmul rate (hardware.py measures both); the fraction of the floor a
step reached is floor ÷ its measured time. A step that reaches under OVERHEAD_BELOW of its floor is
"overhead-bound": neither memory nor arithmetic is what it is waiting for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

OVERHEAD_BELOW = 0.5


@dataclass(frozen=True)
class StepCost:
    bytes: float    # that must move
    flops: float    # that must be done


@dataclass(frozen=True)
class ModelShape:
    """What a decode step's cost depends on: the weights as held and the attention's geometry."""

    weight_bytes: int        # read per token (variants/recipe.decode_weight_bytes)
    linear_params: int       # weights multiplied per token (2 FLOPs each)
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_element: int


@dataclass(frozen=True)
class Roofline:
    achieved_gbps: float
    achieved_tflops: float
    floor_s: float
    fraction_of_floor: float
    bound: str               # "memory" | "compute": which ceiling sets the floor
    verdict: str             # "memory-bound" | "compute-bound" | "overhead-bound"

    def line(self) -> str:
        return (f"{self.verdict}: {self.fraction_of_floor:.0%} of the {self.bound} floor "
                f"({self.achieved_gbps:.1f} GB/s, {self.achieved_tflops * 1e3:.1f} GFLOP/s)")


def decode_cost(shape: ModelShape, context: float) -> StepCost:
    """One decode token at `context` cached positions."""
    if context < 0:
        raise ValueError(f"context must be ≥ 0, not {context}")
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * context * shape.kv_bytes_per_element
    attention = 4 * shape.layers * shape.heads * shape.head_dim * context
    return StepCost(shape.weight_bytes + kv, 2 * shape.linear_params + attention)


def per_token_decode_cost(shape: ModelShape, context: float, batch: int = 1) -> StepCost:
    """One token's share of a decode step of `batch` rows at `context` cached positions each: the
    weights are read once a step, so each row's token carries 1/batch of them; its KV cache is its own."""
    if batch < 1:
        raise ValueError(f"batch must be ≥ 1, not {batch}")
    one = decode_cost(shape, context)
    kv = one.bytes - shape.weight_bytes
    return StepCost(shape.weight_bytes / batch + kv, one.flops)


def per_token_prefill_cost(shape: ModelShape, prompt_tokens: float, batch: int = 1) -> StepCost:
    """One prompt token's share of a prefill of `batch` prompts of `prompt_tokens` each: the weights are
    read once for the whole pass, each token's K and V written once, 2 FLOPs per weight per token, and
    causal attention over the tokens before it (on average (T + 1) / 2 positions)."""
    if prompt_tokens < 1 or batch < 1:
        raise ValueError(f"prompt_tokens and batch must be ≥ 1, not {prompt_tokens} and {batch}")
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * shape.kv_bytes_per_element
    attention = 4 * shape.layers * shape.heads * shape.head_dim * (prompt_tokens + 1) / 2
    return StepCost(shape.weight_bytes / (batch * prompt_tokens) + kv, 2 * shape.linear_params + attention)


def roofline(cost: StepCost, seconds: float, read_gbps: float, peak_tflops: float | None) -> Roofline:
    """Where a step of `seconds` stands against the machine's ceilings (peak None: memory only)."""
    for name, value in (("seconds", seconds), ("read_gbps", read_gbps)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, not {value!r}")
    memory_s = cost.bytes / (read_gbps * 1e9)
    compute_s = cost.flops / (peak_tflops * 1e12) if peak_tflops and math.isfinite(peak_tflops) else 0.0
    floor_s = max(memory_s, compute_s)
    bound = "memory" if memory_s >= compute_s else "compute"
    fraction = floor_s / seconds
    verdict = f"{bound}-bound" if fraction >= OVERHEAD_BELOW else "overhead-bound"
    return Roofline(cost.bytes / seconds / 1e9, cost.flops / seconds / 1e12, floor_s, fraction, bound, verdict)


def model_shape(model, weight_bytes: int) -> ModelShape:
    """A transformers causal LM's shape: its config's heads and layers, its linear layers' weights
    (quantized ones by their logical size), and the KV cache's element size (the model's dtype)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    from ..variants.quant_linear import QuantLinear
    cfg = getattr(model.config, "text_config", None) or model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D)))
    linear += sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantLinear)
                  and hasattr(m, "in_features"))
    dtype = getattr(model, "dtype", torch.float32)
    return ModelShape(weight_bytes, linear, cfg.num_hidden_layers, heads,
                      getattr(cfg, "num_key_value_heads", None) or heads, head_dim,
                      torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 2)
