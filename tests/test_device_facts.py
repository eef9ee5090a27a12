"""Device facts (device_facts.py) from recorded /proc/cpuinfo lines and CUDA capabilities of several machines."""
from __future__ import annotations

import pytest

import os
import subprocess
import sys

import variantlab.device_facts as device_facts_module
from variantlab.device_facts import (DeviceFacts, GpuFacts, architecture, available_cores, cpu_info, device_facts,
                                    isa_features)

EPYC = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 avx512_vnni avx512_vbmi
"""
SAPPHIRE_RAPIDS = """model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: avx avx2 fma avx512f avx512_bf16 avx512_vnni avx512_fp16 amx_bf16 amx_int8 amx_tile
"""
HASWELL = """model name\t: Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz
flags\t\t: fpu sse sse2 avx avx2 fma f16c
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve svebf16 i8mm bf16
"""


@pytest.mark.parametrize("text,model,on", [
    (EPYC, "AMD EPYC 9B14", {"AVX2", "FMA", "AVX-512", "AVX-512 BF16", "VNNI"}),
    (SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
     {"AVX2", "FMA", "AVX-512", "AVX-512 BF16", "AVX-512 FP16", "VNNI", "AMX-BF16", "AMX-INT8"}),
    (HASWELL, "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", {"AVX2", "FMA"}),
    (GRAVITON, None, {"NEON", "SVE"}),
])
def test_the_instruction_sets_of_recorded_machines(text, model, on):
    name, flags = cpu_info(text)
    if model is not None:
        assert name == model
    isa = isa_features(flags)
    assert {k for k, v in isa.items() if v} == on


@pytest.mark.parametrize("capability,arch", [((8, 0), "Ampere"), ((8, 6), "Ampere"), ((8, 9), "Ada Lovelace"),
                                             ((9, 0), "Hopper"), ((10, 0), "Blackwell"), ((12, 0), "Blackwell"),
                                             ((9, 5), "Hopper"), ((7, 5), "Turing"), ((13, 0), "unknown (sm_130)")])
def test_compute_capability_names_its_architecture(capability, arch):
    assert architecture(*capability) == arch


def test_the_facts_read_as_lines_without_a_gpu_and_with_one():
    isa = isa_features(cpu_info(SAPPHIRE_RAPIDS)[1])
    plain = DeviceFacts("Xeon", 8, 16, isa)
    assert plain.lines()[2] == "GPU: none visible to torch" and "AMX-INT8" in plain.lines()[1]
    h200 = GpuFacts("NVIDIA H200", "9.0", architecture(9, 0), 141 * 2**30, "570.86", "12.8")
    text = DeviceFacts("Xeon", 8, 16, isa, (h200,)).lines()[2]
    assert text == "GPU 0: NVIDIA H200, compute capability 9.0 (Hopper), 141.0 GiB, driver 570.86, CUDA 12.8"


def test_this_machine_gives_its_facts():
    facts = device_facts()
    assert facts.cores >= 1 and facts.cpu_model and set(facts.isa) >= {"AVX2", "VNNI", "AMX-BF16", "NEON"}
    assert facts.to_json()["isa"] == facts.isa


# ---------------------------------------------------------------- the cores this process may use

def test_available_cores_follows_the_affinity_mask():
    one = sorted(os.sched_getaffinity(0))[0]
    code = ("import os; os.sched_setaffinity(0, {%d}); "
            "from variantlab.device_facts import available_cores; print(available_cores())" % one)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    assert available_cores() == len(os.sched_getaffinity(0))


def test_available_cores_without_affinity_falls_back_to_the_cpu_count(monkeypatch):
    monkeypatch.delattr(device_facts_module.os, "sched_getaffinity")
    monkeypatch.setattr(device_facts_module.os, "cpu_count", lambda: 3)
    assert available_cores() == 3
    monkeypatch.setattr(device_facts_module.os, "cpu_count", lambda: None)
    assert available_cores() == 1


def test_available_cores_honours_a_cgroup_cpu_quota(tmp_path):
    affinity = available_cores(tmp_path / "missing")
    (tmp_path / "cpu.max").write_text("100000 100000\n")     # one CPU's worth of quota
    assert available_cores(tmp_path / "cpu.max") == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(tmp_path / "cpu.max") == affinity
