"""The mixed-precision recipe (variants/mixed.py): options, the greedy order (no model), and the
plan it builds on tiny models: within budget, monotonic in the budget, the extremes, the facts."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from variantlab.errors import RecipeError
from variantlab.variants import mixed
from variantlab.variants import quant_linear as ql
from variantlab.variants.registry import RECIPES, get_recipe, parse_options

RECIPE = get_recipe("mixed")
BUDGETS = [1e-9, 1e-3, 1e-2, 1e-1, 1e9]  # on the conftest model: 16 | 16+8 | 16+8 | 8+4 | 4 bits
FAST = {"calibration_samples": 4, "group_size": 32}  # the conftest model is 32 wide


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Dozens of small forward passes: one thread is faster than two on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _options(**options):
    return parse_options(RECIPE, {**FAST, **options})


def _build(path, **options):
    from variantlab.models.loading import load_causal_lm
    opts = _options(**options)
    model, _ = load_causal_lm(path, RECIPE.load_dtype(opts), "cpu")
    return model, RECIPE.apply(model, opts, "cpu")


def _decoder_linears(model):
    return [n for n, m in model.named_modules() if n.startswith("model.layers.") and
            isinstance(m, (nn.Linear, ql.QuantLinear))]


# --- options (unit) ---------------------------------------------------------------------------

def test_registered_with_defaults():
    assert RECIPES["mixed"] is RECIPE
    o = parse_options(RECIPE, {})
    assert (o.max_kld, o.group_size, o.compute_dtype, o.candidates, o.calibration_samples,
            o.calibration_seed) == (0.01, 64, "bf16", (16, 8, 4), 16, 1234)
    assert RECIPE.load_dtype(o) == torch.bfloat16
    assert parse_options(RECIPE, {"candidates": [4, 16, 4]}).candidates == (16, 4)  # widest first
    assert RECIPE.unsupported_reason("cpu") is None


@pytest.mark.parametrize("options,match", [({"max_kld": 0}, "max_kld"), ({"max_kld": -1}, "max_kld"),
                                           ({"group_size": 48}, "group_size"), ({"candidates": [16]}, "4 or 8"),
                                           ({"candidates": [2, 4]}, "candidates"), ({"bits": 4}, "bits"),
                                           ({"compute_dtype": "fp32"}, "compute_dtype"),
                                           ({"calibration_samples": 0}, "calibration_samples")])
def test_bad_options_are_recipe_errors(options, match):
    with pytest.raises(RecipeError, match=match):
        parse_options(RECIPE, options)


# --- the order and the prediction (unit, no model) --------------------------------------------

SENS = {"a": {8: 0.001, 4: 0.1}, "b": {8: 0.002, 4: 0.004}, "c": {8: 0.05, 4: 0.06}}
BYTES = {n: {16: 200, 8: 100, 4: 50} for n in SENS}


def test_steps_are_cheapest_per_byte_first_and_walk_each_layer_down_its_ladder():
    steps = mixed.order_steps(SENS, BYTES, (16, 8, 4))
    assert [(s.layer, s.src, s.dst) for s in steps] == [
        ("a", 16, 8), ("b", 16, 8), ("b", 8, 4), ("c", 16, 8), ("c", 8, 4), ("a", 8, 4)]
    assert [s.kld for s in steps] == pytest.approx([0.001, 0.002, 0.002, 0.05, 0.01, 0.099])
    assert all(s.saved in (100, 50) for s in steps)


def test_a_wider_rung_that_measures_worse_costs_nothing_to_leave():
    steps = mixed.order_steps({"a": {8: 0.01, 4: 0.005}}, {"a": BYTES["a"]}, (16, 8, 4))
    assert [s.kld for s in steps] == [0.01, 0.0]


def test_prediction_is_the_longest_prefix_within_budget():
    steps = mixed.order_steps(SENS, BYTES, (16, 8, 4))
    assert [mixed.predicted_prefix(steps, SENS, (16, 8, 4), b) for b in (1e-4, 0.001, 0.0049, 0.0051, 1.0)] == \
        [0, 1, 2, 3, 6]
    # without 16 every layer starts at 8, which already costs the sum of the 8-bit sensitivities
    steps8 = mixed.order_steps(SENS, BYTES, (8, 4))
    assert mixed.predicted_prefix(steps8, SENS, (8, 4), 0.05) == 0
    assert mixed.predicted_prefix(steps8, SENS, (8, 4), 0.06) == 1


def _fake_model(factor):
    """(plan, put, kld) over SENS: the 'measured' KLD is factor(plan) × the sum of the layers' sensitivities."""
    plan = {n: 16 for n in SENS}
    put = plan.__setitem__
    kld = lambda: factor(plan) * sum(0.0 if b == 16 else SENS[n][b] for n, b in plan.items())  # noqa: E731
    return plan, put, kld


