"""Our decode kernels under a built variant (variants/kernel_linear.py): which layers take them, that
decode-shaped calls use them and larger ones stay on aten, and what the facts say."""
from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, switch_off_our_kernels
import torch.nn.functional as F
from torch import nn

from variantlab.variants import kernel_linear
from variantlab.variants import kernels as vk
from variantlab.variants.build import VariantDefinition, build
from variantlab.variants.decode_kernels import use_decode_kernels
from variantlab.variants.kernel_linear import KernelLinear, plain_class

pytestmark = pytest.mark.model


def _calls(monkeypatch, name):
    """Count calls of one of our ops (variants.kernels.<name>)."""
    seen = []
    real = getattr(vk, name)
    monkeypatch.setattr(vk, name, lambda *a: seen.append(a[0].shape) or real(*a))
    return seen


@pytest.mark.parametrize("dtype,op", [(torch.float32, "fp32_mm"), (torch.bfloat16, "bf16_mm")])
def test_decode_rows_take_our_gemv_and_prefill_stays_on_aten(our_kernels, monkeypatch, dtype, op):
    torch.manual_seed(0)
    layer = nn.Linear(96, 40).to(dtype)
    plain = nn.Linear(96, 40).to(dtype)
    plain.load_state_dict(layer.state_dict())
    model = nn.Sequential(layer)
    use_decode_kernels(model)
    assert type(model[0]) is KernelLinear and plain_class(model[0]) is nn.Linear
    assert model[0].state_dict().keys() == plain.state_dict().keys()
    seen = _calls(monkeypatch, op)
    rows = vk.OURS_UP_TO[op][1]                          # K = 96: as many rows as ours is used for
    x = torch.randn(1, rows, 96).to(dtype)
    y, ref = model(x), F.linear(x.float(), plain.weight.float(), plain.bias.float())
    assert seen == [(rows, 96)] and y.shape == (1, rows, 40) and y.dtype == dtype
    assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < (1e-5 if dtype == torch.float32 else 1e-2)
    x = torch.randn(rows + 1, 96).to(dtype)              # one more: aten, exactly (bf16: widened where scalar)
    widened = dtype == torch.bfloat16 and kernel_linear.aten_bf16_is_scalar()
    expect = kernel_linear.widened_linear(x, plain.weight, plain.bias) if widened else plain(x)
    assert torch.equal(model(x), expect) and len(seen) == 1


@pytest.mark.parametrize("scalar", [True, False])
def test_prefill_in_bf16_widens_to_fp32_where_atens_bf16_is_scalar(our_kernels, monkeypatch, scalar):
    """Above our rows, a bf16 layer runs aten's fp32 linear on widened x and weight where aten's bf16 matmul has
    no vector kernel (kernel_linear.aten_bf16_is_scalar), rounding to bf16: aten's bf16 values up to summation
    order; elsewhere aten's bf16 linear, exactly."""
    torch.manual_seed(0)
    layer = nn.Linear(256, 48).to(torch.bfloat16)
    plain = nn.Linear(256, 48).to(torch.bfloat16)
    plain.load_state_dict(layer.state_dict())
    model = nn.Sequential(layer)
    use_decode_kernels(model)
    monkeypatch.setattr(kernel_linear, "aten_bf16_is_scalar", lambda: scalar)
    x = torch.randn(40, 256).to(torch.bfloat16)          # 40 rows: above every CPU's bf16_mm rows
    y = model(x)
    assert y.dtype == torch.bfloat16 and y.shape == (40, 48)
    if scalar:
        ref = F.linear(x.float(), plain.weight.float(), plain.bias.float())
        assert torch.equal(y, ref.to(torch.bfloat16))
        assert ((y.float() - plain(x).float()).abs() <= plain(x).float().abs() * 2 ** -7 + 1e-6).all()
    else:
        assert torch.equal(y, plain(x))


def test_the_row_limits_cover_every_op_on_every_instruction_set():
    assert all(table.keys() == vk.UP_TO["AVX-512"].keys() for table in vk.UP_TO.values())
    assert set(vk.UP_TO) == {isa.name for isa in vk.ISAS}
    assert vk.rows_up_to("fp32_mm", 4096) == vk.OURS_UP_TO["fp32_mm"][0]
    assert vk.rows_up_to("fp32_mm", 512) == vk.OURS_UP_TO["fp32_mm"][1]


