"""backend: torch — built from the checkpoint here (variants/build.py) and run by our engine in the measuring
process (backends/torch_engine.py), its cold start staged from the process's own start: import (every module
the variant needs, transformers' lazy ones included) → tokenizer → load (the weights only, from the variant's
artifact) → compile (when asked) → first token."""
from __future__ import annotations

from pathlib import Path

from ..process import compile_warmup, kernels_built_here, process_clock, progress, setup, tokenizer_id
from .base import BUILD_FIELDS, BackendKind, Opened


def open_torch(job, t_start: float) -> Opened:
    import_stage(job.artifact_dir, job.trust_remote_code)
    import torch
    from transformers import AutoTokenizer

    from ...backends.base import GenerationRequest, run_requests
    from ...backends.torch_engine import TorchEngine
    from ...environment import torch_fingerprint
    from ...variants import build as variants
    from ..trackers.cold_start import ColdStartOutput
    from ..trackers.memory import current_bytes
    device = setup(job.device, job.threads, job.seed)
    built_kernels_s = kernels_built_here(device)
    t_imported = process_clock()
    baseline = current_bytes(device)

    tokenizer = AutoTokenizer.from_pretrained(job.artifact_dir, local_files_only=True,
                                              trust_remote_code=job.trust_remote_code)
    tokenizer_fingerprint = tokenizer_id(job.artifact_dir)   # counts in the tokenizer stage
    t_tokenizer = process_clock()
    built = variants.load(job.artifact_dir, device, tokenizer=tokenizer, trust_remote_code=job.trust_remote_code)
    t_loaded = process_clock()
    engine = TorchEngine(built.model, built.tokenizer, device, tokenizer_id=tokenizer_fingerprint,
                         decode_step=job.variant.decode_step and not job.variant.compile)
    built.facts = engine_facts(engine, built.facts)
    t_compiled = t_loaded     # without compile, setting up the engine counts toward the first token
    if job.variant.compile:
        from ...variants.compiled import compile_variant
        built.facts = compile_variant(engine, built.model, built.facts)
        compile_warmup(engine, [s["prompt"] for s in job.samples[:2]])
        t_compiled = process_clock()
    run_requests(engine, [GenerationRequest("cold-start", prompt=job.samples[0]["prompt"], max_new_tokens=1)])
    t_first = process_clock()
    progress("loaded", 0.0)

    left_out = built_kernels_s or 0.0
    cold = ColdStartOutput(import_s=t_imported - t_start - left_out, tokenizer_s=t_tokenizer - t_imported,
                           load_s=t_loaded - t_tokenizer,
                           compile_s=(t_compiled - t_loaded) if job.variant.compile else None,
                           first_token_s=t_first - t_compiled, total_s=t_first - t_start - left_out,
                           clock="the process's own start (kernel start time, boot clock)",
                           process_start=t_start, kernels_build_s=built_kernels_s)
    return Opened(engine, built, device, cold, baseline, environment=torch_fingerprint(device, job.seed),
                  kernels=lambda: tuple(built.facts.kernels), notes=lambda: tuple(built.facts.notes),
                  context=torch.inference_mode)   # the engine then skips its own per-step mode switch


def engine_facts(engine, facts):
    """The facts with which engine runs each decode step: variantlab's decode step (its label), or transformers'
    forward and, where our step was wanted, why it does not run this model (a note); and where its weights lie
    (extra["weight_memory"]: how much of them the kernel holds in 2 MiB pages)."""
    from ...variants.decode_step import LABEL
    if engine.settled is not None:
        facts = facts.replace(extra=facts.extra | {"weight_memory": engine.settled.summary})
    if engine.step is not None:
        return facts.replace(kernels=facts.kernels + (LABEL,))
    if engine.step_note:
        return facts.replace(notes=facts.notes + (engine.step_note,))
    return facts


def import_stage(artifact_dir: str, trust_remote_code: bool = False) -> None:
    """Import everything loading and running this variant needs, so that "load" is the weights alone:
    torch, transformers, the model's class (transformers imports it lazily), the tokenizer's class,
    safetensors, and variantlab's recipes, kernels, engine and trackers."""
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.tokenization_auto import get_tokenizer_config, tokenizer_class_from_name

    from ...backends.torch_engine import TorchEngine  # noqa: F401
    from ...variants import build, decode_step, quant_linear, registry  # noqa: F401
    from .. import trackers  # noqa: F401

    config = AutoConfig.from_pretrained(artifact_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    try:
        AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:   # not an auto-mapped architecture: loading says what is wrong, with the file named
        pass
    name = get_tokenizer_config(artifact_dir).get("tokenizer_class")
    if name:
        tokenizer_class_from_name(name)


def build_torch(job):
    """The variant built from its checkpoint (variants.build) and saved as its artifact (variants.save)."""
    from ...environment import torch_fingerprint
    from ...variants import build as variants
    from ..wire import BuildRecord

    device = setup(job.device, job.threads, job.seed)
    kernels_built_here(device)
    progress("loading", 0.1)
    built = variants.build(job.source, job.variant, device,
                           calibration_texts=job.calibration_texts, trust_remote_code=job.trust_remote_code)
    progress("saving", 0.7)
    meta = variants.save(built, job.source, job.artifact_dir)
    progress("saved", 1.0)
    return BuildRecord(variant=job.variant.name, status="ok", artifact_dir=str(Path(job.artifact_dir).resolve()),
                       facts=meta["facts"], bytes_on_disk=meta["weights"]["bytes_on_disk"],
                       timings=meta["build"], environment=torch_fingerprint(device, job.seed)), {}


def torch_artifact_size(definition, source: Path):
    """The artifact's disk, estimated before building: the weights file as the recipe lays it out (its
    `artifact_bytes`; one without: every tensor in fp32, the widest a recipe stores), the checkpoint's tokenizer
    files copied beside it, variant.json."""
    from ...variants.artifact import copied_bytes
    from ...variants.artifact_size import META_BYTES, ArtifactSize, read_weights
    from ...variants.registry import get_recipe, parse_options
    recipe, weights = get_recipe(definition.recipe), read_weights(source)
    estimate = getattr(recipe, "artifact_bytes", None)
    weights_file = (estimate(parse_options(recipe, definition.options), weights) if estimate is not None
                    else weights.at_width(4))
    return ArtifactSize(weights_file + copied_bytes(source) + META_BYTES)


TORCH = BackendKind("torch", "built and run here", open_torch, takes=BUILD_FIELDS, build=build_torch,
                    our_kernels=True, serves=True, artifact_size=torch_artifact_size)
