"""One measurement in a fresh process: build one variant, run the scenarios, write JSON.

    python -m variantlab.measure.worker SPEC.json RESULT.json

Run by the executor (measure/executor.py), never by hand. A fresh process per variant makes cold
start and peak memory honest and keeps a crash to one variant. Stages are timed from the
parent's spawn time (wall clock, passed in the spec): import → load → first token. Progress goes
to stdout as lines starting with PROGRESS_PREFIX. The result is versioned JSON
(RESULT_VERSION); a failure is a result too, with its reason.
"""
from __future__ import annotations

import json
import sys
import time

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
    """Everything after the imports: build, cold start, scenarios, memory, scoring."""
    t_spawn = spec["spawn_time"]
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from transformers.utils import logging as hf_logging

    from ..backends.torch_backend import TorchBackend
    from ..environment import torch_fingerprint
    from ..errors import UnsupportedOnHardware
    from ..models.loading import load_causal_lm, tokenizer_fingerprint
    from ..suite import OfflineSpec, SingleStreamSpec
    from ..variants.registry import get_recipe, parse_options
    from .scenarios import scenario_from_spec
    t_imported = time.time()

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    device = spec["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    variant = spec["variant"]
    recipe = get_recipe(variant["recipe"])
    options = parse_options(recipe, variant.get("options", {}))
    reason = recipe.unsupported_reason(device)
    if reason:
        raise UnsupportedOnHardware(reason)

    from pathlib import Path
    model_path = Path(variant["model_path"])
    model, tokenizer = load_causal_lm(model_path, recipe.load_dtype(options), device)
    facts = recipe.apply(model, options, device)
    backend = TorchBackend(model, tokenizer, device, tokenizer_fingerprint(model_path))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t_loaded = time.time()

    samples = [json.loads(line) for line in Path(spec["samples_path"]).read_text().splitlines() if line]
    backend.generate("cold-start", samples[0]["prompt"], 1)
    t_first = time.time()
    _progress("loaded", 0.0)

    passes = {}
    specs = spec["scenarios"]
    for k, s in enumerate(specs):
        sspec = (SingleStreamSpec if s["type"] == "single-stream" else OfflineSpec).model_validate(s)
        scenario = scenario_from_spec(sspec)
        done = lambda f, k=k: _progress(scenario.name, (k + f) / (len(specs) + 1))  # noqa: E731
        passes[scenario.name] = [p.to_json() for p in scenario.run(backend, samples, spec["max_new_tokens"], done)]
    memory = _peak_memory(device)  # before scoring: its full-vocabulary logits are not serving memory

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
                       "first_token_s": t_first - t_loaded, "total_s": t_first - t_spawn},
        "memory": memory, "passes": passes, "accuracy": accuracy,
        "environment": torch_fingerprint(device, spec["seed"]),
    }


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    try:
        result = run_measurement(spec)
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
