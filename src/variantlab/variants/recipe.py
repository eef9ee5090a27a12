"""The recipe seam: a recipe is data that turns a loaded checkpoint into a variant.

Two steps, as in gpt-fast: `load_dtype` says in which dtype to load the checkpoint, `apply`
converts the loaded model in place and returns facts about what was built. Model code knows
nothing of recipes. Adding a recipe is one line in `RECIPES` (variants/registry.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from ..spec_model import SpecModel
from .facts import VariantFacts


class NoOptions(SpecModel):
    """A recipe without options: any key is unknown."""


@dataclass(frozen=True)
class BuildContext:
    """What a recipe may use besides the model: the checkpoint's tokenizer and calibration text
    (the suite's `calibration:` dataset, else its workload's prompts and answers)."""

    tokenizer: Any = None
    calibration_texts: tuple[str, ...] = ()


class Recipe(Protocol):
    name: str
    description: str
    options_model: type[BaseModel]

    def unsupported_reason(self, device: str) -> str | None:
        """None when the device can run this recipe; else why not (reported as 'unsupported')."""

    def load_dtype(self, options: BaseModel) -> Any:
        """torch dtype to load the checkpoint in."""

    def apply(self, model: Any, options: BaseModel, device: str, context: BuildContext | None = None) -> VariantFacts:
        """Convert the loaded model in place; return facts about the result."""

    def artifact_bytes(self, options: BaseModel, weights: Any) -> int:
        """The bytes its artifact's weights file will take for a checkpoint of these tensors
        (artifact_size.CheckpointWeights), estimated before building: the disk budget reads it."""


def weight_facts(model) -> tuple[int, int]:
    """(parameters, bytes) of a model's persistent state as stored (its state_dict); tied tensors count once."""
    seen: set[tuple[int, int, int]] = set()
    params = nbytes = 0
    for t in model.state_dict().values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key in seen:
            continue
        seen.add(key)
        nbytes += t.numel() * t.element_size()
        params += t.numel()
    return params, nbytes


def resident_bytes(model) -> int:
    """Bytes of a model's weights as they run: parameters and persistent buffers in memory, tied tensors
    once. The same as `weight_facts`' stored bytes unless a module runs another form than it stores
    (W4A8: int4 packed two a byte as stored, unpacked to int8 as it runs). Buffers the config computes
    (RoPE's inv_freq, not saved) count in neither."""
    seen: set[tuple[int, int, int]] = set()
    nbytes = 0
    for m in model.modules():
        buffers = (b for name, b in m._buffers.items() if name not in m._non_persistent_buffers_set)
        for t in (*m._parameters.values(), *buffers):
            if t is None:
                continue
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
            if key not in seen:
                seen.add(key)
                nbytes += t.numel() * t.element_size()
    return nbytes


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step must read: every weight as it runs, except that the input
    embedding table is only looked up (one row a token) unless the LM head shares it (then the head
    reads all of it)."""
    total = resident_bytes(model)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    table = getattr(emb, "weight", None)
    if table is None or (head is not None and getattr(head, "weight", None) is table):
        return total
    row = sum(t.numel() * t.element_size() for t in (*emb.parameters(), *emb.buffers())) // max(table.shape[0], 1)
    return total - resident_bytes(emb) + row


def cast_parameters(model, dtype) -> None:
    """Cast floating-point parameters (and persistent buffers) to dtype, leaving the rotary
    embedding's non-persistent inv_freq in the fp32 that loading gave it: `model.to(bf16)` would
    round it too and shift every position (KLD 1.5e-5 on the reference model from that alone)."""
    persistent = {name for name, _ in model.state_dict().items()}
    for name, p in model.named_parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    for name, b in model.named_buffers():
        if name in persistent and b.is_floating_point() and b.dtype != dtype:
            b.data = b.data.to(dtype)
