"""The serving engine (serve/engine.py) on the tiny model: a request's greedy output is the same alone
and inside a continuous batch (and the naive generator's), stop rules, cancellation frees the slot, a
full queue refuses, and the metrics count what happened."""
from __future__ import annotations

import threading
import time

import pytest

from tests.backends.test_torch_engine import naive
from variantlab.backends.base import FINISH_LENGTH, FINISH_STOP, GenerationRequest
from variantlab.backends.torch_engine import TorchEngine
from variantlab.serve.engine import FINISH_CANCELLED, QueueFull, ServeEngine, ServeRequest, ShuttingDown
from variantlab.serve.lane import Lane
from variantlab.serve.policies import AdaptivePolicy, SinglePolicy, StaticPolicy, StepCost

pytestmark = pytest.mark.model
TEXTS = ["order_id: ORD-5493\ncustomer: Priya", "hello world", "[{\"invoice\":\"INV-65887\"", "Q: what A:",
         "status: pending\nQ: What is the status?\nA:"]


class Collector:
    def __init__(self):
        self.events, self.lock, self.done = {}, threading.Lock(), threading.Event()
        self.expected = 0

    def __call__(self, ev):
        with self.lock:
            self.events.setdefault(ev.request_id, []).append(ev)
            if sum(1 for evs in self.events.values() if evs[-1].finish_reason) >= self.expected:
                self.done.set()

    def tokens(self, rid):
        return [e.token_id for e in self.events[rid] if e.token_id is not None]


@pytest.fixture
def engine(tiny_lm):
    model, tok = tiny_lm
    return TorchEngine(model, tok, "cpu")


def requests(engine, n, **kw):
    return [ServeRequest(f"r{i}", tuple(engine.encode(TEXTS[i % len(TEXTS)] * (1 + i % 2))), 5 + i % 7, **kw)
            for i in range(n)]


def run_all(serving: ServeEngine, reqs, stagger_s=0.0, timeout=60):
    c = Collector()
    c.expected = len(reqs)
    serving.start()
    try:
        for r in reqs:
            serving.submit(r, c)
            time.sleep(stagger_s)
        assert c.done.wait(timeout), "requests did not finish"
    finally:
        serving.stop()
    return c


@pytest.mark.parametrize("policy", ["single", "static", "adaptive"])
def test_greedy_output_is_the_same_alone_and_inside_any_batch(engine, tiny_lm, policy):
    model, tok = tiny_lm
    reqs = requests(engine, 12, stop=("\n",))
    lane = Lane("v", engine, max_rows=8, max_len=128, chunk=16)
    pol = {"single": SinglePolicy("v"), "static": StaticPolicy("v", 4, 0.005),
           "adaptive": AdaptivePolicy({"v": StepCost("v", {1: 0.001, 8: 0.002})}, max_rows=8)}[policy]
    c = run_all(ServeEngine({"v": lane}, pol), reqs, stagger_s=0.002)
    for r in reqs:
        want, why = naive(model, tok, GenerationRequest(r.request_id, prompt_ids=r.prompt_ids,
                                                        max_new_tokens=r.max_new_tokens, stop=r.stop))
        assert c.tokens(r.request_id) == want, r.request_id
        evs = c.events[r.request_id]
        assert evs[-1].finish_reason == why and all(e.finish_reason is None for e in evs[:-1])
        assert evs[0].prompt_tokens == len(r.prompt_ids) and all(e.variant == "v" for e in evs)
        assert [e.time for e in evs] == sorted(e.time for e in evs)


def test_requests_that_name_a_variant_run_there(engine):
    lanes = {"a": Lane("a", engine, max_rows=4, max_len=128), "b": Lane("b", engine, max_rows=4, max_len=128)}
    reqs = [ServeRequest(f"r{i}", tuple(engine.encode("hello world")), 4, variant="b" if i % 2 else None)
            for i in range(6)]
    c = run_all(ServeEngine(lanes, SinglePolicy("a")), reqs)
    assert {c.events[f"r{i}"][0].variant for i in range(0, 6, 2)} == {"a"}
    assert {c.events[f"r{i}"][0].variant for i in range(1, 6, 2)} == {"b"}


def test_a_cancelled_request_frees_its_row_at_the_next_step(engine):
    lane = Lane("v", engine, max_rows=2, max_len=512)
    serving = ServeEngine({"v": lane}, AdaptivePolicy({"v": StepCost("v", {1: 0.001})}, max_rows=2))
    long = ServeRequest("long", tuple(engine.encode("hello world")), 400, stop_on_eos=False)
    got = []
    started = threading.Event()

    def sink(ev):
        got.append(ev)
        if len(got) == 3:
            started.set()
    serving.start()
    try:
        serving.submit(long, sink)
        assert started.wait(30)
        serving.cancel("long")
        deadline = time.time() + 10
        while (lane.n_active or serving.running()) and time.time() < deadline:
            time.sleep(0.005)
        assert lane.n_active == 0 and serving.running() == 0
        assert len(got) < 400 and all(e.finish_reason is None for e in got)   # no more events after the cancel
        text = serving.metrics.exposition().decode()
        assert 'variantlab_requests_finished_total{reason="cancelled"} 1.0' in text
    finally:
        serving.stop()


