"""server: requests arriving at a rate (Poisson or gamma) or at a fixed concurrency, for a duration; a
sweep over rates; per-request latencies, throughput, goodput under the suite's SLOs, and the highest
rate that still meets them.

The load goes to a server, never to the bench engine's batch loop:
- a local variant is served in the measuring process by the serving engine (serve/engine.py) with the
  scenario's policy (single | static | adaptive) and continuous batching, exactly as `variantlab serve`
  runs it, minus HTTP; each token is stamped as the engine delivers it to the scenario;
- a `backend: openai` variant is any OpenAI-compatible endpoint, over HTTP (backends/openai_http.py),
  stamped as each streamed chunk arrives, with token counts from the response's usage.
Timing is the client's: a request's send time is read when it is sent, at its scheduled arrival.

Arrivals (vLLM's benchmark_serving's): `poisson` draws exponential gaps at `rate`; `gamma` draws gaps from
a gamma distribution of shape `burstiness` and mean 1/rate (burstiness < 1 is burstier than Poisson, > 1
more regular); `constant` sends every 1/rate. `concurrency: N` instead keeps N requests in flight (a
closed loop). Each phase (one rate of `rates`, or the concurrency) first sends for `warmup_s`, unrecorded,
then for `duration_s`, then waits up to `drain_s` for what is still running; requests still running then
count as failed ("did not finish"). A request the server refuses (429, a full queue) is recorded as
failed with that reason.

Rows per phase ("… @ 8 req/s"): E2EL, TTFT, TPOT and ITL percentiles, output and request throughput,
goodput (requests/s meeting every SLO: `requirements.slo`), SLO attainment (share of all requests sent
that met every SLO) and the share refused or failed. Then "Max sustainable rate": the highest swept rate
whose attainment reaches `attainment` (0.95 by default; without SLOs, a phase holds when its requests
succeed at that share and it completes at least 90% of the offered rate).
"""
from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ...backends.base import GenerationRequest, RequestEnd, TokenEvent
from ...spec_model import SpecModel
from .. import metrics as m
from ..records import RequestRecord
from ..stats import mean, quantile
from ..tracker import MetricDef
from ...sizes import MAX_BATCH, MAX_DURATION_S
from .common import PassOutput, Scenario, ScenarioOutput, requests_for

KEEP_UP = 0.9     # without SLOs, a phase holds when it completes this share of the offered rate


def _policy_names() -> tuple[str, ...]:
    from ...serve.policy_kinds import policy_names
    return policy_names()


