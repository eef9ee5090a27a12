"""Executors: where a measurement runs. The local one starts a fresh Python process per variant.

A worker that crashes, is killed, or outlives its timeout becomes a failed result with its reason
(the last lines it wrote to stderr); the sweep goes on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Protocol

from .worker import PROGRESS_PREFIX, RESULT_VERSION

ProgressFn = Callable[[str, float], None]


class Executor(Protocol):
    def run(self, spec: dict, workdir: Path, timeout_s: float, progress: ProgressFn | None = None) -> dict:
        """Run one measurement; always return a result dict with 'status'."""


class LocalProcessExecutor:
    """`python -m variantlab.measure.worker` in a fresh process, with a timeout."""

    def __init__(self, python: str = sys.executable):
        self.python = python

    def run(self, spec: dict, workdir: Path, timeout_s: float, progress: ProgressFn | None = None) -> dict:
        workdir.mkdir(parents=True, exist_ok=True)
        spec_path, out_path, err_path = workdir / "spec.json", workdir / "result.json", workdir / "stderr.txt"
        out_path.unlink(missing_ok=True)
        env = os.environ | {"PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error",
                            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        spec = spec | {"spawn_time": time.time()}
        spec_path.write_text(json.dumps(spec))
        with err_path.open("w") as err:
            proc = subprocess.Popen([self.python, "-m", "variantlab.measure.worker", str(spec_path), str(out_path)],
                                    stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env)
            reader = threading.Thread(target=_read_progress, args=(proc.stdout, progress), daemon=True)
            reader.start()
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return {"version": RESULT_VERSION, "status": "failed",
                        "reason": f"timed out after {timeout_s:g} s (suite field timeout_s)"}
            reader.join(timeout=5)
        if out_path.is_file():
            try:
                return json.loads(out_path.read_text())
            except json.JSONDecodeError:
                pass
        tail = [ln for ln in err_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        why = f"worker exited with status {code}" + (f": {tail[0].strip()}" if tail else "")
        return {"version": RESULT_VERSION, "status": "failed", "reason": why}


def _read_progress(stream, progress: ProgressFn | None) -> None:
    for line in stream:
        if progress and line.startswith(PROGRESS_PREFIX):
            try:
                d = json.loads(line[len(PROGRESS_PREFIX):])
                progress(d["stage"], float(d["fraction"]))
            except (json.JSONDecodeError, KeyError, ValueError):
                pass
