"""The attention-kind registry: each kind an `AttentionKind` that says how it is written, what a checkpoint
must have for it, how a loaded model is converted to it, what its cache costs and which kernels run it, and
how its float64 reference is computed (variants/attention_stability.py).

variants/attention.py (parse, check, apply, facts), the stability check and the suite read the kinds here and
never compare a kind's name. Adding a kind is a subclass of AttentionKind, one `register_attention(...)` and
its tests (docs/architecture.md); tests/variants/test_attention_kinds.py adds one in the test.

The number after a kind's colon (`gqa:4`, `sliding:4096`) is held by AttentionSpec as `kv_heads` or `window`
(`arg`); a kind without one takes none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class CacheCost:
    """What one sequence's attention keeps: bytes a token adds, bytes of fixed state, the window it is cut at."""
    per_token: int
    state: int = 0
    window: int | None = None
    notes: tuple[str, ...] = ()


class AttentionKind:
    name: str = ""
    arg: str | None = None          # "kv_heads" | "window": the AttentionSpec field its number goes in
    arg_label: str = ""             # how the accepted list writes the number: "<kv_heads>"
    needs_family: bool = True       # converts the attention of the architectures variantlab knows only
    swaps_modules: bool = False     # our attention modules replace the model's (variants/attention_module.py)

    def written(self) -> str:
        return f"{self.name}:{self.arg_label}" if self.arg else self.name

    # -- planning, from config.json alone (no torch)
    def check_config(self, spec, config: dict, family, bad: Callable[[str, str], Exception]) -> None:
        """Raise bad(why, accepted) when this checkpoint cannot take the kind."""

    # -- building
    def apply(self, model, modules: list, spec, options, family, helpers) -> list[str]:
        """Convert `model` (its attention `modules`) in place; the notes to report. `helpers`: variants/attention.py's."""
        return []

    def native_window_note(self, native: int, spec) -> str:
        """What becomes of a checkpoint's own sliding window under this kind."""
        return (f"the checkpoint's own sliding_window={native} applies to attention, but a DynamicCache() made "
                "without the config keeps every token: cache bytes are reported for the full length")

    # -- facts
    def cache(self, spec, options, *, layers: int, kv_heads: int, head_dim: int, dtype) -> CacheCost:
        return CacheCost(2 * layers * kv_heads * head_dim * dtype.itemsize)

    def kernels(self, cfg, options) -> list[str]:
        return ["torch.nn.functional.scaled_dot_product_attention (transformers 'sdpa')"]

    def state_dtype(self, options) -> str | None:
        """The dtype its fixed state accumulates in, where it has one the options choose."""
        return None

    # -- the stability check's kernel (float64 reference: the same call on float64 inputs)
    def reference_kv(self, spec, k, v):
        """The K/V heads this kind attends over, from a draw of as many heads as queries."""
        return k, v

    def run_kernel(self, spec, options, q, k, v):
        """(output, intermediates finite?) of this kind's attention of q over k, v, in q's dtype."""
        import torch.nn.functional as F  # what transformers' sdpa path calls for an unpadded prefill
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=q.shape[-1] ** -0.5, **gqa), True


_KINDS: dict[str, AttentionKind] = {}
TRANSFORMERS_SDPA = "sdpa"   # transformers' attn_implementation that runs scaled_dot_product_attention
_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def dtype_name(dtype) -> str:
    """torch.bfloat16 → 'bf16', as the facts and notes write dtypes."""
    name = str(dtype).removeprefix("torch.")
    return _DTYPE_NAMES.get(name, name)