class ServerSpec(SpecModel):
    """Requests arriving at a rate (or a sweep of rates, or a fixed concurrency) against a server."""

    model_config = ConfigDict(allow_inf_nan=False)   # bounds: variantlab/sizes.py

    type: Literal["server"]
    name: str | None = Field(None, description="row label and key (default: the type)")
    rate: float | None = Field(None, gt=0, le=100_000, description="requests per second")
    rates: list[Annotated[float, Field(gt=0, le=100_000)]] | None = Field(
        None, min_length=1, max_length=32, description="a sweep: one phase per rate (each as `rate`)")
    concurrency: int | None = Field(None, ge=1, le=4096, description="keep this many requests in flight instead")
    arrivals: Literal["poisson", "gamma", "constant"] = "poisson"
    burstiness: float = Field(1.0, gt=0, le=100, description="gamma: the shape (1 = Poisson, < 1 burstier)")
    duration_s: float = Field(10.0, gt=0, le=MAX_DURATION_S, description="seconds of recorded arrivals per phase")
    warmup_s: float = Field(1.0, ge=0, le=3600, description="seconds of unrecorded arrivals before each phase")
    drain_s: float = Field(30.0, ge=0, le=3600, description="how long to wait for requests still running")
    policy: str = Field("adaptive", description="a local variant's batch policy, one of serve/policy_kinds.py's "
                        "(an endpoint batches as it does)", json_schema_extra=lambda schema: schema.update(
                            enum=list(_policy_names())))
    max_batch: int = Field(32, ge=1, le=MAX_BATCH)
    batch_size: int = Field(8, ge=1, le=MAX_BATCH, description="static: the batch it waits for")
    max_wait_ms: float = Field(20.0, ge=0, le=60_000, description="static: the longest wait for a batch")
    max_queue: int = Field(1024, ge=1, le=1_000_000, description="a local server's queue bound (then 429)")
    attainment: float = Field(0.95, gt=0, le=1, description="share of requests that must meet every SLO")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in _policy_names():
            raise ValueError(f"unknown policy {v!r}: accepted {' | '.join(_policy_names())}")
        return v

    @model_validator(mode="after")
    def _one_load(self) -> "ServerSpec":
        given = [k for k in ("rate", "rates", "concurrency") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of rate, rates (a sweep) or concurrency"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.rates is not None and (len(set(self.rates)) != len(self.rates) or any(r <= 0 for r in self.rates)):
            raise ValueError("rates must be distinct and above 0")
        return self

    def phases(self) -> list[tuple[str, float | None, int | None]]:
        """(key suffix, rate, concurrency) per phase, in order."""
        if self.concurrency is not None:
            return [(f"c{self.concurrency}", None, self.concurrency)]
        return [(f"{r:g}", r, None) for r in sorted(self.rates or [self.rate])]

    def context_lengths(self) -> list[int]:
        return []


class ServerOutput(ScenarioOutput):
    phases: tuple[str, ...] = ()                  # key suffix per pass
    offered: tuple[float | None, ...] = ()        # rate per pass (None: concurrency)
    target: float = 0.95


def arrival_offsets(kind: str, rate: float, duration_s: float, burstiness: float, rng: random.Random) -> list[float]:
    """Send times, in seconds from the start, of the arrivals in [0, duration_s)."""
    if kind == "constant":   # k / rate, not a running sum: 10 × 0.05 must not fall short of 0.5
        return [k / rate for k in range(1, math.ceil(duration_s * rate)) if k / rate < duration_s]
    out, t = [], 0.0
    while True:
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) if kind == "gamma" else rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(t)


# ---------------------------------------------------------------- clients: where the requests go

class LocalClient:
    """The variant in this process, behind the serving engine with the scenario's policy."""

    def __init__(self, engine, spec: ServerSpec, max_len: int, clock=time.perf_counter):
        from ...serve.engine import ServeEngine
        from ...serve.lane import Lane
        from ...serve.policy_kinds import PolicySettings, make_policy, policy_kind
        self.text, self.clock = engine, clock
        kind = policy_kind(spec.policy, field="policy")
        lane = Lane("v", engine, max_rows=spec.max_batch if kind.batches else 1, max_len=max_len)
        policy, _ = make_policy(kind.name, {"v": lane}, PolicySettings(max_rows=spec.max_batch, batch_size=spec.batch_size,
                                                                        max_wait_s=spec.max_wait_ms / 1e3))
        self.engine = ServeEngine({"v": lane}, policy, max_queue=spec.max_queue, clock=clock).start()

    def set_slo(self, tpot_s: float | None, ttft_s: float | None = None) -> None:
        keep = getattr(self.engine.policy, "keep", None)      # adaptive keeps SLOs; single and static do not
        if keep is not None:
            keep(tpot_s, ttft_s)

    def submit(self, index: int, request: GenerationRequest, on_event) -> None:
        from ...serve.engine import QueueFull, ServeRequest
        ids = tuple(request.prompt_ids) if request.prompt_ids is not None else tuple(self.text.encode(request.prompt))
        clock = self.clock

        def sink(ev) -> None:
            now = clock()
            if ev.token_id is not None:
                on_event(TokenEvent(index, ev.token_id, now, ev.finish_reason, ev.prompt_tokens))
            if ev.finish_reason is not None:
                on_event(RequestEnd(index, now, ev.finish_reason, len(ids), None,
                                    ev.error if ev.token_id is None else None))
        try:
            self.engine.submit(ServeRequest(f"{request.request_id}#{index}", ids, request.max_new_tokens,
                                            request.stop, request.stop_on_eos), sink)
        except QueueFull as e:
            on_event(RequestEnd(index, clock(), None, len(ids), None, f"refused: {e} (429)"))

    def decode(self, ids) -> str:
        return self.text.decode(ids)

    def close(self) -> None:
        self.engine.stop()


