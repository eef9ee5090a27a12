"""The backend seam: something that runs requests and says when each token arrived.

A backend declares what it can do (`Capabilities`); scenarios ask instead of checking names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..measure.records import RequestRecord

Clock = Callable[[], float]


@dataclass(frozen=True)
class Capabilities:
    batching: bool = False        # generate_batch runs requests together (else one at a time)
    token_timestamps: bool = True  # token_times are real per-token arrival times
    scoring: bool = False          # score() gives teacher-forced log-probabilities
    token_input: bool = False      # generate_ids() takes a prompt as token ids (exact prompt lengths)


@dataclass(frozen=True)
class ScoredText:
    """Teacher-forced scoring of one text: log-probs of every next token (positions × vocab)."""

    logprobs: object  # numpy float32 array (T-1, V)
    targets: object   # numpy int64 array (T-1,)
    n_bytes: int      # UTF-8 bytes of the scored text (for bits per byte)


class Backend(Protocol):
    capabilities: Capabilities
    tokenizer_id: str

    def generate(self, request_id: str, prompt: str, max_new_tokens: int) -> RequestRecord:
        """One request, greedy, streaming: every token's arrival time recorded."""

    def generate_batch(self, request_ids: Sequence[str], prompts: Sequence[str],
                       max_new_tokens: int) -> list[RequestRecord]:
        """Several requests together (padded); records share the batch's send time."""

    def score(self, texts: Sequence[str]) -> list[ScoredText]:
        """Teacher-forced next-token log-probabilities over each text."""
