"""Heterogeneous serving: several worker processes (CPU processes, or CPU and GPU together), each holding
some variants behind its own ServeEngine, and the `Router` in this process that the HTTP app talks to
in place of one engine (it offers submit, cancel, queue_length, running, lanes, policy, metrics, error).

- **Workers.** One spawned process (multiprocessing's spawn context, daemonic) per `WorkerSpec`, which
  builds and serves its variants (serve/worker.py) and dies with this process.
- **IPC.** One duplex pipe per worker carrying the frozen records of serve/worker.py, versioned at the
  handshake. One reader thread per worker delivers each event to its request's sink, so the events of
  a request (which lives on one worker) arrive in order; the sink is called from that thread.
- **Routing.** A request that names a variant goes only to the live workers holding it; an unpinned one
  to any live worker. Among them it goes to the lowest expected completion time

      (outstanding tokens + the request's max_new_tokens) × step(b) / b,   b = min(rows, in flight + 1)

  where the outstanding tokens are the unfinished max_new_tokens of the requests this router has in
  flight there (counted here, so that a burst of arrivals is spread without waiting for a report),
  step(b) is the worker's measured decode step at batch b for the variant the request would run on
  (its policy's current variant when unpinned; `routing_costs`: workers that run a variant on the same
  kind of device with the same threads share one curve, the fastest figure at each batch size, and a
  curve never falls as the batch grows) and `rows` how many rows its policy runs together
  (single 1, static its batch, adaptive its current cap: from the worker's `Load` reports). Expected
  times within ROUTE_MARGIN of the best count as equal, and the queue decides among them: the fewest
  outstanding tokens, then the lower index. The margin is the calibration's noise (each worker measures
  its own steps while the others start), and the curves are often flat (the tiny model's step is
  about the same from 1 to 8 rows; bf16 on our CPUs up to 64), where batching looks free and the
  noise alone would pile a burst onto one worker while another sits idle; a GPU beside a CPU differs
  by far more than the margin. A worker with `max_queue` requests in flight takes no more; when every
  candidate is full, QueueFull (429).
- **Prompt scoring** (`score`: echo + logprobs, serve/scoring.py) is one forward: it goes to the live worker
  holding its variant with the fewest outstanding tokens, and its one answer comes back as a PromptScores.
- **Failure.** A worker whose pipe closes (crashed, killed) is taken out of routing; its requests in
  flight end with an error event (finish_reason "error", and which worker died with what exit code),
  and the others go on. `error` (what /health reads) is set only when no worker is left.
- **Metrics.** `/metrics` is this router's own registry (requests routed per worker, worker deaths,
  workers alive, refusals) followed by every live worker's families merged, each sample labelled
  `worker="N"`: one valid Prometheus text.

The CUDA path (a spec whose device is "cuda:N") is written but has been tested on CPU workers only;
build_server refuses a CUDA device this machine does not have (server.check_devices) before anything
is spawned.
"""
from __future__ import annotations

import collections
import itertools
import logging
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ..errors import VariantlabError
from .engine import FINISH_CANCELLED, FINISH_ERROR, QueueFull, ServeRequest, ShuttingDown, StreamEvent
from .policy_kinds import policy_kind
from .scoring import PromptScores, ScoreRequest
from .shedding import RETRY_AFTER_S, refusal
from .worker import (PROTOCOL, Built, Calibrate, Cancel, Failed, Load, Log, MetricsQuery, MetricsReply, Ready, Score,
                     Stop, Submit, WorkerSpec, worker_main)

log_ = logging.getLogger("variantlab.serve.workers")

ROUTE_MARGIN = 1.25       # expected times within this factor of the best are a tie (module doc)
METRICS_TIMEOUT_S = 2.0   # /metrics waits this long for a worker's exposition, then uses its last one
START_TIMEOUT_S = 600.0   # a worker that has not built its variants by then fails the start


# ------------------------------------------------------------------ the router (this process)

