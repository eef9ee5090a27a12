"""The OpenAI-compatible HTTP API over a serving engine (FastAPI + uvicorn).

Routes: POST /v1/completions and /v1/chat/completions (streamed over SSE or not), GET /v1/models
(one entry per served variant; a request's `model` may name one, else the policy picks), GET /health,
GET /metrics (Prometheus). Each route is thin: parse and bound the body, hand a ServeRequest to the
engine, relay its events. Errors are OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`,
from one place (`ApiError` → `_error`): a malformed body or a bad field 400, a missing or wrong bearer
key 401 (only with `api_key`), an unknown model 404, a body not all there within `body_timeout_s` 408,
one over `max_body_bytes` 413 (serve/body.py reads and validates bodies), a full queue 429 with
Retry-After, an engine that failed 500, a server shutting down 503 (`shutting_down`, Connection:
close); an unknown route or method is OpenAI-shaped too. Fields are
validated strictly, as OpenAI does: "0.5" is not a number, "yes" not a boolean. A client that
disconnects is cancelled however its response ends: its row is freed at the engine's next step. The
requests handed to the engine and not yet answered are counted (serve/admission.py, `app.state.admission`):
/health reports them as `in_flight`, and the listener drains them on shutdown (serve/listener.py).

Prompt scoring: a completion with `echo: true`, `logprobs: K` (0 … 20) and `max_tokens` 0 or 1, not streamed
(OpenAI's legacy form, what lm-eval-harness and our own endpoint backend send), is answered with the prompt
echoed and `choices[0].logprobs` for its tokens: each token's text (backends/token_texts.py: decoded alone,
"<s>" spelled out), its log-probability given those before it (null for the first), its top K by text (ids
that read alike merged, their probabilities summed) and its text offset; with max_tokens 1, the generated
token's too. The engine computes it (serve/scoring.py); any other echo, or logprobs without echo, is refused.

Prompts: a completion's `prompt` is encoded as the bench engine encodes it (BOS included); a chat's
messages go through the tokenizer's chat template when it has one, else their texts are joined with
newlines (the reference model has no template: a user message whose content is the prompt is that
prompt). Output text is cut before the first stop string and never contains it (serve/detok.py).
A temperature below GREEDY_BELOW is greedy, as in vLLM: the logits divided by it would overflow.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import math
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..backends.base import FINISH_LENGTH
from ..backends.token_texts import token_texts
from .admission import Admission
from .body import parse_body
from .detok import TextStream
from .engine import FINISH_ERROR, QueueFull, ServeRequest, ShuttingDown, StreamEvent
from .metrics import CONTENT_TYPE
from .protocol import (DEFAULT_MAX_TOKENS, ApiError, ChatRequest, CompletionRequest, chat_body, chat_chunk,
                       completion_body, completion_chunk, logprobs_body, new_id, scoring_body, usage_chunk)
from .sampling import GREEDY_BELOW, SamplingParams
from .scoring import PromptScores, ScoreRequest

AUTO_MODELS = ("auto", "variantlab", "")
log = logging.getLogger("variantlab.serve")


@dataclass(frozen=True)
class ServerLimits:
    max_tokens: int = 256            # a request's max_tokens above this is refused
    max_body_bytes: int = 1 << 20    # a body larger than this is refused (413)
    max_prompt_chars: int = 200_000
    body_timeout_s: float = 30.0     # a body not all there by then is refused (408): a Content-Length that lies


def create_app(engine, text, *, api_key: str | None = None, limits: ServerLimits = ServerLimits(),
               served_name: str = "variantlab", info: dict | None = None) -> FastAPI:
    """`engine`: a ServeEngine (or anything with submit, cancel, lanes, metrics); `text`: the variants'
    shared TorchEngine for encode/decode and the tokenizer."""
    app = FastAPI(title="variantlab serve", docs_url=None, redoc_url=None)
    app.state.engine, app.state.text = engine, text
    admission = app.state.admission = Admission()
    created = int(time.time())
    if api_key:
        app.add_middleware(_BearerKey, key=api_key)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return _error(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException):   # an unknown route (404), a wrong method (405)
        return _error(ApiError(e.status_code, str(e.detail), headers=dict(e.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):       # the last resort: the routes are _guarded
        return _error(_internal(e))

    @app.get("/health")
    async def health():
        failed = getattr(engine, "error", None)
        if failed:
            return JSONResponse({"status": "error", "error": failed}, status_code=503)
        return {"status": "ok", "variants": list(engine.lanes), "policy": engine.policy.name,
                "queue_length": engine.queue_length(), "running": engine.running(),
                "in_flight": admission.in_flight, **(info or {})}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                            "owned_by": served_name} for name in engine.lanes]}

    @app.post("/v1/completions")
    @_guarded
    async def completions(request: Request):
        body = await parse_body(request, CompletionRequest, limits.max_body_bytes, limits.body_timeout_s)
        if len(body.prompt) > limits.max_prompt_chars:
            raise ApiError(400, f"the prompt is longer than {limits.max_prompt_chars} characters", param="prompt")
        ids = tuple(text.encode(body.prompt))
        k = body.scoring_top_k()
        if k is not None:
            return await _score(request, body, ids, k)
        return await _generate(request, body, ids, "prompt", DEFAULT_MAX_TOKENS, chat=False)

    @app.post("/v1/chat/completions")
    @_guarded
    async def chat(request: Request):
        body = await parse_body(request, ChatRequest, limits.max_body_bytes, limits.body_timeout_s)
        if sum(len(m.text()) for m in body.messages) > limits.max_prompt_chars:
            raise ApiError(400, f"the messages are longer than {limits.max_prompt_chars} characters",
                           param="messages")
        ids = tuple(_chat_ids(text, body))
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        return await _generate(request, body, ids, "messages", None, chat=True)

    async def _score(request: Request, body: CompletionRequest, ids: tuple[int, ...], k: int):
        body.refuse_unsupported(scoring=True)
        variant = _variant(engine, body.model)
        lane = engine.lanes[variant or next(iter(engine.lanes))]
        if len(ids) + body.max_tokens > lane.max_len:
            raise ApiError(400, f"the prompt is {len(ids)} tokens (+ max_tokens {body.max_tokens}); this server's "
                                f"context is {lane.max_len}", param="prompt", code="context_length_exceeded")
        rid = new_id("cmpl")
        temperature = body.temperature if body.temperature >= GREEDY_BELOW else 0.0
        req = ScoreRequest(rid, ids, k, variant, body.max_tokens, SamplingParams(temperature, body.top_p, body.seed))
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[PromptScores] = loop.create_future()

        def sink(answer: PromptScores) -> None:     # from the engine's (or the router's reader) thread
            loop.call_soon_threadsafe(lambda: answered.done() or answered.set_result(answer))

        _submitted(lambda: _admitted(admission, lambda: engine.score(req, sink)), "prompt")
        try:
            answer = await _answered(request, answered)
        finally:
            admission.leave()
        if answer is None:
            return Response(status_code=499)        # the client has gone
        if answer.error:
            raise ApiError(500, f"prompt scoring failed: {answer.error}", "server_error")
        return _scored(rid, body.prompt, answer, text)

    async def _generate(request: Request, body, ids: tuple[int, ...], prompt_field: str, default_max: int | None,
                        chat: bool):
        body.refuse_unsupported()
        if body.max_tokens == 0:
            raise ApiError(400, "max_tokens must be at least 1 (0 is for prompt scoring only: echo with logprobs)",
                           param="max_tokens")
        variant = _variant(engine, body.model)
        lane = engine.lanes[variant or next(iter(engine.lanes))]
        room = lane.max_len - len(ids)
        if room < 1:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this server's context is {lane.max_len}",
                           param=prompt_field, code="context_length_exceeded")
        # left out: OpenAI's default (completions 16, chat: as many as fit), within this server's limit and context
        max_tokens = body.max_tokens if body.max_tokens is not None else min(default_max or limits.max_tokens,
                                                                             limits.max_tokens, room)
        if max_tokens > limits.max_tokens:
            raise ApiError(400, f"max_tokens {max_tokens} is above this server's limit of {limits.max_tokens}",
                           param="max_tokens")
        if max_tokens > room:
            raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds this server's "
                                f"context of {lane.max_len} tokens", param="max_tokens",
                           code="context_length_exceeded")
        rid = new_id("chatcmpl" if chat else "cmpl")
        temperature = body.temperature if body.temperature >= GREEDY_BELOW else 0.0
        req = ServeRequest(rid, ids, max_tokens, tuple(body.stop), True,
                           SamplingParams(temperature, body.top_p, body.seed), variant)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        _submitted(lambda: _admitted(admission, lambda: engine.submit(
            req, lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev))), prompt_field)
        stream = TextStream(text.decode, body.stop)
        ended = _Ended()

        def finish() -> None:   # once, however the response ended; the client gone or cancelled: free its row
            if ended.left:
                return
            ended.left = True
            admission.leave()
            if not ended.done:
                engine.cancel(rid)

        if body.stream:
            return _EventStream(_sse(request, queue, stream, rid, len(ids), chat, body.include_usage, ended),
                                on_exit=finish)
        try:
            return await _whole(request, queue, stream, rid, len(ids), chat, ended)
        finally:
            finish()

    return app


# ------------------------------------------------------------------ helpers

def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _internal(e: Exception) -> ApiError:
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error")


def _guarded(route):
    """A route whose unexpected exceptions are answered as OpenAI-shaped 500s like any ApiError. (One that
    reaches Starlette's last-resort handler is re-raised after its response, and uvicorn then drops the
    connection: the client's next request on it fails.) A client gone while its body was read gets no
    answer (499, which nobody reads), and is no failure of the server's."""
    @functools.wraps(route)
    async def run(request: Request):
        try:
            return await route(request)
        except (ApiError, HTTPException):
            raise
        except ClientDisconnect:
            log.debug("%s: the client went away while sending its body", request.url.path)
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001 - every failure gets an answer
            log.exception("request failed")
            raise _internal(e) from e
    return run


class _BearerKey:
    """401 for a /v1/ request without `Authorization: Bearer <key>`. A plain ASGI middleware: Starlette's
    BaseHTTPMiddleware would sit between every streamed response and its client."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = _error(ApiError(401, "missing or wrong API key (send Authorization: Bearer <key>)",
                                           code="invalid_api_key"))
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


@dataclass
class _Ended:
    """`done` once a request's last event has been relayed (a response that ends before cancels the
    request); `left` once the request has left the admission count."""
    done: bool = False
    left: bool = False


class _EventStream(StreamingResponse):
    """An SSE response that runs `on_exit` however it ends (finished, the client gone, the server shutting
    down): when a send fails, Starlette abandons the event generator without closing it, so the
    generator's own `finally` would wait for the garbage collector."""

    def __init__(self, events, on_exit):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_exit = on_exit

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_exit()


