"""Cold start: a fresh process from its own start to its first token, stage by stage.

The worker (measure/worker.py) times the stages from the process's own start time (the kernel's
record of when it was created, so the figure holds wherever the worker runs, another host
included): import (every module the variant needs: torch, transformers, the model's class and
the tokenizer's, variantlab's kernels) → tokenizer → load (the weights only) → compile (when the
variant asks) → first token. This tracker hands those timings on and owns their rows.

Our CPU kernels are built once per machine by the command, before its first worker; a worker that
still had to build them (their cache vanished mid-run) or wait for another process's build leaves
that time out of import and total (`kernels_build_s` keeps it) and the comparison warns.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..stats import mean
from ..tracker import MetricDef, Output, Unconfigured


class ColdStartOutput(Output):
    import_s: float
    tokenizer_s: float
    load_s: float
    compile_s: float | None = None
    first_token_s: float
    total_s: float
    clock: str     # what "start" means
    process_start: float | None = None   # when the process started, on that clock (seconds since boot on Linux)
    kernels_build_s: float | None = None  # building (or waiting for a build of) our kernels: left out of import, total


def _stage(field: str):
    return lambda out: [] if getattr(out, field) is None else [getattr(out, field)]


@dataclass(frozen=True)
class ColdStart(Unconfigured):
    kind = "cold_start"
    remote_reason = "the endpoint's own process start is not visible from the client"
    name = "cold_start"
    output_model = ColdStartOutput

    def metrics(self) -> tuple[MetricDef, ...]:
        return (
            MetricDef("total", "Cold start (process start → first token)", "s", True, "process", _stage("total_s"),
                      mean, headline=9),
            MetricDef("import", "Cold start: import", "s", True, "process", _stage("import_s"), mean),
            MetricDef("tokenizer", "Cold start: tokenizer", "s", True, "process", _stage("tokenizer_s"), mean),
            MetricDef("load", "Cold start: load weights", "s", True, "process", _stage("load_s"), mean),
            MetricDef("compile", "Cold start: compile", "s", True, "process", _stage("compile_s"), mean),
            MetricDef("first_token", "Cold start: first token", "s", True, "process", _stage("first_token_s"), mean),
        )

    def run(self, ctx) -> ColdStartOutput:
        return ctx.cold_start

    def warnings(self, variant: str, out: ColdStartOutput) -> list[str]:
        if out.kernels_build_s is None:
            return []
        return [f"{variant}: its worker had to build variantlab's CPU kernels (or wait for another process's build: "
                f"{out.kernels_build_s:.1f} s, their cache went missing during the run); that time is left out of its "
                "cold start"]