@dataclass(frozen=True)
class LaneInfo:
    """What the HTTP app reads of a served variant."""

    name: str
    max_len: int


@dataclass(frozen=True)
class RouterPolicy:
    name: str


@dataclass
class _Flight:
    request: ServeRequest
    sink: Callable[[StreamEvent], None]
    worker: int
    tokens: int = 0
    variant: str = ""


@dataclass
class Worker:
    """The router's view of one worker process."""

    spec: WorkerSpec
    process: Any
    conn: Any
    ready: Ready | None = None
    load: Load | None = None
    alive: bool = True
    exit_code: int | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None
    costs: dict = field(default_factory=dict)   # variant → the step seconds routing uses (routing_costs)
    metrics_text: bytes = b""            # its last exposition
    load_at: float = 0.0                 # when its last Load report came (the router's clock)
    last_error: str | None = None

    @property
    def index(self) -> int:
        return self.spec.index

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def device(self) -> str:
        return self.spec.options.device

    def holds(self, variant: str) -> bool:
        return variant in self.ready.max_len


class Router:
    """Several worker processes behind the interface of one ServeEngine (module doc). `start()` spawns them
    and returns once every one has built its variants; `stop()` ends them."""

    def __init__(self, specs: list[WorkerSpec], *, max_queue: int = 256, log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.perf_counter):
        if not specs:
            raise ValueError("a router needs at least one worker")
        self.specs = list(specs)
        self.max_queue = max_queue          # requests in flight on one worker at most
        self.clock = clock
        self._log = log
        self.workers: list[Worker] = []
        self._flights: dict[str, _Flight] = {}
        self._scorings: dict[str, tuple[Callable[[PromptScores], None], int]] = {}   # id → (sink, worker)
        self._served_by: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._stopping = False
        self._tokens = itertools.count()
        self._replies: dict[int, tuple[threading.Event, list]] = {}
        self._ids = itertools.count()
        self.policy = RouterPolicy(specs[0].options.policy)
        self.metrics = _RouterMetrics(self)
        self.error: str | None = None

    # ------------------------------------------------------------------ life

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "Router":
        """Spawn every worker (they build at once, side by side), then let each measure its step costs in
        turn and wait for it to be ready; a worker that fails stops them all and raises (a VariantlabError
        when its error was one).

        Spawned processes import the parent's main module: a script that starts a router needs the
        `if __name__ == "__main__":` guard. Linux's parent-death signal follows the *thread* that
        spawned a worker, so call this from a thread that lives as long as the server (the main one)."""
        ctx = multiprocessing.get_context("spawn")
        for spec in self.specs:
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, args=(child_end, spec, os.getpid()),
                               name=f"variantlab-serve-worker-{spec.index}", daemon=True)
            proc.start()
            child_end.close()                # so that the worker's death closes the pipe here
            self.workers.append(Worker(spec, proc, parent_end))
            self.metrics.routed.labels(str(spec.index))
        try:
            deadline = (time.monotonic() + timeout_s, timeout_s)
            for w in self.workers:
                self._await(w, Built, deadline)
            for w in self.workers:                  # one at a time (serve/worker.py)
                self._send(w, Calibrate())
                w.ready = self._await(w, Ready, deadline)
                if w.ready.protocol != PROTOCOL:
                    raise RuntimeError(f"worker {w.index} speaks protocol {w.ready.protocol}, this router {PROTOCOL}")
                self._log(f"worker {w.index} ({w.device}, pid {w.ready.pid}) serves {', '.join(w.ready.max_len)} "
                          f"({w.ready.policy})")
            for w, costs in zip(self.workers, routing_costs(self.workers)):
                w.costs = costs
        except BaseException:
            self.stop()
            raise
        for w in self.workers:
            w.reader = threading.Thread(target=self._read, args=(w,), name=f"variantlab-router-{w.index}",
                                        daemon=True)
            w.reader.start()
        self.metrics.alive.set(len(self.workers))
        return self

    def _await(self, w: Worker, kind: type, deadline: tuple[float, float]):
        """The worker's next `kind` record while it starts (by deadline: (monotonic time, the timeout it
        came from)), its log lines relayed; raise when it fails."""
        while True:
            left = deadline[0] - time.monotonic()
            if left <= 0 or not w.conn.poll(left):
                raise RuntimeError(f"worker {w.index} ({w.device}) did not start within {deadline[1]:.0f} s")
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                w.process.join(5)
                raise RuntimeError(f"worker {w.index} ({w.device}) died while starting "
                                   f"(exit code {w.process.exitcode})") from None
            if isinstance(msg, Log):
                self._log(msg.line)
            elif isinstance(msg, Failed):
                if msg.user_error:
                    raise VariantlabError(f"worker {msg.index} ({w.device}): {msg.message}")
                raise RuntimeError(f"worker {msg.index} ({w.device}) failed to start: {msg.message}")
            elif isinstance(msg, kind):
                return msg

    def stop(self, timeout: float = 10.0) -> None:
        """End every worker (asked first, killed after `timeout`); requests still in flight end cancelled,
        and later submits raise ShuttingDown. Stopping twice is stopping once."""
        with self._lock:
            self._stopping = True
        for w in self.workers:
            self._send(w, Stop())
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.process.join(max(0.1, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(5)
        for w in self.workers:
            if w.reader is not None:
                w.reader.join(5)
            w.conn.close()
            w.alive = False
        with self._lock:
            left, self._flights = list(self._flights.values()), {}
            scorings, self._scorings = dict(self._scorings), {}
        for rid, (sink, _) in scorings.items():
            _answer(sink, PromptScores(rid, "", error="the server is shutting down"))
        now = self.clock()
        for f in left:
            self._deliver(f, StreamEvent(f.request.request_id, None, now, f.variant, FINISH_CANCELLED,
                                         error="the server is shutting down"))

    # ------------------------------------------------------------------ the engine's interface

    @property
    def lanes(self) -> dict[str, LaneInfo]:
        """The served variants (those of the live workers, in worker order) → their context."""
        live = [w for w in self.workers if w.alive and w.ready] or [w for w in self.workers if w.ready]
        out: dict[str, LaneInfo] = {}
        for w in live:
            for name, n in w.ready.max_len.items():
                out.setdefault(name, LaneInfo(name, n))
        return out

    def submit(self, request: ServeRequest, sink: Callable[[StreamEvent], None]) -> None:
        """Route a request (module doc). ValueError for a variant no live worker holds or a request longer
        than its lane allows; QueueFull when every worker that could take it has max_queue in flight;
        ShuttingDown once stopped; RuntimeError when no worker is left."""
        if not request.prompt_ids:
            raise ValueError("the prompt has no tokens")
        with self._lock:
            able = self._able(request.variant)
            max_len = min(w.ready.max_len[request.variant or self._current(w)] for w in able)
            if len(request.prompt_ids) + request.max_new_tokens > max_len:
                raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) + max_tokens "
                                 f"({request.max_new_tokens}) exceeds the served context of {max_len} tokens")
            open_ = [w for w in able if self._in_flight(w) < self.max_queue]
            if not open_:
                self.metrics.rejected.inc()
                raise QueueFull(max(1.0, min(self.expected_s(w, request) for w in able)))
            late = {w.index: refusal(self._head_wait(w), self._ttft_slo(w)) for w in open_}
            if all(late.values()):
                self.metrics.rejected.inc()
                raise QueueFull(RETRY_AFTER_S, late[open_[0].index])
            open_ = [w for w in open_ if late[w.index] is None]
            expected = {w.index: self.expected_s(w, request) for w in open_}
            best = min(expected.values())
            near = [w for w in open_ if expected[w.index] <= best * ROUTE_MARGIN]
            w = min(near, key=lambda w: (self._outstanding(w), expected[w.index], w.index))
            self._flights[request.request_id] = _Flight(request, sink, w.index)
            self._served_by[request.request_id] = w.index
            while len(self._served_by) > 4096:
                self._served_by.popitem(last=False)
        self.metrics.routed.labels(str(w.index)).inc()
        self._send(w, Submit(request))   # a worker that has just died: its reader fails the flight

    def _able(self, variant: str | None) -> list:
        """The live workers that hold `variant` (any, for None); called under the lock. ShuttingDown once
        stopped, RuntimeError when no worker is left, ValueError for a variant none holds."""
        if self._stopping:
            raise ShuttingDown()
        live = [w for w in self.workers if w.alive]
        if not live:
            raise RuntimeError(self.error or "no serving worker is left")
        able = [w for w in live if variant is None or w.holds(variant)]
        if not able:
            served = ", ".join(dict.fromkeys(n for w in live for n in w.ready.max_len))
            raise ValueError(f"unknown variant {variant!r} (served: {served})")
        return able

    def score(self, request: ScoreRequest, sink: Callable[[PromptScores], None]) -> None:
        """Send a prompt scoring to the live worker holding its variant with the fewest outstanding tokens
        (module doc); its PromptScores goes to `sink` from that worker's reader thread. ValueError,
        ShuttingDown and RuntimeError as submit."""
        with self._lock:
            able = self._able(request.variant)
            w = min(able, key=lambda w: (self._outstanding(w), w.index))
            max_len = w.ready.max_len[request.variant or next(iter(w.ready.max_len))]
            if not request.prompt_ids or len(request.prompt_ids) + request.generate > max_len:
                raise ValueError(f"the prompt ({len(request.prompt_ids)} tokens) does not fit the served context "
                                 f"of {max_len} tokens")
            self._scorings[request.request_id] = (sink, w.index)
        self._send(w, Score(request))   # a worker that has just died: its reader fails the scoring

    def cancel(self, request_id: str) -> None:
        """The client went away: forget the request here (no further events) and free its row there."""
        with self._lock:
            f = self._flights.pop(request_id, None)
        if f is not None:
            self._send(self.workers[f.worker], Cancel(request_id))

    def queue_length(self) -> int:
        return sum(w.load.waiting for w in self.workers if w.alive and w.load)

    def running(self) -> int:
        return sum(w.load.running for w in self.workers if w.alive and w.load)

    def next_id(self) -> str:
        return f"req-{next(self._ids)}"

    # ------------------------------------------------------------------ routing

    def expected_s(self, w: Worker, request: ServeRequest) -> float:
        """Seconds until `request` would be done on `w`: the outstanding work there, itself included,
        times the per-token cost at the batch it would join (module doc)."""
        variant = request.variant or self._current(w)
        rows = w.load.rows.get(variant, 1) if w.load else w.spec.options.max_batch
        b = max(1, min(rows, self._in_flight(w) + 1))
        return (self._outstanding(w) + request.max_new_tokens) * _step_s(w.costs[variant], b) / b

    def _head_wait(self, w: Worker) -> float | None:
        """How long the oldest request waiting on `w` has waited now, from its last Load report (sent every
        REPORT_S while requests wait) and the time since."""
        if w.load is None or w.load.oldest_wait_s is None:
            return None
        return w.load.oldest_wait_s + (self.clock() - w.load_at)

    @staticmethod
    def _ttft_slo(w: Worker) -> float | None:
        """The TTFT SLO a worker's policy keeps, by which the router sheds (adaptive only)."""
        return w.spec.options.ttft_slo_s if policy_kind(w.spec.options.policy).keeps_slos else None

    def _current(self, w: Worker) -> str:
        return w.load.current if w.load else next(iter(w.ready.max_len))

    def _in_flight(self, w: Worker) -> int:
        return sum(1 for f in self._flights.values() if f.worker == w.index)

    def _outstanding(self, w: Worker) -> int:
        """Tokens still to come of the requests in flight on `w` (their max_new_tokens, less what came)."""
        return sum(max(0, f.request.max_new_tokens - f.tokens) for f in self._flights.values() if f.worker == w.index)

    def served_by(self, request_id: str) -> int | None:
        """The worker a request was routed to (the last 4,096 requests)."""
        return self._served_by.get(request_id)

    def calibration(self) -> dict:
        """worker → variant → decode-step seconds by batch size, as each worker measured them."""
        return {w.index: {n: {str(b): s for b, s in sorted(c.items())} for n, c in w.ready.costs.items()}
                for w in self.workers if w.ready}

    # ------------------------------------------------------------------ the pipes

    def _send(self, w: Worker, msg) -> bool:
        try:
            with w.send_lock:
                w.conn.send(msg)
            return True
        except (OSError, ValueError):   # closed or broken: the reader sees the death
            return False

    def _read(self, w: Worker) -> None:
        try:
            while True:
                msg = w.conn.recv()
                if isinstance(msg, StreamEvent):
                    self._on_event(msg)
                elif isinstance(msg, PromptScores):
                    with self._lock:
                        waiting = self._scorings.pop(msg.request_id, None)
                    if waiting is not None:
                        _answer(waiting[0], msg)
                elif isinstance(msg, Load):
                    w.load, w.load_at = msg, self.clock()
                    if msg.error and msg.error != w.last_error:
                        self._log(f"worker {w.index}: a serving step failed: {msg.error}")
                    w.last_error = msg.error
                elif isinstance(msg, MetricsReply):
                    w.metrics_text = msg.text
                    waiter = self._replies.get(msg.token)
                    if waiter is not None:
                        waiter[1].append((w.index, msg.text))
                        waiter[0].set()
                elif isinstance(msg, Log):
                    self._log(msg.line)
        except (EOFError, OSError, ValueError):
            pass
        self._died(w)

    def _on_event(self, ev: StreamEvent) -> None:
        with self._lock:
            f = self._flights.get(ev.request_id)
            if f is None:             # cancelled here already
                return
            if ev.token_id is not None:
                f.tokens += 1
            f.variant = ev.variant or f.variant
            if ev.finish_reason is not None:
                del self._flights[ev.request_id]
        self._deliver(f, ev)

    def _deliver(self, f: _Flight, ev: StreamEvent) -> None:
        try:
            f.sink(ev)
        except Exception:  # noqa: BLE001 - a sink that fails is a client gone; the others go on
            log_.exception("a request's sink raised; dropping the request")
            if ev.finish_reason is None:
                self.cancel(ev.request_id)

    def _died(self, w: Worker) -> None:
        """The worker's pipe closed: out of routing, its requests in flight failed (module doc)."""
        w.process.join(1)
        w.exit_code = w.process.exitcode
        with self._lock:
            w.alive = False
            lost = [f for f in self._flights.values() if f.worker == w.index]
            for f in lost:
                del self._flights[f.request.request_id]
            scorings = {rid: sink for rid, (sink, i) in self._scorings.items() if i == w.index}
            for rid in scorings:
                del self._scorings[rid]
            left = sum(1 for x in self.workers if x.alive)
        if self._stopping:
            reason, message = FINISH_CANCELLED, "the server is shutting down"
        else:
            reason = FINISH_ERROR
            message = f"worker {w.index} ({w.device}, pid {w.pid}) died (exit code {w.exit_code})"
            self.metrics.deaths.inc()
            self.metrics.alive.set(left)
            self._log(f"{message}; {len(lost)} requests in flight failed; {left} workers left")
            if not left:
                self.error = f"no serving worker is left: the last, {message}"
        now = self.clock()
        for f in lost:
            self._deliver(f, StreamEvent(f.request.request_id, None, now, f.variant or f.request.variant or "",
                                         reason, error=message))
        for rid, sink in scorings.items():
            _answer(sink, PromptScores(rid, "", error=message))

    def worker_expositions(self, timeout_s: float = METRICS_TIMEOUT_S) -> dict[int, bytes]:
        """worker → its Prometheus text, asked for now (a worker that does not answer in time: its last)."""
        live = [w for w in self.workers if w.alive]
        token = next(self._tokens)
        event, got = threading.Event(), []
        self._replies[token] = (event, got)
        try:
            asked = [w for w in live if self._send(w, MetricsQuery(token))]
            deadline = time.monotonic() + timeout_s
            while len(got) < len(asked):
                if not event.wait(max(0.0, deadline - time.monotonic())):
                    break
                event.clear()
        finally:
            del self._replies[token]
        return {w.index: w.metrics_text for w in live if w.metrics_text}


