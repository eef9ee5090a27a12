"""The streaming engine (backends/torch_engine.py) on the tiny random Llama, fp32, CPU.

Greedy output is checked token for token against transformers' own `generate` and against a naive
reference that recomputes the whole sequence every step (no cache) and applies the stop rules by
their definition (the whole output decoded after every token); batches (left-padded) against each
request alone. Stop rules are driven exactly by a scripted stand-in model that emits given tokens.
"""
from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import build_tokenizer

from variantlab.backends.base import (FINISH_LENGTH, FINISH_STOP, Capabilities, GenerationRequest, cut_at_stop,
                                      run_requests)
from variantlab.backends.torch_engine import TorchEngine

pytestmark = pytest.mark.model

# Different lengths, so a batch of them is left-padded.
PROMPTS = [
    "Q: hi\nA:",
    "a: 1\nQ: What is the a?\nA:",
    "order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA:",
    "hello world\n",
]
N = 10


@pytest.fixture(scope="module")
def engine(tiny_lm):
    model, tok = tiny_lm
    return TorchEngine(model, tok, "cpu", "tok")


def req(i, prompt=None, **kw) -> GenerationRequest:
    return GenerationRequest(f"r{i}", prompt=prompt if prompt is not None else PROMPTS[i % len(PROMPTS)], **kw)


def tokens_of(engine, requests) -> list[list[int]]:
    out = [[] for _ in requests]
    for ev in engine.stream(requests):
        out[ev.index].append(ev.token_id)
    return out


def finishes_of(engine, requests) -> list[str | None]:
    out = [None] * len(requests)
    for ev in engine.stream(requests):
        if ev.finish_reason is not None:
            out[ev.index] = ev.finish_reason
    return out


@torch.inference_mode()
def naive(model, tok, r: GenerationRequest) -> tuple[list[int], str]:
    """Greedy without a cache (the whole sequence through the model every step), the stop rules
    applied by their definition: (tokens, finish reason)."""
    prompt = list(r.prompt_ids) if r.prompt_ids is not None else tok(r.prompt).input_ids
    ids = torch.tensor([prompt])
    eos = {tok.eos_token_id} if r.stop_on_eos else set()
    out: list[int] = []
    while True:
        nxt = int(model(input_ids=ids).logits[0, -1].argmax())
        out.append(nxt)
        text = tok.decode(out, skip_special_tokens=True)
        if nxt in eos or any(s in text for s in r.stop):
            return out, FINISH_STOP
        if len(out) == r.max_new_tokens:
            return out, FINISH_LENGTH
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)


def cut_at_own_stop(tokens: list[int], eos: int) -> list[int]:
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


class Scripted(torch.nn.Module):
    """A stand-in causal LM whose greedy choice at step k for batch row b is scripts[b][k] (the last
    entry repeats). It counts its steps on the cache object it is given, records the keyword
    arguments of every call, and can fail at a given step."""

    def __init__(self, scripts, vocab_size: int, fail_at: int | None = None):
        super().__init__()
        self.scripts, self.fail_at = scripts, fail_at
        self.config = SimpleNamespace(vocab_size=vocab_size)
        self.calls: list[dict] = []

    def forward(self, input_ids, past_key_values=None, **kw):
        step = getattr(past_key_values, "scripted_step", 0)
        past_key_values.scripted_step = step + 1
        self.calls.append(kw)
        if step == self.fail_at:
            raise RuntimeError(f"scripted failure at step {step}")
        b, t = input_ids.shape
        logits = torch.zeros(b, t, self.config.vocab_size)
        for row in range(b):
            script = self.scripts[row]
            logits[row, -1, script[min(step, len(script) - 1)]] = 1.0
        return SimpleNamespace(logits=logits)


def scripted_engine(tok, scripts, **kw) -> TorchEngine:
    return TorchEngine(Scripted(scripts, len(tok), **kw), tok, "cpu", "tok")


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# ------------------------------------------------------------------------------------ greedy, exactly

@pytest.mark.parametrize("prompt", PROMPTS)
def test_one_request_equals_transformers_generate(engine, tiny_lm, prompt):
    model, tok = tiny_lm
    enc = tok(prompt, return_tensors="pt")
    ref = model.generate(**enc, do_sample=False, max_new_tokens=N)[0, enc.input_ids.shape[1]:].tolist()
    (got,) = tokens_of(engine, [GenerationRequest("r", prompt=prompt, max_new_tokens=N)])
    assert got == cut_at_own_stop(ref, tok.eos_token_id)


