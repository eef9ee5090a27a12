"""Choosing each row's next token: greedy, or sampled with temperature and top-p from a seeded generator.

A request's `SamplingParams` travel with it. temperature 0 is greedy (argmax, on the device, like
the bench engine); otherwise the row's logits are divided by the temperature, cut to the smallest
set of tokens whose probability reaches top_p (nucleus sampling, Holtzman et al. 2020: the token
that crosses top_p is kept, so at least one always is), renormalised and sampled with the request's
own torch.Generator. A seeded request gets the same tokens whatever else runs in its batch: its
generator draws once per token of its own and nothing else draws from it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


GREEDY_BELOW = 1e-5     # a temperature under this is greedy (vLLM's rule): logits divided by it overflow
SEED_RANGE = (-2**63, 2**63 - 1)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must fit in 64 bits, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def generator(self) -> torch.Generator | None:
        """The request's own generator (None: greedy needs none). Unseeded requests draw a seed from torch's
        global generator, so that two unseeded requests do not repeat each other."""
        if self.greedy:
            return None
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        return torch.Generator().manual_seed(seed % 2**64)   # manual_seed takes 0 … 2**64 - 1


def nucleus_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(V,) logits → (V,) float32 probabilities after temperature and top-p; the reference the tests use."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1:
        return probs
    sorted_p, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p          # mass of the tokens ranked above each
    keep = before < top_p
    keep[0] = True              # the first always: a top_p below float32's least (1e-300) would keep none, and NaN
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return kept / kept.sum()


def choose(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """(B, V) logits of the rows' last positions → each row's next token id (host ints)."""
    greedy = logits.argmax(-1).tolist()                          # one host read for the whole batch
    for b, (p, g) in enumerate(zip(params, generators)):
        if not p.greedy:
            probs = nucleus_probs(logits[b], p.temperature, p.top_p).cpu()
            greedy[b] = int(torch.multinomial(probs, 1, generator=g).item())
    return greedy
