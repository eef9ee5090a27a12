"""`compile: true`: torch.compile (inductor, dynamic shapes) of each decoder layer's MLP.

A runtime setting, applied by the measuring host after the variant loads and timed as its own
cold-start stage; `compile_warmup` then runs the shapes the scenarios use (one request, a batch of
two) so that compilation happens there, never inside a measurement. Attention and the KV cache stay
eager: transformers' DynamicCache mutates Python state, which breaks graphs on every token.
"""
from __future__ import annotations

import dataclasses

from ..errors import RecipeError


def compile_decoder_mlps(model, facts):
    """Compile every decoder layer's .mlp in place; facts with the kernel and settings added."""
    import torch

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(layer, "mlp") for layer in layers):
        raise RecipeError(f"compile: true needs decoder layers with an .mlp; {type(model).__name__} has none",
                          field="compile", accepted="a Llama/Mistral/Qwen2-style model, or compile: false")
    for layer in layers:
        layer.mlp = torch.compile(layer.mlp, dynamic=True)
    return dataclasses.replace(facts, kernels=facts.kernels + ("torch.compile (inductor, dynamic) of decoder MLPs",),
                               extra={**facts.extra, "compile": {"backend": "inductor", "dynamic": True,
                                                                 "scope": "decoder MLPs"}})


def compile_warmup(backend, prompts) -> None:
    """Run one request and a batch of two, so that inductor compiles the shapes scenarios will use."""
    from ..backends.base import GenerationRequest, run_requests

    prompts = list(prompts[:2]) * (2 if len(prompts) < 2 else 1)
    run_requests(backend, [GenerationRequest("compile", prompt=prompts[0], max_new_tokens=3)])
    run_requests(backend, [GenerationRequest(f"compile-{i}", prompt=p, max_new_tokens=3)
                           for i, p in enumerate(prompts[:2])])
