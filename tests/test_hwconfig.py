"""The hardware-aware configuration (hwconfig.py): recorded facts of other machines → expected choices;
the fallback never raises; `recipe: auto` plans and resolves. No wall-clock time is asserted: kernel
times here are recorded figures, and the real measuring path is only checked for its shape."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from variantlab.device_facts import DeviceFacts, GpuFacts, architecture, isa_features
from variantlab.errors import RecipeError, VariantlabError
from variantlab.hwconfig import BATCH_HEAVY, DECODE_HEAVY, Phase, Workload, crossover, hardware_config
from variantlab.kernel_times import KernelTimes

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Recorded on our build CPU (1024→1024, 2 threads, ms), rounded: weight-only wins decode, loses batched.
RECORDED_MS = {
    "fp32": (0.158, 0.151, 0.204, 0.306, 0.709, 0.903, 1.276, 2.203, 3.693),
    "bf16": (0.115, 0.113, 0.134, 0.149, 0.297, 0.344, 0.478, 0.805, 1.402),
    "int8": (0.060, 0.070, 0.099, 0.151, 0.353, 0.559, 1.007, 1.900, 3.656),
    "int4": (0.053, 0.055, 0.072, 0.120, 0.221, 0.412, 0.808, 1.591, 3.160),
    "w8a8": (0.090, 0.089, 0.094, 0.081, 0.464, 0.360, 0.434, 0.786, 1.950),
}

SPR = ("fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 "
       "amx_bf16 amx_int8 amx_tile").split()        # Sapphire Rapids
ZEN4 = "fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16".split()
SKYLAKE = "fpu sse sse2 avx avx2 fma avx512f avx512bw".split()
HASWELL = "fpu sse sse2 avx avx2 fma".split()


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    """A kernel-times cache of the test's own, with our kernels reported absent: the cache key asks whether they
    run, and in a fresh cache that would build them (40-70 s)."""
    from variantlab.variants import kernels as vk
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(vk, "available", lambda: False)
    return tmp_path


def kernel_times(ms=RECORDED_MS, compute="bf16", failed=None) -> KernelTimes:
    return KernelTimes("cpu", 2, 1024, 1024, compute, 64, ROWS,
                       {p: tuple(t / 1e3 for t in ts) for p, ts in ms.items()}, {p: () for p in ms},
                       dict(failed or {}), "recorded", 1.0)


def cpu(flags, cores=2) -> DeviceFacts:
    return DeviceFacts("recorded CPU", cores, cores, isa_features(flags))


def gpu(capability: str, flags=SPR) -> DeviceFacts:
    major, minor = (int(x) for x in capability.split("."))
    return DeviceFacts("recorded CPU", 16, 32, isa_features(flags),
                       (GpuFacts("recorded GPU", capability, architecture(major, minor), 80 * 2**30, "1", "12"),))


@pytest.mark.parametrize("flags, dtype", [(SPR, "bf16"), (ZEN4, "bf16"), (SKYLAKE, "fp32"), (HASWELL, "fp32"),
                                         ("fp asimd sve".split(), "fp32")])   # an Arm server
def test_cpu_dtype_follows_native_bf16(flags, dtype):
    cfg = hardware_config(cpu(flags), None, kernel_times(), DECODE_HEAVY)
    assert cfg.choice("dtype").value == dtype
    assert not cfg.fallback
    assert cfg.choice("TF32").value is False and cfg.choice("fp8").value == "not available"
    assert cfg.choice("threads").value == 2


def test_decode_picks_weight_only_and_batch_picks_past_the_crossover():
    kt = kernel_times()
    decode = hardware_config(cpu(SPR), None, kt, DECODE_HEAVY)
    batch = hardware_config(cpu(SPR), None, kt, BATCH_HEAVY)
    assert decode.recipe in ("int8", "int4") and decode.options == {"compute_dtype": "bf16"}
    assert batch.recipe in ("bf16", "w8a8")
    assert crossover(kt, list(RECORDED_MS)) == 32 == decode.choice("crossover M").value
    assert decode.choice("decode kernel (M=1)").value == "int4"
    # every choice says why, with the figures that decided it
    assert "int4 0.053 ms" in decode.choice("decode kernel (M=1)").reason
    assert all(c.reason for c in decode.choices)
    assert decode.summary().startswith(decode.recipe)


# Recorded on the AVX2 EPYC (no AVX-512, no native bf16; `variantlab hw`, 2026-12-06, 1024→1024, 2 threads, ms):
# our kernels take fp32 and bf16 activations there, aten's int4 only bf16 fast (fp32 x is ~18x slower).
AVX2_MS = {
    "fp32": {"fp32": (0.183, 0.199, 0.259, 0.293, 0.719, 0.910, 1.496, 2.553, 4.079),
             "bf16": (0.115, 0.144, 0.206, 0.240, 0.969, 1.145, 1.983, 3.105, 4.374),
             "int8": (0.083, 0.140, 0.185, 0.183, 0.306, 0.579, 1.107, 2.138, 4.284),
             "int4": (1.086, 2.096, 4.151, 8.302, 16.563, 33.395, 66.558, 131.676, 265.245),
             "w8a8": (0.081, 0.074, 0.082, 0.111, 0.192, 0.341, 0.665, 1.272, 2.493)},
    "bf16": {"fp32": (0.161, 0.189, 0.258, 0.279, 0.705, 0.959, 1.533, 2.504, 4.021),
             "bf16": (0.117, 0.150, 0.208, 0.248, 1.035, 1.333, 1.965, 2.936, 4.455),
             "int8": (0.086, 0.082, 0.111, 0.229, 0.511, 0.889, 1.645, 3.156, 6.173),
             "int4": (0.060, 0.065, 0.095, 0.162, 0.298, 0.567, 1.105, 2.219, 4.342),
             "w8a8": (0.072, 0.074, 0.081, 0.111, 0.188, 0.342, 0.649, 1.273, 2.472)},
}


@pytest.mark.parametrize("facts, device, dtypes", [
    (cpu(HASWELL), "cpu", ("fp32", "bf16")), (cpu(SKYLAKE), "cpu", ("fp32", "bf16")),
    (cpu("fp asimd".split()), "cpu", ("fp32", "bf16")), (cpu(ZEN4), "cpu", ("bf16",)), (cpu(SPR), "cpu", ("bf16",)),
    (gpu("8.0"), "cuda:0", ("bf16",)), (gpu("7.5"), "cuda:0", ("fp16",)),
    (cpu([]), "cpu", ()), (gpu("13.0"), "cuda:0", ()),
])
def test_kernels_are_timed_in_both_dtypes_only_where_no_rule_settles_it(facts, device, dtypes):
    from variantlab.hwconfig import timed_dtypes
    assert timed_dtypes(facts, None, device) == dtypes


def test_a_cpu_without_native_bf16_computes_in_the_dtype_its_kernel_times_favour():
    both = (kernel_times(AVX2_MS["fp32"], compute="fp32"), kernel_times(AVX2_MS["bf16"], compute="bf16"))
    weight_only = hardware_config(cpu(HASWELL), None, both, DECODE_HEAVY, candidates=("int4", "int8"))
    assert (weight_only.recipe, weight_only.options) == ("int4", {"compute_dtype": "bf16"})
    reason = weight_only.choice("dtype").reason
    assert weight_only.choice("dtype").value == "bf16" and "measured" in reason
    assert reason.index("bf16: int4") < reason.index("fp32: int8")         # each dtype's best, least first
    # the rule alone (one dtype timed) would have run int4 on aten's fp32 kernel, 18x slower at M = 1
    rule = hardware_config(cpu(HASWELL), None, both[0], DECODE_HEAVY, candidates=("int4", "int8"))
    assert (rule.choice("dtype").value, rule.recipe, rule.options) == ("fp32", "int8", {"compute_dtype": "fp32"})
    # w8a8's activations are int8 in either dtype: where its two estimates are within 5%, the line says so
    slower = {"w8a8": tuple(t * 1.02 for t in AVX2_MS["fp32"]["w8a8"])}
    w8a8 = hardware_config(cpu(HASWELL), None, (kernel_times(AVX2_MS["fp32"], compute="fp32"),
                                                kernel_times(slower, compute="bf16")), DECODE_HEAVY,
                           candidates=("w8a8",))
    assert w8a8.choice("dtype").value == "fp32" and "near tie" in w8a8.choice("dtype").reason
    assert "near tie" not in weight_only.choice("dtype").reason


def test_dense_weights_are_weighed_by_the_workload_not_by_a_dtype_rule():
    """bf16 weights read half fp32's bytes, so they decode faster even where bf16 dot products are emulated;
    past 8 rows fp32 wins. The workload decides: single stream bf16, offline fp32."""
    both = (kernel_times(AVX2_MS["fp32"], compute="fp32"), kernel_times(AVX2_MS["bf16"], compute="bf16"))
    dense = ("fp32", "bf16")
    decode = hardware_config(cpu(HASWELL), None, both, DECODE_HEAVY, candidates=dense)
    batch = hardware_config(cpu(HASWELL), None, both, BATCH_HEAVY, candidates=dense)
    assert (decode.recipe, batch.recipe) == ("bf16", "fp32")
    assert decode.choice("dtype").value == "fp32" == batch.choice("dtype").value   # no quantized candidate: the rule
    assert decode.options == {} == batch.options


def test_machine_inputs_time_each_dtype_the_rule_leaves_open(monkeypatch, empty_cache):
    from variantlab import device_facts as df, hwconfig, kernel_times as kt_mod
    timed = []
    monkeypatch.setattr(kt_mod, "measure_kernel_times", lambda *a, compute_dtype, **k:
                        timed.append(compute_dtype) or kernel_times(compute=compute_dtype))
    for flags, dtypes in ((HASWELL, ["fp32", "bf16"]), (ZEN4, ["bf16"])):
        timed.clear()
        monkeypatch.setattr(df, "device_facts", lambda with_gpus=False, f=flags: cpu(f))
        inputs = hwconfig.machine_inputs(ceilings={"matmul_tflops": {}}, shape=(64, 64 + len(flags)))
        assert timed == dtypes and [kt.compute_dtype for kt in inputs.kernel_times] == dtypes


def test_candidates_narrow_the_choice():
    cfg = hardware_config(cpu(SPR), None, kernel_times(), DECODE_HEAVY, candidates=("fp32", "bf16"))
    assert cfg.recipe == "bf16" and cfg.options == {}


def test_compile_is_a_rule_that_pays_only_for_long_runs():
    short = hardware_config(cpu(SPR), None, kernel_times(), DECODE_HEAVY)
    assert short.compile is False and "rule" in short.choice("compile").reason
    long = Workload("a server", (Phase("decode, batch 1", 1, 10_000_000),), layers=64)
    assert hardware_config(cpu(SPR), None, kernel_times(), long).compile is True


@pytest.mark.parametrize("cap, dtype, tf32, fp8", [
    ("8.0", "bf16", True, "not available"),
    ("8.9", "bf16", True, "available, no fp8 recipe yet"),
    ("9.0", "bf16", True, "available, no fp8 recipe yet"),
    ("10.0", "bf16", True, "available, no fp8 recipe yet"),
    ("12.9", "bf16", True, "available, no fp8 recipe yet"),   # a new minor of a known major: Blackwell
    ("7.0", "fp16", False, "not available"),
    ("7.5", "fp16", False, "not available"),
])
def test_cuda_capabilities_map_to_dtype_tf32_and_fp8(cap, dtype, tf32, fp8):
    cfg = hardware_config(gpu(cap), None, kernel_times(compute=dtype), BATCH_HEAVY)
    assert cfg.device == "cuda:0"
    assert cfg.choice("dtype").value == dtype
    assert cfg.choice("TF32").value is tf32
    assert cfg.choice("fp8").value == fp8
    assert not cfg.fallback


def test_hopper_says_fp8_is_there_but_unused():
    reason = hardware_config(gpu("9.0"), None, kernel_times(), BATCH_HEAVY).choice("fp8").reason
    assert "Hopper" in reason and "no variantlab recipe" in reason


@pytest.mark.parametrize("facts, device", [
    (cpu([]), "cpu"),                                    # no instruction-set flags
    (gpu("13.0"), "cuda:0"),                             # an architecture the table does not know
    (gpu("9.0"), "cuda:3"),                              # a device the facts do not list
    ({"cores": 8, "isa": {}, "gpus": [{"name": "x"}]}, "cuda"),   # a GPU with no capability recorded
    ({"cores": None, "isa": {}, "gpus": []}, None),      # recorded JSON with nothing in it
])
def test_unknown_hardware_gets_the_safe_fallback_and_a_note(facts, device):
    cfg = hardware_config(facts, None, kernel_times(), DECODE_HEAVY, device=device)
    assert (cfg.recipe, cfg.options, cfg.compile, cfg.fallback) == ("fp32", {}, False, True)
    assert cfg.choice("dtype").value == "fp32"
    assert cfg.notes and "fp32" in cfg.notes[0]


def test_failed_micro_benchmark_and_untimed_paths_fall_back_or_are_left_out():
    cfg = hardware_config(cpu(SPR), None, None, DECODE_HEAVY)
    assert cfg.fallback and cfg.recipe == "fp32" and "could not be measured" in cfg.notes[0]
    partial = {p: t for p, t in RECORDED_MS.items() if p != "int4"}
    cfg = hardware_config(cpu(SPR), None, kernel_times(partial, failed={"int4": "no kernel"}), DECODE_HEAVY)
    assert cfg.recipe == "int8" and any("int4: no kernel" in n for n in cfg.notes)


def test_recorded_json_round_trips_through_the_pure_function():
    facts = json.loads(json.dumps(cpu(SPR).to_json()))
    kt = json.loads(json.dumps(kernel_times().to_json()))
    cfg = hardware_config(facts, None, kt, DECODE_HEAVY)
    assert cfg == hardware_config(cpu(SPR), None, kernel_times(), DECODE_HEAVY)
    assert json.loads(json.dumps(cfg.to_json()))["recipe"] == cfg.recipe


def test_machine_config_never_raises_when_measuring_fails(monkeypatch, empty_cache):
    from variantlab import hwconfig, kernel_times as kt_mod

    def broken(*a, **k):
        raise RuntimeError("no kernels on this machine")
    monkeypatch.setattr(kt_mod, "measure_kernel_times", broken)
    ceilings = dataclasses.make_dataclass("C", ["matmul_tflops"])({"fp32": 0.2, "bf16": 0.6})
    cfg = hwconfig.machine_config(DECODE_HEAVY, inputs=hwconfig.machine_inputs(ceilings=ceilings, shape=(64, 64)))
    assert cfg.fallback and cfg.recipe == "fp32"
    assert any("micro-benchmark failed: RuntimeError: no kernels" in n for n in cfg.notes)


def test_a_cpu_times_bf16_weights_whatever_the_compute_dtype():
    from variantlab.kernel_times import QUANTIZED, paths_for
    assert paths_for("bf16") == paths_for("fp32") == ("fp32", "bf16") + QUANTIZED
    assert paths_for("fp32", "cuda:0") == ("fp32",) + QUANTIZED          # a GPU times its dtype's only
    assert paths_for("fp16", "cuda:0") == ("fp32", "fp16") + QUANTIZED
    assert paths_for("bf16", "cuda:0") == ("fp32", "bf16") + QUANTIZED


@pytest.mark.parametrize("compute", ["bf16", "fp32"])
def test_the_real_measuring_path_times_every_recipe_here(compute):
    from variantlab.kernel_times import measure_kernel_times
    kt = measure_kernel_times(128, 256, compute_dtype=compute, parameters=128 * 256 * 4, rows=(1, 8, 64),
                              rounds=2, threads=1)
    assert set(kt.seconds) | set(kt.failed) == {"fp32", "bf16", "int8", "int4", "w8a8", "w4a8"}
    assert all(len(ts) == 3 and all(t > 0 for t in ts) for ts in kt.seconds.values())
    assert kt.copies == 4 and kt.threads == 1
    assert KernelTimes.from_json(json.loads(json.dumps(kt.to_json()))) == kt
    cfg = hardware_config(cpu(SPR), None, kt, DECODE_HEAVY)
    assert cfg.recipe in kt.seconds


def test_kernel_times_are_cached_per_machine_and_shape(monkeypatch, empty_cache):
    from variantlab import kernel_times as kt_mod
    calls = []
    monkeypatch.setattr(kt_mod, "measure_kernel_times", lambda *a, **k: calls.append(a) or kernel_times())
    first, hit = kt_mod.cached_kernel_times(1024, 1024, threads=2)
    assert not hit and calls
    again, hit = kt_mod.cached_kernel_times(1024, 1024, threads=2)
    assert hit and again == first and len(calls) == 1
    _, hit = kt_mod.cached_kernel_times(128, 384, threads=2)                # another shape: measured
    assert not hit and len(calls) == 2


# --- recipe: auto in a suite ------------------------------------------------------------------------

SUITE = """
name: auto-test
model: {model}
variants:
  - name: fp32
  - name: auto
    recipe: auto
{extra}
workload:
  dataset: {{generator: structured, n: 8, seed: 0}}
  scenarios:
    - {{type: {scenario}}}
  accuracy: {{samples: 0}}
