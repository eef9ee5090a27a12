"""The AVX-512 kernels (gemv_avx512.cpp) run and equal their references on a CPU without AVX-512: on an emulated
Sapphire Rapids core (tests/variants/avx512_emulator.py, bochscpu), through avx512_harness.cpp. A host builds and
runs only its own instruction set's kernels (test_kernels.py there), so without this an edit to the AVX-512 source
made on an AVX2 host would be compiled (test_kernel_cache.py) but never run until an AVX-512 CPU ran it. The cases
are test_kernels.py's: every M from 1 to 9, odd N, K with a tail, fp32 and bf16, three group sizes."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.variants.test_kernels import SHAPES, _close
from variantlab.variants import quant_packing as qp
from variantlab.variants.kernels import _build
from variantlab.variants.kernels import packing as kp

HARNESS = Path(__file__).parent / "avx512_harness.cpp"


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """The harness built for AVX-512 (-DVK_SERIAL: one thread, no calls out) and loaded into the emulated core."""
    if importlib.util.find_spec("bochscpu") is None:
        pytest.skip("bochscpu-python (the test extra, on x86-64 Linux) emulates the CPU: not installed")
    from torch.utils import cpp_extension

    from tests.variants.avx512_emulator import Machine
    cxx = shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    work = tmp_path_factory.mktemp("avx512")
    includes = [f for p in (*cpp_extension.include_paths(), sysconfig.get_paths()["include"]) for f in ("-isystem", p)]
    flags = [f for f in _build.AVX512.cflags if f != "-fopenmp"]
    lib = work / "harness.so"
    done = subprocess.run([cxx, "-std=c++17", "-fPIC", "-shared", "-Wl,-Bsymbolic", "-DVK_SERIAL", *includes,
                           f"-I{_build.HERE}", *flags, str(HARNESS), "-o", str(lib)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the AVX-512 harness does not compile:\n{done.stderr[-4000:]}"
    return Machine(lib, work)


@pytest.fixture
def run(cpu):
    cpu.reset()
    return cpu


def test_the_emulated_cpu_has_every_instruction_set_the_kernels_are_built_for(cpu):
    assert set(_build.AVX512.cpu_flags) <= cpu.features()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_float_gemv_equals_the_reference(run, m, k, n):
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    y = run.alloc(m * n * 4)
    run.call("vke_fp32", run.put(x), run.put(w), m, k, n, y)
    _close(run.take(y, (m, n), torch.float32), kp.fp32_mm_reference(x, w), torch.float32)
    xb, wb = x.bfloat16(), w.bfloat16()
    run.call("vke_bf16", run.put(xb), run.put(wb), m, k, n, y)
    _close(run.take(y, (m, n), torch.bfloat16), kp.bf16_mm_reference(xb, wb), torch.bfloat16)


def _int8_op(run, x, q, s, sums, digits):
    m, k = x.shape
    n = q.shape[0]
    bf16 = x.dtype == torch.bfloat16
    y, xq, a = run.alloc(m * n * 4), run.alloc((2 if digits else 1) * m * ((k + 63) // 64 * 64)), run.alloc(4 * m)
    run.call("vke_w8a8", run.put(x), run.put(q), run.put(s), run.put(sums) if sums is not None else 0, m, k, n, y,
             int(bf16), int(digits), xq, a)
    return run.take(y, (m, n), x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_int8_kernels_equal_the_reference(run, m, k, n, dtype):
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g)
    q, s = qp.quantize_int8_per_channel(w, dtype)
    y = run.alloc(m * n * 4)
    run.call("vke_int8", run.put(x.float()), run.put(q), run.put(s), m, k, n, y, int(dtype == torch.bfloat16))
    _close(run.take(y, (m, n), dtype), kp.int8_mm_reference(x, q, s), dtype)
    sums = q.to(torch.int32).sum(1).to(torch.int32)
    for digits, ref in ((False, kp.w8a8_mm_reference), (True, kp.int8_digits_mm_reference)):
        summed_here = _int8_op(run, x, q, s, None, digits)
        _close(summed_here, ref(x, q, s), dtype)
        assert torch.equal(_bits(summed_here), _bits(_int8_op(run, x, q, s, sums, digits)))   # Σ q given: the same


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n", [(1, 16), (3, 40), (8, 17), (9, 48)])
def test_int4_kernels_equal_the_reference(run, m, n, dtype, group_size):
    """x, y and the scales in dtype, as a variant of that compute dtype has them (int4_mm's fp32 x: two bf16 rows,
    summed by the op around the kernel; here its bf16 rows)."""
    k = 256
    g = torch.Generator().manual_seed(m * n + group_size)
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g)
    q, s, z = qp.quantize_int4_groupwise(w, group_size, dtype)
    sz = kp.pack_scales_zeros(s, z)
    n16 = kp.padded_rows(n)
    xb = x.bfloat16()
    yf = run.alloc(m * n16 * 4)
    run.call("vke_int4", run.put(xb), run.put(kp.pack_int4_bf16(q)), run.put(sz), int(dtype == torch.bfloat16), m, k,
             group_size, n16, yf, run.alloc(4 * m * (k // group_size)))
    ref = kp.int4_mm_reference(xb.float(), q, s, z, group_size)
    _close(run.take(yf, (m, n16), torch.float32)[:, :n], ref, torch.float32)
    for digits, reference in ((0, kp.w4a8_mm_reference), (1, kp.int4_digits_mm_reference)):
        _close(_w4a8(run, x, kp.pack_int4_vnni(q), sz, True, group_size, n, digits), reference(x, q, s, z, group_size),
               dtype)


def _w4a8(run, x, packed, sz, zeros, group_size, n, digits):
    m, k = x.shape
    rows, n16 = (2 if digits else 1) * m, kp.padded_rows(n)
    y = run.alloc(m * n * 4)
    run.call("vke_w4a8", run.put(x), run.put(packed), run.put(sz), int(sz.dtype == torch.bfloat16), int(zeros), m, k,
             group_size, n, n16, y, int(x.dtype == torch.bfloat16), digits, run.alloc(rows * k), run.alloc(4 * m),
             run.alloc(4 * rows * (k // group_size)), run.alloc(4 * rows * n16))
    return run.take(y, (m, n), x.dtype)


@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("m,n", [(1, 16), (3, 40), (9, 48)])
def test_symmetric_int4_reads_the_scales_alone(run, m, n, group_size):
    k = 256
    g = torch.Generator().manual_seed(m * n + group_size)
    x, w = torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g)
    q, s, z = qp.quantize_int4_groupwise(w, group_size, torch.bfloat16, symmetric=True)
    p, alone, both = kp.pack_int4_vnni(q), kp.pack_scales_zeros(s, None), kp.pack_scales_zeros(s, z)
    for digits, reference in ((0, kp.w4a8_mm_reference), (1, kp.int4_digits_mm_reference)):
        y = _w4a8(run, x, p, alone, False, group_size, n, digits)
        _close(y, reference(x, q, s, z, group_size), torch.bfloat16)
        assert torch.equal(y, _w4a8(run, x, p, both, True, group_size, n, digits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h,hkv,length,lmax,d,masked", [(12, 12, 128, 128, 64, False), (4, 2, 40, 64, 24, True),
                                                         (8, 1, 256, 300, 128, True), (2, 2, 7, 16, 16, False)])
def test_decode_attention_equals_sdpa(run, dtype, h, hkv, length, lmax, d, masked):
    g = torch.Generator().manual_seed(h * length + d)
    q = torch.randn(h, d, generator=g).to(dtype)
    k, v = torch.randn(hkv, lmax, d, generator=g).to(dtype), torch.randn(hkv, lmax, d, generator=g).to(dtype)
    keep = torch.rand(length, generator=g) > 0.3 if masked else torch.ones(length, dtype=torch.bool)
    keep[0] = True
    scale = d ** -0.5
    out = run.alloc(h * d * 4)
    run.call("vke_attention", run.put(q), run.put(k), run.put(v), h, hkv, length, lmax, d,
             run.put(keep) if masked else 0, run.put(torch.tensor([scale])), run.alloc(4 * length), out,
             int(dtype == torch.bfloat16))
    kk, vv = (t[:, :length].float().repeat_interleave(h // hkv, 0) for t in (k, v))
    ref = F.scaled_dot_product_attention(q.float()[:, None], kk, vv, attn_mask=keep[None, None], scale=scale)
    _close(run.take(out, (h, d), dtype), ref[:, 0].to(dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [16, 45, 1000])
def test_silu_times_up_rounds_as_transformers_does(run, dtype, n):
    g = torch.Generator().manual_seed(n)
    gate, up = (torch.randn(n, generator=g) * 4).to(dtype), torch.randn(n, generator=g).to(dtype)
    at = run.put(gate)
    run.call("vke_silu_mul", at, run.put(up), n, int(dtype == torch.bfloat16))
    _close(run.take(at, (n,), dtype), F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,d", [(1, 64), (3, 896), (9, 100)])
def test_rms_norm_equals_llamas(run, dtype, m, d):
    g = torch.Generator().manual_seed(m * d)
    h, w = torch.randn(m, d, generator=g).to(dtype), (1 + torch.randn(d, generator=g) / 4).to(dtype)
    eps = 1e-6
    out = run.alloc(m * d * 4)
    run.call("vke_rms_norm", run.put(h), run.put(w), m, d, run.put(torch.tensor([eps])), out,
             int(dtype == torch.bfloat16))
    hf = h.float()
    ref = w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    _close(run.take(out, (m, d), dtype), ref, dtype)


def test_what_the_emulator_cannot_run_is_one_clear_error_and_never_hangs(run, monkeypatch):
    """A function the library lacks, memory outside its buffers (named with its address), and a function that does
    not return within the bound (the watchdog stops the emulated core) each raise EmulationError; the core runs
    the next call as before."""
    from tests.variants import avx512_emulator
    from tests.variants.avx512_emulator import EmulationError
    with pytest.raises(EmulationError, match="defines no vke_nothing"):
        run.call("vke_nothing")
    with pytest.raises(EmulationError, match=r"vke_fp32: page fault .* at address 0x8 "):
        run.call("vke_fp32", 8, 8, 1, 64, 16, 8)   # x at address 8: unmapped
    monkeypatch.setattr(avx512_emulator, "MAX_SECONDS", 1.0)
    with pytest.raises(EmulationError, match="vke_spin did not return within 1 s"):
        run.call("vke_spin", run.alloc(4))   # the flag stays 0
    flag = run.put(torch.ones(1, dtype=torch.int32))
    run.call("vke_spin", flag)
