"""length-sweep: prefill time and per-token decode time at exact prompt lengths.

Per length, `repeats` requests of exactly that many prompt tokens (the dataset's prompts
concatenated and cut), each decoding `decode_tokens` tokens with every stop rule off. A record's
TTFT is its prefill time; its TPOT the per-token decode time at that context length. Warm-up runs
each length once, short. Needs a backend that takes token-id prompts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from ...backends.base import GenerationRequest, run_requests
from ...spec_model import SpecModel
from .. import metrics as m
from ..tracker import MetricDef
from ...sizes import MAX_REQUESTS, MAX_TOKENS, MAX_WARMUP
from .common import PassOutput, Scenario, ScenarioOutput, labelled, take_turn, warm_up


class LengthSweepSpec(SpecModel):
    """Prefill time and per-token decode time at given prompt lengths (one request at a time)."""

    model_config = ConfigDict(allow_inf_nan=False)   # bounds: variantlab/sizes.py

    type: Literal["length-sweep"]
    name: str | None = Field(None, description="row label and key (default: the type)")
    lengths: list[int] = Field(default_factory=lambda: [128, 512, 2048], min_length=1, max_length=64,
                               description=f"prompt lengths in tokens, 1 to {MAX_TOKENS}")
    decode_tokens: int = Field(16, ge=2, le=MAX_TOKENS, description="tokens decoded after each prompt (stop rules "
                                                                    "off)")
    repeats: int = Field(3, ge=1, le=MAX_REQUESTS, description="requests per length (per round)")
    warmup: int = Field(1, ge=0, le=MAX_WARMUP, description="full unmeasured requests at the shortest length")

    @field_validator("lengths")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(not 1 <= n <= MAX_TOKENS for n in v):
            raise ValueError(f"every length must be 1 to {MAX_TOKENS} tokens (sizes.py: MAX_TOKENS)")
        return sorted(set(v))

    def context_lengths(self) -> list[int]:
        return list(self.lengths)


def prompt_of_length(backend, samples, length: int) -> list[int]:
    """Token ids of exactly `length` tokens: the dataset's prompts, concatenated and cut."""
    ids: list[int] = []
    i = 0
    while len(ids) < length:
        ids += backend.encode(samples[i % len(samples)]["prompt"] + "\n")
        i += 1
    return ids[:length]


@dataclass(frozen=True)
class LengthSweep(Scenario):
    kind = "length-sweep"
    role = "sweep"
    needs_local_model = True
    remote_reason = "it sends prompts of exact token lengths, as token ids, which an endpoint does not take"
    spec_model = LengthSweepSpec

    def metrics(self) -> tuple[MetricDef, ...]:
        def at(n: int, metric):
            return lambda out: metric([r for p in out.passes for r in p.records if r.tokens_in == n])
        return labelled(self.name, (d for n in self.spec.lengths for d in (
            MetricDef(f"prefill_{n}", f"Prefill @{n} tokens", "s", True, "samples", at(n, m.ttft)),
            MetricDef(f"decode_{n}", f"Decode per token @{n}", "s", True, "samples", at(n, m.tpot)))))

    def _request(self, rid: str, ids: list[int], tokens: int) -> GenerationRequest:
        return GenerationRequest(rid, prompt_ids=tuple(ids), max_new_tokens=tokens, stop_on_eos=False)

    def run(self, ctx) -> ScenarioOutput:
        backend, s = ctx.backend, self.spec
        if not backend.capabilities.token_input:
            raise ValueError("this backend takes no token-id prompts; the length sweep needs exact lengths")
        longest = prompt_of_length(backend, ctx.samples, max(s.lengths))  # each shorter prompt is its start
        prompts = {n: longest[:n] for n in s.lengths}
        ctx.turn(f"{self.name} warm-up")
        warmed = warm_up(backend, [[self._request(f"len{n}", prompts[n], s.decode_tokens)] for n in s.lengths],
                         [[self._request(f"warmup-{w}", prompts[s.lengths[0]], s.decode_tokens)]
                          for w in range(s.warmup)])
        start = self.clock()
        records = []
        paused = 0.0      # at turns, while other variants ran, and the lead-in after (measure/turns.py)
        total = len(s.lengths) * s.repeats
        for n in s.lengths:
            for r in range(s.repeats):
                request = [self._request(f"len{n}-{r}", prompts[n], s.decode_tokens)]
                paused += take_turn(ctx, f"{self.name} length {n} repeat {r + 1}", backend, request, self.clock)
                records += run_requests(backend, request)
                ctx.progress(self.name, len(records) / total)
        shapes = f"1 × {', '.join(map(str, s.lengths))} prompt tokens, {s.decode_tokens} new"
        ctx.shapes.append(f"{self.name}: {shapes}")
        timed = PassOutput(start=start, end=self.clock(), paused=paused, records=tuple(records))
        return ScenarioOutput(passes=(timed,), shapes=shapes, warmed_shapes=warmed)
