"""One job in a fresh process: build one variant's artifact, or measure one variant; write JSON.

    python -m variantlab.measure.worker SPEC.json RESULT.json

Run by the executor (measure/executor.py), never by hand. A fresh process per variant makes cold
start and peak memory honest and keeps a crash to one variant. Progress goes to stdout as lines
starting with PROGRESS_PREFIX. The result is versioned JSON (RESULT_VERSION); a failure is a result
too, with its reason.

- spec "mode": "build" — load the source checkpoint, apply the recipe, save the artifact
  (variants/artifact.py) to spec "artifact_dir"; the result holds its facts, its size on disk and
  the build time (load + apply + save, `build_s`).
- otherwise, measure: the variant loads from `variant.artifact_path` when the runner gave one (a
  built variant: no quantization runs here, so cold start is the artifact's load), else from the
  source checkpoint with the recipe applied (dtype recipes: the checkpoint is their artifact).
  Stages are timed from the parent's spawn time (wall clock, passed in the spec):
  import → load → first token.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

RESULT_VERSION = 1
PROGRESS_PREFIX = "@@variantlab-progress "


def _progress(stage: str, fraction: float) -> None:
    print(PROGRESS_PREFIX + json.dumps({"stage": stage, "fraction": round(fraction, 4)}), flush=True)


def _peak_memory(device: str) -> dict:
    import resource

    import psutil
    import torch
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated()
        total = torch.cuda.get_device_properties(0).total_memory
        kind = "device (torch.cuda.max_memory_allocated)"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        total = psutil.virtual_memory().total
        kind = "process peak RSS (getrusage)"
    return {"peak_bytes": int(peak), "total_bytes": int(total), "utilization_pct": 100.0 * peak / total,
            "kind": kind}


def run_measurement(spec: dict) -> dict:
    """Everything after the imports: load the variant, cold start, scenarios, memory, scoring."""
    t_spawn = spec["spawn_time"]
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    from ..backends.torch_backend import TorchBackend
    from ..environment import torch_fingerprint
    from ..models.loading import load_causal_lm, tokenizer_fingerprint
    from ..suite import SCENARIO_SPECS
    from ..variants import registry  # noqa: F401  (the recipes load here, inside the timed import stage)
    from ..variants.artifact import load_artifact
    from .scenarios import scenario_from_spec
    t_imported = time.time()

    device = _setup(spec)
    variant = spec["variant"]
    if variant.get("artifact_path"):
        # A built variant: load what the build step saved (the runner checked it matches this variant).
        tokenizer_dir = Path(variant["artifact_path"])
        model, tokenizer, facts = load_artifact(tokenizer_dir, device)
        facts = with_attention_facts(model, facts)
    else:
        recipe, options = _recipe_for(variant, device)
        tokenizer_dir = Path(variant["model_path"])
        model, tokenizer = load_causal_lm(tokenizer_dir, recipe.load_dtype(options), device)
        facts = build_variant(model, recipe, options, variant, device)
    backend = TorchBackend(model, tokenizer, device, tokenizer_fingerprint(tokenizer_dir))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t_loaded = time.time()

    samples = [json.loads(line) for line in Path(spec["samples_path"]).read_text().splitlines() if line]
    if variant.get("compile"):
        facts = compile_model(model, backend, samples, facts)
    t_compiled = time.time()
    backend.generate("cold-start", samples[0]["prompt"], 1)
    t_first = time.time()
    _progress("loaded", 0.0)

    passes = {}
    specs = spec["scenarios"]
    for k, s in enumerate(specs):
        sspec = SCENARIO_SPECS[s["type"]].model_validate(s)
        scenario = scenario_from_spec(sspec)
        done = lambda f, k=k: _progress(scenario.name, (k + f) / (len(specs) + 1))  # noqa: E731
        passes[scenario.name] = [p.to_json() for p in scenario.run(backend, samples, spec["max_new_tokens"], done)]
    memory = _peak_memory(device)  # before scoring: its full-vocabulary logits are not serving memory
    stability = _attention_stability(facts, specs)

    accuracy = None
    n_acc = min(spec["accuracy_samples"], len(samples))
    if n_acc:
        texts = [s["prompt"] + " " + s["answer"] for s in samples[:n_acc]]
        scored = backend.score(texts)
        logprobs = np.concatenate([s.logprobs for s in scored])
        targets = np.concatenate([s.targets for s in scored])
        save_file({"logprobs": logprobs, "targets": targets}, spec["logprobs_path"])
        nll = float(-logprobs[np.arange(len(targets)), targets].astype(np.float64).sum())
        accuracy = {"logprobs_path": spec["logprobs_path"], "positions": int(len(targets)), "nll_nats": nll,
                    "n_bytes": int(sum(s.n_bytes for s in scored)), "texts": n_acc}
    _progress("done", 1.0)

    return {
        "status": "ok", "reason": None, "device": device,
        "facts": facts.to_json(), "tokenizer_id": backend.tokenizer_id,
        "cold_start": {"import_s": t_imported - t_spawn, "load_s": t_loaded - t_imported,
                       "compile_s": (t_compiled - t_loaded) if variant.get("compile") else None,
                       "first_token_s": t_first - t_compiled, "total_s": t_first - t_spawn},
        "memory": memory, "passes": passes, "accuracy": accuracy, "stability": stability,
        "environment": torch_fingerprint(device, spec["seed"]),
    }


def _setup(spec: dict) -> str:
    """Quiet transformers, resolve the device, set threads and seed; return the device."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    device = spec["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    return device


