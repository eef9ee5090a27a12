"""Mixed precision: 4, 8 or 16 bits per decoder linear, chosen from measured sensitivity to meet a KLD budget.

The budget `max_kld` is the mean KL(original ‖ mixed) of next-token distributions, in nats, on
calibration text (docs/metrics.md's KLD, computed by measure/accuracy.py), where "original" is the
checkpoint in compute_dtype exactly as the bf16/fp16 recipes build it (`cast_parameters`: weights in
compute_dtype, Llama's rotary inv_freq left in the fp32 that loading gives it). Every decoder linear
becomes one of quant_linear's modules: 4 → Int4WeightOnly (group-wise, `group_size`), 8 →
Int8WeightOnly (per channel), 16 → the nn.Linear kept in compute_dtype. Embeddings, norms and the
LM head stay in compute_dtype, as in the other recipes.

Calibration text is the first `calibration_samples` of `context.calibration_texts` (the suite's
`calibration:` dataset, else its workload's prompts and answers), tokenized with
`context.tokenizer`. Without texts it falls back to `generate_samples(calibration_samples,
seed=calibration_seed)`, prompt + " " + answer (seed 1234: never the benchmark's seed 0), and says
so in the notes; without a tokenizer it loads one from `model.name_or_path`. Texts are cut to
`max_calibration_tokens` and run in micro-batches of 4 (less padding than one batch).

Algorithm:

1. Capture (1 pass): run the original once; keep its log-probs (the reference) and, for the
   first `sensitivity_samples` texts, each decoder layer's output hidden states.
2. Sensitivity (one suffix run per layer × width below 16, on those texts): the KLD of the final
   output with that linear alone quantized. A linear in decoder layer i cannot change layers
   0..i-1, so the run replays layer i-1's captured output in their place and computes layers
   i..N-1, the norm and the head for real: the same numbers as a full forward, bit for bit
   (tests/variants/test_mixed.py checks it), at (N−i)/N of the decoder's cost. Why not a local
   proxy (the layer's output error): turning it into final-output KLD needs a per-layer gain that
   itself takes suffix runs, and it assumes that an error from q_proj and one from down_proj are
   equally visible at the output, which they are not. Here the head and the vocabulary-wide KL
   (float64, as accuracy.py computes it) are the fixed part of every run; measuring on a few
   texts (default 4 of 16) is what makes sensitivity cheap, and is honest because it only orders
   the steps: the budget is checked on every calibration text, by measurement.
3. Order: every layer starts at the widest candidate; a step lowers one layer one rung (16→8,
   8→4). Steps are ordered greedily, cheapest first, by KLD added (sensitivity increase, ≥ 0) per
   byte saved; a layer's next step becomes available once its previous one is taken. The order
   does not depend on the budget. A layer whose in_features `group_size` does not divide (Qwen2's
   688-wide down_proj at 64), without `pad_to_group`, has no 4-bit rung: it walks the other
   candidates (8 when 4 was the only one), and the notes and `extra["no_int4"]` name it.
4. Search (about log2(steps + 1) full passes): bisect over the prefix length k of that order;
   measure the KLD of the whole model with the first k steps taken; it fits → k is confirmed and
   the search goes longer, else shorter. The model returned is the longest confirmed prefix,
   whose measured KLD is the one reported (≤ max_kld: the guarantee). Prefix 0 is the original
   (KLD 0, not measured) when 16 is a candidate; else it is measured and must fit.

A looser budget never gives more bits, even where KLD is not monotone along the order: two
budgets probe the same prefixes until one probe fits the looser and not the tighter, after which
the looser one's answer is at least that prefix and the tighter one's is shorter.

Cost: 1 + `search.passes` full passes + `cost.suffix_runs` suffix runs; facts.extra["cost"] splits
the seconds (capture, sensitivity, search); facts.extra["calibration_seconds"] is the whole build.
The KLD measured is on calibration text; on the suite's evaluation text it can be higher or lower.

References: HAWQ-V2 / "mixed-precision quantization by sensitivity" (per-layer sensitivity,
budgeted bit allocation); GPTQ's layer-by-layer calibration on captured activations; llama.cpp's
per-tensor quant mixes; this package's quant.py (modules, targets, facts).
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

from pydantic import Field, field_validator

from ..errors import RecipeError
from ..spec_model import SpecModel
from .linear_widths import architecture, quantized_in_features, undivided
from .artifact_size import FLOAT_WIDTHS, CheckpointWeights, int4_bytes, int8_bytes
from .quant import _facts, _features, _kernel_probe, _require_kernel, _targets
from .calibration import SensitivityProbe, calibration_set
from .facts import VariantFacts
from .recipe import BuildContext, cast_parameters, weight_facts

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
_MODULES = {4: "Int4WeightOnly", 8: "Int8WeightOnly"}  # 16: the nn.Linear itself


class MixedOptions(SpecModel):
    max_kld: float = Field(0.01, gt=0, description="budget: mean KL(original ‖ mixed) on calibration text, nats")
    group_size: Literal[32, 64, 128] = 64  # of the int4 layers
    pad_to_group: bool = False  # zero-pad in_features up to a multiple of group_size where it does not divide
    compute_dtype: Literal["bf16", "fp16"] = "bf16"  # 16-bit layers keep their weights in it: 16 means 16
    candidates: tuple[Literal[4, 8, 16], ...] = Field((4, 8, 16), validate_default=True)
    calibration_samples: int = Field(16, ge=1, description="the first N calibration texts")
    sensitivity_samples: int = Field(4, ge=1, description="of those, the first N measure sensitivities")
    calibration_seed: int = 1234  # of the fallback generator; the benchmark's text is seed 0
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
    uses_calibration = True  # its artifact records which text it was calibrated on (variants/build.py)

    def unsupported_reason(self, device: str) -> str | None:
        for module in _MODULES.values():
            reason = _kernel_probe(module, device, "bf16", 64 if module == "Int4WeightOnly" else 0)
            if reason:
                return reason
        return None

    def load_dtype(self, options):
        import torch
        return getattr(torch, _DTYPES[options.compute_dtype])

    def artifact_bytes(self, options: MixedOptions, weights: CheckpointWeights) -> int:
        """The weights file, estimated before building (artifact_size.py): which layers end at which width is
        known only once calibrated, so every linear at its widest candidate (an upper bound; a layer whose
        in_features the group does not divide at 8 bits where 4 is the widest), the rest in the compute dtype."""
        width, widest = FLOAT_WIDTHS[options.compute_dtype], options.candidates[0]

        def linear(shape) -> int:
            if widest == 16:
                return shape[0] * shape[1] * width
            if widest == 8 or (shape[1] % options.group_size and not options.pad_to_group):
                return int8_bytes(shape, width)
            return int4_bytes(shape, options.group_size, width)
        return weights.quantized(linear, width)

    def apply(self, model, options: MixedOptions, device: str, context: BuildContext | None = None) -> VariantFacts:
        import torch

        clock, start = self.clock, self.clock()
        dtype = self.load_dtype(options)
        cast_parameters(model, dtype)  # the reference: the model as the bf16/fp16 recipe builds it
        targets, kept = _targets(model, self.name, quantize_lm_head=False)
        ladders, no4 = _ladders(targets, options)
        self._check(ladders, options, device)
        parameters = weight_facts(model)[0]
        calib = calibration_set(model, context or BuildContext(), samples=options.calibration_samples,
                                max_tokens=options.max_calibration_tokens,
                                sensitivity_samples=options.sensitivity_samples,
                                fallback_seed=options.calibration_seed)
        layers = dict(targets)
        build = lambda name, bits: _build(layers[name], bits, dtype, options)  # noqa: E731
        widest = options.candidates[0]
        with torch.no_grad():
            probe = SensitivityProbe(model, layers, calib.batches, calib.sensitivity_batches)
            t_capture = clock()
            sens, nbytes = _sensitivities(model, layers, build, probe.sensitivity, ladders)
            probe.release_activations()
            t_sens = clock()
            steps = order_steps(sens, nbytes, ladders)
            plan = {name: 16 for name in layers}  # what the model holds now: the original

            def take(k: int) -> None:  # the model with the first k steps taken
                bits = {name: ladders[name][0] for name in layers}
                for s in steps[:k]:
                    bits[s.layer] = s.dst
                for name, b in bits.items():
                    if plan[name] != b:
                        plan[name] = b
                        model.set_submodule(name, build(name, b))

            def measure(k: int) -> float:
                take(k)
                return probe.kld()

            at_zero = 0.0 if all(r[0] == 16 for r in ladders.values()) else None  # prefix 0: the original
            taken, measured, probes = bisect_prefix(len(steps), options.max_kld, measure, at_zero)
            take(taken)  # the state measured last may be a longer prefix that did not fit
        if not measured <= options.max_kld:
            at = f"{widest} bits" + (f" ({len(no4)} at 8: int4 cannot hold them)" if widest == 4 and no4 else "")
            raise RecipeError(f"mixed cannot meet max_kld {options.max_kld:g}: with every layer at "
                              f"{at} the measured KLD is {measured:.3g}",
                              field="max_kld", accepted="a larger max_kld, or 16 among candidates")
        end = clock()
        search = {"steps": len(steps), "predicted": predicted_prefix(steps, sens, ladders, options.max_kld),
                  "taken": taken, "passes": len(probes), "probes": [list(p) for p in probes]}
        cost = {"passes": 1 + len(probes), "suffix_runs": probe.runs, "suffix_layers": probe.layers_run,
                "decoder_layers": len(probe.stack), "capture_seconds": t_capture - start,
                "sensitivity_seconds": t_sens - t_capture, "search_seconds": end - t_sens}
        return self._facts(model, options, parameters, kept, plan, sens, measured, search, calib, cost, end - start,
                           ladders, no4)

    def check_config(self, options: dict, config: dict, *, variant: str, file: str | None = None,
                     field: str | None = None) -> tuple[str, ...]:
        """Planning's look at config.json (no torch): nothing refused; the layers int4 cannot hold are said
        before measuring (linear_widths.py; nothing where the architecture's layer shapes are not known)."""
        opts = self.options_model.model_validate(options)
        widths = quantized_in_features(config, lm_head=False)
        if widths is None or 4 not in opts.candidates or opts.pad_to_group:
            return ()
        bad = undivided(widths, opts.group_size)
        if not bad:
            return ()
        at = f"{field}.options.group_size: " if field else ""
        return (f"{at}variant '{variant}': {_no4_note(bad, opts, f' in each layer of {architecture(config)}')}",)

    def _check(self, ladders: dict[str, tuple[int, ...]], options: MixedOptions, device: str) -> None:
        if options.dequant == "kernel":
            for bits in sorted({b for rungs in ladders.values() for b in rungs}):
                if bits in _MODULES:
                    _require_kernel(_MODULES[bits], device, options.compute_dtype,
                                    options.group_size if bits == 4 else 0)

    def _facts(self, model, options, parameters, kept, plan, sens, measured, search, calib, cost, seconds,
               ladders, no4):
        from . import quant_linear as ql

        swapped = [m for m in model.modules() if isinstance(m, ql.QuantLinear)]
        facts = _facts(self, model, options, parameters, swapped, [], False)
        counts = {str(b): sum(v == b for v in plan.values())
                  for b in sorted({b for rungs in ladders.values() for b in rungs}, reverse=True)}
        samples = sum(b.samples for b in calib.batches)
        positions = sum(b.positions for b in calib.batches)
        notes = list(facts.notes)
        notes.append(f"plan: {counts.get('4', 0)} layers at 4 bits, {counts.get('8', 0)} at 8, "
                     f"{counts.get('16', 0)} at 16 ({options.compute_dtype}); measured KLD {measured:.3g} "
                     f"≤ max_kld {options.max_kld:g} on {samples} calibration texts ({calib.source}); on the "
                     f"suite's evaluation text it can be higher or lower")
        if calib.source == "generator":
            notes.append(f"no calibration texts were given: calibrated on the synthetic structured-sample "
                         f"generator (seed {options.calibration_seed}), not on this suite's workload")
        if kept:
            notes.append(f"kept in {options.compute_dtype}: {', '.join(kept)} (the LM head), as the embeddings")
        if no4:
            notes.append(_no4_note(no4, options))
        extra = dict(facts.extra, plan=dict(plan), bits_histogram=counts, no_int4=dict(no4),
                     sensitivities={n: {str(b): v for b, v in s.items()} for n, s in sens.items()},
                     final_kld=measured, max_kld=options.max_kld, search=search, cost=cost,
                     calibration_source=calib.source, calibration_samples=samples,
                     calibration_positions=positions,
                     sensitivity_samples=sum(b.samples for b in calib.batches[:calib.sensitivity_batches]),
                     calibration_seed=options.calibration_seed if calib.source == "generator" else None,
                     calibration_seconds=seconds)
        return facts.replace(notes=tuple(notes), extra=extra)


def _ladders(targets, options: MixedOptions) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Each layer's rungs, widest first, and {layer: in_features} of those int4 cannot hold: `group_size` does
    not divide their in_features (and pad_to_group is off). Those walk the candidates without 4, or stay at
    8 bits when 4 was the only candidate: one layer's width does not fail the whole variant."""
    no4 = {} if 4 not in options.candidates or options.pad_to_group else {
        name: _features(m)[0] for name, m in targets if _features(m)[0] % options.group_size}
    return {name: _without_4(options) if name in no4 else options.candidates for name, _ in targets}, no4


def _without_4(options: MixedOptions) -> tuple[int, ...]:
    return tuple(b for b in options.candidates if b != 4) or (8,)


def _no4_note(no4: dict[str, int], options: MixedOptions, where: str = "") -> str:
    """Which layers int4 cannot hold, why, what they take instead and how to let them take 4 bits. `where`
    follows the layers' names (' in each layer of Qwen2ForCausalLM')."""
    names = list(no4)
    shown = ", ".join(names[:4]) + (f", … ({len(names)} layers)" if len(names) > 4 else "") + where
    widths = ", ".join(map(str, sorted(set(no4.values()))))
    rungs = " or ".join(map(str, sorted(_without_4(options))))
    return (f"group_size {options.group_size} does not divide in_features {widths} of {shown}: int4 cannot hold "
            f"{'them' if len(names) > 1 else 'it'}, so {'they take' if len(names) > 1 else 'it takes'} {rungs} "
            f"bits, never 4 (pad_to_group: true zero-pads in_features to a multiple of the group so that 4 bits fit)")


def _rungs(ladders, layer: str) -> tuple[int, ...]:
    """A layer's rungs: `ladders` is one tuple for every layer, or {layer: its tuple}."""
    return ladders[layer] if isinstance(ladders, dict) else ladders


# --- the greedy order, the prediction and the search (no model) --------------------------------

def order_steps(sens: dict[str, dict[int, float]], nbytes: dict[str, dict[int, int]],
                ladders: tuple[int, ...] | dict[str, tuple[int, ...]]) -> list[Step]:
    """Every one-rung lowering of every layer, cheapest KLD per byte saved first (see the module docstring).

    sens[layer][bits] is the measured KLD with that layer alone at `bits` (0 at 16);
    nbytes[layer][bits] its stored bytes; `ladders` the rungs, widest first, of every layer or of each.
    A layer's step to rung i+1 is offered after its step to rung i.
    """
    def step(layer: str, rung: int) -> Step:
        src, dst = _rungs(ladders, layer)[rung], _rungs(ladders, layer)[rung + 1]
        return Step(layer, src, dst, max(_cost(sens, layer, dst) - _cost(sens, layer, src), 0.0),
                    nbytes[layer][src] - nbytes[layer][dst])

    def key(s: Step, rung: int):
        return (s.kld / max(s.saved, 1), -s.saved, s.layer, rung)

    heap = [(key(s, 0), s, 0) for s in (step(layer, 0) for layer in sens if len(_rungs(ladders, layer)) > 1)]
    heapq.heapify(heap)
    order = []
    while heap:
        _, s, rung = heapq.heappop(heap)
        order.append(s)
        if rung + 2 < len(_rungs(ladders, s.layer)):
            nxt = step(s.layer, rung + 1)
            heapq.heappush(heap, (key(nxt, rung + 1), nxt, rung + 1))
    return order


def predicted_prefix(steps: list[Step], sens: dict[str, dict[int, float]],
                     ladders: tuple[int, ...] | dict[str, tuple[int, ...]], max_kld: float) -> int:
    """How many steps would fit if KLD added over layers (reported beside the measured answer)."""
    total = sum(_cost(sens, layer, _rungs(ladders, layer)[0]) for layer in sens)
    taken = 0
    for s in steps:
        total += s.kld
        if not total <= max_kld:  # NaN or inf stop it too
            break
        taken += 1
    return taken


def bisect_prefix(n: int, max_kld: float, measure: Callable[[int], float],
                  at_zero: float | None = None) -> tuple[int, float, list[tuple[int, float]]]:
    """(longest confirmed prefix, its measured KLD, the probes [(prefix, KLD)]) over prefixes 0..n.

    `measure(k)` is the KLD of the model with the first k steps taken; `at_zero` the known KLD of
    prefix 0 (else it is measured first). At most ceil(log2(n + 1)) probes beyond prefix 0. When
    prefix 0 does not fit, (0, its KLD) comes back and the caller refuses the budget.
    """
    probes = []

    def probe(k: int) -> float:
        probes.append((k, measure(k)))
        return probes[-1][1]

    lo_kld = probe(0) if at_zero is None else at_zero
    lo, hi = 0, n + 1  # lo: longest prefix measured to fit; hi: shortest measured not to (n + 1: none yet)
    if not lo_kld <= max_kld:
        return 0, lo_kld, probes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        kld = probe(mid)
        if kld <= max_kld:  # NaN never fits
            lo, lo_kld = mid, kld
        else:
            hi = mid
    return lo, lo_kld, probes


def _cost(sens, layer: str, bits: int) -> float:
    return 0.0 if bits == 16 else sens[layer][bits]


def _build(linear, bits: int, dtype, options: MixedOptions):
    from . import quant_linear as ql
    if bits == 16:
        return linear
    if bits == 8:
        return ql.Int8WeightOnly(linear, dtype, options.dequant)
    return ql.Int4WeightOnly(linear, dtype, options.dequant, group_size=options.group_size)


def _state_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _sensitivities(model, layers, build, kld, ladders):
    """({layer: {bits: KLD with that layer alone at bits}}, {layer: {bits: stored bytes}}).

    `kld(name)` measures the model as it is now, knowing that only `name` differs from the original."""
    sens, nbytes = {}, {}
    for name, linear in layers.items():
        sens[name], nbytes[name] = {}, {16: _state_bytes(linear)}
        for bits in _rungs(ladders, name):
            if bits == 16:
                continue
            q = build(name, bits)
            nbytes[name][bits] = _state_bytes(q)
            model.set_submodule(name, q)
            sens[name][bits] = kld(name)
        model.set_submodule(name, linear)
    return sens, nbytes
