"""Attention kernels without a model: linear attention's chunked, recurrent and quadratic forms agree;
banded sliding attention matches the naive masked softmax; the rolling cache never holds more than its
window and decodes exactly what a full recompute gives; the stability check reports what it measures."""
from __future__ import annotations

import math

import pytest
import torch

from variantlab.variants.attention_linear import (EPS, LinearStateLayer, feature_map, linear_attention_chunked,
                                                  linear_attention_naive, linear_attention_recurrent, normaliser)
from variantlab.variants.attention_sliding import RollingKVLayer, sliding_attention, sliding_attention_naive
from variantlab.variants.attention_stability import (StabilityVariant, attention_stability, default_variants,
                                                     relative_error)
from variantlab.variants.attention import AttentionOptions, parse_attention

B, H, HKV, D = 2, 4, 2, 8


def qkv(t, hkv=HKV, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, D, generator=g, dtype=dtype)
    k = torch.randn(B, hkv, t, D, generator=g, dtype=dtype)
    v = torch.randn(B, hkv, t, D, generator=g, dtype=dtype)
    return q, k, v


def left_padding(t, pads=(0, 3)):
    valid = torch.ones(B, t, dtype=torch.bool)
    for b, p in enumerate(pads):
        valid[b, :p] = False
    return valid


# ------------------------------------------------------------------------------------------ linear

@pytest.mark.parametrize("hkv", [H, HKV])
@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_linear_chunked_recurrent_and_naive_agree(hkv, chunk):
    q, k, v = qkv(19, hkv)
    valid = left_padding(19)
    ref = linear_attention_naive(q, k, v, valid, acc_dtype=torch.float64)
    chunked, (s1, z1) = linear_attention_chunked(q, k, v, valid, chunk=chunk, acc_dtype=torch.float64)
    recurrent, (s2, z2) = linear_attention_recurrent(q, k, v, valid, acc_dtype=torch.float64)
    torch.testing.assert_close(chunked, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(recurrent, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s1, s2)
    torch.testing.assert_close(z1, z2)
    assert s1.shape == (B, hkv, 1, D, D) and z1.shape == (B, hkv, 1, D)


def test_normaliser_is_the_row_sum_of_the_quadratic_form():
    q, k, v = qkv(11)
    den = normaliser(q, k, acc_dtype=torch.float64)
    a = (feature_map(q) @ feature_map(k).repeat_interleave(2, 1).transpose(-1, -2)).tril()
    torch.testing.assert_close(den, a.sum(-1))
    # the naive form divides by exactly this (+ EPS): out * (den + EPS) = A @ V
    out = linear_attention_naive(q, k, v, acc_dtype=torch.float64)
    torch.testing.assert_close(out * (den + EPS)[..., None], a @ v.repeat_interleave(2, 1))


def test_linear_padding_contributes_nothing():
    q, k, v = qkv(12)
    valid = left_padding(12, pads=(0, 5))
    padded = linear_attention_chunked(q, k, v, valid, chunk=4, acc_dtype=torch.float64)[0]
    alone = linear_attention_chunked(q[1:, :, 5:], k[1:, :, 5:], v[1:, :, 5:], chunk=4, acc_dtype=torch.float64)[0]
    torch.testing.assert_close(padded[1:, :, 5:], alone)
    assert torch.isfinite(padded).all()


def test_linear_state_layer_prefill_then_decode_matches_one_pass():
    q, k, v = qkv(20, dtype=torch.float32)
    whole = linear_attention_naive(q, k, v)
    layer = LinearStateLayer(chunk=8, acc_dtype=torch.float32)
    parts = [layer.attend(q[:, :, :13], k[:, :, :13], v[:, :, :13], None)]
    bytes_after_prefill = layer.nbytes()
    for t in range(13, 20):
        parts.append(layer.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], None))
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=1e-5, atol=1e-6)
    assert layer.get_seq_length() == 20
    assert layer.nbytes() == bytes_after_prefill == B * HKV * (D * D + D) * 4  # constant: no per-token growth


