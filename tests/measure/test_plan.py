"""The plan (measure/plan.py): a suite file turned into variants, samples, trackers, rounds and the
order each round runs them in — checked up front, and without importing torch."""
from __future__ import annotations

import json
import shutil
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from variantlab.data.structured import generate_samples
from variantlab.errors import DatasetError, ModelLoadError, RecipeError, SuiteError, VariantlabError
from variantlab.measure.plan import CALIBRATION_LIMIT, plan_suite_file
from variantlab.measure.trackers import tracker_from_config
from variantlab.models.loading import BUILTIN_MODELS

NAMES = ["fp32", "bf16", "fp16", "int8", "int4"]
RECIPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "int8": "int8", "int4": "int4"}


def write_suite(tmp_path: Path, names=("fp32", "bf16", "fp16"), **extra) -> Path:
    suite = {"name": "t", "model": "builtin:tiny-structured",
             "variants": [{"name": n, "recipe": RECIPES[n]} for n in names],
             "workload": {"dataset": {"generator": "structured", "n": 6, "seed": 0}, "max_new_tokens": 4,
                          "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 0}]}}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(suite.get(key), dict):
            suite[key] = suite[key] | value
        else:
            suite[key] = value
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def texts(samples) -> tuple[str, ...]:
    return tuple(s["prompt"] + " " + s["answer"] for s in samples)


# ---------------------------------------------------------------- variants and order

def test_the_baseline_comes_first_and_the_others_keep_their_order(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, ("fp32", "bf16", "fp16"), baseline="bf16"))
    assert [v.name for v in plan.variants] == ["bf16", "fp32", "fp16"]
    assert plan.baseline == "bf16"
    assert plan.variant("fp16").definition.recipe == "fp16"
    assert plan.variant("fp32").source == BUILTIN_MODELS["tiny-structured"]


def test_rotate_order_shifts_by_one_each_round(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, ("fp32", "bf16", "fp16"), rounds=4, order="rotate"))
    assert [plan.order(r) for r in range(5)] == [
        ["fp32", "bf16", "fp16"], ["bf16", "fp16", "fp32"], ["fp16", "fp32", "bf16"],
        ["fp32", "bf16", "fp16"], ["bf16", "fp16", "fp32"]]
    assert plan.to_json()["order"] == [plan.order(r) for r in range(4)]


def test_random_order_is_a_permutation_every_round_and_fixed_by_the_seed_and_the_run(tmp_path):
    a = plan_suite_file(write_suite(tmp_path / "a", NAMES, order="random", seed=3, rounds=8)).for_run("r1")
    again = plan_suite_file(write_suite(tmp_path / "b", NAMES, order="random", seed=3, rounds=8)).for_run("r1")
    other = plan_suite_file(write_suite(tmp_path / "c", NAMES, order="random", seed=4, rounds=8)).for_run("r1")
    orders = [a.order(r) for r in range(8)]
    for o in orders:
        assert sorted(o) == sorted(NAMES)
    assert orders == [again.order(r) for r in range(8)]            # deterministic for the suite's seed and run
    assert orders == [a.order(r) for r in range(8)]                # and for the same plan, asked twice
    assert orders != [other.order(r) for r in range(8)]            # another seed, another sequence
    assert orders != [a.for_run("r2").order(r) for r in range(8)]  # another run, another sequence
    assert len({tuple(o) for o in orders}) > 1                     # shuffled per round, not once
    assert orders != [a.order(0)[k:] + a.order(0)[:k] for k in range(8)]  # not a rotation


def test_with_rounds_gives_a_new_plan(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, rounds=5))
    fewer = plan.with_rounds(2)
    assert (plan.rounds, fewer.rounds) == (5, 2)
    assert len(fewer.to_json()["order"]) == 2 and len(plan.to_json()["order"]) == 5
    assert fewer.variants == plan.variants and fewer.samples == plan.samples


def test_to_json_is_json_and_rebuilds_the_trackers(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, ("fp32", "bf16"), rounds=3))
    d = json.loads(json.dumps(plan.to_json()))
    assert d["baseline"] == "fp32" and d["rounds"] == 3 and d["samples"] == 6
    assert [v["name"] for v in d["variants"]] == ["fp32", "bf16"]
    assert d["variants"][1]["recipe"] == "bf16"
    assert d["variants"][0]["source"] == str(BUILTIN_MODELS["tiny-structured"])
    rebuilt = [tracker_from_config(t["kind"], t["config"]) for t in d["trackers"]]
    assert [t.name for t in rebuilt] == [t.name for t in plan.trackers]
    assert [t.config() for t in rebuilt] == [t.config() for t in plan.trackers]


