"""The adaptive policy's calibration on CUDA (marked `cuda`: skipped with the reason where torch sees no CUDA device).

`step_cost` times a lane's decode steps on the host clock; each step reads its tokens to the host
(sampling.choose: one `.tolist()`), which waits for the device. Checked as the engine's token times
are (tests/backends/test_cuda_engine.py): every forward ends with a measured stretch of device sleep,
and every calibrated step time is at least the shortest of them — without the wait, a step would
time its kernel launches only, and the policy would switch on launch times.
"""
from __future__ import annotations

import pytest

from tests.backends.test_cuda_engine import SleepAfterForward, gpu_sleep_cycles
from variantlab.backends.torch_engine import TorchEngine
from variantlab.serve.calibrate import step_cost
from variantlab.serve.lane import Lane
from variantlab.variants import build as variants

pytestmark = pytest.mark.cuda

DEVICE = "cuda"
SLEEP_S = 0.03


def test_calibrated_step_times_wait_for_the_device():
    built = variants.build("builtin:tiny-structured", variants.VariantDefinition("bf16", "bf16"), DEVICE)
    engine = TorchEngine(built.model, built.tokenizer, DEVICE)
    lane = Lane("bf16", engine, max_rows=4, max_len=128)
    plain = step_cost(lane, context=32)
    with SleepAfterForward(built.model, gpu_sleep_cycles(SLEEP_S)) as sleep:
        slept = step_cost(lane, context=32)
        shortest = min(sleep.seconds())
    assert sorted(slept.seconds) == [1, 2, 4]
    assert all(s >= 0.95 * shortest for s in slept.seconds.values()), (slept.seconds, shortest)
    assert all(plain.seconds[b] < slept.seconds[b] for b in plain.seconds), (plain.seconds, slept.seconds)
