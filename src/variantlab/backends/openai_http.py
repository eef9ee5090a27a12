"""An OpenAI-compatible HTTP endpoint as a backend: our own server, vLLM, a llama.cpp server, a hosted API.

Every request is a streamed `POST {base_url}/completions` (`stream: true`, `stream_options:
{include_usage: true}`), sent from one asyncio loop on a thread of its own with httpx2, so that a
batch (offline) or an arrival schedule (the server scenario) puts many requests in flight at once.
Timing is the client's: the send time is read just before the request goes out, each streamed chunk
that carries text is a token event stamped as it arrives, and the request ends at the last one.
Token counts come from the response's `usage` (a chunk may carry several tokens; the first token's
text may be held back by the server), so TPOT divides by usage's completion_tokens while ITL is the
gap between chunks, as vLLM's benchmark_serving does. Only what the endpoint exposes is measured: no
token-id prompts, and `encode` is a byte count, used only to tell prompt shapes apart for warm-up.

Teacher-forced scoring is top-k only (`score_topk`, capability `topk_scoring`): each text is sent once,
not streamed, in the legacy prompt-scoring form `echo: true, logprobs: K, max_tokens: 1` (the generated token
dropped; again with max_tokens 0 where 1 is refused), and `choices[0].logprobs` gives each prompt
token's text, its log-probability and the top K by token text. Token ids are not known over HTTP: the
scoring tracker matches tokens by text, and checks that the tokens spell the text (a leading special
token, "<s>", aside). An endpoint that refuses or sends no log-probabilities raises TopkUnavailable.

A request that fails (connection refused, HTTP 429 or 5xx, a broken stream, a stream that ends without a
finish_reason) is data: a RequestEnd with the error, never an exception; the scenario counts it.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from .base import (Capabilities, GenerationRequest, RequestEnd, ScoredText, TokenEvent, TopkScoredText,
                   TopkUnavailable)

MAX_STOP = 4      # the OpenAI API takes at most four stop sequences
CUT_SHORT = ("the stream ended without a finish_reason: the server cut the request short (llama-cpp-python's "
             "server interrupts a request when another arrives unless started with --interrupt_requests false)")
TOPK_DEFAULT = 20  # log-probabilities asked for per position (OpenAI took 5 at most; vLLM 20 by default)


@dataclass(frozen=True)
class Endpoint:
    base_url: str                 # ".../v1"
    model: str = "auto"           # what to send as `model`
    api_key: str | None = None
    timeout_s: float = 600.0

    @classmethod
    def from_json(cls, d: dict) -> "Endpoint":
        key = os.environ.get(d["api_key_env"]) if d.get("api_key_env") else None
        return cls(d["base_url"].rstrip("/"), d.get("model") or "auto", key, d.get("timeout_s") or 600.0)


class OpenAIBackend:
    """The Backend protocol (backends/base.py) over an OpenAI-compatible endpoint (module doc)."""

    capabilities = Capabilities(batching=True, token_timestamps=True, scoring=False, token_input=False,
                                topk_scoring=True)

    def __init__(self, endpoint: Endpoint, clock: Callable[[], float] = time.perf_counter,
                 max_connections: int = 1024):
        import httpx2
        self.endpoint, self.clock = endpoint, clock
        self.tokenizer_id = f"endpoint:{endpoint.base_url}#{endpoint.model}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="variantlab-http-client", daemon=True)
        self._thread.start()
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)

        async def make():
            return httpx2.AsyncClient(base_url=endpoint.base_url, headers=headers, limits=limits,
                                      timeout=httpx2.Timeout(endpoint.timeout_s, connect=10.0))
        self._client = asyncio.run_coroutine_threadsafe(make(), self._loop).result()

    # ------------------------------------------------------------------ text (what the endpoint does not expose)

    def encode(self, text: str) -> list[int]:
        """The prompt's UTF-8 bytes: a stand-in used only to tell prompt shapes apart (the endpoint tokenizes)."""
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        raise NotImplementedError("an endpoint's events carry their text; token ids are not known here")

    def score(self, texts: Sequence[str]) -> list[ScoredText]:
        raise NotImplementedError("full teacher-forced scoring needs the model's logits; an endpoint gives top-k "
                                  "log-probabilities at most (score_topk)")

    def score_topk(self, texts: Sequence[str], k: int = TOPK_DEFAULT) -> list[TopkScoredText]:
        """Each text's prompt log-probabilities, top `k` per position, from the endpoint (module doc), one
        request at a time; TopkUnavailable when the endpoint gives none."""
        return [asyncio.run_coroutine_threadsafe(self._score_one(t, k), self._loop).result() for t in texts]

    async def _score_one(self, text: str, k: int) -> TopkScoredText:
        refusals = []
        for max_tokens in (1, 0):     # 1 first: llama-cpp-python's server reads 0 as "no limit"
            body = {"model": self.endpoint.model, "prompt": text, "max_tokens": max_tokens, "echo": True,
                    "logprobs": k, "temperature": 0.0, "stream": False}
            try:
                resp = await self._client.post("/completions", json=body)
            except Exception as e:  # noqa: BLE001 - an endpoint that cannot be reached gives no log-probabilities
                raise TopkUnavailable(f"{type(e).__name__}: {e}") from None
            if resp.status_code == 200:
                try:
                    answer = resp.json()
                except ValueError:
                    raise TopkUnavailable(f"the endpoint's answer is not JSON: {_message(resp.text)}") from None
                return prompt_topk(text, answer, max_tokens)
            refusals.append(f"with max_tokens {max_tokens}: HTTP {resp.status_code}: {_message(resp.text)}")
        raise TopkUnavailable("the endpoint refused echo + logprobs " + "; ".join(refusals))

    # ------------------------------------------------------------------ requests

    def submit(self, index: int, request: GenerationRequest, on_event: Callable[[object], None],
               sampling: dict | None = None) -> Future:
        """Send one request now; `on_event` gets its TokenEvents and then one RequestEnd (on the client's
        loop thread)."""
        if request.prompt is None:
            raise ValueError("an endpoint takes text prompts, not token ids")
        return asyncio.run_coroutine_threadsafe(self._one(index, request, on_event, sampling or {}), self._loop)

    def stream(self, requests: Sequence[GenerationRequest]) -> Iterator[object]:
        """All requests in flight together; their events as they arrive (TokenEvents, then a RequestEnd each)."""
        import queue
        q: queue.SimpleQueue = queue.SimpleQueue()
        for i, r in enumerate(requests):
            self.submit(i, r, q.put)
        ended = 0
        while ended < len(requests):
            ev = q.get()
            ended += isinstance(ev, RequestEnd)
            yield ev

    def body(self, request: GenerationRequest, sampling: dict) -> dict:
        return {"model": self.endpoint.model, "prompt": request.prompt, "max_tokens": request.max_new_tokens,
                "temperature": 0.0, **sampling, "stop": list(request.stop[:MAX_STOP]) or None, "stream": True,
                "stream_options": {"include_usage": True}}

    async def _one(self, index: int, request: GenerationRequest, on_event, sampling: dict) -> None:
        clock = self.clock
        finish, usage, error, last = None, {}, None, None
        try:
            async with self._client.stream("POST", "/completions", json=self.body(request, sampling)) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    error = f"HTTP {resp.status_code}: {_message(text)}"
                else:
                    lines = resp.aiter_lines()
                    try:
                        async for line in lines:
                            if not line.startswith("data:"):
                                continue
                            data = line[5:].strip()
                            if data == "[DONE]":
                                break
                            chunk = json.loads(data)
                            if "error" in chunk:
                                error = f"stream error: {_message(json.dumps(chunk))}"
                                break
                            if chunk.get("usage"):
                                usage = chunk["usage"]
                            for choice in chunk.get("choices") or ():
                                piece = choice.get("text") or ""
                                if piece:
                                    last = clock()
                                    on_event(TokenEvent(index, -1, last, None, None, text=piece))
                                finish = choice.get("finish_reason") or finish
                    finally:
                        await lines.aclose()      # a stream left at [DONE] is closed now, not by the collector
        except Exception as e:  # noqa: BLE001 - a request that cannot be sent is a failed request, not a crash
            error = f"{type(e).__name__}: {e}"
        if error is None and finish is None:   # an answer cut short is not an empty answer
            error = CUT_SHORT
        on_event(RequestEnd(index, last if last is not None else clock(), finish, usage.get("prompt_tokens"),
                            usage.get("completion_tokens"), error))

    def close(self) -> None:
        async def shut():
            await self._client.aclose()
        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


