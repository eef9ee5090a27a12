"""What the scenarios share: their output record, warm-up over every shape they will send, and
the per-request metric rows (docs/metrics.md's E2EL, TTFT, TPOT, ITL, throughput, goodput).

Warm-up covers shapes: a kernel's first call at a new shape can carry one-off costs (bf16 prefill
at an unseen prompt length ran 1.4–1.6x slower than at a repeated one on our CPUs), so before
timing, each scenario sends one short request (prefill + one decode step) per distinct shape it
will send — every prompt length, every batch — then its `warmup` full requests.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

from pydantic import Field

from ...backends.base import Clock, GenerationRequest, run_requests
from .. import metrics as m
from ..records import RequestRecord, ScenarioPass
from ..stats import mean, quantile
from ..tracker import MetricDef, Output, TrackerBase, WorkloadSettings

WARMUP_TOKENS = 2   # prefill and one decode step: every kernel a shape reaches


class PassOutput(Output):
    """One timed pass: the wall clock around it and every request it sent."""

    start: float
    end: float
    records: tuple[RequestRecord, ...]
    paused: float = 0.0     # of end - start, at turns (other variants ran) and their lead-ins (measure/turns.py)

    @property
    def wall_time(self) -> float:
        return self.end - self.start - self.paused

    def to_pass(self, scenario: str) -> ScenarioPass:
        return ScenarioPass(scenario, self.start, self.end, self.records, self.paused)


class ScenarioOutput(Output):
    passes: tuple[PassOutput, ...]
    shapes: str = Field(description="the shapes it sent, for the memory row's coverage note")
    warmed_shapes: int = 0
    # What a decode step must read, and how fast this process reads memory (measured in the same round):
    weight_bytes_per_token: int | None = None     # every weight a step reads (variants/recipe.decode_weight_bytes)
    kv_bytes_per_position: int | None = None      # KV cache read per cached position
    read_gbps: float | None = None                # hardware.read_bandwidth with the worker's threads, measured
                                                  # after every tracker (measure/worker.with_read_bandwidth)


@dataclass(frozen=True)
class Scenario(TrackerBase):
    """What every scenario tracker shares: its suite entry, the workload's stop rules and SLOs, a clock.
    A subclass sets `kind` and `spec_model` and writes `metrics` and `run`."""

    spec: Any
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    clock: Clock = time.perf_counter
    kind = ""
    spec_model = None       # the suite entry's pydantic model (a class attribute, not a field)
    output_model = ScenarioOutput
    needs_local_model = False   # a scenario drives any backend, an endpoint's included
    # What the layers above read instead of the scenario's type name (charts, explain, objectives, the matrix):
    role = ""               # "latency": requests as a user waits on each | "throughput": batches | "sweep": lengths
    one_at_a_time = False   # requests run one at a time (the throughput chart's batch-1 point; explain's TPOT check)
    time_row: ClassVar[str | None] = None   # the row the selection matrix reads as this scenario's time
    measured_rows: ClassVar[dict] = {}      # profiled phase → ((row suffix, label), …) explain quotes beside it

    @classmethod
    def profile_workload(cls, spec, n_samples: int) -> tuple[int, int] | None:
        """(batch, requests) explain profiles this scenario's work with; None: it is not profiled."""
        return None

    @property
    def name(self) -> str:
        return self.spec.name or self.kind

    def config(self) -> dict:
        return {"spec": self.spec.model_dump(mode="json"), "workload": self.workload.to_json()}

    @classmethod
    def from_config(cls, config: dict):
        return cls(cls.spec_model.model_validate(config["spec"]), WorkloadSettings.from_json(config["workload"]))


def warm_up(backend, batches: Sequence[Sequence[GenerationRequest]], full: Sequence[Sequence[GenerationRequest]]) -> int:
    """One short run of each distinct batch shape (batch size, longest prompt), then the full warm-up
    batches; nothing recorded. Returns how many shapes were warmed."""
    seen: set[tuple[int, int]] = set()
    for batch in batches:
        shape = (len(batch), max(_prompt_len(backend, r) for r in batch))
        if shape in seen:
            continue
        seen.add(shape)
        run_requests(backend, [_short(r) for r in batch])
    for batch in full:
        run_requests(backend, list(batch))
    return len(seen)


