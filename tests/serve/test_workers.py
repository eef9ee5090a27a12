"""Heterogeneous serving (serve/workers.py) with two CPU worker processes on the shipped tiny model: the
router's greedy outputs equal a single in-process engine's, load is spread over both workers, a pinned
variant goes only to a worker that holds it, cancel frees the row, a killed worker fails its requests in
flight and the survivor takes the rest, stop() (and the parent's death) leave no worker behind, and the
whole thing answers the openai client over HTTP. Which worker served a request is read from the router
(`served_by`, its counters), never inferred from timings."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest

from variantlab.backends.base import FINISH_LENGTH
from variantlab.errors import VariantlabError
from variantlab.measure.plan import plan_suite_file
from variantlab.serve.engine import FINISH_ERROR, ServeRequest, ShuttingDown
from variantlab.serve.server import ServeOptions, build_server

pytestmark = pytest.mark.model

SUITE = """\
name: workers
model: builtin:tiny-structured
baseline: fp32
variants:
  - name: fp32
    recipe: fp32
  - name: bf16
    recipe: bf16
workload:
  dataset: {generator: structured, n: 16, seed: 0}
  max_new_tokens: 16
  stop: ["\\n"]
"""
TEXTS = ["order_id: ORD-5493\ncustomer: Priya", "status: pending\nQ: What is the status?\nA:",
         "[{\"invoice\":\"INV-65887\"", "hello world"]
CONTEXT = 256
WAIT_S = 60          # an upper bound for things to happen, never a measurement


class Collector:
    """A sink for many requests: their events in arrival order, and a wait for each one's end."""

    def __init__(self):
        self.events: dict[str, list] = {}
        self.cond = threading.Condition()

    def __call__(self, ev):
        with self.cond:
            self.events.setdefault(ev.request_id, []).append(ev)
            self.cond.notify_all()

    def wait(self, pred, what: str) -> None:
        with self.cond:
            assert self.cond.wait_for(pred, WAIT_S), what

    def finished(self, rid: str) -> bool:
        return bool(self.events.get(rid)) and self.events[rid][-1].finish_reason is not None

    def wait_done(self, rids) -> None:
        self.wait(lambda: all(self.finished(r) for r in rids), f"requests did not finish: {rids}")

    def tokens(self, rid: str) -> list[int]:
        return [e.token_id for e in self.events[rid] if e.token_id is not None]


