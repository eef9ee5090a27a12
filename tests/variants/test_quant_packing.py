"""Quantization formats and kernels, no model: round-trip bounds and every kernel path against
the dequantized reference (variants/quant_packing.py, variants/quant_linear.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import switch_off_our_kernels
from variantlab.variants import quant_linear as ql
from variantlab.variants import quant_packing as qp

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ROWS = [1, 7, 64]


def _weight(n=48, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0] = 0.0               # an all-zero row (and all-zero groups)
    w[1, :128] = 0.3         # constant groups
    w[2, 64:128] = -5.0      # a constant group far from zero
    w[3, :32] = 1e-30        # a range far below any scale's resolution
    return w


def _ulp(dtype):
    return torch.finfo(dtype).eps  # relative rounding step of the storage dtype (2**-7 bf16, 2**-10 fp16)


# --- round trips ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_per_channel_round_trip_is_within_half_a_step(dtype):
    w = _weight()
    q, s = qp.quantize_int8_per_channel(w, dtype)
    assert q.dtype == torch.int8 and s.dtype == dtype and q.abs().max() <= 127
    d = qp.dequantize_int8_per_channel(q, s)
    assert torch.isfinite(d).all()
    amax = w.abs().amax(1, keepdim=True)
    bound = s.float()[:, None] / 2 + amax * _ulp(dtype) + 1e-30
    assert ((d - w).abs() <= bound).all()
    assert (d[0] == 0).all()  # all-zero row: exact
    assert torch.allclose(d[1, :128], torch.full((128,), 0.3), rtol=2 * _ulp(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_groupwise_round_trip_is_within_half_a_step(dtype, group_size):
    w = _weight()
    q, s, z = qp.quantize_int4_groupwise(w, group_size, dtype)
    n, k = w.shape
    assert q.dtype == torch.uint8 and q.max() <= 15 and s.shape == z.shape == (n, k // group_size)
    d = qp.dequantize_int4_groupwise(q, s, z, group_size)
    assert torch.isfinite(d).all()
    step = s.float().repeat_interleave(group_size, 1)
    zero_err = (z.float().abs() * _ulp(dtype)).repeat_interleave(group_size, 1)
    assert ((d - w).abs() <= step / 2 + zero_err + 1e-30).all()
    assert (d[0] == 0).all()
    assert torch.allclose(d[2, 64:128], torch.full((64,), -5.0), rtol=2 * _ulp(dtype))
    # a random group really uses the grid: error well below the range/15 step on average
    assert (d[8:] - w[8:]).abs().mean() < 0.3 * s[8:].float().mean()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 128])
def test_symmetric_int4_is_q4_0s_grid(dtype, group_size):
    """Symmetric: no zero point; the group's value of largest magnitude lands on q = 0 (−8 steps) exactly up to
    the scale's rounding, the sign of that value is the scale's, and every other value is within half a step,
    or, on the grid's short side (7 steps), its distance past the last level."""
    w = _weight()
    q, s, z = qp.quantize_int4_groupwise(w, group_size, dtype, symmetric=True)
    n, k = w.shape
    assert not z.any() and q.max() <= 15
    d = qp.dequantize_int4_groupwise(q, s, z, group_size)
    assert torch.isfinite(d).all() and (d[0] == 0).all()
    step = s.float().abs().repeat_interleave(group_size, 1)
    past = w.abs() - 7 * step                      # beyond 7 steps from 0: only the extreme's side reaches 8
    assert ((d - w).abs() <= torch.maximum(step / 2, past) + w.abs() * _ulp(dtype) + 1e-30).all()
    assert (d[8:] - w[8:]).abs().mean() < 0.3 * step[8:].mean()
    wg = w.reshape(n, -1, group_size)
    at = wg.abs().argmax(-1, keepdim=True)
    extreme = wg.gather(-1, at).squeeze(-1)
    live = extreme.abs() / 8 >= torch.finfo(dtype).tiny   # else the smallest scale, and the group reads as 0
    assert (q.reshape(n, -1, group_size).gather(-1, at).squeeze(-1)[live] == 0).all()
    assert (torch.sign(s.float()[live]) == -torch.sign(extreme[live])).all()


def test_int4_rejects_a_group_size_that_does_not_divide():
    with pytest.raises(ValueError, match="does not divide"):
        qp.quantize_int4_groupwise(torch.randn(16, 96), 64)


