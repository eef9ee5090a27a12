"""Serving metrics over request records, named and defined as in docs/metrics.md.

Pure functions of RequestRecord / ScenarioPass (bench/records.py): no model, no clock, no I/O.
Times are seconds on the measuring process's perf_counter; rates are per second.

Failed requests (record.error is not None) are left out of every latency and token metric:
a request that errored has no meaningful end-to-end latency, and its tokens were not delivered.
They count only in error_rate.

Per-request latencies (vLLM's benchmark_serving and MLPerf use the same definitions):
  E2EL = end_time - send_time
  TTFT = token_times[0] - send_time
  TPOT = (E2EL - TTFT) / (tokens_out - 1)        requests with at least 2 output tokens
  ITL  = token_times[i + 1] - token_times[i]     pooled over requests
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from variantlab.measure import stats
from variantlab.measure.records import RequestRecord, ScenarioPass


def _ok(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok]


# --------------------------------------------------------------------------- per request

def e2el(records: Iterable[RequestRecord]) -> list[float]:
    """End-to-end latency of each successful request: end time - send time."""
    return [r.end_time - r.send_time for r in _ok(records)]


def ttft(records: Iterable[RequestRecord]) -> list[float]:
    """Time to first token of each successful request that produced a token."""
    return [r.token_times[0] - r.send_time for r in _ok(records) if r.token_times]


def tpot(records: Iterable[RequestRecord]) -> list[float]:
    """Time per output token after the first: (E2EL - TTFT) / (tokens_out - 1).

    Only successful requests with at least two output tokens have one. From an HTTP endpoint the count
    is the server's usage (one streamed chunk may carry several tokens).
    """
    return [((r.end_time - r.send_time) - (r.token_times[0] - r.send_time)) / (r.tokens_out - 1)
            for r in _ok(records) if r.tokens_out >= 2 and r.token_times]


def itl(records: Iterable[RequestRecord]) -> list[float]:
    """Inter-token latencies: every gap between consecutive output tokens, pooled over requests."""
    gaps: list[float] = []
    for r in _ok(records):
        gaps.extend(b - a for a, b in zip(r.token_times, r.token_times[1:]))
    return gaps


_SUMMARY_PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def latency_summary(xs: Iterable[float]) -> dict[str, float | None]:
    """p50, p90, p95, p99, mean and stdev (sample) of latencies; every value None when empty."""
    xs = list(xs)
    if not xs:
        return {key: None for key in (*_SUMMARY_PERCENTILES, "mean", "stdev")}
    summary: dict[str, float | None] = {
        key: stats.percentile(xs, q) for key, q in _SUMMARY_PERCENTILES.items()}
    summary["mean"] = stats.mean(xs)
    summary["stdev"] = stats.stdev(xs)
    return summary


# --------------------------------------------------------------------------- rates

def _per_second(count: float, wall_time: float) -> float | None:
    return count / wall_time if wall_time > 0 else None


def output_throughput(pass_: ScenarioPass) -> float | None:
    """Output tokens of successful requests / wall time of the pass (tokens/s, "TPS").

    None when the pass has no positive wall time.
    """
    return _per_second(sum(r.tokens_out for r in _ok(pass_.records)), pass_.wall_time)


def peak_throughput(records: Iterable[RequestRecord], window_s: float = 1.0) -> float | None:
    """Highest output tokens/s over any half-open window [t, t + window_s).

    Token times of successful requests are pooled and sorted; the window starts at each token
    time in turn (a maximal window can always be slid right until it starts on a token), and the
    tokens inside are counted by binary search: O(n log n).

    When all tokens fall within less than one window (span = last - first token time <
    window_s), dividing by window_s would understate a short burst, so the rate is
    total tokens / span instead. None for fewer than two tokens or a span of 0 (no rate can be
    measured from tokens that arrived at one instant).
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    times = np.sort(np.fromiter((t for r in _ok(records) for t in r.token_times), dtype=np.float64))
    if times.size < 2:
        return None
    span = float(times[-1] - times[0])
    if span == 0.0:
        return None
    if span < window_s:
        return times.size / span
    ends = np.searchsorted(times, times + window_s, side="left")  # first token at or past t + w
    return int(np.max(ends - np.arange(times.size))) / window_s


def single_task_latency(pass_: ScenarioPass) -> float:
    """Wall time to process the whole workload end to end (the analysis's "6.8 min")."""
    return pass_.wall_time


@dataclass(frozen=True)
class SLO:
    """Per-request service-level objectives, in seconds; None means "no objective"."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2el_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"SLO {name} must be positive seconds or None, got {value}")

    def met_by(self, r: RequestRecord) -> bool:
        """Whether a successful request meets every objective that is set.

        A request without output tokens has no TTFT, so it misses a TTFT objective; a request
        with one token has no TPOT, so a TPOT objective holds vacuously (as in vLLM's goodput).
        """
        if self.e2el_s is not None and r.end_time - r.send_time > self.e2el_s:
            return False
        if self.ttft_s is not None and (not r.token_times
                                        or r.token_times[0] - r.send_time > self.ttft_s):
            return False
        if self.tpot_s is not None and r.tokens_out >= 2 and r.token_times and tpot([r])[0] > self.tpot_s:
            return False
        return True


def goodput(records: Iterable[RequestRecord], wall_time: float, slo: SLO) -> float | None:
    """Successful requests meeting every given SLO, per second of wall time (None if wall_time <= 0)."""
    return _per_second(sum(1 for r in _ok(records) if slo.met_by(r)), wall_time)


def request_rate(records: Iterable[RequestRecord], wall_time: float) -> float | None:
    """Successful (completed) requests per second of wall time (None if wall_time <= 0)."""
    return _per_second(len(_ok(records)), wall_time)


def slo_attainment(records: Iterable[RequestRecord], slo: SLO) -> float | None:
    """Share of all requests sent (failed and refused ones included) that succeeded and met every SLO, 0..1;
    None when none were sent. The server scenario's "sustained" test: a rate holds when this reaches its
    target (0.95 by default)."""
    records = list(records)
    return sum(1 for r in _ok(records) if slo.met_by(r)) / len(records) if records else None


def error_rate(records: Iterable[RequestRecord]) -> float | None:
    """Share of requests that failed, 0..1; None when there are no requests."""
    records = list(records)
    return sum(1 for r in records if not r.ok) / len(records) if records else None