def test_left_padded_batch_equals_transformers_generate(engine, tiny_lm):
    model, tok = tiny_lm
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    ref = model.generate(**enc, do_sample=False, max_new_tokens=N)[:, enc.input_ids.shape[1]:].tolist()
    got = tokens_of(engine, [req(i, max_new_tokens=N) for i in range(len(PROMPTS))])
    assert len({len(tok(p).input_ids) for p in PROMPTS}) == len(PROMPTS)   # really padded
    for g, r in zip(got, ref):
        assert g == cut_at_own_stop(r, tok.eos_token_id)


MIXED = [  # stop rules of every kind, prompts as text and as ids
    dict(max_new_tokens=N, stop=("\n",)),
    dict(max_new_tokens=3, stop_on_eos=False),
    dict(max_new_tokens=N, stop=("A:", ": ", "e")),
    dict(max_new_tokens=7, stop=("\n",), stop_on_eos=False),
]


@pytest.mark.parametrize("batched", [False, True], ids=["one-at-a-time", "batch"])
def test_equals_the_naive_reference_without_cache(engine, tiny_lm, batched):
    model, tok = tiny_lm
    requests = [req(i, **kw) for i, kw in enumerate(MIXED)]
    requests[1] = GenerationRequest("ids", prompt_ids=tuple(tok(PROMPTS[1]).input_ids), max_new_tokens=3,
                                    stop_on_eos=False)
    if batched:
        got, reasons = tokens_of(engine, requests), finishes_of(engine, requests)
    else:
        got = [tokens_of(engine, [r])[0] for r in requests]
        reasons = [finishes_of(engine, [r])[0] for r in requests]
    for r, g, why in zip(requests, got, reasons):
        assert (g, why) == naive(model, tok, r)


def test_a_batch_gives_each_request_what_it_gets_alone(engine):
    requests = [req(i, **kw) for i, kw in enumerate(MIXED)] + [req(3, max_new_tokens=1), req(0, max_new_tokens=12)]
    alone = [tokens_of(engine, [r])[0] for r in requests]
    assert tokens_of(engine, requests) == alone
    assert tokens_of(engine, requests[::-1]) == alone[::-1]


# ------------------------------------------------------------------------------------ the event stream

def test_events_come_per_step_in_request_order_with_prompt_tokens_first_and_finish_last(tiny_lm):
    model, tok = tiny_lm
    readings = iter(range(100, 10_000))
    engine = TorchEngine(model, tok, "cpu", "tok", clock=lambda: float(next(readings)))
    requests = [req(0, max_new_tokens=2, stop_on_eos=False), req(1, max_new_tokens=4, stop_on_eos=False),
                GenerationRequest("ids", prompt_ids=(0, 5, 6), max_new_tokens=3, stop_on_eos=False)]
    events = list(engine.stream(requests))
    assert [(e.index, e.time) for e in events] == [(0, 100.0), (1, 100.0), (2, 100.0), (0, 101.0), (1, 101.0),
                                                    (2, 101.0), (1, 102.0), (2, 102.0), (1, 103.0)]
    for i, r in enumerate(requests):
        mine = [e for e in events if e.index == i]
        prompt_len = len(r.prompt_ids) if r.prompt_ids else len(tok(r.prompt).input_ids)
        assert [e.prompt_tokens for e in mine] == [prompt_len] + [None] * (len(mine) - 1)
        assert [e.finish_reason for e in mine] == [None] * (len(mine) - 1) + [FINISH_LENGTH]


