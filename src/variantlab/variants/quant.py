"""Quantization recipes: int8 (W8A16), w8a8, int4 (W4A16), w4a8 ("Flash") and sparse (2:4 + int8).

Two steps, as in gpt-fast: the worker loads the checkpoint in `load_dtype` (the compute dtype, so
that peak memory never holds an fp32 copy), then `apply` quantizes every nn.Linear it targets (and
every transformers Conv1D, GPT-2's transposed linear: quant_linear.as_linear) and swaps it in place for
a module of quant_linear.py; model code knows nothing of this. Embeddings (unless quantize_embeddings:
int8 rows, one scale per row; a scaled embedding, Gemma's, is quantized with its scale folded in),
norms and the LM head stay in the compute dtype unless an option says otherwise.

What each recipe runs, and its cost, is in quant_linear.py's docstring; the measured per-layer
timings come from benchmarks/quant_kernels.py. `unsupported_reason` does not trust names: it runs
the recipe's kernel on a small layer on the device and checks it against the dequantized
reference, so "unsupported" means "this torch build on this device cannot run it".

The analysis describes variants as (weight_dtype, activation_dtype, quant_scheme);
`recipe_from_analysis_vocabulary` maps those words to a recipe name and options.

References: gpt-fast quantize.py (two-step recipes, tinygemm int4 layout); torchao's int4/int8
CPU layouts; aten/src/ATen/native/cpu/int4mm_kernel.cpp (kernel conventions).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from ..errors import RecipeError, UnsupportedOnHardware
from ..spec_model import SpecModel
from .artifact_size import FLOAT_WIDTHS, CheckpointWeights, int4_bytes, int8_bytes
from .linear_widths import architecture, by_width, quantized_in_features, undivided
from .facts import VariantFacts
from .recipe import cast_parameters, resident_bytes, weight_facts

GROUP_SIZES = (32, 64, 128)
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class QuantOptions(SpecModel):
    compute_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    dequant: Literal["kernel", "python"] = "kernel"
    quantize_embeddings: bool = False   # true: the input embedding table in int8, one scale per row
    quantize_lm_head: bool = False


class GroupQuantOptions(QuantOptions):
    group_size: Literal[32, 64, 128] = 64
    pad_to_group: bool = False  # zero-pad in_features up to a multiple of group_size where it does not divide
    symmetric: bool = False     # a scale per group and no zero point (llama.cpp's Q4_0): 4 + 16/group_size bits


@dataclass(frozen=True)
class QuantRecipe:
    name: str
    description: str
    module: str  # class name in quant_linear
    weights: str
    activations: str  # "compute" (the compute dtype) or "int8"
    scheme: str
    options_model: type = QuantOptions
    cuda_only: bool = False

    @property
    def grouped(self) -> bool:
        return self.options_model is GroupQuantOptions

    def device_reason(self, device: str) -> str | None:
        """Why `device` cannot run this recipe, told from the device's name alone (no torch): planning asks it."""
        dev = device.split(":")[0]
        if self.cuda_only and dev != "cuda":
            return (f"unsupported on this hardware: {self.name} (2:4 semi-structured sparsity + int8) needs CUDA "
                    f"with cuSPARSELt (compute capability 8.0+); torch has no {dev} kernel for it")
        return None

    def unsupported_reason(self, device: str) -> str | None:
        return self.device_reason(device) or _kernel_probe(self.module, device, "bf16", 64 if self.grouped else 0)

    def check_config(self, options: dict, config: dict, *, variant: str, file: str | None = None,
                     field: str | None = None) -> tuple[str, ...]:
        """Planning's check of the options against the checkpoint's config.json (no torch): raises RecipeError
        for what cannot be built; returns what to say before measuring (nothing, here)."""
        if self.grouped:
            opts = self.options_model.model_validate(options)
            check_group_size_for(config, opts, lm_head=opts.quantize_lm_head, variant=variant, file=file,
                                 field=f"{field}.options.group_size" if field else "group_size")
        return ()

    def load_dtype(self, options):
        import torch
        return getattr(torch, _DTYPES[options.compute_dtype])

    def artifact_bytes(self, options, weights: CheckpointWeights) -> int:
        """The weights file, estimated before building (artifact_size.py): each linear in int4 groups or int8 rows
        (2:4 sparse stores less than int8 rows), what the options name (the LM head, the embeddings) with them,
        the rest in the compute dtype."""
        width = FLOAT_WIDTHS[options.compute_dtype]
        linear = ((lambda s: int4_bytes(s, options.group_size, width)) if self.grouped
                  else (lambda s: int8_bytes(s, width)))
        return weights.quantized(linear, width, lm_head=options.quantize_lm_head,
                                 embeddings=options.quantize_embeddings)

    def apply(self, model, options, device: str, context=None) -> VariantFacts:
        from . import quant_linear as ql

        dtype = self.load_dtype(options)
        targets, kept = _targets(model, self.name, options.quantize_lm_head)
        group = {"group_size": options.group_size, "symmetric": options.symmetric} if self.grouped else {}
        if self.grouped and not options.pad_to_group:
            _check_group_size(targets, options.group_size)
        if device.startswith("cuda") and self.activations == "int8":
            _check_int_mm_shapes(targets, self.name)
        if options.dequant == "kernel":
            _require_kernel(self.module, device, options.compute_dtype, group.get("group_size", 0))
        parameters = weight_facts(model)[0]  # logical weights, before packing
        tied_head = _tied_head_quantized(model, targets)
        cls = getattr(ql, self.module)
        swapped = []
        targets.reverse()
        while targets:  # pop each layer as it is swapped, so that its unquantized weight can be freed at once
            name, linear = targets.pop()
            new = cls(linear, dtype, options.dequant, **group)
            model.set_submodule(name, new)
            swapped.append(new)
        del linear
        split_tie = False
        if options.quantize_embeddings:
            split_tie = _head_tied_to_embeddings(model)   # the head, kept, shares the table about to be swapped
            swapped.append(_quantize_embeddings(model, dtype, options.dequant))
        cast_parameters(model, dtype)  # everything not swapped: embeddings, norms, kept linears
        facts = _facts(self, model, options, parameters, swapped, kept, tied_head)
        return _with_split_tie_note(facts, model, options) if split_tie else facts


