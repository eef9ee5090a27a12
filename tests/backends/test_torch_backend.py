"""The PyTorch backend (backends/torch_backend.py) on the tiny random model, fp32, CPU.

The KV-cache decode loop is checked against a naive greedy reference that recomputes the whole
sequence every step (no cache), and batches (left-padded) against one request at a time.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from variantlab.backends.torch_backend import TorchBackend, stop_token_ids

pytestmark = pytest.mark.model

# Different lengths, so a batch of them is left-padded; the short one tends to stop early.
PROMPTS = [
    "Q: hi\nA:",
    "a: 1\nQ: What is the a?\nA:",
    "order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA:",
    "hello world\n",
]
MAX_NEW = 8


@pytest.fixture(scope="module")
def backend(tiny_lm):
    model, tok = tiny_lm
    return TorchBackend(model, tok, "cpu", "tok")


def text_of(tok, tokens: list[int]) -> str:
    """What the backend reports as output text: special tokens dropped, cut at the first newline."""
    return tok.decode(tokens, skip_special_tokens=True).split("\n", 1)[0]


@torch.inference_mode()
def naive_greedy(model, tok, prompt: str, max_new_tokens: int, stop: frozenset[int]) -> list[int]:
    """Greedy decoding without a KV cache: the full sequence goes through the model every step."""
    ids = tok(prompt, add_special_tokens=True, return_tensors="pt").input_ids
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(model(input_ids=ids).logits[:, -1].argmax())
        tokens.append(nxt)
        if nxt in stop:
            break
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return tokens


def forced(model, token_id: int):
    """A copy of the model whose head always puts its maximum on token_id (zero weights, one-hot bias)."""
    m = copy.deepcopy(model)
    head = torch.nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[token_id] = 1.0
    m.lm_head = head
    return m.eval()


def newline_token(tok) -> int:
    return next(i for i in range(len(tok)) if tok.decode([i]) == "\n")


# --------------------------------------------------------------------------- generation

@pytest.mark.parametrize("prompt", PROMPTS)
def test_decode_loop_matches_naive_greedy_without_cache(backend, tiny_lm, prompt):
    model, tok = tiny_lm
    ref = naive_greedy(model, tok, prompt, MAX_NEW, backend.stop_ids)
    rec = backend.generate("r", prompt, MAX_NEW)
    assert rec.tokens_out == len(ref)
    assert rec.output_text == text_of(tok, ref)
    assert rec.tokens_in == len(tok(prompt).input_ids)


def test_batch_equals_one_at_a_time(backend, tiny_lm):
    _, tok = tiny_lm
    singles = [backend.generate(f"r{i}", p, MAX_NEW) for i, p in enumerate(PROMPTS)]
    batch = backend.generate_batch([f"r{i}" for i in range(len(PROMPTS))], PROMPTS, MAX_NEW)
    assert [r.request_id for r in batch] == [r.request_id for r in singles]
    for s, b in zip(singles, batch):
        assert (b.tokens_out, b.output_text, b.tokens_in) == (s.tokens_out, s.output_text, s.tokens_in)
    assert len({r.send_time for r in batch}) == 1   # one batch, one send time


def test_batch_equals_naive_reference_in_any_order(backend, tiny_lm):
    model, tok = tiny_lm
    prompts = PROMPTS[::-1]
    batch = backend.generate_batch([str(i) for i in range(len(prompts))], prompts, MAX_NEW)
    for p, b in zip(prompts, batch):
        ref = naive_greedy(model, tok, p, MAX_NEW, backend.stop_ids)
        assert (b.tokens_out, b.output_text) == (len(ref), text_of(tok, ref))


def test_token_times_are_ordered_and_bounded(backend):
    for rec in [backend.generate("r", p, MAX_NEW) for p in PROMPTS] + \
            backend.generate_batch(["a", "b", "c", "d"], PROMPTS, MAX_NEW):
        times = rec.token_times
        assert 1 <= len(times) <= MAX_NEW
        assert list(times) == sorted(times)
        assert rec.send_time <= times[0] and times[-1] <= rec.end_time
        assert rec.ok


def test_token_times_come_from_the_injected_clock(tiny_lm):
    model, tok = tiny_lm
    readings = iter(range(1, 10_000))
    backend = TorchBackend(model, tok, "cpu", "tok", clock=lambda: float(next(readings)))
    rec = backend.generate("r", PROMPTS[2], 3)
    # send, then one reading per token, then the end
    assert rec.send_time == 1.0
    assert rec.token_times == tuple(float(2 + k) for k in range(rec.tokens_out))
    assert rec.end_time == rec.token_times[-1] + 1.0


def test_max_new_tokens_one_gives_one_token(backend):
    assert backend.generate("r", PROMPTS[1], 1).tokens_out == 1
    assert [r.tokens_out for r in backend.generate_batch(["a", "b"], PROMPTS[:2], 1)] == [1, 1]


# --------------------------------------------------------------------------- stopping

def test_stop_tokens_are_eos_and_every_token_holding_a_newline(tiny_lm):
    _, tok = tiny_lm
    stop = stop_token_ids(tok)
    assert tok.eos_token_id in stop
    assert newline_token(tok) in stop
    assert stop == {tok.eos_token_id} | {i for i in range(len(tok)) if "\n" in tok.decode([i])}


@pytest.mark.parametrize("which", ["eos", "newline"])
def test_generation_stops_at_a_stop_token(tiny_lm, which):
    model, tok = tiny_lm
    token = tok.eos_token_id if which == "eos" else newline_token(tok)
    backend = TorchBackend(forced(model, token), tok, "cpu", "tok")
    rec = backend.generate("r", PROMPTS[1], MAX_NEW)
    assert rec.tokens_out == 1 and rec.output_text == ""   # the stop token counts, its text does not
    for rec in backend.generate_batch(["a", "b", "c"], PROMPTS[:3], MAX_NEW):
        assert rec.tokens_out == 1 and rec.output_text == ""


def test_no_output_text_holds_a_newline(backend):
    recs = [backend.generate("r", p, MAX_NEW) for p in PROMPTS]
    recs += backend.generate_batch([str(i) for i in range(len(PROMPTS))], PROMPTS, MAX_NEW)
    assert all("\n" not in r.output_text for r in recs)


def test_a_token_that_is_not_a_stop_token_runs_to_max_new_tokens(tiny_lm):
    model, tok = tiny_lm
    plain = next(i for i in range(len(tok)) if i not in stop_token_ids(tok) and tok.decode([i]).isalpha())
    backend = TorchBackend(forced(model, plain), tok, "cpu", "tok")
    rec = backend.generate("r", PROMPTS[0], 5)
    assert rec.tokens_out == 5 and rec.output_text == tok.decode([plain] * 5)


# --------------------------------------------------------------------------- scoring

def test_score_gives_normalised_logprobs_over_the_shifted_input(backend, tiny_lm):
    model, tok = tiny_lm
    texts = [PROMPTS[1] + " 1", "héllo — wörld"]
    scored = backend.score(texts)
    assert len(scored) == 2
    for text, s in zip(texts, scored):
        ids = tok(text, return_tensors="pt").input_ids[0].numpy()
        t = len(ids)
        assert s.logprobs.shape == (t - 1, model.config.vocab_size) and s.logprobs.dtype == np.float32
        assert s.targets.dtype == np.int64
        np.testing.assert_array_equal(s.targets, ids[1:])
        np.testing.assert_allclose(np.exp(s.logprobs.astype(np.float64)).sum(axis=1), 1.0, atol=1e-5)
        assert s.n_bytes == len(text.encode("utf-8"))

