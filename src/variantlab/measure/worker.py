"""The measuring host: one job, in a fresh process, in, one record (and its blobs) out.

    python -m variantlab.measure.worker JOB.json RESULT.bin      (the local executor runs this)

`run_job(job)` is the whole of it, callable in any process (a Ray task calls it directly):
- a `BuildJob` builds the variant from its checkpoint through `variants.build` and saves the
  artifact (`variants.save`);
- a `MeasureJob` times the cold start from this process's own start — import (every module the
  variant needs, transformers' lazy ones included) → tokenizer → load (the weights only, from the
  variant's artifact) → compile (when asked) → first token — then hosts the job's trackers in
  order (measure/trackers/): the scenarios and memory, and, in a variant's first good round, the
  once-per-variant ones (facts, attention error, grading, scoring). A tracker that raises is
  recorded as that tracker's error, and the round's other trackers keep their results. When every
  scenario raised, the round measured none of the workload: it is "failed", with the first
  scenario's reason (issue 22: GPT-2's scenarios all raised IndexError and the variant read "ok"),
  and its record still carries what the other trackers measured. NaN or inf logits (the engine
  checks each prompt's, scoring each text's) fail the whole measurement.
Cold start and peak memory are the process's own, so a job needs a process of its own: a Ray task
that calls `run_job` must not share its worker process with another (max_calls=1).
A failure is a record too: "unsupported" only when a capability check says the device cannot run
the recipe; any other exception is "failed" with its message and the tail of its traceback.
Progress goes to stdout as lines starting with PROGRESS_PREFIX.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .wire import (BuildJob, BuildRecord, Job, MeasureJob, MeasurementRecord, TrackerResult, decode_job,
                   encode_result)

PROGRESS_PREFIX = "@@variantlab-progress "


def progress(stage: str, fraction: float) -> None:
    print(PROGRESS_PREFIX + json.dumps({"stage": stage, "fraction": round(fraction, 4)}), flush=True)


def process_clock() -> float:
    """Seconds on the clock the process start time is read on: CLOCK_BOOTTIME on Linux (not moved by NTP)."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time()


def process_start_time() -> float:
    """When this process started, on `process_clock`, from the kernel's record.

    Linux: /proc/self/stat's start time, in clock ticks since boot (10 ms resolution). psutil's
    create_time adds the boot time from /proc/stat, a whole number of seconds, against time.time():
    that put up to a second into every cold start (0.4 s measured here)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if hasattr(time, "CLOCK_BOOTTIME"):
            return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    import psutil
    return psutil.Process(os.getpid()).create_time()


def failure_reason(e: BaseException) -> str:
    """One line: the exception and where it was raised (the last two frames of its traceback)."""
    from ..errors import VariantlabError
    if isinstance(e, VariantlabError):
        return e.one_line()
    frames = traceback.extract_tb(e.__traceback__)[-2:]
    where = " ← ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return f"{text} (at {where})" if where else text


def _status_of(e: BaseException) -> str:
    from ..errors import UnsupportedOnHardware
    return "unsupported" if isinstance(e, UnsupportedOnHardware) else "failed"


def setup(device: str, threads: int, seed: int) -> str:
    """Quiet transformers, resolve the device, set threads and seed; return the device."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return device


def import_stage(artifact_dir: str, trust_remote_code: bool = False) -> None:
    """Import everything loading and running this variant needs, so that "load" is the weights alone:
    torch, transformers, the model's class (transformers imports it lazily), the tokenizer's class,
    safetensors, and variantlab's recipes, kernels, engine and trackers."""
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.tokenization_auto import get_tokenizer_config, tokenizer_class_from_name

    from ..backends.torch_engine import TorchEngine  # noqa: F401
    from ..variants import build, quant_linear, registry  # noqa: F401
    from . import trackers  # noqa: F401

    config = AutoConfig.from_pretrained(artifact_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    try:
        AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:   # not an auto-mapped architecture: loading says what is wrong, with the file named
        pass
    name = get_tokenizer_config(artifact_dir).get("tokenizer_class")
    if name:
        tokenizer_class_from_name(name)


def kernels_built_here(device: str) -> float | None:
    """Load variantlab's CPU kernels now, in the import stage, for a CPU measurement; the seconds it took when
    this process had to build them (or wait for another's build): the command built them before its first
    worker, so that happens only when their cache went missing mid-run, and the cold start leaves it out."""
    if device != "cpu":
        return None
    from ..variants import kernels
    st = kernels.status(retry_failed=False)   # the command's own build failed: not again in every worker
    return st.load_s if st.built_here else None


# ---------------------------------------------------------------- measuring

@dataclass
class Host:
    """What the trackers see (measure/tracker.py HostContext)."""

    backend: object
    built: object
    samples: tuple[dict, ...]
    device: str
    cold_start: object
    baseline_bytes: int
    shapes: list[str] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)

    def progress(self, stage: str, fraction: float) -> None:
        progress(stage, fraction)

    def add_blob(self, data: bytes) -> str:
        from .tracker import blob_id
        sha = blob_id(data)
        self.blobs[sha] = data
        return sha


