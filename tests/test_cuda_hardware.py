"""`variantlab hw` on CUDA: facts, ceilings, kernel times and the configuration (marked `cuda`: skipped with
the reason where torch sees no CUDA device).

The ceilings are host-clock timings of device work (hardware.py), so each must wait for the device:
checked against CUDA events timing the same work. A 128 MiB copy runs tens of microseconds on a
current GPU, several times a launch, so an unsynchronised reading would come out several times too
fast; the bound is 10% faster than the events' figure (the host's figure includes the launch and the
sync, so it can only be slower). The matmul is checked at 8192², where it runs a millisecond or more.
"""
from __future__ import annotations

import pytest
import torch

from variantlab import hardware
from variantlab.device_facts import device_facts
from variantlab.hwconfig import BATCH_HEAVY, DECODE_HEAVY, machine_config, machine_inputs
from variantlab.kernel_times import QUANTIZED, measure_kernel_times

pytestmark = pytest.mark.cuda


def event_seconds(fn, repeats: int = 3) -> float:
    """The best of `repeats` device times of fn(), by CUDA events, after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def test_the_gpu_is_named_with_its_architecture():
    (gpu, *_) = device_facts().gpus
    props = torch.cuda.get_device_properties(0)
    assert gpu.name == props.name and gpu.capability == f"{props.major}.{props.minor}"
    assert gpu.architecture != "unknown" and not gpu.architecture.startswith("unknown"), gpu
    assert gpu.memory_bytes == props.total_memory and gpu.cuda == torch.version.cuda


def test_the_ceilings_wait_for_the_device():
    c = hardware.measure_ceilings("cuda:0")
    src = torch.ones(hardware.BUFFER_BYTES // 4, device="cuda:0")
    dst = torch.empty_like(src)
    copy_gbps = 2 * hardware.BUFFER_BYTES / event_seconds(lambda: dst.copy_(src)) / 1e9
    read_gbps = hardware.BUFFER_BYTES / event_seconds(src.sum) / 1e9
    assert 0 < c.copy_gbps <= 1.1 * copy_gbps, (c.copy_gbps, copy_gbps)
    assert 0 < c.read_gbps <= 1.1 * read_gbps, (c.read_gbps, read_gbps)
    assert all(v is not None and v > 0 for v in c.matmul_tflops.values()), c.matmul_tflops
    assert c.int8_tops is not None and c.int8_tops > 0


def test_the_matmul_rate_waits_for_the_device():
    n = 8192
    a = torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16)
    event_tflops = 2 * n**3 / event_seconds(lambda: a @ a) / 1e12
    rate = hardware.matmul_rate("bf16", "cuda:0", n=n)
    assert rate is not None and 0.3 * event_tflops <= rate <= 1.1 * event_tflops, (rate, event_tflops)


def test_every_quantized_kernel_is_timed_on_cuda_and_none_is_the_cpus():
    kt = measure_kernel_times(device="cuda:0", rows=(1, 64), rounds=1, parameters=2**22)
    assert not kt.failed, kt.failed
    assert set(QUANTIZED) <= set(kt.seconds)
    labels = " ".join(k for ks in kt.kernels.values() for k in ks)
    assert "for_cpu" not in labels and "AVX-512" not in labels, kt.kernels


def test_the_configuration_for_this_gpu_is_measured_not_the_fallback():
    inputs = machine_inputs("cuda:0")
    assert not inputs.notes, inputs.notes
    for workload in (DECODE_HEAVY, BATCH_HEAVY):
        config = machine_config(workload, device="cuda:0", inputs=inputs)
        assert not config.fallback, config.notes
        major = torch.cuda.get_device_properties(0).major
        assert config.choice("dtype").value == ("bf16" if major >= 8 else "fp16")
        assert config.choice("TF32").value is (major >= 8)