def register_attention(kind: AttentionKind) -> AttentionKind:
    if kind.name in _KINDS:
        raise ValueError(f"an attention kind named {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    return kind


def attention_kind(name: str) -> AttentionKind | None:
    return _KINDS.get(name)


def attention_kinds() -> tuple[AttentionKind, ...]:
    return tuple(_KINDS.values())


def accepted() -> str:
    """'sdpa | gqa:<kv_heads> | linear | sliding:<window>': every registered kind as a suite writes it."""
    return " | ".join(k.written() for k in _KINDS.values())


# ---------------------------------------------------------------------------------------------- built-in kinds

class Sdpa(AttentionKind):
    name = "sdpa"
    needs_family = False     # transformers decides at build time whether an architecture has an sdpa path

    def check_config(self, spec, config, family, bad):
        if family.no_sdpa or config.get("attn_logit_softcapping") is not None:
            raise bad(family.no_sdpa or "its attention logits are soft-capped (attn_logit_softcapping), which "
                      "scaled_dot_product_attention cannot do",
                      f"{_written('gqa')} | {_swapped_written()}; or none (the model's own)")

    def apply(self, model, modules, spec, options, family, helpers):
        helpers.set_sdpa(model)
        return []


class Gqa(AttentionKind):
    name, arg, arg_label = "gqa", "kv_heads", "<kv_heads>"

    def check_config(self, spec, config, family, bad):
        heads = config.get(family.heads_key)
        old = config.get("num_key_value_heads") or heads
        if family.no_pool and spec.kv_heads != heads:
            raise bad(family.no_pool, f"gqa:{heads} (the identity) | {_swapped_written()}")
        if isinstance(old, int) and old % spec.kv_heads:
            divisors = [d for d in range(1, old + 1) if old % d == 0]
            raise bad(f"mean-pooling its {old} key/value heads needs kv_heads to divide {old}",
                      "gqa:" + " | gqa:".join(map(str, divisors)))

    def apply(self, model, modules, spec, options, family, helpers):
        helpers.check_gqa(modules, family)  # refuse before changing anything
        notes = []
        if not family.no_sdpa:
            helpers.set_sdpa(model)
        else:
            notes.append(f"{type(model).__name__} keeps its own '{model.config._attn_implementation}' attention "
                         f"(K/V repeated per group): {family.no_sdpa}")
        return notes + helpers.convert_to_gqa(model, modules, spec.kv_heads, family)

    def kernels(self, cfg, options):
        return ["torch.nn.functional.scaled_dot_product_attention (transformers 'sdpa', enable_gqa or packed "
                "query heads where the kernel allows, else repeated K/V)" if cfg._attn_implementation == TRANSFORMERS_SDPA
                else f"transformers '{cfg._attn_implementation}' attention (K/V repeated per group)"]

    def reference_kv(self, spec, k, v):
        heads = k.shape[1]
        if heads % spec.kv_heads:
            raise ValueError(f"gqa:{spec.kv_heads}: kv_heads must divide heads={heads}")
        return k[:, :spec.kv_heads], v[:, :spec.kv_heads]   # its own K/V heads: the first kv_heads of the draw


class SwappedKind(AttentionKind):
    """A kind transformers has no kernel for: our attention modules, keeping their state in `layer_type`."""
    swaps_modules = True

    def layer_type(self) -> type:
        raise NotImplementedError

    def apply(self, model, modules, spec, options, family, helpers):
        from . import attention_module
        runtime = attention_module.AttentionRuntime(self.name, self.layer_type(), spec.window, options.linear_chunk,
                                                    self.accumulator(options))
        attention_module.swap(model, modules, runtime, family.layout)
        cap = getattr(model.config, "attn_logit_softcapping", None)
        return [] if cap is None else [self.softcap_note(cap)]

    def accumulator(self, options):
        return None

    def softcap_note(self, cap: float) -> str:
        return (f"attention logits soft-capped at {cap:g} (tanh), as the checkpoint does: explicit scores, not the "
                "fused sdpa kernel")

    def native_window_note(self, native, spec):
        return f"the checkpoint's own sliding_window={native} is replaced by attention '{spec}'"


class Linear(SwappedKind):
    name = "linear"

    def layer_type(self):
        from .attention_linear import LinearStateLayer
        return LinearStateLayer

    def accumulator(self, options):
        import torch
        return None if options.linear_state_dtype == "model" else torch.float32

    def softcap_note(self, cap):
        return f"the checkpoint soft-caps its attention logits at {cap:g}; linear attention has no logits to cap"

    def cache(self, spec, options, *, layers, kv_heads, head_dim, dtype):
        import torch
        acc = dtype if options.linear_state_dtype == "model" else torch.float32
        return CacheCost(0, layers * kv_heads * (head_dim * head_dim + head_dim) * acc.itemsize, None,
                         (f"state accumulated in {dtype_name(acc)}", "linear attention replaces softmax without "
                          "retraining: outputs differ from the checkpoint's; measure accuracy before using it"))

    def kernels(self, cfg, options):
        return [f"ours: chunked parallel form (chunk {options.linear_chunk}) for prefill, recurrent state for "
                "decode (torch matmul)"]

    def state_dtype(self, options):
        return options.linear_state_dtype

    def run_kernel(self, spec, options, q, k, v):
        import torch

        from .attention_linear import linear_attention_chunked, normaliser
        acc = q.dtype if (options.linear_state_dtype == "model" or q.dtype == torch.float64) else torch.float32
        out, state = linear_attention_chunked(q, k, v, chunk=options.linear_chunk, acc_dtype=acc)
        den = normaliser(q, k, acc_dtype=acc)
        return out, all(bool(torch.isfinite(x).all()) for x in (*state, den))


class Sliding(SwappedKind):
    name, arg, arg_label = "sliding", "window", "<window>"

    def layer_type(self):
        from .attention_sliding import RollingKVLayer
        return RollingKVLayer

    def cache(self, spec, options, *, layers, kv_heads, head_dim, dtype):
        return CacheCost(2 * layers * kv_heads * head_dim * dtype.itemsize, 0, spec.window,
                         ("padded batches add one byte per cached token and layer (the padding mask)",))

    def kernels(self, cfg, options):
        return ["ours: banded scaled_dot_product_attention per block of queries; rolling KV cache"]

    def run_kernel(self, spec, options, q, k, v):
        from .attention_sliding import sliding_attention
        return sliding_attention(q, k, v, spec.window, q.shape[-1] ** -0.5), True


def _written(name: str) -> str:
    return _KINDS[name].written()


def _swapped_written() -> str:
    return " | ".join(k.written() for k in _KINDS.values() if k.swaps_modules)


for _kind in (Sdpa(), Gqa(), Linear(), Sliding()):
    register_attention(_kind)
