"""Attention error: the model's own attention path in its compute dtype against float64.

Measured on the loaded variant (variants/attention_stability.py `model_attention_error`), at the
lengths the workload reaches (the length sweep's, else 512 and 2048 tokens). A non-finite output or
an overflowed linear-attention state is reported as such, never as a number; an error over the
threshold is flagged and warned about. Deterministic: measured once per variant.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..tracker import MetricDef, Output, Problem, TrackerBase

DEFAULT_LENGTHS = (512, 2048)


class StabilityRowOutput(Output):
    variant: str
    dtype: str
    length: int
    rel_error: float | None     # None: the output was not finite
    status: str                 # ok | flagged | nan | inf | overflow


class StabilityOutput(Output):
    rows: tuple[StabilityRowOutput, ...]


def _longest(out: StabilityOutput):
    if not out.rows:
        return []
    last = max(out.rows, key=lambda r: r.length)
    if last.rel_error is None or not math.isfinite(last.rel_error):
        return Problem(f"{last.status} at {last.length} tokens")
    return [last.rel_error]


@dataclass(frozen=True)
class Stability(TrackerBase):
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    kind = "stability"
    remote_reason = "the attention-error check needs the model's attention modules"
    name = "stability"
    once = True
    output_model = StabilityOutput

    def config(self) -> dict:
        return {"lengths": list(self.lengths)}

    @classmethod
    def from_config(cls, config: dict) -> "Stability":
        return cls(tuple(config.get("lengths") or DEFAULT_LENGTHS))

    def metrics(self) -> tuple[MetricDef, ...]:
        return (MetricDef("attention_error", f"Attention rel. error vs fp64 @{max(self.lengths)} tokens", "rel",
                          True, "fact", _longest, with_delta=False),)

    def run(self, ctx) -> StabilityOutput:
        from ...variants.attention_stability import model_attention_error
        rows = model_attention_error(ctx.built.model, list(self.lengths))
        return StabilityOutput(rows=tuple(StabilityRowOutput(**r.to_json()) for r in rows))

    @staticmethod
    def warnings(variant: str, out: StabilityOutput) -> list[str]:
        """Plain-words warnings for the rows over threshold or not finite."""
        return [f"{variant}: attention in {r.dtype} at {r.length} tokens is {r.status} (relative error "
                f"{'not finite' if r.rel_error is None else f'{r.rel_error:.3g}'} against float64)"
                for r in out.rows if r.status != "ok"]
