"""Executors: where a job runs. The local one starts a fresh Python process per job; the Ray one
(ray_executor.py) runs the same process as a Ray task on a cluster.

An executor takes a job (measure/wire.py) and always returns a record and its blobs — data, never
a path. A worker that crashes, is killed, outlives its timeout, grows past its memory limit or writes
a result that does not validate becomes a failed record with the reason (for a crash: the last line
it wrote to stderr). The local executor keeps each job's files (job.json, result.bin, stderr.txt) in
a folder of the run for the curious; nothing downstream reads them.

`run` runs one job; `run_all` runs a stream of tasks, as many at once as the executor has room for
(the local one: one), taking the next task from the iterator only when a slot is free, so that a
task made late sees every result that came before it (the runner decides then whether a variant's
once-per-variant trackers still have to run). A task whose `together` is n > 1 opens a round of n
tasks in turns (measure/turns.py): the local executor keeps their n workers resident and lets one run
at a time, turn by turn (`run_round`); the Ray one runs them as separate tasks.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from .limits import Limits, format_bytes
from .turns import GO, TURN_PREFIX
from .wire import CorruptResult, Job, Record, check_answers, decode_result, encode_job, failed, job_trackers
from .worker import PROGRESS_PREFIX

ProgressFn = Callable[[str, float], None]
MEMORY_POLL_S = 0.025     # how often a worker under max_memory has its resident set read
CHILDREN_EVERY_S = 0.5    # how often its process group's members are looked up again (GroupMemory)

WORKER_MODULE = "variantlab.measure.worker"   # what a worker process runs: python -m WORKER_MODULE JOB OUT
# A worker in turns has its OpenMP threads bound to cores (OMP_PROC_BIND=true) unless the user placed them (any of
# these set). After another 2-thread worker's request and one request of its own, a worker's next request read TTFT
# 44% above back to back unbound, 18% bound (2-core EPYC, the reference model; back to back 3.70 and 3.87 ms); the
# lead-in (scenarios/common.rewarm) takes the rest.
THREAD_PLACEMENT = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


@dataclass(frozen=True)
class Task:
    """One job of a stream: what `run_all` hands back with its record."""

    label: str                         # "fp32 · round 2/5", for the display
    job: Job
    workdir: Path
    progress: ProgressFn | None = None
    together: int = 1                  # n > 1: this task and the stream's next n - 1 are one round in turns


DoneFn = Callable[[Task, Record, dict[str, bytes]], None]


class Executor(Protocol):
    def run(self, job: Job, workdir: Path, limits: Limits | float,
            progress: ProgressFn | None = None) -> tuple[Record, dict[str, bytes]]:
        """Run one job; always return (record, blobs)."""

    def run_all(self, tasks: Iterable[Task], limits: Limits, on_done: DoneFn,
                on_start: Callable[[Task], None] | None = None) -> None:
        """Run every task (as many at once as there is room for); on_done(task, record, blobs) for each as it
        finishes, in the calling thread."""

    def kill(self) -> None:
        """End whatever is running now (an interrupted run)."""

    def close(self) -> None:
        """Release what the executor started for itself (a local Ray cluster); nothing for the local one."""


def read_result(job: Job, data: bytes) -> tuple[Record, dict[str, bytes]]:
    """A worker's result bytes as (record, blobs), validated against the job; a failed record saying why
    when they do not validate. Both executors read results through here."""
    try:
        record, blobs = decode_result(data, job_trackers(job))
        check_answers(record, job)
        return record, blobs
    except CorruptResult as e:
        return failed(job, "failed", f"corrupt worker result: {e}"), {}


def as_limits(limits: Limits | float) -> Limits:
    return limits if isinstance(limits, Limits) else Limits(float(limits))


class LocalProcessExecutor:
    """`python -m variantlab.measure.worker` in a fresh process (its own process group), with a timeout
    and, when given, a memory limit on the whole group."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self._running: list[subprocess.Popen] = []

    def run_all(self, tasks: Iterable[Task], limits: Limits, on_done: DoneFn,
                on_start: Callable[[Task], None] | None = None) -> None:
        stream = iter(tasks)
        for task in stream:
            if task.together > 1:
                self.run_round([task, *itertools.islice(stream, task.together - 1)], limits, on_done, on_start)
                continue
            if on_start:
                on_start(task)
            record, blobs = self.run(task.job, task.workdir, limits, task.progress)
            on_done(task, record, blobs)

    def run(self, job: Job, workdir: Path, limits: Limits | float,
            progress: ProgressFn | None = None) -> tuple[Record, dict[str, bytes]]:
        limits = as_limits(limits)
        timeout_s = limits.timeout_s
        w = self._spawn(Task("", job, workdir, progress))
        try:
            code = _wait(w.proc, timeout_s, limits.max_memory)
        except subprocess.TimeoutExpired:
            return failed(job, "failed", f"exceeded its time limit: still running after {timeout_s:g} s "
                                         "(suite field timeout_s)"), {}
        except MemoryLimitExceeded as e:
            return failed(job, "failed", f"exceeded its memory limit: {e} (suite field max_memory)"), {}
        finally:
            self._retire(w)     # no worker, and nothing it started, outlives its job
        return w.result(code)

    def run_round(self, tasks: list[Task], limits: Limits, on_done: DoneFn,
                  on_start: Callable[[Task], None] | None = None) -> None:
        """One round in turns (measure/turns.py): each task's worker started in the given order, each run alone
        up to its first turn, then the machine handed to each waiting worker in that order, one turn at a time,
        until every worker has ended. Exactly one worker runs at any time. A job's time limit counts the time it
        ran, not its waits; one that passes it, or its memory limit, or crashes, is recorded as failed and the
        round goes on without it. Each job's folder keeps turns.txt: the round's turn count, the turn, and the
        seconds the worker had run when it reached it."""
        workers: list[_Worker] = []
        count = itertools.count(1)
        try:
            for task in tasks:
                if on_start:
                    on_start(task)
                w = self._spawn(task, turns=True)
                workers.append(w)
                self._advance(w, limits, on_done, count)
            while waiting := [w for w in workers if w.waits_at is not None]:
                for w in waiting:
                    w.go()
                    self._advance(w, limits, on_done, count)
        finally:
            for w in workers:
                self._retire(w)

    def _spawn(self, task: Task, turns: bool = False) -> "_Worker":
        workdir = task.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        job_path, out_path, err_path = workdir / "job.json", workdir / "result.bin", workdir / "stderr.txt"
        out_path.unlink(missing_ok=True)
        job = task.job.model_copy(update={"turns": True}) if turns else task.job
        job_path.write_bytes(encode_job(job))
        env = os.environ | {"PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error",
                            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if turns and not any(k in env for k in THREAD_PLACEMENT):
            env["OMP_PROC_BIND"] = "true"
        with err_path.open("w") as err:
            proc = subprocess.Popen([self.python, "-m", WORKER_MODULE, str(job_path), str(out_path)],
                                    stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.PIPE if turns else subprocess.DEVNULL, text=True, env=env,
                                    errors="replace", start_new_session=True, preexec_fn=_die_with_parent)
        self._running.append(proc)
        said: queue.Queue | None = queue.Queue() if turns else None
        reader = threading.Thread(target=_read_progress, args=(proc.stdout, task.progress, said), daemon=True)
        reader.start()
        if turns:
            (workdir / "turns.txt").write_text("")
        return _Worker(task, proc, reader, said, out_path, err_path)

    def _advance(self, w: "_Worker", limits: Limits, on_done: DoneFn, count) -> None:
        """Let worker `w` run to its next turn (it then waits there) or to its end (its record handed to
        on_done), within what is left of its time limit."""
        job, left = w.task.job, limits.timeout_s - w.ran_s
        t0 = time.monotonic()
        try:
            tag = w.next_turn(left, limits.max_memory)
            if tag is None:      # its stdout closed: it is ending
                code = _exited(w.proc, max(left - (time.monotonic() - t0), 1.0))
        except subprocess.TimeoutExpired:
            w.end((failed(job, "failed", f"exceeded its time limit: still running after {limits.timeout_s:g} s of "
                                         "its own turns (suite field timeout_s)"), {}), on_done, self)
            return
        except MemoryLimitExceeded as e:
            w.end((failed(job, "failed", f"exceeded its memory limit: {e} (suite field max_memory)"), {}),
                  on_done, self)
            return
        finally:
            w.ran_s += time.monotonic() - t0
        if tag is not None:
            w.waits_at = tag
            with (w.task.workdir / "turns.txt").open("a") as f:
                f.write(f"{next(count)}\t{tag}\t{w.ran_s:.3f}\n")
            return
        w.end(w.result(code), on_done, self)

    def _retire(self, w: "_Worker") -> None:
        if w.proc in self._running:
            self._end_group(w.proc)
            self._running.remove(w.proc)
            w.reader.join(timeout=5)

    def close(self) -> None:
        pass

    def kill(self) -> None:
        """End the running workers (a round in turns keeps several) and their children, if any."""
        for proc in list(self._running):
            self._end_group(proc)

    @staticmethod
    def _end_group(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # its own session: the worker and whatever it started
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.kill()
        proc.wait()


@dataclass
class _Worker:
    """A worker process of the local executor, and where it is in its round."""

    task: Task
    proc: subprocess.Popen
    reader: threading.Thread
    said: queue.Queue | None          # the turns it reaches, in order; None once its stdout closes
    out_path: Path
    err_path: Path
    ran_s: float = 0.0                # the time it has run (a round in turns: its turns only)
    waits_at: str | None = None       # the turn it waits at now
    memory: "GroupMemory | None" = field(default=None, repr=False)

    def go(self) -> None:
        """Let it run on from the turn it waits at."""
        self.waits_at = None
        try:
            self.proc.stdin.write(GO)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):   # it ended meanwhile: its end is read next
            pass

    def next_turn(self, timeout_s: float, max_memory: int | None) -> str | None:
        """The next turn it reaches (None: its stdout closed, it is ending); TimeoutExpired past timeout_s,
        MemoryLimitExceeded when its group holds more than max_memory (sampled every MEMORY_POLL_S)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if max_memory is not None:
                self.memory = self.memory or GroupMemory(self.proc.pid)
                if (rss := self.memory.rss()) > max_memory:
                    raise MemoryLimitExceeded(f"resident memory reached {format_bytes(rss)}, over max_memory "
                                              f"{format_bytes(max_memory)}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.proc.args, timeout_s)
            try:
                return self.said.get(timeout=left if max_memory is None else min(MEMORY_POLL_S, left))
            except queue.Empty:
                continue

    def result(self, code: int) -> tuple[Record, dict[str, bytes]]:
        """Its record: the result it wrote, or why there is none (its exit, and the last line of its stderr)."""
        job = self.task.job
        if self.out_path.is_file():
            return read_result(job, self.out_path.read_bytes())
        tail = [ln for ln in self.err_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        return failed(job, "failed", f"worker {how}" + (f": {tail[0].strip()}" if tail else "")), {}

    def end(self, outcome: tuple[Record, dict[str, bytes]], on_done: DoneFn, executor) -> None:
        self.waits_at = None
        executor._retire(self)
        on_done(self.task, *outcome)


class MemoryLimitExceeded(Exception):
    """The worker's process group held more resident memory than its limit."""


class GroupMemory:
    """The resident set of a worker's process group, read cheaply enough to sample it every MEMORY_POLL_S beside a
    measurement. Finding a process's descendants scans every process of the machine (psutil's children(): 1.1 to
    1.8 ms of CPU here), which 40 times a second took 4-7% of a core from the 2-core machine being measured; so the
    descendants are looked up every CHILDREN_EVERY_S, and each sample reads only the known processes' own
    resident sets (/proc/PID/statm). A process started in between counts from the next look-up."""

    def __init__(self, pid: int):
        import psutil
        self.psutil = psutil    # imported once, not at each sample
        try:
            self.root = psutil.Process(pid)
        except psutil.Error:
            self.root = None
        self.procs: list = []
        self.found_at = float("-inf")

    def rss(self) -> int:
        psutil = self.psutil
        if self.root is None:
            return 0
        now = time.monotonic()
        if now - self.found_at >= CHILDREN_EVERY_S:
            self.found_at = now
            try:
                self.procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return 0
        total = 0
        for p in self.procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total


def _wait(proc: subprocess.Popen, timeout_s: float, max_memory: int | None) -> int:
    """The worker's exit code; TimeoutExpired past timeout_s,
    MemoryLimitExceeded when its group's resident set passes max_memory (sampled every MEMORY_POLL_S).
    Without a memory limit this process sleeps until the worker ends (`_exited`): no periodic wake-ups beside
    the measurement."""
    if max_memory is None:
        return _exited(proc, timeout_s)
    group = GroupMemory(proc.pid)
    deadline = time.monotonic() + timeout_s
    while True:
        rss = group.rss()
        if rss > max_memory:
            raise MemoryLimitExceeded(f"resident memory reached {format_bytes(rss)}, over max_memory "
                                      f"{format_bytes(max_memory)}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            return proc.wait(timeout=min(MEMORY_POLL_S, left))
        except subprocess.TimeoutExpired:
            continue


def _exited(proc: subprocess.Popen, timeout_s: float) -> int:
    """proc's exit code, waited for by a thread blocked in waitpid; TimeoutExpired past timeout_s. (Popen.wait with
    a timeout polls: it wakes up to 20 times a second, each time on a core the worker's threads are measuring on.)"""
    waiter = threading.Thread(target=proc.wait, name="variantlab-worker-wait", daemon=True)
    waiter.start()
    waiter.join(timeout_s)
    if waiter.is_alive():
        raise subprocess.TimeoutExpired(proc.args, timeout_s)
    return proc.returncode


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it when the parent dies, so that a runner killed
    with SIGKILL (or by the OOM killer) leaves no worker behind. Elsewhere a no-op."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _read_progress(stream, progress: ProgressFn | None, said: queue.Queue | None = None) -> None:
    """Drain a worker's stdout: progress lines to `progress`, turns (measure/turns.py) to `said`, and None to
    `said` when the stream ends."""
    try:
        _drain(stream, progress, said)
    finally:
        if said is not None:
            said.put(None)


def _drain(stream, progress: ProgressFn | None, said: queue.Queue | None) -> None:
    for line in stream:
        if said is not None and line.startswith(TURN_PREFIX):
            said.put(line[len(TURN_PREFIX):].strip())
        elif progress and line.startswith(PROGRESS_PREFIX):
            try:
                d = json.loads(line[len(PROGRESS_PREFIX):])
                progress(d["stage"], float(d["fraction"]))
            except Exception:  # noqa: BLE001 - a bad line or a failing display must never stop the draining
                pass
