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
once-per-variant trackers still have to run).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from .limits import Limits, format_bytes
from .wire import CorruptResult, Job, Record, check_answers, decode_result, encode_job, failed, job_trackers
from .worker import PROGRESS_PREFIX

ProgressFn = Callable[[str, float], None]
MEMORY_POLL_S = 0.025     # how often a worker under max_memory has its resident set read
CHILDREN_EVERY_S = 0.5    # how often its process group's members are looked up again (GroupMemory)

WORKER_MODULE = "variantlab.measure.worker"   # what a worker process runs: python -m WORKER_MODULE JOB OUT


@dataclass(frozen=True)
class Task:
    """One job of a stream: what `run_all` hands back with its record."""

    label: str                         # "fp32 · round 2/5", for the display
    job: Job
    workdir: Path
    progress: ProgressFn | None = None


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


def run_one_at_a_time(executor, tasks: Iterable[Task], limits: Limits, on_done: DoneFn,
                      on_start: Callable[[Task], None] | None = None) -> None:
    """`run_all` of an executor that runs one job at a time: each task in turn, in the stream's order."""
    for task in tasks:
        if on_start:
            on_start(task)
        record, blobs = executor.run(task.job, task.workdir, limits, task.progress)
        on_done(task, record, blobs)


def as_limits(limits: Limits | float) -> Limits:
    return limits if isinstance(limits, Limits) else Limits(float(limits))


class LocalProcessExecutor:
    """`python -m variantlab.measure.worker` in a fresh process (its own process group), with a timeout
    and, when given, a memory limit on the whole group."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self._running: subprocess.Popen | None = None

    def run_all(self, tasks: Iterable[Task], limits: Limits, on_done: DoneFn,
                on_start: Callable[[Task], None] | None = None) -> None:
        run_one_at_a_time(self, tasks, limits, on_done, on_start)

    def run(self, job: Job, workdir: Path, limits: Limits | float,
            progress: ProgressFn | None = None) -> tuple[Record, dict[str, bytes]]:
        limits = as_limits(limits)
        timeout_s = limits.timeout_s
        workdir.mkdir(parents=True, exist_ok=True)
        job_path, out_path, err_path = workdir / "job.json", workdir / "result.bin", workdir / "stderr.txt"
        out_path.unlink(missing_ok=True)
        job_path.write_bytes(encode_job(job))
        env = os.environ | {"PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error",
                            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with err_path.open("w") as err:
            proc = subprocess.Popen([self.python, "-m", WORKER_MODULE, str(job_path), str(out_path)],
                                    stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env,
                                    errors="replace", start_new_session=True, preexec_fn=_die_with_parent)
            self._running = proc
            reader = threading.Thread(target=_read_progress, args=(proc.stdout, progress), daemon=True)
            reader.start()
            try:
                code = _wait(proc, timeout_s, limits.max_memory)
            except subprocess.TimeoutExpired:
                self.kill()
                return failed(job, "failed", f"exceeded its time limit: still running after {timeout_s:g} s "
                                             "(suite field timeout_s)"), {}
            except MemoryLimitExceeded as e:
                self.kill()
                return failed(job, "failed", f"exceeded its memory limit: {e} (suite field max_memory)"), {}
            finally:
                self._end_group(proc)     # no worker, and nothing it started, outlives its job
                self._running = None
            reader.join(timeout=5)
        if out_path.is_file():
            return read_result(job, out_path.read_bytes())
        tail = [ln for ln in err_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        return failed(job, "failed", f"worker {how}" + (f": {tail[0].strip()}" if tail else "")), {}

    def close(self) -> None:
        pass

    def kill(self) -> None:
        """End the running worker and its children, if any."""
        if self._running is not None:
            self._end_group(self._running)

    @staticmethod
    def _end_group(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # its own session: the worker and whatever it started
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.kill()
        proc.wait()


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


def _read_progress(stream, progress: ProgressFn | None) -> None:
    for line in stream:
        if progress and line.startswith(PROGRESS_PREFIX):
            try:
                d = json.loads(line[len(PROGRESS_PREFIX):])
                progress(d["stage"], float(d["fraction"]))
            except Exception:  # noqa: BLE001 - a bad line or a failing display must never stop the draining
                pass