def test_per_token_activation_quantization():
    x = torch.randn(5, 64)
    x[2] = 0.0
    q, a = qp.quantize_int8_per_token(x)
    assert q.dtype == torch.int8 and a.shape == (5, 1) and torch.isfinite(a).all()
    assert ((q.float() * a - x).abs() <= a / 2 + 1e-7).all()
    assert (q[2] == 0).all()
    assert torch.isfinite(qp.fake_quantize_int8_per_token(x.bfloat16()).float()).all()


def test_nibble_packing_round_trips():
    q = torch.randint(0, 16, (32, 64), dtype=torch.uint8)
    p = qp.pack_nibbles(q)
    assert p.shape == (32, 32) and p.dtype == torch.uint8
    assert torch.equal(qp.unpack_nibbles(p), q)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_group_major_int4_layout_round_trips(group_size):
    q = torch.randint(0, 16, (24, 256), dtype=torch.uint8)
    qg = qp.int4_group_major(q, group_size)
    assert qg.shape == (256 // group_size, 24, group_size) and qg.dtype == torch.int8 and qg.is_contiguous()
    assert torch.equal(qg[1, 5], q[5, group_size:2 * group_size].to(torch.int8) - 8)  # group g of row n, centred
    assert torch.equal(qp.int4_from_group_major(qg), q)


def test_prune_2_4_keeps_the_two_largest_of_every_four():
    w = torch.randn(8, 64)
    p = qp.prune_2_4(w)
    groups = (p != 0).reshape(8, 16, 4).sum(-1)
    assert (groups == 2).all()
    kept = p.reshape(8, 16, 4).abs().sort(-1).values[..., 2:]
    assert torch.equal(kept, w.reshape(8, 16, 4).abs().sort(-1).values[..., 2:])


# --- raw kernels against the dequantized reference ---------------------------------------------

@pytest.mark.parametrize("m", ROWS)
def test_weight_int8pack_mm_matches_reference(m):
    w = _weight()
    q, s = qp.quantize_int8_per_channel(w, torch.float32)
    x = torch.randn(m, w.shape[1])
    y = torch.ops.aten._weight_int8pack_mm(x, q, s)
    torch.testing.assert_close(y, x @ qp.dequantize_int8_per_channel(q, s).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_weight_int4pack_mm_for_cpu_matches_reference(m, group_size):
    """The kernel's zero convention is (q − 8)·s + z with scales_and_zeros [G, N, 2]."""
    w = _weight()
    q, s, z = qp.quantize_int4_groupwise(w, group_size, torch.float32)
    x = torch.randn(m, w.shape[1])
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, qp.pack_int4_for_cpu(q), group_size, qp.scales_and_zeros(s, z))
    ref = x @ qp.dequantize_int4_groupwise(q, s, z, group_size).T
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", ROWS)
def test_int_mm_is_exact(m):
    a = torch.randint(-127, 128, (m, 96), dtype=torch.int8)
    b = torch.randint(-127, 128, (40, 96), dtype=torch.int8)
    assert torch.equal(ql.int_mm(a, b.t()), a.int() @ b.int().t())


# --- modules: kernel path against the python (dequantize-every-call) path ------------------------

MODULES = [(ql.Int8WeightOnly, {}), (ql.W8A8, {}), (ql.Int4WeightOnly, {"group_size": 32}),
           (ql.Int4WeightOnly, {"group_size": 128}), (ql.W4A8, {"group_size": 64})]


def _linear(k=256, n=48, bias=True, seed=1):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(_weight(n, k, seed))
    return lin


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("cls,kw", MODULES)
def test_kernel_path_matches_python_path_in_fp32(cls, kw, m):
    lin = _linear()
    fast, ref = cls(lin, torch.float32, "kernel", **kw), cls(lin, torch.float32, "python", **kw)
    x = torch.randn(m, 256)
    torch.testing.assert_close(fast(x), ref(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls,kw", MODULES)
def test_kernel_path_matches_python_path_in_bf16_with_3d_input(cls, kw):
    lin = _linear()
    fast, ref = cls(lin, torch.bfloat16, "kernel", **kw), cls(lin, torch.bfloat16, "python", **kw)
    x = torch.randn(2, 7, 256, dtype=torch.bfloat16)
    y, r = fast(x), ref(x)
    assert y.shape == (2, 7, 48) and y.dtype == torch.bfloat16
    err = (y.float() - r.float()).abs().max()
    assert err <= 0.02 * r.float().abs().max()


@pytest.mark.parametrize("cls,kw", MODULES)
def test_quantized_layer_stays_close_to_the_fp32_layer(cls, kw):
    lin = _linear(bias=False)
    mod = cls(lin, torch.float32, "kernel", **kw)
    x = torch.randn(16, 256)
    ref = lin(x).detach()
    rel = (mod(x) - ref).norm() / ref.norm()
    assert rel < (0.02 if "int8" in cls.__name__.lower() or cls is ql.W8A8 else 0.15)


@pytest.mark.parametrize("cls", [ql.Int4WeightOnly, ql.W4A8])
@pytest.mark.parametrize("path", ["kernel", "python"])
def test_in_features_padded_to_the_group_size(cls, path):
    lin = _linear(k=200, n=40)  # 200 % 64 != 0; 40 % 16 != 0 (int4 CPU kernel pads N too)
    mod = cls(lin, torch.float32, path, group_size=64)
    assert mod.k_pad == 56 and any("zero-padded" in n for n in mod.notes)
    x = torch.randn(3, 200)
    ref = lin(x).detach()
    assert (mod(x) - ref).norm() / ref.norm() < 0.15
    other = cls(lin, torch.float32, "python" if path == "kernel" else "kernel", group_size=64)
    torch.testing.assert_close(mod(x), other(x), rtol=1e-4, atol=1e-4)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("ours", [False, True])
def test_int4_kernel_path_stores_four_bits_plus_scales(monkeypatch, ours):
    from variantlab.variants import kernels
    if not ours:
        switch_off_our_kernels(monkeypatch)
    elif not kernels.available():
        pytest.skip(kernels.status().reason)
    lin = _linear(k=256, n=64, bias=False)
    mod = ql.Int4WeightOnly(lin, torch.bfloat16, "kernel", group_size=64)
    nbytes = _nbytes(mod.state_dict().values())
    assert nbytes == 64 * 256 // 2 + (256 // 64) * 64 * 2 * 2  # packed nibbles + bf16 scale and zero per group
    assert 8 * nbytes / (64 * 256) == 4.5
    assert _nbytes(mod.buffers()) == nbytes  # either layout holds 4 bits a weight and the same scales
    if ours:   # stored as nibbles, scales and zeros; read by our int4_digits_mm in W4A8's packed layout
        assert set(mod.state_dict()) == {"qpacked", "scales", "zeros"}
        assert set(dict(mod.named_buffers())) == {"packed", "scales_zeros"}
    else:      # aten's layout is stored as it runs
        assert set(mod.state_dict()) == {"packed", "scales_and_zeros"}


@pytest.mark.parametrize("cls", ["Int4WeightOnly", "W4A8"])
@pytest.mark.parametrize("ours", [False, True])
def test_symmetric_int4_stores_no_zeros_and_loads_back(monkeypatch, cls, ours):
    """Symmetric int4 stores nibbles and scales (4.5 bits a weight at group 32, Q4_0's), reads them back bit
    identical through an artifact's route, and the kernel path agrees with the python one."""
    from variantlab.variants import kernels
    if not ours:
        switch_off_our_kernels(monkeypatch)
    elif not kernels.available():
        pytest.skip(kernels.status().reason)
    n, k = 64, 256
    lin = _linear(k=k, n=n, bias=True)
    mod = getattr(ql, cls)(lin, torch.bfloat16, "kernel", group_size=32, symmetric=True)
    stored = mod.state_dict()
    if cls == "W4A8" or ours:   # aten's own int4 layout (Int4WeightOnly without ours) is stored as it runs
        assert set(stored) == {"qpacked", "scales", "bias"}
        assert 8 * _nbytes([stored["qpacked"], stored["scales"]]) / (n * k) == 4.5
    if ours:
        assert mod.scales_zeros.numel() == n * k // 32   # the scales alone are resident too
    python = getattr(ql, cls)(lin, torch.bfloat16, "python", group_size=32, symmetric=True)
    assert python.zeros is None and set(python.state_dict()) == {"qpacked", "scales", "bias"}
    assert mod.state()["attrs"]["symmetric"] is True
    back = getattr(ql, cls).from_state(mod.state(), {key: t.to("meta") for key, t in stored.items()})
    result = back.load_state_dict(stored, assign=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(3, k, dtype=torch.bfloat16)
    assert torch.equal(mod(x), back(x))
    y, r = mod(x).float(), python(x).float()
    assert (y - r).abs().max() <= 0.02 * r.abs().max()


def test_an_int4_module_saved_before_symmetric_existed_loads_as_asymmetric():
    mod = ql.W4A8(_linear(k=256, n=32, bias=False), torch.bfloat16, "kernel", group_size=64)
    state = mod.state()
    del state["attrs"]["symmetric"]
    back = ql.W4A8.from_state(state, mod.state_dict())
    assert back.symmetric is False
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    assert torch.equal(mod(x), back(x))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_w4a8_stores_four_bits_and_holds_eight(aten_only, group_size):
    """Stored (state_dict): nibbles + scales and zeros, the python path's very tensors. Resident without
    our kernels: int8 per group, for torch._int_mm."""
    n, k = 64, 256
    lin = _linear(k=k, n=n, bias=False)
    mod = ql.W4A8(lin, torch.bfloat16, "kernel", group_size=group_size)
    stored = mod.state_dict()
    per_group = (k // group_size) * n * 2 * 2  # bf16 scale and zero per group
    assert _nbytes(stored.values()) == n * k // 2 + per_group
    assert 8 * _nbytes(stored.values()) / (n * k) == 4 + 32 / group_size
    assert _nbytes(mod.buffers()) == n * k + per_group
    reference = ql.W4A8(lin, torch.bfloat16, "python", group_size=group_size).state_dict()
    assert stored.keys() == reference.keys() == {"qpacked", "scales", "zeros"}
    for name, t in reference.items():
        assert stored[name].dtype == t.dtype and torch.equal(stored[name], t), name


@pytest.mark.parametrize("path", ["kernel", "python"])
@pytest.mark.parametrize("bias", [True, False])
def test_w4a8_loads_its_stored_form_back_bit_identical(path, bias):
    """from_state on meta tensors (the shapes), then load_state_dict(assign=True): what load_artifact does."""
    lin = _linear(k=200, n=40, bias=bias)  # padded K: 200 → 256
    mod = ql.W4A8(lin, torch.bfloat16, path, group_size=64)
    stored = mod.state_dict()
    back = ql.W4A8.from_state(mod.state(), {k: t.to("meta") for k, t in stored.items()})
    result = back.load_state_dict(stored, assign=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert not any(b.is_meta for b in back.buffers())
    mine, theirs = dict(mod.named_buffers()), dict(back.named_buffers())
    assert mine.keys() == theirs.keys()
    for name, b in mine.items():
        assert b.dtype == theirs[name].dtype and torch.equal(b, theirs[name]), name
    x = torch.randn(5, 200, dtype=torch.bfloat16)
    assert torch.equal(mod(x), back(x))
    direct = ql.W4A8.from_state(mod.state(), stored)  # real tensors: usable at once
    assert torch.equal(mod(x), direct(x))


def test_w4a8_load_of_an_incomplete_state_names_what_is_missing():
    mod = ql.W4A8(_linear(bias=False), torch.bfloat16, "kernel", group_size=64)
    stored = mod.state_dict()
    del stored["qpacked"]
    with pytest.raises(RuntimeError, match='Missing key.*"qpacked"') as e:
        mod.load_state_dict(stored)
    assert "qweight" not in str(e.value) and "size mismatch" not in str(e.value)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_w4a8_holds_four_bits_for_our_kernel(our_kernels, group_size):
    """With our w4a8_mm, resident = stored: the int4 values stay packed (16-row blocks, N = 64 here),
    and the state_dict is the same as without it (an artifact does not depend on the machine)."""
    n, k = 64, 256
    lin = _linear(k=k, n=n, bias=False)
    mod = ql.W4A8(lin, torch.bfloat16, "kernel", group_size=group_size)
    assert mod.packed.dtype == torch.uint8 and "qweight" not in dict(mod.named_buffers())
    stored = mod.state_dict()
    assert _nbytes(mod.buffers()) == _nbytes(stored.values()) == n * k // 2 + (k // group_size) * n * 2 * 2
    reference = ql.W4A8(lin, torch.bfloat16, "python", group_size=group_size).state_dict()
    assert stored.keys() == reference.keys()
    for name, t in reference.items():
        assert torch.equal(stored[name], t), name


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_aten_int4_layout_reads_back_exactly(group_size):
    """An int4 artifact stored as nibbles but loaded where only aten's layout runs can be saved again: the
    nibbles come back from aten's layout through its own kernel, exactly."""
    n, k = 48, 256
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(group_size)) * 3
    q, s, z = qp.quantize_int4_groupwise(w, group_size, torch.bfloat16)
    got_q, got_s, got_z = qp.unpack_int4_from_cpu(qp.pack_int4_for_cpu(q), qp.scales_and_zeros(s, z), group_size, n, k)
    assert torch.equal(got_q, q.to(torch.uint8)) and torch.equal(got_s, s) and torch.equal(got_z, z)