def test_one_request_runs_without_padding_or_mask_and_a_batch_with_both(tiny_lm):
    _, tok = tiny_lm
    engine = scripted_engine(tok, [[5]])
    tokens_of(engine, [req(0, max_new_tokens=3)])
    assert len(engine.model.calls) == 3
    assert all(c["attention_mask"] is None and c["position_ids"] is None and c["use_cache"] for c in engine.model.calls)
    engine = scripted_engine(tok, [[5], [6]])
    assert tokens_of(engine, [req(0, max_new_tokens=3), req(2, max_new_tokens=3)]) == [[5] * 3, [6] * 3]
    for call in engine.model.calls:
        assert {"attention_mask", "position_ids"} <= set(call)
    first, last = engine.model.calls[0], engine.model.calls[-1]
    short = len(tok(PROMPTS[0]).input_ids)
    width = len(tok(PROMPTS[2]).input_ids)
    assert first["attention_mask"][0].tolist() == [0] * (width - short) + [1] * short
    assert first["position_ids"][0, -1] == short - 1 and last["position_ids"][:, 0].tolist() == [short + 1, width + 1]
    assert last["attention_mask"].shape == (2, width + 2)


# ------------------------------------------------------------------------------------ stop rules

def test_eos_stops_and_counts_unless_stop_on_eos_is_off(tiny_lm):
    _, tok = tiny_lm
    script = ids_of(tok, "ab") + [tok.eos_token_id] + ids_of(tok, "cd")
    engine = scripted_engine(tok, [script, script])
    on, off = run_requests(engine, [req(0, max_new_tokens=8), req(1, max_new_tokens=8, stop_on_eos=False)])
    assert on.token_ids == tuple(script[:3]) and on.finish_reason == FINISH_STOP and on.output_text == "ab"
    assert off.tokens_out == 8 and off.finish_reason == FINISH_LENGTH
    assert off.output_text == tok.decode(off.token_ids, skip_special_tokens=True)


def test_newline_stops_and_the_text_is_cut_before_it(tiny_lm):
    _, tok = tiny_lm
    script = ids_of(tok, "pending\nQ: x")
    (rec,) = run_requests(scripted_engine(tok, [script]), [req(0, max_new_tokens=20, stop=("\n",))])
    assert rec.token_ids == tuple(ids_of(tok, "pending\n"))   # the stopping token counts
    assert rec.tokens_out == len(rec.token_times) and rec.finish_reason == FINISH_STOP
    assert rec.output_text == "pending"


def test_a_stop_string_spanning_two_tokens(tiny_lm):
    _, tok = tiny_lm
    script = ids_of(tok, " 42 A: more")
    a, colon = ids_of(tok, "A"), ids_of(tok, ":")
    assert len(a) == len(colon) == 1 and a[0] in script and colon[0] in script   # "A:" is two tokens here
    (rec,) = run_requests(scripted_engine(tok, [script]), [req(0, max_new_tokens=20, stop=("A:", "zz"))])
    assert rec.token_ids == tuple(script[:script.index(colon[0]) + 1])
    assert rec.finish_reason == FINISH_STOP and rec.output_text == "42"


def test_a_non_ascii_stop_string_completed_by_byte_pieces(tiny_lm):
    """The shipped tokenizer spells 本 with three byte tokens, each alone decoding to U+FFFD."""
    _, tok = tiny_lm
    script = ids_of(tok, "日本 é!")
    hon = ids_of(tok, "本")
    assert len(hon) == 3 and all("\ufffd" == tok.decode([i]) for i in hon)
    engine = scripted_engine(tok, [script] * 3)
    recs = run_requests(engine, [req(0, max_new_tokens=20, stop=("本",)), req(1, max_new_tokens=20, stop=("é!",)),
                                 req(2, max_new_tokens=20, stop=("!",))])
    assert [r.tokens_out for r in recs] == [len(ids_of(tok, "日本")), len(script), len(script)]
    assert [r.output_text for r in recs] == ["日", "日本", "日本 é"]
    assert {r.finish_reason for r in recs} == {FINISH_STOP}


def test_max_new_tokens_differs_per_request_inside_one_batch(tiny_lm):
    _, tok = tiny_lm
    engine = scripted_engine(tok, [[7]] * 3)
    recs = run_requests(engine, [req(i, max_new_tokens=n, stop=("\n",)) for i, n in enumerate((1, 4, 2))])
    assert [r.tokens_out for r in recs] == [1, 4, 2]
    assert {r.finish_reason for r in recs} == {FINISH_LENGTH}
    assert len(engine.model.calls) == 4   # prefill + 3 steps: the batch runs until its longest request ends


