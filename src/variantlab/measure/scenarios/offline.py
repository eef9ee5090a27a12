"""offline: the whole dataset in batches, as one timed pass: single-task latency and throughput.

A pass's wall time is docs/metrics.md's single-task latency (the analysis's "6.8 min"). Passes repeat
until both `passes` and `min_duration_s` are reached. Warm-up runs each batch of the pass once,
short (prefill + one decode step), then `warmup` full batches. A backend that cannot batch gets
the requests one at a time (its shapes note says so). In a round in turns (measure/turns.py) each
pass is a turn of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict, Field

from ...backends.base import run_requests
from ...spec_model import SpecModel
from .. import metrics as m
from ..stats import mean
from ..tracker import MetricDef
from ...sizes import MAX_BATCH, MAX_DURATION_S, MAX_PASSES, MAX_WARMUP
from .common import (PassOutput, Scenario, ScenarioOutput, labelled, pass_rate, requests_for, shapes_text, take_turn,
                     warm_up)


class OfflineSpec(SpecModel):
    """The whole dataset in batches: single-task latency and throughput."""

    model_config = ConfigDict(allow_inf_nan=False)   # bounds: variantlab/sizes.py

    type: Literal["offline"]
    name: str | None = Field(None, description="row label and key (default: the type)")
    batch_size: int = Field(16, ge=1, le=MAX_BATCH)
    passes: int = Field(3, ge=1, le=MAX_PASSES, description="minimum number of timed passes over the dataset "
                                                            "(per round)")
    min_duration_s: float = Field(0.0, ge=0, le=MAX_DURATION_S, description="keep passing until this much time "
                                                                            "has passed")
    warmup: int = Field(1, ge=0, le=MAX_WARMUP, description="full batches run first and not measured (after one "
                                                            "short run of each batch shape)")

    def context_lengths(self) -> list[int]:
        return []


@dataclass(frozen=True)
class Offline(Scenario):
    kind = "offline"
    role = "throughput"
    time_row = "single_task_latency"
    measured_rows = {"decode": (("single_task_latency", "single-task latency"),
                                ("output_throughput", "output throughput"))}

    @classmethod
    def profile_workload(cls, spec, n_samples: int) -> tuple[int, int] | None:
        batch = min(spec.batch_size, n_samples)
        return batch, batch
    spec_model = OfflineSpec

    def metrics(self) -> tuple[MetricDef, ...]:
        return labelled(self.name, (
            MetricDef("single_task_latency", "Single-task latency (whole dataset)", "s", True, "samples",
                      lambda out: [p.wall_time for p in out.passes], mean, headline=3, checks_stability=True),
            MetricDef("output_throughput", "Output throughput", "tok/s", False, "samples",
                      pass_rate(m.output_throughput), mean, headline=7, checks_stability=True),
            MetricDef("peak_throughput", "Peak throughput (best 1 s)", "tok/s", False, "samples",
                      lambda out: [x for p in out.passes if (x := m.peak_throughput(p.records)) is not None], mean),
        ))

    def _batches(self, backend, samples) -> list[list]:
        size = self.spec.batch_size if backend.capabilities.batching else 1
        requests = requests_for(samples, len(samples), self.workload)
        return [requests[k:k + size] for k in range(0, len(requests), size)]

    def run(self, ctx) -> ScenarioOutput:
        backend, s = ctx.backend, self.spec
        batches = self._batches(backend, ctx.samples)
        ctx.turn(f"{self.name} warm-up")
        warmed = warm_up(backend, batches, [batches[w % len(batches)] for w in range(s.warmup)])
        passes = []
        start = self.clock()
        paused = 0.0
        while len(passes) < s.passes or self.clock() - start - paused < s.min_duration_s:
            # a pass is many batches: a short run of one brings the worker back after a turn
            paused += take_turn(ctx, f"{self.name} pass {len(passes) + 1}", backend, batches[0], self.clock, full=False)
            t0 = self.clock()
            records = [rec for batch in batches for rec in run_requests(backend, batch)]
            passes.append(PassOutput(start=t0, end=self.clock(), records=tuple(records)))
            ctx.progress(self.name, min(1.0, len(passes) / s.passes))
        shapes = shapes_text(passes[0].records, len(batches[0]))
        ctx.shapes.append(f"{self.name}: {shapes}")
        return ScenarioOutput(passes=tuple(passes), shapes=shapes, warmed_shapes=warmed)
