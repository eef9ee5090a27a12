"""The suite file (suite.py): valid YAML loads with defaults filled in; every bad input raises a
SuiteError whose text is one line naming the file, the field path and what would be accepted."""
from __future__ import annotations

import textwrap

import pytest

from variantlab.errors import SuiteError
from variantlab.measure.scenarios.offline import OfflineSpec
from variantlab.measure.scenarios.single_stream import SingleStreamSpec
from variantlab.suite import DEFAULT_ROUNDS, Suite, load_suite, parse_suite, suite_json_schema

MINIMAL = """\
model: builtin:tiny-structured
variants:
  - name: fp32
"""


def write(tmp_path, text: str, name: str = "suite.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def suite_error(path) -> SuiteError:
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    err = info.value
    text = str(err)
    assert "\n" not in text and text == err.one_line()
    assert str(path) in text and err.file == str(path)
    return err


# --------------------------------------------------------------------------- valid suites

def test_minimal_suite_fills_in_defaults(tmp_path):
    suite = load_suite(write(tmp_path, MINIMAL))
    assert isinstance(suite, Suite)
    assert suite.name == "suite" and suite.model == "builtin:tiny-structured"
    assert [v.name for v in suite.variants] == ["fp32"]
    v = suite.variants[0]
    assert (v.recipe, v.options, v.model, v.compile) == (None, {}, None, None)    # not given: fp32, off
    assert suite.baseline is None and suite.baseline_name == "fp32"
    assert (suite.device, suite.threads, suite.seed, suite.timeout_s) == ("auto", None, 0, 900)
    w = suite.workload
    assert (w.dataset.generator, w.dataset.path, w.dataset.n, w.dataset.seed) == ("structured", None, None, 0)
    assert w.dataset.count == 64
    assert w.max_new_tokens == 24 and w.accuracy.samples == 32
    assert w.scenarios == [SingleStreamSpec(type="single-stream"), OfflineSpec(type="offline")]
    assert (w.scenarios[0].requests, w.scenarios[0].warmup, w.scenarios[0].min_duration_s) == (16, 2, 0.0)
    assert (w.scenarios[1].batch_size, w.scenarios[1].passes, w.scenarios[1].warmup) == (16, 3, 1)
    assert suite.output.dir == "runs" and suite.output.store is None
    assert suite.requirements.slo.ttft_s is None
    assert (suite.rounds, suite.order) == (DEFAULT_ROUNDS, "random")
    assert w.stop == ["\n"] and (w.accuracy.graded, w.accuracy.batch_size) == (None, 16)
    assert suite.calibration is None


def test_full_suite_keeps_every_value(tmp_path):
    suite = load_suite(write(tmp_path, """\
        name: full
        model: ./ckpt
        baseline: b
        variants:
          - {name: a, recipe: bf16}
          - {name: b, recipe: fp32, model: ./other}
        workload:
          dataset: {path: data.jsonl, n: 8}
          scenarios:
            - {type: offline, batch_size: 4, passes: 2}
            - {type: single-stream, requests: 3, warmup: 0, min_duration_s: 1.5}
          max_new_tokens: 5
          accuracy: {samples: 0}
        requirements: {max_kld: 0.1, slo: {ttft_s: 0.5}}
        output: {dir: out, store: s.sqlite}
        device: cpu
        threads: 2
        seed: 7
        timeout_s: 60
        rounds: 3
        order: random
        calibration: {generator: structured, n: 16, seed: 9}
        """))
    assert suite.name == "full" and suite.baseline_name == "b"
    assert [(v.name, v.recipe, v.model) for v in suite.variants] == [("a", "bf16", None), ("b", "fp32", "./other")]
    assert suite.workload.dataset.path == "data.jsonl" and suite.workload.dataset.generator is None
    off, ss = suite.workload.scenarios
    assert isinstance(off, OfflineSpec) and (off.batch_size, off.passes) == (4, 2)
    assert isinstance(ss, SingleStreamSpec) and (ss.requests, ss.warmup, ss.min_duration_s) == (3, 0, 1.5)
    assert suite.requirements.max_kld == 0.1 and suite.requirements.slo.ttft_s == 0.5
    assert (suite.device, suite.threads, suite.seed, suite.timeout_s) == ("cpu", 2, 7, 60)
    assert (suite.output.dir, suite.output.store) == ("out", "s.sqlite")
    assert (suite.rounds, suite.order, suite.calibration.n, suite.calibration.seed) == (3, "random", 16, 9)


def test_suite_is_frozen(tmp_path):
    suite = load_suite(write(tmp_path, MINIMAL))
    with pytest.raises(Exception):
        suite.seed = 3  # type: ignore[misc]


def test_shipped_example_loads():
    from pathlib import Path
    example = Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"
    if not example.is_file():
        pytest.skip("examples/quickstart.yaml is not in this tree")
    suite = load_suite(example)
    assert suite.baseline_name == suite.variants[0].name


def test_parse_suite_names_its_file_argument():
    with pytest.raises(SuiteError, match=r"^mine\.yaml: modle: unknown key"):
        parse_suite({"model": "x", "variants": [{"name": "a"}], "modle": 1}, file="mine.yaml")


# --------------------------------------------------------------------------- bad input

def test_missing_file(tmp_path):
    err = suite_error(tmp_path / "nope.yaml")
    assert "no such suite file" in str(err)


def test_malformed_yaml_gives_line_and_column(tmp_path):
    path = write(tmp_path, "model: x\nvariants:\n  - name: a\n bad: [\n")
    err = suite_error(path)
    assert "malformed YAML" in str(err)
    assert err.field is not None and err.field.startswith("line ") and ", column " in err.field
    assert err.field in str(err)


def test_malformed_yaml_line_number_is_one_based(tmp_path):
    path = write(tmp_path, "model: x\n  oops: : y\nvariants: []\n")
    err = suite_error(path)
    assert err.field.startswith("line 2, column ")


@pytest.mark.parametrize("text, kind", [("- a\n- b\n", "list"), ("just text\n", "str"), ("", "NoneType")])
def test_top_level_must_be_a_mapping(tmp_path, text, kind):
    err = suite_error(write(tmp_path, text))
    assert "mapping" in str(err) and kind in str(err)
    for key in ("model", "variants", "workload", "device"):
        assert key in err.accepted


@pytest.mark.parametrize("extra, field, accepted", [
    ("modle: y\n", "modle", ("model", "variants", "workload", "baseline", "device")),
    ("workload: {max_tokens: 3}\n", "workload.max_tokens", ("dataset", "scenarios", "max_new_tokens")),
    ("workload: {dataset: {generator: structured, file: a.jsonl}}\n", "workload.dataset.file",
     ("generator", "path", "n", "seed")),
    ("requirements: {slo: {latency: 1}}\n", "requirements.slo.latency", ("ttft_s", "tpot_s", "e2el_s")),
])
def test_unknown_key_names_path_and_accepted_keys(tmp_path, extra, field, accepted):
    err = suite_error(write(tmp_path, MINIMAL + extra))
    assert err.field == field and f"{field}: unknown key '{field.rsplit('.', 1)[-1]}'" in str(err)
    assert all(a in err.accepted for a in accepted), err.accepted
    assert f"(accepted: {err.accepted})" in str(err)


def test_unknown_key_in_a_variant(tmp_path):
    err = suite_error(write(tmp_path, """\
        model: x
        variants:
          - name: a
            dtyp: bf16
        """))
    assert err.field == "variants[0].dtyp" and "variants[0].dtyp" in str(err)
    assert err.accepted.startswith("name, recipe, options, model, weight_dtype")


def test_unknown_key_in_a_scenario_lists_that_scenarios_keys(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + """\
workload:
  scenarios:
    - type: single-stream
    - type: offline
      bs: 4
"""))
    assert err.field == "workload.scenarios[1].bs"
    assert "batch_size" in err.accepted and "passes" in err.accepted and "requests" not in err.accepted
    err = suite_error(write(tmp_path, MINIMAL + "workload:\n  scenarios:\n    - {type: single-stream, bs: 4}\n"))
    assert err.field == "workload.scenarios[0].bs"
    assert "requests" in err.accepted and "batch_size" not in err.accepted