def test_row_labels_say_every_M_one_row_or_a_limit(monkeypatch):
    monkeypatch.setattr(vk, "OURS_UP_TO", {"a": (vk.EVERY, vk.EVERY), "b": (1, 8), "c": (4, vk.EVERY)})
    assert vk.rows_label("a") == "a at every M"
    assert vk.rows_label("b") == "b at 1 row (≤ 8 with K ≤ 1024)"
    assert vk.rows_label("c") == "c at ≤ 4 rows (every M with K ≤ 1024)"
    assert vk.ours_beats_aten("a", 10 ** 6, 4096) and not vk.ours_beats_aten("b", 2, 4096)
    assert vk.ours_beats_aten("b", 8, 1024) and not vk.ours_beats_aten("b", 9, 1024)


@pytest.mark.parametrize("table", ["AVX-512", "AVX2"])
def test_a_quantized_variant_lists_atens_kernel_only_where_it_runs(our_kernels, tiny_model_dir, monkeypatch,
                                                                     table):
    """W8A8: aten's torch._int_mm runs above our rows; where ours runs at every M (AVX2) it never does, and the
    facts do not list it."""
    monkeypatch.setattr(vk, "OURS_UP_TO", vk.UP_TO[table])
    facts = build(tiny_model_dir, VariantDefinition("w8a8", "w8a8", {}), "cpu").facts
    every = vk.UP_TO[table]["w8a8_mm"][0] >= vk.EVERY
    assert ("aten::_int_mm" in facts.kernels) is not every
    assert any("w8a8_mm at " + ("every M" if every else "≤ 8 rows") in k for k in facts.kernels)


def test_a_variant_says_which_of_our_kernels_it_runs(our_kernels, tiny_model_dir):
    expected = {"fp32": ["fp32_mm"], "bf16": ["bf16_mm"], "int8": ["int8_digits_mm", "bf16_mm"],
                "w8a8": ["w8a8_mm", "bf16_mm"], "w4a8": ["w4a8_mm", "bf16_mm"], "int4": ["int4_digits_mm", "bf16_mm"]}
    for recipe, ops in expected.items():
        facts = build(tiny_model_dir, VariantDefinition(recipe, recipe, {"group_size": 32} if "4" in recipe else {}),
                      "cpu").facts
        ours = [k for k in facts.kernels if k.startswith("variantlab ")]
        assert [next(op for op in ops + ["decode_attention"] if op in k) for k in ours] == ops + ["decode_attention"]


def test_without_our_kernels_nothing_changes_and_the_facts_say_why(aten_only, tiny_model_dir):
    built = build(tiny_model_dir, VariantDefinition("bf16", "bf16", {}), "cpu")
    assert not any(isinstance(m, KernelLinear) for m in built.model.modules())
    assert not any(k.startswith("variantlab ") for k in built.facts.kernels)
    assert any("switched off for this test; aten runs instead" in n for n in built.facts.notes)


def test_an_artifact_gets_this_machines_kernels_when_loaded(our_kernels, tiny_model_dir, tmp_path, monkeypatch):
    """Built without our kernels (as on another machine), loaded where they run: the labels and notes
    are this machine's, not the builder's."""
    from variantlab.variants.build import load, save
    with pytest.MonkeyPatch.context() as mp:
        switch_off_our_kernels(mp)
        built = build(tiny_model_dir, VariantDefinition("w4a8", "w4a8", {"group_size": 32}), "cpu")
        save(built, tiny_model_dir, tmp_path / "a")
    loaded = load(tmp_path / "a")
    assert any("w4a8_mm" in k for k in loaded.facts.kernels)
    assert not any("aten runs instead" in n for n in loaded.facts.notes)
    assert loaded.facts.extra["resident_bytes"] < built.facts.extra["resident_bytes"]   # int4 stays packed