class _Collector:
    """Records of the requests of one phase, assembled from events that arrive on other threads."""

    def __init__(self, requests: list[GenerationRequest], decode):
        self.requests, self.decode = requests, decode
        self.send: dict[int, float] = {}
        self.times: dict[int, list[float]] = {}
        self.ids: dict[int, list[int]] = {}
        self.texts: dict[int, list[str]] = {}
        self.ends: dict[int, RequestEnd] = {}
        self.lock = threading.Lock()
        self.all_ended = threading.Event()
        self.expected: int | None = None

    def on_event(self, ev) -> None:
        with self.lock:
            if isinstance(ev, RequestEnd):
                self.ends[ev.index] = ev
                if self.expected is not None and len(self.ends) >= self.expected:
                    self.all_ended.set()
                return
            self.times.setdefault(ev.index, []).append(ev.time)
            if ev.text is not None:
                self.texts.setdefault(ev.index, []).append(ev.text)
            elif ev.token_id >= 0:
                self.ids.setdefault(ev.index, []).append(ev.token_id)

    def seal(self, sent: int) -> None:
        with self.lock:
            self.expected = sent
            if len(self.ends) >= sent:
                self.all_ended.set()

    def in_flight(self) -> int:
        with self.lock:
            return len(self.send) - len(self.ends)

    def records(self, end_time: float) -> list[RequestRecord]:
        from ...backends.base import cut_at_stop
        out = []
        with self.lock:
            for i, send in sorted(self.send.items()):
                req, end, times = self.requests[i], self.ends.get(i), tuple(self.times.get(i, ()))
                raw = "".join(self.texts[i]) if i in self.texts else (self.decode(self.ids.get(i, [])) if
                                                                      self.ids.get(i) else "")
                error = "did not finish before the drain timeout" if end is None else end.error
                out.append(RequestRecord(req.request_id, send, times[-1] if times else (end.time if end else end_time),
                                         times, (end.prompt_tokens if end else None) or 0,
                                         cut_at_stop(raw, req.stop).strip(), error, tuple(self.ids.get(i, ())),
                                         None if error else end.finish_reason, end.completion_tokens if end else None))
        return out


# ---------------------------------------------------------------- the scenario

