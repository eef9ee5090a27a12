"""The machine's measured ceilings (hardware.py): real measurements, so only their sanity is asserted."""
from __future__ import annotations

from variantlab.hardware import copy_bandwidth, read_bandwidth


def test_bandwidths_are_measured_and_plausible():
    read, copy = read_bandwidth(16 * 2**20, repeats=2), copy_bandwidth(16 * 2**20, repeats=2)
    assert 0.1 < read < 10_000 and 0.1 < copy < 10_000      # GB/s, whatever the machine


def test_the_ceilings_are_measured_once_per_machine_and_kept(tmp_path, monkeypatch):
    import json

    from variantlab import hardware
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path))
    calls = []
    real = hardware.measure_ceilings
    monkeypatch.setattr(hardware, "measure_ceilings", lambda device: calls.append(device) or real(device))
    first, hit = hardware.cached_ceilings("cpu")
    assert not hit and calls == ["cpu"]
    assert first.copy_gbps > 0 and first.read_gbps > 0 and first.matmul_tflops["fp32"] > 0
    assert set(first.matmul_tflops) == set(hardware.MATMUL_DTYPES)
    again, hit = hardware.cached_ceilings("cpu")
    assert hit and again == first and calls == ["cpu"]                     # read back, not measured
    (cached,) = (tmp_path / "hw").glob("*.json")
    assert json.loads(cached.read_text())["facts"]["isa"]                   # the machine it describes
    cached.write_text("{not json")                                          # a damaged cache is measured again
    _, hit = hardware.cached_ceilings("cpu")
    assert not hit and calls == ["cpu", "cpu"] and json.loads(cached.read_text())
    _, hit = hardware.cached_ceilings("cpu", refresh=True)
    assert not hit and len(calls) == 3


def test_a_dtype_without_a_real_kernel_reads_as_none_not_zero(monkeypatch):
    from variantlab import hardware
    monkeypatch.setattr(hardware, "SLOW_TFLOPS", 1e9)           # every probe counts as a reference loop
    assert hardware.matmul_rate("fp32") is None
    lines = hardware.Ceilings("cpu", 2, 1.0, 1.0, {"fp32": 0.2, "fp16": None}, None, "now", 0.1).lines()
    assert "fp16 —" in lines[1] and "int8 torch._int_mm — TOP/s" in lines[1]
