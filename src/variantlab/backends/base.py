"""The backend seam: a streaming engine. Requests go in, token events come out.

A backend declares what it can do (`Capabilities`); scenarios ask instead of checking names.
Every load shape (one request at a time, offline batches, the length sweep, and next the server)
goes through the one method `stream`: a batch of one is a single request. Stop rules travel on
the request (`GenerationRequest`): EOS, stop strings, max_new_tokens; a backend has no stop habits
of its own (the dataset's one-line answers are the stop string "\\n", set by the scenario).

`run_requests` is the one place that turns a stream into `RequestRecord`s: send time before the
call, each token's arrival time as the backend stamped it (after synchronising the device), the
output text cut before the first stop string.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, Protocol, Sequence

from ..measure.records import RequestRecord

Clock = Callable[[], float]

FINISH_STOP = "stop"        # EOS or a stop string
FINISH_LENGTH = "length"    # max_new_tokens reached


class NonFiniteLogits(ArithmeticError):
    """The model produced NaN or inf logits: its answers would be argmax of garbage, so the measurement fails."""


@dataclass(frozen=True)
class Capabilities:
    batching: bool = False         # stream() runs several requests together (else give it one at a time)
    token_timestamps: bool = True  # token times are real per-token arrival times
    scoring: bool = False          # score() gives teacher-forced log-probabilities
    token_input: bool = False      # a request may give its prompt as token ids (exact prompt lengths)
    topk_scoring: bool = False     # score_topk() gives each position's top-k log-probabilities by token text


@dataclass(frozen=True)
class GenerationRequest:
    """One request: a prompt (text, or token ids when the backend takes them) and its stop rules.

    Generation ends at the first of: EOS (when stop_on_eos), a token that completes one of `stop`
    in the generated text, or max_new_tokens tokens. The stopping token counts as an output token:
    it was computed and cost a forward pass."""

    request_id: str
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    max_new_tokens: int = 16
    stop_on_eos: bool = True
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.prompt_ids is None):
            raise ValueError("give exactly one of prompt and prompt_ids")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            raise TypeError(f"stop must be a tuple of strings, not the string {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))


class TokenEvent(NamedTuple):
    """One output token of request `index` (its position in the batch given to `stream`).

    `time` is the backend clock when the token was available on the host. `finish_reason` is set
    on a request's last token: FINISH_STOP or FINISH_LENGTH. A NamedTuple, as immutable and typed as a
    frozen dataclass: one is made per token, and it costs 0.27 µs to make where the dataclass cost 0.76."""

    index: int
    token_id: int                      # -1 where the backend does not know ids (an HTTP endpoint's text chunk)
    time: float
    finish_reason: str | None = None
    prompt_tokens: int | None = None   # set on each request's first token: its prompt length in tokens
    text: str | None = None            # the text this event delivered, where the backend gives text, not ids


class Collected(NamedTuple):
    """One request run to its end by a backend's `collect` (no events between tokens): its token ids, each
    one's time on the backend clock (when it was on the host), how it finished, its prompt length."""

    tokens: list[int]
    times: list[float]
    finish_reason: str | None
    prompt_tokens: int


@dataclass(frozen=True)
class RequestEnd:
    """The end of request `index` from a backend that reports it apart from its tokens (an HTTP endpoint):
    how it finished, the endpoint's usage counts, or the error that ended it (a failed request is data)."""

    index: int
    time: float
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class ScoredText:
    """Teacher-forced scoring of one text.

    logprobs: float32 (T-1, V), the log-probabilities of every next token; targets: int64 (T-1,)
    the tokens that followed; token_ids: all T token ids of the text as the backend tokenized it;
    n_bytes: the UTF-8 bytes of the text that were predicted (without a BOS token, the first
    token is never predicted and its bytes are not counted); first_nonfinite: the first position
    whose logits held NaN or inf (None when all were finite)."""

    logprobs: object
    targets: object
    token_ids: tuple[int, ...]
    n_bytes: int
    first_nonfinite: int | None = None


@dataclass(frozen=True)
class TopkScoredText:
    """Teacher-forced scoring of one text as an endpoint gives it: by token text, top-k only.

    tokens: the text's tokens as the endpoint split it (their texts, a leading special token such as "<s>"
    included where it sends one); target_logprobs: the log-probability of each token but the first, given
    those before it (T-1 values); top: at each of those positions, token text → log-probability for the
    endpoint's top-k and the token that followed; n_bytes: the UTF-8 bytes of the text predicted (as
    ScoredText); mismatch: why the tokens do not spell the text (then nothing here is position-comparable)."""

    tokens: tuple[str, ...]
    target_logprobs: tuple[float, ...]
    top: tuple[dict, ...]
    n_bytes: int
    mismatch: str | None = None


