"""`compile: true`: torch.compile (inductor) of what the engine runs per token.

A runtime setting, applied by the measuring host after the variant loads and timed as its own
cold-start stage. Over the engine's preallocated (static) KV cache, the whole decode step is
compiled with static shapes, as gpt-fast does (`TorchEngine.compile_decode_step`); a model whose
attention keeps cache layers of its own (variantlab's linear and sliding kinds) has no static cache,
and only its decoder MLPs are compiled (dynamic shapes). The worker's `compile_warmup` (measure/process.py) then runs the shapes the
scenarios start with (one request, a batch of two) so that compilation happens there; the
scenarios' own warm-up covers the other shapes, never a timed request.
"""
from __future__ import annotations


from ..errors import RecipeError


def compile_variant(engine, model, facts):
    """Compile the engine's decode step (static cache) or else the model's decoder MLPs; facts say which."""
    if engine.compile_decode_step():
        return facts.replace(
            kernels=facts.kernels + ("torch.compile (inductor, static shapes) of the whole decode step",),
            extra={**facts.extra, "compile": {"backend": "inductor", "dynamic": False, "scope": "decode step"}})
    return compile_decoder_mlps(model, facts)


def compile_decoder_mlps(model, facts):
    """Compile every decoder layer's .mlp in place; facts with the kernel and settings added."""
    import torch

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(layer, "mlp") for layer in layers):
        raise RecipeError(f"compile: true needs decoder layers with an .mlp; {type(model).__name__} has none",
                          field="compile", accepted="a Llama/Mistral/Qwen2-style model, or compile: false")
    for layer in layers:
        layer.mlp = torch.compile(layer.mlp, dynamic=True)
    return facts.replace(kernels=facts.kernels + ("torch.compile (inductor, dynamic) of decoder MLPs",),
                               extra={**facts.extra, "compile": {"backend": "inductor", "dynamic": True,
                                                                 "scope": "decoder MLPs"}})
