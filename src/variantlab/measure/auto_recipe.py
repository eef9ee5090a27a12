"""`recipe: auto`: a variant whose recipe is chosen for this machine and the suite's workload when the suite is planned.

A planning-time recipe: it sits above the recipes it chooses from (it reads the machine layer: hwconfig,
kernel_times), so it registers itself with variants/registry.py (`register_plan_time`) when planning
imports it, and the registry never imports it (docs/architecture.md).

Planning (measure/plan.py) asks a recipe that has `resolve` to name a concrete one: auto reads the
suite's workload as linear-layer calls (`suite_workload`: each scenario's batch, requests, prompt and
answer tokens, counted with the model's tokenizer), takes the model's shape (hidden → intermediate, the
layer the kernel micro-benchmark times) and size, and asks hwconfig.machine_config, which measures the
kernels once per machine (kernel_times.py, cached) and maps facts and timings to choices with reasons.
The plan then holds a normal variant of the chosen recipe (its artifact is one of that recipe) and
records what auto resolved to and why (`PlannedVariant.resolved`). Auto is never built itself.

Auto weighs speed only: the accuracy rows of the run show what the chosen recipe costs, and
`options.candidates` narrows the recipes it may choose (e.g. [bf16, int8] to keep 8 bits or more).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field

from ..errors import RecipeError
from ..spec_model import SpecModel
from ..variants.linear_widths import by_width, quantized_in_features, undivided
from ..variants.registry import group_wise, kernel_recipes, parse_options, register_plan_time

Timed = Literal["fp32", "bf16", "fp16", "int8", "int4", "w8a8", "w4a8"]
GROUP_SIZE = 64          # int4 / w4a8 default group size: every in_features must divide by it
CHARS_PER_TOKEN = 4      # a prompt's tokens where the model has no tokenizer.json (a rule of thumb)


class AutoOptions(SpecModel):
    candidates: tuple[Timed, ...] | None = Field(None, min_length=1, description="recipes auto may choose "
                                                 "(default: every one timed here)")
    workload: Literal["suite", "decode-heavy", "batch-heavy"] = Field(
        "suite", description="choose for the suite's own scenarios, or for a preset workload")


@dataclass(frozen=True)
class Resolution:
    """What auto resolved to: a concrete recipe, its options, whether to compile, and why."""

    recipe: str
    options: dict
    compile: bool
    summary: str          # "int8 {compute_dtype: bf16} (reason)"
    config: dict          # hwconfig.HardwareConfig.to_json()

    def to_json(self) -> dict:
        return {"recipe": "auto", "resolved_to": self.recipe, "options": dict(self.options),
                "compile": self.compile, "summary": self.summary, "config": self.config}


def _tokens(model_dir: Path | None):
    """A function text → token count: the model's tokenizer.json, else len / CHARS_PER_TOKEN."""
    if model_dir is not None and (model_dir / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
        except Exception:   # noqa: BLE001 - a tokenizer the library cannot read: the rule of thumb
            pass
    return lambda text: max(1, round(len(text) / CHARS_PER_TOKEN))


def model_shape(config: dict) -> tuple[tuple[int, int], int] | None:
    """((hidden, intermediate), linear parameters) from a config.json; None where it does not say."""
    h = config.get("hidden_size") or config.get("n_embd") or config.get("d_model")
    layers = config.get("num_hidden_layers") or config.get("n_layer")
    if not (isinstance(h, int) and isinstance(layers, int)):
        return None
    inter = config.get("intermediate_size") or config.get("n_inner") or 4 * h
    vocab = config.get("vocab_size") or 0
    return (h, inter), layers * (4 * h * h + 3 * h * inter) + h * vocab


def undivided_by_group(config: dict, hidden: int, intermediate: int) -> str:
    """The in_features GROUP_SIZE does not divide, with their layers ('688 (mlp.down_proj)'); '' when it divides
    all. Exact for the families linear_widths.py knows; else hidden and intermediate stand for every layer."""
    widths = quantized_in_features(config, lm_head=False)
    if widths is None:
        widths = {"hidden": hidden, "intermediate": intermediate}
    return by_width(undivided(widths, GROUP_SIZE))


def suite_workload(suite, samples, config: dict, model_dir: Path | None = None):
    """The suite's scenarios as linear-layer calls per measuring process (hwconfig.Workload): for each
    scenario, one prefill per batch (batch × mean prompt tokens rows) and one decode step per further
    new token (batch rows). Read from each scenario spec's fields where it has them (batch_size, requests,
    passes, lengths, repeats, decode_tokens); otherwise one request per sample at batch 1."""
    from ..hwconfig import Phase, Workload

    count = _tokens(model_dir)
    prompt = statistics.mean(count(s["prompt"]) for s in samples) if samples else 32
    answer = statistics.mean(count(s.get("answer", "")) for s in samples) if samples else 8
    max_new = suite.workload.max_new_tokens
    phases = []
    for spec in suite.workload.scenarios:
        batch = getattr(spec, "batch_size", 1)
        lengths = getattr(spec, "lengths", None)
        new = getattr(spec, "decode_tokens", None) or min(max_new, round(answer) + 1)   # the stop token ends it
        tokens = statistics.mean(lengths) if lengths else prompt
        requests = (len(lengths) * getattr(spec, "repeats", 1) if lengths
                    else getattr(spec, "requests", None) or len(samples) * getattr(spec, "passes", 1))
        batches = -(-max(requests, 1) // batch)
        label = getattr(spec, "name", None) or spec.type
        phases.append(Phase(f"{label} prefill {batch}×{tokens:.0f} tokens", round(batch * tokens), batches, False))
        if new > 1:
            phases.append(Phase(f"{label} decode at batch {batch}", batch, batches * (new - 1)))
    return Workload(f"suite '{suite.name}'", tuple(phases))


def _device(suite_device: str) -> str:
    if suite_device == "auto":
        import torch
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    return "cuda:0" if suite_device == "cuda" else suite_device


@dataclass(frozen=True)
class AutoRecipe:
    name: str = "auto"
    description: str = ("chosen when the suite is planned, for this machine and the suite's workload, from "
                        "measured kernel times (`variantlab hw` shows the choices and why)")
    options_model: type = AutoOptions

    def unsupported_reason(self, device: str) -> str | None:
        """Auto itself is never built: planning resolves it to the recipe a build then runs."""
        return ("recipe 'auto' is not built itself: planning a suite (measure/plan.make_plan) resolves it to a "
                "concrete recipe, which is then built")

    def load_dtype(self, options):
        raise RecipeError("recipe 'auto' is resolved to a concrete recipe when the suite is planned; "
                          "build the recipe it resolved to", accepted="measure/plan.make_plan first")

    def apply(self, model, options, device: str, context=None):
        self.load_dtype(options)

    def resolve(self, options: dict, *, suite, samples, config: dict, model_dir: Path | None = None,
                file: str | None = None, field: str | None = None) -> Resolution:
        """The concrete recipe for this machine and the suite's workload (never raises for unknown
        hardware: the fallback is fp32, with a note)."""
        from ..hwconfig import BATCH_HEAVY, DECODE_HEAVY, machine_config
        from ..variants.decode_step import runs_config
        from ..device_facts import available_cores

        opts = parse_options(self, options, file=file, field=f"{field}.options" if field else None)
        shape = model_shape(config)
        workload = (suite_workload(suite, samples, config, model_dir) if opts.workload == "suite"
                    else {"decode-heavy": DECODE_HEAVY, "batch-heavy": BATCH_HEAVY}[opts.workload])
        candidates = opts.candidates
        notes = []
        if shape is not None:
            (h, inter), params = shape
            workload = replace(workload, layers=params / (h * inter))
            if bad := undivided_by_group(config, h, inter):
                grouped = [r for r in kernel_recipes() if group_wise(r)]
                candidates = tuple(c for c in (candidates or get_args(Timed)) if not group_wise(c))
                notes.append(f"{' and '.join(grouped)} left out: group size {GROUP_SIZE} does not divide "
                             f"in_features {bad}")
        else:
            notes.append("the model's config.json gives no hidden size or layer count: timed at 1024→1024")
        cfg = machine_config(workload, device=_device(suite.device), shape=shape[0] if shape else None,
                             parameters=shape[1] if shape else None, threads=suite.threads or available_cores(),
                             candidates=candidates)
        if cfg.compile and runs_config(config):   # compiling would swap our decode step for transformers' modules
            cfg = replace(cfg, compile=False)
            notes.append("compile: off after all — variantlab's decode step runs this model without compiling "
                         "(docs/engine.md); compiling would run transformers' modules instead")
        if notes:
            cfg = replace(cfg, notes=cfg.notes + tuple(notes))
        return Resolution(cfg.recipe, dict(cfg.options), cfg.compile, cfg.summary(), cfg.to_json())


register_plan_time(AutoRecipe())