def test_walk_backs_off_when_the_measurement_is_worse_than_predicted():
    steps = mixed.order_steps(SENS, BYTES, (16, 8, 4))
    plan, put, kld = _fake_model(lambda plan: 2.0)  # super-additive
    taken, measured, passes = mixed._walk(steps, 3, 0.0051, put, kld)  # predicted: 3 steps, 0.005
    assert (taken, passes) == (1, 3) and measured == pytest.approx(0.002)  # 0.010 and 0.006 undone
    assert plan == {"a": 8, "b": 16, "c": 16}


def test_walk_walks_on_when_the_measurement_is_better_than_predicted():
    steps = mixed.order_steps(SENS, BYTES, (16, 8, 4))
    plan, put, kld = _fake_model(lambda plan: 0.5)  # sub-additive
    taken, measured, passes = mixed._walk(steps, 3, 0.03, put, kld)  # predicted 3: 0.0025 measured
    assert (taken, passes) == (4, 3) and measured == pytest.approx(0.0275)  # step 5 (0.0325) undone
    assert plan == {"a": 8, "b": 4, "c": 8}


def test_walk_is_monotonic_in_the_budget_whatever_the_measurements():
    import random
    noisy = lambda plan: random.Random(str(sorted(plan.items()))).uniform(0.2, 3.0)  # noqa: E731
    steps = mixed.order_steps(SENS, BYTES, (16, 8, 4))
    sizes = []
    for budget in [1e-4 * 1.5 ** i for i in range(25)]:
        plan, put, kld = _fake_model(noisy)
        predicted = mixed.predicted_prefix(steps, SENS, (16, 8, 4), budget)
        taken, measured, _ = mixed._walk(steps, predicted, budget, put, kld)
        assert measured <= budget or taken == 0
        assert measured == pytest.approx(kld())  # the state left is the state measured
        sizes.append(sum(BYTES[n][b] for n, b in plan.items()))
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


# --- on the conftest model --------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tiny_model_dir):
    """{budget: (model, facts)} on the conftest model."""
    return {b: _build(tiny_model_dir, max_kld=b) for b in BUDGETS}


@pytest.mark.model
def test_measured_kld_is_within_budget(built):
    for budget, (_, facts) in built.items():
        assert 0.0 <= facts.extra["final_kld"] <= budget
        assert facts.extra["max_kld"] == budget


@pytest.mark.model
def test_a_looser_budget_never_costs_more_bits(built):
    bits = [built[b][1].bits_per_weight for b in BUDGETS]
    assert bits == sorted(bits, reverse=True)
    assert bits[0] > bits[-1]
    mixes = [set(built[b][1].extra["plan"].values()) for b in BUDGETS[1:-1]]
    assert any(len(m) > 1 for m in mixes)  # some budget in between really mixes widths


@pytest.mark.model
def test_a_huge_budget_puts_every_layer_at_4_bits(built):
    model, facts = built[1e9]
    assert set(facts.extra["plan"].values()) == {4}
    assert all(isinstance(model.get_submodule(n), ql.Int4WeightOnly) for n in _decoder_linears(model))
    assert facts.kernels == ("aten::_weight_int4pack_mm_for_cpu", "aten::mm (bf16)")


@pytest.mark.model
def test_a_tiny_budget_keeps_every_layer_at_16_bits(built):
    model, facts = built[1e-9]
    assert set(facts.extra["plan"].values()) == {16}
    assert facts.extra["final_kld"] == 0.0
    assert all(type(model.get_submodule(n)) is nn.Linear and model.get_submodule(n).weight.dtype == torch.bfloat16
               for n in _decoder_linears(model))
    assert facts.kernels == ("aten::mm (bf16)",) and facts.bits_per_weight == 16.0


@pytest.mark.model
@pytest.mark.parametrize("budget", BUDGETS)
def test_plan_covers_every_decoder_linear_and_is_what_was_built(built, budget):
    model, facts = built[budget]
    plan, sens = facts.extra["plan"], facts.extra["sensitivities"]
    names = _decoder_linears(model)
    assert len(names) == 14 and set(plan) == set(names) == set(sens)
    assert all(set(s) == {"8", "4"} and all(v >= 0 for v in s.values()) for s in sens.values())
    kinds = {4: ql.Int4WeightOnly, 8: ql.Int8WeightOnly, 16: nn.Linear}
    assert all(type(model.get_submodule(n)) is kinds[plan[n]] for n in names)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.bfloat16
    hist = facts.extra["bits_histogram"]
    assert sum(hist.values()) == 14 and all(hist[str(b)] == sum(v == b for v in plan.values()) for b in (4, 8, 16))
    assert len(set(facts.kernels)) == len(facts.kernels)
    assert facts.extra["calibration_seconds"] > 0 and facts.extra["calibration_samples"] == 4
    search = facts.extra["search"]
    assert search["steps"] == 28 and 0 <= search["taken"] <= 28 and search["passes"] >= 1


