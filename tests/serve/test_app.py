"""The OpenAI-compatible server (serve/app.py) end to end: a real server built from a suite, on a free
loopback port, called with the official `openai` client and, for what the client cannot send (malformed
bodies, chunked bodies, closing a stream halfway), with httpx2.

One server per module serves fp32 and bf16 under the adaptive policy; small ones apart for the options
a test needs (a bearer key and a tiny body limit; a queue of one that never drains). What is checked:
completions and chat, whole and streamed (the deltas join to the whole text, usage counts the tokens);
a dataset answer at temperature 0 is the bench engine's; seeded sampling repeats and top_p, stop and
max_tokens are honoured; every refusal is OpenAI-shaped with its status and the client's exception
class; a client that closes its stream frees its row. Nothing is timed: every wait polls for a state.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import socket
import threading
import time

import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_cli import write_suite
from variantlab.backends.base import GenerationRequest, cut_at_stop, run_requests
from variantlab.backends.torch_engine import TorchEngine
from variantlab.measure.plan import plan_suite_file
from variantlab.serve.app import ServerLimits
from variantlab.serve.engine import ServeRequest
from variantlab.serve.server import ServeOptions, build_server

pytestmark = [pytest.mark.model, pytest.mark.e2e]

SUITE = """\
name: serve-app
model: builtin:tiny-structured
baseline: fp32
variants:
  - name: fp32
    recipe: fp32
  - name: bf16
    recipe: bf16
workload:
  dataset: {generator: structured, n: 16, seed: 0}
  max_new_tokens: 24
  stop: ["\\n"]
  scenarios:
    - type: single-stream
      requests: 4
"""
KEY = "sekret-key"
LONG = {"prompt": "hello", "temperature": 2.0, "seed": 1}   # fp32 samples all 256 tokens without an EOS (asserted)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return plan_suite_file(write_suite(tmp_path_factory.mktemp("suite"), SUITE))


@contextlib.contextmanager
def serving(plan, **options):
    handle = build_server(plan, ServeOptions(**options), log=lambda line: None)
    try:
        yield handle, handle.start_http()
    finally:
        handle.close()


@pytest.fixture(scope="module")
def server(plan):
    with serving(plan, policy="adaptive", max_batch=4) as (handle, url):
        yield handle, url


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def metric(url: str, name: str, **labels) -> float:
    """One sample's value from /metrics (0 when the series has no sample yet)."""
    families = text_string_to_metric_families(httpx2.get(url + "/metrics").text)
    return sum(s.value for f in families for s in f.samples if s.name == name and s.labels == labels)


def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def error_of(response: httpx2.Response, status: int) -> dict:
    """The OpenAI-shaped error body of a refused response, checked for shape and status."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


def post(url: str, path: str, body, **kw) -> httpx2.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx2.post(url + path, content=raw, headers={"content-type": "application/json", **kw.pop("headers", {})},
                       timeout=60, **kw)


def sse_chunks(response: httpx2.Response):
    """The JSON objects of an SSE stream, up to (not including) [DONE]."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return
            yield json.loads(line[len("data: "):])


# --------------------------------------------------------------------------- the routes

def test_models_and_health_list_every_served_variant(server):
    handle, url = server
    assert [m.id for m in client(url).models.list().data] == ["fp32", "bf16"] == list(handle.engine.lanes)
    health = httpx2.get(url + "/health").json()
    assert health["status"] == "ok" and health["variants"] == ["fp32", "bf16"] and health["policy"] == "adaptive"
    assert health["running"] == 0 and health["queue_length"] == 0


