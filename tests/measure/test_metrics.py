"""Unit tests for measure/metrics.py on records with hand-chosen times (binary fractions, exact)."""
import math

import numpy as np
import pytest

from variantlab.measure import metrics
from variantlab.measure.metrics import SLO
from variantlab.measure.records import RequestRecord, ScenarioPass

# r1: 4 tokens; E2EL 1.5, TTFT 0.5, TPOT (1.5 - 0.5) / 3, ITL 0.25, 0.25, 0.5
R1 = RequestRecord("r1", send_time=0.0, end_time=1.5, token_times=(0.5, 0.75, 1.0, 1.5))
# r2: 1 token; E2EL 0.5, TTFT 0.25, no TPOT, no ITL
R2 = RequestRecord("r2", send_time=1.0, end_time=1.5, token_times=(1.25,))
# r3: no tokens; E2EL 0.5, no TTFT
R3 = RequestRecord("r3", send_time=2.0, end_time=2.5)
# r4: failed; excluded from every latency and token metric
R4 = RequestRecord("r4", send_time=0.0, end_time=10.0, token_times=(0.125, 0.25), error="boom")
RECORDS = (R1, R2, R3, R4)
PASS = ScenarioPass("server", start_time=0.0, end_time=4.0, records=RECORDS)


def steady(times, rid="s"):
    times = tuple(sorted(times))
    return RequestRecord(rid, send_time=times[0], end_time=times[-1], token_times=times)


def test_per_request_latencies_by_hand():
    assert metrics.e2el(RECORDS) == [1.5, 0.5, 0.5]
    assert metrics.ttft(RECORDS) == [0.5, 0.25]
    assert metrics.tpot(RECORDS) == [pytest.approx(1.0 / 3.0)]
    assert metrics.itl(RECORDS) == [0.25, 0.25, 0.5]


def test_latencies_of_only_failed_records_are_empty():
    assert metrics.e2el([R4]) == metrics.ttft([R4]) == metrics.tpot([R4]) == metrics.itl([R4]) == []


def test_latency_summary():
    s = metrics.latency_summary([4.0, 1.0, 3.0, 2.0])
    assert s == {"p50": pytest.approx(2.5), "p90": pytest.approx(3.7), "p95": pytest.approx(3.85),
                 "p99": pytest.approx(3.97), "mean": 2.5, "stdev": pytest.approx(math.sqrt(5 / 3))}
    assert metrics.latency_summary([]) == dict.fromkeys(
        ["p50", "p90", "p95", "p99", "mean", "stdev"])
    assert metrics.latency_summary([0.5])["stdev"] == 0.0


def test_output_throughput_and_single_task_latency():
    assert metrics.output_throughput(PASS) == 5 / 4  # 4 + 1 + 0 tokens of successful requests
    assert metrics.single_task_latency(PASS) == 4.0
    assert metrics.output_throughput(ScenarioPass("offline", 1.0, 1.0, RECORDS)) is None


def test_peak_throughput_finds_a_burst():
    # One token a second for 10 s, plus a burst of 10 tokens within [5, 5.5625].
    burst = [5.0 + i / 16 for i in range(10)]
    records = [steady(range(10), "steady"), steady(burst, "burst")]
    assert metrics.peak_throughput(records) == 11.0            # [5, 6): token 5 + the burst
    assert metrics.peak_throughput(records, window_s=2.0) == 6.0   # [4, 6) or [5, 7): 12 tokens
    assert metrics.peak_throughput(records + [R4]) == 11.0     # failed tokens do not count


def test_peak_throughput_window_is_half_open():
    assert metrics.peak_throughput([steady([0.0, 1.0, 2.0])]) == 1.0
    assert metrics.peak_throughput([steady([0.0, 0.5, 1.0, 2.0])]) == 2.0


def test_peak_throughput_short_span_and_degenerate_cases():
    assert metrics.peak_throughput([steady([0.0, 0.25, 0.5])]) == 3 / 0.5  # span < window
    assert metrics.peak_throughput([steady([1.0])]) is None
    assert metrics.peak_throughput([steady([1.0, 1.0])]) is None     # one instant: no rate
    assert metrics.peak_throughput([]) is None
    with pytest.raises(ValueError, match="window_s"):
        metrics.peak_throughput(RECORDS, window_s=0.0)


def test_peak_throughput_matches_brute_force():
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.exponential(0.05, size=500))
    records = [steady(times[i::3], f"r{i}") for i in range(3)]
    brute = max(int(np.sum((times >= t) & (times < t + 1.0))) for t in times)
    assert metrics.peak_throughput(records) == brute


def test_goodput_counts_requests_meeting_every_slo():
    wall = 2.0
    assert metrics.goodput(RECORDS, wall, SLO(ttft_s=0.3)) == 1 / wall  # r2; r3 has no token
    assert metrics.goodput(RECORDS, wall, SLO(e2el_s=1.0)) == 2 / wall  # r2, r3
    assert metrics.goodput(RECORDS, wall, SLO(tpot_s=0.3)) == 2 / wall  # r1's 1/3 misses
    assert metrics.goodput(RECORDS, wall, SLO(tpot_s=0.4)) == 3 / wall
    assert metrics.goodput(RECORDS, wall, SLO()) == 3 / wall            # failed r4 never counts
    assert metrics.goodput(RECORDS, wall, SLO(ttft_s=1.0, tpot_s=0.3, e2el_s=2.0)) == 1 / wall
    assert metrics.goodput(RECORDS, 0.0, SLO()) is None


def test_slo_rejects_non_positive_objectives():
    with pytest.raises(ValueError, match="ttft_s"):
        SLO(ttft_s=0.0)
    with pytest.raises(ValueError, match="e2el_s"):
        SLO(e2el_s=-1.0)


def test_request_and_error_rates():
    assert metrics.request_rate(RECORDS, 2.0) == 1.5
    assert metrics.request_rate(RECORDS, 0.0) is None
    assert metrics.error_rate(RECORDS) == 0.25
    assert metrics.error_rate([]) is None
