"""backend: llamacpp — a GGUF run by llama.cpp in the measuring process (backends/llamacpp.py): one that
llama.cpp's own tools make from the suite's checkpoint (`gguf_type: Q4_K_M`; variants/gguf_convert.py), or a
GGUF file the user has (`model: path/to/model-Q4_K_M.gguf`). Either is an artifact (variants/gguf_artifact.py),
sealed with its hashes and reused like our own. Its cold start is staged from the process's own start like a
torch variant's: import (llama_cpp and the tokenizer's modules) → tokenizer → load (the GGUF, memory-mapped) →
first token (the context is made on the first request, as llama.cpp makes it at start).

Without llama-cpp-python a llamacpp variant is refused when the suite is planned, in one line naming the install
command. Trackers that need our torch modules (the attention-error check, the profiler) say why they are not
measured for it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ...errors import RecipeError, SuiteError
from ...variants.build import VariantDefinition
from ...variants.gguf_convert import GGUF_TYPES, INSTALL, accepted_types
from ..process import process_clock, progress
from .base import BackendKind, Opened

FIELDS = ("gguf_type",)


def check_llamacpp(spec) -> None:
    gguf_file = spec.model is not None and spec.model.endswith(".gguf")
    if gguf_file and spec.gguf_type is not None:
        raise ValueError("gguf_type makes a GGUF from a checkpoint; model: names a GGUF file that already has its "
                         "type: give one of them")
    if not gguf_file and spec.gguf_type is None:
        raise ValueError(f"backend: llamacpp needs gguf_type ({accepted_types()}) to build a GGUF from the "
                         "checkpoint, or model: a .gguf file")
    if spec.gguf_type is not None and spec.gguf_type not in GGUF_TYPES:
        raise ValueError(f"unknown gguf_type {spec.gguf_type!r} (accepted: {accepted_types()})")


def llama_cpp_installed() -> bool:
    """Whether llama-cpp-python can be imported here (found, not imported: planning stays cheap)."""
    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):     # a module that failed to import, or one blocked (None in sys.modules)
        return False


def plan_llamacpp(spec, base_dir: Path, file: str, field: str) -> VariantDefinition:
    """The variant's definition; refused here when llama-cpp-python is not installed or the GGUF file is missing."""
    if not llama_cpp_installed():
        raise RecipeError("backend: llamacpp needs llama-cpp-python, which is not installed", file=file,
                          field=f"{field}.backend", accepted=f"install the llamacpp extra once: `{INSTALL}`")
    if spec.gguf_type is not None:
        config = {"gguf_type": spec.gguf_type}
        if spec.model is not None:
            from ...models.loading import resolve_model_path
            config["checkpoint"] = str(resolve_model_path(spec.model, base_dir, file=file, field=f"{field}.model"))
        return VariantDefinition(spec.name, recipe=f"gguf:{spec.gguf_type}", backend="llamacpp",
                                 backend_config=config)
    path = Path(spec.model).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise SuiteError(f"GGUF file {path} does not exist", file=file, field=f"{field}.model",
                         accepted="a .gguf file, or gguf_type to build one from the suite's checkpoint")
    return VariantDefinition(spec.name, recipe="gguf:file", backend="llamacpp",
                             backend_config={"gguf_file": str(path.resolve())})


def build_llamacpp(job):
    """The GGUF artifact: made by llama.cpp's tools from the checkpoint, or the user's file described and sealed."""
    from ...variants.gguf_artifact import build_gguf_artifact
    from ..wire import BuildRecord
    progress("converting", 0.1)
    config = job.variant.backend_config
    meta = build_gguf_artifact(config.get("checkpoint", job.source), config, Path(job.artifact_dir),
                               threads=job.threads, calibration_texts=job.calibration_texts)
    progress("saved", 1.0)
    return BuildRecord(variant=job.variant.name, status="ok", artifact_dir=str(Path(job.artifact_dir).resolve()),
                       facts=meta["facts"], bytes_on_disk=meta["weights"]["bytes_on_disk"], timings=meta["build"],
                       environment=llamacpp_fingerprint(job.threads, job.seed)), {}


def artifact_problem_llamacpp(artifact: Path, definition, source: Path, plan) -> str | None:
    from ...variants.gguf_artifact import gguf_problem
    config = definition.backend_config
    return gguf_problem(artifact, config, config.get("checkpoint", source))


