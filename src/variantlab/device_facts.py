"""What the machine is: CPU model, cores and instruction sets; GPU name, architecture, memory and driver.

Pure functions over what the OS and the driver report (`/proc/cpuinfo` flags, CUDA compute
capability), so recorded facts of other machines test the mapping. `device_facts()` reads this
machine's; `variantlab hw` prints them beside the measured ceilings (hardware.py), and every run's
environment record carries them (environment.host_fingerprint).
"""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Instruction sets that decide which kernels run here, as (name shown, /proc/cpuinfo flags: any of).
ISA_FEATURES = (
    ("AVX2", ("avx2",)),
    ("FMA", ("fma",)),
    ("AVX-512", ("avx512f",)),
    ("AVX-512 BF16", ("avx512_bf16",)),
    ("AVX-512 FP16", ("avx512_fp16",)),
    ("VNNI", ("avx512_vnni", "avx_vnni")),
    ("AMX-BF16", ("amx_bf16",)),
    ("AMX-INT8", ("amx_int8",)),
    ("NEON", ("asimd",)),
    ("SVE", ("sve",)),
)

# CUDA compute capability (major, minor) → architecture, as NVIDIA names them.
_ARCHITECTURES = {(7, 0): "Volta", (7, 2): "Volta", (7, 5): "Turing", (8, 0): "Ampere", (8, 6): "Ampere",
                  (8, 7): "Ampere", (8, 9): "Ada Lovelace", (9, 0): "Hopper", (10, 0): "Blackwell",
                  (10, 1): "Blackwell", (10, 3): "Blackwell", (12, 0): "Blackwell", (12, 1): "Blackwell"}


def isa_features(flags: set[str] | list[str]) -> dict[str, bool]:
    """Each ISA_FEATURES name → whether the CPU flags include it."""
    have = set(flags)
    return {name: any(f in have for f in names) for name, names in ISA_FEATURES}


def architecture(major: int, minor: int) -> str:
    """The architecture of a CUDA compute capability; an unknown one says so (never raises)."""
    name = _ARCHITECTURES.get((major, minor))
    if name is None and major in {m for m, _ in _ARCHITECTURES}:
        name = next(v for (m, _), v in _ARCHITECTURES.items() if m == major)   # a new minor of a known major
    return name or f"unknown (sm_{major}{minor})"


@dataclass(frozen=True)
class GpuFacts:
    name: str
    capability: str          # "9.0"
    architecture: str        # "Hopper"
    memory_bytes: int
    driver: str | None
    cuda: str | None


@dataclass(frozen=True)
class DeviceFacts:
    cpu_model: str
    cores: int               # available to this process (cgroup quota and affinity)
    logical_cpus: int | None
    isa: dict[str, bool]
    gpus: tuple[GpuFacts, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The facts in words, one line each."""
        isa = ", ".join(name for name, on in self.isa.items() if on) or "none of " + ", ".join(self.isa)
        out = [f"CPU: {self.cpu_model}, {self.cores} cores available ({self.logical_cpus} logical)",
               f"ISA: {isa}"]
        if not self.gpus:
            out.append("GPU: none visible to torch")
        for i, g in enumerate(self.gpus):
            out.append(f"GPU {i}: {g.name}, compute capability {g.capability} ({g.architecture}), "
                       f"{g.memory_bytes / 2**30:.1f} GiB, driver {g.driver or 'unknown'}, CUDA {g.cuda or 'unknown'}")
        return out


def cpu_info(cpuinfo: str) -> tuple[str, list[str]]:
    """(model name, flags) from the text of /proc/cpuinfo (x86 'flags', Arm 'Features')."""
    model, flags = "", []
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "Hardware") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = value.split()
    return model or platform.processor() or platform.machine(), flags


def gpu_facts() -> tuple[GpuFacts, ...]:
    """Every CUDA device torch sees (none without CUDA); the driver from nvidia-smi where it runs."""
    import torch
    if not torch.cuda.is_available():
        return ()
    driver = None
    try:
        import subprocess
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0] or None
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(GpuFacts(p.name, f"{p.major}.{p.minor}", architecture(p.major, p.minor), p.total_memory,
                            driver, torch.version.cuda))
    return tuple(out)


def this_cpu() -> tuple[str, list[str]]:
    """(model name, flags) of this machine's CPU; its platform name and no flags where /proc/cpuinfo is absent."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return cpu_info(f.read())
    except OSError:
        return platform.processor() or platform.machine(), []


def available_cores(cpu_max: str | Path = "/sys/fs/cgroup/cpu.max") -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a container
    started with --cpus=2 on a 64-core machine gets 2), not every core of the machine."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def device_facts(with_gpus: bool = True) -> DeviceFacts:
    """This machine's facts. with_gpus=False needs no torch (the planning process)."""
    model, flags = this_cpu()
    return DeviceFacts(model, available_cores(), os.cpu_count(), isa_features(flags),
                       gpu_facts() if with_gpus else ())
