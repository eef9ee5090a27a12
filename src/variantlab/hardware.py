"""The machine's measured ceilings: what a figure is compared against.

A single-stream decode step must read every weight (and the KV cache) once per token, so its
ceiling is the rate at which this process can read memory. `read_bandwidth` measures that: a pass
over a buffer far larger than the caches (a sum, or our GEMV where it runs: the faster), with the
threads torch uses now. `copy_bandwidth` (read + write bytes of a copy ÷ time) is the figure
the analysis quotes (docs/hardware.md). Both are measured, not quoted: on a
shared machine they move with the load, so a worker measures them in the same round as its decode.

`variantlab hw` measures the ceilings once per machine (memory bandwidth, matmul rate per dtype,
int8 matmul rate: `measure_ceilings`, a few seconds) and keeps them in a cache file named by the
machine's facts, torch version, device and threads (`cached_ceilings`); `--refresh` measures again.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BUFFER_BYTES = 128 * 2**20   # far past any L3: what DRAM gives


def _best(fn, repeats: int) -> float:
    fn()                       # first touch and warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(nbytes: int = BUFFER_BYTES, repeats: int = 3) -> float:
    """GB/s this process reads memory at: the best of `repeats` passes over `nbytes`, each either a
    torch sum or, where our kernels run, our fp32 GEMV streaming the buffer as a [N, 1024] matrix
    (the way a decode step reads its weights; torch's sum read 42 GB/s here where the GEMV read 50+,
    so the sum alone would put decode above 100% of its ceiling)."""
    import torch
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    best = _best(buf.sum, repeats)
    from .variants import kernels
    if kernels.available() and buf.numel() % 1024 == 0:
        w, x = buf.view(-1, 1024), torch.ones(1, 1024)
        best = min(best, _best(lambda: kernels.fp32_mm(x, w), repeats))
    return nbytes / best / 1e9


def copy_bandwidth(nbytes: int = BUFFER_BYTES, repeats: int = 3) -> float:
    """GB/s of a copy of `nbytes`, counting read + write (docs/hardware.md's "copy bandwidth")."""
    import torch
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best(lambda: dst.copy_(src), repeats) / 1e9


# --- the machine's ceilings, measured once and cached per machine (`variantlab hw`) ----------------

MATMUL_N = 1024          # square matmuls: large enough to be compute-bound, small enough for seconds
MATMUL_DTYPES = ("fp32", "bf16", "fp16")
PROBE_N, SLOW_TFLOPS = 128, 0.01   # a dtype whose 128² probe runs under 10 GFLOP/s has no real kernel here


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def matmul_rate(dtype: str, device: str = "cpu", n: int = MATMUL_N, repeats: int = 3) -> float | None:
    """TFLOP/s of an n×n matmul in `dtype` on `device` (best of `repeats`); None where it fails or a
    small probe runs under SLOW_TFLOPS (a reference loop, not a kernel: timing it would take seconds)."""
    import torch
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    try:
        p = torch.randn(PROBE_N, PROBE_N, device=device).to(dt)

        def probe():
            p @ p
            _sync(device)
        if 2 * PROBE_N ** 3 / _best(probe, 1) / 1e12 < SLOW_TFLOPS:
            return None
        a = torch.randn(n, n, device=device).to(dt)

        def step():
            a @ a
            _sync(device)
        return 2 * n ** 3 / _best(step, repeats) / 1e12
    except (RuntimeError, TypeError):
        return None


def int8_matmul_rate(device: str = "cpu", n: int = MATMUL_N, repeats: int = 3) -> float | None:
    """TOP/s of torch._int_mm (int8 × int8 → int32) at n×n; None where it does not run."""
    import torch
    try:
        a = torch.randint(-127, 127, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-127, 127, (n, n), dtype=torch.int8, device=device).t()

        def step():
            torch._int_mm(a, b)
            _sync(device)
        return 2 * n ** 3 / _best(step, repeats) / 1e12
    except (RuntimeError, TypeError):
        return None


@dataclass(frozen=True)
class Ceilings:
    """What this machine gives, measured: the figures a run's results are compared against."""

    device: str
    threads: int
    copy_gbps: float                       # read + write bytes of a 128 MiB copy ÷ time
    read_gbps: float                       # read_bandwidth()
    matmul_tflops: dict[str, float | None]  # per dtype; None: no fast kernel here
    int8_tops: float | None
    measured_at: str                       # UTC, ISO 8601
    seconds: float                         # how long measuring took

    def to_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        mm = ", ".join(f"{d} {'—' if v is None else f'{v:.2f}'}" for d, v in self.matmul_tflops.items())
        int8 = "—" if self.int8_tops is None else f"{self.int8_tops:.2f}"
        return [f"memory ({self.device}, {self.threads} threads): copy {self.copy_gbps:.1f} GB/s (read + write), "
                f"read {self.read_gbps:.1f} GB/s",
                f"matmul {MATMUL_N}² TFLOP/s: {mm}; int8 torch._int_mm {int8} TOP/s",
                f"measured {self.measured_at} in {self.seconds:.1f} s (—: no real kernel for it here)"]


def measure_ceilings(device: str = "cpu") -> Ceilings:
    """Memory bandwidth and matmul rates on `device`, with torch's current threads: a few seconds."""
    import datetime

    import torch
    t0 = time.perf_counter()
    if device.startswith("cuda"):   # device memory: a copy on the device (untested in CI: no GPU there)
        src = torch.ones(BUFFER_BYTES // 4, device=device)
        dst = torch.empty_like(src)

        def copy():
            dst.copy_(src)
            torch.cuda.synchronize()

        def read():
            src.sum()
            torch.cuda.synchronize()
        copy_gbps = 2 * BUFFER_BYTES / _best(copy, 3) / 1e9
        read_gbps = BUFFER_BYTES / _best(read, 3) / 1e9
    else:
        copy_gbps, read_gbps = copy_bandwidth(), read_bandwidth()
    rates = {d: matmul_rate(d, device) for d in MATMUL_DTYPES}
    return Ceilings(device, torch.get_num_threads(), copy_gbps, read_gbps, rates, int8_matmul_rate(device),
                    datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    time.perf_counter() - t0)


def cache_dir() -> Path:
    """Where measured ceilings are kept: $VARIANTLAB_CACHE or ~/.cache/variantlab, then hw/."""
    root = os.environ.get("VARIANTLAB_CACHE") or Path.home() / ".cache" / "variantlab"
    return Path(root) / "hw"


def machine_key(facts: dict, device: str, threads: int, torch_version: str) -> str:
    """Names one machine and setup: the same CPU, cores, ISA, GPUs, torch, device and threads."""
    import hashlib
    import json
    text = json.dumps([facts, device, threads, torch_version], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_ceilings(device: str = "cpu", *, refresh: bool = False) -> tuple[Ceilings, bool]:
    """(ceilings, whether they came from the cache): measured once per machine key, then read back.
    A cache file that cannot be read or parsed is measured again and rewritten."""
    import torch

    from .device_facts import device_facts
    facts = device_facts().to_json()
    path = cache_dir() / f"{machine_key(facts, device, torch.get_num_threads(), torch.__version__)}.json"
    return cached_measurement(path, "ceilings", facts, lambda: measure_ceilings(device), lambda d: Ceilings(**d),
                              Ceilings.to_json, refresh=refresh)


def cached_measurement(path: Path, name: str, facts: dict, measure, from_json, to_json, *,
                       refresh: bool = False) -> tuple[object, bool]:
    """(value, whether it came from the cache file `path`): read back unless `refresh`; else (or when the file
    cannot be read or parsed) measured and written with the machine's facts, atomically. An unwritable
    cache only costs a measurement next time."""
    import json
    if not refresh and path.is_file():
        try:
            return from_json(json.loads(path.read_text())[name]), True
        except (OSError, ValueError, TypeError, KeyError):
            pass
    value = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"facts": facts, name: to_json(value)}, indent=2))
        tmp.replace(path)
    except OSError:
        pass
    return value, False
