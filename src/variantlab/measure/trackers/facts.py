"""The variant's facts as built: size as stored, size resident, bits per weight, KV-cache cost.

Model size has one definition for every variant: the bytes of its weights as stored on disk (its
artifact's model.safetensors). What the weights occupy in memory once loaded (a packed format
may be unpacked for its kernel) is a separate row. Deterministic: measured once per variant.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..tracker import MetricDef, Output, Unconfigured


class FactsOutput(Output):
    recipe: str
    dtype: str
    parameters: int
    stored_bytes: int                # model.safetensors on disk
    resident_bytes: int | None       # the tensors as they run
    bits_per_weight: float
    kv_cache_bytes_per_token: int | None
    kv_cache_bytes_2048: int | None
    kernels: tuple[str, ...]
    notes: tuple[str, ...]
    attention: str | None


def _one(field: str):
    return lambda out: [] if getattr(out, field) is None else [float(getattr(out, field))]


@dataclass(frozen=True)
class Facts(Unconfigured):
    kind = "facts"
    remote_reason = "the endpoint's weights are not visible from the client"
    name = "facts"
    once = True
    output_model = FactsOutput

    def metrics(self) -> tuple[MetricDef, ...]:
        return (
            MetricDef("model_size", "Model size (weights as stored)", "B", True, "fact", _one("stored_bytes"),
                      headline=10),
            MetricDef("resident", "Weights in memory (as they run)", "B", True, "fact", _one("resident_bytes")),
            MetricDef("bits_per_weight", "Bits per weight (as stored)", "bits", None, "fact", _one("bits_per_weight")),
            MetricDef("kv_cache_per_token", "KV cache per token", "B", True, "fact", _one("kv_cache_bytes_per_token")),
            MetricDef("kv_cache_2048", "KV cache (or state) per 2048-token sequence", "B", True, "fact",
                      _one("kv_cache_bytes_2048")),
        )

    def run(self, ctx) -> FactsOutput:
        f = ctx.built.facts
        attn = f.attention
        stored = f.extra.get("artifact_bytes_on_disk", f.weight_bytes)
        return FactsOutput(
            recipe=f.recipe, dtype=f.dtype, parameters=f.parameters, stored_bytes=int(stored),
            resident_bytes=f.extra.get("resident_bytes"), bits_per_weight=8.0 * stored / max(f.parameters, 1),
            kv_cache_bytes_per_token=attn.kv_cache_bytes_per_token if attn else None,
            kv_cache_bytes_2048=attn.kv_cache_bytes_per_sequence.get("2048") if attn else None,
            kernels=tuple(f.kernels), notes=tuple(f.notes), attention=attn.attention if attn else None)