# ---------------------------------------------------------------- trackers from the workload

def test_workload_stop_and_length_reach_every_generating_tracker(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, workload={"stop": ["END", ";"], "max_new_tokens": 7}))
    configs = {t.name: t.config() for t in plan.trackers}
    assert configs["single-stream"]["workload"]["stop"] == ["END", ";"]
    assert configs["grading"]["workload"]["stop"] == ["END", ";"]
    assert configs["grading"]["workload"]["max_new_tokens"] == 7


def test_standard_trackers_in_order(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path))
    assert [t.name for t in plan.trackers] == ["cold_start", "machine", "single-stream", "memory", "facts",
                                               "stability", "grading", "scoring"]


@pytest.mark.parametrize("accuracy, grading, scoring", [
    ({"graded": 0}, None, {"samples": 6}),            # graded off; scoring capped at the dataset's 6
    ({"graded": 100, "samples": 0}, 6, None),         # more than the dataset: all 6; scoring off
    ({"graded": 2, "samples": 3}, 2, {"samples": 3}),
    ({}, 6, {"samples": 6}),                          # default: every sample graded
])
def test_accuracy_settings_choose_the_accuracy_trackers(tmp_path, accuracy, grading, scoring):
    plan = plan_suite_file(write_suite(tmp_path, workload={"accuracy": accuracy}))
    configs = {t.name: t.config() for t in plan.trackers}
    assert (configs["grading"]["samples"] if "grading" in configs else None) == grading
    assert configs.get("scoring") == scoring


# ---------------------------------------------------------------- samples and calibration

def test_generated_samples_keep_the_generators_ids(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path))
    expected = generate_samples(6, 0)
    assert [s["id"] for s in plan.samples] == [str(s["id"]) for s in expected]
    assert len({s["id"] for s in plan.samples}) == 6
    assert [(s["prompt"], s["answer"]) for s in plan.samples] == [(s["prompt"], s["answer"]) for s in expected]


def test_jsonl_samples_keep_their_ids_as_strings(tmp_path):
    lines = [{"id": 17, "prompt": "a?", "answer": "1"}, {"prompt": "b?", "answer": "2"},
             {"id": "x", "prompt": "c?", "answer": "3"}]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    plan = plan_suite_file(write_suite(tmp_path, workload={"dataset": {"path": "data.jsonl", "n": 3}}))
    assert [s["id"] for s in plan.samples] == ["17", "1", "x"]
    assert plan.samples[1]["prompt"] == "b?"


def test_a_jsonl_shorter_than_the_n_asked_for_is_refused_unless_n_is_the_default(tmp_path):
    """Issue 13: 3 records against n: 5 measured 3 samples without a word."""
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"{i}?", "answer": "a"}) + "\n"
                                                 for i in range(3)))
    with pytest.raises(DatasetError) as e:
        plan_suite_file(write_suite(tmp_path, workload={"dataset": {"path": "data.jsonl", "n": 5}}))
    assert e.value.field == "workload.dataset.n" and "3 records, fewer than the n: 5" in e.value.one_line()
    assert "n: 3 or less" in e.value.one_line() and "data.jsonl" in e.value.one_line()
    assert len(plan_suite_file(write_suite(tmp_path, workload={"dataset": {"path": "data.jsonl"}})).samples) == 3


def test_calibration_defaults_to_the_workload_samples(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path))
    assert plan.calibration_texts == texts(plan.samples)


def test_calibration_dataset_of_the_suite_is_used(tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, calibration={"generator": "structured", "n": 3, "seed": 5}))
    assert plan.calibration_texts == texts(generate_samples(3, 5))
    assert plan.calibration_texts != texts(plan.samples[:3])
    assert len(plan.samples) == 6                      # the workload keeps its own samples


def test_calibration_from_jsonl_relative_to_the_suite(tmp_path):
    (tmp_path / "calib.jsonl").write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n")
    plan = plan_suite_file(write_suite(tmp_path, calibration={"path": "calib.jsonl"}))
    assert plan.calibration_texts == ("p a",)