def _admitted(admission: Admission, submit) -> None:
    """Count the request in (ShuttingDown once the gate has closed), then hand it over; out again if refused."""
    admission.enter()
    try:
        submit()
    except BaseException:
        admission.leave()
        raise


def _submitted(submit, prompt_field: str) -> None:
    """Run `submit` (a request handed to the engine); its refusals as ApiErrors (429, 503, 400)."""
    try:
        submit()
    except QueueFull as e:
        raise ApiError(429, f"the server is busy: {e}", "rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(int(round(e.retry_after_s)))}) from None
    except ShuttingDown as e:
        raise ApiError(503, str(e), "server_error", code="shutting_down", headers={"Connection": "close"}) from None
    except ValueError as e:
        raise ApiError(400, str(e), param=prompt_field) from None


async def _answered(request: Request, answered: asyncio.Future):
    """The scoring's answer; None when the client has gone away first."""
    while True:
        try:
            return await asyncio.wait_for(asyncio.shield(answered), timeout=0.25)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return None


def _scored(rid: str, prompt: str, answer: PromptScores, text) -> dict:
    """The completion body of a prompt scoring: the prompt echoed (and the generated token), with logprobs."""
    tok = text.tokenizer
    ids = list(answer.prompt_ids) + list(answer.generated)
    top_ids = sorted({i for position in answer.top for i, _ in position})
    names = dict(zip(top_ids, token_texts(tok, top_ids)))
    tops = [None] + [_by_text(position, names) for position in answer.top]
    logprobs = logprobs_body(token_texts(tok, ids), [None, *answer.logprobs], tops,
                             special_first=ids[0] in tok.all_special_ids)
    echoed = prompt + (text.decode(answer.generated) if answer.generated else "")
    return scoring_body(rid, answer.variant, echoed, "length", logprobs, len(answer.prompt_ids),
                        len(answer.generated))


def _by_text(position, names: dict) -> dict[str, float]:
    """(id, logprob) pairs → token text → logprob, ids that read alike merged (their probabilities summed)."""
    out: dict[str, float] = {}
    for i, lp in position:
        name = names[i]
        out[name] = lp if name not in out else max(out[name], lp) + math.log1p(math.exp(-abs(out[name] - lp)))
    return out


def _variant(engine, model: str | None) -> str | None:
    if model is None or model in AUTO_MODELS:
        return None
    if model not in engine.lanes:
        raise ApiError(404, f"the model {model!r} does not exist here (served: {', '.join(engine.lanes)}, or "
                            "'auto' to let the policy choose)", param="model", code="model_not_found")
    return model


def _chat_ids(text, body: ChatRequest) -> list[int]:
    tok = text.tokenizer
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    if getattr(tok, "chat_template", None):
        out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) else out)
    return text.encode("\n".join(m["content"] for m in messages))