def test_wrong_type(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + 'threads: "two"\n'))
    assert err.field == "threads"
    assert "integer" in str(err) and "'two'" in str(err)


@pytest.mark.parametrize("extra, field", [
    ("workload: {max_new_tokens: 0}\n", "workload.max_new_tokens"),
    ("workload: {scenarios: [{type: offline, batch_size: -1}]}\n", "workload.scenarios[0].batch_size"),
    ("timeout_s: 0\n", "timeout_s"),
    ("workload: {scenarios: []}\n", "workload.scenarios"),
    ("rounds: 0\n", "rounds"),
    ("workload: {stop: ['']}\n", "workload.stop"),
])
def test_out_of_range_values_name_their_field(tmp_path, extra, field):
    err = suite_error(write(tmp_path, MINIMAL + extra))
    assert err.field == field and f": {field}: " in str(err)


def test_variants_must_not_be_empty_or_a_mapping(tmp_path):
    assert suite_error(write(tmp_path, "model: x\nvariants: []\n")).field == "variants"
    assert suite_error(write(tmp_path, "model: x\nvariants: {name: a}\n")).field == "variants"


def test_missing_required_field(tmp_path):
    err = suite_error(write(tmp_path, "variants: [{name: a}]\n"))
    assert err.field == "model" and "missing" in str(err)