def _quantize_embeddings(model, dtype, path: str):
    """Swap the input embedding table for its int8 form (the LM head keeps its own weight if tied).

    An embedding that multiplies its rows by a constant (Gemma's `embed_scale`, sqrt(hidden)) is
    quantized as the scaled table it returns, so the int8 module needs no scale of its own."""
    import torch
    from torch import nn

    from . import quant_linear as ql

    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if not isinstance(emb, nn.Embedding):
        raise RecipeError(f"quantize_embeddings: {type(model).__name__}'s input embeddings are "
                          f"{type(emb).__name__}, not nn.Embedding", field="quantize_embeddings",
                          accepted="false for this model")
    scale = getattr(emb, "embed_scale", None)
    if scale is not None:  # the table as forward returns it: rows × the scale in the weight's dtype
        w = emb.weight.detach()
        scaled = nn.Embedding(emb.num_embeddings, emb.embedding_dim, emb.padding_idx, device="meta")
        scaled.weight = nn.Parameter(w * torch.as_tensor(scale).to(w.dtype), requires_grad=False)
        emb = scaled
    new = ql.Int8Embedding(emb, dtype, path)
    model.set_input_embeddings(new)
    return new


def _is_linear(m) -> bool:
    """nn.Linear, or transformers' Conv1D (GPT-2: the same layer with its weight stored [in, out])."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D
    return isinstance(m, (nn.Linear, Conv1D))


def _features(m) -> tuple[int, int]:
    """(in_features, out_features) of an nn.Linear or a Conv1D (weight [in, out], `nx` → `nf`)."""
    return (m.in_features, m.out_features) if hasattr(m, "in_features") else (m.nx, m.nf)


def _targets(model, recipe: str, quantize_lm_head: bool):
    """(name, layer) pairs to swap (nn.Linear or Conv1D, as the model holds them) and the names of
    linears kept; refuse what cannot be swapped."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets, kept = [], []
    for name, m in model.named_modules():
        if _is_linear(m):
            if m is head and not quantize_lm_head:
                kept.append(name)
            else:
                targets.append((name, m))
    if not targets:
        raise RecipeError(f"no quantizable layers: {type(model).__name__} has no nn.Linear or Conv1D layers"
                          + (f" besides the LM head ({', '.join(kept)})" if kept else ""),
                          accepted="a causal LM with nn.Linear projections, or quantize_lm_head: true")
    return targets, kept