def test_rows_that_stopped_early_yield_nothing_more(tiny_lm):
    _, tok = tiny_lm
    nl = ids_of(tok, "\n")
    engine = scripted_engine(tok, [[5] + nl, [5, 6, 7, 8, 9]])
    events = list(engine.stream([req(0, max_new_tokens=9, stop=("\n",)), req(1, max_new_tokens=5)]))
    assert [e.index for e in events] == [0, 1, 0, 1, 1, 1, 1]


def test_an_empty_stop_string_is_refused(engine):
    with pytest.raises(ValueError, match="empty"):
        run_requests(engine, [req(0, stop=("",))])


# ------------------------------------------------------------------------------------ run_requests

def test_run_requests_times_come_from_the_engine_clock_exactly(tiny_lm):
    model, tok = tiny_lm
    readings = iter(range(1, 10_000))
    engine = TorchEngine(model, tok, "cpu", "tok", clock=lambda: float(next(readings)))
    recs = run_requests(engine, [req(0, max_new_tokens=3, stop_on_eos=False),
                                 req(2, max_new_tokens=5, stop_on_eos=False)])
    # one reading before the call (send), one per step, one after the stream
    assert [r.send_time for r in recs] == [1.0, 1.0]
    assert recs[0].token_times == (2.0, 3.0, 4.0) and recs[1].token_times == (2.0, 3.0, 4.0, 5.0, 6.0)
    assert [r.end_time for r in recs] == [4.0, 6.0]
    for r in recs:
        assert r.send_time <= r.first_token_time <= r.end_time and r.ok


@pytest.mark.parametrize("caller_mode", ["inference", "normal"])
def test_one_request_is_collected_with_the_tokens_times_and_ending_the_stream_gives(tiny_lm, caller_mode):
    """run_requests takes a single request through `collect` (no event per token): the record is what the
    stream's events make, on one clock reading per token; a batch still streams."""
    model, tok = tiny_lm
    for r in (req(1, max_new_tokens=N, stop_on_eos=False), req(2, max_new_tokens=40, stop=("\n",)),
              GenerationRequest("ids", prompt_ids=(0, 9, 9, 9), max_new_tokens=1)):
        readings = iter(range(1, 10_000))
        engine = TorchEngine(model, tok, "cpu", "tok", clock=lambda: float(next(readings)))
        with torch.inference_mode(caller_mode == "inference"):
            (rec,) = run_requests(engine, [r])
            assert torch.is_inference_mode_enabled() == (caller_mode == "inference")   # the caller's mode
            events = list(engine.stream([r]))
        assert rec.token_ids == tuple(ev.token_id for ev in events)
        assert rec.finish_reason == events[-1].finish_reason and rec.tokens_in == events[0].prompt_tokens
        assert rec.send_time == 1.0 and rec.token_times == tuple(float(t) for t in range(2, 2 + len(events)))
        assert rec.output_text == cut_at_stop(engine.decode(list(rec.token_ids)), r.stop).strip()


def test_run_requests_tokens_in_for_text_and_id_prompts(engine, tiny_lm):
    _, tok = tiny_lm
    text, ids = run_requests(engine, [req(2, max_new_tokens=2), GenerationRequest("ids", prompt_ids=(0, 9, 9, 9),
                                                                                   max_new_tokens=2)])
    assert text.tokens_in == len(tok(PROMPTS[2]).input_ids) and ids.tokens_in == 4


def test_an_exception_inside_stream_propagates_so_the_measurement_fails(tiny_lm):
    """In a benchmark a kernel that raises is a failed measurement (with its traceback), not slow requests."""
    _, tok = tiny_lm
    engine = TorchEngine(Scripted([[5], [6]], len(tok), fail_at=2), tok, "cpu", "tok")
    with pytest.raises(RuntimeError, match="scripted failure at step 2"):
        run_requests(engine, [req(0, max_new_tokens=5), req(1, max_new_tokens=5)])


# ------------------------------------------------------------------------------------ text and scoring

def test_encode_decode_and_what_the_engine_declares(engine, tiny_lm):
    _, tok = tiny_lm
    ids = engine.encode("hello world")
    assert ids == tok("hello world").input_ids and ids[0] == tok.bos_token_id
    assert engine.decode(ids + [tok.eos_token_id]) == "hello world"
    assert engine.tokenizer_class == type(tok).__name__ and engine.tokenizer_id == "tok"
    assert engine.capabilities == Capabilities(batching=True, token_timestamps=True, scoring=True, token_input=True)