def run_measure(job: MeasureJob) -> tuple[MeasurementRecord, dict[str, bytes]]:
    if job.variant.get("endpoint"):
        return run_endpoint_measure(job)
    t_start = process_start_time()
    name = job.variant["name"]
    try:
        import_stage(job.artifact_dir, job.trust_remote_code)
        import torch
        from transformers import AutoTokenizer

        from ..backends.base import GenerationRequest, run_requests
        from ..backends.torch_engine import TorchEngine
        from ..environment import torch_fingerprint
        from ..variants import build as variants
        from .trackers.cold_start import ColdStartOutput
        from .trackers.memory import current_bytes
        device = setup(job.device, job.threads, job.seed)
        built_kernels_s = kernels_built_here(device)
        t_imported = process_clock()
        baseline = current_bytes(device)

        tokenizer = AutoTokenizer.from_pretrained(job.artifact_dir, local_files_only=True,
                                                  trust_remote_code=job.trust_remote_code)
        tokenizer_id = _tokenizer_id(job.artifact_dir)
        t_tokenizer = process_clock()
        built = variants.load(job.artifact_dir, device, tokenizer=tokenizer, trust_remote_code=job.trust_remote_code)
        t_loaded = process_clock()
        engine = TorchEngine(built.model, built.tokenizer, device, tokenizer_id=tokenizer_id)
        t_compiled = t_loaded     # without compile, setting up the engine counts toward the first token
        if job.variant.get("compile"):
            from ..variants.compiled import compile_variant
            built.facts = compile_variant(engine, built.model, built.facts)
            compile_warmup(engine, [s["prompt"] for s in job.samples[:2]])
            t_compiled = process_clock()
        run_requests(engine, [GenerationRequest("cold-start", prompt=job.samples[0]["prompt"], max_new_tokens=1)])
        t_first = process_clock()
        progress("loaded", 0.0)

        left_out = built_kernels_s or 0.0
        cold = ColdStartOutput(import_s=t_imported - t_start - left_out, tokenizer_s=t_tokenizer - t_imported,
                               load_s=t_loaded - t_tokenizer,
                               compile_s=(t_compiled - t_loaded) if job.variant.get("compile") else None,
                               first_token_s=t_first - t_compiled, total_s=t_first - t_start - left_out,
                               clock="the process's own start (kernel start time, boot clock)",
                               process_start=t_start, kernels_build_s=built_kernels_s)
        host = Host(engine, built, job.samples, device, cold, baseline)
        with torch.inference_mode():   # the engine then skips its own per-step mode switch (harness overhead)
            results, scenarios = run_trackers(host, job)
        progress("done", 1.0)
        env = torch_fingerprint(device, job.seed)
        reason = every_scenario_failed(results, scenarios)
        return (MeasurementRecord(variant=name, round=job.round, status="failed" if reason else "ok",
                                  reason=reason, device=device, ran_once=job.run_once,
                                  kernels=tuple(built.facts.kernels), notes=tuple(built.facts.notes),
                                  outputs=tuple(results), blobs={k: len(v) for k, v in host.blobs.items()},
                                  environment=env), host.blobs)
    except Exception as e:  # a failing variant is a record with its reason; the sweep goes on
        if _status_of(e) == "failed":
            traceback.print_exc()
        return MeasurementRecord(variant=name, round=job.round, status=_status_of(e), reason=failure_reason(e)), {}


def run_trackers(host, job: MeasureJob, *, remote: bool = False) -> tuple[list[TrackerResult], list[str]]:
    """Every tracker of the job on `host`, the one loop for every backend: (results, the scenarios' names).

    A tracker that raises (a scenario, a once-per-variant check) is that tracker's error: the round's other
    trackers, finished or still to run, keep their results, and its rows say why; non-finite logits fail the
    whole measurement (NonFiniteLogits). `remote` (an endpoint): a tracker that needs the model in this
    process says why it was not measured instead of running."""
    from ..backends.base import NonFiniteLogits
    from .scenarios.common import Scenario
    from .tracker import NOT_MEASURED
    from .trackers import tracker_from_config
    results, scenarios = [], []
    for tj in job.trackers:
        tracker = tracker_from_config(tj.kind, tj.config)
        if tracker.once and not job.run_once:
            continue
        if remote and tracker.needs_local_model:
            results.append(TrackerResult(kind=tracker.kind, name=tracker.name, data={},
                                         error=f"{NOT_MEASURED} for an endpoint: {tracker.remote_reason}"))
            continue
        if isinstance(tracker, Scenario):
            scenarios.append(tracker.name)
        try:
            out = tracker.run(host)
            nonfinite = getattr(out, "nonfinite", None)   # teacher-forced scoring names where
            if nonfinite:
                raise NonFiniteLogits(nonfinite)
        except NonFiniteLogits:
            raise          # garbage answers: the whole measurement failed, with where
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            results.append(TrackerResult(kind=tracker.kind, name=tracker.name, data={}, error=failure_reason(e)))
            continue
        host.outputs[tracker.name] = out
        results.append(TrackerResult(kind=tracker.kind, name=tracker.name, data=out.model_dump(mode="json")))
    return results, scenarios