@pytest.mark.model
@pytest.mark.parametrize("budget", BUDGETS)
def test_bytes_and_bits_per_weight_follow_the_plan(built, budget):
    model, facts = built[budget]
    per_layer = {16: lambda n, k: 2 * n * k,                          # bf16
                 8: lambda n, k: n * k + 2 * n,                       # int8 + a bf16 scale per row
                 4: lambda n, k: n * k // 2 + 2 * 2 * n * (k // 32)}  # nibbles + bf16 scale and zero per group
    params = sum(p.numel() for p in model.parameters()) + sum(
        m.in_features * m.out_features for m in model.modules() if isinstance(m, ql.QuantLinear))
    expected, lin_params = 0, 0
    for name, bits in facts.extra["plan"].items():
        m = model.get_submodule(name)
        expected += per_layer[bits](m.out_features, m.in_features)
        lin_params += m.in_features * m.out_features
    expected += 2 * (params - lin_params)  # embeddings, norms, LM head in bf16
    assert facts.parameters == params
    assert facts.weight_bytes == expected
    assert facts.bits_per_weight == pytest.approx(8 * expected / params)


@pytest.mark.model
@pytest.mark.parametrize("budget", BUDGETS)
def test_reported_kld_is_the_kld_of_the_returned_model(built, tiny_model_dir, budget):
    from variantlab.models.loading import load_causal_lm
    from variantlab.variants.recipe import cast_parameters
    ref_model, _ = load_causal_lm(tiny_model_dir, torch.bfloat16, "cpu")
    cast_parameters(ref_model, torch.bfloat16)  # as the bf16 recipe and apply do (RoPE's inv_freq stays fp32)
    model, facts = built[budget]
    batch = mixed._calibration_batch(ref_model, _options())
    with torch.no_grad():
        ref, var = mixed._logprobs(ref_model, batch), mixed._logprobs(model, batch)
    assert mixed._kld(ref, var) == pytest.approx(facts.extra["final_kld"], rel=1e-6)


@pytest.mark.model
def test_an_optimistic_prediction_is_backed_off_until_the_measurement_fits(tiny_model_dir, monkeypatch, built):
    monkeypatch.setattr(mixed, "predicted_prefix", lambda steps, *a: len(steps))  # predict "all at 4"
    budget = 1e-2
    model, facts = _build(tiny_model_dir, max_kld=budget)
    search = facts.extra["search"]
    assert search["predicted"] == search["steps"] == 28 and search["passes"] > 1
    assert search["taken"] == 28 - (search["passes"] - 1) or search["taken"] == 0
    assert facts.extra["final_kld"] <= budget
    # it undoes the last steps of the same order, so it stops at least as far along as the normal walk
    assert facts.bits_per_weight <= built[budget][1].bits_per_weight


@pytest.mark.model
@pytest.mark.parametrize("budget", [1e-2, 1e9])
def test_a_cautious_prediction_is_walked_on_while_the_measurement_fits(tiny_model_dir, monkeypatch, budget):
    monkeypatch.setattr(mixed, "predicted_prefix", lambda *a: 0)  # predict "nothing fits"
    model, facts = _build(tiny_model_dir, max_kld=budget)
    search = facts.extra["search"]
    assert search["predicted"] == 0 and search["taken"] > 0 and facts.extra["final_kld"] <= budget
    if budget == 1e9:
        assert set(facts.extra["plan"].values()) == {4} and search["passes"] == 29


@pytest.mark.model
def test_a_budget_the_narrowest_candidates_cannot_meet_is_an_error(tiny_model_dir):
    with pytest.raises(RecipeError, match="cannot meet max_kld 1e-09.*every layer at 8 bits"):
        _build(tiny_model_dir, max_kld=1e-9, candidates=[4, 8])


def test_a_model_without_its_tokenizer_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(RecipeError, match="needs the checkpoint's tokenizer"):
        RECIPE.apply(LlamaForCausalLM(cfg).eval(), _options(), "cpu")


# --- the shipped reference model --------------------------------------------------------------

@pytest.mark.model
@pytest.mark.parametrize("budget", [0.01, 1e-4])  # the default, and one tight enough to mix widths
def test_meets_its_budget_on_the_reference_model(budget):
    from variantlab.models.loading import resolve_model_path
    model, facts = _build(resolve_model_path("builtin:tiny-structured"), max_kld=budget, group_size=64,
                          calibration_samples=2)
    assert facts.extra["final_kld"] <= budget
    plan = facts.extra["plan"]
    assert set(plan) == set(_decoder_linears(model)) and len(plan) == 28
    assert 4.5 < facts.bits_per_weight <= 16.0
