"""Scenarios (measure/scenarios/) driving a fake streaming backend on a fake clock.

The backend emits one token per 1/8 s of fake time and records every batch it was sent, so that
counts, shapes, warm-up and stop rules are checked exactly, with no model and no wall clock.
"""
from __future__ import annotations

import pytest

from variantlab.backends.base import Capabilities, TokenEvent
from variantlab.measure.scenarios import SCENARIO_SPECS, SCENARIOS, scenario_tracker
from variantlab.measure.scenarios.common import ScenarioOutput
from variantlab.measure.tracker import WorkloadSettings

SAMPLES = tuple({"id": f"s{i}", "prompt": " ".join(["w"] * (3 + i % 4)), "answer": "a"} for i in range(10))
SETTINGS = WorkloadSettings(max_new_tokens=5, stop=("\n",), slo={})


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """Prompt tokens = words; every request decodes max_new_tokens tokens, 1/8 s per step."""

    tokenizer_id = "fake"

    def __init__(self, clock, batching=True, token_input=True):
        self.clock = clock
        self.capabilities = Capabilities(batching=batching, token_input=token_input)
        self.batches: list[list] = []

    def encode(self, text):
        return [1] * len(text.split())

    def decode(self, ids):
        return "t" * len(ids)

    def stream(self, requests):
        self.batches.append(list(requests))
        for step in range(max(r.max_new_tokens for r in requests)):
            self.clock.now += 0.125
            for i, r in enumerate(requests):
                if step < r.max_new_tokens:
                    n_in = len(r.prompt_ids) if r.prompt_ids is not None else len(self.encode(r.prompt))
                    yield TokenEvent(i, 7, self.clock.now, "length" if step == r.max_new_tokens - 1 else None,
                                     n_in if step == 0 else None)


class Host:
    def __init__(self, backend):
        self.backend, self.samples, self.shapes, self.outputs = backend, SAMPLES, [], {}

    def progress(self, stage, fraction):
        pass

    def turn(self, tag):
        return 0.0


def make(kind: str, clock, **spec):
    tracker = scenario_tracker(SCENARIO_SPECS[kind](type=kind, **spec), SETTINGS)
    return type(tracker)(tracker.spec, SETTINGS, clock)


def timed(backend, warm: int):
    return [b for b in backend.batches[warm:]]


def test_single_stream_warms_every_prompt_length_then_sends_exactly_the_requests():
    clock = Clock()
    backend = FakeBackend(clock)
    sc = make("single-stream", clock, requests=6, warmup=2)
    out = sc.run(Host(backend))
    lengths = {len(s["prompt"].split()) for s in SAMPLES[:6]}
    short = [b for b in backend.batches if b[0].max_new_tokens == 2]
    assert sorted(len(b[0].prompt.split()) for b in short) == sorted(lengths)   # one short request per length
    assert all(not b[0].stop_on_eos for b in short)
    (p,) = out.passes
    assert [r.request_id for r in p.records] == [s["id"] for s in SAMPLES[:6]]
    assert len(backend.batches) == len(lengths) + 2 + 6
    last = backend.batches[-1][0]
    assert last.stop == ("\n",) and last.max_new_tokens == 5 and last.stop_on_eos
    assert all(r.tokens_in == len(s["prompt"].split()) for r, s in zip(p.records, SAMPLES))


def test_single_stream_keeps_sending_until_its_minimum_duration():
    clock = Clock()
    out = make("single-stream", clock, requests=2, warmup=0, min_duration_s=3.0).run(Host(FakeBackend(clock)))
    (p,) = out.passes
    assert len(p.records) == 5            # 5 tokens x 1/8 s = 0.625 s a request; 3 s needs 5
    assert p.end - p.start >= 3.0


class TurnHost(Host):
    """A worker in a round in turns: each turn waits `wait` seconds of the fake clock for the other variants."""

    def __init__(self, backend, clock, wait=2.0):
        super().__init__(backend)
        self.clock, self.wait, self.tags = clock, wait, []

    def turn(self, tag):
        self.tags.append(tag)
        self.clock.now += self.wait
        return self.wait


