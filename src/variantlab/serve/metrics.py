"""What the server counts, in Prometheus's exposition format (`GET /metrics`): one registry per engine.

Gauges: queue length, running requests, the batch size of each variant's last decode step.
Counters: tokens generated (per variant), decode steps, requests finished (by reason), requests
refused with 429, variant switches (from, to). Histograms: TTFT, TPOT, ITL, E2EL, queue wait and
prefill-chunk time, in seconds. Updated from the engine thread; prometheus_client's metrics are
thread-safe.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServeMetrics:
    def __init__(self, variants: list[str]):
        r = self.registry = CollectorRegistry()
        p = "variantlab_"
        self.queue_length = Gauge(p + "queue_length", "requests waiting to be admitted", registry=r)
        self.running = Gauge(p + "running_requests", "requests being prefilled or decoded", registry=r)
        self.batch_size = Gauge(p + "batch_size", "rows in the variant's last decode step", ["variant"], registry=r)
        self.tokens = Counter(p + "generated_tokens", "output tokens generated", ["variant"], registry=r)
        self.steps = Counter(p + "decode_steps", "decode steps run", ["variant"], registry=r)
        self.finished = Counter(p + "requests_finished", "requests that ended, by reason", ["reason"], registry=r)
        self.rejected = Counter(p + "requests_rejected", "requests refused because the queue was full (429)",
                                registry=r)
        self.switches = Counter(p + "variant_switches", "times the policy switched the admitting variant",
                                ["from_variant", "to_variant"], registry=r)
        self.ttft_seconds = Histogram(p + "ttft_seconds", "time to first token", buckets=LATENCY_BUCKETS, registry=r)
        self.tpot_seconds = Histogram(p + "tpot_seconds", "time per output token after the first",
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.itl_seconds = Histogram(p + "itl_seconds", "gap between consecutive tokens", buckets=TOKEN_BUCKETS,
                                     registry=r)
        self.e2el_seconds = Histogram(p + "e2el_seconds", "arrival to last token", buckets=LATENCY_BUCKETS,
                                      registry=r)
        self.queue_wait_seconds = Histogram(p + "queue_wait_seconds", "arrival to admission",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.prefill_seconds = Histogram(p + "prefill_chunk_seconds", "one prefill chunk", buckets=LATENCY_BUCKETS,
                                         registry=r)
        for v in variants:   # every variant's series exists from the start, at 0
            self.batch_size.labels(v).set(0)
            self.tokens.labels(v)
            self.steps.labels(v)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
