"""The streaming engine on CUDA (marked `cuda`: skipped with the reason where torch sees no CUDA device).

Token times are synchronised: a kernel launch returns before the kernel has run, so a clock read
after launching a step but before the step's tokens reach the host would time the launch, not the
work. The check makes every forward pass end with a known stretch of device work —
`torch.cuda._sleep`, a kernel that spins for a number of cycles, queued after the logits and before
the engine's argmax on the same stream (a forward hook, so that any host sync inside the model's own
forward comes before it) — and asks that every token's time lies at least that long after the
previous one (TTFT: after the send). The same test first shows that the check discriminates here: the
unsynchronised reading of one such step, taken before its tokens are read, is under a fifth of it.

Compiled decoding (`compile: true`, inductor on CUDA through Triton) gives eager's tokens in fp32.
"""
from __future__ import annotations

import time

import pytest
import torch

from variantlab.backends.base import GenerationRequest, run_requests
from variantlab.backends.torch_engine import TorchEngine
from variantlab.data.structured import generate_samples
from variantlab.variants import build as variants

pytestmark = pytest.mark.cuda

DEVICE = "cuda"
MODEL = "builtin:tiny-structured"
PROMPTS = [s["prompt"] for s in generate_samples(3, seed=0)]
SLEEP_S = 0.1           # device work added to every forward: far above a tiny-model step's launch time


def gpu_sleep_cycles(seconds: float) -> int:
    """Cycles of torch.cuda._sleep that keep the device busy about `seconds`, timed by CUDA events: the last of
    three timings, once the device's clock has left idle (an idle H200 ran at 345 MHz, a busy one at 1980)."""
    cycles = 20_000_000
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        cycles = max(1_000_000, int(cycles * seconds / (start.elapsed_time(end) / 1e3)))
    return cycles


class SleepAfterForward:
    """A forward hook that queues `cycles` of device sleep after each forward's own kernels and records, with
    CUDA events, how long each one ran (the device's clock can change between calls: each is measured)."""

    def __init__(self, model, cycles: int):
        self.cycles, self.events = cycles, []
        self.handle = model.register_forward_hook(self)

    def __call__(self, module, args, out) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(self.cycles)
        end.record()
        self.events.append((start, end))

    def seconds(self) -> list[float]:
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in self.events]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


@pytest.fixture(scope="module")
def fp32():
    return variants.build(MODEL, variants.VariantDefinition("fp32"), DEVICE)


def test_token_times_are_read_after_the_device_finished_the_step(fp32):
    engine = TorchEngine(fp32.model, fp32.tokenizer, DEVICE)
    ids = torch.tensor([engine.encode(PROMPTS[0])], device=DEVICE)
    with SleepAfterForward(fp32.model, gpu_sleep_cycles(SLEEP_S)) as sleep:
        # the check can tell here: read before the tokens reach the host, the clock misses the step's work
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            nxt = engine.model(input_ids=ids).logits[:, -1].argmax(-1)
        unsynchronised = time.perf_counter() - t0
        nxt.tolist()
        (slept,) = sleep.seconds()
        assert slept > 0.2 * SLEEP_S and unsynchronised < 0.2 * slept, (unsynchronised, slept)
        sleep.events.clear()
        (r,) = run_requests(engine, [GenerationRequest("r", prompt=PROMPTS[0], max_new_tokens=4, stop_on_eos=False)])
        slept = sleep.seconds()
    times = (r.send_time,) + r.token_times
    gaps = [b - a for a, b in zip(times, times[1:])]
    # token i is stamped after forward i (prefill, then one step a token) and its sleep have run
    assert len(gaps) == len(slept) == 4 and all(g >= 0.95 * s for g, s in zip(gaps, slept)), (gaps, slept)


def test_a_batch_stamps_each_step_after_the_device_finished_it(fp32):
    engine = TorchEngine(fp32.model, fp32.tokenizer, DEVICE)
    with SleepAfterForward(fp32.model, gpu_sleep_cycles(SLEEP_S)) as sleep:
        records = run_requests(engine, [GenerationRequest(f"b{i}", prompt=p, max_new_tokens=3, stop_on_eos=False)
                                        for i, p in enumerate(PROMPTS)])
        slept = sleep.seconds()
    for r in records:
        times = (r.send_time,) + r.token_times
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert len(gaps) == len(slept) == 3 and all(g >= 0.95 * s for g, s in zip(gaps, slept)), (gaps, slept)


def test_compiled_decoding_on_cuda_gives_eagers_tokens(fp32):
    reqs = [GenerationRequest(f"c{i}", prompt=p, max_new_tokens=16, stop_on_eos=False) for i, p in enumerate(PROMPTS)]
    eager = TorchEngine(fp32.model, fp32.tokenizer, DEVICE)
    compiled = TorchEngine(fp32.model, fp32.tokenizer, DEVICE, compile_step=True)
    want = [r.token_ids for r in run_requests(eager, reqs[:1])] + [r.token_ids for r in run_requests(eager, reqs)]
    got = [r.token_ids for r in run_requests(compiled, reqs[:1])] + [r.token_ids for r in run_requests(compiled, reqs)]
    assert got == want
