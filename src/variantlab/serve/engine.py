"""The serving engine: one thread that admits requests, prefills them in chunks and decodes every
running request together, step by step, across the variants it holds.

Requests arrive from any thread (`submit`); each names a sink, a callable the engine thread calls
with every `StreamEvent` of that request (a token, then its finish). One iteration of the loop:

1. take in new requests and cancellations (a cancelled request's row is freed before the next step);
2. ask the policy (serve/policies.py) which lane admits how many waiting requests, and start their
   prefill group; requests that name a variant go to that variant's lane;
3. run one prefill chunk in each lane that has a group, and join the finished groups (their first
   tokens are emitted then: TTFT);
4. one decode step in each lane with running rows; emit each token; free the rows that finished.

A prompt-scoring request (`score`: OpenAI's echo + logprobs, serve/scoring.py) is one forward over its
prompt, run on this thread at the start of the next iteration, before the admissions: it holds no row
and no KV cache, and its one answer (PromptScores) goes to its sink.

It sleeps only when there is nothing to run, until a request arrives or the policy's deadline (a
static batch's wait) passes. Stop rules are the bench engine's (backends/stopping.py): EOS, stop
strings, max_new_tokens; a request's greedy output is the same alone and inside any batch
(tests/serve/test_engine.py checks it token for token). Everything the server reports — queue
length, batch sizes, tokens, TTFT/TPOT, switches — is counted in `ServeMetrics`.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..backends.base import FINISH_LENGTH
from .lane import Lane, Row
from .metrics import ServeMetrics
from .policies import LaneView, LoadView, Policy, SinglePolicy
from .sampling import SamplingParams
from .scoring import PromptScores, ScoreRequest, score_prompt
from .shedding import RETRY_AFTER_S, refusal

log = logging.getLogger("variantlab.serve")

FINISH_CANCELLED = "cancelled"
FINISH_ERROR = "error"
ARRIVALS = 64          # recent submits the arrival rate and the requests' shape are measured over


class QueueFull(Exception):
    """The engine's queue is at its bound, or its oldest request is already late on the TTFT SLO the
    policy keeps (serve/shedding.py): the server answers 429 with Retry-After."""

    def __init__(self, retry_after_s: float, why: str = "the queue is full"):
        super().__init__(f"{why}; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class ShuttingDown(Exception):
    """The server is shutting down and takes no new request (503): the HTTP app's gate has closed
    (serve/admission.py), or the engine has stopped."""

    def __init__(self, why: str = "the server is shutting down"):
        super().__init__(why)


@dataclass(frozen=True)
class ServeRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_on_eos: bool = True
    sampling: SamplingParams = SamplingParams()
    variant: str | None = None          # a variant the client asked for; None: the policy picks


@dataclass(frozen=True)
class StreamEvent:
    """One token of a request (token_id), or its end without one (cancelled, error)."""

    request_id: str
    token_id: int | None
    time: float
    variant: str
    finish_reason: str | None = None    # stop | length | cancelled | error, on the last event
    prompt_tokens: int | None = None    # on the first event
    error: str | None = None


Sink = Callable[[StreamEvent], None]


@dataclass
class _Waiting:
    request: ServeRequest
    sink: Sink
    arrived: float


@dataclass
class _Running:
    request: ServeRequest
    sink: Sink
    arrived: float
    lane: str
    first_at: float | None = None
    last_at: float | None = None
    tokens: int = 0
    row: Row | None = None
    cancelled: bool = False             # cancelled while its group was being prefilled: leaves on joining


class ServeEngine:
    """Continuous batching over one Lane per variant (`lanes`: name → Lane), driven by `policy`."""

    def __init__(self, lanes: dict[str, Lane], policy: Policy | None = None, *, max_queue: int = 256,
                 clock: Callable[[], float] = time.perf_counter, metrics: ServeMetrics | None = None):
        if not lanes:
            raise ValueError("a serving engine needs at least one variant")
        self.lanes = lanes
        self.policy = policy or SinglePolicy(next(iter(lanes)))
        self.max_queue = max_queue
        self.clock = clock
        self.metrics = metrics or ServeMetrics(list(lanes))
        self.sheds = True          # False in a routed worker: the router sheds, seeing every worker
        self.on_switch: Callable[[str], None] | None = None   # where a switch's line goes besides logging
        self._inbox: collections.deque = collections.deque()
        self._cancel: collections.deque = collections.deque()
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._running: dict[str, _Running] = {}
        self._scores: collections.deque[tuple[ScoreRequest, Callable]] = collections.deque()   # prompt scoring
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ids = itertools.count()
        self.switches: list[dict] = []
        self.error: str | None = None
        self.recent_step_s: dict[str, collections.deque] = {n: collections.deque(maxlen=64) for n in lanes}
        self.steps = {n: 0 for n in lanes}
        self.recent_interval_s: dict[str, collections.deque] = {n: collections.deque(maxlen=64) for n in lanes}
        self._last_step: dict[str, float | None] = {}
        self._arrivals: collections.deque[float] = collections.deque(maxlen=ARRIVALS)
        self._prefilled: collections.deque[int] = collections.deque(maxlen=ARRIVALS)  # padded prompt a request
        self._outputs: collections.deque[int] = collections.deque(maxlen=ARRIVALS)    # output tokens a request

    # ------------------------------------------------------------------ from any thread

    def submit(self, request: ServeRequest, sink: Sink) -> None:
        """Queue a request; QueueFull when the queue holds max_queue already; ValueError for a variant
        this engine does not hold, or a request longer than its lane allows; ShuttingDown once stopped
        (no thread would ever take it)."""
        if request.variant is not None and request.variant not in self.lanes:
            raise ValueError(f"unknown variant {request.variant!r} (served: {', '.join(self.lanes)})")
        lane = self.lanes[request.variant or next(iter(self.lanes))]
        if len(request.prompt_ids) + request.max_new_tokens > lane.max_len:
            raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) + max_tokens ({request.max_new_tokens}) "
                             f"exceeds the served context of {lane.max_len} tokens")
        if not request.prompt_ids:
            raise ValueError("the prompt has no tokens")
        with self._wake:
            self._check_open()
            now = self.clock()
            late = refusal(self.oldest_wait(now), getattr(self.policy, "ttft_slo_s", None)) if self.sheds else None
            if late is not None:                     # a policy that keeps a TTFT SLO sheds load (serve/shedding.py)
                self.metrics.rejected.inc()
                raise QueueFull(RETRY_AFTER_S, late)
            self._arrivals.append(now)
            self._inbox.append(_Waiting(request, sink, now))
            self._wake.notify()

    def _check_open(self) -> None:
        """Under the lock: ShuttingDown once stopped, QueueFull when max_queue requests wait."""
        if self._stopping:
            raise ShuttingDown()
        if self.queue_length() >= self.max_queue:
            self.metrics.rejected.inc()
            raise QueueFull(self._retry_after())

    def score(self, request: ScoreRequest, sink: Callable[[PromptScores], None]) -> None:
        """Queue a prompt scoring (module doc); its PromptScores goes to `sink` from the engine thread.
        ValueError for a variant this engine does not hold or a prompt longer than its lane allows;
        QueueFull and ShuttingDown as for submit."""
        if request.variant is not None and request.variant not in self.lanes:
            raise ValueError(f"unknown variant {request.variant!r} (served: {', '.join(self.lanes)})")
        lane = self.lanes[request.variant or next(iter(self.lanes))]
        if not request.prompt_ids or len(request.prompt_ids) + request.generate > lane.max_len:
            raise ValueError(f"the prompt ({len(request.prompt_ids)} tokens) does not fit the served context of "
                             f"{lane.max_len} tokens")
        with self._wake:
            self._check_open()
            self._scores.append((request, sink))
            self._wake.notify()

    def cancel(self, request_id: str) -> None:
        """The client went away: its row is freed at the next step (no further events)."""
        with self._wake:
            self._cancel.append(request_id)
            self._wake.notify()

    def queue_length(self) -> int:
        return len(self._inbox) + len(self._waiting) + len(self._scores)

    def running(self) -> int:
        return len(self._running)

    def oldest_wait(self, now: float | None = None) -> float | None:
        """Seconds the oldest request not yet admitted has waited (None: none waits); from any thread."""
        now = self.clock() if now is None else now
        try:
            first = self._waiting[0] if self._waiting else self._inbox[0]
        except IndexError:            # emptied under us by the engine thread
            return None
        return now - first.arrived

    def start(self) -> "ServeEngine":
        self._thread = threading.Thread(target=self._loop, name="variantlab-serve-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def next_id(self) -> str:
        return f"req-{next(self._ids)}"

    # ------------------------------------------------------------------ the loop (engine thread)

    def _loop(self) -> None:
        import torch
        with torch.inference_mode():
            while True:
                with self._wake:
                    self._take_inbox()
                    if self._stopping:
                        break
                    if not self._has_work():
                        self._wake.wait(timeout=self._idle_timeout())
                        self._take_inbox()
                        if self._stopping:
                            break
                try:
                    self.iterate()
                    self.error = None     # serving again: /health is ok once a step succeeds
                except Exception as e:  # noqa: BLE001 - a kernel that raises fails the requests, not the server
                    log.exception("serving step failed")
                    self.error = f"{type(e).__name__}: {e}"
                    self._fail_all(self.error, waiting_too=False)
            self._fail_all("the server is shutting down", reason=FINISH_CANCELLED)   # the lanes' tensors need the mode

    def _take_inbox(self) -> None:
        while self._inbox:
            self._waiting.append(self._inbox.popleft())
        while self._cancel:
            self._drop(self._cancel.popleft())

    def _has_work(self) -> bool:
        return bool(self._waiting) or bool(self._scores) or any(lane.busy for lane in self.lanes.values())

    def _idle_timeout(self) -> float | None:
        deadline = self.policy.deadline(self._view()) if self._waiting else None
        return None if deadline is None else max(0.0, deadline - self.clock())

    def iterate(self) -> None:
        """One iteration: the prompt scorings queued, admit, one prefill chunk per lane, one decode step per
        lane (module doc)."""
        self._score_queued()
        budget = self._admit()
        for name, lane in self.lanes.items():
            if lane.group is not None:
                t0 = self.clock()
                if lane.prefill_chunk(budget.get(name)):
                    self._joined(name, lane.join(self._make_row))
                self.metrics.prefill_seconds.observe(self.clock() - t0)
        for name, lane in self.lanes.items():
            if lane.n_active:
                t0 = self.clock()
                stepped = lane.step()
                now = self.clock()
                self.recent_step_s[name].append(now - t0)      # the bare step: what the batch cap controls
                last = self._last_step.get(name)                # what a running row waited for this token:
                if last is not None:                            # prefill chunks and other lanes' steps included
                    self.recent_interval_s[name].append(now - last)
                self._last_step[name] = now
                self.steps[name] += 1
                self.metrics.batch_size.labels(name).set(len(stepped))
                self.metrics.steps.labels(name).inc()
                for row, tok in stepped:
                    self._emit(row.request.request_id, tok, now)
            else:
                self._last_step[name] = None
                self.metrics.batch_size.labels(name).set(0)
        self.metrics.queue_length.set(self.queue_length())
        self.metrics.running.set(len(self._running))

    def _view(self) -> LoadView:
        now = self.clock()
        lanes = {n: self._lane_view(n) for n in self.lanes}
        oldest = now - self._waiting[0].arrived if self._waiting else 0.0
        free = [w for w in self._waiting if w.request.variant is None]
        return LoadView(now, len(self._waiting), len(free), oldest, lanes, self._arrival_rate(now),
                        sum(len(w.request.prompt_ids) for w in free), _mean(self._prefilled), _mean(self._outputs))

    def _arrival_rate(self, now: float) -> float:
        """Requests/s over the last ARRIVALS submits, up to now (it decays when arrivals stop)."""
        t = self._arrivals
        return (len(t) - 1) / (now - t[0]) if len(t) > 1 and now > t[0] else 0.0

    def _admit(self) -> dict[str, int]:
        """Admit what the policy lets in; the prefill token budget it set for this iteration."""
        if not self._waiting and not any(lane.busy for lane in self.lanes.values()):
            return {}
        decision = self.policy.decide(self._view())
        if decision.switch is not None:
            self.switches.append(decision.switch)
            self.metrics.switches.labels(decision.switch["from"], decision.switch["to"]).inc()
            line = f"switch {decision.switch['from']} → {decision.switch['to']}: {decision.switch['reason']}"
            log.info(line)
            if self.on_switch is not None:
                self.on_switch(line)
        take: dict[str, list[_Waiting]] = collections.defaultdict(list)
        budget = dict(decision.admit)                 # lane → how many unpinned requests it may take
        keep: collections.deque[_Waiting] = collections.deque()
        for w in self._waiting:
            pinned = w.request.variant
            name = pinned or next((n for n, k in budget.items() if k > 0), None)
            lane = self.lanes.get(name) if name else None
            if (lane is None or lane.group is not None or
                    len(take.get(name, ())) >= lane.capacity() or (pinned is None and budget.get(name, 0) <= 0) or
                    (pinned is not None and not self.policy.admits_pinned(self._lane_view(name)))):
                keep.append(w)
                continue
            if not self._fits(take.get(name, ()), w, decision.prefill_tokens.get(name)):
                keep.append(w)               # the group is as large as one iteration's prefill budget
                continue
            take[name].append(w)
            if pinned is None:
                budget[name] -= 1
        self._waiting = keep
        now = self.clock()
        for name, items in take.items():
            self.lanes[name].start_group([w.request for w in items])
            self._prefilled.extend([max(len(w.request.prompt_ids) for w in items)] * len(items))
            for w in items:
                self._running[w.request.request_id] = _Running(w.request, w.sink, w.arrived, name)
                self.metrics.queue_wait_seconds.observe(now - w.arrived)
        return decision.prefill_tokens

    @staticmethod
    def _fits(group, w: _Waiting, tokens: int | None) -> bool:
        """Whether `w` may join a group under a prefill budget: the padded group (rows × its longest prompt)
        stays within it, so that a group is prefilled in one iteration (or, alone, in as few as it needs)
        and newcomers do not wait behind a group many iterations long."""
        if tokens is None or not group:
            return True
        width = max([len(w.request.prompt_ids)] + [len(g.request.prompt_ids) for g in group])
        return (len(group) + 1) * width <= tokens

    def _lane_view(self, name: str) -> LaneView:
        lane = self.lanes[name]
        return LaneView(name, lane.n_active, len(lane.group.requests) if lane.group else 0, lane.max_rows,
                        tuple(self.recent_step_s[name]), self.steps[name], tuple(self.recent_interval_s[name]))

    def _make_row(self, request: ServeRequest, generator, first: int) -> Row:
        lane = self.lanes[self._running[request.request_id].lane]
        rules = lane.engine.stop_rules(request)     # the bench engine's: EOS, stop strings, max_new_tokens
        return Row(request, rules, generator, 0, 0, first)

    def _joined(self, name: str, joined) -> None:
        now = self.clock()
        for row, tok in joined:
            run = self._running[row.request.request_id]
            run.row = row
            if run.cancelled:
                self._finish(run, FINISH_CANCELLED)
                continue
            self._emit(row.request.request_id, tok, now, prompt_tokens=len(row.request.prompt_ids))

    def _emit(self, request_id: str, token: int, now: float, prompt_tokens: int | None = None) -> None:
        run = self._running.get(request_id)
        if run is None:
            return
        row = run.row
        why = row.stop.finish(token)
        row.tokens.append(token)
        if run.first_at is None:
            run.first_at = now
            self.metrics.ttft_seconds.observe(now - run.arrived)
        elif run.last_at is not None:
            self.metrics.itl_seconds.observe(now - run.last_at)
        run.last_at = now
        run.tokens += 1
        self.metrics.tokens.labels(run.lane).inc()
        ev = StreamEvent(request_id, token, now, run.lane, why, prompt_tokens)
        if why is not None:
            self._finish(run, why)
        self._deliver(run, ev)

    def _finish(self, run: _Running, why: str) -> None:
        self._running.pop(run.request.request_id, None)
        if run.row is not None and run.row in self.lanes[run.lane].rows:
            self.lanes[run.lane].release(run.row)
        self.metrics.finished.labels(why).inc()
        if run.tokens:
            self._outputs.append(run.tokens)
        if run.first_at is not None and run.tokens > 1:
            self.metrics.tpot_seconds.observe((run.last_at - run.first_at) / (run.tokens - 1))
        if run.first_at is not None:
            self.metrics.e2el_seconds.observe(run.last_at - run.arrived)

    def _deliver(self, run: _Running, ev: StreamEvent) -> None:
        try:
            run.sink(ev)
        except Exception:  # noqa: BLE001 - a sink that fails is a client gone; the others go on
            log.exception("a request's sink raised; dropping the request")
            self._drop(run.request.request_id)

    def _drop(self, request_id: str) -> None:
        """Cancel a request wherever it is: waiting, being prefilled, or running."""
        for w in list(self._waiting):
            if w.request.request_id == request_id:
                self._waiting.remove(w)
                self.metrics.finished.labels(FINISH_CANCELLED).inc()
                return
        run = self._running.get(request_id)
        if run is None:
            return
        if run.row is None:   # still in its lane's prefill group: it leaves when the group joins
            run.cancelled = True
            return
        self._finish(run, FINISH_CANCELLED)

    def _score_queued(self) -> None:
        """Run the prompt scorings queued so far, each answered to its sink (a failure is its answer's error)."""
        for _ in range(len(self._scores)):
            request, sink = self._scores.popleft()
            name = request.variant or next(iter(self.lanes))
            try:
                answer = score_prompt(self.lanes[name].engine, request, name)
            except Exception as e:  # noqa: BLE001 - a scoring that fails is that request's error, not the server's
                log.exception("prompt scoring failed")
                answer = PromptScores(request.request_id, name, error=f"{type(e).__name__}: {e}")
            self._answer(sink, answer)

    @staticmethod
    def _answer(sink, answer: PromptScores) -> None:
        try:
            sink(answer)
        except Exception:  # noqa: BLE001 - a gone client must not stop the engine
            log.exception("a scoring request's sink raised")

    def _fail_all(self, message: str, reason: str = FINISH_ERROR, waiting_too: bool = True) -> None:
        """End every running request with an error event (a step raised: which request caused it is not
        known); the waiting ones too when the engine stops."""
        now = self.clock()
        for run in list(self._running.values()):
            self._finish(run, reason)
            self._deliver(run, StreamEvent(run.request.request_id, None, now, run.lane, reason, error=message))
        for lane in self.lanes.values():
            lane.clear()
        while waiting_too and self._scores:
            request, sink = self._scores.popleft()
            self._answer(sink, PromptScores(request.request_id, request.variant or "", error=message))
        while waiting_too and self._waiting:
            w = self._waiting.popleft()
            try:
                w.sink(StreamEvent(w.request.request_id, None, now, "", reason, error=message))
            except Exception:  # noqa: BLE001 - a gone client must not stop the others' ends
                log.exception("a request's sink raised while the engine stopped")

    def _retry_after(self) -> float:
        """Seconds until the queue has room, from the recent decode rate: at least 1 s (Retry-After is whole seconds)."""
        steps = [s for d in self.recent_step_s.values() for s in d]
        per_step = sum(steps) / len(steps) if steps else 0.05
        rows = max(1, sum(lane.max_rows for lane in self.lanes.values()))
        return max(1.0, self.queue_length() / rows * per_step * 16)


def _mean(values) -> float | None:
    return sum(values) / len(values) if values else None


__all__ = ["ServeEngine", "ServeRequest", "StreamEvent", "QueueFull", "ShuttingDown", "FINISH_CANCELLED",
           "FINISH_ERROR", "FINISH_LENGTH"]