def test_invalid_variant_name(tmp_path):
    err = suite_error(write(tmp_path, "model: x\nvariants: [{name: 'has space'}]\n"))
    assert err.field == "variants[0].name" and "'has space'" in str(err)


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "a\\b", ".hidden", ""])
def test_a_suite_name_that_is_not_a_safe_folder_name_is_refused(tmp_path, name):
    """The name is the artifacts folder (./artifacts/NAME): it must not lead outside it (issue 13)."""
    err = suite_error(write(tmp_path, MINIMAL + f"name: '{name}'\n"))
    assert err.field == "name" and "pattern" in str(err)


def test_a_suite_name_with_spaces_and_dots_is_kept(tmp_path):
    assert load_suite(write(tmp_path, MINIMAL + "name: my suite v1.2\n")).name == "my suite v1.2"


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    """YAML keeps the last of two equal keys without a word; a suite refuses them (issue 13)."""
    err = suite_error(write(tmp_path, MINIMAL + "rounds: 5\nseed: 1\nrounds: 1\n"))
    assert err.field == "line 6, column 1" and "'rounds' appears twice" in str(err)
    nested = suite_error(write(tmp_path, "model: x\nvariants:\n  - name: a\n    recipe: int8\n    recipe: int4\n"))
    assert nested.field == "line 5, column 5" and "'recipe'" in str(nested)


def test_invalid_literal_lists_accepted_values(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + "device: tpu\n"))
    assert err.field == "device" and "'tpu'" in str(err)
    assert err.accepted == "auto | cpu | cuda"


def test_invalid_generator_lists_accepted_values(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + "workload: {dataset: {generator: random}}\n"))
    assert err.field == "workload.dataset.generator" and err.accepted == "structured"


@pytest.mark.parametrize("scenario", ["{type: servr}", "{requests: 3}"])
def test_unknown_or_missing_scenario_type(tmp_path, scenario):
    err = suite_error(write(tmp_path, MINIMAL + f"workload: {{scenarios: [{{type: offline}}, {scenario}]}}\n"))
    assert err.field == "workload.scenarios[1]"
    assert "single-stream" in err.accepted and "offline" in err.accepted


def test_two_scenarios_of_one_type_need_names(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + "workload: {scenarios: [{type: offline}, {type: offline}]}\n"))
    assert err.field == "workload.scenarios[1].name" and "two scenarios are named 'offline'" in str(err)
    named = "workload: {scenarios: [{type: offline, batch_size: 1}, {type: offline, name: batched}]}\n"
    assert [s.name for s in load_suite(write(tmp_path, MINIMAL + named)).workload.scenarios] == [None, "batched"]


def test_a_scenario_may_not_take_a_trackers_name(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + "workload: {scenarios: [{type: offline, name: memory}]}\n"))
    assert "reserved" in str(err)


def test_order_lists_what_it_accepts(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + "order: shuffled\n"))
    assert err.field == "order" and err.accepted == "random | rotate"


def test_duplicate_variant_names_name_the_repeated_variant(tmp_path):
    err = suite_error(write(tmp_path, "model: x\nvariants: [{name: a}, {name: b}, {name: a}]\n"))
    assert "'a' is used twice" in str(err)
    assert err.field == "variants[2].name"


