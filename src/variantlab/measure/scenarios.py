"""Scenarios: load shapes that drive a backend and yield records.

- single-stream: one request at a time, cycling through the dataset, until both the minimum
  count and the minimum duration are reached (after unmeasured warm-up requests).
- offline: the whole dataset in batches of a given size, as one timed pass; passes repeat until
  both the minimum count and duration are reached. A pass's wall time is the single-task latency.
  A backend that cannot batch gets its requests one at a time (the pass says so in its name).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..backends.base import Backend, Clock
from .records import ScenarioPass

Progress = Callable[[float], None]


class Scenario(Protocol):
    name: str

    def run(self, backend: Backend, samples: Sequence[dict], max_new_tokens: int,
            progress: Progress | None = None) -> list[ScenarioPass]:
        ...


def _noop(_: float) -> None:
    pass


@dataclass(frozen=True)
class SingleStream:
    requests: int = 16
    min_duration_s: float = 0.0
    warmup: int = 2
    clock: Clock = time.perf_counter
    name: str = "single-stream"

    def run(self, backend, samples, max_new_tokens, progress: Progress | None = None):
        progress = progress or _noop
        for i in range(self.warmup):
            backend.generate(f"warmup-{i}", samples[i % len(samples)]["prompt"], max_new_tokens)
        records = []
        start = self.clock()
        i = 0
        while i < self.requests or self.clock() - start < self.min_duration_s:
            s = samples[i % len(samples)]
            records.append(backend.generate(str(s.get("id", i)), s["prompt"], max_new_tokens))
            i += 1
            progress(min(1.0, i / self.requests))
        return [ScenarioPass(self.name, start, self.clock(), tuple(records))]


@dataclass(frozen=True)
class Offline:
    batch_size: int = 16
    passes: int = 3
    min_duration_s: float = 0.0
    warmup: int = 1
    clock: Clock = time.perf_counter
    name: str = "offline"

    def _pass(self, backend, samples, max_new_tokens):
        start = self.clock()
        records = []
        if backend.capabilities.batching:
            for k in range(0, len(samples), self.batch_size):
                chunk = samples[k:k + self.batch_size]
                records += backend.generate_batch([str(s.get("id", k + j)) for j, s in enumerate(chunk)],
                                                  [s["prompt"] for s in chunk], max_new_tokens)
        else:
            for j, s in enumerate(samples):
                records.append(backend.generate(str(s.get("id", j)), s["prompt"], max_new_tokens))
        return ScenarioPass(self.name, start, self.clock(), tuple(records))

    def run(self, backend, samples, max_new_tokens, progress: Progress | None = None):
        progress = progress or _noop
        for w in range(self.warmup):
            chunk = samples[w * self.batch_size:(w + 1) * self.batch_size] or samples[:self.batch_size]
            if backend.capabilities.batching:
                backend.generate_batch([f"warmup-{j}" for j in range(len(chunk))],
                                       [s["prompt"] for s in chunk], max_new_tokens)
            else:
                backend.generate("warmup", chunk[0]["prompt"], max_new_tokens)
        passes = []
        start = self.clock()
        while len(passes) < self.passes or self.clock() - start < self.min_duration_s:
            passes.append(self._pass(backend, samples, max_new_tokens))
            progress(min(1.0, len(passes) / self.passes))
        return passes


def prompt_of_length(backend, samples: Sequence[dict], length: int) -> list[int]:
    """Token ids of exactly `length` tokens: the dataset's prompts, concatenated and cut."""
    ids: list[int] = []
    i = 0
    while len(ids) < length:
        ids += backend.tokenizer(samples[i % len(samples)]["prompt"] + "\n").input_ids
        i += 1
    return ids[:length]


@dataclass(frozen=True)
class LengthSweep:
    """Prefill and decode cost against prompt length: per length, `repeats` requests of exactly that
    many prompt tokens, each decoding `decode_tokens` tokens with stop tokens ignored. TTFT of a record
    is its prefill time; TPOT its per-token decode time at that context length."""

    lengths: tuple[int, ...] = (128, 512, 2048)
    decode_tokens: int = 16
    repeats: int = 3
    warmup: int = 1
    clock: Clock = time.perf_counter
    name: str = "length-sweep"

    def run(self, backend, samples, max_new_tokens, progress: Progress | None = None):
        progress = progress or _noop
        if not backend.capabilities.token_input:
            raise ValueError("this backend takes no token-id prompts; the length sweep needs exact lengths")
        longest = prompt_of_length(backend, samples, max(self.lengths))  # each shorter prompt is its start
        prompts = {n: longest[:n] for n in self.lengths}
        for w in range(self.warmup):
            backend.generate_ids(f"warmup-{w}", prompts[self.lengths[0]], 2, stop=False)
        start = self.clock()
        records = []
        total = len(self.lengths) * self.repeats
        for n in self.lengths:
            for r in range(self.repeats):
                records.append(backend.generate_ids(f"len{n}-{r}", prompts[n], self.decode_tokens, stop=False))
                progress(len(records) / total)
        return [ScenarioPass(self.name, start, self.clock(), tuple(records))]


def scenario_from_spec(spec) -> Scenario:
    """Build a scenario from its suite entry (suite.SingleStreamSpec / OfflineSpec / LengthSweepSpec)."""
    if spec.type == "single-stream":
        return SingleStream(spec.requests, spec.min_duration_s, spec.warmup)
    if spec.type == "offline":
        return Offline(spec.batch_size, spec.passes, spec.min_duration_s, spec.warmup)
    if spec.type == "length-sweep":
        return LengthSweep(tuple(spec.lengths), spec.decode_tokens, spec.repeats, spec.warmup)
    raise ValueError(f"unknown scenario type {spec.type!r}")