def test_a_completion_streamed_joins_to_the_whole_one_and_usage_counts_its_tokens(server, plan):
    handle, url = server
    c = client(url)
    kw = dict(model="bf16", prompt=plan.samples[1]["prompt"], max_tokens=24, temperature=0)
    before = metric(url, "variantlab_generated_tokens_total", variant="bf16")
    whole = c.completions.create(**kw)
    chunks = list(c.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text_chunks, usage = chunks[:-1], chunks[-1]
    assert whole.model == "bf16" and all(ch.model == "bf16" for ch in chunks)
    assert len(text_chunks) > 1 and "".join(ch.choices[0].text for ch in text_chunks) == whole.choices[0].text
    assert all(ch.choices[0].finish_reason is None for ch in text_chunks[:-1])
    assert text_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert usage.choices == [] and usage.usage.completion_tokens == whole.usage.completion_tokens
    assert usage.usage.prompt_tokens == whole.usage.prompt_tokens == len(handle.text.encode(kw["prompt"]))
    n = whole.usage.completion_tokens
    assert 1 <= n <= 24 and whole.usage.total_tokens == whole.usage.prompt_tokens + n
    assert metric(url, "variantlab_generated_tokens_total", variant="bf16") == before + 2 * n


def test_chat_whole_and_streamed(server, plan):
    _, url = server
    c = client(url)
    prompt = plan.samples[2]["prompt"]
    as_completion = c.completions.create(model="fp32", prompt=prompt, max_tokens=20, temperature=0)
    kw = dict(model="fp32", messages=[{"role": "user", "content": prompt}], max_tokens=20, temperature=0)
    whole = c.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert whole.object == "chat.completion" and whole.model == "fp32" and msg.role == "assistant"
    assert msg.content == as_completion.choices[0].text   # no chat template: the message is the prompt
    assert whole.usage.completion_tokens == as_completion.usage.completion_tokens
    chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    text_chunks, usage = chunks[:-1], chunks[-1]
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert "".join(ch.choices[0].delta.content or "" for ch in text_chunks) == msg.content
    assert text_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert usage.usage.completion_tokens == whole.usage.completion_tokens
    parts = c.chat.completions.create(**{**kw, "messages": [{"role": "user", "content": [
        {"type": "text", "text": prompt[:20]}, {"type": "text", "text": prompt[20:]}]}]})
    assert parts.choices[0].message.content == msg.content


def test_a_named_variant_answers_and_auto_lets_the_policy_pick(server):
    handle, url = server
    c = client(url)
    for name in ("fp32", "bf16", "fp32"):
        assert c.completions.create(model=name, prompt="status:", max_tokens=2, temperature=0).model == name
    for name in ("auto", "variantlab"):
        picked = c.completions.create(model=name, prompt="status:", max_tokens=2, temperature=0).model
        assert picked == handle.engine.policy.current   # idle: the variant fastest at one row


def test_metrics_are_prometheus_text_that_counts_tokens_and_finishes(server):
    _, url = server
    response = httpx2.get(url + "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(response.text)}
    assert {"variantlab_generated_tokens", "variantlab_requests_finished", "variantlab_queue_length"} <= names
    tokens = metric(url, "variantlab_generated_tokens_total", variant="fp32")
    length = metric(url, "variantlab_requests_finished_total", reason="length")
    out = client(url).completions.create(model="fp32", prompt="hello", max_tokens=3, temperature=0)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3
    assert metric(url, "variantlab_generated_tokens_total", variant="fp32") == tokens + 3
    assert metric(url, "variantlab_requests_finished_total", reason="length") == length + 1


# --------------------------------------------------------------------------- what it generates

@pytest.mark.parametrize("variant", ["fp32", "bf16"])
def test_a_dataset_answer_is_the_bench_engines(server, plan, variant):
    handle, url = server
    lane = handle.engine.lanes[variant]
    bench = TorchEngine(lane.model, lane.engine.tokenizer, "cpu")   # the same weights, the bench's own caches
    c = client(url)
    for i, sample in enumerate(plan.samples[:4]):
        out = c.completions.create(model=variant, prompt=sample["prompt"], max_tokens=24, temperature=0, stop=["\n"])
        [want] = run_requests(bench, [GenerationRequest(f"s{i}", prompt=sample["prompt"], max_new_tokens=24,
                                                        stop=("\n",))])
        text = out.choices[0].text
        assert "\n" not in text and text == cut_at_stop(bench.decode(want.token_ids), ("\n",)), i
        assert text.strip() == want.output_text and want.output_text, i
        assert out.usage.completion_tokens == len(want.token_ids) and out.choices[0].finish_reason == want.finish_reason


def test_seeded_sampling_repeats_and_top_p_and_stop_are_honoured(server):
    _, url = server
    c = client(url)
    kw = dict(model="fp32", prompt="hello", max_tokens=32)
    a, b = (c.completions.create(**kw, temperature=0.8, seed=7).choices[0].text for _ in range(2))
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(**kw, temperature=0.8, seed=7, stream=True))
    assert a == b == streamed and a
    seeds = {c.completions.create(**kw, temperature=0.8, seed=s).choices[0].text for s in range(4)}
    assert len(seeds) > 1, "four seeds sampled the same text"
    greedy = c.completions.create(**kw, temperature=0).choices[0].text
    nucleus = c.completions.create(**kw, temperature=1.5, top_p=1e-6, seed=3).choices[0].text
    assert nucleus == greedy != a   # a top_p this small keeps the most likely token only
    tiny = c.completions.create(**kw, temperature=1e-300, seed=3).choices[0].text
    assert tiny == greedy and httpx2.get(url + "/health").json()["status"] == "ok"
    stop = greedy[len(greedy) // 2:len(greedy) // 2 + 2]
    cut = c.completions.create(**kw, temperature=0, stop=[stop, "never-there"])
    assert cut.choices[0].text == greedy[:greedy.index(stop)] and cut.choices[0].finish_reason == "stop"
    deltas = [ch.choices[0].text for ch in c.completions.create(**kw, temperature=0, stop=stop, stream=True)]
    assert "".join(deltas) == greedy[:greedy.index(stop)] and not any(stop in d for d in deltas)
    short = c.completions.create(**{**kw, "max_tokens": 4}, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 4
    assert greedy.startswith(short.choices[0].text)


# --------------------------------------------------------------------------- refusals

def test_malformed_bodies_and_bad_fields_are_400_naming_the_param(server):
    _, url = server
    assert error_of(post(url, "/v1/completions", b"{not json"), 400)["param"] is None
    assert "JSON object" in error_of(post(url, "/v1/completions", [1, 2]), 400)["message"]
    assert "JSON" in error_of(post(url, "/v1/chat/completions", b"\xff\xfe"), 400)["message"]
    for body, param in [({"max_tokens": 2}, "prompt"), ({"prompt": 5}, "prompt"),
                        ({"prompt": "x", "temperature": "hot"}, "temperature"),
                        ({"prompt": "x", "temperature": "0.5"}, "temperature"),
                        ({"prompt": "x", "temperature": 2.5}, "temperature"), ({"prompt": "x", "top_p": 0}, "top_p"),
                        ({"prompt": "x", "max_tokens": 0}, "max_tokens"), ({"prompt": "x", "stop": 5}, "stop"),
                        ({"prompt": "x", "stop": ["a", 1]}, "stop.1"), ({"prompt": "x", "stop": [""]}, "stop"),
                        ({"prompt": "x", "stream": "yes"}, "stream"), ({"prompt": "x", "seed": 2**64}, "seed"),
                        ({"prompt": ["a", "b"]}, "prompt")]:
        err = error_of(post(url, "/v1/completions", body), 400)
        assert err["param"] == param and err["type"] == "invalid_request_error", (body, err)
    for messages, param in [([], "messages"), ([{"role": "robot", "content": "x"}], "messages.0.role"),
                            ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                             "messages.0.content")]:
        assert error_of(post(url, "/v1/chat/completions", {"messages": messages}), 400)["param"] == param
    assert error_of(httpx2.get(url + "/v1/nowhere"), 404)
    assert error_of(httpx2.get(url + "/v1/completions"), 405)
    assert httpx2.get(url + "/health").json()["status"] == "ok"


def test_what_is_not_implemented_is_refused_with_the_clients_exceptions(server):
    _, url = server
    c = client(url)
    chat = [{"role": "user", "content": "hi"}]
    refused = [(dict(n=2), "n"), (dict(logprobs=1), "logprobs"), (dict(logprobs=0), "logprobs"),
               (dict(echo=True), "echo"), (dict(best_of=2), "best_of"),
               (dict(presence_penalty=0.5), "presence_penalty")]
    for kw, param in refused:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="fp32", prompt="hi", max_tokens=2, **kw)
        assert e.value.status_code == 400 and e.value.param == param and e.value.code == "unsupported_parameter", kw
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="fp32", messages=chat, max_tokens=2, logprobs=True)
    assert e.value.param == "logprobs"
    accepted = c.completions.create(model="fp32", prompt="hi", max_tokens=2, n=1, echo=False, best_of=1,
                                    presence_penalty=0, logprobs=None, user="someone", temperature=0)
    assert accepted.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="fp32", prompt="hi", temperature=3)
    assert e.value.param == "temperature"
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-9", prompt="hi")
    assert e.value.status_code == 404 and e.value.param == "model" and e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-9", messages=chat, stream=True)