def test_calibration_texts_are_capped(tmp_path):
    n = CALIBRATION_LIMIT + 5
    plan = plan_suite_file(write_suite(tmp_path, calibration={"generator": "structured", "n": n, "seed": 1}))
    assert len(plan.calibration_texts) == CALIBRATION_LIMIT
    assert plan.calibration_texts == texts(generate_samples(n, 1))[:CALIBRATION_LIMIT]


# ---------------------------------------------------------------- input problems, before anything runs

def test_an_unknown_recipe_is_raised_with_its_field(tmp_path):
    path = write_suite(tmp_path)
    suite = yaml.safe_load(path.read_text())
    suite["variants"][1]["recipe"] = "int3"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(RecipeError) as info:
        plan_suite_file(path)
    assert info.value.field == "variants[1].recipe" and info.value.file == str(path)


def test_a_missing_dataset_is_raised(tmp_path):
    with pytest.raises(DatasetError):
        plan_suite_file(write_suite(tmp_path, workload={"dataset": {"path": "nowhere.jsonl"}}))


# ---------------------------------------------------------------- the machine

def test_device_cuda_without_cuda_is_a_planning_error(tmp_path):
    """Issue 13: each variant failed with an AssertionError in its worker instead."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SuiteError) as e:
        plan_suite_file(write_suite(tmp_path, device="cuda"))
    line = e.value.one_line()
    assert e.value.field == "device" and "cuda asked for, but" in line and "cpu" in line


def test_planning_never_imports_torch(tmp_path):
    path = write_suite(tmp_path, ("fp32", "bf16", "int8"), rounds=3,
                       calibration={"generator": "structured", "n": 2, "seed": 1})
    code = ("import sys, json\n"
            "from variantlab.measure.plan import plan_suite_file\n"
            f"p = plan_suite_file({str(path)!r})\n"
            "json.dumps(p.to_json()); p.order(1); [t.metrics() for t in p.trackers]\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print(len(p.variants))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"


# ---------------------------------------------------------------- checks that used to run only in the worker

def suite_with(tmp_path: Path, variants: list[dict], **extra) -> Path:
    path = write_suite(tmp_path, **extra)
    suite = yaml.safe_load(path.read_text())
    suite["variants"] = variants
    path.write_text(yaml.safe_dump(suite))
    return path


def planning_error(path: Path):
    with pytest.raises(VariantlabError) as info:
        plan_suite_file(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{path}: ")
    return info.value


def sweep(lengths, decode_tokens=4) -> dict:
    return {"scenarios": [{"type": "length-sweep", "lengths": lengths, "decode_tokens": decode_tokens,
                           "repeats": 1, "warmup": 0}]}


def test_a_length_sweep_past_a_learned_position_table_is_refused_naming_the_limit(tmp_path, family_dirs):
    """Issue 13: 1,100 tokens against GPT-2's 1,024 positions raised IndexError in the worker (here: 128)."""
    gpt2 = str(family_dirs["gpt2"])
    err = planning_error(write_suite(tmp_path, model=gpt2, workload=sweep([64, 125, 200])))
    line = err.one_line()
    assert isinstance(err, SuiteError) and err.field == "workload.scenarios[0].lengths"
    assert "lengths 125, 200 + 4 decoded tokens need 204 positions" in line and "has 128" in line
    assert "n_positions: 128" in line and gpt2 in line and err.accepted == "lengths up to 124"
    plan = plan_suite_file(write_suite(tmp_path, model=gpt2, workload=sweep([64, 124])))   # 124 + 4 = 128 fits
    assert [v.name for v in plan.variants] == ["fp32", "bf16", "fp16"]


def test_max_new_tokens_past_a_learned_position_table_is_refused(tmp_path, family_dirs):
    err = planning_error(write_suite(tmp_path, model=str(family_dirs["gpt2"]), workload={"max_new_tokens": 128}))
    assert err.field == "workload.max_new_tokens" and err.accepted == "max_new_tokens up to 127"


def prompts_dataset(tmp_path: Path, model_dir: Path, repeats=(1, 6, 3)) -> list[int]:
    """data.jsonl of prompts of growing length (sample ids p0, p1, …); their token counts, as the model's own
    tokenizer gives them with its special tokens (what the engine sends)."""
    from transformers import AutoTokenizer
    prompts = ["order ORD-5493 is pending. " * k + "Q: What is the status?\nA:" for k in repeats]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "answer": "pending"}) + "\n"
                                                 for i, p in enumerate(prompts)))
    tok = AutoTokenizer.from_pretrained(model_dir)
    return [len(tok(p, add_special_tokens=True).input_ids) for p in prompts]


