"""Executors: where a job runs. The local one starts a fresh Python process per job.

An executor takes a job (measure/wire.py) and always returns a record and its blobs — data, never
a path. A worker that crashes, is killed, outlives its timeout or writes a result that does not
validate becomes a failed record with the reason (for a crash: the last line it wrote to stderr).
The local executor keeps each job's files (job.json, result.bin, stderr.txt) in a folder of the
run for the curious; nothing downstream reads them.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Protocol

from .wire import CorruptResult, Job, Record, check_answers, decode_result, encode_job, failed, job_trackers
from .worker import PROGRESS_PREFIX

ProgressFn = Callable[[str, float], None]


class Executor(Protocol):
    def run(self, job: Job, workdir: Path, timeout_s: float,
            progress: ProgressFn | None = None) -> tuple[Record, dict[str, bytes]]:
        """Run one job; always return (record, blobs)."""


class LocalProcessExecutor:
    """`python -m variantlab.measure.worker` in a fresh process (its own process group), with a timeout."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self._running: subprocess.Popen | None = None

    def run(self, job: Job, workdir: Path, timeout_s: float,
            progress: ProgressFn | None = None) -> tuple[Record, dict[str, bytes]]:
        workdir.mkdir(parents=True, exist_ok=True)
        job_path, out_path, err_path = workdir / "job.json", workdir / "result.bin", workdir / "stderr.txt"
        out_path.unlink(missing_ok=True)
        job_path.write_bytes(encode_job(job))
        env = os.environ | {"PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error",
                            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with err_path.open("w") as err:
            proc = subprocess.Popen([self.python, "-m", "variantlab.measure.worker", str(job_path), str(out_path)],
                                    stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env,
                                    errors="replace", start_new_session=True, preexec_fn=_die_with_parent)
            self._running = proc
            reader = threading.Thread(target=_read_progress, args=(proc.stdout, progress), daemon=True)
            reader.start()
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                return failed(job, "failed", f"timed out after {timeout_s:g} s (suite field timeout_s)"), {}
            finally:
                self._end_group(proc)     # no worker, and nothing it started, outlives its job
                self._running = None
            reader.join(timeout=5)
        if out_path.is_file():
            try:
                record, blobs = decode_result(out_path.read_bytes(), job_trackers(job))
                check_answers(record, job)
                return record, blobs
            except CorruptResult as e:
                return failed(job, "failed", f"corrupt worker result: {e}"), {}
        tail = [ln for ln in err_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        return failed(job, "failed", f"worker {how}" + (f": {tail[0].strip()}" if tail else "")), {}

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
