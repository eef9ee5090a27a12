"""Our decode kernels (variants/kernels) against their plain-PyTorch references (kernels/packing.py),
on odd shapes: every M from 1 to 9 (9: two chunks of 8 rows), N not a multiple of the row block, K
with a tail, bf16 and fp32 activations, three group sizes. The packings invert exactly."""
from __future__ import annotations

import pytest
import torch

from variantlab.variants import kernels as vk
from variantlab.variants import quant_packing as qp
from variantlab.variants.kernels import _build
from variantlab.variants.kernels import packing as kp

SHAPES = [(1, 64, 16), (2, 96, 40), (3, 256, 100), (5, 128, 17), (8, 192, 48), (9, 64, 33)]


def _close(out, ref, dtype):
    """fp32: summation order only. bf16 outputs: one rounding of the result (2^-8 relative)."""
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    scale = ref.float().abs().max().clamp(min=1e-6)
    limit = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert ((out.float() - ref.float()).abs().max() / scale).item() <= limit


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_float_gemv_equals_the_reference(our_kernels, m, k, n):
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    _close(vk.fp32_mm(x, w), kp.fp32_mm_reference(x, w), torch.float32)
    xb, wb = x.bfloat16(), w.bfloat16()
    _close(vk.bf16_mm(xb, wb), kp.bf16_mm_reference(xb, wb), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_int8_kernels_equal_the_reference(our_kernels, m, k, n, dtype):
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g)
    q, s = qp.quantize_int8_per_channel(w, dtype)
    _close(vk.int8_mm(x, q, s), kp.int8_mm_reference(x, q, s), dtype)
    _close(vk.w8a8_mm(x, q, s), kp.w8a8_mm_reference(x, q, s), dtype)
    _close(vk.int8_digits_mm(x, q, s), kp.int8_digits_mm_reference(x, q, s), dtype)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_two_digit_activations_are_as_close_as_bf16_ones(our_kernels, m, k, n):
    """int8 weights × bf16 x through two int8 digits a value: off the exact product by no more than bf16's own
    rounding of x and of the result."""
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    x[:, 0] *= 20                                               # an outlier: the digits' scale is set by it
    q, s = qp.quantize_int8_per_channel(w, torch.float32)
    exact = kp.int8_mm_reference(x.double(), q, s.double())
    digits = vk.int8_digits_mm(x.bfloat16(), q, s.bfloat16()).double()
    as_bf16 = kp.int8_mm_reference(x.bfloat16().double(), q, s.bfloat16().double()).bfloat16().double()
    scale = exact.abs().max()
    assert (digits - exact).abs().max() <= 1.5 * (as_bf16 - exact).abs().max() + 1e-6 * scale


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n", [(1, 16), (3, 40), (8, 17), (9, 48)])
def test_int4_kernels_equal_the_reference(our_kernels, m, n, dtype, group_size):
    k = 256
    g = torch.Generator().manual_seed(m * n + group_size)
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g)
    q, s, z = qp.quantize_int4_groupwise(w, group_size, dtype)
    sz = kp.pack_scales_zeros(s, z)
    _close(vk.int4_mm(x, kp.pack_int4_bf16(q), sz, group_size, n), kp.int4_mm_reference(x, q, s, z, group_size), dtype)
    _close(vk.w4a8_mm(x, kp.pack_int4_vnni(q), sz, group_size, n),
           kp.w4a8_mm_reference(x, q, s, z, group_size), dtype)
    _close(vk.int4_digits_mm(x, kp.pack_int4_vnni(q), sz, group_size, n),
           kp.int4_digits_mm_reference(x, q, s, z, group_size), dtype)


