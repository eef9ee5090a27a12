"""Attention error: the model's own attention path in its compute dtype against float64.

Measured on the loaded variant (variants/attention_stability.py `model_attention_error`), at the
lengths the workload reaches (the length sweep's, else 512 and 2048 tokens), none past a learned
position table: on GPT-2 (1,024 positions) 2,048 tokens raised IndexError and left the row empty, so
planning caps them at the table (`stability_within`) and the row's note says so. A non-finite output or
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
    capped: str | None = None       # why the lengths stop short of the workload's (the row's note)
    kind = "stability"
    remote_reason = "the attention-error check needs the model's attention modules"
    needs_torch_model = True
    name = "stability"
    once = True
    output_model = StabilityOutput

    def config(self) -> dict:
        return {"lengths": list(self.lengths)} | ({"capped": self.capped} if self.capped else {})

    @classmethod
    def from_config(cls, config: dict) -> "Stability":
        return cls(tuple(config.get("lengths") or DEFAULT_LENGTHS), config.get("capped"))

    def metrics(self) -> tuple[MetricDef, ...]:
        capped = self.capped
        return (MetricDef("attention_error", f"Attention rel. error vs fp64 @{max(self.lengths)} tokens", "rel",
                          True, "fact", _longest, with_delta=False, note=lambda out: capped),)

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


def stability_within(lengths, position_limit: tuple[int, str] | None) -> Stability:
    """The check at `lengths`, each capped at `position_limit` ((positions, why): a learned position table,
    models/checks.position_limit) with the note saying so; as asked when nothing is past it."""
    lengths = tuple(sorted(set(lengths)))
    if position_limit is None or lengths[-1] <= position_limit[0]:
        return Stability(lengths)
    most, why = position_limit
    kept = tuple(sorted({min(n, most) for n in lengths}))
    return Stability(kept, f"capped at the model's {most} positions ({why}): measured at "
                           f"{', '.join(map(str, kept))} tokens, not {', '.join(map(str, lengths))}")