LEAD_IN_S = 0.03   # after a turn, a worker's own untimed work before it is timed again (rewarm)


def rewarm(backend, batch: Sequence[GenerationRequest], full: bool = True, clock: Clock = time.perf_counter,
           lead_in_s: float = LEAD_IN_S) -> None:
    """After a turn (measure/turns.py), the batch run again, untimed — in full (`full`) or short — until
    `lead_in_s` of this worker's own time has passed (once at least). Another worker's turn leaves this one slow
    for tens of milliseconds, not one request: after a peer's request (2 threads each, 2-core EPYC, the
    reference model) the same request ran at 10.1, 6.5, 4.9, then 4.6 ms steadily; one request run first left
    TTFT 44% above back to back, and single-stream TTFT p50 in turns read 1.6x one process after another."""
    t0 = clock()
    while True:
        run_requests(backend, list(batch) if full else [_short(r) for r in batch])
        if clock() - t0 >= lead_in_s:
            return


def take_turn(ctx, tag: str, backend, batch: Sequence[GenerationRequest], clock: Clock, full: bool = True) -> float:
    """Wait at turn `tag` (measure/turns.py) and, when this worker waited, lead in with `batch` (rewarm); the
    seconds both took, which the pass's time leaves out. Alone (no turns): nothing, 0 s."""
    t0 = clock()
    if not ctx.turn(tag):
        return 0.0
    rewarm(backend, batch, full, clock)
    return clock() - t0


def _short(r: GenerationRequest) -> GenerationRequest:
    return GenerationRequest(f"warmup-{r.request_id}", r.prompt, r.prompt_ids, WARMUP_TOKENS, stop_on_eos=False)


def _prompt_len(backend, r: GenerationRequest) -> int:
    return len(r.prompt_ids) if r.prompt_ids is not None else len(backend.encode(r.prompt))


def requests_for(samples: Sequence[dict], count: int, settings, offset: int = 0) -> list[GenerationRequest]:
    """`count` requests cycling through the samples, with the workload's stop rules."""
    out = []
    for i in range(offset, offset + count):
        s = samples[i % len(samples)]
        out.append(GenerationRequest(str(s.get("id", i % len(samples))), prompt=s["prompt"],
                                     max_new_tokens=settings.max_new_tokens, stop=settings.stop))
    return out


def shapes_text(records: Sequence[RequestRecord], batch: int) -> str:
    lengths = [r.tokens_in for r in records]
    out = max((r.tokens_out for r in records), default=0)
    if not lengths:
        return "nothing sent"
    span = f"{min(lengths)}–{max(lengths)}" if min(lengths) != max(lengths) else f"{lengths[0]}"
    return f"batches of {batch} × {span} prompt tokens, up to {out} new"


# ---------------------------------------------------------------- rows

def labelled(name: str, rows) -> tuple[MetricDef, ...]:
    """Rows labelled with the scenario they come from: "TPOT p50 [single-stream]"."""
    return tuple(dataclasses.replace(d, label=f"{d.label} [{name}]") for d in rows)


def _records(out: ScenarioOutput) -> list[RequestRecord]:
    return [r for p in out.passes for r in p.records]