def _check_group_size(targets, group_size: int) -> None:
    bad = [(n, _features(m)[0]) for n, m in targets if _features(m)[0] % group_size]
    if not bad:
        return
    name, k = bad[0]
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise RecipeError(f"group_size {group_size} does not divide in_features {k} of layer '{name}'{more}",
                      field="group_size", accepted=group_size_fixes([_features(m)[0] for _, m in targets]))


def group_size_fixes(widths) -> str:
    """What to write instead of a group size that does not divide every in_features in `widths`."""
    widths = sorted(set(widths))
    fits = [g for g in GROUP_SIZES if all(k % g == 0 for k in widths)]
    if fits:
        return f"group_size {' | '.join(map(str, fits))} for this model, or pad_to_group: true"
    return (f"pad_to_group: true, which zero-pads in_features to a multiple of group_size: none of "
            f"{' | '.join(map(str, GROUP_SIZES))} divides every in_features ({', '.join(map(str, widths))})")


def check_group_size_for(config: dict, options, *, lm_head: bool, variant: str, file: str | None = None,
                         field: str | None = None) -> None:
    """Refuse, from config.json alone, a group size that does not divide the in_features of a layer the recipe
    quantizes (linear_widths.py); pass where the architecture's layer shapes are not known there."""
    widths = quantized_in_features(config, lm_head=lm_head)
    if widths is None or options.pad_to_group or not (bad := undivided(widths, options.group_size)):
        return
    raise RecipeError(f"variant '{variant}': group_size {options.group_size} does not divide in_features "
                      f"{by_width(bad)} in each layer of {architecture(config)} (read from its config.json)",
                      file=file, field=field, accepted=group_size_fixes(widths.values()))


def _check_int_mm_shapes(targets, recipe: str) -> None:
    bad = [(n, _features(m)) for n, m in targets if _features(m)[0] % 8 or _features(m)[1] % 8]
    if bad:
        n, (k, m) = bad[0]
        raise UnsupportedOnHardware(f"{recipe} on cuda: torch._int_mm needs in/out features divisible by 8; "
                                    f"layer '{n}' is {k}→{m}")


def _head_tied_to_embeddings(model) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return (getattr(head, "weight", None) is not None and getattr(emb, "weight", None) is not None
            and head.weight.data_ptr() == emb.weight.data_ptr())