def test_max_tokens_above_the_limit_or_beyond_the_context_is_400(server, plan):
    handle, url = server
    c = client(url)
    limit, context = ServerLimits().max_tokens, handle.engine.lanes["fp32"].max_len
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="fp32", prompt="hi", max_tokens=limit + 1)
    assert e.value.param == "max_tokens" and str(limit) in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="fp32", messages=[{"role": "user", "content": "hi"}],
                                  max_completion_tokens=limit + 1)
    assert e.value.param == "max_tokens"
    samples = itertools.cycle(s["prompt"] for s in plan.samples)
    prompt = next(samples)
    while len(handle.text.encode(prompt)) <= context - limit:
        prompt += "\n" + next(samples)
    n = len(handle.text.encode(prompt))
    assert n < context, "the prompt alone should fit"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="fp32", prompt=prompt, max_tokens=limit)
    assert e.value.param == "max_tokens" and e.value.code == "context_length_exceeded"
    fits = c.completions.create(model="fp32", prompt=prompt, max_tokens=context - n, temperature=0)
    assert fits.usage.prompt_tokens == n
    while len(handle.text.encode(prompt)) < context:
        prompt += "\n" + next(samples)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="fp32", prompt=prompt, max_tokens=1)
    assert e.value.param == "prompt" and e.value.code == "context_length_exceeded"