@dataclass(frozen=True)
class Server(Scenario):
    kind = "server"
    role = "latency"
    time_row = "e2el_p50"
    spec_model = ServerSpec
    output_model = ServerOutput

    def metrics(self) -> tuple[MetricDef, ...]:
        rows: list[MetricDef] = []
        slo = self._slo()
        for i, (key, rate, conc) in enumerate(self.spec.phases()):
            at = f" @ {rate:g} req/s" if rate is not None else f" @ concurrency {conc}"
            rows += [dataclasses.replace(d, key=f"{d.key}@{key}", label=f"{d.label}{at} [{self.name}]")
                     for d in _phase_rows(i, slo)]
        rows.append(MetricDef("max_sustainable_rate", f"Max sustainable rate (SLO attainment ≥ "
                              f"{100 * self.spec.attainment:g}%) [{self.name}]", "req/s", False, "process",
                              lambda out: [_max_rate(out, slo)], mean, headline=7,
                              note=lambda out: _max_rate_note(out, slo)))
        return tuple(rows)

    def _slo(self) -> m.SLO:
        return m.SLO(**{k: v for k, v in (self.workload.slo or {}).items() if v is not None})

    def run(self, ctx) -> ServerOutput:
        backend = ctx.backend
        ctx.turn(self.name)     # its arrivals overlap: the whole scenario is one turn (measure/turns.py)
        if hasattr(backend, "submit"):          # an endpoint: it batches as it does
            client, close = backend, None
        else:
            longest = max(len(backend.encode(s["prompt"])) for s in ctx.samples)   # the cache holds what is sent
            max_len = min(_max_positions(backend), longest + self.workload.max_new_tokens + 1)
            client = LocalClient(backend, self.spec, max_len, self.clock)
            client.set_slo(self._slo().tpot_s, self._slo().ttft_s)
            close = client.close
        decode = getattr(client, "decode", None) or (lambda ids: "")
        rng = random.Random(zlib.crc32(self.name.encode()))   # the same arrivals for every variant and round
        passes, phases, offered = [], [], []
        try:
            for i, (key, rate, conc) in enumerate(self.spec.phases()):
                self._phase(client, ctx.samples, rate, conc, self.spec.warmup_s, rng, decode, record=False)
                start, end, records = self._phase(client, ctx.samples, rate, conc, self.spec.duration_s, rng,
                                                  decode, record=True)
                passes.append(PassOutput(start=start, end=end, records=tuple(records)))
                phases.append(key)
                offered.append(rate)
                ctx.progress(self.name, (i + 1) / len(self.spec.phases()))
        finally:
            if close is not None:
                close()
        ctx.shapes.append(f"{self.name}: " + ", ".join(f"{len(p.records)} requests @ {k}" for p, k in zip(passes, phases)))
        return ServerOutput(passes=tuple(passes), shapes="; ".join(f"{len(p.records)} requests at {k}"
                                                                   for p, k in zip(passes, phases)),
                            phases=tuple(phases), offered=tuple(offered), target=self.spec.attainment)

    def _phase(self, client, samples, rate, concurrency, duration_s, rng, decode, record: bool):
        """Send for duration_s (at `rate`, or keeping `concurrency` in flight), then drain; (start, end, records)."""
        if duration_s <= 0:
            return 0.0, 0.0, []
        clock, spec = self.clock, self.spec
        n_max = int(rate * duration_s * 2 + 64) if rate is not None else 1_000_000
        requests = requests_for(samples, min(n_max, 1_000_000), self.workload)
        col = _Collector(requests, decode)
        start = clock()
        sent = 0
        if rate is not None:
            for offset in arrival_offsets(spec.arrivals, rate, duration_s, spec.burstiness, rng):
                _sleep_until(start + offset, clock)
                col.send[sent] = clock()
                client.submit(sent, requests[sent], col.on_event)
                sent += 1
        else:
            while clock() - start < duration_s and sent < len(requests):
                if col.in_flight() < concurrency:
                    col.send[sent] = clock()
                    client.submit(sent, requests[sent], col.on_event)
                    sent += 1
                else:
                    time.sleep(0.0005)
        col.seal(sent)
        col.all_ended.wait(timeout=spec.drain_s)      # warm-up too: it must not spill into the phase
        end = clock()
        if not record:
            return start, end, []
        recs = col.records(end)
        last = max((r.end_time for r in recs), default=end)
        return start, max(last, start + duration_s), recs


def _sleep_until(t: float, clock) -> None:
    """Sleep to t in one call (no polling: a load generator that wakes often takes the GIL from an engine
    in the same process; Linux's sleep overshoots by ~0.1 ms, which the send time records)."""
    left = t - clock()
    if left > 0:
        time.sleep(left)


def _max_positions(engine) -> int:
    config = getattr(getattr(engine, "model", None), "config", None)
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048)


