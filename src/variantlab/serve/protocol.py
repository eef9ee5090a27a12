"""The OpenAI-compatible request and response bodies the server speaks, as pydantic models.

Only what the server implements is accepted with a meaning; fields a client library sends that do not
change the output (user, presence_penalty 0, …) are ignored, as vLLM does, and fields that would change
it and are not implemented (n > 1, logprobs, echo, best_of, a non-zero penalty, a content part that
is not text) are refused with 400 naming the field, never silently dropped. One exception: a completion
that is OpenAI's legacy prompt scoring, `echo: true` with `logprobs: K` (0 … 20), `max_tokens` 0 or 1 and
not streamed, is answered with the prompt's log-probabilities (`scoring_top_k`, serve/scoring.py); any other
echo is refused. A field left out takes
OpenAI's default, validated like a given one (`stop` is always a list). Text the model reads or the
output is matched against (prompt, message contents, stop) must be Unicode: JSON can escape a lone
surrogate ("\ud800"), which no tokenizer encodes, and it is refused with 400 like any bad field.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_MAX_TOKENS = 16          # OpenAI's default for completions
INT64 = (-(2**63), 2**63 - 1)    # a seed outside this cannot seed a torch.Generator
TOPK_MAX = 20                    # prompt scoring: the most log-probabilities a position may ask for (vLLM's bound)
# fields that would change the output, with the values that leave it as it is (compared by type too: True == 1)
UNSUPPORTED_EXTRA = {"echo": (False,), "best_of": (1,), "suffix": ("",), "logit_bias": ({},), "tools": ([],),
                     "functions": ([],), "response_format": ({"type": "text"},)}


class ApiError(Exception):
    """An OpenAI-shaped error: status, message, type, param, code (app.py renders it)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _unicode(text: str) -> str:
    """`text`, when it is valid Unicode (no lone surrogate); ValueError naming the first bad one else."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode text: a lone surrogate (\\u{ord(text[e.start]):04x}) at "
                         f"character {e.start}") from None
    return text


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)    # 0 only for prompt scoring (app.py refuses it else)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = Field(None, validate_default=True)
    seed: int | None = Field(None, ge=INT64[0], le=INT64[1])
    stream: bool = False
    stream_options: dict | None = None
    n: int = 1
    logprobs: Any = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [_unicode(s) for s in ([v] if isinstance(v, str) else list(v or []))]
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return stops

    def refuse_unsupported(self, scoring: bool = False) -> None:
        """ApiError 400 naming the first field that would change the output and is not implemented; `scoring`:
        a prompt-scoring request, whose echo and logprobs were checked (CompletionRequest.scoring_top_k)."""
        # logprobs 0 still asks for the sampled tokens' log-probabilities: only null and false leave it out
        asks_logprobs = not scoring and self.logprobs is not None and self.logprobs is not False
        for name, bad in (("n", self.n != 1), ("logprobs", asks_logprobs),
                          ("presence_penalty", self.presence_penalty != 0),
                          ("frequency_penalty", self.frequency_penalty != 0)):
            if bad:
                raise ApiError(400, f"{name} is not supported by this server (accepted: its default)", param=name,
                               code="unsupported_parameter")
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED_EXTRA.items():
            value = extra.get(name)
            if scoring and name == "echo":
                continue
            if value is not None and not any(type(value) is type(v) and value == v for v in neutral):
                raise ApiError(400, f"{name} is not supported by this server (accepted: {json.dumps(neutral[0])})",
                               param=name, code="unsupported_parameter")

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(_Common):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request (a list of one string is accepted)")
            v = v[0]
        return _unicode(v)


    def scoring_top_k(self) -> int | None:
        """K when this is a prompt-scoring request (`echo: true` with `logprobs`), None when `echo` is not
        true (the other refusals then apply); ApiError 400 for an echo this server does not answer."""
        if (self.model_extra or {}).get("echo") is not True:
            return None
        accepted = f"echo with logprobs 0 … {TOPK_MAX}, max_tokens 0 or 1, not streamed"
        k = self.logprobs
        if k is None or k is False:
            raise ApiError(400, f"echo without logprobs is not supported: echo is for prompt scoring (accepted: "
                                f"{accepted})", param="echo", code="unsupported_parameter")
        if type(k) is not int or not 0 <= k <= TOPK_MAX:
            raise ApiError(400, f"logprobs {json.dumps(k)} is not supported with echo (accepted: an integer 0 … "
                                f"{TOPK_MAX})", param="logprobs", code="unsupported_parameter")
        if self.max_tokens not in (0, 1):
            raise ApiError(400, f"echo with max_tokens {json.dumps(self.max_tokens)} is not supported: echo is "
                                f"for prompt scoring (accepted: {accepted})", param="max_tokens",
                           code="unsupported_parameter")
        if self.stream:
            raise ApiError(400, f"a streamed echo is not supported (accepted: {accepted})", param="stream",
                           code="unsupported_parameter")
        return k


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        if isinstance(v, list):
            for part in v:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"only text content parts are supported, not {part.get('type')!r}")
                _unicode(part["text"])
        elif v is not None:
            _unicode(v)
        return v

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p["text"] for p in self.content)
        return self.content or ""


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, finish: str | None, prompt_tokens: int, n: int) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": usage(prompt_tokens, n)}


def logprobs_body(tokens: list[str], logprobs: list[float | None], top: list[dict | None],
                  special_first: bool) -> dict:
    """OpenAI's legacy `choices[0].logprobs`: each token's text, its log-probability (None for the first
    prompt token, which nothing predicts), its top-K texts → log-probabilities, and where its text starts
    in the choice's text (`special_first`: the first token, "<s>", covers none of it)."""
    offsets, at = [], 0
    for i, tok in enumerate(tokens):
        offsets.append(at)
        at += 0 if i == 0 and special_first else len(tok)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets}


def scoring_body(rid: str, model: str, text: str, finish: str, logprobs: dict, prompt_tokens: int, n: int) -> dict:
    body = completion_body(rid, model, text, finish, prompt_tokens, n)
    body["choices"][0]["logprobs"] = logprobs
    return body


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}


def chat_body(rid: str, model: str, text: str, finish: str | None, prompt_tokens: int, n: int) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                         "logprobs": None}],
            "usage": usage(prompt_tokens, n)}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def usage_chunk(rid: str, model: str, obj: str, prompt_tokens: int, n: int) -> dict:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, n)}
