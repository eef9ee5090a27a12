"""One serving worker process: the records on its pipe to the router (serve/workers.py) and its body.

A worker sets its torch threads, builds its variants through the path build_server uses
(`assembly.build_engines` over the plan's PlannedVariant definitions, then `assembly.assemble_engine`: one
Lane per variant and the spec's policy), measures each lane's decode step at every batch size
(serve/calibrate.step_cost: the router's cost model needs it whatever the policy) and starts its
ServeEngine. The builds run side by side, the measurements one worker at a time: a worker says `Built`
and waits for `Calibrate`, so that no worker's step times carry another's start-up (two workers that
calibrated while the other built differed by more than 25% on our 2 cores). Then it relays: down the
pipe come `Submit`, `Score` (a prompt scoring, serve/scoring.py), `Cancel`, `MetricsQuery` and `Stop`; up
go `Log`, `Built` and `Ready` (or `Failed`) while it starts, then every `StreamEvent` and `PromptScores` its
engine emits (from the
engine thread, in order), a `Load` report whenever its load changes, and `MetricsReply`. Every record is
a frozen dataclass; `Ready` carries `PROTOCOL`, checked by the router at the handshake.

It dies with its parent: PR_SET_PDEATHSIG on Linux (as the bench's workers, measure/executor.py), and
it exits when its pipe closes. It ignores SIGINT and SIGTERM: a terminal's Ctrl-C reaches the whole
process group, and so does a service manager's SIGTERM (systemd signals every process of the unit),
and the parent stops its workers itself (`Stop`), after its requests in flight have had their grace
(serve/listener.py). A worker that returns runs multiprocessing's finalizers, which release the
semaphores it made (tqdm's lock, made while transformers loads weights); one killed by a signal would
leave them to the resource tracker, which warns of leaked semaphores at exit.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import VariantlabError
from .engine import FINISH_ERROR, QueueFull, ServeRequest, ShuttingDown, StreamEvent
from .scoring import PromptScores, ScoreRequest

PROTOCOL = 3              # the records below; a worker speaking another version is refused at the handshake
REPORT_S = 0.02           # a worker sends its load at most this often (and only when it changed)


# ------------------------------------------------------------------ records that cross the pipe

@dataclass(frozen=True)
class WorkerSpec:
    """What one worker holds and how it runs: its variants as the plan defines them, the calibration
    texts their recipes may need, and the serve options it builds with (device, threads, policy, lanes)."""

    index: int
    variants: tuple                       # measure.plan.PlannedVariant, in the worker's order
    calibration_texts: tuple[str, ...]
    options: Any                          # assembly.ServeOptions for this worker (workers=1, its device/threads)
    tpot_slo_s: float | None = None
    trust_remote_code: bool = False       # the suite's switch: may a checkpoint's own Python run


@dataclass(frozen=True)
class Submit:
    request: ServeRequest


@dataclass(frozen=True)
class Score:
    request: ScoreRequest


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class MetricsQuery:
    token: int


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Calibrate:
    """Go on: measure the step costs and start serving (the router lets one worker measure at a time)."""


@dataclass(frozen=True)
class Built:
    index: int


@dataclass(frozen=True)
class Log:
    line: str


@dataclass(frozen=True)
class Ready:
    protocol: int
    index: int
    pid: int
    device: str
    policy: str
    max_len: dict[str, int]               # variant → prompt + output tokens its lane allows
    costs: dict[str, dict[int, float]]    # variant → decode-step seconds by batch size (calibrate.step_cost)


@dataclass(frozen=True)
class Failed:
    index: int
    message: str
    user_error: bool                      # a VariantlabError (the user can fix it): raised as one again


@dataclass(frozen=True)
class Load:
    waiting: int
    running: int
    current: str                          # the variant an unpinned request runs on now
    rows: dict[str, int]                  # variant → rows its policy runs together now
    error: str | None = None              # the worker engine's last step failure (it failed those requests)
    oldest_wait_s: float | None = None    # how long the oldest request not yet admitted has waited (the router sheds)


@dataclass(frozen=True)
class MetricsReply:
    token: int
    text: bytes


# ------------------------------------------------------------------ the worker process

def worker_main(conn, spec: WorkerSpec, parent_pid: int) -> None:
    """The body of a worker process (module doc); everything it says goes up `conn`."""
    _die_with_parent(parent_pid)
    for sig in (signal.SIGINT, signal.SIGTERM):    # sent to the whole group: the parent stops us (module doc)
        signal.signal(sig, signal.SIG_IGN)
    send_lock = threading.Lock()

    def send(msg) -> None:
        with send_lock:
            conn.send(msg)

    def log(line: str) -> None:
        send(Log(f"worker {spec.index} ({spec.options.device}): {line}"))

    try:
        engines = _build(spec, log)
        send(Built(spec.index))
        if not isinstance(conn.recv(), Calibrate):   # Stop: the start failed elsewhere
            conn.close()
            return
        engine, costs = _assemble(spec, engines, log)
    except (EOFError, OSError):   # the parent has gone
        return
    except BaseException as e:  # noqa: BLE001 - whatever stops the build is the parent's to report
        user = isinstance(e, VariantlabError)
        send(Failed(spec.index, e.one_line() if user else f"{type(e).__name__}: {e}", user))
        conn.close()
        return
    engine.sheds = False          # the router sheds load (serve/shedding.py): a refusal here could not be a 429
    engine.start()
    send(Ready(PROTOCOL, spec.index, os.getpid(), spec.options.device, engine.policy.name,
               {n: lane.max_len for n, lane in engine.lanes.items()},
               {n: dict(c.seconds) for n, c in costs.items()}))
    done = threading.Event()
    reporter = threading.Thread(target=_report, args=(engine, send, done), name="variantlab-worker-load", daemon=True)
    reporter.start()
    sink = send   # the engine thread hands each StreamEvent straight up the pipe
    try:
        while True:
            msg = conn.recv()
            if isinstance(msg, Submit):
                try:
                    engine.submit(msg.request, sink)
                except (QueueFull, ValueError) as e:   # the router bounds and checks first: rare
                    send(StreamEvent(msg.request.request_id, None, time.perf_counter(), msg.request.variant or "",
                                     FINISH_ERROR, error=str(e)))
            elif isinstance(msg, Score):
                try:
                    engine.score(msg.request, sink)
                except (QueueFull, ShuttingDown, ValueError) as e:   # the router checks first: rare
                    send(PromptScores(msg.request.request_id, msg.request.variant or "", error=str(e)))
            elif isinstance(msg, Cancel):
                engine.cancel(msg.request_id)
            elif isinstance(msg, MetricsQuery):
                send(MetricsReply(msg.token, engine.metrics.exposition()))
            elif isinstance(msg, Stop):
                break
    except (EOFError, OSError):   # the parent has gone
        pass
    finally:
        done.set()
        engine.stop()             # its requests end "cancelled", sent up while the pipe still works
        reporter.join(1)
        try:
            conn.close()
        except OSError:
            pass


def _build(spec: WorkerSpec, log: Callable[[str], None]) -> dict:
    import torch

    from .assembly import build_engines
    if spec.options.threads:
        torch.set_num_threads(spec.options.threads)
    return build_engines(spec.variants, spec.calibration_texts, spec.options.device, log, spec.trust_remote_code)


def _assemble(spec: WorkerSpec, engines: dict, log: Callable[[str], None]):
    """The engine over the built variants, and every lane's measured step cost."""
    from .calibrate import step_cost
    from .assembly import assemble_engine
    engine, costs = assemble_engine(engines, list(spec.options.variants), spec.options, spec.tpot_slo_s, log)
    for name, lane in engine.lanes.items():   # single and static measure nothing: routing needs it all the same
        if name not in costs:
            costs[name] = step_cost(lane)
    return engine, costs


def _report(engine, send, done: threading.Event) -> None:
    """Send the engine's load whenever it changes, until `done` (or the pipe breaks)."""
    last = None
    while not done.wait(REPORT_S):
        try:
            load = Load(engine.queue_length(), engine.running(), _current(engine.policy),
                        {n: _rows(engine.policy, n, lane.max_rows) for n, lane in engine.lanes.items()}, engine.error,
                        engine.oldest_wait())
        except RuntimeError:      # a deque changed size under us: next time
            continue
        if load != last:
            try:
                send(load)
            except (OSError, ValueError):
                return
            last = load


def _current(policy) -> str:
    return getattr(policy, "current", None) or policy.variant


def _rows(policy, name: str, max_rows: int) -> int:
    """How many requests the policy runs together in this lane now."""
    from .policies import AdaptivePolicy, StaticPolicy
    if isinstance(policy, AdaptivePolicy):
        return policy.caps.get(name, max_rows)
    if isinstance(policy, StaticPolicy):
        return min(policy.batch_size, max_rows)
    return 1


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere the closed pipe ends it), as the
    bench's workers do (measure/executor.py); the parent may have died before we got here."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)