def routing_costs(workers: list[Worker]) -> list[dict[str, dict[int, float]]]:
    """Per worker, variant → the decode-step seconds routing uses. Workers that run a variant on the same
    kind of device (every CPU worker alike; a CUDA worker per device) with the same threads run the same
    kernels on the same hardware, so their measurements are one curve: the fastest at each batch size
    (the calibration's own rule: the others carry the machine's noise). A step over more rows never takes
    less time, so the curve is made non-decreasing (each size at least the figure of every smaller one):
    measured noise must not make joining a batch look cheaper than running alone."""
    def key(w: Worker, variant: str) -> tuple:
        return w.device, w.spec.options.threads, variant

    pooled: dict[tuple, dict[int, float]] = {}
    for w in workers:
        for variant, seconds in w.ready.costs.items():
            curve = pooled.setdefault(key(w, variant), {})
            for b, sec in seconds.items():
                curve[b] = min(sec, curve.get(b, float("inf")))
    for curve in pooled.values():
        top = 0.0
        for b in sorted(curve):
            top = curve[b] = max(top, curve[b])
    return [{v: pooled[key(w, v)] for v in w.ready.costs} for w in workers]


def _answer(sink: Callable[[PromptScores], None], answer: PromptScores) -> None:
    try:
        sink(answer)
    except Exception:  # noqa: BLE001 - a sink that fails is a client gone; the others go on
        log_.exception("a scoring request's sink raised")