TEXTS = [PROMPTS[1] + " 1", "héllo — wörld", "日本 x"]


def test_score_with_a_bos_tokenizer_predicts_every_byte(engine, tiny_lm):
    model, tok = tiny_lm
    for text, s in zip(TEXTS, engine.score(TEXTS)):
        ids = tok(text).input_ids
        assert ids[0] == tok.bos_token_id and s.token_ids == tuple(ids)
        assert s.logprobs.shape == (len(ids) - 1, model.config.vocab_size) and s.logprobs.dtype == np.float32
        assert s.targets.dtype == np.int64 and s.targets.tolist() == ids[1:]
        np.testing.assert_allclose(np.exp(s.logprobs.astype(np.float64)).sum(axis=1), 1.0, atol=1e-5)
        assert s.n_bytes == len(text.encode("utf-8")) and s.first_nonfinite is None


def test_score_without_bos_does_not_count_the_first_tokens_bytes(tiny_lm):
    model, _ = tiny_lm
    tok = build_tokenizer()   # byte-level BPE that adds no special tokens
    engine = TorchEngine(model, tok, "cpu", "plain")
    texts = ["hello world", "status: pending", "héllo"]
    for text, s in zip(texts, engine.score(texts)):
        ids = tok(text).input_ids
        assert tok.bos_token_id not in ids and s.token_ids == tuple(ids) and len(s.targets) == len(ids) - 1
        first = tok.decode(ids[:1])
        assert text.startswith(first) and s.n_bytes == len(text.encode("utf-8")) - len(first.encode("utf-8"))
    (s,) = engine.score(["hello"])
    assert s.n_bytes == len("hello") - len(tok.decode(tok("hello").input_ids[:1]))
    (empty,) = engine.score([""])
    assert empty.token_ids == () and empty.n_bytes == 0 and empty.logprobs.shape == (0, model.config.vocab_size)


class SlowTokenizer:
    """A tokenizer without offset mappings (is_fast False): everything else delegated."""

    is_fast = False

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *args, **kwargs):
        return self._tok(*args, **kwargs)

    def __len__(self):
        return len(self._tok)


def test_score_without_offsets_counts_the_first_tokens_decoded_bytes(tiny_lm):
    model, tok = tiny_lm
    plain = build_tokenizer()
    texts = ["hello world", "héllo", "日本 x"]
    for t in (tok, plain):
        fast, slow = TorchEngine(model, t, "cpu").score(texts), TorchEngine(model, SlowTokenizer(t), "cpu").score(texts)
        assert [s.n_bytes for s in slow] == [s.n_bytes for s in fast]


def test_score_reports_the_first_nonfinite_position_without_raising(tiny_lm):
    model, tok = tiny_lm
    broken = copy.deepcopy(model)

    def nan_from_4(module, args, output):
        output[:, 4:] = float("nan")
        return output

    broken.lm_head.register_forward_hook(nan_from_4)
    (s,) = TorchEngine(broken, tok, "cpu", "tok").score([PROMPTS[2]])
    assert s.first_nonfinite == 4
    assert np.isfinite(s.logprobs[:4]).all() and np.isnan(s.logprobs[4:]).all()


# ------------------------------------------------------------------------------------ every quantized module

@pytest.mark.parametrize("recipe", ["bf16", "int8", "w8a8", "int4", "w4a8"])
def test_quantized_variants_stream_like_their_naive_reference(tiny_lm, recipe):
    from variantlab.variants.registry import get_recipe, parse_options
    model, tok = tiny_lm
    r = get_recipe(recipe)
    options = parse_options(r, {"group_size": 32} if "4" in recipe else {})
    variant = copy.deepcopy(model).to(r.load_dtype(options))
    r.apply(variant, options, "cpu")
    engine = TorchEngine(variant, tok, "cpu", "tok")
    requests = [req(i, max_new_tokens=6, stop=("\n",)) for i in range(3)]
    alone = [tokens_of(engine, [q])[0] for q in requests]
    assert tokens_of(engine, requests) == alone
    assert alone[2] == naive(variant, tok, requests[2])[0]
