"""Our decode kernels (variants/kernels) under a built or loaded variant, and what its facts say of them.

`with_decode_kernels(model, facts)` runs at the end of `variants.build.build` and of
`artifact.load_artifact`, so every measured variant, `variantlab build` and the peer benchmark take
the same path. Where our kernels run (an AVX-512 BF16 + VNNI or an AVX2 + FMA CPU with a C++ compiler):
- plain fp32/bf16 linears become KernelLinear (variants/kernel_linear.py: ours at decode shapes);
- SDPA attention becomes ours at one query position (variants/kernel_attention.py);
- the quantized modules (variants/quant_linear.py) pick ours per call on their own, and W4A8 holds
  the layout its kernel reads (chosen when it is built or loaded).

The facts get one label per kernel of ours that the model calls, and lose any an artifact brought
from the machine that built it. Where ours cannot run, nothing changes and a note says why: the
figures then describe aten.
"""
from __future__ import annotations

import torch
from torch import nn

from . import kernels as vk
from .kernel_attention import LABELS as ATTENTION_LABELS
from .kernel_attention import use_decode_attention
from .kernel_linear import FLOAT_OPS, KernelLinear, aten_bf16_is_scalar, swap_linears

BF16_MM = "aten::mm (bf16)"
WIDENED_MM = "aten::mm (fp32, bf16 widened: aten's bf16 matmul is scalar here)"

SUFFIX = f" ({vk.ISA_NAME})"   # this machine's; an artifact may carry another's (SUFFIXES)
SUFFIXES = tuple(f" ({isa.name})" for isa in vk.ISAS)
OFF_PREFIXES = (vk.OFF, "our AVX-512 kernels")   # (the second: artifacts built before the AVX2 kernels)


def use_decode_kernels(model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Put our kernels under the model, in place; (kernel labels, notes). Nothing for a model off the CPU."""
    if not any(p.device.type == "cpu" for p in model.parameters()):
        return (), ()
    st = vk.status()
    if not st.available:
        return (), (st.reason,)
    swap_linears(model)
    return decode_kernel_labels(model) + use_decode_attention(model), ()


def with_decode_kernels(model: nn.Module, facts):
    """`use_decode_kernels` on a built or loaded variant; its facts with this machine's labels and notes
    and the resident bytes that result."""
    from .quant_linear import W4A8, Int4WeightOnly
    from .recipe import resident_bytes

    labels, notes = use_decode_kernels(model)
    # W4A8's and int4's layouts are this machine's choice (made at load): their labels and notes are read from
    # the modules
    w4a8 = [m for m in model.modules() if isinstance(m, (W4A8, Int4WeightOnly)) and m.path == "kernel"]
    stale = {*W4A8.OURS_LABELS, W4A8.GROUP_MAJOR_LABEL, W4A8.GROUP_MAJOR_NOTE, *Int4WeightOnly.OURS_LABELS,
             "aten::_weight_int4pack_mm_for_cpu"} if w4a8 else set()
    kernels = tuple(dict.fromkeys(m.kernel for m in w4a8)) + tuple(
        k for k in facts.kernels if not is_decode_label(k) and k not in stale)
    kernels = aten_labels_that_run(model, kernels)
    notes = tuple(n for n in facts.notes if not is_decode_label(n) and n not in stale) + tuple(
        dict.fromkeys(n for m in w4a8 for n in m.notes if n in stale)) + notes
    return facts.replace(kernels=kernels + labels, notes=notes,
                         extra={**facts.extra, "resident_bytes": resident_bytes(model)})


def aten_labels_that_run(model: nn.Module, kernels: tuple[str, ...]) -> tuple[str, ...]:
    """`kernels` as aten runs here: less the aten kernel of a quantized module where ours runs it at every M (W8A8
    on AVX2), with it where it runs here but an artifact's facts (built where it did not) lack it, and aten's bf16
    matmul named as what runs where it is scalar (kernel_linear.widened_linear)."""
    from .quant_linear import QuantLinear

    quant = [m for m in model.modules() if isinstance(m, QuantLinear) and m.ours() is not None]
    never = {m.kernel for m in quant if vk.available() and m.ours().endswith("every M")}
    runs = [m.kernel for m in quant if m.kernel not in never]
    kernels = tuple(k for k in kernels if k not in never) + tuple(k for k in dict.fromkeys(runs) if k not in kernels)
    widened = aten_bf16_is_scalar() and any(isinstance(m, KernelLinear) and m.weight.dtype == torch.bfloat16
                                            for m in model.modules())
    old, new = (BF16_MM, WIDENED_MM) if widened else (WIDENED_MM, BF16_MM)
    return tuple(new if k == old else k for k in kernels)


def is_decode_label(text: str) -> bool:
    """A label or note `use_decode_kernels` wrote (so a reloaded artifact can replace its build machine's)."""
    return ((text.startswith("variantlab ") and text.endswith(SUFFIXES)) or text.startswith(OFF_PREFIXES)
            or text in ATTENTION_LABELS)


def decode_kernel_labels(model: nn.Module) -> tuple[str, ...]:
    """Which of our linear kernels the model's layers call at decode, one label each (empty where none)."""
    from .quant_linear import QuantLinear

    if not vk.available():
        return ()
    labels: list[str] = []
    for module in model.modules():
        if isinstance(module, KernelLinear):
            label = vk.rows_label(FLOAT_OPS[module.weight.dtype])
        elif isinstance(module, QuantLinear):
            label = module.ours()
        else:
            continue
        if label and f"variantlab {label}{SUFFIX}" not in labels:
            labels.append(f"variantlab {label}{SUFFIX}")
    return tuple(labels)
