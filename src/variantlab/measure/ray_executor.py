"""The Ray executor: each job a Ray task, on whichever node of a cluster has room for it.

    variantlab bench SUITE --executor ray [--address auto]

A task runs the local executor on its node: the worker is still a fresh process of its own (so cold
start and peak memory are its own, and a timeout or memory limit ends it), and the task returns the
worker's result as the same bytes a local worker writes (wire.encode_result), checked by the same
decode_result when they arrive. Results reach the runner as they finish; the runner commits each to
the store at once.

Resources: a job whose variant runs on a GPU asks for `num_gpus: 1` (Ray then shows it that GPU alone,
so measurements never share one); a CPU job asks for the worker's threads as CPUs. How many run at
once is how many such jobs the cluster's nodes hold side by side (`slots`); tasks are submitted in the
plan's order and one more only when one finishes, so interleaved rounds keep their order per device
and a late task sees every result before it (the local executor's contract, executor.py).

On a cluster of several machines, every node must see the run folder and the model at the same paths
(a shared filesystem), and have variantlab installed: a job whose artifact folder is not on its node
fails with that reason. Ray is an optional extra: `pip install 'variantlab[ray]'`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Iterable

from ..errors import VariantlabError
from .executor import WORKER_MODULE, DoneFn, LocalProcessExecutor, ProgressFn, Task, as_limits, read_result
from .limits import Limits
from .wire import Job, MeasureJob, Record, decode_job, encode_job, encode_result, failed

ACCEPTED_EXECUTORS = "local | ray"
KILL_WAIT_S = 30.0   # an interrupted run waits this long at most for its killed tasks' replies (RayExecutor.kill)


def is_gpu_job(device: str, cluster_gpus: float) -> bool:
    """Whether a job on `device` takes a GPU: cuda asked for, or auto on a cluster that has GPUs."""
    return device.startswith("cuda") or (device == "auto" and cluster_gpus >= 1)


def task_resources(device: str, threads: int, cluster_gpus: float, largest_node_cpus: float) -> dict:
    """What a job's Ray task asks for: one whole GPU (and a CPU to drive it), or its threads as CPUs
    (never more than the largest node has, or it would wait forever)."""
    if is_gpu_job(device, cluster_gpus):
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": max(1, min(threads, int(largest_node_cpus) or 1))}


def slots(resources: dict, nodes: Iterable[dict]) -> int:
    """How many jobs asking for `resources` the alive nodes (ray.nodes()' "Resources") hold at once."""
    total = 0
    for node in nodes:
        fits = [int(node.get("CPU", 0) // resources["num_cpus"])]
        if resources.get("num_gpus"):
            fits.append(int(node.get("GPU", 0) // resources["num_gpus"]))
        total += max(0, min(fits))
    return max(1, total)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """ConnectionError at once when a host:port address answers nothing (Ray itself keeps retrying for
    minutes); "auto" and ray:// addresses are left to Ray."""
    import socket
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"nothing answers at {address} ({e.strerror or e})") from None


def run_on_node(job_bytes: bytes, workdir: str, limits: Limits) -> bytes:
    """The body of a Ray task: the job in a fresh worker process on this node; the result's bytes."""
    job = decode_job(job_bytes)
    if isinstance(job, MeasureJob) and job.artifact_dir and not Path(job.artifact_dir).is_dir():
        import socket
        record = failed(job, "failed", f"artifact folder {job.artifact_dir} is not on node {socket.gethostname()}: "
                                       "every node must see the run folder at the same path (a shared filesystem)")
        return encode_result(record, {})
    record, blobs = LocalProcessExecutor().run(job, Path(workdir), limits)
    return encode_result(record, blobs)


@contextlib.contextmanager
def _own_signal_handlers():
    """Keep this process's SIGTERM and SIGINT handlers across ray.init. Ray's driver installs abseil's
    failure handler for SIGTERM, which arms a 3 s alarm that aborts the process (SIGABRT, a core dump)
    when the graceful shutdown after it takes longer, as ending a run's tasks and cluster does; ours
    already ends a run as interrupted (cli.py), so put it back (main thread only, where it can be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in old.items():
            if handler is not None:
                signal.signal(s, handler)


class RayExecutor:
    """Jobs as Ray tasks on a running cluster (`address`, e.g. "auto") or on a local one started here."""

    def __init__(self, address: str | None = None, cpus: int | None = None):
        try:
            import ray
        except ImportError:
            raise VariantlabError("the ray executor needs Ray, which is not installed", field="--executor",
                                  accepted="local, or install Ray: pip install 'variantlab[ray]'") from None
        self._ray = ray
        self._owned = not ray.is_initialized()
        if self._owned:
            try:
                if address:
                    check_reachable(address)
                with _own_signal_handlers():
                    ray.init(address=address, num_cpus=None if address else cpus, include_dashboard=False,
                             log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise VariantlabError(f"cannot reach a Ray cluster at {address!r}: {str(e).splitlines()[0]}",
                                      field="--address", accepted="auto (the cluster this machine belongs to, "
                                      "started with `ray start --head`), an address host:port, or no --address "
                                      "(a local cluster)") from None
        self._remote = ray.remote(max_retries=0)(run_on_node)
        self._inflight: dict = {}

    def close(self) -> None:
        """Shut down the local cluster this executor started (a cluster it joined stays up)."""
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()

    def _placement(self, job: Job) -> tuple[dict, int]:
        """What each of the run's tasks asks for (every job of a run has the same device and threads), and how
        many such tasks the cluster's alive nodes hold at once."""
        nodes = [n["Resources"] for n in self._ray.nodes() if n.get("Alive")]
        options = task_resources(job.device, job.threads, sum(n.get("GPU", 0) for n in nodes),
                                 max((n.get("CPU", 0) for n in nodes), default=1))
        return options, slots(options, nodes)

    def run(self, job: Job, workdir: Path, limits: Limits | float,
            progress: ProgressFn | None = None) -> tuple[Record, dict[str, bytes]]:
        got: list = []
        self.run_all([Task("", job, workdir, progress)], as_limits(limits), lambda t, r, b: got.append((r, b)))
        return got[0]

    def run_all(self, tasks: Iterable[Task], limits: Limits, on_done: DoneFn,
                on_start: Callable[[Task], None] | None = None) -> None:
        ray = self._ray
        stream = iter(tasks)
        room, options = None, None
        while True:
            while room is None or len(self._inflight) < room:
                task = next(stream, None)
                if task is None:
                    break
                if options is None:
                    options, room = self._placement(task.job)
                if on_start:
                    on_start(task)
                ref = self._remote.options(**options).remote(encode_job(task.job), str(task.workdir), limits)
                self._inflight[ref] = task
            if not self._inflight:
                return
            ready, _ = ray.wait(list(self._inflight), num_returns=1)
            task = self._inflight.pop(ready[0])
            record, blobs = self._result(task, ready[0])
            on_done(task, record, blobs)

    def _result(self, task: Task, ref) -> tuple[Record, dict[str, bytes]]:
        try:
            data = self._ray.get(ref)
        except self._ray.exceptions.RayError as e:   # the task, its worker process or its node died
            first = (str(e).strip().splitlines() or [""])[0]
            return failed(task.job, "failed", f"ray task failed: {type(e).__name__}: {first}"[:500]), {}
        return read_result(task.job, data)

    def kill(self) -> None:
        """End every task in flight. On a cluster we joined, by cancelling each: its worker process dies with its
        Ray worker (the parent-death signal). On a local cluster of ours, by killing the worker processes, so that
        each task returns on its own, and waiting (bounded) for their replies: Ray aborts this process (exit 1,
        `Check failed: it != submissible_tasks_.end()`, ray-project/ray#54798's kind) when a task is cancelled or
        failed by a shutdown while its reply arrives, where an interrupted run must end with 130."""
        refs = list(self._inflight)
        self._inflight.clear()
        if self._owned:
            _kill_local_workers()
            self._ray.wait(refs, num_returns=len(refs), timeout=KILL_WAIT_S)
            return
        for ref in refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or its node is gone
                pass


def _kill_local_workers() -> None:
    """SIGKILL every measuring worker below this process (python -m variantlab.measure.worker, each in its own
    process group with whatever it started)."""
    import psutil
    for p in psutil.Process().children(recursive=True):
        try:
            if WORKER_MODULE in p.cmdline():
                os.killpg(p.pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass


def make_executor(name: str, address: str | None = None, cpus: int | None = None):
    """The executor a `--executor` name asks for; bad input for anything else."""
    if name == "local":
        if address:
            raise VariantlabError("--address is for the ray executor", field="--address",
                                  accepted="--executor ray --address auto, or no --address")
        return LocalProcessExecutor()
    if name == "ray":
        return RayExecutor(address, cpus)
    raise VariantlabError(f"unknown executor {name!r}", field="--executor", accepted=ACCEPTED_EXECUTORS)