def test_a_full_queue_refuses_with_a_retry_after(engine):
    serving = ServeEngine({"v": Lane("v", engine, max_rows=1, max_len=128)}, SinglePolicy("v"), max_queue=2)
    r = requests(engine, 3)
    serving.submit(r[0], lambda ev: None)        # the engine is not started: both wait
    serving.submit(r[1], lambda ev: None)
    with pytest.raises(QueueFull) as e:
        serving.submit(r[2], lambda ev: None)
    assert e.value.retry_after_s >= 1
    assert "variantlab_requests_rejected_total 1.0" in serving.metrics.exposition().decode()


def test_a_policy_that_keeps_a_ttft_slo_refuses_newcomers_while_the_queue_head_is_late(engine):
    """serve/shedding.py on the engine's own clock: the first request waits (the engine is not started);
    while it has waited under 60% of the 100 ms TTFT SLO a newcomer joins, then one is refused."""
    now = [0.0]
    policy = AdaptivePolicy({"v": StepCost("v", {1: 0.001})}, tpot_slo_s=0.025, ttft_slo_s=0.1)
    serving = ServeEngine({"v": Lane("v", engine, max_rows=4, max_len=128)}, policy, clock=lambda: now[0])
    r = requests(engine, 3)
    serving.submit(r[0], lambda ev: None)
    now[0] = 0.059
    serving.submit(r[1], lambda ev: None)
    assert serving.oldest_wait() == pytest.approx(0.059)
    now[0] = 0.061
    with pytest.raises(QueueFull, match="waited 61 ms") as e:
        serving.submit(r[2], lambda ev: None)
    assert e.value.retry_after_s >= 1
    assert "variantlab_requests_rejected_total 1.0" in serving.metrics.exposition().decode()
    serving.sheds = False                       # a routed worker: the router decides
    serving.submit(r[2], lambda ev: None)
    assert serving.queue_length() == 3


def test_a_stopped_engine_refuses_a_request_instead_of_holding_it_forever(engine):
    """No thread takes requests once the engine has stopped: one submitted then would wait for ever."""
    serving = ServeEngine({"v": Lane("v", engine, max_rows=1, max_len=64)}, SinglePolicy("v")).start()
    serving.stop()
    with pytest.raises(ShuttingDown, match="shutting down"):
        serving.submit(requests(engine, 1)[0], lambda ev: None)
    assert serving.queue_length() == 0


def test_requests_the_engine_cannot_serve_are_refused_at_submit(engine):
    serving = ServeEngine({"v": Lane("v", engine, max_rows=1, max_len=64)}, SinglePolicy("v"))
    with pytest.raises(ValueError, match="unknown variant 'w'"):
        serving.submit(ServeRequest("x", (1, 2), 4, variant="w"), print)
    with pytest.raises(ValueError, match="exceeds the served context of 64 tokens"):
        serving.submit(ServeRequest("x", (1,) * 60, 10), print)


def test_the_metrics_count_tokens_requests_and_batches(engine):
    lane = Lane("v", engine, max_rows=8, max_len=128)
    serving = ServeEngine({"v": lane}, AdaptivePolicy({"v": StepCost("v", {1: 0.001})}, max_rows=8))
    reqs = requests(engine, 6)
    c = run_all(serving, reqs)
    text = serving.metrics.exposition().decode()
    n_tokens = sum(len(c.tokens(r.request_id)) for r in reqs)
    assert f'variantlab_generated_tokens_total{{variant="v"}} {float(n_tokens)}' in text
    assert "variantlab_ttft_seconds_count 6.0" in text and "variantlab_queue_length 0.0" in text
    finished = sum(1 for r in reqs if c.events[r.request_id][-1].finish_reason in (FINISH_STOP, FINISH_LENGTH))
    assert finished == 6 and FINISH_CANCELLED not in text.split("requests_finished_total")[-1][:40]


def test_requests_pinned_to_a_full_lane_wait_their_turn(engine):
    """Pinned requests beyond a lane's rows stay queued (an empty group must never be started)."""
    lane = Lane("v", engine, max_rows=2, max_len=128)
    reqs = [ServeRequest(f"p{i}", tuple(engine.encode("hello world")), 4, variant="v") for i in range(6)]
    c = run_all(ServeEngine({"v": lane}, AdaptivePolicy({"v": StepCost("v", {1: 0.001})}, max_rows=2)), reqs)
    assert all(c.events[r.request_id][-1].finish_reason in (FINISH_STOP, FINISH_LENGTH) for r in reqs)


def test_every_switch_is_logged_with_its_reason_and_counted(engine):
    """A policy that switches on its first look: the engine hands the line to on_switch (the server's log;
    a routed worker's goes up its pipe) and counts it in /metrics."""
    from variantlab.serve.policies import Decision

    class Switching(SinglePolicy):
        def decide(self, view):
            return Decision({"b": 1}, {"from": "a", "to": "b", "reason": "demand 9: b is faster", "demand": 9})

    lines = []
    serving = ServeEngine({"a": Lane("a", engine, max_rows=2, max_len=128), "b": Lane("b", engine, max_rows=2,
                                                                                      max_len=128)}, Switching("a"))
    serving.on_switch = lines.append
    serving.submit(requests(engine, 1)[0], lambda ev: None)
    serving._take_inbox()
    serving.iterate()
    assert lines == ["switch a → b: demand 9: b is faster"]
    counted = 'variantlab_variant_switches_total{from_variant="a",to_variant="b"} 1.0'
    assert counted in serving.metrics.exposition().decode()
