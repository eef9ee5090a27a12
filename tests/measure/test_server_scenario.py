"""The server scenario (measure/scenarios/server.py): arrivals, the spec's checks, the sustained-rate rule
on synthetic phases, a run against a fake client that answers on other threads (as an HTTP client and
the serving engine do), and against the serving engine on the tiny model."""
from __future__ import annotations

import random
import statistics
import threading

import pytest
from pydantic import ValidationError

from variantlab.backends.base import RequestEnd, TokenEvent
from variantlab.measure import metrics as m
from variantlab.measure.records import RequestRecord
from variantlab.measure.scenarios.common import PassOutput
from variantlab.measure.scenarios.server import Server, ServerOutput, ServerSpec, _max_rate, arrival_offsets
from variantlab.measure.tracker import WorkloadSettings

SAMPLES = tuple({"id": f"s{i}", "prompt": f"prompt {i}", "answer": "a"} for i in range(8))
SLO = {"ttft_s": 0.05, "tpot_s": 0.02}


def test_poisson_constant_and_gamma_arrivals_have_their_rate_and_spread():
    rng = random.Random(0)
    poisson = arrival_offsets("poisson", 50, 200, 1.0, rng)
    assert abs(len(poisson) / 200 - 50) < 50 * 0.05
    gaps = [b - a for a, b in zip(poisson, poisson[1:])]
    assert abs(statistics.pstdev(gaps) / statistics.mean(gaps) - 1) < 0.05       # exponential: CV 1
    bursty = arrival_offsets("gamma", 50, 200, 0.25, random.Random(1))
    gaps = [b - a for a, b in zip(bursty, bursty[1:])]
    assert abs(statistics.pstdev(gaps) / statistics.mean(gaps) - 2) < 0.2        # shape k: CV 1/sqrt(k)
    assert arrival_offsets("constant", 4, 1.0, 1.0, rng) == [0.25, 0.5, 0.75]
    assert all(0 < t < 200 for t in poisson) and poisson == sorted(poisson)


@pytest.mark.parametrize("fields", [{}, {"rate": 2, "concurrency": 4}, {"rates": [2, 2]}, {"rates": []}])
def test_a_spec_gives_exactly_one_load(fields):
    with pytest.raises(ValidationError):
        ServerSpec(type="server", **fields)


def test_phases_are_swept_in_increasing_rate():
    spec = ServerSpec(type="server", rates=[8, 2, 4])
    assert spec.phases() == [("2", 2, None), ("4", 4, None), ("8", 8, None)]
    assert ServerSpec(type="server", concurrency=3).phases() == [("c3", None, 3)]


def record(send, ttft, tpot, n=5, error=None) -> RequestRecord:
    times = tuple(send + ttft + i * tpot for i in range(n))
    return RequestRecord("r", send, times[-1], times, 10, "a", error, (), None if error else "stop")


def test_the_sustained_rate_is_the_highest_whose_attainment_reaches_the_target():
    good = [record(i * 0.1, 0.01, 0.005) for i in range(40)]
    slow = [record(i * 0.1, 0.2, 0.005) for i in range(40)]              # TTFT past 50 ms: misses the SLO
    half = good[:20] + slow[:20]
    out = ServerOutput(passes=(PassOutput(start=0, end=4, records=tuple(good)),
                               PassOutput(start=0, end=4, records=tuple(good[:39] + slow[:1])),
                               PassOutput(start=0, end=4, records=tuple(half))),
                       shapes="", phases=("2", "4", "8"), offered=(2.0, 4.0, 8.0), target=0.95)
    assert _max_rate(out, m.SLO(**SLO)) == 4.0                 # 39/40 = 97.5% at 4; 50% at 8
    refused = [record(0, 0.01, 0.005, error="refused: the queue is full (429)")] * 40
    none = ServerOutput(passes=(PassOutput(start=0, end=4, records=tuple(refused)),), shapes="", phases=("2",),
                        offered=(2.0,), target=0.95)
    assert _max_rate(none, m.SLO(**SLO)) == 0.0
    # no SLO: a phase holds when its requests succeed and it completes 90% of the offered rate
    assert _max_rate(out, m.SLO()) == 8.0