def test_in_turns_each_request_waits_its_turn_runs_once_untimed_and_the_pass_leaves_both_out():
    clock = Clock()
    backend = FakeBackend(clock)
    host = TurnHost(backend, clock)
    (p,) = make("single-stream", clock, requests=3, warmup=0, min_duration_s=1.5).run(host).passes
    assert host.tags == ["single-stream warm-up"] + [f"single-stream request {i}" for i in (1, 2, 3)]
    timed = backend.batches[-6:]          # the request before it (in full, untimed), then the request, each turn
    assert [b[0].request_id for b in timed] == ["s9", "s0", "s0", "s1", "s1", "s2"]
    assert all(b[0].max_new_tokens == 5 for b in timed)
    # 3 requests of 0.625 s counted (min_duration_s counts them too: 1.875 s ≥ 1.5); 3 waits of 2 s and 3 rewarms
    # of 0.625 s left out of the pass's time
    assert p.paused == pytest.approx(3 * 2.625) and p.wall_time == pytest.approx(3 * 0.625)
    assert p.to_pass("x").wall_time == pytest.approx(3 * 0.625)


def test_in_turns_each_offline_pass_is_a_turn_after_a_short_batch():
    clock = Clock()
    backend = FakeBackend(clock)
    host = TurnHost(backend, clock)
    out = make("offline", clock, batch_size=4, passes=2, warmup=0).run(host)
    assert host.tags == ["offline warm-up", "offline pass 1", "offline pass 2"]
    assert [p.wall_time for p in out.passes] == [pytest.approx(3 * 0.625)] * 2     # 3 batches a pass, no wait
    shorts = [b for b in backend.batches if b[0].max_new_tokens == 2]
    assert len(shorts) == 2 + 2           # one per batch shape (4 and 2), then one before each pass


def test_a_rewarm_runs_until_its_lead_in_has_passed_once_at_least():
    from variantlab.measure.scenarios.common import rewarm
    clock = Clock()
    backend = FakeBackend(clock)
    request = [scenario_request()]
    rewarm(backend, request, clock=clock, lead_in_s=1.0)      # 0.625 s a run: two runs pass 1 s
    assert len(backend.batches) == 2
    rewarm(backend, request, full=False, clock=clock, lead_in_s=0.0)
    assert len(backend.batches) == 3 and backend.batches[-1][0].max_new_tokens == 2


def scenario_request():
    from variantlab.measure.scenarios.common import requests_for
    return requests_for(SAMPLES, 1, SETTINGS)[0]


def test_offline_passes_cover_every_sample_once_in_batches():
    clock = Clock()
    backend = FakeBackend(clock)
    out = make("offline", clock, batch_size=4, passes=2, warmup=1).run(Host(backend))
    assert len(out.passes) == 2
    for p in out.passes:
        assert [r.request_id for r in p.records] == [s["id"] for s in SAMPLES]
    timed = [b for b in backend.batches if b[0].max_new_tokens == 5][1:]   # after the one full warm-up batch
    assert [len(b) for b in timed] == [4, 4, 2] * 2


def test_offline_warms_each_batch_shape_once():
    clock = Clock()
    backend = FakeBackend(clock)
    make("offline", clock, batch_size=4, passes=1, warmup=0).run(Host(backend))
    short = [b for b in backend.batches if b[0].max_new_tokens == 2]
    shapes = [(len(b), max(len(r.prompt.split()) for r in b)) for b in short]
    assert len(shapes) == len(set(shapes)) and set(shapes) == {(4, 6), (2, 4)}   # batches 1 and 2 share a shape


def test_offline_sends_one_request_at_a_time_to_a_backend_that_cannot_batch():
    clock = Clock()
    backend = FakeBackend(clock, batching=False)
    out = make("offline", clock, batch_size=4, passes=1, warmup=0).run(Host(backend))
    assert all(len(b) == 1 for b in backend.batches) and len(out.passes[0].records) == len(SAMPLES)


