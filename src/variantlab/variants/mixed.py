"""Mixed precision: 4, 8 or 16 bits per decoder linear, chosen from measured sensitivity to meet a KLD budget.

The budget `max_kld` is the mean KL(original ‖ mixed) of next-token distributions, in nats, on
calibration text (DESIGN.md's KLD, computed by measure/accuracy.py), where "original" is the
checkpoint in compute_dtype exactly as the bf16/fp16 recipes build it (`cast_parameters`: weights in
compute_dtype, Llama's rotary inv_freq left in the fp32 that loading gives it). Every decoder linear
becomes one of quant_linear's modules: 4 → Int4WeightOnly (group-wise, `group_size`), 8 →
Int8WeightOnly (per channel), 16 → the nn.Linear kept in compute_dtype. Embeddings, norms and the
LM head stay in compute_dtype, as in the other recipes.

Algorithm (all on the calibration batch; one forward pass per measurement):

1. Reference: log-probs of the original (above). Calibration text is
   `generate_samples(calibration_samples, seed=calibration_seed)`, prompt + " " + answer; seed 1234
   by default, so calibration never sees the benchmark's text (seed 0).
2. Sensitivity: for every decoder linear and every candidate width below 16, the KLD of the model
   with that layer alone quantized (the others original).
3. Order: every layer starts at the widest candidate; a step lowers one layer one rung (16→8,
   8→4). Steps are ordered greedily, cheapest first, by KLD added (sensitivity increase, ≥ 0) per
   byte saved; a layer's next step becomes available once its previous one is taken. The order
   does not depend on the budget.
4. Predict: treat KLD as additive over layers; the prediction is the longest prefix of the order
   whose summed step costs are within budget.
5. Measure and adjust: measure the KLD of that whole mixed model. While it exceeds the budget,
   undo the last step taken (the most sensitive per byte: a 4-bit layer goes back to 8 before 8
   goes to 16) and measure again; undoing every step gives the original back (KLD 0 when 16 is
   a candidate). If instead it fits (KLD is usually sub-additive, so the prediction is cautious),
   take the next steps one by one while the measurement still fits; the first that does not is
   undone and the walk stops.

The plan is therefore a prefix of one budget-independent order, and its length only grows with
the budget (a looser budget never gives more bits). The KLD that `apply` measures is on
calibration text; on the suite's evaluation text it can be higher or lower.

Calibration costs 1 + layers × (quantized candidates) + `search.passes` forward passes; the time
is reported in facts.extra["calibration_seconds"].

The recipe seam (recipe.py) hands `apply` a model, not a tokenizer: calibration loads the
tokenizer from the directory the model was loaded from (`model.name_or_path`).

References: HAWQ-V2 / "mixed-precision quantization by sensitivity" (per-layer sensitivity,
budgeted bit allocation); llama.cpp's per-tensor quant mixes; this package's quant.py (modules,
targets, facts).
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import RecipeError
from .quant import _check_group_size, _facts, _kernel_probe, _require_kernel, _targets
from .recipe import VariantFacts, cast_parameters, weight_facts

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
_MODULES = {4: "Int4WeightOnly", 8: "Int8WeightOnly"}  # 16: the nn.Linear itself


class MixedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_kld: float = Field(0.01, gt=0, description="budget: mean KL(original ‖ mixed) on calibration text, nats")
    group_size: Literal[32, 64, 128] = 64  # of the int4 layers
    pad_to_group: bool = False  # zero-pad in_features up to a multiple of group_size where it does not divide
    compute_dtype: Literal["bf16", "fp16"] = "bf16"  # 16-bit layers keep their weights in it: 16 means 16
    candidates: tuple[Literal[4, 8, 16], ...] = Field((4, 8, 16), validate_default=True)
    calibration_samples: int = Field(16, ge=1)
    calibration_seed: int = 1234  # the benchmark's text is seed 0
    max_calibration_tokens: int = Field(256, ge=2, description="per sample; longer ones are truncated")
    dequant: Literal["kernel", "python"] = "kernel"

    @field_validator("candidates")
    @classmethod
    def _candidates(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not any(b in _MODULES for b in v):
            raise ValueError("candidates need 4 or 8 (16 alone is the bf16 recipe)")
        return tuple(sorted(set(v), reverse=True))  # widest first: the ladder every layer walks down


@dataclass(frozen=True)
class Step:
    """Lower `layer` from `src` to `dst` bits: `kld` more (predicted), `saved` bytes less."""

    layer: str
    src: int
    dst: int
    kld: float
    saved: int


@dataclass(frozen=True)
class MixedRecipe:
    name: str = "mixed"
    description: str = ("per-layer 4/8/16-bit weights (int4 group-wise / int8 per channel / compute_dtype), "
                        "widths chosen from measured per-layer sensitivity to meet a KLD budget (max_kld)")
    options_model: type = MixedOptions
    weights: str = "int4 | int8 | 16-bit, per layer"
    activations: str = "compute"
    scheme: str = "per-layer mixed: int4 asymmetric group-wise, int8 symmetric per channel"
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)

    grouped = True  # facts report group_size (of the int4 layers)

    def unsupported_reason(self, device: str) -> str | None:
        for module in _MODULES.values():
            reason = _kernel_probe(module, device, "bf16", 64 if module == "Int4WeightOnly" else 0)
            if reason:
                return reason
        return None

    def load_dtype(self, options):
        import torch
        return getattr(torch, _DTYPES[options.compute_dtype])

    def apply(self, model, options: MixedOptions, device: str) -> VariantFacts:
        import torch

        start = self.clock()
        dtype = self.load_dtype(options)
        cast_parameters(model, dtype)  # the reference: the model as the bf16/fp16 recipe builds it
        targets, kept = _targets(model, self.name, quantize_lm_head=False)
        self._check(targets, options, device)
        parameters = weight_facts(model)[0]
        batch = _calibration_batch(model, options)
        layers = dict(targets)
        build = lambda name, bits: _build(layers[name], bits, dtype, options)  # noqa: E731
        with torch.no_grad():
            ref = _logprobs(model, batch).cpu()  # compared on the host every pass: copy it once
            kld = lambda: _kld(ref, _logprobs(model, batch))  # noqa: E731
            sens, nbytes = _sensitivities(model, layers, build, kld, options.candidates)
            steps = order_steps(sens, nbytes, options.candidates)
            predicted = predicted_prefix(steps, sens, options.candidates, options.max_kld)
            plan = {}

            def put(name: str, bits: int) -> None:
                plan[name] = bits
                model.set_submodule(name, build(name, bits))

            for name in layers:
                put(name, options.candidates[0])
            taken, measured, passes = _walk(steps, predicted, options.max_kld, put, kld)
        if measured > options.max_kld:
            raise RecipeError(f"mixed cannot meet max_kld {options.max_kld:g}: with every layer at "
                              f"{options.candidates[0]} bits the measured KLD is {measured:.3g}",
                              field="max_kld", accepted="a larger max_kld, or 16 among candidates")
        seconds = self.clock() - start
        search = {"steps": len(steps), "predicted": predicted, "taken": taken, "passes": passes}
        return self._facts(model, options, parameters, kept, plan, sens, measured, search, batch, seconds)

    def _check(self, targets, options: MixedOptions, device: str) -> None:
        if 4 in options.candidates and not options.pad_to_group:
            _check_group_size(targets, options.group_size)
        if options.dequant == "kernel":
            for bits in options.candidates:
                if bits in _MODULES:
                    _require_kernel(_MODULES[bits], device, options.compute_dtype,
                                    options.group_size if bits == 4 else 0)

    def _facts(self, model, options, parameters, kept, plan, sens, measured, search, batch, seconds):
        from . import quant_linear as ql

        swapped = [m for m in model.modules() if isinstance(m, ql.QuantLinear)]
        facts = _facts(self, model, options, parameters, swapped, [], False)
        counts = {str(b): sum(v == b for v in plan.values()) for b in options.candidates}
        notes = list(facts.notes)
        notes.append(f"plan: {counts.get('4', 0)} layers at 4 bits, {counts.get('8', 0)} at 8, "
                     f"{counts.get('16', 0)} at 16 ({options.compute_dtype}); measured KLD {measured:.3g} "
                     f"≤ max_kld {options.max_kld:g} on {batch.samples} calibration samples "
                     f"(seed {options.calibration_seed}), not on the suite's evaluation text")
        if kept:
            notes.append(f"kept in {options.compute_dtype}: {', '.join(kept)} (the LM head), as the embeddings")
        extra = dict(facts.extra, plan=dict(plan), bits_histogram=counts,
                     sensitivities={n: {str(b): v for b, v in s.items()} for n, s in sens.items()},
                     final_kld=measured, max_kld=options.max_kld, search=search,
                     calibration_samples=batch.samples, calibration_positions=batch.positions,
                     calibration_seed=options.calibration_seed, calibration_seconds=seconds)
        return replace(facts, notes=tuple(notes), extra=extra)


# --- the greedy order, the prediction and the walk (no model) ----------------------------------

def order_steps(sens: dict[str, dict[int, float]], nbytes: dict[str, dict[int, int]],
                candidates: tuple[int, ...]) -> list[Step]:
    """Every one-rung lowering of every layer, cheapest KLD per byte saved first (see the module docstring).

    sens[layer][bits] is the measured KLD with that layer alone at `bits` (0 at 16);
    nbytes[layer][bits] its stored bytes. A layer's step to rung i+1 is offered after its step to rung i.
    """
    def step(layer: str, rung: int) -> Step:
        src, dst = candidates[rung], candidates[rung + 1]
        return Step(layer, src, dst, max(_cost(sens, layer, dst) - _cost(sens, layer, src), 0.0),
                    nbytes[layer][src] - nbytes[layer][dst])

    def key(s: Step, rung: int):
        return (s.kld / max(s.saved, 1), -s.saved, s.layer, rung)

    heap = [(key(s, 0), s, 0) for s in (step(layer, 0) for layer in sens)] if len(candidates) > 1 else []
    heapq.heapify(heap)
    order = []
    while heap:
        _, s, rung = heapq.heappop(heap)
        order.append(s)
        if rung + 2 < len(candidates):
            nxt = step(s.layer, rung + 1)
            heapq.heappush(heap, (key(nxt, rung + 1), nxt, rung + 1))
    return order


def predicted_prefix(steps: list[Step], sens: dict[str, dict[int, float]], candidates: tuple[int, ...],
                     max_kld: float) -> int:
    """How many steps fit the budget if KLD adds over layers: the longest prefix, never a gap."""
    total = sum(_cost(sens, layer, candidates[0]) for layer in sens)
    taken = 0
    for s in steps:
        total += s.kld
        if not total <= max_kld:  # NaN or inf stop it too
            break
        taken += 1
    return taken


def _walk(steps: list[Step], predicted: int, max_kld: float, put: Callable[[str, int], None],
          kld: Callable[[], float]) -> tuple[int, float, int]:
    """(steps taken, measured KLD, forward passes): step 5 of the module docstring.

    Starts with no step taken; `put(layer, bits)` sets one layer, `kld()` measures the whole model."""
    for step in steps[:predicted]:
        put(step.layer, step.dst)
    taken, measured, passes = predicted, kld(), 1
    if measured > max_kld:
        while measured > max_kld and taken:  # back off: undo the last (most sensitive) step
            taken -= 1
            put(steps[taken].layer, steps[taken].src)
            measured, passes = kld(), passes + 1
        return taken, measured, passes
    while taken < len(steps):  # walk on while the measurement fits
        put(steps[taken].layer, steps[taken].dst)
        trial, passes = kld(), passes + 1
        if trial > max_kld:
            put(steps[taken].layer, steps[taken].src)  # back to what was measured last
            break
        taken, measured = taken + 1, trial
    return taken, measured, passes


def _cost(sens, layer: str, bits: int) -> float:
    return 0.0 if bits == 16 else sens[layer][bits]


# --- the model side -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Batch:
    ids: object      # [B, T] token ids, right-padded
    mask: object     # [B, T] attention mask
    score: object    # [B, T] bool: positions whose next-token distribution counts (all but each text's last)
    samples: int
    positions: int


def _calibration_batch(model, options: MixedOptions) -> _Batch:
    import torch

    from ..data.structured import generate_samples
    tok = _tokenizer(model)
    texts = [f"{s['prompt']} {s['answer']}" for s in generate_samples(options.calibration_samples,
                                                                         options.calibration_seed)]
    encoded = [tok(t, add_special_tokens=True).input_ids[:options.max_calibration_tokens] for t in texts]
    width = max(len(e) for e in encoded)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, :len(e)] = torch.tensor(e)
        mask[i, :len(e)] = 1
    score = mask.bool().clone()
    score[torch.arange(len(encoded)), mask.sum(1) - 1] = False  # as the benchmark's scoring: no last position
    device = next(model.parameters()).device
    return _Batch(ids.to(device), mask.to(device), score.to(device), len(texts), int(score.sum()))


def _tokenizer(model):
    from transformers import AutoTokenizer
    path = getattr(model, "name_or_path", "") or ""
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many types; the user needs one line
        raise RecipeError(f"mixed calibrates on text and needs the checkpoint's tokenizer, which cannot be "
                          f"loaded from '{path}' ({type(e).__name__})", field="recipe",
                          accepted="a model loaded from a local directory that holds its tokenizer") from None


def _logprobs(model, batch: _Batch):
    """[positions, vocab] fp32 next-token log-probs at the scored positions."""
    import torch
    logits = model(input_ids=batch.ids, attention_mask=batch.mask).logits
    return torch.log_softmax(logits[batch.score].float(), dim=-1)


def _kld(ref, var) -> float:
    from ..measure.accuracy import kld_summary
    return kld_summary(ref, var)["mean"]


def _build(linear, bits: int, dtype, options: MixedOptions):
    from . import quant_linear as ql
    if bits == 16:
        return linear
    if bits == 8:
        return ql.Int8WeightOnly(linear, dtype, options.dequant)
    return ql.Int4WeightOnly(linear, dtype, options.dequant, group_size=options.group_size)


def _state_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _sensitivities(model, layers, build, kld, candidates):
    """({layer: {bits: KLD with that layer alone at bits}}, {layer: {bits: stored bytes}})."""
    sens, nbytes = {}, {}
    for name, linear in layers.items():
        sens[name], nbytes[name] = {}, {16: _state_bytes(linear)}
        for bits in candidates:
            if bits == 16:
                continue
            q = build(name, bits)
            nbytes[name][bits] = _state_bytes(q)
            model.set_submodule(name, q)
            sens[name][bits] = kld()
        model.set_submodule(name, linear)
    return sens, nbytes