"""


@pytest.fixture
def recorded_machine(monkeypatch, tmp_path):
    """This machine's inputs replaced by recorded ones: an AVX-512 BF16 CPU and RECORDED_MS."""
    from variantlab import hwconfig
    monkeypatch.setattr(hwconfig, "machine_inputs", lambda *a, **k: hwconfig.MachineInputs(cpu(SPR), None,
                                                                                           (kernel_times(),)))


def write_suite(tmp_path: Path, scenario="single-stream", extra="", model="builtin:tiny-structured") -> Path:
    p = tmp_path / "suite.yaml"
    p.write_text(SUITE.format(model=model, scenario=scenario, extra=extra))
    return p


def test_auto_resolves_at_plan_time_to_a_normal_recipe(recorded_machine, tmp_path):
    from variantlab.measure.plan import plan_suite_file
    plan = plan_suite_file(write_suite(tmp_path))
    v = plan.variant("auto")
    assert v.definition.recipe in ("int8", "int4", "bf16", "w8a8", "fp32")
    assert v.definition.recipe != "auto" and v.resolved["recipe"] == "auto"
    assert v.resolved["resolved_to"] == v.definition.recipe
    assert v.resolved["summary"].startswith(v.definition.recipe)
    listed = next(x for x in plan.to_json()["variants"] if x["name"] == "auto")
    assert listed["resolved"]["config"]["choices"]
    assert "resolved" not in plan.to_json()["variants"][0]