def test_baseline_not_a_variant_names_the_field_and_lists_the_variants(tmp_path):
    err = suite_error(write(tmp_path, "model: x\nbaseline: c\nvariants: [{name: a}, {name: b}]\n"))
    assert err.field == "baseline"
    assert "baseline 'c' is not a variant" in str(err) and err.accepted == "a | b"


@pytest.mark.parametrize("dataset", ["{n: 3}", "{generator: structured, path: d.jsonl}"])
def test_dataset_needs_exactly_one_source(tmp_path, dataset):
    err = suite_error(write(tmp_path, MINIMAL + f"workload: {{dataset: {dataset}}}\n"))
    assert err.field == "workload.dataset"
    assert "generator: structured" in str(err) and "path: FILE.jsonl" in str(err)


def test_a_directory_is_not_a_suite_file(tmp_path):
    err = suite_error(tmp_path)
    assert "cannot read" in str(err)


# --------------------------------------------------------------------------- schema

def test_json_schema_describes_the_suite():
    schema = suite_json_schema()
    assert isinstance(schema, dict)
    assert "variants" in schema["properties"] and "model" in schema["properties"]
    assert "variants" in schema.get("required", [])


@pytest.mark.parametrize("extra, field, needles", [
    ("requirements: {preset: fast}\n", "requirements.preset", ("unknown preset 'fast'", "balanced")),
    ("requirements: {max_e2el_s: {p42: 0.5}}\n", "requirements.max_e2el_s.p42", ("p95",)),
    ("requirements: {max_e2el_s: {p95: -1}}\n", "requirements.max_e2el_s", ("above 0",)),
    ("requirements: {objective: fastest}\n", "requirements.objective", ("unknown objective", "throughput")),
    ("requirements: {objective: {throughput: 0}}\n", "requirements.objective", ("must be above 0",)),
    ("requirements: {sequence_length: {min: 512, max: 128}}\n", "requirements.sequence_length", ("below min",)),
    ("requirements: {scenario: server}\n", "requirements.scenario", ("no scenario is named 'server'",)),
    ("requirements: {max_e2el_p95_s: 1}\n", "requirements.max_e2el_p95_s", ("max_e2el_s",)),
])
def test_bad_requirements_name_the_field(tmp_path, extra, field, needles):
    err = suite_error(write(tmp_path, MINIMAL + extra))
    assert err.field == field, str(err)
    for needle in needles:
        assert needle in str(err), str(err)


def test_requirements_with_a_preset_percentiles_and_weights_load():
    from variantlab.suite import parse_suite
    suite = parse_suite({"model": "x", "variants": [{"name": "a"}], "requirements": {
        "preset": "balanced", "max_e2el_s": {"p95": 0.5, "p99": 1}, "objective": {"throughput": 2, "size": 1},
        "sequence_length": {"max": 2048}, "scenario": "single-stream"}})
    r = suite.requirements
    assert r.max_e2el_s == {"p95": 0.5, "p99": 1.0} and r.sequence_length.min == 1 and r.given
    assert not parse_suite({"model": "x", "variants": [{"name": "a"}],
                            "requirements": {"slo": {"ttft_s": 1}}}).requirements.given


# --------------------------------------------------------------------------- absurd sizes and odd numbers (issue 13)

@pytest.mark.parametrize("extra, field, accepted", [
    # `n: 1000000000` printed nothing for two minutes while memory grew
    ("workload: {dataset: {generator: structured, n: 1000000000}}\n", "workload.dataset.n",
     "an integer from 1 to 100000"),
    ("workload: {max_new_tokens: 10000000}\n", "workload.max_new_tokens", "an integer from 1 to 131072"),
    ("workload: {accuracy: {batch_size: 100000}}\n", "workload.accuracy.batch_size", "an integer from 1 to 1024"),
    ("workload: {scenarios: [{type: offline, batch_size: 999999}]}\n", "workload.scenarios[0].batch_size",
     "an integer from 1 to 1024"),
    ("workload: {scenarios: [{type: single-stream, requests: 1000000000}]}\n", "workload.scenarios[0].requests",
     "an integer from 1 to 100000"),
    ("workload: {scenarios: [{type: server, concurrency: 100000}]}\n", "workload.scenarios[0].concurrency",
     "an integer from 1 to 4096"),
    ("rounds: 99999999999999999999999999\n", "rounds", "an integer from 1 to 1000"),
    ("threads: 100000\n", "threads", "an integer from 1 to 4096"),
    ("seed: 18446744073709551616\n", "seed", "an integer from -9223372036854775808 to 9223372036854775807"),
    ("timeout_s: 1.0e+308\n", "timeout_s", "a finite number above 0 and at most 604800"),
    ("timeout_s: .inf\n", "timeout_s", "a finite number above 0 and at most 604800"),
    ("requirements: {slo: {ttft_s: .nan}}\n", "requirements.slo.ttft_s", "a finite number above 0 and at most 86400"),
    ("workload: {max_new_tokens: 1.0e+308}\n", "workload.max_new_tokens", "an integer from 1 to 131072"),
])
def test_absurd_sizes_and_non_finite_numbers_name_the_field_and_the_range(tmp_path, extra, field, accepted):
    err = suite_error(write(tmp_path, MINIMAL + extra))
    assert err.field == field and f"(accepted: {accepted}" in str(err), str(err)


