"""Variant construction as one library call: a checkpoint and a definition in, a runnable model out.

    built = build("builtin:tiny-structured", VariantDefinition("int4", recipe="int4"), "cpu")
    built.model, built.tokenizer, built.facts        # runnable, in eval mode, on the device
    save(built, "builtin:tiny-structured", "artifacts/int4")   # the artifact a measurement loads
    built = load("artifacts/int4", "cpu")             # no quantization runs again

The bench worker, `variantlab build`, and next `serve` and `explain` all build variants through
these three functions. `build` loads the checkpoint in the recipe's load dtype, applies the
variant's attention first (so that gqa's pooled K/V projections get quantized), then its recipe;
`VariantDefinition` is plain data (torch is imported only inside the functions, so planning a
suite never loads it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pydantic import Field, model_validator

from ..payloads import Payload


class VariantDefinition(Payload):
    """What a variant is, as the suite resolved it (recipe options validated, attention canonical): a typed
    payload, which the plan stores and every build and measure job carries. Built as
    `VariantDefinition("int4", "int4", {"group_size": 32})` (fields by position, in order) or by name."""

    name: str
    recipe: str = "fp32"
    options: dict[str, Any] = Field(default_factory=dict)
    attention: str | None = None            # "gqa:2", "linear", …; None: the checkpoint's own
    attention_options: dict[str, Any] = Field(default_factory=dict)
    compile: bool = False                   # a runtime setting: the measuring host compiles after loading
    decode_step: bool = True                # variantlab's decode step where it runs the model (variants/decode_step);
                                            # False (the suite's `compile: false`): transformers' modules each step
    backend: str = "torch"                  # the runtime it runs on (measure/backend_kinds/)
    backend_config: dict[str, Any] = Field(default_factory=dict)   # what that backend takes of the suite entry
                                                                   # (openai: its base_url, model, api_key_env)

    @model_validator(mode="before")
    @classmethod
    def _upgraded(cls, data: Any) -> Any:
        return upgraded(data) if isinstance(data, dict) else data

    @classmethod
    def from_json(cls, d: dict) -> "VariantDefinition":
        return cls.model_validate(d)

    @property
    def attention_json(self) -> dict | None:
        """How an artifact records the attention conversion (None: the model's own)."""
        return {"spec": self.attention, "options": dict(self.attention_options)} if self.attention else None


def upgraded(d: dict) -> dict:
    """A definition as an earlier version stored it, in today's shape: `endpoint` (a dict, or null) became
    backend: openai with it as its backend_config. Keys other than the definition's (a plan's `source`) stay."""
    if "endpoint" not in d:
        return d
    d = dict(d)
    endpoint = d.pop("endpoint")
    if endpoint is not None:
        d.update(backend="openai", backend_config=endpoint)
    else:
        d.setdefault("backend", "torch")
        d.setdefault("backend_config", {})
    return d

@dataclass
class BuiltVariant:
    """A runnable variant: the model (eval mode, on its device), its tokenizer, and facts about it."""

    model: Any
    tokenizer: Any
    facts: Any            # variants.facts.VariantFacts
    definition: VariantDefinition | None = None
    timings: dict = field(default_factory=dict)   # load_s, apply_s (build) as measured here


def calibration_digest(texts: Sequence[str]) -> str:
    """What identifies the calibration text a build was given (recorded by recipes that use it)."""
    import hashlib
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode() + b"\0")
    return h.hexdigest()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def build(source: str | Path, variant: VariantDefinition, device: str = "cpu", *,
          calibration_texts: Sequence[str] = (), trust_remote_code: bool = False) -> BuiltVariant:
    """Load the checkpoint at `source` (a directory or 'builtin:NAME') and turn it into `variant` on `device`.

    Raises UnsupportedOnHardware when the device has no kernel for the recipe (a capability check),
    RecipeError / ModelLoadError for input that cannot work."""
    from ..errors import UnsupportedOnHardware
    from ..models.loading import load_causal_lm, resolve_model_path
    from .attention import apply_attention, attention_facts
    from .decode_kernels import with_decode_kernels
    from .recipe import BuildContext
    from .registry import get_recipe, parse_options

    recipe = get_recipe(variant.recipe)
    options = parse_options(recipe, dict(variant.options))
    reason = recipe.unsupported_reason(device)
    if reason:
        raise UnsupportedOnHardware(reason)
    path = resolve_model_path(str(source))
    t0 = time.perf_counter()
    model, tokenizer = load_causal_lm(path, recipe.load_dtype(options), device, trust_remote_code=trust_remote_code)
    _sync(device)
    t1 = time.perf_counter()
    attn = (apply_attention(model, variant.attention, variant.attention_options)
            if variant.attention else None)
    context = BuildContext(tokenizer=tokenizer, calibration_texts=tuple(calibration_texts))
    facts = recipe.apply(model, options, device, context)
    _sync(device)
    t2 = time.perf_counter()
    if getattr(recipe, "uses_calibration", False):   # an artifact built on other text is another variant
        facts = facts.replace(extra={**facts.extra, "calibration_sha256": calibration_digest(calibration_texts)})
    if attn is None:
        facts = facts.replace(attention=attention_facts(model))
    else:
        facts = facts.replace(kernels=facts.kernels + attn.kernels, notes=facts.notes + attn.notes, attention=attn)
    facts = with_decode_kernels(model, facts)
    return BuiltVariant(model, tokenizer, facts, variant, {"load_s": t1 - t0, "apply_s": t2 - t1})


def save(built: BuiltVariant, source: str | Path, out_dir: str | Path) -> dict:
    """Write `built` as an artifact folder (variants/artifact.py); returns the variant.json written."""
    from ..models.loading import resolve_model_path
    from .artifact import save_artifact

    v = built.definition
    if v is None:
        raise ValueError("save() needs a BuiltVariant made by build() (its definition says how to rebuild it)")
    return save_artifact(built.model, built.tokenizer, built.facts, v.recipe, v.options,
                         resolve_model_path(str(source)), out_dir, build=dict(built.timings),
                         attention=v.attention_json)


def load(artifact_dir: str | Path, device: str = "cpu", *, tokenizer: Any = None,
         trust_remote_code: bool = False) -> BuiltVariant:
    """The variant saved at `artifact_dir`, on `device`: the stored tensors are assigned, nothing is
    quantized again. `tokenizer`: one already loaded from that folder (the measuring host loads it
    as its own cold-start stage)."""
    from .artifact import load_artifact

    model, tok, facts = load_artifact(Path(artifact_dir), device, tokenizer=tokenizer,
                                      trust_remote_code=trust_remote_code)
    _sync(device)
    return BuiltVariant(model, tok, facts)
