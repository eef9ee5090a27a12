"""The measuring host: one job, in a fresh process, in, one record (and its blobs) out.

    python -m variantlab.measure.worker JOB.json RESULT.bin      (the local executor runs this)

`run_job(job)` is the whole of it, callable in any process (a Ray task calls it directly):
- a `BuildJob` builds the variant by its backend kind's build hook (measure/backend_kinds/: torch
  builds it from its checkpoint through `variants.build` and saves the artifact);
- a `MeasureJob` has its variant brought up by its backend kind's `open` (torch: the cold start timed
  from this process's own start — import → tokenizer → load → compile (when asked) → first token;
  openai: a client of the endpoint), then hosts the job's trackers in order (measure/trackers/), one
  loop for every backend: the scenarios and memory, and, in a variant's first good round, the
  once-per-variant ones (facts, attention error, grading, scoring). A tracker that raises is
  recorded as that tracker's error, and the round's other trackers keep their results. When every
  scenario raised, the round measured none of the workload: it is "failed", with the first
  scenario's reason (issue 22: GPT-2's scenarios all raised IndexError and the variant read "ok"),
  and its record still carries what the other trackers measured. NaN or inf logits (the engine
  checks each prompt's, scoring each text's) fail the whole measurement. A backend whose model is not
  in this process (`local_model` false) has the trackers that need it say why they were not measured.
Cold start and peak memory are the process's own, so a job needs a process of its own: a Ray task
that calls `run_job` must not share its worker process with another (max_calls=1).
A failure is a record too: "unsupported" only when a capability check says the device cannot run
the recipe; any other exception is "failed" with its message and the tail of its traceback.
Progress goes to stdout as lines starting with PROGRESS_PREFIX.
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .backend_kinds import backend_kind
from .turns import Turn, gate, no_turns
from .process import (PROGRESS_PREFIX, failure_reason, process_clock,  # noqa: F401 (read from here too)
                      process_start_time, progress, status_of)
from .wire import (BuildJob, BuildRecord, Job, MeasureJob, MeasurementRecord, TrackerResult, decode_job,
                   encode_result)


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
    reference_dir: str | None = None
    writes_reference: bool = False
    same_checkpoint: bool = False
    turn: Turn = no_turns       # a round in turns: wait for the executor's go (measure/turns.py)

    def progress(self, stage: str, fraction: float) -> None:
        progress(stage, fraction)

    def add_blob(self, data: bytes) -> str:
        from .tracker import blob_id
        sha = blob_id(data)
        self.blobs[sha] = data
        return sha


def run_measure(job: MeasureJob) -> tuple[MeasurementRecord, dict[str, bytes]]:
    """The job's variant brought up by its backend kind (measure/backend_kinds/), its trackers run on it, one
    record out; a variant that fails is a record with its reason, and the sweep goes on."""
    t_start = process_start_time()
    name = job.variant.name
    opened = None
    try:
        kind = backend_kind(job.variant.backend)
        opened = kind.open(job, t_start)
        host = Host(opened.backend, opened.built, job.samples, opened.device, opened.cold, opened.baseline_bytes,
                    reference_dir=job.reference_dir, writes_reference=job.writes_reference,
                    same_checkpoint=job.same_checkpoint, turn=gate() if job.turns else no_turns)
        with opened.context():
            results, scenarios = run_trackers(host, job, remote=not kind.local_model,
                                              runtime=None if kind.torch_model else kind.runtime)
        progress("done", 1.0)
        reason = every_scenario_failed(results, scenarios)
        return (MeasurementRecord(variant=name, round=job.round, status="failed" if reason else "ok",
                                  reason=reason, device=opened.device, ran_once=job.run_once,
                                  kernels=opened.kernels(), notes=opened.notes(), outputs=tuple(results),
                                  blobs={k: len(v) for k, v in host.blobs.items()},
                                  environment=opened.environment), host.blobs)
    except Exception as e:  # a failing variant is a record with its reason; the sweep goes on
        if status_of(e) == "failed":
            traceback.print_exc()
        return MeasurementRecord(variant=name, round=job.round, status=status_of(e), reason=failure_reason(e)), {}
    finally:
        if opened is not None:
            opened.close()


def run_trackers(host, job: MeasureJob, *, remote: bool = False,
                 runtime: str | None = None) -> tuple[list[TrackerResult], list[str]]:
    """Every tracker of the job on `host`, the one loop for every backend: (results, the scenarios' names).

    A tracker that raises (a scenario, a once-per-variant check) is that tracker's error: the round's other
    trackers, finished or still to run, keep their results, and its rows say why; non-finite logits fail the
    whole measurement (NonFiniteLogits). `remote` (an endpoint): a tracker that needs the model in this
    process says why it was not measured instead of running; so does one that reads our torch modules where the
    model runs on another `runtime` (llama.cpp)."""
    from ..backends.base import NonFiniteLogits
    from .scenarios.common import Scenario
    from .tracker import NOT_MEASURED, NotMeasured
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
        if runtime is not None and tracker.needs_torch_model:
            results.append(TrackerResult(kind=tracker.kind, name=tracker.name, data={},
                                         error=f"{NOT_MEASURED} on {runtime}: it reads our torch modules "
                                               f"({tracker.remote_reason})"))
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
        except NotMeasured as e:   # a row this backend cannot give: said in one line, not a failure
            who = "an endpoint" if remote else "this backend"
            results.append(TrackerResult(kind=tracker.kind, name=tracker.name, data={},
                                         error=f"{NOT_MEASURED} for {who}: {' '.join(str(e).split())}"))
            continue
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            results.append(TrackerResult(kind=tracker.kind, name=tracker.name, data={}, error=failure_reason(e)))
            continue
        host.outputs[tracker.name] = out
        results.append(TrackerResult(kind=tracker.kind, name=tracker.name, data=out.model_dump(mode="json")))
    return with_read_bandwidth(results), scenarios


def with_read_bandwidth(results: list[TrackerResult]) -> list[TrackerResult]:
    """Each scenario result that counted the bytes a decode step reads, with the rate this process reads memory
    (hardware.read_bandwidth), measured once, after every tracker: its 128 MiB buffer, measured during a
    scenario, was in the memory tracker's peak (156 MiB above the baseline for a 4 MiB model)."""
    wanted = [i for i, r in enumerate(results) if r.error is None and "read_gbps" in r.data
              and r.data["read_gbps"] is None and r.data.get("weight_bytes_per_token") is not None]
    if not wanted:
        return results
    from ..hardware import read_bandwidth
    gbps = read_bandwidth()
    out = list(results)
    for i in wanted:
        out[i] = results[i].model_copy(update={"data": {**results[i].data, "read_gbps": gbps}})
    return out


def every_scenario_failed(results, scenarios: list[str]) -> str | None:
    """The reason a round failed when it hosted scenarios and every one raised: the first one's; else None
    (one good scenario keeps the round, and the report warns about the others)."""
    errors = [r for r in results if r.name in scenarios and r.error is not None]
    if not scenarios or len(errors) < len(scenarios):
        return None
    return f"every scenario failed; {errors[0].name}: {errors[0].error}"


# ---------------------------------------------------------------- building

def run_build(job: BuildJob) -> tuple[BuildRecord, dict[str, bytes]]:
    """The job's variant built by its backend kind's build hook; a failure is a record with its reason."""
    name = job.variant.name
    try:
        return backend_kind(job.variant.backend).build(job)
    except Exception as e:  # noqa: BLE001
        if status_of(e) == "failed":
            traceback.print_exc()
        return BuildRecord(variant=name, status=status_of(e), reason=failure_reason(e)), {}


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