@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("m,n", [(1, 16), (3, 40), (9, 48)])
def test_symmetric_int4_reads_the_scales_alone(our_kernels, m, n, group_size):
    """Symmetric int4 (z = 0) packs the scales alone; w4a8_mm and int4_digits_mm tell it by size and equal
    the reference, and the zeros-present layout of the same weights."""
    k = 256
    g = torch.Generator().manual_seed(m * n + group_size)
    x, w = torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g)
    q, s, z = qp.quantize_int4_groupwise(w, group_size, torch.bfloat16, symmetric=True)
    p, alone, both = kp.pack_int4_vnni(q), kp.pack_scales_zeros(s, None), kp.pack_scales_zeros(s, z)
    assert alone.numel() * 2 == both.numel()
    for op, ref in ((vk.w4a8_mm, kp.w4a8_mm_reference), (vk.int4_digits_mm, kp.int4_digits_mm_reference)):
        y = op(x, p, alone, group_size, n)
        _close(y, ref(x, q, s, z, group_size), torch.bfloat16)
        assert torch.equal(y, op(x, p, both, group_size, n))
    with pytest.raises(RuntimeError, match="the scales alone"):
        vk.w4a8_mm(x, p, alone[:-1].contiguous(), group_size, n)


@pytest.mark.parametrize("n", [16, 17, 40])
def test_packings_invert_exactly(n):
    g = torch.Generator().manual_seed(n)
    q = torch.randint(0, 16, (n, 64), generator=g, dtype=torch.uint8)
    assert torch.equal(kp.unpack_int4_bf16(kp.pack_int4_bf16(q), n), q)
    assert torch.equal(kp.unpack_int4_vnni(kp.pack_int4_vnni(q), n), q)
    s, z = torch.randn(n, 2, generator=g), torch.randn(n, 2, generator=g)
    s2, z2 = kp.unpack_scales_zeros(kp.pack_scales_zeros(s, z), n)
    assert torch.equal(s2, s) and torch.equal(z2, z)
    s3, z3 = kp.unpack_scales_zeros(kp.pack_scales_zeros(s, None), n)
    assert torch.equal(s3, s) and not z3.any()
    assert kp.pack_int4_vnni(q).numel() == kp.padded_rows(n) * 64 // 2   # 4 bits a weight, rows padded to 16


def test_bad_input_is_one_clear_error(our_kernels):
    x = torch.randn(1, 64)
    with pytest.raises(RuntimeError, match="x is \\[M, K\\], w is \\[N, K\\]"):
        vk.fp32_mm(x, torch.randn(8, 32))
    with pytest.raises(RuntimeError, match="must be bf16"):
        vk.bf16_mm(x, torch.randn(8, 64))


