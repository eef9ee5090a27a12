"""The environment fingerprint stored with every run: what machine and software measured it.

`host_fingerprint` needs no torch (the CLI process); `torch_fingerprint` is taken inside each
worker, where torch is loaded, and adds threads, device, GPU and driver.
"""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

_INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16",
                      "amx_int8", "amx_fp16", "fma", "f16c", "asimd", "sve")


_RELEVANT_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE",
                 "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "ATEN_CPU_CAPABILITY")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


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


def comparable(a: dict, b: dict) -> str | None:
    """None when two host fingerprints describe the same machine and software; else why not."""
    for key in ("cpu_model", "cpu_count", "packages"):
        if a.get(key) != b.get(key):
            return f"{key} differs: {a.get(key)} vs {b.get(key)}"
    return None
