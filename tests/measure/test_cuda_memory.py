"""Peak memory on CUDA is the device's (marked `cuda`: skipped with the reason where torch sees no CUDA device).

The memory tracker reads torch's peak allocation on a GPU (docs/metrics.md: "peak allocated device memory"),
not the process's resident set. Checked around a known allocation: 1 GiB allocated and freed on the
device moves the tracker's peak by that GiB and its current reading back, while the host's resident
set hardly moves; the total is the device's memory. Then a whole measuring worker on CUDA: its
memory row says it read the device, and its peak covers the variant's weights on the device.
"""
from __future__ import annotations

import psutil
import pytest
import torch

from variantlab.measure.trackers.memory import current_bytes, read_peak

pytestmark = pytest.mark.cuda

GIB = 2**30


def test_the_peak_is_the_devices_allocation_around_a_known_allocation():
    torch.ones(1, device="cuda").fill_(2)      # the CUDA context and the fill kernel loaded: host memory they take
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before, rss_before = current_bytes("cuda"), psutil.Process().memory_info().rss
    block = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    during = current_bytes("cuda")
    del block
    torch.cuda.synchronize()
    peak, total, instrument = read_peak("cuda")
    assert during - before == GIB
    assert peak == torch.cuda.max_memory_allocated() and peak >= before + GIB
    assert current_bytes("cuda") == before
    assert total == torch.cuda.get_device_properties(0).total_memory
    assert instrument.startswith("device")
    assert psutil.Process().memory_info().rss - rss_before < GIB / 4   # the host never held it


def test_a_cuda_worker_reports_device_memory_covering_its_weights(tmp_path):
    from variantlab.measure.executor import LocalProcessExecutor
    from variantlab.measure.wire import MeasureJob, TrackerJob
    from variantlab.variants import build as variants
    built = variants.build("builtin:tiny-structured", variants.VariantDefinition("bf16", "bf16"), "cuda")
    variants.save(built, "builtin:tiny-structured", tmp_path / "bf16")
    weights = built.facts.weight_bytes
    job = MeasureJob(variant=variants.VariantDefinition("bf16", "bf16").to_json(), round=0, device="cuda",
                     artifact_dir=str(tmp_path / "bf16"), threads=1, seed=0, run_once=False,
                     samples=({"id": "0", "prompt": "order_id: A-1\nQ: What is the order id?\nA:", "answer": "A-1"},),
                     trackers=(TrackerJob(kind="memory"),))
    record, _ = LocalProcessExecutor().run(job, tmp_path / "job", 300)   # a fresh process, as bench runs it
    assert record.status == "ok", record.reason
    (out,) = record.outputs
    assert out.data["instrument"].startswith("device")
    assert weights <= out.data["peak_bytes"] < 4 * GIB          # the device's peak: weights, cache, activations
    assert out.data["baseline_bytes"] == 0                      # nothing on the device after the imports
    assert out.data["total_bytes"] == torch.cuda.get_device_properties(0).total_memory
    assert record.environment["device"] == "cuda" and record.environment["gpu"]