def test_the_datasets_prompts_plus_max_new_tokens_past_a_learned_position_table_are_refused(tmp_path, family_dirs):
    """Issue 22: max_new_tokens 1,000 after GPT-2 prompts of 66–146 tokens passed planning (1,000 + 1 fits in
    1,024) and every scenario raised IndexError in the worker. Here: 128 positions."""
    gpt2 = family_dirs["gpt2"]
    counts = prompts_dataset(tmp_path, gpt2)
    longest = max(counts)
    assert counts.index(longest) == 1 and 40 < longest < 100
    fits = 128 - longest
    err = planning_error(write_suite(tmp_path, model=str(gpt2), workload={"dataset": {"path": "data.jsonl"},
                                                                         "max_new_tokens": fits + 1}))
    line = err.one_line()
    assert isinstance(err, SuiteError) and err.field == "workload.max_new_tokens"
    assert err.accepted == f"max_new_tokens up to {fits}, or prompts of at most {128 - fits - 1} tokens"
    assert f"of data.jsonl + max_new_tokens {fits + 1}" in line
    assert f"sample 'p1', is {longest} tokens and needs 129" in line and "has 128: config.json n_positions" in line
    plan = plan_suite_file(write_suite(tmp_path, model=str(gpt2), workload={"dataset": {"path": "data.jsonl"},
                                                                           "max_new_tokens": fits}))
    assert len(plan.samples) == 3


def test_a_prompt_that_fills_the_position_table_is_the_datasets_problem(tmp_path, family_dirs):
    gpt2 = family_dirs["gpt2"]
    counts = prompts_dataset(tmp_path, gpt2, repeats=(1, 30))
    assert counts[1] >= 128
    err = planning_error(write_suite(tmp_path, model=str(gpt2), workload={"dataset": {"path": "data.jsonl"},
                                                                         "max_new_tokens": 4}))
    assert isinstance(err, DatasetError) and err.field == "workload.dataset"
    assert err.accepted == "prompts of at most 124 tokens" and "1 of 2 prompts" in err.one_line()


def test_the_generated_dataset_is_named_when_its_prompts_do_not_fit(tmp_path, family_dirs):
    err = planning_error(write_suite(tmp_path, model=str(family_dirs["gpt2"]), workload={"max_new_tokens": 120}))
    assert err.field == "workload.max_new_tokens" and "of the structured dataset (n 6, seed 0)" in err.one_line()


def test_the_attention_error_check_stops_at_a_learned_position_table_and_says_so(tmp_path, family_dirs):
    """Issue 22: the check ran at 2,048 tokens on GPT-2 (1,024 positions) and every variant's row was empty
    (IndexError). Capped at the table (here 128), with the row's note saying why."""
    plan = plan_suite_file(write_suite(tmp_path, model=str(family_dirs["gpt2"])))
    stability = next(t for t in plan.trackers if t.name == "stability")
    assert stability.lengths == (128,)
    (row,) = stability.metrics()
    assert row.label == "Attention rel. error vs fp64 @128 tokens"
    note = row.note(None)
    assert note.startswith("capped at the model's 128 positions (config.json n_positions: 128")
    assert note.endswith("measured at 128 tokens, not 512, 2048")
    assert tracker_from_config("stability", stability.config()) == stability      # crosses to the worker
    rotary = next(t for t in plan_suite_file(write_suite(tmp_path / "r")).trackers if t.name == "stability")
    assert rotary.lengths == (512, 2048) and rotary.config() == {"lengths": [512, 2048]}
    assert rotary.metrics()[0].note(None) is None


def test_rotary_models_take_any_length(tmp_path):
    """The reference model (rotary, max_position_embeddings 512) computes positions for any length: the
    shipped examples sweep to 2,048 tokens on it."""
    assert plan_suite_file(write_suite(tmp_path, workload=sweep([64, 2048]))).variants


def test_every_problem_of_a_variant_is_reported_at_once(tmp_path):
    """Issue 13: a variant with two problems reported only the first."""
    path = suite_with(tmp_path, [{"name": "base"},
                                 {"name": "bad", "recipe": "int4", "options": {"group_size": 48}, "attention": "gqa:3"}])
    err = planning_error(path)
    line = err.one_line()
    assert isinstance(err, RecipeError) and line.startswith(f"{path}: 2 problems: variants[1].options: ")
    assert "group_size" in line and "; variants[1].attention: attention 'gqa:3'" in line
    assert "gqa:1 | gqa:2 | gqa:4" in line
    assert [p.field for p in err.problems] == ["variants[1].options", "variants[1].attention"]