def _step_s(seconds: dict[int, float], batch: int) -> float:
    from .policies import StepCost
    return StepCost("", seconds).at(batch)


# ------------------------------------------------------------------ metrics

class _RouterMetrics:
    """The router's own counters, then every worker's families relabelled with worker="N"."""

    def __init__(self, router: Router):
        self.router = router
        r = self.registry = CollectorRegistry()
        p = "variantlab_router_"
        self.routed = Counter(p + "routed_requests", "requests routed to each worker", ["worker"], registry=r)
        self.deaths = Counter(p + "worker_deaths", "workers that died while serving", registry=r)
        self.alive = Gauge(p + "workers_alive", "workers taking requests", registry=r)
        self.rejected = Counter(p + "requests_rejected", "requests refused (429): every worker full, or late on "
                                "the TTFT SLO (shedding)", registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + relabel(self.router.worker_expositions())


def relabel(texts: dict[int, bytes]) -> bytes:
    """Several registries' Prometheus texts as one, each sample labelled worker="N" (families merged,
    so that each family's HELP and TYPE appear once)."""
    families: dict[str, Metric] = {}
    for index, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type, fam.unit))
            for s in fam.samples:
                merged.add_sample(s.name, {"worker": str(index), **s.labels}, s.value, s.timestamp, s.exemplar)

    class _Collector:
        def collect(self):
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry)


# ------------------------------------------------------------------ text for the HTTP app

class TokenizerText:
    """What the HTTP app needs of a TorchEngine (encode, decode, tokenizer) without a model in this process:
    the same calls as backends/torch_engine.TorchEngine.encode/decode."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True).input_ids

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


def tokenizer_text(source, trust_remote_code: bool = False) -> TokenizerText:
    """The checkpoint's tokenizer, loaded as models/loading.load_causal_lm loads it."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return TokenizerText(tok)
