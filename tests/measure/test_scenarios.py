"""Scenarios (bench/scenarios.py) driving a real TorchBackend on the tiny random model.

The scenarios' own clock is a counter that advances one second per reading, so "keep going until
min_duration_s has passed" is decided by clock readings, not by how fast this machine is.
"""
from __future__ import annotations

import pytest

from variantlab.backends.base import Capabilities
from variantlab.backends.torch_backend import TorchBackend
from variantlab.measure.scenarios import Offline, SingleStream, scenario_from_spec
from variantlab.suite import OfflineSpec, SingleStreamSpec

pytestmark = pytest.mark.model

SAMPLES = [
    {"id": "s0", "prompt": "a: 1\nQ: What is the a?\nA:", "answer": "1"},
    {"id": "s1", "prompt": "Q: hi\nA:", "answer": "hi"},
    {"id": "s2", "prompt": "status: pending\nitems: 3\nQ: What is the status?\nA:", "answer": "pending"},
]
MAX_NEW = 2


class CounterClock:
    """A clock that reads 1.0, 2.0, 3.0, ...: one second passes per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class OneAtATime(TorchBackend):
    """The same backend declaring that it cannot batch."""

    capabilities = Capabilities(batching=False, token_timestamps=True, scoring=True)


@pytest.fixture(scope="module")
def backend(tiny_lm):
    model, tok = tiny_lm
    return TorchBackend(model, tok, "cpu", "tok")


def test_single_stream_yields_exactly_the_requested_records(backend):
    fractions = []
    passes = SingleStream(requests=3, warmup=1, clock=CounterClock()).run(
        backend, SAMPLES[:2], MAX_NEW, fractions.append)
    assert len(passes) == 1
    p = passes[0]
    assert p.scenario == "single-stream"
    assert [r.request_id for r in p.records] == ["s0", "s1", "s0"]   # cycles through the dataset
    assert all(r.ok and 1 <= r.tokens_out <= MAX_NEW for r in p.records)
    assert fractions == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert p.start_time < p.end_time


def test_single_stream_sample_without_id_is_named_by_its_index(backend):
    samples = [{"prompt": s["prompt"], "answer": s["answer"]} for s in SAMPLES[:2]]
    p, = SingleStream(requests=3, warmup=0).run(backend, samples, MAX_NEW)
    assert [r.request_id for r in p.records] == ["0", "1", "2"]


def test_single_stream_keeps_sending_until_min_duration(backend):
    p, = SingleStream(requests=1, warmup=0, min_duration_s=4.0, clock=CounterClock()).run(
        backend, SAMPLES, MAX_NEW)
    assert len(p.records) > 1
    assert p.wall_time >= 4.0
    assert [r.request_id for r in p.records] == [SAMPLES[i % 3]["id"] for i in range(len(p.records))]


def test_offline_passes_cover_every_sample_once(backend):
    fractions = []
    passes = Offline(batch_size=2, passes=2, warmup=1, clock=CounterClock()).run(
        backend, SAMPLES, MAX_NEW, fractions.append)
    assert len(passes) == 2
    for p in passes:
        assert p.scenario == "offline"
        assert sorted(r.request_id for r in p.records) == ["s0", "s1", "s2"]
        assert p.wall_time > 0
        # batches of 2: the first two requests were sent together, the third in a batch of its own
        assert p.records[0].send_time == p.records[1].send_time != p.records[2].send_time
    assert fractions == [0.5, 1.0]
    assert passes[0].end_time <= passes[1].start_time


def test_offline_repeats_passes_until_min_duration(backend):
    passes = Offline(batch_size=3, passes=1, warmup=0, min_duration_s=10.0, clock=CounterClock()).run(
        backend, SAMPLES, MAX_NEW)
    assert len(passes) > 1
    assert passes[-1].end_time - passes[0].start_time >= 10.0 - 1.0   # the run's first reading precedes
    for p in passes:
        assert sorted(r.request_id for r in p.records) == ["s0", "s1", "s2"]


def test_offline_sends_one_request_at_a_time_to_a_backend_that_cannot_batch(tiny_lm):
    model, tok = tiny_lm
    p, = Offline(batch_size=2, passes=1, warmup=1).run(OneAtATime(model, tok, "cpu", "tok"), SAMPLES,
                                                       MAX_NEW)
    assert [r.request_id for r in p.records] == ["s0", "s1", "s2"]
    sends = [r.send_time for r in p.records]
    assert sends == sorted(sends) and len(set(sends)) == 3


def test_scenario_from_spec():
    ss = scenario_from_spec(SingleStreamSpec(type="single-stream", requests=5, warmup=0, min_duration_s=1.5))
    assert isinstance(ss, SingleStream) and (ss.requests, ss.warmup, ss.min_duration_s) == (5, 0, 1.5)
    off = scenario_from_spec(OfflineSpec(type="offline", batch_size=4, passes=2, warmup=0))
    assert isinstance(off, Offline) and (off.batch_size, off.passes, off.warmup) == (4, 2, 0)
    assert (ss.name, off.name) == ("single-stream", "offline")


def test_length_sweep_prompts_have_exact_lengths_and_decode_all_tokens(tiny_lm):
    from variantlab.backends.torch_backend import TorchBackend
    from variantlab.measure.scenarios import LengthSweep

    model, tok = tiny_lm
    backend = TorchBackend(model, tok, "cpu", "t")
    samples = [{"prompt": "order_id: ORD-1\nQ: What is the order?\nA:"}]
    (p,) = LengthSweep(lengths=(5, 40), decode_tokens=3, repeats=2, warmup=1).run(backend, samples, 8)
    assert [r.tokens_in for r in p.records] == [5, 5, 40, 40]
    assert all(r.tokens_out == 3 for r in p.records)  # stop tokens ignored: every request decodes 3
    assert [r.request_id for r in p.records] == ["len5-0", "len5-1", "len40-0", "len40-1"]