class TopkUnavailable(Exception):
    """The endpoint returned no prompt log-probabilities (it refused echo and logprobs, or sent none)."""


class Backend(Protocol):
    capabilities: Capabilities
    tokenizer_id: str     # identifies the tokenizer's files and class (cheap; see scoring for the behavioural id)
    clock: Clock

    def stream(self, requests: Sequence[GenerationRequest]) -> Iterator[TokenEvent | RequestEnd]:
        """Run the requests together (greedy) and yield each token as it is available (a backend that
        reports ends apart, an HTTP endpoint, also yields one RequestEnd per request)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of text, special tokens included as the model expects them (BOS)."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated token ids, special tokens dropped."""

    def score(self, texts: Sequence[str]) -> list[ScoredText]:
        """Teacher-forced next-token log-probabilities over each text."""


class IdScoring(Protocol):
    """A backend with `scoring` that also scores a text given as token ids, and says whose ids it takes:
    `vocabulary_source` "checkpoint" (the suite's checkpoint tokenizer's: our engine, a GGUF built from the
    checkpoint), so that it is scored on the baseline's own split (measure/reference.py), or "own" (a user's GGUF)."""

    vocabulary_source: str

    def score_ids(self, ids: Sequence[int], n_bytes: int) -> ScoredText:
        """Teacher-forced next-token log-probabilities over one text's token ids; `n_bytes` its predicted bytes."""


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """text up to (not including) the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stop:
        at = text.find(s)
        if 0 <= at < cut:
            cut = at
    return text[:cut]


@dataclass
class _Pending:
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish: str | None = None
    prompt_tokens: int | None = None
    usage_tokens: int | None = None
    error: str | None = None
    end: float | None = None


def run_requests(backend: Backend, requests: Sequence[GenerationRequest]) -> list[RequestRecord]:
    """Send `requests` together through backend.stream and record each: send time (read just before
    the call, so tokenization counts in TTFT), token arrival times, end time (its last token's
    arrival), tokens in, output text (decoded, cut before the first stop string, stripped), finish
    reason. An exception from the backend propagates: in a benchmark a kernel that raises is a failed
    measurement, not a slow request (a remote backend reports a request's error as data instead).
    Every time comes from the backend's clock, so that send and token times are on one clock. A single
    request goes through the backend's `collect` where its class has one (the same tokens and times, with
    no event per token: the measured path disturbs the step least), else through `stream`."""
    clock = backend.clock
    pending = [_Pending() for _ in requests]
    collect = getattr(type(backend), "collect", None)
    send = clock()
    if collect is not None and len(requests) == 1:   # one request, nothing yielded between its tokens
        got = collect(backend, requests[0])
        pending[0] = _Pending(got.tokens, got.times, finish=got.finish_reason, prompt_tokens=got.prompt_tokens)
        return [_record(backend, requests[0], pending[0], send)]
    for ev in backend.stream(requests):
        p = pending[ev.index]
        if isinstance(ev, RequestEnd):   # a backend that reports the end apart: usage counts, or the error
            p.finish, p.error, p.end = ev.finish_reason or p.finish, ev.error, ev.time
            p.usage_tokens, p.prompt_tokens = ev.completion_tokens, ev.prompt_tokens or p.prompt_tokens
            continue
        p.tokens.append(ev.token_id)
        p.times.append(ev.time)
        if ev.text is not None:
            p.texts.append(ev.text)
        if ev.finish_reason is not None:
            p.finish = ev.finish_reason
        if ev.prompt_tokens is not None:
            p.prompt_tokens = ev.prompt_tokens
    return [_record(backend, req, p, send) for req, p in zip(requests, pending)]


def _record(backend, req: GenerationRequest, p: _Pending, send: float) -> RequestRecord:
    raw = "".join(p.texts) if p.texts else (backend.decode(p.tokens) if p.tokens else "")
    text = cut_at_stop(raw, req.stop).strip()
    end = p.times[-1] if p.times else (p.end if p.end is not None else backend.clock())
    n_in = len(req.prompt_ids) if req.prompt_ids is not None else (p.prompt_tokens or 0)
    return RequestRecord(req.request_id, send, end, tuple(p.times), n_in, text, p.error,
                         tuple(p.tokens) if not p.texts else (), None if p.error else p.finish, p.usage_tokens)