def _finish_reason(ev: StreamEvent) -> str:
    return "length" if ev.finish_reason == FINISH_LENGTH else "stop"


def _failed(ev: StreamEvent) -> ApiError:
    return ApiError(500 if ev.finish_reason == FINISH_ERROR else 503, ev.error or "the request ended early",
                    "server_error")


async def _next(request: Request, queue: asyncio.Queue) -> StreamEvent | None:
    """The next event; None when the client has gone away."""
    while True:
        try:
            return await asyncio.wait_for(queue.get(), timeout=0.25)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return None


async def _whole(request: Request, queue, stream: TextStream, rid: str, n_prompt: int, chat: bool,
                 ended: _Ended):
    variant = ""
    while True:
        ev = await _next(request, queue)
        if ev is None:
            return Response(status_code=499)    # the client has gone: the caller cancels the request
        variant = ev.variant or variant
        if ev.token_id is None:
            ended.done = True
            raise _failed(ev)
        stream.push(ev.token_id)
        if ev.finish_reason is not None:
            ended.done = True
            make = chat_body if chat else completion_body
            return make(rid, variant, stream.text, _finish_reason(ev), n_prompt, len(stream.tokens))


async def _sse(request: Request, queue, stream: TextStream, rid: str, n_prompt: int, chat: bool,
               include_usage: bool, ended: _Ended):
    """The request's SSE events; it returns early when the client has gone (_EventStream then cancels it)."""
    first = True
    while True:
        ev = await _next(request, queue)
        if ev is None:
            return
        if ev.token_id is None:
            ended.done = True
            yield _data(_failed(ev).body())
            return
        delta = stream.push(ev.token_id)
        done = ev.finish_reason is not None
        if done:
            ended.done = True
            delta += stream.finish()
        reason = _finish_reason(ev) if done else None
        if chat:
            if first:
                yield _data(chat_chunk(rid, ev.variant, {"role": "assistant", "content": ""}, None))
            if delta or done:
                yield _data(chat_chunk(rid, ev.variant, {"content": delta} if delta else {}, reason))
        elif delta or done:
            yield _data(completion_chunk(rid, ev.variant, delta, reason))
        first = False
        if done:
            if include_usage:
                obj = "chat.completion.chunk" if chat else "text_completion"
                yield _data(usage_chunk(rid, ev.variant, obj, n_prompt, len(stream.tokens)))
            yield "data: [DONE]\n\n"
            return


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
