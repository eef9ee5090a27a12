"""The profiling tracker: where a variant's prefill and decode time goes, by operator (explain's input).

Hosted by the worker in jobs of their own (`variantlab explain`, `explain: true`), never beside the
timed scenarios, so the profiler's cost touches no reported figure. For each workload it is given
(single-stream: requests one at a time; offline: one batch), it runs explain/profiling.py's
`profile_workload` (plain timed runs interleaved with profiled runs, modules marked), reads hardware
counters over one more plain run (explain/counters.py), and records the model's shape for the
roofline. Its output has no rows of its own in the comparison table: explain/attribution.py reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..tracker import Output, TrackerBase


class OpTime(Output):
    name: str
    category: str
    region: str | None
    self_s: float        # over the whole workload, one profiled run
    calls: int


class ProfiledRun(Output):
    seconds: float       # the phase's wall time under the profiler
    ops: tuple[OpTime, ...]


class PhaseProfile(Output):
    phase: str           # prefill | decode
    tokens: int          # prompt tokens (prefill) or generated tokens after each request's first (decode)
    plain_s: tuple[float, ...]        # the phase's seconds in each plain run
    profiled: tuple[ProfiledRun, ...]


class Counters(Output):
    reason: str | None   # None: counted
    counts: dict[str, float]
    tokens: int          # generated tokens over the counted run


class WorkloadProfile(Output):
    scenario: str        # single-stream | offline
    batch: int
    requests: int
    prompt_tokens: int
    new_tokens: int      # per request
    mean_prompt_tokens: float
    phases: tuple[PhaseProfile, ...]
    counters: Counters


class ProfileOutput(Output):
    device: str
    recipe: str
    dtype: str
    ceilings: dict       # hardware.Ceilings' fields: this machine's, with the worker's threads
    compiled: bool
    marked_modules: int
    shape: dict          # roofline.ModelShape's fields
    kernels: tuple[str, ...]
    workloads: tuple[WorkloadProfile, ...]


@dataclass(frozen=True)
class WorkloadSpec:
    scenario: str
    batch: int
    requests: int

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "batch": self.batch, "requests": self.requests}


@dataclass(frozen=True)
class Profile(TrackerBase):
    workloads: tuple[WorkloadSpec, ...] = (WorkloadSpec("single-stream", 1, 4),)
    max_new_tokens: int = 24
    reps: int = 3
    kind = "profile"
    remote_reason = "profiling needs the model in the measuring process"
    name = "profile"
    output_model = ProfileOutput

    def config(self) -> dict:
        return {"workloads": [w.to_json() for w in self.workloads], "max_new_tokens": self.max_new_tokens,
                "reps": self.reps}

    @classmethod
    def from_config(cls, config: dict) -> "Profile":
        return cls(tuple(WorkloadSpec(**w) for w in config["workloads"]), config["max_new_tokens"], config["reps"])

    def metrics(self):
        return ()

    def run(self, ctx) -> ProfileOutput:
        import dataclasses

        from ...backends.base import GenerationRequest
        from ...explain.counters import perf_stat
        from ...explain.profiling import PHASES, phase_times, profile_workload
        from ...hardware import cached_ceilings
        from ...explain.roofline import model_shape
        from ...variants.recipe import decode_weight_bytes

        engine, model = ctx.backend, getattr(ctx.built, "model", None)   # None: another runtime's (llama.cpp)
        out = []
        for i, w in enumerate(self.workloads):
            ctx.progress(f"profiling {w.scenario}", i / len(self.workloads))
            prompts = [engine.encode(s["prompt"]) for s in ctx.samples[:w.requests]]
            requests = [GenerationRequest(f"p{j}", prompt_ids=tuple(p), max_new_tokens=self.max_new_tokens,
                                          stop_on_eos=False) for j, p in enumerate(prompts)]
            batches = [requests[j:j + w.batch] for j in range(0, len(requests), w.batch)]
            got = profile_workload(engine, model, batches, self.reps, ctx.device)
            with perf_stat() as reading:
                phase_times(engine, batches, marked=False)
            tokens = {"prefill": sum(map(len, prompts)), "decode": len(prompts) * (self.max_new_tokens - 1)}
            phases = tuple(PhaseProfile(
                phase=p, tokens=tokens[p], plain_s=tuple(got["plain"][p]),
                profiled=tuple(ProfiledRun(seconds=run["seconds"][p], ops=tuple(
                    OpTime(name=n, category=c, region=r, self_s=s, calls=k)
                    for (n, c, r), (s, k) in sorted(run["ops"][p].items(), key=lambda kv: -kv[1][0])))
                    for run in got["profiled"]))
                for p in PHASES)
            out.append(WorkloadProfile(
                scenario=w.scenario, batch=w.batch, requests=len(prompts), prompt_tokens=tokens["prefill"],
                new_tokens=self.max_new_tokens, mean_prompt_tokens=tokens["prefill"] / max(len(prompts), 1),
                phases=phases, counters=Counters(reason=reading.reason, counts=dict(reading.counts),
                                                 tokens=len(prompts) * self.max_new_tokens)))
            marked = got["marked_modules"]
        facts = ctx.built.facts
        shape = (dataclasses.asdict(model_shape(model, decode_weight_bytes(model))) if model is not None
                 else facts.extra["shape"])      # what the other runtime's build read of its file
        ceilings, _ = cached_ceilings(ctx.device)
        decode = getattr(engine, "_decode", None)   # transformers' forward, our decode step, or a compiled step
        compiled = decode is not None and decode != getattr(engine, "_forward", None) \
            and decode is not getattr(engine, "step", None)
        return ProfileOutput(device=ctx.device, recipe=facts.recipe, dtype=facts.dtype, ceilings=ceilings.to_json(),
                             compiled=compiled, marked_modules=marked if out else 0, shape=shape,
                             kernels=tuple(ctx.built.facts.kernels), workloads=tuple(out))