def test_the_problems_of_every_variant_are_reported_at_once(tmp_path, tiny_model_dir):
    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    (broken / "tokenizer.json").unlink()
    path = suite_with(tmp_path, [{"name": "base"}, {"name": "a", "recipe": "int3"},
                                 {"name": "b", "model": "broken"}, {"name": "c", "attention": "gqa:3"}])
    err = planning_error(path)
    assert type(err) is VariantlabError      # a RecipeError and a ModelLoadError
    assert [p.field for p in err.problems] == ["variants[1].recipe", "variants[2].model", "variants[3].attention"]
    assert "3 problems" in err.one_line() and "has no tokenizer" in err.one_line()


def test_one_problem_is_raised_as_it_is(tmp_path):
    err = planning_error(suite_with(tmp_path, [{"name": "base"}, {"name": "c", "attention": "gqa:3"}]))
    assert isinstance(err, RecipeError) and err.field == "variants[1].attention" and not hasattr(err, "problems")


def test_a_variants_checkpoint_that_does_not_match_its_config_is_a_planning_error(tmp_path, tiny_model_dir):
    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(cfg | {"hidden_size": 64}))
    err = planning_error(suite_with(tmp_path, [{"name": "base"}, {"name": "own", "model": "broken"}]))
    assert isinstance(err, ModelLoadError) and err.field == "variants[1].model"
    assert "config.json says hidden_size: 64, but the weights have 32 columns" in err.one_line()


def test_a_baseline_the_device_cannot_build_is_a_planning_error(tmp_path):
    """A CUDA-only baseline on `device: cpu` left nothing to compare against; as another variant it is measured
    as 'unsupported' (the report says why), so only the baseline is refused."""
    err = planning_error(suite_with(tmp_path, [{"name": "sparse", "recipe": "sparse"}, {"name": "fp32"}],
                                    device="cpu"))
    assert isinstance(err, RecipeError) and err.field == "variants[0].recipe"
    assert "the baseline cannot be built" in err.one_line() and "needs CUDA" in err.one_line()
    plan = plan_suite_file(suite_with(tmp_path, [{"name": "fp32"}, {"name": "sparse", "recipe": "sparse"}],
                                      device="cpu"))
    assert plan.variant("sparse").definition.recipe == "sparse"


# ---------------------------------------------------------------- group sizes, from config.json (issue 22)

def test_a_group_size_that_divides_no_layer_width_is_refused_while_planning(tmp_path, qwen2_688_dir):
    """Qwen2-style intermediate 688 with group_size 64 was found only when the variant was built."""
    path = suite_with(tmp_path, [{"name": "base"}, {"name": "q4", "recipe": "int4", "options": {"group_size": 64}}],
                      model=str(qwen2_688_dir))
    err = planning_error(path)
    line = err.one_line()
    assert isinstance(err, RecipeError) and err.field == "variants[1].options.group_size", line
    assert "variant 'q4': group_size 64 does not divide in_features 688 (mlp.down_proj)" in line
    assert "Qwen2ForCausalLM" in line and "config.json" in line
    assert err.accepted.startswith("pad_to_group: true")
    assert "none of 32 | 64 | 128 divides every in_features (64, 688)" in line
    padded = suite_with(tmp_path, [{"name": "base"}, {"name": "q4", "recipe": "int4",
                                                      "options": {"group_size": 64, "pad_to_group": True}}],
                        model=str(qwen2_688_dir))
    assert plan_suite_file(padded).variant("q4").definition.options == {"group_size": 64, "pad_to_group": True}


@pytest.mark.parametrize("variant", [{"recipe": "w4a8"}, {"recipe": "int4", "options": {"group_size": 128}},
                                     {"weight_dtype": "int4", "activation_dtype": "bf16"}])
def test_every_group_wise_recipe_and_vocabulary_is_checked(tmp_path, qwen2_688_dir, variant):
    err = planning_error(suite_with(tmp_path, [{"name": "base"}, {"name": "q", **variant}],
                                    model=str(qwen2_688_dir)))
    assert err.field == "variants[1].options.group_size" and "688 (mlp.down_proj)" in err.one_line()


