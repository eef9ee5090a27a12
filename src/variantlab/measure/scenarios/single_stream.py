"""single-stream: one request at a time, cycling through the dataset: per-request latency.

After warm-up (one short request per distinct prompt length it will send, then `warmup` full
requests), it sends requests one by one until both `requests` and `min_duration_s` are reached.
One timed pass; its records give E2EL, TTFT, TPOT, ITL, output throughput and goodput. In a round
in turns (measure/turns.py) each request is a turn of its own, led in by the request before it, run
untimed (common.rewarm), and the pass's time leaves out the waits and the lead-ins.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict, Field

from ...backends.base import run_requests
from ...spec_model import SpecModel
from ..tracker import MetricDef
from ...sizes import MAX_DURATION_S, MAX_REQUESTS, MAX_WARMUP
from .common import (PassOutput, Scenario, ScenarioOutput, bandwidth_rows, decode_bytes, labelled, latency_rows,
                     requests_for, shapes_text, take_turn, warm_up)


class SingleStreamSpec(SpecModel):
    """One request at a time: per-request latency (E2EL, TTFT, TPOT, ITL)."""

    model_config = ConfigDict(allow_inf_nan=False)   # bounds: variantlab/sizes.py

    type: Literal["single-stream"]
    name: str | None = Field(None, description="row label and key (default: the type); needed when a suite "
                                               "has two scenarios of one type")
    requests: int = Field(16, ge=1, le=MAX_REQUESTS, description="minimum number of measured requests (per round)")
    min_duration_s: float = Field(0.0, ge=0, le=MAX_DURATION_S, description="keep sending until this much time "
                                                                            "has passed")
    warmup: int = Field(2, ge=0, le=MAX_WARMUP, description="full requests sent first and not measured (after one "
                                                            "short request per prompt length)")

    def context_lengths(self) -> list[int]:
        return []


@dataclass(frozen=True)
class SingleStream(Scenario):
    kind = "single-stream"
    role = "latency"
    one_at_a_time = True
    time_row = "e2el_p50"
    measured_rows = {"prefill": (("ttft_p50", "TTFT p50"),), "decode": (("tpot_p50", "TPOT p50"),)}
    PROFILED_REQUESTS = 4     # enough tokens for per-token figures, seconds of work

    @classmethod
    def profile_workload(cls, spec, n_samples: int) -> tuple[int, int] | None:
        return 1, min(cls.PROFILED_REQUESTS, n_samples)
    spec_model = SingleStreamSpec

    def metrics(self) -> tuple[MetricDef, ...]:
        return labelled(self.name, latency_rows(self.workload.slo) + bandwidth_rows())

    def run(self, ctx) -> ScenarioOutput:
        backend, samples, s = ctx.backend, ctx.samples, self.spec
        reach = len(samples) if s.min_duration_s > 0 else min(len(samples), s.requests)
        ctx.turn(f"{self.name} warm-up")
        warmed = warm_up(backend, [[r] for r in requests_for(samples, reach, self.workload)],
                         [[r] for r in requests_for(samples, s.warmup, self.workload)])
        records = []
        start = self.clock()
        paused = 0.0      # at turns (interleave: requests): other variants' requests and the lead-ins, not this one's
        i = 0
        while i < s.requests or self.clock() - start - paused < s.min_duration_s:
            # after a turn, the request before this one leads in: the timed one follows another, as back to back
            # (the same request run just before ran 9% faster here)
            paused += take_turn(ctx, f"{self.name} request {i + 1}", backend,
                                requests_for(samples, 1, self.workload, offset=i - 1), self.clock)
            records += run_requests(backend, requests_for(samples, 1, self.workload, offset=i))
            i += 1
            ctx.progress(self.name, min(1.0, i / s.requests))
        end = self.clock()
        ctx.shapes.append(f"{self.name}: {shapes_text(records, 1)}")
        return ScenarioOutput(passes=(PassOutput(start=start, end=end, paused=paused, records=tuple(records)),),
                              shapes=shapes_text(records, 1), warmed_shapes=warmed, **decode_bytes(ctx))