def _recipe_for(variant: dict, device: str):
    """The variant's recipe and parsed options; UnsupportedOnHardware when the recipe cannot run on `device`."""
    from ..errors import UnsupportedOnHardware
    from ..variants.registry import get_recipe, parse_options

    recipe = get_recipe(variant["recipe"])
    options = parse_options(recipe, variant.get("options", {}))
    reason = recipe.unsupported_reason(device)
    if reason:
        raise UnsupportedOnHardware(reason)
    return recipe, options


def _attention_stability(facts, scenario_specs: list[dict]) -> list[dict]:
    """Relative error of this variant's attention kernel against float64 at growing lengths, in its
    compute dtype (random q, k, v with the model's head shape); rows flagged over the threshold."""
    from ..variants.attention import parse_attention, parse_attention_options
    from ..variants.attention_stability import DTYPES, StabilityVariant, attention_stability

    attn = facts.extra.get("attention") or {}
    spec = attn.get("attention")
    spec = "sdpa" if spec in (None, "model's own") else spec
    options = {"linear_state_dtype": attn["linear_state_dtype"]} if attn.get("linear_state_dtype") else {}
    dtype = attn.get("cache_dtype", "fp32")  # already a short name (fp32, bf16, fp16)
    sweep = [n for s in scenario_specs if s["type"] == "length-sweep" for n in s.get("lengths", ())]
    lengths = sorted(set(sweep)) or [512, 2048]
    variant = StabilityVariant(spec, parse_attention(spec), parse_attention_options(options))
    if dtype not in DTYPES:
        return []
    return [r.to_json() for r in attention_stability([variant], lengths, (dtype,), heads=attn["heads"],
                                                     head_dim=attn["head_dim"])]