class FakeClient:
    """Answers each request on a timer thread: TTFT 5 ms, then `tokens` chunks 2 ms apart; or refuses."""

    def __init__(self, tokens=4, refuse=False):
        self.tokens, self.refuse, self.sent = tokens, refuse, []

    def submit(self, index, request, on_event):
        import time
        self.sent.append(request)
        if self.refuse:
            on_event(RequestEnd(index, time.perf_counter(), None, 3, None, "HTTP 429: busy"))
            return

        def answer():
            for i in range(self.tokens):
                time.sleep(0.005 if i == 0 else 0.002)
                on_event(TokenEvent(index, -1, time.perf_counter(), None, None, text="x"))
            on_event(RequestEnd(index, time.perf_counter(), "length", 3, self.tokens))
        threading.Thread(target=answer, daemon=True).start()


class Host:
    def __init__(self, backend):
        self.backend, self.samples, self.shapes, self.outputs = backend, SAMPLES, [], {}

    def progress(self, stage, fraction):
        pass

    def turn(self, tag):
        return 0.0


def test_a_sweep_against_a_client_that_answers_on_other_threads():
    spec = ServerSpec(type="server", rates=[20, 40], arrivals="constant", duration_s=0.5, warmup_s=0.1, drain_s=5)
    sc = Server(spec, WorkloadSettings(4, ("\n",), {"ttft_s": 2.0, "tpot_s": 1.0}))   # loose: a loaded machine
    client = FakeClient()
    out = sc.run(Host(client))
    assert out.phases == ("20", "40") and len(out.passes) == 2
    for p, n in zip(out.passes, (9, 19)):                                     # every 1/rate s in [0, 0.5)
        assert len(p.records) == n
        assert all(r.ok and r.output_text == "xxxx" and r.tokens_out == 4 for r in p.records)
        assert [r.send_time for r in p.records] == sorted(r.send_time for r in p.records)
    rows = {d.key: d for d in sc.metrics()}
    assert {"ttft_p95@20", "goodput@40", "attainment@40", "failed@20", "max_sustainable_rate"} <= set(rows)
    assert rows["max_sustainable_rate"].samples(out) == [40.0]
    assert rows["failed@20"].samples(out) == [0.0]
    assert len(client.sent) > sum(len(p.records) for p in out.passes)       # warm-up requests are not recorded


def test_refused_requests_are_failed_records_and_nothing_is_sustained():
    spec = ServerSpec(type="server", rate=20, duration_s=0.3, warmup_s=0, drain_s=2)
    sc = Server(spec, WorkloadSettings(4, ("\n",), SLO))
    out = sc.run(Host(FakeClient(refuse=True)))
    rows = {d.key: d for d in sc.metrics()}
    assert out.passes[0].records and all("429" in r.error for r in out.passes[0].records)
    assert rows["failed@20"].samples(out) == [100.0] and rows["max_sustainable_rate"].samples(out) == [0.0]


def test_a_fixed_concurrency_keeps_that_many_in_flight():
    spec = ServerSpec(type="server", concurrency=3, duration_s=0.3, warmup_s=0, drain_s=2)
    sc = Server(spec, WorkloadSettings(4, ("\n",), {}))
    out = sc.run(Host(FakeClient()))
    recs = out.passes[0].records
    events = sorted([(r.send_time, 1) for r in recs] + [(r.end_time, -1) for r in recs])
    running, peak = 0, 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    assert len(recs) > 3 and peak <= 3


@pytest.mark.model
@pytest.mark.parametrize("policy", ["single", "adaptive"])
def test_the_serving_engine_in_process_answers_what_the_bench_engine_answers(tiny_lm, policy):
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine
    model, tok = tiny_lm
    engine = TorchEngine(model, tok, "cpu")
    spec = ServerSpec(type="server", rate=30, duration_s=0.5, warmup_s=0.1, policy=policy, drain_s=30)
    out = Server(spec, WorkloadSettings(6, ("\n",), {})).run(Host(engine))
    recs = out.passes[0].records
    assert recs and all(r.ok for r in recs)
    for r in recs[:4]:
        prompt = next(s["prompt"] for s in SAMPLES if s["id"] == r.request_id)
        (want,) = run_requests(engine, [GenerationRequest("x", prompt=prompt, max_new_tokens=6, stop=("\n",))])
        assert r.output_text == want.output_text and r.token_ids == want.token_ids
        assert r.tokens_in == len(engine.encode(prompt))