def test_linear_state_in_fp16_overflows_where_fp32_does_not():
    # head_dim 64, unit-scale keys: the normaliser phi(q)·z grows ~ 64 · 1.2^2 · T and passes fp16's 65504
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 1, 2, 2048, 64, generator=g, dtype=torch.float64)
    ref = linear_attention_chunked(q, k, v, acc_dtype=torch.float64)[0]
    half = [x.half() for x in (q, k, v)]
    assert relative_error(linear_attention_chunked(*half, acc_dtype=torch.float32)[0], ref)[0] < 2e-3
    err, status = relative_error(linear_attention_chunked(*half, acc_dtype=torch.float16)[0], ref)
    assert status != "ok" or err > 0.05


# ------------------------------------------------------------------------------------------ sliding

@pytest.mark.parametrize("window,block", [(1, None), (3, 4), (5, 2), (50, None)])
def test_banded_sliding_matches_naive(window, block):
    q, k, v = qkv(17)
    valid = left_padding(17)
    fast = sliding_attention(q, k, v, window, D ** -0.5, valid, block=block)
    ref = sliding_attention_naive(q, k, v, window, D ** -0.5, valid)
    torch.testing.assert_close(fast, ref)
    # the last T queries of N keys (a prefill continuing a cache)
    fast = sliding_attention(q[:, :, 9:], k, v, window, D ** -0.5, valid, block=block)
    torch.testing.assert_close(fast, ref[:, :, 9:])


def test_sliding_with_a_window_as_long_as_the_sequence_is_causal_softmax():
    q, k, v = qkv(16)
    full = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                            is_causal=True)
    torch.testing.assert_close(sliding_attention(q, k, v, 16, D ** -0.5), full)


@pytest.mark.parametrize("window", [1, 4, 6])
@pytest.mark.parametrize("steps", [(9, 1, 1, 1, 1, 1, 1, 1), (2, 1, 1, 5, 1, 3, 1, 1, 1, 1), (3, 7, 1, 1, 4)])
def test_rolling_cache_never_exceeds_window_and_matches_recompute(window, steps):
    t = sum(steps)
    q, k, v = qkv(t)
    valid = left_padding(t, pads=(0, 2))
    ref = sliding_attention_naive(q, k, v, window, D ** -0.5, valid)
    layer, outs, pos = RollingKVLayer(window), [], 0
    for n in steps:
        sl = slice(pos, pos + n)
        outs.append(layer.attend(q[:, :, sl], k[:, :, sl], v[:, :, sl], valid[:, sl], D ** -0.5))
        pos += n
        assert layer.keys.shape[-2] == min(pos, window) <= window
        assert layer.values.shape[-2] == layer.valid.shape[-1] == layer.keys.shape[-2]
        assert layer.get_seq_length() == pos
    torch.testing.assert_close(torch.cat(outs, dim=2), ref)


# ------------------------------------------------------------------------------------------ stability

def test_stability_rows_report_errors_nonfinite_and_flags():
    variants = [StabilityVariant("sdpa", parse_attention("sdpa")),
                StabilityVariant("linear fp16 state", parse_attention("linear"),
                                 AttentionOptions(linear_state_dtype="model"))]
    rows = attention_stability(variants, lengths=(64, 2048), dtypes=("fp32", "fp16"), heads=2, head_dim=64)
    by = {(r.variant, r.dtype, r.length): r for r in rows}
    assert len(rows) == 8
    assert by["sdpa", "fp32", 2048].rel_error < 1e-5 and by["sdpa", "fp32", 2048].status == "ok"
    assert by["linear fp16 state", "fp32", 2048].rel_error < 1e-5
    assert by["linear fp16 state", "fp16", 64].status == "ok"
    assert by["linear fp16 state", "fp16", 2048].flagged
    assert by["linear fp16 state", "fp16", 2048].status in ("overflow", "nan", "inf")  # the normaliser passes 65504
    assert all(r.to_json()["status"] == r.status for r in rows)


def test_relative_error_names_nan_and_inf():
    ref = torch.ones(3, dtype=torch.float64)
    assert relative_error(torch.tensor([1.0, math.nan, 1.0]), ref)[1] == "nan"
    assert relative_error(torch.tensor([1.0, math.inf, 1.0]), ref)[1] == "inf"
    assert relative_error(ref.float(), ref) == (0.0, "ok")


def test_default_stability_variants_cover_every_kind():
    kinds = {v.spec.kind for v in default_variants(4)}
    assert kinds == {"sdpa", "gqa", "linear", "sliding"}
