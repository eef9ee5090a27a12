"""The environment fingerprint stored with every run: what machine and software measured it.

`host_fingerprint` needs no torch (the CLI process); `torch_fingerprint` is taken inside each
worker, where torch is loaded, and adds threads, device, GPU and driver. A run row carries the first as
a `HostEnvironment`, each record the second as a `WorkerEnvironment` (typed payloads, payloads.py).
`key_fingerprint` is what two runs must share to be compared (`variantlab compare`), `other_differences`
the rest, in words.
"""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any, Sequence

from .payloads import OpenPayload

_INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16",
                      "amx_int8", "amx_fp16", "fma", "f16c", "asimd", "sve")


_RELEVANT_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE",
                 "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "ATEN_CPU_CAPABILITY")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


class HostEnvironment(OpenPayload):
    """The machine and software of a run (its row in the store): host_fingerprint and the run's settings."""

    cpu_model: str | None = None
    cpu_flags: tuple[str, ...] = ()
    isa: dict[str, Any] = {}
    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    os: str | None = None
    python: str | None = None
    packages: dict[str, str | None] = {}
    env: dict[str, str] = {}
    threads_per_worker: int | None = None     # the run's settings, added by the runner
    rounds: int | None = None


class WorkerEnvironment(OpenPayload):
    """Where one record was measured or built (torch_fingerprint, taken in its worker)."""

    torch: str | None = None
    threads: int | None = None
    interop_threads: int | None = None
    device: str | None = None
    seed: int | None = None
    cuda_available: bool | None = None
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    cuda: str | None = None
    capability: str | None = None
    architecture: str | None = None
    driver: str | None = None


def host_fingerprint() -> dict:
    import psutil

    from .device_facts import isa_features, this_cpu
    cpu_model, all_flags = this_cpu()
    flags = [fl for fl in _INTERESTING_FLAGS if fl in set(all_flags)]
    return {
        "cpu_model": cpu_model,
        "cpu_flags": flags,
        "isa": isa_features(all_flags),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "packages": {p: _version(p) for p in ("variantlab", "torch", "transformers", "numpy", "safetensors")},
        "env": {k: os.environ[k] for k in _RELEVANT_ENV if k in os.environ},
    }


def torch_fingerprint(device: str, seed: int) -> dict:
    import torch
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "device": device, "seed": seed,
            "cuda_available": torch.cuda.is_available()}
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        from .device_facts import architecture
        info |= {"gpu": props.name, "gpu_memory_bytes": props.total_memory,
                 "cuda": torch.version.cuda, "capability": f"{props.major}.{props.minor}",
                 "architecture": architecture(props.major, props.minor)}
        try:
            import subprocess
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    return info


# ------------------------------------------------------------------ comparing two runs' environments

KEY_FIELDS = ("CPU model", "GPU", "device", "torch (major)", "transformers (major)", "Python (major.minor)",
              "torch threads")
"""The fields two runs must share to be compared (variantlab compare); the rest only warn."""


def _release(version: str | None, parts: int) -> str | None:
    return None if not version else ".".join(str(version).split("+")[0].split(".")[:parts])


def key_fingerprint(run_env: dict, measured: Sequence[dict]) -> dict[str, str | None]:
    """KEY_FIELDS → value (None: not recorded) of a run: `run_env` is its host fingerprint, `measured` the
    environment of each of its good measurements (the worker's torch_fingerprint). Several values (two
    devices in one run) read joined: "cpu, cuda"."""
    def joined(key: str) -> str | None:
        return ", ".join(sorted({str(e[key]) for e in measured if e.get(key) is not None})) or None
    packages = run_env.get("packages") or {}
    per_worker = run_env.get("threads_per_worker")
    return {"CPU model": run_env.get("cpu_model"),
            "GPU": joined("gpu") or ("none" if measured else None),
            "device": joined("device"),
            "torch (major)": _release(packages.get("torch"), 1),
            "transformers (major)": _release(packages.get("transformers"), 1),
            "Python (major.minor)": _release(run_env.get("python"), 2),
            "torch threads": joined("threads") or (None if per_worker is None else str(per_worker))}


def other_differences(run_env_a: dict, run_env_b: dict, measured_a: Sequence[dict],
                      measured_b: Sequence[dict]) -> list[str]:
    """What else differs between two runs' environments ("packages.torch: 2.13.0 vs 2.13.1"): full
    versions, core count, memory, flags, environment variables, driver; worth saying, not refusing."""
    def flat(env: dict, measured: Sequence[dict]) -> dict[str, object]:
        out = {}
        for k, v in env.items():
            if k in ("rounds", "threads_per_worker", "cpu_model"):
                continue
            out |= {f"{k}.{k2}": v2 for k2, v2 in v.items()} if isinstance(v, dict) else {k: v}
        for k in ("interop_threads", "cuda", "driver", "capability"):
            vals = sorted({str(e[k]) for e in measured if e.get(k) is not None})
            if vals:
                out[k] = ", ".join(vals)
        return out
    a, b = flat(run_env_a, measured_a), flat(run_env_b, measured_b)
    return [f"{k}: {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