def eventually(pred, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def gone(pid: int) -> bool:
    """No such process, or only its zombie (a reaped-later child of a dead parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("workers") / "suite.yaml"
    path.write_text(SUITE)
    return plan_suite_file(path)


@pytest.fixture(scope="module")
def reference(plan):
    """One in-process engine holding both variants: what the router's outputs must equal. Its batch holds
    every request a test sends at once: a pinned request kept waiting fails the in-process engine's step
    (engine.py's _admit hands the lane an empty group), which the workers guard against."""
    handle = build_server(plan, ServeOptions(context=CONTEXT, max_batch=32, threads=1), log=lambda line: None)
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def routed(plan):
    """Two CPU workers, one thread each, four rows a variant: worker 0 holds fp32 and bf16, worker 1 fp32."""
    handle = build_server(plan, ServeOptions(workers=2, worker_variants=(("fp32", "bf16"), ("fp32",)),
                                             context=CONTEXT, max_batch=4, threads=1), log=lambda line: None)
    workers = list(handle.engine.workers)
    yield handle
    handle.close()
    assert all(gone(w.pid) for w in workers) and not any(w.process.is_alive() for w in workers)


def requests(text, n: int, prefix: str, **kw) -> list[ServeRequest]:
    return [ServeRequest(f"{prefix}{i}", tuple(text.encode(TEXTS[i % len(TEXTS)])), 6 + i % 9, **kw)
            for i in range(n)]


def run(engine, reqs) -> Collector:
    c = Collector()
    for r in reqs:
        engine.submit(r, c)
    c.wait_done([r.request_id for r in reqs])
    return c


def test_greedy_outputs_equal_a_single_in_process_engine(routed, reference):
    reqs = [*requests(routed.text, 6, "u", stop=("\n",)), *requests(routed.text, 4, "b", variant="bf16"),
            *requests(routed.text, 4, "f", variant="fp32", stop_on_eos=False)]
    got = run(routed.engine, reqs)
    # the same prompts, pinned to the variant each one ran on, through one engine in this process
    ran_on = {r.request_id: got.events[r.request_id][0].variant for r in reqs}
    want = run(reference.engine, [ServeRequest(r.request_id, r.prompt_ids, r.max_new_tokens, r.stop, r.stop_on_eos,
                                               r.sampling, ran_on[r.request_id]) for r in reqs])
    for r in reqs:
        assert got.tokens(r.request_id) == want.tokens(r.request_id), r.request_id
        assert got.events[r.request_id][-1].finish_reason == want.events[r.request_id][-1].finish_reason
        assert got.events[r.request_id][0].prompt_tokens == len(r.prompt_ids)
        assert all(e.finish_reason is None for e in got.events[r.request_id][:-1])   # in order, one end


def test_requests_are_spread_over_both_workers_under_load(routed):
    before = _routed_counts(routed.engine)
    reqs = requests(routed.text, 10, "load", stop_on_eos=False)
    run(routed.engine, reqs)
    served = [routed.engine.served_by(r.request_id) for r in reqs]
    assert set(served) == {0, 1}, (served, routed.engine.calibration())
    after = _routed_counts(routed.engine)
    assert {w: after[w] - before[w] for w in after} == {w: served.count(w) for w in (0, 1)}


def test_a_pinned_variant_goes_only_to_a_worker_that_holds_it(routed):
    reqs = requests(routed.text, 8, "pin", variant="bf16", stop_on_eos=False)
    c = run(routed.engine, reqs)
    assert {routed.engine.served_by(r.request_id) for r in reqs} == {0}
    assert {e.variant for r in reqs for e in c.events[r.request_id]} == {"bf16"}
    with pytest.raises(ValueError, match="unknown variant 'int4'"):
        routed.engine.submit(ServeRequest("nope", (1, 2, 3), 4, variant="int4"), Collector())
    with pytest.raises(ValueError, match="exceeds the served context"):
        routed.engine.submit(ServeRequest("long", (1, 2, 3), CONTEXT), Collector())


def test_cancel_ends_a_request_and_frees_its_row(routed):
    router = routed.engine
    c = Collector()
    req = ServeRequest("cancel-me", tuple(routed.text.encode(TEXTS[0])), CONTEXT - 32, stop_on_eos=False)
    router.submit(req, c)
    c.wait(lambda: len(c.events.get("cancel-me", [])) >= 2, "no tokens came")
    worker = router.served_by("cancel-me")
    router.cancel("cancel-me")
    eventually(lambda: _finished(router, worker, "cancelled") >= 1, "the worker never cancelled the request")
    eventually(lambda: router.running() == 0, "the cancelled row still runs")
    assert not c.finished("cancel-me")   # a cancelled request gets no further events
    after = run(router, [ServeRequest("after", req.prompt_ids, 5, variant="fp32")])
    assert len(after.tokens("after")) == 5


def test_a_killed_worker_fails_its_requests_and_the_survivor_serves_on(plan):
    handle = build_server(plan, ServeOptions(workers=2, variants=("fp32",), context=CONTEXT, max_batch=8, threads=1),
                          log=lambda line: None)
    router = handle.engine
    pids = [w.pid for w in router.workers]
    try:
        c = Collector()
        reqs = requests(handle.text, 6, "k", stop_on_eos=False)
        reqs = [ServeRequest(r.request_id, r.prompt_ids, CONTEXT - 32, stop_on_eos=False) for r in reqs]
        for r in reqs:
            router.submit(r, c)
        by = {r.request_id: router.served_by(r.request_id) for r in reqs}
        assert set(by.values()) == {0, 1}, router.calibration()
        c.wait(lambda: all(c.events.get(r.request_id) for r in reqs), "not every request started")
        os.kill(router.workers[0].pid, signal.SIGKILL)
        c.wait_done([r.request_id for r in reqs])
        ends = {rid: c.events[rid][-1] for rid in by}
        lost = [rid for rid, w in by.items() if w == 0]
        assert any(ends[rid].finish_reason == FINISH_ERROR for rid in lost)
        for rid in lost:
            if ends[rid].finish_reason == FINISH_ERROR:
                assert ends[rid].token_id is None and "worker 0" in ends[rid].error and "died" in ends[rid].error
        for rid in (rid for rid, w in by.items() if w == 1):
            assert ends[rid].finish_reason == FINISH_LENGTH and len(c.tokens(rid)) == CONTEXT - 32
        assert router.error is None and list(router.lanes) == ["fp32"]   # one left: not degraded
        later = requests(handle.text, 4, "later")
        run(router, later)
        assert {router.served_by(r.request_id) for r in later} == {1}
        text = router.metrics.exposition().decode()
        assert "variantlab_router_worker_deaths_total 1.0" in text and "variantlab_router_workers_alive 1.0" in text
        os.kill(router.workers[1].pid, signal.SIGKILL)
        eventually(lambda: router.error is not None, "the router did not notice its last worker died")
        assert "no serving worker is left" in router.error
        with pytest.raises(RuntimeError, match="no serving worker"):
            router.submit(ServeRequest("none", (1, 2), 2), Collector())
    finally:
        handle.close()
    assert all(gone(p) for p in pids) and not any(w.process.is_alive() for w in router.workers)
    with pytest.raises(ShuttingDown):             # stopped: a 503, not "no serving worker" (a 500)
        router.submit(ServeRequest("after-stop", (1, 2), 2), Collector())


def test_workers_die_with_their_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        from variantlab.measure.plan import plan_suite_file
        from variantlab.serve.workers import Router, WorkerSpec
        from variantlab.serve.server import ServeOptions

        if __name__ == "__main__":
            plan = plan_suite_file({str(tmp_path / "suite.yaml")!r})
            opts = ServeOptions(policy="single", variants=("fp32",), context=64, max_batch=2, threads=1)
            specs = [WorkerSpec(0, (plan.variant("fp32"),), plan.calibration_texts, opts)]
            router = Router(specs, log=lambda line: None).start()
            print(*[w.pid for w in router.workers], flush=True)
            time.sleep(600)
        """))
    (tmp_path / "suite.yaml").write_text(SUITE)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 1 and not any(gone(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
    eventually(lambda: all(gone(p) for p in pids), "a worker outlived its parent")


def test_a_cuda_device_that_is_absent_is_one_clean_error(plan):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(VariantlabError, match="--devices: device 'cuda:0' asked for, but this machine has no CUDA"):
        build_server(plan, ServeOptions(workers=2, devices=("cpu", "cuda:0")))
    with pytest.raises(VariantlabError, match="--devices: 1 devices for 2 workers"):
        ServeOptions(workers=2, devices=("cpu",))


@pytest.mark.e2e
def test_the_openai_client_through_http(routed, reference):
    openai = pytest.importorskip("openai")
    from prometheus_client.parser import text_string_to_metric_families
    url, ref_url = routed.start_http(), reference.start_http()
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    ref = openai.OpenAI(base_url=ref_url + "/v1", api_key="x")
    assert [m.id for m in client.models.list().data] == ["fp32", "bf16"]
    for model in ("auto", "bf16", "fp32"):
        out = client.completions.create(model=model, prompt=TEXTS[0], max_tokens=12, temperature=0)
        want = ref.completions.create(model=out.model, prompt=TEXTS[0], max_tokens=12, temperature=0)
        assert out.choices[0].text == want.choices[0].text and out.choices[0].text
    stream = client.chat.completions.create(model="bf16", messages=[{"role": "user", "content": TEXTS[1]}],
                                            max_tokens=8, temperature=0, stream=True)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    want = ref.chat.completions.create(model="bf16", messages=[{"role": "user", "content": TEXTS[1]}],
                                       max_tokens=8, temperature=0)
    assert streamed == want.choices[0].message.content
    health = json.loads(urllib.request.urlopen(url + "/health").read())
    assert health["status"] == "ok" and [w["variants"] for w in health["workers"]] == [["fp32", "bf16"], ["fp32"]]
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}   # valid Prometheus text
    tokens = {s.labels["worker"] for s in families["variantlab_generated_tokens"].samples}
    assert tokens == {"0", "1"} and "variantlab_router_routed_requests" in families


def test_routing_costs_pool_identical_workers_and_never_fall_with_the_batch():
    from variantlab.serve.worker import PROTOCOL, Ready, WorkerSpec
    from variantlab.serve.workers import Worker, routing_costs

    def worker(i, device, seconds):
        spec = WorkerSpec(i, (), (), ServeOptions(device=device, threads=1))
        return Worker(spec, None, None, Ready(PROTOCOL, i, 0, device, "adaptive", {"fp32": 64}, {"fp32": seconds}))

    twins = [worker(0, "cpu", {1: 2.0, 2: 1.8, 4: 2.4}), worker(1, "cpu", {1: 1.6, 2: 2.2, 4: 3.0}),
             worker(2, "cuda:0", {1: 9.0, 2: 5.0, 4: 9.5})]
    cpu0, cpu1, gpu = routing_costs(twins)
    assert cpu0 == cpu1 == {"fp32": {1: 1.6, 2: 1.8, 4: 2.4}}      # the fastest of the two at each size
    assert gpu == {"fp32": {1: 9.0, 2: 9.0, 4: 9.5}}               # its own, made non-decreasing


def _routed_counts(router) -> dict[int, float]:
    get = router.metrics.registry.get_sample_value
    return {w.index: get("variantlab_router_routed_requests_total", {"worker": str(w.index)}) for w in router.workers}


def _finished(router, worker: int, reason: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = router.worker_expositions()[worker].decode()
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "variantlab_requests_finished")
    return sum(s.value for s in fam.samples if s.labels.get("reason") == reason and s.name.endswith("_total"))


def test_the_router_sheds_while_every_adaptive_workers_queue_head_is_late():
    """serve/shedding.py in the router, from the workers' Load reports and the time since each (its own
    clock): a worker whose oldest waiting request has waited 60% of the TTFT SLO takes no newcomer; when
    every worker is late, QueueFull (the HTTP app's 429). Real pipes; no worker process is needed."""
    import multiprocessing

    from variantlab.serve.engine import QueueFull
    from variantlab.serve.worker import PROTOCOL, Load, Ready, Submit, WorkerSpec
    from variantlab.serve.workers import Router, Worker

    now = [100.0]
    pipes = [multiprocessing.Pipe() for _ in range(2)]
    specs = [WorkerSpec(i, (), (), ServeOptions(threads=1, ttft_slo_s=0.1)) for i in range(2)]
    router = Router(specs, clock=lambda: now[0])
    router.workers = [Worker(s, None, here, Ready(PROTOCOL, s.index, 0, "cpu", "adaptive", {"fp32": 64},
                                                  {"fp32": {1: 0.001}}), costs={"fp32": {1: 0.001}})
                      for s, (here, _) in zip(specs, pipes)]

    def report(w, oldest):
        w.load, w.load_at = Load(1, 0, "fp32", {"fp32": 8}, None, oldest), now[0]

    def send(i):
        router.submit(ServeRequest(f"r{i}", (1, 2, 3), 4), lambda ev: None)

    report(router.workers[0], 0.050)
    report(router.workers[1], None)
    now[0] += 0.015                                   # worker 0's head has waited 65 ms by now
    send(0)
    assert router.served_by("r0") == 1 and isinstance(pipes[1][1].recv(), Submit)
    report(router.workers[1], 0.065)
    with pytest.raises(QueueFull, match="waited 65 ms"):
        send(1)
    assert router.metrics.registry.get_sample_value("variantlab_router_requests_rejected_total") == 1.0
    report(router.workers[0], None)                   # worker 0 caught up
    send(2)
    assert router.served_by("r2") == 0
    static = Router([WorkerSpec(0, (), (), ServeOptions(threads=1, ttft_slo_s=0.1, policy="static"))])
    assert static._ttft_slo(Worker(static.specs[0], None, None)) is None    # only adaptive keeps the SLO