@pytest.mark.parametrize("extra, field", [
    ("workload: {scenarios: [{type: length-sweep, lengths: [128, 10000000]}]}\n", "workload.scenarios[0].lengths"),
    ("workload: {scenarios: [{type: server, rates: [1, .inf]}]}\n", "workload.scenarios[0].rates[1]"),
    ("workload: {scenarios: [{type: server, rates: [1, 1.0e+9]}]}\n", "workload.scenarios[0].rates[1]"),
    ("requirements: {max_e2el_s: {p95: .nan}}\n", "requirements.max_e2el_s.p95"),
    ("requirements: {min_goodput: .inf}\n", "requirements.min_goodput"),
])
def test_absurd_items_of_lists_and_maps_name_their_field(tmp_path, extra, field):
    assert suite_error(write(tmp_path, MINIMAL + extra)).field == field


@pytest.mark.parametrize("text, detail", [
    (MINIMAL + "workload: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),    # was RecursionError
    (MINIMAL + "seed: !!timestamp 2020-99-99\n", "malformed YAML value"),              # was ValueError
    (MINIMAL + "rounds: " + "1" * 5000 + "\n", "malformed YAML value"),                  # was ValueError (int digits)
])
def test_yaml_the_parser_cannot_hold_is_a_one_line_error(tmp_path, text, detail):
    assert detail in str(suite_error(write(tmp_path, text)))


def test_a_huge_value_is_quoted_short(tmp_path):
    err = suite_error(write(tmp_path, MINIMAL + "rounds: 0x" + "f" * 5000 + "\n"))
    assert "got an integer of about 6020 digits" in str(err) and len(str(err)) < 400
    err = suite_error(write(tmp_path, MINIMAL + "threads: '" + "x" * 5000 + "'\n"))
    assert "got 'xxx" in str(err) and len(str(err)) < 400


@pytest.mark.parametrize("extra, field", [
    ("max_memory: '" + "9" * 400 + "'\n", "max_memory"),                                # was OverflowError
    ("variants: [{name: a, attention: 'gqa:" + "9" * 5000 + "'}]\n", "variants[0].attention"),   # was ValueError
])
def test_numbers_too_long_for_python_are_one_line_errors(tmp_path, extra, field):
    from variantlab.errors import VariantlabError
    from variantlab.measure.plan import plan_suite_file
    path = write(tmp_path, "model: builtin:tiny-structured\n" + (extra if "variants" in extra else
                                                                  "variants: [{name: a}]\n" + extra))
    with pytest.raises(VariantlabError) as caught:
        plan_suite_file(path)
    assert caught.value.field == field and "\n" not in str(caught.value) and len(str(caught.value)) < 500


@pytest.mark.parametrize("model", ["9" * 400, "a\\0b", "a/" * 3000])
def test_model_paths_the_os_refuses_are_one_line_errors(tmp_path, model):
    """`model: 999…` (400 digits) raised OSError: File name too long, a NUL byte ValueError (issue 13 fuzz)."""
    from variantlab.errors import ModelLoadError
    from variantlab.measure.plan import plan_suite_file
    with pytest.raises(ModelLoadError, match="cannot be looked up") as caught:
        plan_suite_file(write(tmp_path, f'model: "{model}"\nvariants: [{{name: a}}]\n'))
    assert caught.value.field == "model" and "\n" not in str(caught.value)


def test_a_dataset_path_with_a_nul_byte_is_a_one_line_error(tmp_path):
    from variantlab.errors import DatasetError
    from variantlab.measure.plan import plan_suite_file
    with pytest.raises(DatasetError, match="cannot read file"):
        plan_suite_file(write(tmp_path, MINIMAL + 'workload: {dataset: {path: "a\\0b"}}\n'))


# --------------------------------------------------------------------------- a boolean is not a number (issue 22)

@pytest.mark.parametrize("extra, field, accepted", [
    ("rounds: true\n", "rounds", "an integer from 1 to 1000"),           # ran one round of a full bench
    ("timeout_s: true\n", "timeout_s", "a finite number above 0 and at most 604800"),
    ("threads: false\n", "threads", "an integer from 1 to 4096"),
    ("seed: false\n", "seed", "an integer from"),
    ("workload: {max_new_tokens: true}\n", "workload.max_new_tokens", "an integer from 1 to 131072"),
    ("workload: {dataset: {generator: structured, n: true}}\n", "workload.dataset.n", "an integer from 1 to 100000"),
    ("workload: {accuracy: {graded: true}}\n", "workload.accuracy.graded", "an integer from 0 to 100000"),
    ("workload: {scenarios: [{type: offline, batch_size: true}]}\n", "workload.scenarios[0].batch_size",
     "an integer from 1 to 1024"),
    ("workload: {scenarios: [{type: server, rate: true}]}\n", "workload.scenarios[0].rate", None),
    ("requirements: {slo: {ttft_s: true}}\n", "requirements.slo.ttft_s", "a finite number above 0"),
    ("requirements: {min_task_accuracy: true}\n", "requirements.min_task_accuracy", "a finite number from 0 to 1"),
    ("requirements: {sequence_length: {max: true}}\n", "requirements.sequence_length.max", "an integer from 1"),
])
def test_a_boolean_where_a_number_belongs_is_a_type_error(tmp_path, extra, field, accepted):
    """pydantic's lax mode read `true` as 1: `rounds: true` started a full bench of one round."""
    err = suite_error(write(tmp_path, MINIMAL + extra))
    assert err.field == field, str(err)
    assert "Input should be a number, not a boolean, got " in str(err), str(err)
    if accepted:
        assert f"(accepted: {accepted}" in str(err), str(err)


@pytest.mark.parametrize("extra, field, where", [
    ("requirements: {max_e2el_s: {p95: true}}\n", "requirements.max_e2el_s", "p95"),     # was a 1-second limit
    ("requirements: {objective: {throughput: true, size: 1}}\n", "requirements.objective", "throughput"),
    ("workload: {scenarios: [{type: length-sweep, lengths: [128, true]}]}\n", "workload.scenarios[0].lengths", "[1]"),
    ("workload: {scenarios: [{type: server, rates: [true]}]}\n", "workload.scenarios[0].rates", "[0]"),
])
def test_a_boolean_inside_a_list_or_a_map_of_numbers_names_where(tmp_path, extra, field, where):
    err = suite_error(write(tmp_path, MINIMAL + extra))
    assert err.field == field and f"not a boolean (at {where})" in str(err), str(err)


def _numeric_fields(model, prefix=()):
    """(path, a value holding a bool where the field wants a number) for every number-typed field reachable from
    `model` (nested models, their lists and optionals), found from the annotations alone."""
    import typing
    from typing import Annotated, Literal, Union

    from pydantic import BaseModel

    def members(a):
        if typing.get_origin(a) is Annotated:
            return members(typing.get_args(a)[0])
        if typing.get_origin(a) in (Union, __import__("types").UnionType):
            return [m for x in typing.get_args(a) for m in members(x)]
        return [a]

    for name, f in model.model_fields.items():
        for m in members(f.annotation):
            origin, args = typing.get_origin(m), typing.get_args(m)
            if m in (int, float):
                yield prefix + (name,), True
            elif origin is dict and args[1] in (int, float):
                key = typing.get_args(args[0])[0] if typing.get_origin(args[0]) is Literal else "throughput"
                yield prefix + (name,), {key: True}
            elif origin in (list, tuple) and args and set(members(args[0])) & {int, float}:
                yield prefix + (name,), [True]
            elif isinstance(m, type) and issubclass(m, BaseModel):
                yield from _numeric_fields(m, prefix + (name,))
            elif origin is list and args:
                for inner in members(args[0]):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        yield from _numeric_fields(inner, prefix + (name, inner))


def test_every_number_field_of_the_suite_refuses_a_boolean():
    """The rule is model-wide (spec_model.SpecModel): no field of the suite, a scenario's included, reads `true`
    as a number. The fields are found from the models' annotations, so a field added later is covered too."""
    from variantlab.suite import Suite

    cases = list(_numeric_fields(Suite))
    assert len(cases) > 40 and any(p[-1] == "rounds" for p, _ in cases)
    for path, value in cases:
        doc: dict = {"model": "x", "variants": [{"name": "a"}]}
        node = doc
        for part in path[:-1]:
            if isinstance(part, type):    # a scenario spec, inside workload.scenarios
                node = node.setdefault("scenarios", [{"type": part.model_fields["type"].annotation.__args__[0]}])[0]
                continue
            if part == "scenarios":
                continue
            node = node.setdefault(part, {} if part != "variants" else [{"name": "a"}])
            node = node[0] if isinstance(node, list) else node
        node[path[-1]] = value
        with pytest.raises(SuiteError, match="not a boolean") as caught:
            parse_suite(doc, "suite.yaml")
        assert caught.value.field.replace("[0]", "").split(".")[-1] == path[-1], (path, str(caught.value))


def test_the_json_schema_and_validation_agree_on_booleans(tmp_path):
    """JSON Schema's integer and number exclude booleans: the exported schema refused `rounds: true` all along,
    and now validation does too."""
    import jsonschema
    import yaml

    schema = suite_json_schema()
    for extra in ("rounds: true\n", "timeout_s: false\n", "requirements: {max_e2el_s: {p95: true}}\n"):
        doc = yaml.safe_load(MINIMAL + extra)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)
        with pytest.raises(SuiteError, match="not a boolean"):
            parse_suite(doc, "suite.yaml")