def test_an_int4_artifact_loads_on_either_kind_of_machine(our_kernels, tiny_model_dir, tmp_path):
    """int4 built where ours run stores nibbles, and loads as aten's layout where they do not (the same
    weights); built where they do not, it stores aten's layout and keeps aten's kernel wherever it loads."""
    from variantlab.variants import quant_linear as ql
    from variantlab.variants.build import load, save
    definition = VariantDefinition("int4", "int4", {"group_size": 32})
    ours = build(tiny_model_dir, definition, "cpu")
    save(ours, tiny_model_dir, tmp_path / "ours")
    with pytest.MonkeyPatch.context() as mp:
        switch_off_our_kernels(mp)
        elsewhere = load(tmp_path / "ours")
        assert ql.Int4WeightOnly.OURS_LABEL not in elsewhere.facts.kernels
        assert "aten::_weight_int4pack_mm_for_cpu" in elsewhere.facts.kernels
        x = torch.randn(3, 128).bfloat16()
        for name, m in ours.model.named_modules():
            if isinstance(m, ql.Int4WeightOnly) and m.in_features == 128:
                other = elsewhere.model.get_submodule(name)
                assert "scales_and_zeros" in other._buffers and "scales_zeros" in m._buffers
                a, b = m(x).float(), other(x).float()   # the same weights: apart by bf16's rounding only
                assert ((a - b).abs().max() / b.abs().max()).item() < 2 ** -6
        aten_built = build(tiny_model_dir, definition, "cpu")
        save(aten_built, tiny_model_dir, tmp_path / "aten")
    loaded = load(tmp_path / "aten")
    assert "aten::_weight_int4pack_mm_for_cpu" in loaded.facts.kernels
    assert ql.Int4WeightOnly.OURS_LABEL in ours.facts.kernels


def _decode_logits(model, vocab: int, steps: int = 3) -> torch.Tensor:
    """Logits of `steps` one-token decode steps after a 9-token prefill, on fixed tokens (teacher-forced,
    so both sides compute the same positions whatever they would pick)."""
    from transformers import DynamicCache
    ids = torch.randint(3, vocab, (1, 9 + steps), generator=torch.Generator().manual_seed(0))
    cache, out = DynamicCache(), []
    with torch.inference_mode():
        model(input_ids=ids[:, :9], past_key_values=cache, use_cache=True)
        for t in range(9, 9 + steps):
            out.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits.float())
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("recipe", ["fp32", "bf16", "int8", "w8a8", "w4a8"])
@pytest.mark.parametrize("family", ("llama",) + FAMILIES)
def test_ours_computes_what_aten_computes_on_every_family(our_kernels, tiny_model_dir, family_dirs, family, recipe):
    """Decode logits (our GEMV, int8/int4 matmuls and decode attention) against aten's, per family."""
    definition = VariantDefinition(recipe, recipe, {"group_size": 32} if recipe == "w4a8" else {})
    source = tiny_model_dir if family == "llama" else family_dirs[family]
    with pytest.MonkeyPatch.context() as mp:
        switch_off_our_kernels(mp)
        ref = build(source, definition, "cpu").model
        want = _decode_logits(ref, ref.config.vocab_size)
    model = build(source, definition, "cpu").model
    got = _decode_logits(model, model.config.vocab_size)
    rel = ((got - want).abs().max() / want.abs().max()).item()
    # fp32: summation order only (measured ≤ 7e-7). bf16 activations round each layer's outputs
    # (2^-8), and per-token int8 activations can round one step apart: measured ≤ 1.2% and ≤ 3.5%.
    assert rel < {"fp32": 1e-5, "bf16": 0.03, "int8": 0.03}.get(recipe, 0.07)