def prompt_topk(text: str, body: dict, generated: int) -> TopkScoredText:
    """The prompt's scoring from a completion answered with echo and logprobs: the tokens generated after the
    prompt's (usage's completion_tokens, else `generated`) are dropped."""
    try:
        lp = body["choices"][0].get("logprobs") or {}
    except (KeyError, IndexError, TypeError, AttributeError):
        raise TopkUnavailable("the endpoint's answer has no choices") from None
    tokens, values, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
    if not tokens or values is None or tops is None:
        raise TopkUnavailable("the endpoint answered without prompt log-probabilities (choices[0].logprobs is "
                              "empty: it ignores echo or logprobs)")
    # the generated tokens close the list: usage's completion_tokens says how many (llama-cpp-python's server
    # takes max_tokens 0 as "no limit"); its prompt_tokens cannot place the cut, since a server may leave the
    # BOS it counts out of the list (llama-cpp-python's does)
    n = len(tokens) - ((body.get("usage") or {}).get("completion_tokens") or generated)
    tokens, values, tops = tokens[:n], values[:n], tops[:n]
    if len(values) != len(tokens) or len(tops) != len(tokens) or any(v is None for v in values[1:]):
        raise TopkUnavailable(f"the endpoint's prompt log-probabilities are incomplete ({len(tokens)} tokens, "
                              f"{sum(v is not None for v in values)} log-probabilities)")
    top = tuple({**(t or {}), tok: v} for tok, v, t in zip(tokens[1:], values[1:], tops[1:]))
    joined, total = "".join(tokens), len(text.encode("utf-8"))
    mismatch = None
    if joined == text:              # the first token is text: it is never predicted
        n_bytes = total - len(tokens[0].encode("utf-8"))
    elif tokens[0] + text == joined:   # a leading special token ("<s>") covers no text: every byte is predicted
        n_bytes = total
    else:
        n_bytes = total
        mismatch = (f"the endpoint's {len(tokens)} prompt tokens do not spell the text ({joined[:40]!r}… vs "
                    f"{text[:40]!r}…)")
    return TopkScoredText(tuple(tokens), tuple(float(v) for v in values[1:]), top, n_bytes, mismatch)


def _message(text: str) -> str:
    """The error message of an OpenAI-shaped body, else the text itself (one line, at most 300 chars)."""
    try:
        d = json.loads(text)
        text = d.get("error", {}).get("message") or text if isinstance(d, dict) else text
    except (json.JSONDecodeError, AttributeError):
        pass
    return " ".join(str(text).split())[:300]