def _with_split_tie_note(facts: VariantFacts, model, options) -> VariantFacts:
    """quantize_embeddings on a model whose LM head is tied to its embeddings (and kept): the head keeps
    the compute-dtype table and the int8 table comes beside it, so the variant is larger than the same
    recipe with the tie kept. Say so, with the sizes."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    head_bytes = head.weight.numel() * head.weight.element_size()
    emb_bytes = sum(t.numel() * t.element_size() for t in emb.state_dict().values())
    tied_bytes = facts.weight_bytes - emb_bytes   # the head's table serving both again
    note = (f"quantize_embeddings split the LM head's tie to the input embeddings: the head keeps its own "
            f"{options.compute_dtype} copy ({_mib(head_bytes)}) beside the int8 table ({_mib(emb_bytes)}), so the "
            f"weights take {_mib(facts.weight_bytes)} against {_mib(tied_bytes)} with the tie kept "
            f"(quantize_embeddings: false)")
    return facts.replace(notes=facts.notes + (note,), extra={**facts.extra, "weight_bytes_with_tie_kept": tied_bytes})


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _tied_head_quantized(model, targets) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return (head is not None and emb is not None and any(m is head for _, m in targets)
            and head.weight.data_ptr() == emb.weight.data_ptr())


def _facts(recipe: QuantRecipe, model, options, parameters: int, swapped, kept, tied_head: bool) -> VariantFacts:
    params_q = sum(m.logical_parameters for m in swapped)
    bytes_q = sum(t.numel() * t.element_size() for m in swapped for t in m.state_dict().values())
    _, nbytes = weight_facts(model)
    kernels = list(dict.fromkeys(m.kernel for m in swapped))
    if any(_is_linear(m) for m in model.modules()):
        kernels.append(f"aten::mm ({options.compute_dtype})")
    notes = list(dict.fromkeys(n for m in swapped for n in m.notes))
    if kept:
        notes.append(f"kept in {options.compute_dtype}: {', '.join(kept)} (quantize_lm_head: true quantizes it)")
    if tied_head:
        notes.append("the LM head was tied to the embeddings: the quantized head is a second copy, "
                     "so bytes exceed the untied count")
    if any(m.device_type == "cuda" for m in swapped) and options.dequant == "kernel":
        notes.append("the CUDA kernel paths are untested in CI (no GPU there); the build-time probe checked "
                     "this layer type against its dequantized reference on this device")
    if options.compute_dtype == "fp16" and not any(p.is_cuda for p in model.parameters()):
        notes.append("fp16 on CPU: unquantized matmuls (LM head, attention) may run far slower than bf16")
    extra = {"weights": recipe.weights, "activations": (options.compute_dtype if recipe.activations == "compute"
                                                        else recipe.activations),
             "scheme": recipe.scheme, "dequant": options.dequant, "quantized_layers": len(swapped),
             "quantized_parameters": params_q, "quantized_bytes": bytes_q,
             "quantized_bits_per_weight": 8 * bytes_q / max(params_q, 1), "resident_bytes": resident_bytes(model)}
    if recipe.grouped:
        extra.update(group_size=options.group_size, pad_to_group=options.pad_to_group)
        if getattr(options, "symmetric", False):   # the mixed recipe has no such option
            extra.update(scheme=recipe.scheme.replace("asymmetric weights", "symmetric weights")
                         .replace("asymmetric", "symmetric"))
    return VariantFacts(recipe=recipe.name, dtype=options.compute_dtype, parameters=parameters, weight_bytes=nbytes,
                        bits_per_weight=8 * nbytes / max(parameters, 1), kernels=tuple(kernels),
                        notes=tuple(notes), extra=extra)


def _require_kernel(module: str, device: str, compute_dtype: str, group_size: int) -> None:
    """Raise UnsupportedOnHardware when `module`'s kernel cannot run here (the probe says why)."""
    reason = _kernel_probe(module, device, compute_dtype, group_size)
    if reason:
        raise UnsupportedOnHardware(f"{reason} (compute_dtype {compute_dtype}; dequant: python runs anywhere)")


@functools.lru_cache(maxsize=None)
def _kernel_probe(module: str, device: str, compute_dtype: str, group_size: int) -> str | None:
    """None when the module's kernel path runs on `device` and agrees with its python reference."""
    import torch
    from torch import nn

    from . import quant_linear as ql

    dtype = getattr(torch, _DTYPES[compute_dtype])
    cls = getattr(ql, module)
    kw = {"group_size": group_size} if group_size else {}
    gen = torch.Generator().manual_seed(0)
    try:
        linear = nn.Linear(256, 64, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(64, 256, generator=gen) * 0.05)
        linear = linear.to(device)
        fast, ref = cls(linear, dtype, "kernel", **kw), cls(linear, dtype, "python", **kw)
        for m in (1, 5):
            x = torch.randn(m, 256, generator=gen).to(device=device, dtype=dtype)
            y, r = fast(x).float(), ref(x).float()
            err = (y - r).abs().max().item()
            if not err <= 0.05 * r.abs().max().item() + 1e-3:
                return (f"unsupported on this hardware: {fast.kernel} gives wrong results on {device} "
                        f"(max error {err:.3g} against the dequantized reference)")
    except (RuntimeError, NotImplementedError) as e:  # how aten says it has no kernel; our bugs propagate
        label = getattr(cls, "kernel", "") or module
        return f"unsupported on this hardware: {label} kernel path failed on {device}: {str(e).splitlines()[0]}"
    return None