def compile_model(model, backend, samples: list[dict], facts):
    """torch.compile (inductor, dynamic shapes) each decoder layer's MLP, then run the shapes the
    scenarios will (one request, a batch of two) so that compilation happens here, timed as its own
    cold-start stage and never inside a measurement. Attention and the KV cache stay eager:
    transformers' DynamicCache mutates Python state, which breaks graphs on every token."""
    import dataclasses

    import torch

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(layer, "mlp") for layer in layers):
        from ..errors import RecipeError
        raise RecipeError(f"compile: true needs decoder layers with an .mlp; {type(model).__name__} has none",
                          field="compile", accepted="a Llama/Mistral/Qwen2-style model, or compile: false")
    for layer in layers:
        layer.mlp = torch.compile(layer.mlp, dynamic=True)
    t0 = time.perf_counter()
    prompts = [s["prompt"] for s in samples[:2]] * (2 if len(samples) < 2 else 1)
    backend.generate("compile", prompts[0], 3)
    backend.generate_batch(["compile-0", "compile-1"], prompts[:2], 3)
    return dataclasses.replace(facts, kernels=facts.kernels + ("torch.compile (inductor, dynamic) of decoder MLPs",),
                               extra={**facts.extra, "compile": {"backend": "inductor", "dynamic": True,
                                                                 "scope": "decoder MLPs",
                                                                 "warmup_s": time.perf_counter() - t0}})


def _attention_of(variant: dict) -> dict | None:
    if not variant.get("attention"):
        return None
    return {"spec": variant["attention"], "options": variant.get("attention_options") or {}}


def with_attention_facts(model, facts):
    """facts with extra["attention"] (KV-cache bytes per token and per sequence) for a model left as loaded."""
    import dataclasses

    from ..variants.attention import attention_facts

    if "attention" in facts.extra:
        return facts
    return dataclasses.replace(facts, extra={**facts.extra, "attention": attention_facts(model)})


def build_variant(model, recipe, options, variant: dict, device: str):
    """Attention first (so gqa's pooled K/V projections get quantized), then the recipe; one facts record."""
    import dataclasses

    from ..variants.attention import apply_attention

    attention = _attention_of(variant)
    attn = apply_attention(model, attention["spec"], attention["options"]) if attention else None
    facts = recipe.apply(model, options, device)
    if attn is None:
        return with_attention_facts(model, facts)
    return dataclasses.replace(facts, kernels=facts.kernels + tuple(attn.get("kernels", ())),
                               notes=facts.notes + tuple(attn.get("notes", ())),
                               extra={**facts.extra, "attention": attn})


def run_build(spec: dict) -> dict:
    """Build one variant from its source checkpoint and save its artifact to spec["artifact_dir"]."""
    import torch

    from ..environment import torch_fingerprint
    from ..models.loading import load_causal_lm
    from ..variants.artifact import save_artifact

    device = _setup(spec)
    variant = spec["variant"]
    recipe, options = _recipe_for(variant, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    model_path = Path(variant["model_path"])
    t0 = time.perf_counter()
    model, tokenizer = load_causal_lm(model_path, recipe.load_dtype(options), device)
    sync()
    t1 = time.perf_counter()
    _progress("loaded", 0.3)
    facts = build_variant(model, recipe, options, variant, device)
    sync()
    t2 = time.perf_counter()
    _progress("built", 0.6)
    meta = save_artifact(model, tokenizer, facts, variant["recipe"], options, model_path, spec["artifact_dir"],
                         build={"load_s": t1 - t0, "apply_s": t2 - t1},
                         attention=_attention_of(variant))
    _progress("saved", 1.0)
    return {"status": "ok", "reason": None, "device": device,
            "artifact_path": str(Path(spec["artifact_dir"]).resolve()),
            "facts": meta["facts"], "bytes_on_disk": meta["weights"]["bytes_on_disk"],
            "build_s": meta["build"]["build_s"], "build": meta["build"],
            "environment": torch_fingerprint(device, spec["seed"])}


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    try:
        result = run_build(spec) if spec.get("mode") == "build" else run_measurement(spec)
        code = 0
    except Exception as e:  # a failing variant is a result: recorded with its reason, the sweep goes on
        from ..errors import UnsupportedOnHardware, VariantlabError
        status = "unsupported" if isinstance(e, UnsupportedOnHardware) else "failed"
        reason = e.one_line() if isinstance(e, VariantlabError) else f"{type(e).__name__}: {e}"
        result = {"status": status, "reason": reason}
        code = 0 if status == "unsupported" else 1
        if status == "failed":
            import traceback
            traceback.print_exc()
    result["version"] = RESULT_VERSION
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