def every_scenario_failed(results, scenarios: list[str]) -> str | None:
    """The reason a round failed when it hosted scenarios and every one raised: the first one's; else None
    (one good scenario keeps the round, and the report warns about the others)."""
    errors = [r for r in results if r.name in scenarios and r.error is not None]
    if not scenarios or len(errors) < len(scenarios):
        return None
    return f"every scenario failed; {errors[0].name}: {errors[0].error}"


def run_endpoint_measure(job: MeasureJob) -> tuple[MeasurementRecord, dict[str, bytes]]:
    """A `backend: openai` variant: the trackers that drive a backend (the scenarios, grading, the machine's
    yardstick) run against the endpoint over HTTP; the others say why they are not measured."""
    from ..backends.openai_http import Endpoint, OpenAIBackend
    from ..environment import torch_fingerprint
    name = job.variant["name"]
    endpoint = Endpoint.from_json(job.variant["endpoint"])
    backend = None
    try:
        setup("cpu", job.threads, job.seed)
        backend = OpenAIBackend(endpoint)
        host = Host(backend, None, job.samples, "endpoint", None, 0)
        results, scenarios = run_trackers(host, job, remote=True)
        progress("done", 1.0)
        reason = every_scenario_failed(results, scenarios)
        return (MeasurementRecord(variant=name, round=job.round, status="failed" if reason else "ok",
                                  reason=reason, device="endpoint", ran_once=job.run_once, kernels=(f"served by {endpoint.base_url} "
                                                                  f"(model {endpoint.model})",),
                                  outputs=tuple(results), environment=torch_fingerprint("cpu", job.seed)), {})
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return MeasurementRecord(variant=name, round=job.round, status="failed", reason=failure_reason(e)), {}
    finally:
        if backend is not None:
            backend.close()


def _tokenizer_id(path: str) -> str:
    from ..models.loading import tokenizer_fingerprint
    return tokenizer_fingerprint(Path(path))


# ---------------------------------------------------------------- building

def run_build(job: BuildJob) -> tuple[BuildRecord, dict[str, bytes]]:
    name = job.variant["name"]
    try:
        from ..environment import torch_fingerprint
        from ..variants import build as variants

        device = setup(job.device, job.threads, job.seed)
        kernels_built_here(device)
        progress("loading", 0.1)
        built = variants.build(job.source, variants.VariantDefinition.from_json(job.variant), device,
                               calibration_texts=job.calibration_texts, trust_remote_code=job.trust_remote_code)
        progress("saving", 0.7)
        meta = variants.save(built, job.source, job.artifact_dir)
        progress("saved", 1.0)
        return BuildRecord(variant=name, status="ok", artifact_dir=str(Path(job.artifact_dir).resolve()),
                           facts=meta["facts"], bytes_on_disk=meta["weights"]["bytes_on_disk"],
                           timings=meta["build"], environment=torch_fingerprint(device, job.seed)), {}
    except Exception as e:  # noqa: BLE001
        if _status_of(e) == "failed":
            traceback.print_exc()
        return BuildRecord(variant=name, status=_status_of(e), reason=failure_reason(e)), {}


def run_job(job: Job):
    """(record, blobs) of one job, run in this process."""
    return run_build(job) if isinstance(job, BuildJob) else run_measure(job)


def main(argv: list[str]) -> int:
    job_path, out_path = argv
    job = decode_job(Path(job_path).read_bytes())
    record, blobs = run_job(job)
    tmp = Path(out_path).with_suffix(".partial")
    tmp.write_bytes(encode_result(record, blobs))
    tmp.replace(out_path)  # the executor never sees half a result
    return 1 if record.status == "failed" else 0


def compile_warmup(backend, prompts) -> None:
    """`compile: true` (variants/compiled.py): one request and a batch of two run, so that inductor compiles the
    shapes the scenarios start with here, in the compile stage, never in a timed request."""
    from ..backends.base import GenerationRequest, run_requests

    prompts = list(prompts[:2]) * (2 if len(prompts) < 2 else 1)
    run_requests(backend, [GenerationRequest("compile", prompt=prompts[0], max_new_tokens=3)])
    run_requests(backend, [GenerationRequest(f"compile-{i}", prompt=p, max_new_tokens=3)
                           for i, p in enumerate(prompts[:2])])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