def test_auto_resolves_per_workload_and_keeps_an_explicit_compile(recorded_machine, tmp_path):
    from variantlab.measure.plan import plan_suite_file
    extra = "    options: {workload: batch-heavy}\n    compile: true"
    v = plan_suite_file(write_suite(tmp_path, extra=extra)).variant("auto")
    assert v.definition.recipe in ("bf16", "w8a8") and v.definition.compile is True
    v = plan_suite_file(write_suite(tmp_path, extra="    options: {workload: decode-heavy}")).variant("auto")
    assert v.definition.recipe in ("int8", "int4") and v.definition.compile is False


def test_auto_never_compiles_a_model_our_decode_step_runs(recorded_machine, tmp_path, our_kernels):
    """Compiling swaps our decode step for transformers' modules: where the step runs the model, auto keeps it."""
    from variantlab.measure.plan import plan_suite_file
    v = plan_suite_file(write_suite(tmp_path, extra="    options: {workload: batch-heavy}")).variant("auto")
    assert v.definition.compile is False and v.definition.decode_step
    rule = next(c for c in v.resolved["config"]["choices"] if c["name"] == "compile")
    if rule["value"]:   # the rule alone would compile: the note says why it does not
        assert "decode step runs this model" in " ".join(v.resolved["config"]["notes"])