def test_in_fp32_the_engine_with_ours_decodes_what_it_decodes_with_aten(our_kernels, tiny_model_dir):
    """fp32 differs from aten by summation order only: the same greedy tokens, batched and alone."""
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine

    prompts = ["Q: hi\nA:", "a: 1\nQ: What is the a?\nA:", "order_id: ORD-5493\nstatus: pending\nQ: status?\nA:"]

    def tokens(engine, group):
        reqs = [GenerationRequest(f"r{i}", prompt=p, max_new_tokens=12, stop_on_eos=False) for i, p in enumerate(group)]
        return [r.token_ids for r in run_requests(engine, reqs)]

    definition = VariantDefinition("fp32", "fp32", {})
    with pytest.MonkeyPatch.context() as mp:
        switch_off_our_kernels(mp)
        ref = build(tiny_model_dir, definition, "cpu")
        engine = TorchEngine(ref.model, ref.tokenizer, "cpu")
        want = tokens(engine, prompts), [tokens(engine, [p]) for p in prompts]
    ours = build(tiny_model_dir, definition, "cpu")
    assert any("decode_attention" in k for k in ours.facts.kernels)
    engine = TorchEngine(ours.model, ours.tokenizer, "cpu")
    assert (tokens(engine, prompts), [tokens(engine, [p]) for p in prompts]) == want


@pytest.mark.parametrize("recipe", ["int8", "w8a8", "w4a8", "fp16"])
def test_fp16_activations_stay_on_aten(our_kernels, tiny_model_dir, recipe):
    """Our kernels take fp32 and bf16 activations: an fp16 compute dtype runs aten's (and says nothing of ours)."""
    options = ({"compute_dtype": "fp16"} if recipe != "fp16" else {}) | ({"group_size": 32} if recipe == "w4a8" else {})
    built = build(tiny_model_dir, VariantDefinition(recipe, recipe, options), "cpu")
    assert not any(f"{recipe}_mm" in k or "decode_attention" in k for k in built.facts.kernels)
    assert built.model.config._attn_implementation == "sdpa"
    with torch.inference_mode():
        logits = built.model(input_ids=torch.tensor([[5, 6, 7]])).logits
        step = built.model(input_ids=torch.tensor([[8]])).logits
    assert torch.isfinite(logits).all() and torch.isfinite(step).all()


def test_decode_attention_takes_what_it_computes_exactly_and_hands_the_rest_to_sdpa(our_kernels):
    """One query position with a kept-positions mask (shared by the batch or per row): ours, equal to
    SDPA within rounding. Two positions, a float mask or a strided value: SDPA itself, bit for bit."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from variantlab.variants.kernel_attention import decode_attention_forward

    class Module(torch.nn.Module):
        is_causal, num_key_value_groups = True, 2

    module, g = Module(), torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 16, generator=g)
    k, v = torch.randn(3, 2, 20, 16, generator=g), torch.randn(3, 2, 20, 16, generator=g)
    shared = (torch.arange(20) < 13)[None, None, None, :]                   # [1, 1, 1, L]
    calls = []
    real = vk.decode_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vk, "decode_attention", lambda *a: calls.append(1) or real(*a))
        out, _ = decode_attention_forward(module, q, k, v, shared)
        ref, _ = sdpa_attention_forward(module, q, k, v, shared.expand(3, -1, -1, -1))
        assert calls == [1] and (out - ref).abs().max() < 1e-5
        for args in ((torch.randn(3, 4, 2, 16, generator=g), k, v, None),                 # two positions
                     (q, k, v, torch.zeros(3, 1, 1, 20)),                                  # a float mask
                     (q, k, v.transpose(2, 3).contiguous().transpose(2, 3), None)):        # strided value
            got, _ = decode_attention_forward(module, *args)
            want, _ = sdpa_attention_forward(module, *args)
            assert torch.equal(got, want)
        assert calls == [1]


@pytest.mark.parametrize("scalar", [True, False])
def test_a_bf16_variant_names_the_matmul_its_prefill_runs(our_kernels, tiny_model_dir, monkeypatch, scalar):
    """Where aten's bf16 matmul is scalar, bf16 prefill runs aten's fp32 one on widened values, and the facts
    say so; elsewhere they say aten's bf16 matmul. Either way, whichever label the build brought."""
    from variantlab.variants import decode_kernels
    monkeypatch.setattr(decode_kernels, "aten_bf16_is_scalar", lambda: scalar)
    facts = build(tiny_model_dir, VariantDefinition("bf16", "bf16", {}), "cpu").facts
    assert (decode_kernels.WIDENED_MM in facts.kernels) is scalar
    assert (decode_kernels.BF16_MM in facts.kernels) is not scalar
