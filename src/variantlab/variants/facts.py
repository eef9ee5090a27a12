"""What a built variant is, as typed records: `VariantFacts` (its size as stored and how it computes) and the
`AttentionFacts` inside it (its attention mechanism and what its cache costs).

Both are payloads (payloads.Payload): frozen, read by attribute or by the key of the JSON they are written as.
That JSON is the shape artifacts and stored records have always had: the attention facts sit in
`facts.extra.attention`, where a variant of an earlier version has them, so its artifacts and runs read back
unchanged. `extra` holds the recipe's own details (quantized layers, a mixed plan, calibration digests):
open keys that only that recipe and its tests read."""
from __future__ import annotations

from typing import Any

from pydantic import Field, model_serializer, model_validator

from ..payloads import Payload


class AttentionFacts(Payload):
    """A variant's attention: its kind, shape, and the bytes its cache (or fixed state) holds."""

    attention: str                          # the spec as given ("gqa:4"), or "model's own"
    kind: str                               # the attention kind (variants/attention_kinds.py)
    implementation: str | None = None       # transformers' attention implementation it runs through
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    cache_dtype: str
    window: int | None = None               # a sliding window's size (None: the cache grows with the sequence)
    kv_cache_bytes_per_token: int
    state_bytes_per_sequence: int = 0       # a fixed state's bytes (linear attention)
    linear_state_dtype: str | None = None
    kv_cache_bytes_max: int | None = None   # None: unbounded
    kv_cache_bytes_per_sequence: dict[str, int] = Field(default_factory=dict)   # length → bytes
    kernels: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def cache_bytes(self, seq_len: int, batch: int = 1) -> int:
        """Bytes of KV cache (or linear state) `batch` sequences of `seq_len` tokens hold."""
        tokens = seq_len if self.window is None else min(seq_len, self.window)
        return batch * (self.kv_cache_bytes_per_token * tokens + self.state_bytes_per_sequence)


class VariantFacts(Payload):
    """What a built variant is: its size as stored and how it computes."""

    recipe: str                                 # "endpoint" for a variant built nowhere
    dtype: str | None = None
    parameters: int | None = None               # None: a backend that builds nothing (its size is not known)
    weight_bytes: int | None = None
    bits_per_weight: float | None = None
    kernels: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    attention: AttentionFacts | None = None     # in the JSON: extra.attention
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _attention_from_extra(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("extra"), dict) and "attention" in data["extra"]:
            extra = dict(data["extra"])
            moved = extra.pop("attention")
            data = {**data, "extra": extra, "attention": data.get("attention") or moved}
        return data

    @model_serializer(mode="wrap")
    def _attention_in_extra(self, handler) -> dict:
        out = handler(self)
        attention = out.pop("attention", None)
        if attention is not None:
            out["extra"] = {**out["extra"], "attention": attention}
        return out