def test_auto_with_options_it_cannot_take_is_one_line_naming_file_and_field(recorded_machine, tmp_path):
    from variantlab.measure.plan import plan_suite_file
    for extra in ("    options: {group_size: 64}", "    options: {candidates: [int3]}",
                  "    options: {workload: sometimes}"):
        path = write_suite(tmp_path, extra=extra)
        with pytest.raises(RecipeError) as e:
            plan_suite_file(path)
        assert isinstance(e.value, VariantlabError)
        line = e.value.one_line()
        assert "\n" not in line and str(path) in line and "variants[1].options" in line
        assert "recipe 'auto'" in line


def test_planning_without_auto_imports_no_torch(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "plain.yaml"
    path.write_text(SUITE.format(model="builtin:tiny-structured", scenario="single-stream", extra="")
                    .replace("  - name: auto\n    recipe: auto\n", ""))
    code = ("import sys; from variantlab.measure.plan import plan_suite_file; "
            f"plan_suite_file({str(path)!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_the_recipes_command_lists_auto(tmp_path):
    """auto is a planning-time recipe: registered by planning (measure/auto_recipe.py), not among the buildable
    ones, and listed by `variantlab recipes` all the same."""
    from tests.test_cli import run_cli
    from variantlab.measure import auto_recipe  # noqa: F401 - planning imports it, which registers it
    from variantlab.variants.registry import PLAN_TIME, RECIPES, get_recipe
    assert "auto" not in RECIPES and get_recipe("auto") is PLAN_TIME["auto"]
    assert PLAN_TIME["auto"].options_model.model_fields.keys() == {"candidates", "workload"}
    listed = run_cli("recipes", cwd=tmp_path)
    assert listed.returncode == 0 and any(line.split()[1:2] == ["auto"] for line in listed.stdout.splitlines()
                                          if len(line.split()) > 1), listed.stdout


@pytest.mark.slow
def test_auto_plans_on_this_machine_with_real_measurements(tmp_path, fresh_cache):
    from variantlab.measure.plan import plan_suite_file
    v = plan_suite_file(write_suite(tmp_path, scenario="offline")).variant("auto")
    assert v.definition.recipe in ("fp32", "bf16", "int8", "int4", "w8a8", "w4a8")
    assert v.resolved["config"]["choices"][0]["name"] == "dtype"
    assert list((tmp_path / "cache" / "hw").glob("kernels-*.json"))


def test_a_near_tie_is_called_one():
    ms = {"bf16": RECORDED_MS["bf16"], "int8": tuple(t * 1.01 for t in RECORDED_MS["bf16"])}
    reason = hardware_config(cpu(SPR), None, kernel_times(ms), DECODE_HEAVY).choice("recipe").reason
    assert "near tie with int8" in reason
    assert "near tie" not in hardware_config(cpu(SPR), None, kernel_times(), DECODE_HEAVY).choice("recipe").reason


def test_kernel_times_measured_on_a_busy_machine_say_so():
    busy = dataclasses.replace(kernel_times(), load_average=5.0)
    notes = hardware_config(cpu(SPR), None, busy, DECODE_HEAVY).notes
    assert any("busy machine (load average 5.0 on 2 threads)" in n for n in notes)
    assert not hardware_config(cpu(SPR), None, kernel_times(), DECODE_HEAVY).notes


def test_auto_leaves_int4_out_where_the_group_does_not_divide_a_layer_config_json_names(recorded_machine, tmp_path,
                                                                                         tiny_model_dir):
    """hidden 64 and intermediate 128 divide by 64, but o_proj takes 4 heads × head_dim 24 = 96: auto read only
    hidden and intermediate, chose int4, and planning (or the build) then refused it (issue 22)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from variantlab.measure.plan import plan_suite_file
    model_dir = tmp_path / "model"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                                 max_position_embeddings=128)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    extra = "    options: {workload: decode-heavy, candidates: [int4, int8]}"
    v = plan_suite_file(write_suite(tmp_path, extra=extra, model=str(model_dir))).variant("auto")
    assert v.definition.recipe == "int8"
    notes = " ".join(v.resolved["config"]["notes"])
    assert "int4 and w4a8 left out: group size 64 does not divide in_features 96 (self_attn.o_proj)" in notes
    decides = plan_suite_file(write_suite(tmp_path, extra=extra)).variant("auto")      # the reference model: 128 wide
    assert decides.definition.recipe == "int4"