def test_offline_repeats_passes_until_its_minimum_duration():
    clock = Clock()
    out = make("offline", clock, batch_size=10, passes=1, warmup=0, min_duration_s=2.0).run(Host(FakeBackend(clock)))
    assert len(out.passes) == 4           # 0.625 s a pass


def test_length_sweep_sends_exact_lengths_with_every_stop_rule_off():
    clock = Clock()
    backend = FakeBackend(clock)
    out = make("length-sweep", clock, lengths=[8, 3], decode_tokens=4, repeats=2, warmup=0).run(Host(backend))
    recs = out.passes[0].records
    assert [r.tokens_in for r in recs] == [3, 3, 8, 8]
    assert all(r.tokens_out == 4 for r in recs)
    sent = backend.batches[-1][0]
    assert sent.stop == () and not sent.stop_on_eos


def test_length_sweep_refuses_a_backend_without_token_prompts():
    clock = Clock()
    with pytest.raises(ValueError, match="token-id prompts"):
        make("length-sweep", clock, lengths=[4]).run(Host(FakeBackend(clock, token_input=False)))


def test_rows_are_labelled_with_their_scenario_and_goodput_needs_an_slo():
    plain = scenario_tracker(SCENARIO_SPECS["single-stream"](type="single-stream", name="chat"), SETTINGS)
    assert plain.name == "chat"
    assert all(d.label.endswith("[chat]") for d in plain.metrics())
    assert "goodput" not in {d.key for d in plain.metrics()}
    with_slo = scenario_tracker(SCENARIO_SPECS["single-stream"](type="single-stream"),
                                WorkloadSettings(5, ("\n",), {"ttft_s": 0.2, "tpot_s": None}))
    (goodput,) = [d for d in with_slo.metrics() if d.key == "goodput"]
    assert "TTFT ≤ 0.2 s" in goodput.label


def test_goodput_counts_requests_that_meet_every_objective():
    clock = Clock()
    sc = scenario_tracker(SCENARIO_SPECS["single-stream"](type="single-stream", requests=4, warmup=0),
                          WorkloadSettings(5, ("\n",), {"ttft_s": 0.2}))
    sc = type(sc)(sc.spec, sc.workload, clock)
    out = sc.run(Host(FakeBackend(clock)))
    (goodput,) = [d for d in sc.metrics() if d.key == "goodput"]
    wall = out.passes[0].end - out.passes[0].start
    assert goodput.samples(out) == [pytest.approx(4 / wall)]   # TTFT 0.125 s <= 0.2 s for all


def test_a_scenario_rebuilds_from_its_config_and_its_output_validates():
    for kind, cls in SCENARIOS.items():
        t = scenario_tracker(SCENARIO_SPECS[kind](type=kind, **({"rate": 4} if kind == "server" else {})), SETTINGS)
        again = cls.from_config(t.config())
        assert again.spec == t.spec and again.workload == t.workload
    clock = Clock()
    out = make("single-stream", clock, requests=2, warmup=0).run(Host(FakeBackend(clock)))
    assert ScenarioOutput.model_validate_json(out.model_dump_json()) == out


def test_decode_bandwidth_is_the_bytes_a_token_reads_over_its_tpot():
    from variantlab.measure.scenarios.common import bandwidth_rows, decode_gbps
    clock = Clock()
    out = make("single-stream", clock, requests=2, warmup=0).run(Host(FakeBackend(clock)))
    assert decode_gbps(out) == []                                  # a remote backend: nothing known
    out = out.model_copy(update={"weight_bytes_per_token": 10**9, "kv_bytes_per_position": 10**6, "read_gbps": 20.0})
    r = out.passes[0].records[0]                                   # TPOT 1/8 s, context prompt + 2 tokens
    assert decode_gbps(out)[0] == (10**9 + 10**6 * (r.tokens_in + 2)) / 0.125 / 1e9
    gbps, share = bandwidth_rows()
    assert share.samples(out)[0] == 100 * decode_gbps(out)[0] / 20.0
    assert "20.0 GB/s" in gbps.note(out)
