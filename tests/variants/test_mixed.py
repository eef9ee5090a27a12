"""The mixed-precision recipe (variants/mixed.py): options, the greedy order and the bisection (no
model), the suffix-run sensitivity against full passes, calibration text and tokenizer from the
build context, and the plan it builds on tiny models: within budget, monotonic in the budget, the
extremes, the facts, O(log steps) measured passes."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from variantlab.errors import RecipeError
from variantlab.variants import calibration, mixed
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
            o.sensitivity_samples, o.calibration_seed) == (0.01, 64, "bf16", (16, 8, 4), 16, 4, 1234)
    assert RECIPE.load_dtype(o) == torch.bfloat16
    assert parse_options(RECIPE, {"candidates": [4, 16, 4]}).candidates == (16, 4)  # widest first
    assert RECIPE.unsupported_reason("cpu") is None


@pytest.mark.parametrize("options,match", [({"max_kld": 0}, "max_kld"), ({"max_kld": -1}, "max_kld"),
                                           ({"group_size": 48}, "group_size"), ({"candidates": [16]}, "4 or 8"),
                                           ({"candidates": [2, 4]}, "candidates"), ({"bits": 4}, "bits"),
                                           ({"compute_dtype": "fp32"}, "compute_dtype"),
                                           ({"calibration_samples": 0}, "calibration_samples"),
                                           ({"sensitivity_samples": 0}, "sensitivity_samples")])
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


def test_a_layer_with_its_own_ladder_walks_only_its_rungs():
    """A layer int4 cannot hold (its in_features not a multiple of group_size) walks 16 → 8 only."""
    ladders = {"a": (16, 8, 4), "b": (16, 8), "c": (16, 8, 4)}
    steps = mixed.order_steps(SENS, BYTES, ladders)
    assert [(s.layer, s.src, s.dst) for s in steps] == [
        ("a", 16, 8), ("b", 16, 8), ("c", 16, 8), ("c", 8, 4), ("a", 8, 4)]
    assert mixed.predicted_prefix(steps, SENS, ladders, 1.0) == 5
    at_8 = mixed.order_steps(SENS, BYTES, {"a": (8, 4), "b": (8,), "c": (8, 4)})   # candidates [8, 4]; b stays
    assert [(s.layer, s.dst) for s in at_8] == [("c", 4), ("a", 4)]
    assert mixed.predicted_prefix(at_8, SENS, {"a": (8, 4), "b": (8,), "c": (8, 4)}, 0.0529) == 0   # 0.053 at 8
    assert mixed.predicted_prefix(at_8, SENS, {"a": (8, 4), "b": (8,), "c": (8, 4)}, 0.0631) == 1


def _measure(kld_of):
    """A fake model over 168 steps (a 150M-parameter Llama's count): measure(k) = kld_of(k), counted."""
    calls = []

    def measure(k):
        calls.append(k)
        return kld_of(k)
    return measure, calls


@pytest.mark.parametrize("budget", [1e-5, 0.01, 0.05, 0.1675, 0.168, 0.2, 10.0])
def test_bisection_finds_the_longest_fitting_prefix_in_log_passes_when_kld_grows_along_the_order(budget):
    measure, calls = _measure(lambda k: k / 1000)
    taken, measured, probes = mixed.bisect_prefix(168, budget, measure, at_zero=0.0)
    assert taken == min(168, int(budget * 1000 + 1e-9)) and measured == taken / 1000
    assert len(calls) == len(probes) <= 8 == math.ceil(math.log2(168 + 1))  # the old walk: up to 168
    assert 0 not in calls  # prefix 0 is the original: known, not measured


def test_bisection_measures_prefix_zero_when_it_is_not_the_original():
    measure, calls = _measure(lambda k: 0.5 + k)
    assert mixed.bisect_prefix(10, 0.1, measure) == (0, 0.5, [(0, 0.5)])  # does not fit: the caller refuses
    measure, calls = _measure(lambda k: 0.5 + k)
    taken, measured, probes = mixed.bisect_prefix(10, 2.7, measure)
    assert (taken, measured) == (2, 2.5) and calls[0] == 0 and len(calls) <= 1 + math.ceil(math.log2(11))


def test_bisection_is_monotonic_in_the_budget_and_keeps_only_measured_fits_whatever_the_measurements():
    import random
    noisy = lambda k: k / 1000 * random.Random(k).uniform(0.3, 3.0) if k % 7 else math.nan  # noqa: E731
    taken_by_budget = []
    for budget in [1e-4 * 1.5 ** i for i in range(25)]:
        measure, calls = _measure(noisy)
        taken, measured, probes = mixed.bisect_prefix(168, budget, measure, at_zero=0.0)
        assert len(calls) <= 8 and measured <= budget
        assert taken == 0 or (taken, measured) in probes  # the answer was measured, not predicted
        longer = [k for k, v in probes if k > taken]
        assert taken == 168 or min(longer) == taken + 1  # confirmed: one step more was measured not to fit
        taken_by_budget.append(taken)
    assert taken_by_budget == sorted(taken_by_budget) and taken_by_budget[0] < taken_by_budget[-1]


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
    from variantlab.variants import kernels
    int4 = ql.Int4WeightOnly.OURS_LABEL if kernels.available() else "aten::_weight_int4pack_mm_for_cpu"
    assert facts.kernels == (int4, "aten::mm (bf16)")


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
    assert search["steps"] == 28 and 0 <= search["taken"] <= 28
    assert 1 <= search["passes"] == len(search["probes"]) <= math.ceil(math.log2(28 + 1))
    taken_kld = [kld for k, kld in search["probes"] if k == search["taken"]]
    assert taken_kld == ([facts.extra["final_kld"]] if search["taken"] else [])


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


def _calibration(model, options, context):
    return calibration.calibration_set(model, context, samples=options.calibration_samples,
                                       max_tokens=options.max_calibration_tokens,
                                       sensitivity_samples=options.sensitivity_samples,
                                       fallback_seed=options.calibration_seed)


def _kld_on_calibration(model, path, options, context=None):
    """The KLD of `model` against a freshly loaded original, on the recipe's calibration text."""
    from variantlab.models.loading import load_causal_lm
    from variantlab.variants.recipe import BuildContext, cast_parameters
    ref_model, _ = load_causal_lm(path, torch.bfloat16, "cpu")
    cast_parameters(ref_model, torch.bfloat16)  # as the bf16 recipe and apply do (RoPE's inv_freq stays fp32)
    calib = _calibration(ref_model, options, context or BuildContext())
    with torch.no_grad():
        ref = torch.cat([calibration.logprobs(ref_model, b) for b in calib.batches])
        var = torch.cat([calibration.logprobs(model, b) for b in calib.batches])
    return calibration.kld(ref, var)


@pytest.mark.model
@pytest.mark.parametrize("budget", BUDGETS)
def test_reported_kld_is_the_kld_of_the_returned_model(built, tiny_model_dir, budget):
    model, facts = built[budget]
    assert _kld_on_calibration(model, tiny_model_dir, _options()) == pytest.approx(facts.extra["final_kld"], rel=1e-6)


@pytest.mark.model
def test_suffix_runs_measure_what_full_passes_measure(tiny_model_dir):
    """The fast sensitivity (decoder layers below replay their captured outputs) against the naive
    one (a full forward per layer and width), over several batches, on every linear of both layers."""
    from variantlab.models.loading import load_causal_lm
    from variantlab.variants.recipe import BuildContext, cast_parameters
    opts = _options(calibration_samples=6, sensitivity_samples=6)  # batches of 4 + 2
    model, _ = load_causal_lm(tiny_model_dir, torch.bfloat16, "cpu")
    cast_parameters(model, torch.bfloat16)
    layers = {n: model.get_submodule(n) for n in _decoder_linears(model)}
    build = lambda n, b: mixed._build(layers[n], b, torch.bfloat16, opts)  # noqa: E731
    calib = _calibration(model, opts, BuildContext())
    with torch.no_grad():
        probe = calibration.SensitivityProbe(model, layers, calib.batches, calib.sensitivity_batches)
        fast, fast_bytes = mixed._sensitivities(model, layers, build, probe.sensitivity, opts.candidates)
        naive, naive_bytes = mixed._sensitivities(model, layers, build, lambda name: probe.kld(), opts.candidates)
    assert len(calib.batches) == calib.sensitivity_batches == 2
    assert fast_bytes == naive_bytes and set(fast) == set(naive) == set(layers)
    for name in layers:
        assert fast[name] == pytest.approx(naive[name], rel=1e-9, abs=1e-15)
    assert probe.runs == 28 and probe.layers_run == 14 * 2 + 14 * 1  # layer 1's runs skip layer 0
    assert all(type(layer).__name__ == "LlamaDecoderLayer" for layer in probe.stack)  # replays removed


@pytest.mark.model
def test_search_costs_o_log_steps_full_passes_counted_at_the_forward(tiny_model_dir, monkeypatch):
    """Every forward the recipe makes goes through calibration.logprobs: count them and check the reported cost."""
    calls = []
    real = calibration.logprobs
    monkeypatch.setattr(calibration, "logprobs",
                        lambda model, batch: (calls.append(batch.samples), real(model, batch))[1])
    model, facts = _build(tiny_model_dir, max_kld=1e-2, calibration_samples=6, sensitivity_samples=2)
    cost, search = facts.extra["cost"], facts.extra["search"]
    full = [2, 4]  # texts per batch: the 2 sensitivity texts, then the rest
    assert calls[:2] == full and len(calls) == 2 * cost["passes"] + cost["suffix_runs"]
    assert calls[2:2 + cost["suffix_runs"]] == [2] * 28 and calls[2 + 28:] == full * search["passes"]
    assert cost["passes"] == 1 + search["passes"] and search["passes"] <= math.ceil(math.log2(28 + 1))
    assert cost["suffix_layers"] == 42 and cost["decoder_layers"] == 2
    assert all(cost[k] >= 0 for k in ("capture_seconds", "sensitivity_seconds", "search_seconds"))
    assert facts.extra["sensitivity_samples"] == 2 and facts.extra["calibration_samples"] == 6


@pytest.mark.model
def test_a_budget_the_narrowest_candidates_cannot_meet_is_an_error(tiny_model_dir):
    with pytest.raises(RecipeError, match="cannot meet max_kld 1e-09.*every layer at 8 bits"):
        _build(tiny_model_dir, max_kld=1e-9, candidates=[4, 8])


# --- calibration text and tokenizer from the build context -----------------------------------

TEXTS_A = ('order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA: pending',
           '[{"invoice":"INV-65887","paid":"yes"}]\nQ: How many invoices have paid yes?\nA: 1',
           'hello world\nQ: what A: 42', 'status: shipped\nQ: status?\nA: shipped', 'x')
TEXTS_B = tuple(" ".join(["the quick brown fox jumps over the lazy dog"] * (i + 1)) for i in range(4))


def _build_with(path, context, **options):
    from variantlab.models.loading import load_causal_lm
    opts = _options(**options)
    model, _ = load_causal_lm(path, RECIPE.load_dtype(opts), "cpu")
    return model, RECIPE.apply(model, opts, "cpu", context)


@pytest.mark.model
def test_calibrates_on_the_given_texts_and_says_so(tiny_model_dir, monkeypatch):
    from variantlab.data import structured
    from variantlab.variants.recipe import BuildContext
    monkeypatch.setattr(structured, "generate_samples", lambda *a, **k: pytest.fail("the generator was used"))
    tok = _tokenizer_of(tiny_model_dir)
    facts = {name: _build_with(tiny_model_dir, BuildContext(tok, texts), max_kld=1e-2)[1]
             for name, texts in (("a", TEXTS_A), ("b", TEXTS_B))}
    for f in facts.values():
        assert f.extra["calibration_source"] == "context" and f.extra["calibration_seed"] is None
        assert f.extra["calibration_samples"] == 4  # the first calibration_samples texts
        assert not any("generator" in note for note in f.notes) and "(context)" in f.notes[-2]
    assert facts["a"].extra["sensitivities"] != facts["b"].extra["sensitivities"]


@pytest.mark.model
def test_reported_kld_is_on_the_given_texts(tiny_model_dir):
    from variantlab.variants.recipe import BuildContext
    context = BuildContext(_tokenizer_of(tiny_model_dir), TEXTS_B)
    model, facts = _build_with(tiny_model_dir, context, max_kld=1e-3)
    assert _kld_on_calibration(model, tiny_model_dir, _options(), context) == \
        pytest.approx(facts.extra["final_kld"], rel=1e-6)
    assert _kld_on_calibration(model, tiny_model_dir, _options()) != pytest.approx(facts.extra["final_kld"])


@pytest.mark.model
def test_without_texts_it_falls_back_to_the_generator_and_says_so(built):
    facts = built[1e-2][1]
    assert facts.extra["calibration_source"] == "generator" and facts.extra["calibration_seed"] == 1234
    assert any("no calibration texts were given" in note for note in facts.notes)


@pytest.mark.model
def test_uses_the_given_tokenizer_when_the_model_has_no_directory(tiny_model_dir):
    from variantlab.models.loading import load_causal_lm
    from variantlab.variants.recipe import BuildContext
    model, tok = load_causal_lm(tiny_model_dir, torch.bfloat16, "cpu")
    model.name_or_path = ""
    facts = RECIPE.apply(model, _options(max_kld=1e-2), "cpu", BuildContext(tokenizer=tok))
    assert facts.extra["final_kld"] <= 1e-2 and facts.extra["calibration_source"] == "generator"


def test_a_model_without_its_tokenizer_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(RecipeError, match="needs the checkpoint's tokenizer"):
        RECIPE.apply(LlamaForCausalLM(cfg).eval(), _options(), "cpu")


@pytest.mark.model
def test_calibration_texts_too_short_to_score_are_refused(tiny_model_dir):
    from variantlab.variants.recipe import BuildContext
    tok = _tokenizer_of(tiny_model_dir)
    assert len(tok("").input_ids) == 1  # <s> alone: no next token to score
    with pytest.raises(RecipeError, match="two tokens"):
        _build_with(tiny_model_dir, BuildContext(tok, ("", "")))


def _tokenizer_of(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


# --- the shipped reference model --------------------------------------------------------------

@pytest.mark.model
def test_meets_its_budget_on_the_reference_model_for_several_budgets():
    from variantlab.models.loading import resolve_model_path
    path = resolve_model_path("builtin:tiny-structured")
    results = {b: _build(path, max_kld=b, group_size=64, calibration_samples=4) for b in (1e-4, 3e-4, 1e-3, 1e-2)}
    for budget, (model, facts) in results.items():
        assert facts.extra["final_kld"] <= budget
        assert _kld_on_calibration(model, path, _options(group_size=64, calibration_samples=4)) == \
            pytest.approx(facts.extra["final_kld"], rel=1e-6)
        plan = facts.extra["plan"]
        assert set(plan) == set(_decoder_linears(model)) and len(plan) == 28
        assert 4.5 < facts.bits_per_weight <= 16.0
        assert facts.extra["search"]["passes"] <= math.ceil(math.log2(56 + 1))
    bits = [facts.bits_per_weight for _, facts in results.values()]
    assert bits == sorted(bits, reverse=True) and bits[0] > bits[-1]


# --- a width the group size does not divide (issue 22) ---------------------------------------------

QWEN_FAST = {"calibration_samples": 4, "sensitivity_samples": 2, "max_calibration_tokens": 24, "max_kld": 1e9}
DOWN = ("model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj")


@pytest.mark.model
@pytest.mark.parametrize("candidates, down_bits", [([4, 8, 16], 8), ([4], 8), ([4, 16], 16)])
def test_layers_int4_cannot_hold_stay_wider_and_the_facts_say_so(qwen2_688_dir, candidates, down_bits):
    """Qwen2-style intermediate 688 with group_size 64: the whole variant failed at build time; now down_proj
    keeps its next-widest candidate (8 bits, or 8 when 4 was the only one), every other layer is free to reach 4
    (here: all of them, under a budget nothing exceeds), and the notes and extra say which and why."""
    from variantlab.models.loading import load_causal_lm
    opts = parse_options(RECIPE, {**QWEN_FAST, "candidates": candidates})    # group_size: the default 64
    model, _ = load_causal_lm(qwen2_688_dir, RECIPE.load_dtype(opts), "cpu")
    facts = RECIPE.apply(model, opts, "cpu")
    plan = facts.extra["plan"]
    assert {n: b for n, b in plan.items() if n in DOWN} == dict.fromkeys(DOWN, down_bits)
    assert set(b for n, b in plan.items() if n not in DOWN) == {4} and len(plan) == 14
    kinds = {4: ql.Int4WeightOnly, 8: ql.Int8WeightOnly, 16: nn.Linear}
    assert all(type(model.get_submodule(n)) is kinds[b] for n, b in plan.items())
    assert facts.extra["no_int4"] == dict.fromkeys(DOWN, 688)
    assert all("4" not in facts.extra["sensitivities"][n] for n in DOWN)
    assert facts.extra["bits_histogram"][str(down_bits)] == 2
    [note] = [n for n in facts.notes if "does not divide" in n]
    rungs = {8: "8 bits", 16: "16 bits"}[down_bits] if len(candidates) < 3 else "8 or 16 bits"
    assert note.startswith(f"group_size 64 does not divide in_features 688 of {DOWN[0]}, {DOWN[1]}: int4 cannot "
                           f"hold them, so they take {rungs}, never 4"), note
    assert "pad_to_group: true" in note
    with torch.inference_mode():
        assert torch.isfinite(model(torch.tensor([[5, 6, 7, 8]])).logits).all()


@pytest.mark.model
def test_pad_to_group_lets_those_layers_take_4_bits(qwen2_688_dir):
    from variantlab.models.loading import load_causal_lm
    opts = parse_options(RECIPE, {**QWEN_FAST, "pad_to_group": True})
    model, _ = load_causal_lm(qwen2_688_dir, RECIPE.load_dtype(opts), "cpu")
    facts = RECIPE.apply(model, opts, "cpu")
    assert set(facts.extra["plan"].values()) == {4} and facts.extra["no_int4"] == {}
    assert not any("does not divide" in n for n in facts.notes)