def test_a_bearer_key_and_the_body_limit(plan):
    with serving(plan, policy="single", variants=("fp32",), api_key=KEY,
                 limits=ServerLimits(max_body_bytes=2048)) as (_, url):
        body = {"model": "fp32", "prompt": "hi", "max_tokens": 2}
        assert error_of(post(url, "/v1/completions", body), 401)["code"] == "invalid_api_key"
        assert error_of(post(url, "/v1/completions", body, headers={"authorization": "Bearer nope"}), 401)
        assert error_of(httpx2.get(url + "/v1/models"), 401)
        with pytest.raises(openai.AuthenticationError) as e:
            client(url, "wrong").completions.create(model="fp32", prompt="hi", max_tokens=2)
        assert e.value.status_code == 401
        good = client(url, KEY)
        assert good.completions.create(model="fp32", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
        assert [m.id for m in good.models.list().data] == ["fp32"]
        assert httpx2.get(url + "/health").json()["status"] == "ok"   # health and metrics need no key
        assert httpx2.get(url + "/metrics").status_code == 200
        auth = {"authorization": f"Bearer {KEY}"}
        big = {**body, "prompt": "x" * 4096}
        assert "2048 bytes" in error_of(post(url, "/v1/completions", big, headers=auth), 413)["message"]
        chunked = httpx2.post(url + "/v1/completions", content=(b"x" * 1024 for _ in range(4)),
                              headers={**auth, "content-type": "application/json"}, timeout=60)
        assert "content-length" not in chunked.request.headers
        error_of(chunked, 413)
        with pytest.raises(openai.APIStatusError) as e:
            good.completions.create(model="fp32", prompt="x" * 4096, max_tokens=2)
        assert e.value.status_code == 413


# --------------------------------------------------------------------------- what the fuzzing found (test_fuzz.py)

def test_bodies_that_were_500s_are_400_naming_what_is_wrong(server):
    """Each of these was a 500: JSON nested past Python's recursion limit, an integer past its 4,300
    digits, a lone surrogate (valid JSON, not Unicode) in a prompt, a chat message or a stop string,
    which the tokenizer refused with a TypeError."""
    _, url = server
    deep = b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert "nests too deeply" in error_of(post(url, "/v1/completions", deep), 400)["message"]
    long_int = b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"
    assert "integer longer than" in error_of(post(url, "/v1/completions", long_int), 400)["message"]
    for path, raw, param in [("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
                             ("/v1/completions", b'{"prompt": ["\\udfff"]}', "prompt"),
                             ("/v1/completions", b'{"prompt": "hi", "stop": "\\ud800"}', "stop"),
                             ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
                              "messages.0.content"),
                             ("/v1/chat/completions",
                              b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
                              "messages.0.content")]:
        err = error_of(post(url, path, raw), 400)
        assert err["param"] == param and "lone surrogate" in err["message"], (raw, err)
    assert httpx2.get(url + "/health").json()["in_flight"] == 0


def test_a_body_that_never_all_comes_is_408_and_a_client_gone_mid_body_is_no_failure(plan, caplog):
    """A Content-Length that says more than is sent held the request until the client gave up (and then
    it was logged as a 500); now it is 408 after body_timeout_s. A client that closes while its body
    is read gets no answer and nothing is logged as failed."""
    # 2 s: the client below closes at once; a timeout must not beat the disconnect on a stalled machine
    with serving(plan, policy="single", variants=("fp32",), limits=ServerLimits(body_timeout_s=2.0)) as (_, url):
        host, port = url.removeprefix("http://").split(":")
        body = b'{"prompt": "hi", "max_tokens": 2}'
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % (len(body) + 10) + body)
            answer = sock.makefile("rb").read()      # the server closes the connection after its answer
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        error = json.loads(payload)["error"]
        assert error["code"] == "body_timeout" and f"{len(body)} of {len(body) + 10} bytes" in error["message"]
        with caplog.at_level(logging.DEBUG, logger="variantlab.serve"):
            with socket.create_connection((host, int(port)), timeout=60) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
            wait_for(lambda: "went away while sending its body" in caplog.text or any(
                r.levelno >= logging.ERROR for r in caplog.records), "the server to see the client go")
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_max_tokens_left_out_is_within_the_servers_limit(plan):
    """A completion without max_tokens takes OpenAI's default of 16, which was refused as "max_tokens 16
    is above this server's limit" on a server run with --max-tokens 4: a field the client never sent."""
    with serving(plan, policy="single", variants=("fp32",), limits=ServerLimits(max_tokens=4)) as (_, url):
        r = post(url, "/v1/completions", {"prompt": "hello", "temperature": 2.0, "seed": 1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_full_queue_is_429_with_retry_after(plan):
    # static with an endless wait never admits: one request submitted here fills the queue of one
    with serving(plan, policy="static", variants=("fp32",), batch_size=8, max_wait_s=3600.0,
                 max_queue=1) as (handle, url):
        events = []
        handle.engine.submit(ServeRequest("held", tuple(handle.text.encode("hi")), 4), events.append)
        wait_for(lambda: handle.engine.queue_length() == 1, "the held request to wait")
        refused = post(url, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        err = error_of(refused, 429)
        assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
        assert int(refused.headers["retry-after"]) >= 1
        with pytest.raises(openai.RateLimitError) as e:
            client(url).chat.completions.create(model="fp32", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, stream=True)
        assert int(e.value.response.headers["retry-after"]) >= 1
        assert metric(url, "variantlab_requests_rejected_total") == 2
        assert events == [] and handle.engine.queue_length() == 1


# --------------------------------------------------------------------------- a client that goes away

def test_a_client_that_closes_its_stream_frees_its_row(server):
    handle, url = server
    body = {"model": "fp32", "max_tokens": 256, **LONG}
    whole = client(url).completions.create(**body)
    assert whole.choices[0].finish_reason == "length", "the long request should run to max_tokens"
    cancelled = metric(url, "variantlab_requests_finished_total", reason="cancelled")
    with httpx2.Client(base_url=url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            chunks = sse_chunks(response)
            first = [next(chunks) for _ in range(2)]
            assert all(ch["choices"][0]["finish_reason"] is None for ch in first)
            assert handle.engine.running() == 1
    wait_for(lambda: handle.engine.running() == 0, "the closed stream's row to be freed")
    wait_for(lambda: metric(url, "variantlab_requests_finished_total", reason="cancelled") == cancelled + 1,
             "the cancellation to be counted")
    again = client(url).completions.create(model="fp32", prompt="status:", max_tokens=2, temperature=0)
    assert again.usage.completion_tokens >= 1


# --------------------------------------------------------------------------- shutting down

def test_shutting_down_answers_every_request_in_flight_with_an_openai_shaped_503(plan):
    """close() with a grace of 0 (serve/listener.py): a streamed and a whole request held in the queue
    (static with an endless wait never admits) each get the shutdown error, not a dropped connection;
    once the app's gate has closed, a new request is refused with 503 and Connection: close."""
    handle = build_server(plan, ServeOptions(policy="static", variants=("fp32",), batch_size=8, max_wait_s=3600.0),
                          log=lambda line: None)
    url = handle.start_http(grace_s=0)
    try:
        got: dict = {}

        def whole():
            got["whole"] = post(url, "/v1/completions", {"prompt": "hi", "max_tokens": 4})

        held = threading.Thread(target=whole)
        held.start()
        with httpx2.stream("POST", url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": True},
                           timeout=60) as streamed:
            assert streamed.status_code == 200
            wait_for(lambda: handle.engine.queue_length() == 2, "both requests to wait")
            assert httpx2.get(url + "/health").json()["in_flight"] == 2
            handle.app.state.admission.close()            # what the listener does first
            refused = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
            assert error_of(refused, 503)["code"] == "shutting_down"
            assert refused.headers["connection"] == "close"
            closing = threading.Thread(target=handle.close)
            closing.start()
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        held.join(60)
        closing.join(60)
        assert not held.is_alive() and not closing.is_alive()
        last = json.loads(lines[-1][len("data: "):])
        assert set(last) == {"error"} and "shutting down" in last["error"]["message"], lines
        assert "shutting down" in error_of(got["whole"], 503)["message"]
        with pytest.raises(httpx2.ConnectError):
            httpx2.get(url + "/health", timeout=5)
    finally:
        handle.close()
