"""What every measuring worker process does around its job, whatever the backend: progress lines, the
process's own start on the boot clock, threads and seed, our CPU kernels, the compile warm-up, the tokenizer's
fingerprint, a failure as one line. The worker (measure/worker.py) and each backend kind's hooks (measure/backend_kinds/) use these."""
from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

PROGRESS_PREFIX = "@@variantlab-progress "


def progress(stage: str, fraction: float) -> None:
    print(PROGRESS_PREFIX + json.dumps({"stage": stage, "fraction": round(fraction, 4)}), flush=True)


def process_clock() -> float:
    """Seconds on the clock the process start time is read on: CLOCK_BOOTTIME on Linux (not moved by NTP)."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time()


def process_start_time() -> float:
    """When this process started, on `process_clock`, from the kernel's record.

    Linux: /proc/self/stat's start time, in clock ticks since boot (10 ms resolution). psutil's
    create_time adds the boot time from /proc/stat, a whole number of seconds, against time.time():
    that put up to a second into every cold start (0.4 s measured here)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if hasattr(time, "CLOCK_BOOTTIME"):
            return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    import psutil
    return psutil.Process(os.getpid()).create_time()


def failure_reason(e: BaseException) -> str:
    """One line: the exception and where it was raised (the last two frames of its traceback)."""
    from ..errors import VariantlabError
    if isinstance(e, VariantlabError):
        return e.one_line()
    frames = traceback.extract_tb(e.__traceback__)[-2:]
    where = " ← ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return f"{text} (at {where})" if where else text


def status_of(e: BaseException) -> str:
    from ..errors import UnsupportedOnHardware
    return "unsupported" if isinstance(e, UnsupportedOnHardware) else "failed"


def setup(device: str, threads: int, seed: int) -> str:
    """Quiet transformers, resolve the device, set threads and seed; return the device."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    return device


def kernels_built_here(device: str) -> float | None:
    """Load variantlab's CPU kernels now, in the import stage, for a CPU measurement; the seconds it took when
    this process had to build them (or wait for another's build): the command built them before its first
    worker, so that happens only when their cache went missing mid-run, and the cold start leaves it out."""
    if device != "cpu":
        return None
    from ..variants import kernels
    st = kernels.status(retry_failed=False)   # the command's own build failed: not again in every worker
    return st.load_s if st.built_here else None


def compile_warmup(backend, prompts) -> None:
    """`compile: true` (variants/compiled.py): one request and a batch of two run, so that inductor compiles the
    shapes the scenarios start with here, in the compile stage, never in a timed request."""
    from ..backends.base import GenerationRequest, run_requests

    prompts = list(prompts[:2]) * (2 if len(prompts) < 2 else 1)
    run_requests(backend, [GenerationRequest("compile", prompt=prompts[0], max_new_tokens=3)])
    run_requests(backend, [GenerationRequest(f"compile-{i}", prompt=p, max_new_tokens=3)
                           for i, p in enumerate(prompts[:2])])


def tokenizer_id(path: str) -> str:
    from ..models.loading import tokenizer_fingerprint
    return tokenizer_fingerprint(Path(path))