def llamacpp_artifact_size(definition, source: Path):
    """The artifact's disk, estimated before building: a GGUF made from the checkpoint (gguf_convert.estimate;
    its F32 intermediate lies beside it while the quantizer runs), with the checkpoint's tokenizer files copied
    beside it; a user's GGUF is referenced, not copied, and costs only those files."""
    from ...variants.artifact import copied_bytes
    from ...variants.artifact_size import META_BYTES, ArtifactSize, read_weights
    from ...variants.gguf_convert import estimate
    config = definition.backend_config
    checkpoint = Path(config.get("checkpoint", source))
    copied = copied_bytes(checkpoint) if checkpoint.is_dir() else 0
    if not config.get("gguf_type"):
        return ArtifactSize(copied + META_BYTES)
    gguf = estimate(config["gguf_type"], read_weights(checkpoint), metadata_bytes=copied)
    return ArtifactSize(gguf.bytes + copied + META_BYTES, gguf.transient)


def llamacpp_fingerprint(threads: int, seed: int) -> dict:
    """A llama.cpp worker's environment: llama-cpp-python's version and the instruction sets its build uses."""
    from importlib import metadata

    from ...variants.gguf_model import cpu_features
    return {"threads": threads, "device": "cpu", "seed": seed, "cuda_available": False,
            "llama_cpp_python": metadata.version("llama-cpp-python"), "llama_cpp_features": cpu_features()}


class _Built:
    """What the facts tracker reads of a GGUF variant: its facts as built."""

    def __init__(self, facts):
        self.facts = facts


def open_llamacpp(job, t_start: float) -> Opened:
    from ...variants.gguf_model import llama
    llama()
    from transformers import AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    from ...backends.base import GenerationRequest, run_requests
    from ...backends.llamacpp import LlamaCppBackend
    from ...backends.tokenized import TokenizerText, eos_ids
    from ...variants.facts import VariantFacts
    from ...variants.gguf_artifact import gguf_path, read_meta
    from ..trackers.cold_start import ColdStartOutput
    from ..trackers.memory import current_bytes
    hf_logging.set_verbosity_error()
    artifact = Path(job.artifact_dir)
    t_imported = process_clock()
    baseline = current_bytes("cpu")

    text = None
    if (artifact / "tokenizer_config.json").is_file() or (artifact / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(artifact, local_files_only=True)
        gen = GenerationConfig.from_pretrained(artifact) if (artifact / "generation_config.json").is_file() else None
        text = TokenizerText(tok, eos_ids(tok, gen))
    t_tokenizer = process_clock()
    backend = LlamaCppBackend(gguf_path(artifact), text, job.threads, tokenizer_id=f"gguf:{artifact.name}")
    t_loaded = process_clock()
    run_requests(backend, [GenerationRequest("cold-start", prompt=job.samples[0]["prompt"], max_new_tokens=1)])
    t_first = process_clock()
    progress("loaded", 0.0)
    facts = VariantFacts.model_validate(read_meta(artifact)["facts"])
    cold = ColdStartOutput(import_s=t_imported - t_start, tokenizer_s=t_tokenizer - t_imported,
                           load_s=t_loaded - t_tokenizer, first_token_s=t_first - t_loaded,
                           total_s=t_first - t_start, clock="the process's own start (kernel start time, boot clock)",
                           process_start=t_start)
    return Opened(backend, _Built(facts), "cpu", cold, baseline, environment=llamacpp_fingerprint(job.threads, job.seed),
                  kernels=lambda: tuple(facts.kernels), notes=lambda: tuple(facts.notes), close=backend.close)


LLAMACPP = BackendKind(
    "llamacpp", "a GGUF run by llama.cpp in the measuring process: gguf_type (built from the checkpoint by "
    f"llama.cpp's tools), or model: a .gguf file; needs `{INSTALL}`", open_llamacpp, takes=("model",),
    fields=FIELDS, refusal="a GGUF is built by llama.cpp's tools, not by our recipes", check=check_llamacpp,
    build=build_llamacpp, plan=plan_llamacpp, artifact_problem=artifact_problem_llamacpp, torch_model=False,
    runtime="llama.cpp", artifact_size=llamacpp_artifact_size)