def test_the_refusal_lists_the_group_sizes_that_divide_every_width(tmp_path, tiny_model_dir):
    """The conftest Llama is 32 wide (intermediate 64): 64 divides its MLP's down_proj, not the rest."""
    err = planning_error(suite_with(tmp_path, [{"name": "base"}, {"name": "q4", "recipe": "w4a8"}],
                                    model=str(tiny_model_dir)))
    line = err.one_line()
    assert "group_size 64 does not divide in_features 32 (self_attn.q_proj, self_attn.k_proj" in line, line
    assert "mlp.down_proj" not in line.split("(accepted")[0]
    assert err.accepted == "group_size 32 for this model, or pad_to_group: true"
    plan = plan_suite_file(suite_with(tmp_path, [{"name": "base"}, {"name": "q4", "recipe": "w4a8",
                                                                    "options": {"group_size": 32}}],
                                      model=str(tiny_model_dir)))
    assert plan.variant("q4").definition.recipe == "w4a8"


def test_a_group_size_problem_is_reported_with_the_variants_other_problems(tmp_path, tiny_model_dir):
    path = suite_with(tmp_path, [{"name": "base"}, {"name": "q4", "recipe": "int4", "attention": "gqa:3"}],
                      model=str(tiny_model_dir))
    err = planning_error(path)
    assert [p.field for p in err.problems] == ["variants[1].attention", "variants[1].options.group_size"]


def test_an_architecture_whose_layer_shapes_are_unknown_is_not_refused(tmp_path, qwen2_688_dir):
    """No table entry, no refusal: the build says what it finds (a wrong refusal is worse than none)."""
    other = shutil.copytree(qwen2_688_dir, tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(cfg | {"architectures": ["SomeNewForCausalLM"]}))
    plan = plan_suite_file(suite_with(tmp_path, [{"name": "base"}, {"name": "q4", "recipe": "int4"}],
                                      model=str(other)))
    assert plan.variant("q4").definition.recipe == "int4"


def test_mixed_is_not_refused_and_says_before_measuring_which_layers_stay_wider(tmp_path, qwen2_688_dir):
    path = suite_with(tmp_path, [{"name": "base"}, {"name": "m", "recipe": "mixed"}], model=str(qwen2_688_dir))
    plan = plan_suite_file(path)
    assert plan.variant("m").definition.recipe == "mixed"
    [warning] = [w for w in plan.warnings if "variant 'm'" in w]
    assert warning.startswith("variants[1].options.group_size: variant 'm': group_size 64 does not divide "
                              "in_features 688 of mlp.down_proj in each layer of Qwen2ForCausalLM")
    assert "8 or 16 bits, never 4" in warning and "pad_to_group: true" in warning
    quiet = plan_suite_file(suite_with(tmp_path, [{"name": "base"}, {"name": "m", "recipe": "mixed",
                                                                     "options": {"pad_to_group": True}}],
                                       model=str(qwen2_688_dir)))
    assert not quiet.warnings


def test_rounds_are_shuffled_afresh_for_every_run_by_default(tmp_path):
    """Issue 50: a fixed rotation keeps one variant on the even jobs of three variants over three rounds (A B C,
    B C A, C A B: C is job 2, 4 and 6), where a load that switches every other job lands on it every round. By
    default every round is shuffled, and every run draws its own."""
    plan = plan_suite_file(write_suite(tmp_path, ("fp32", "bf16", "fp16"), rounds=3))
    assert plan.suite.order == "random"
    rotated = plan_suite_file(write_suite(tmp_path / "r", ("fp32", "bf16", "fp16"), rounds=3, order="rotate"))
    jobs = [name for r in range(3) for name in rotated.order(r)]
    assert {k % 2 for k, name in enumerate(jobs) if name == "fp16"} == {0}
    layouts = {tuple(tuple(plan.for_run(f"run-{i}").order(r)) for r in range(3)) for i in range(20)}
    assert len(layouts) > 10
    assert plan.for_run("x").to_json()["order"] == [plan.for_run("x").order(r) for r in range(3)]
    # a plan of no run draws as runs stored before run ids did, so that such a run still resumes
    legacy = []
    for r in range(3):
        names = ["fp32", "bf16", "fp16"]
        random.Random(plan.suite.seed * 1_000_003 + r).shuffle(names)
        legacy.append(names)
    assert [plan.order(r) for r in range(3)] == legacy