def test_numbers_written_as_yaml_writes_them_still_load(tmp_path):
    """Only booleans are refused: an int where a float belongs, a quoted number, and 1e3 (YAML 1.1 reads it
    as the string '1e3') load as before; so do true/false where a boolean belongs."""
    suite = load_suite(write(tmp_path, MINIMAL + "timeout_s: 1e3\nrounds: '3'\nexplain: true\n"
                                                  "trust_remote_code: false\n"
                                                  "requirements: {max_e2el_s: {p95: 1}, min_goodput: 2,"
                                                  " objective: {throughput: 1, size: 0.5}}\n"))
    assert suite.timeout_s == 1000.0 and suite.rounds == 3 and suite.explain is True
    assert suite.requirements.max_e2el_s == {"p95": 1.0} and suite.requirements.min_goodput == 2.0
    assert suite.requirements.objective == {"throughput": 1.0, "size": 0.5}
    with_variant = load_suite(write(tmp_path, "model: x\nvariants: [{name: a, compile: true, recipe: int4, "
                                              "options: {pad_to_group: true}}]\n"))
    assert with_variant.variants[0].compile is True


def test_every_number_option_of_every_recipe_and_of_attention_refuses_a_boolean():
    from variantlab.errors import RecipeError
    from variantlab.variants.attention import AttentionOptions, parse_attention_options
    from variantlab.variants.registry import RECIPES, parse_options

    checked = []
    for recipe in RECIPES.values():
        for path, value in _numeric_fields(recipe.options_model):
            with pytest.raises(RecipeError, match=f"not a boolean.* for option '{path[-1]}' of recipe"):
                parse_options(recipe, {path[-1]: value})
            checked.append((recipe.name, path[-1]))
    assert ("mixed", "max_kld") in checked and ("mixed", "calibration_samples") in checked
    for path, value in _numeric_fields(AttentionOptions):
        with pytest.raises(RecipeError, match=f"not a boolean for attention option '{path[-1]}'"):
            parse_attention_options({path[-1]: value})
        checked.append(("attention", path[-1]))
    assert ("attention", "linear_chunk") in checked
    assert parse_options(RECIPES["int4"], {"pad_to_group": True, "quantize_lm_head": False}).pad_to_group