def test_the_ops_trace_under_fake_tensors(our_kernels):
    """The registered fake implementations give shapes, so torch.compile can trace through the ops."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x, w = torch.empty(2, 64), torch.empty(24, 64)
        assert vk.fp32_mm(x, w).shape == (2, 24)
        p = torch.empty(2, 64 * 8, dtype=torch.uint8)
        assert vk.int4_mm(x, p, torch.empty(2, 1, 2, 16), 64, 20).shape == (2, 20)


def test_why_they_cannot_run_is_said_before_any_compiling(monkeypatch):
    monkeypatch.delenv(_build.SWITCH, raising=False)
    assert _build.missing_requirement(flags=set()).startswith("the CPU lacks avx2, fma, f16c")
    assert _build.missing_requirement(flags={"avx2", "f16c", "avx512f"}).startswith("the CPU lacks fma (")
    monkeypatch.setenv(_build.SWITCH, "0")
    assert _build.missing_requirement() == f"switched off ({_build.SWITCH}=0)"


def test_each_cpu_builds_the_first_instruction_set_it_has():
    """AVX-512 with BF16 and VNNI takes gemv_avx512.cpp; AVX2 + FMA (an AVX-512 CPU without VNNI too) gemv_avx2.cpp."""
    avx2 = {"avx2", "fma", "f16c"}
    assert _build.isa_for(avx2 | set(_build.AVX512.cpu_flags)) is _build.AVX512
    assert _build.isa_for(avx2 | {"avx512f", "avx512bw", "avx512vl"}) is _build.AVX2
    assert _build.isa_for(avx2) is _build.AVX2
    assert _build.isa_for({"avx2", "f16c"}) is None
    assert _build.isa_for(avx2).source.name == "gemv_avx2.cpp"
    ext = _build.AVX2.extension()   # one library: the ISA's kernels, the ops over them, the decode step
    assert [s.name for s in ext.sources] == ["gemv_avx2.cpp", "decode_step.cpp", "ops.cpp"]
    assert {h.name for h in ext.headers} == {"vk.h", "common.h"} and "-mavx2" in ext.cflags


def test_an_avx512_host_told_avx2_runs_what_an_avx2_machine_runs(monkeypatch):
    """VARIANTLAB_ISA (issue 50: A/A on both instruction sets, on one host): a name we have kernels for keeps that
    one alone; a name we lack says so, naming what is accepted, and our kernels stay off."""
    both = {"avx2", "fma", "f16c", *_build.AVX512.cpu_flags}
    assert _build.isa_for(both, "avx2") is _build.AVX2
    assert _build.isa_for(both, "AVX-512") is _build.AVX512 and _build.isa_for(both, "avx512") is _build.AVX512
    assert _build.isa_for({"avx2", "fma", "f16c"}, "avx-512") is None
    monkeypatch.setenv(_build.ISA_SWITCH, "avx2")
    assert _build.forced_isa() == "avx2" and _build.unknown_isa() is None
    assert _build.missing_requirement(flags={"avx2", "f16c", "fma"}) in (None, "no C++ compiler (c++ not on PATH)",
                                                                           "ninja is not installed (pip install ninja)")
    monkeypatch.setenv(_build.ISA_SWITCH, "avx-512")
    assert _build.missing_requirement(flags={"avx2", "f16c", "fma"}) == \
        f"{_build.ISA_SWITCH}=avx-512 asks for kernels this CPU lacks the instructions of"
    monkeypatch.setenv(_build.ISA_SWITCH, "sse4")
    assert _build.missing_requirement(flags=both) == (f"{_build.ISA_SWITCH}='sse4' names no instruction set we have "
                                                       "kernels for (accepted: avx-512, avx2, or unset for the best "
                                                       "this CPU has)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,h,hkv,length,d", [(1, 12, 12, 128, 64), (3, 4, 2, 40, 24), (2, 8, 1, 256, 128)])
def test_decode_attention_equals_sdpa(our_kernels, dtype, b, h, hkv, length, d):
    """Grouped heads, a head dim with a tail (24), masked positions skipped, no mask = all positions."""
    g = torch.Generator().manual_seed(length)
    q = torch.randn(b, 1, h, d, generator=g).to(dtype).transpose(1, 2)     # HF's query: [B, H, 1, D], strided
    k, v = (torch.randn(b, hkv, length, d, generator=g).to(dtype) for _ in range(2))
    keep = torch.rand(b, length, generator=g) < 0.7
    keep[:, 0] = True
    padded = torch.arange(length) >= length // 3             # left padding: whole blocks of 16 kept, and not
    kf, vf = (t.float().repeat_interleave(h // hkv, dim=1) for t in (k, v))
    for mask in (keep, padded.expand(b, length), None):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), kf, vf, attn_mask=None if mask is None else mask[:, None, None, :]).transpose(1, 2)
        _close(vk.decode_attention(q, k, v, mask, d ** -0.5), ref.to(dtype), dtype)


def test_every_file_a_build_reads_is_in_its_key_and_ships_in_the_package():
    """Each source's own #include "…" is one of the extension's headers (so an edited header makes a new build
    folder, _cache.build_key), and every source and header matches pyproject's package-data (a wheel has them)."""
    import fnmatch
    import re
    import tomllib
    from pathlib import Path

    import variantlab

    pkg = Path(variantlab.__file__).parent
    pyproject = pkg.parents[1] / "pyproject.toml"
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["variantlab"]
    for isa in _build.ISAS:
        ext = isa.extension()
        headers = {h.name for h in ext.headers}
        for f in (*ext.sources, *ext.headers):
            assert set(re.findall(r'#include "([^"]+)"', f.read_text())) <= headers, f.name
            assert any(fnmatch.fnmatch(f.relative_to(pkg).as_posix(), p) for p in patterns), f.name