def _phase_rows(i: int, slo: m.SLO) -> list[MetricDef]:
    def per_request(metric):
        return lambda out: metric(out.passes[i].records) if i < len(out.passes) else []

    def row(key, label, metric, statistic, **kw):
        kw.setdefault("sample_name", "requests")
        return MetricDef(key, label, "s", True, "samples", per_request(metric), statistic, **kw)

    def per_pass(fn, key, label, unit, lower):
        return MetricDef(key, label, unit, lower, "samples",
                         lambda out: [x] if i < len(out.passes) and (x := fn(out.passes[i].to_pass(""))) is not None
                         else [], mean)

    rows = [
        row("e2el_p50", "E2EL p50", m.e2el, quantile(50)),
        row("e2el_p95", "E2EL p95", m.e2el, quantile(95)),
        row("e2el_p99", "E2EL p99", m.e2el, quantile(99)),
        row("ttft_p50", "TTFT p50", m.ttft, quantile(50)),
        row("ttft_p95", "TTFT p95", m.ttft, quantile(95)),
        row("ttft_p99", "TTFT p99", m.ttft, quantile(99)),
        row("tpot_p50", "TPOT p50", m.tpot, quantile(50)),
        row("tpot_p95", "TPOT p95", m.tpot, quantile(95)),
        row("itl_p50", "ITL p50", m.itl, quantile(50), sample_name="token gaps"),
        row("itl_p95", "ITL p95", m.itl, quantile(95), sample_name="token gaps"),
        row("itl_p99", "ITL p99", m.itl, quantile(99), sample_name="token gaps"),
        per_pass(m.output_throughput, "output_throughput", "Output throughput", "tok/s", False),
        per_pass(lambda p: m.request_rate(p.records, p.wall_time), "request_throughput", "Request throughput",
                 "req/s", False),
        per_pass(lambda p: _share(p.records, lambda r: r.ok is False), "failed", "Requests refused or failed",
                 "%", True),
    ]
    if any(v is not None for v in (slo.ttft_s, slo.tpot_s, slo.e2el_s)):
        rows += [per_pass(lambda p: m.goodput(p.records, p.wall_time, slo), "goodput", "Goodput (" + _slo_text(slo)
                          + ")", "req/s", False),
                 per_pass(lambda p: None if (a := m.slo_attainment(p.records, slo)) is None else 100 * a,
                          "attainment", "SLO attainment", "%", False)]
    return rows


def _share(records, bad) -> float | None:
    records = list(records)
    return 100.0 * sum(1 for r in records if bad(r)) / len(records) if records else None


def _slo_text(slo: m.SLO) -> str:
    return ", ".join(f"{k.removesuffix('_s').upper()} ≤ {v:g} s" for k, v in
                     (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2el_s", slo.e2el_s)) if v is not None)


def _holds(p: PassOutput, rate: float | None, slo: m.SLO, target: float) -> bool:
    records = p.records
    if not records:
        return False
    if any(v is not None for v in (slo.ttft_s, slo.tpot_s, slo.e2el_s)):
        return (m.slo_attainment(records, slo) or 0.0) >= target
    ok = sum(1 for r in records if r.ok) / len(records)
    done = m.request_rate(records, p.end - p.start) or 0.0
    return ok >= target and (rate is None or done >= KEEP_UP * rate)


def _max_rate(out: ServerOutput, slo: m.SLO) -> float:
    """The highest offered rate whose phase holds (0 when none does; a concurrency phase has no rate)."""
    held = [rate for p, rate in zip(out.passes, out.offered) if rate is not None and _holds(p, rate, slo, out.target)]
    return max(held, default=0.0)


def _max_rate_note(out: ServerOutput, slo: m.SLO) -> str | None:
    rates = [r for r in out.offered if r is not None]
    if not rates:
        return "a concurrency phase has no offered rate"
    rule = (f"SLO attainment ≥ {100 * out.target:g}% ({_slo_text(slo)})"
            if any(v is not None for v in (slo.ttft_s, slo.tpot_s, slo.e2el_s)) else
            f"no SLO set: ≥ {100 * out.target:g}% of requests succeed and ≥ {100 * KEEP_UP:g}% of the offered rate "
            "completes")
    top = max(rates)
    held = _max_rate(out, slo)
    tail = " (the highest swept rate: the true limit may lie above)" if held == top else ""
    return f"swept {', '.join(f'{r:g}' for r in sorted(rates))} req/s; a rate holds when {rule}{tail}"


__all__ = ["Server", "ServerSpec", "arrival_offsets", "LocalClient"]