def latency_rows(slo: dict) -> tuple[MetricDef, ...]:
    """Per-request rows of a scenario whose requests each stand alone: E2EL, TTFT, TPOT, ITL, goodput."""
    def per_request(metric: Callable) -> Callable[[ScenarioOutput], list[float]]:
        return lambda out: metric(_records(out))

    def row(key: str, label: str, metric: Callable, statistic, **kw) -> MetricDef:
        kw.setdefault("sample_name", "requests")
        return MetricDef(key, label, "s", True, "samples", per_request(metric), statistic, **kw)

    rows = [
        row("e2el_p50", "E2EL p50", m.e2el, quantile(50)),
        row("e2el_p90", "E2EL p90", m.e2el, quantile(90)),
        row("e2el_p95", "E2EL p95", m.e2el, quantile(95)),
        row("e2el_p99", "E2EL p99", m.e2el, quantile(99)),
        row("e2el_mean", "E2EL mean", m.e2el, mean),
        row("ttft_p50", "TTFT p50", m.ttft, quantile(50), headline=4),
        row("ttft_p95", "TTFT p95", m.ttft, quantile(95)),
        row("ttft_p99", "TTFT p99", m.ttft, quantile(99)),
        row("tpot_p50", "TPOT p50", m.tpot, quantile(50), headline=5, checks_stability=True),
        row("tpot_p95", "TPOT p95", m.tpot, quantile(95)),
        row("itl_p50", "ITL p50", m.itl, quantile(50), sample_name="token gaps"),
        row("itl_p95", "ITL p95", m.itl, quantile(95), sample_name="token gaps"),
        row("itl_p99", "ITL p99", m.itl, quantile(99), sample_name="token gaps"),
        MetricDef("output_throughput", "Output throughput", "tok/s", False, "samples", pass_rate(m.output_throughput),
                  mean),
    ]
    objectives = {k: v for k, v in (slo or {}).items() if v is not None}
    if objectives:
        goal = m.SLO(**objectives)
        rows.append(MetricDef("goodput", "Goodput (" + ", ".join(f"{k.removesuffix('_s').upper()} ≤ {v:g} s"
                                                                   for k, v in objectives.items()) + ")",
                              "req/s", False, "samples",
                              lambda out: [x for p in out.passes
                                           if (x := m.goodput(p.records, p.wall_time, goal)) is not None],
                              mean))
    return tuple(rows)


def decode_gbps(out: ScenarioOutput) -> list[float]:
    """Per request: the bytes one decode step reads (weights + KV cache at the request's mean context)
    ÷ its TPOT, in GB/s: what the step achieved against what it had to move."""
    if out.weight_bytes_per_token is None:
        return []
    kv = out.kv_bytes_per_position or 0
    gbps = []
    for r in (r for p in out.passes for r in p.records if r.ok and r.tokens_out >= 2):
        context = r.tokens_in + (r.tokens_out - 1) / 2
        gbps.append((out.weight_bytes_per_token + kv * context) / m.tpot([r])[0] / 1e9)
    return gbps


def decode_bytes(ctx) -> dict:
    """What a decode step of the host's variant reads (the fields of ScenarioOutput); {} where the host has no
    model (a remote backend). The rate this process reads memory is measured by the worker once every tracker
    has run (`read_gbps` left None here): the probe's 128 MiB buffer would otherwise be in the memory
    tracker's peak."""
    built = getattr(ctx, "built", None)
    if built is None:
        return {}
    if getattr(built, "model", None) is None:     # another runtime's model: what its build counted, if anything
        counted = built.facts.extra.get("decode_weight_bytes")
        return {} if counted is None else {"weight_bytes_per_token": counted, "kv_bytes_per_position": None}
    from ...variants.recipe import decode_weight_bytes
    attn = getattr(built.facts, "attention", None)
    return {"weight_bytes_per_token": decode_weight_bytes(built.model),
            "kv_bytes_per_position": attn.kv_cache_bytes_per_token if attn else None}


def bandwidth_rows() -> tuple[MetricDef, ...]:
    """Decode GB/s beside tok/s, and as a share of the rate this process reads memory."""
    return (
        MetricDef("decode_gbps", "Decode bandwidth (bytes a token reads ÷ TPOT)", "GB/s", False, "samples",
                  decode_gbps, quantile(50), headline=6, sample_name="requests",
                  note=lambda out: None if out.read_gbps is None else
                  f"{(out.weight_bytes_per_token or 0) / 2**20:.1f} MiB of weights + "
                  f"{(out.kv_bytes_per_position or 0) / 2**10:.1f} KiB of KV cache per position a token; this "
                  f"process read memory at {out.read_gbps:.1f} GB/s"),
        MetricDef("decode_of_read_bandwidth", "Decode bandwidth ÷ memory read bandwidth", "%", False, "samples",
                  lambda out: [100 * g / out.read_gbps for g in decode_gbps(out)] if out.read_gbps else [],
                  quantile(50), sample_name="requests"),
    )


def pass_rate(metric: Callable) -> Callable[[ScenarioOutput], list[float]]:
    """One sample per pass: metric(ScenarioPass) (a rate over the pass's wall time)."""
    return lambda out: [x for p in out.passes if (x := metric(p.to_pass(""))) is not None]
