"""Dtype recipes: the checkpoint as it is, in fp32, bf16 or fp16.

bf16/fp16 load every weight in 16 bits; transformers' Llama keeps RMSNorm's variance and the
softmax in fp32, so only the matrix products run in the 16-bit dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

from .artifact_size import FLOAT_WIDTHS, CheckpointWeights
from .facts import VariantFacts
from .recipe import NoOptions, cast_parameters, resident_bytes, weight_facts

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class DtypeRecipe:
    name: str
    description: str
    options_model: type = NoOptions

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, _TORCH_DTYPES[self.name])

    def unsupported_reason(self, device: str) -> str | None:
        if self.name == "fp32":
            return None
        import torch
        try:
            a = torch.ones(8, 8, dtype=self.torch_dtype, device=device)
            (a @ a).sum().item()
        except (RuntimeError, TypeError) as e:
            return f"{self.name} matmul is not available on {device}: {str(e).splitlines()[0]}"
        return None

    def load_dtype(self, options) -> object:
        return self.torch_dtype

    def artifact_bytes(self, options, weights: CheckpointWeights) -> int:
        """The weights file, estimated before building (artifact_size.py): every tensor at this dtype's width."""
        return weights.at_width(FLOAT_WIDTHS[self.name])

    def apply(self, model, options, device: str, context=None) -> VariantFacts:
        cast_parameters(model, self.torch_dtype)  # loading already gave this dtype; keeps RoPE in fp32
        params, nbytes = weight_facts(model)
        return VariantFacts(recipe=self.name, dtype=self.name, parameters=params, weight_bytes=nbytes,
                            bits_per_weight=8 * nbytes / max(params, 1),
                            kernels=(f"aten::mm ({self.name})",), extra={"resident_bytes": resident_bytes(model)})