_FLOATS = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16",
           "fp32": "fp32", "float32": "fp32", "float": "fp32"}
_VOCAB = ("int8/fp16|bf16|fp32 symmetric → int8; int8/int8 symmetric → w8a8; int4/fp16|bf16|fp32 asymmetric "
          "or symmetric → int4; int4/int8 asymmetric or symmetric → w4a8; fp16|bf16|fp32 with no scheme → itself")


def recipe_from_analysis_vocabulary(weight_dtype: str, activation_dtype: str,
                                    quant_scheme: str | None = None) -> tuple[str, dict]:
    """('int4', 'int8', 'asymmetric') → ('w4a8', {}): the analysis's words to a recipe name and its options.

    A missing quant_scheme means the recipe's own (symmetric for int8, asymmetric for int4)."""
    w = _FLOATS.get(str(weight_dtype).strip().lower(), str(weight_dtype).strip().lower())
    a = _FLOATS.get(str(activation_dtype).strip().lower(), str(activation_dtype).strip().lower())
    s = None if quant_scheme is None else str(quant_scheme).strip().lower()
    if w in _DTYPES and a == w and s in (None, "none"):
        return w, {}
    own = {"int8": "symmetric", "int4": "asymmetric"}.get(w)
    sym = {"symmetric": True} if w == "int4" and s == "symmetric" else {}   # int4's option (Q4_0's format)
    if own and ((s or own) == own or sym):
        if a in _DTYPES:
            return ("int8" if w == "int8" else "int4"), sym | ({} if a == "bf16" else {"compute_dtype": a})
        if a == "int8":
            return ("w8a8" if w == "int8" else "w4a8"), sym
    raise RecipeError(f"no recipe for weight_dtype {weight_dtype}, activation_dtype {activation_dtype}, "
                      f"quant_scheme {quant_scheme}", field="quant_scheme", accepted=_VOCAB)


QUANT_RECIPES = (
    QuantRecipe("int8", "W8A16: int8 per-channel symmetric weights, activations in compute_dtype "
                "(aten::_weight_int8pack_mm on CPU)", "Int8WeightOnly", "int8", "compute", "symmetric"),
    QuantRecipe("w8a8", "int8 per-channel weights × int8 per-token dynamic activations, int32 accumulate "
                "(torch._int_mm)", "W8A8", "int8", "int8", "symmetric (dynamic activations)"),
    QuantRecipe("int4", "W4A16: int4 group-wise asymmetric weights (scale + zero per group; symmetric: true, "
                "the scale alone, llama.cpp's Q4_0 format), activations in compute_dtype (our int4_digits_mm, "
                "else aten::_weight_int4pack_mm_for_cpu on CPU)", "Int4WeightOnly", "int4", "compute",
                "asymmetric", GroupQuantOptions),
    QuantRecipe("w4a8", "int4 group-wise asymmetric weights (symmetric: true, Q4_0's format) × int8 per-token "
                "activations (the analysis's 'Flash'; our w4a8_mm, else torch._int_mm per group)", "W4A8", "int4",
                "int8", "asymmetric weights, symmetric dynamic activations", GroupQuantOptions),
    QuantRecipe("sparse", "2:4 semi-structured pruned weights in int8 × int8 per-token activations "
                "(cuSPARSELt; CUDA only)", "Sparse24Int8", "int8 2:4", "int8", "symmetric", cuda_only=True),
)
