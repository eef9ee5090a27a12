"""The continuous batch (serve/lane.py) against the naive generator, token for token: rows that join at
every step, leave, move when the cache compacts, shift right for a long newcomer, and resize."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.backends.test_torch_engine import naive
from variantlab.backends.base import GenerationRequest
from variantlab.backends.torch_engine import TorchEngine
from variantlab.serve.lane import Lane, Row, bucket_rows, continuous_batching_refusal
from variantlab.serve.sampling import SamplingParams

pytestmark = pytest.mark.model


@dataclass(frozen=True)
class Req:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()


def reference(model, tok, prompt_ids, n) -> list[int]:
    return naive(model, tok, GenerationRequest("r", prompt_ids=tuple(prompt_ids), max_new_tokens=n,
                                               stop_on_eos=False))[0]


def drive(lane: Lane, arrivals: list[tuple[int, Req]], groups_of: int = 2) -> dict[str, list[int]]:
    """Run the lane until every request has its tokens; `arrivals`: (step at which it may join, request)."""
    out: dict[str, list[int]] = {}
    pending = sorted(arrivals, key=lambda a: a[0])
    step = 0
    while pending or lane.busy:
        ready = [r for s, r in pending if s <= step][:min(groups_of, lane.capacity())]
        if ready and lane.group is None:
            pending = [(s, r) for s, r in pending if r not in ready]
            lane.start_group(ready)
        if lane.group is not None and lane.prefill_chunk():
            for row, tok in lane.join(lambda req, gen, first: Row(req, None, gen, 0, 0, first)):
                row.tokens.append(tok)
        finished = []
        for row, tok in (lane.step() if lane.n_active else []):
            row.tokens.append(tok)
        for row in [r for r in lane.rows if r is not None and len(r.tokens) >= r.request.max_new_tokens]:
            out[row.request.request_id] = row.tokens[:row.request.max_new_tokens]
            finished.append(row)
        for row in finished:
            lane.release(row)
        step += 1
    return out


@pytest.fixture
def engine(tiny_lm):
    model, tok = tiny_lm
    return TorchEngine(model, tok, "cpu")


def prompts(engine, n):
    texts = ["order_id: ORD-5493\ncustomer: Priya", "hello world", "[{\"invoice\":\"INV-65887\"", "Q: what A:",
             "status: pending\nQ: What is the status?\nA:"]
    return [tuple(engine.encode(texts[i % len(texts)] * (1 + i % 3))) for i in range(n)]


def test_staggered_joins_give_each_request_its_naive_greedy_tokens(engine, tiny_lm):
    model, tok = tiny_lm
    ids = prompts(engine, 9)
    reqs = [Req(str(i), p, 6 + i % 5) for i, p in enumerate(ids)]
    lane = Lane("fp32", engine, max_rows=8, max_len=128, chunk=8)      # chunked prefill: 8 positions a step
    got = drive(lane, [(2 * i, r) for i, r in enumerate(reqs)])
    for r in reqs:
        assert got[r.request_id] == reference(model, tok, r.prompt_ids, r.max_new_tokens), r.request_id


def test_compaction_and_right_shifts_keep_every_sequence_exact(engine, tiny_lm):
    """A small cache (2 × 48 slots, rounded up to 128) forces compaction after ~110 steps; a newcomer longer
    than the write position forces a right shift; rows grow 1 → 2 → 4 and shrink back."""
    model, tok = tiny_lm
    ids = prompts(engine, 40)
    reqs = [Req(str(i), p[:40], 8) for i, p in enumerate(ids)]
    lane = Lane("fp32", engine, max_rows=4, max_len=48, chunk=64)
    moves = []
    for name in ("_compact", "_shift_right", "_fit"):
        orig = getattr(lane, name)
        setattr(lane, name, lambda *a, _o=orig, _n=name: (moves.append(_n), _o(*a))[1])
    got = drive(lane, [(3 * i, r) for i, r in enumerate(reqs)], groups_of=1)
    assert {"_compact", "_shift_right", "_fit"} <= set(moves)
    for r in reqs:
        assert got[r.request_id] == reference(model, tok, r.prompt_ids, r.max_new_tokens), r.request_id
    assert len(lane.rows) == 1 and lane.n_active == 0


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(engine):
    ids = prompts(engine, 4)
    sampled = Req("s", ids[0], 10, SamplingParams(temperature=0.8, top_p=0.9, seed=7))
    alone = drive(Lane("a", engine, max_rows=4, max_len=128), [(0, sampled)])
    others = [Req(str(i), p, 10, SamplingParams(temperature=1.0, seed=i)) for i, p in enumerate(ids[1:])]
    batched = drive(Lane("b", engine, max_rows=4, max_len=128), [(0, r) for r in [*others, sampled]], groups_of=4)
    assert alone["s"] == batched["s"]


def test_buckets_and_refusals(tiny_lm):
    assert [bucket_rows(n, 32) for n in (0, 1, 2, 3, 5, 9, 33)] == [1, 1, 2, 4, 8, 16, 32]
    model, _ = tiny_lm
    assert continuous_batching_refusal(model) is None


def test_models_with_their_own_cache_layers_are_refused_with_the_reason(tiny_lm):
    import copy

    from variantlab.variants.attention import apply_attention, parse_attention
    model, tok = tiny_lm
    linear = copy.deepcopy(model)
    apply_attention(linear, parse_attention("linear"))
    reason = continuous_batching_refusal(linear)
    assert reason is not None and "linear or sliding" in reason
    with pytest.raises(ValueError, match="cannot be served with continuous batching"):
        Lane("lin", TorchEngine(linear, tok, "cpu"))


def test_a_token_budget_splits_a_group_prefill_into_narrower_chunks_and_stays_exact(engine, tiny_lm):
    model, tok = tiny_lm
    reqs = [Req(str(i), p, 5) for i, p in enumerate(prompts(engine, 4))]
    lane = Lane("fp32", engine, max_rows=4, max_len=128, chunk=64)
    lane.start_group(reqs)
    chunks = 1
    while not lane.prefill_chunk(max_tokens=8):               # 4 rows × 2 positions a chunk
        chunks += 1
    assert chunks == -(-lane.group.width // 2)
    got = {}
    for row, first in lane.join(lambda req, gen, first: Row(req, None, gen, 0, 0, first)):
        row.tokens.append(first)
    while lane.n_active:
        for row, t in lane.step():
            row.tokens.append(t)
            if len(row.tokens) == 5:
                got[row.request.request_id] = row.tokens
                lane.release(row)
    for r in reqs:
        assert got[r.request_id] == reference(model, tok, r.prompt_ids, 5)
