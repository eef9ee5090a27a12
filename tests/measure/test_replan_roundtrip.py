"""A stored suite re-parses as the user wrote it: `bench --resume` plans again from the suite the store holds
(`runs.suite_json`, a full dump with every default written out), so parse(dump(parse(x))) must mean what
parse(x) means. Keys left out ("not given": a dataset's n, a variant's recipe and compile) are null in the
dump, not their defaults written as if the user had given them.

The property runs over the shipped examples and the valid suites tests/test_suite_fuzz.py builds from the
schema, with what that generator leaves out added (no n, calibration files, endpoint variants, compile);
then the cases that were refused on resume one by one, through a real store and `replan`."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.test_suite_fuzz import GOOD_LINE, as_yaml, fuzz_settings, valid_suites
from variantlab.errors import VariantlabError
from variantlab.measure.plan import make_plan, plan_suite_file
from variantlab.measure.runner import replan
from variantlab.store import Store
from variantlab.suite import load_suite, parse_suite

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
SHORT_FILE = 8     # lines of data.jsonl: fewer than the default n (64)


def plan_or_error(suite, path: Path) -> dict | str:
    try:
        return make_plan(suite, str(path), path.resolve().parent).to_json()
    except VariantlabError as e:
        return e.one_line()


def plans_alike_after_a_round_trip(path: Path) -> None:
    """make_plan of the suite as written == make_plan of it dumped as the store keeps it and parsed again."""
    suite = load_suite(path)
    stored = json.loads(json.dumps(suite.model_dump(mode="json")))      # as runs.suite_json holds it
    again = parse_suite(stored, str(path))
    assert plan_or_error(again, path) == plan_or_error(suite, path)
    assert again.model_dump(mode="json") == stored                       # and the dump is a fixed point


# ---------------------------------------------------------------- the property

@st.composite
def suites_as_users_write_them(draw) -> dict:
    """A valid suite from the fuzz generator, with the keys it always gives sometimes left out, and what it
    never writes (calibration files, endpoint variants, compile) sometimes added."""
    doc = draw(valid_suites())
    dataset = doc["workload"]["dataset"]
    if draw(st.booleans()):
        dataset.pop("n")                              # a file of SHORT_FILE lines, or 64 generated
    if draw(st.booleans()):
        doc["calibration"] = draw(st.sampled_from([{"path": "data.jsonl"}, {"path": "data.jsonl", "n": 3},
                                                   {"generator": "structured"}]))
    for v in doc["variants"]:
        if draw(st.integers(0, 3)) == 0:
            v["compile"] = draw(st.booleans())
    if draw(st.booleans()):
        endpoint = {"name": "endpoint-zz", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}
        if draw(st.booleans()):
            endpoint |= {"served_model": "m", "api_key_env": "KEY_ZZ"}
        doc["variants"].append(endpoint)
    return doc


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("roundtrip")
    (d / "data.jsonl").write_text(GOOD_LINE * SHORT_FILE, encoding="utf-8")
    return d


@fuzz_settings(150)
@given(doc=suites_as_users_write_them())
def test_a_suite_plans_the_same_after_the_stores_round_trip(folder, doc):
    path = folder / "suite.yaml"
    path.write_text(as_yaml(doc), encoding="utf-8")
    plans_alike_after_a_round_trip(path)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_plans_the_same_after_the_stores_round_trip(path):
    plans_alike_after_a_round_trip(path)


# ---------------------------------------------------------------- the cases, through a real store and replan

def stored_then_replanned(path: Path, store_file: Path) -> tuple[dict, dict]:
    """The plan as `bench` stores it with the suite's full dump, and the plan `replan` makes from that row."""
    plan = plan_suite_file(path)
    with Store(store_file) as store:
        store.create_run("run-1", plan.suite.model_dump(mode="json"), str(path.resolve()), plan.to_json(), {},
                         str(path.parent))
        row = store.run("run-1")
    return plan.to_json(), replan(row, store_file).to_json()


def write(tmp_path: Path, suite: dict) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": "builtin:tiny-structured", **suite}))
    return path


SMALL = {"max_new_tokens": 2, "scenarios": [{"type": "single-stream", "requests": 1, "warmup": 0}],
         "accuracy": {"samples": 1}}


def test_a_jsonl_file_shorter_than_64_lines_without_n_resumes(tmp_path):
    (tmp_path / "data.jsonl").write_text(GOOD_LINE * 4, encoding="utf-8")
    path = write(tmp_path, {"variants": [{"name": "base"}], "workload": {"dataset": {"path": "data.jsonl"}, **SMALL}})
    stored, again = stored_then_replanned(path, tmp_path / "store.sqlite")
    assert again == stored and stored["samples"] == 4


def test_an_n_the_suite_gives_still_refuses_a_shorter_file(tmp_path):
    (tmp_path / "data.jsonl").write_text(GOOD_LINE * 4, encoding="utf-8")
    path = write(tmp_path, {"variants": [{"name": "base"}],
                            "workload": {"dataset": {"path": "data.jsonl", "n": 5}, **SMALL}})
    with pytest.raises(VariantlabError, match=r"workload.dataset.n: the file has 4 records, fewer than the n: 5 "
                                              r"asked for"):
        plan_suite_file(path)


def test_an_endpoint_variant_resumes(tmp_path):
    path = write(tmp_path, {"variants": [{"name": "base"}, {"name": "served", "backend": "openai",
                                                            "base_url": "http://127.0.0.1:9/v1"}],
                            "workload": SMALL})
    stored, again = stored_then_replanned(path, tmp_path / "store.sqlite")
    assert again == stored and stored["variants"][1]["backend_config"]["base_url"] == "http://127.0.0.1:9/v1"


def test_a_run_stored_when_a_definition_named_its_endpoint_still_resumes(tmp_path):
    """Before the backend registry a stored plan's variant carried `endpoint` (null, or the endpoint's dict)
    where it now carries backend and backend_config: such a run replans as the same plan."""
    path = write(tmp_path, {"variants": [{"name": "base"}, {"name": "served", "backend": "openai",
                                                            "base_url": "http://127.0.0.1:9/v1"}],
                            "workload": SMALL})
    plan = plan_suite_file(path)
    old = plan.to_json()
    for v in old["variants"]:
        config = v.pop("backend_config")
        v["endpoint"] = config if v.pop("backend") == "openai" else None
    with Store(tmp_path / "store.sqlite") as store:
        store.create_run("run-1", plan.suite.model_dump(mode="json"), str(path.resolve()), old, {}, str(tmp_path))
    with sqlite3.connect(tmp_path / "store.sqlite") as db:   # as that version stored it: no formats (format 1)
        db.execute("UPDATE runs SET formats_json = NULL")
    with Store(tmp_path / "store.sqlite") as store:
        row = store.run("run-1")
    assert replan(row, tmp_path / "store.sqlite").to_json() == plan.to_json()


def test_an_endpoint_variant_still_refuses_what_it_cannot_apply(tmp_path):
    for given in ({"recipe": "fp32"}, {"compile": False}, {"options": {"group_size": 32}}):
        path = write(tmp_path, {"variants": [{"name": "e", "backend": "openai", "base_url": "http://h:1/v1",
                                              **given}]})
        with pytest.raises(VariantlabError, match=f"{next(iter(given))} cannot apply to backend: openai"):
            load_suite(path)


def test_a_variant_in_the_analysis_vocabulary_resumes(tmp_path):
    path = write(tmp_path, {"variants": [{"name": "base"}, {"name": "flash", "weight_dtype": "int4",
                                                            "activation_dtype": "int8", "quant_scheme": "asymmetric"}],
                            "workload": SMALL})
    stored, again = stored_then_replanned(path, tmp_path / "store.sqlite")
    assert again == stored and stored["variants"][1]["recipe"] == "w4a8"


# recorded kernel times (ms, 1024→1024, rows 1…256) slow enough that compiling pays on a decode-heavy workload
SLOW_MS = {p: tuple(t * 100 for t in ts) for p, ts in {
    "fp32": (0.158, 0.151, 0.204, 0.306, 0.709, 0.903, 1.276, 2.203, 3.693),
    "bf16": (0.115, 0.113, 0.134, 0.149, 0.297, 0.344, 0.478, 0.805, 1.402),
    "int8": (0.060, 0.070, 0.099, 0.151, 0.353, 0.559, 1.007, 1.900, 3.656)}.items()}


@pytest.fixture
def slow_machine(monkeypatch):
    """This machine's facts and kernel times replaced by recorded ones on which auto chooses to compile."""
    from variantlab import hwconfig
    from variantlab.device_facts import DeviceFacts, isa_features
    from variantlab.kernel_times import KernelTimes
    rows = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    times = KernelTimes("cpu", 2, 1024, 1024, "bf16", 64, rows, {p: tuple(t / 1e3 for t in ts)
                                                                  for p, ts in SLOW_MS.items()},
                        {p: () for p in SLOW_MS}, {}, "recorded", 1.0)
    cpu = DeviceFacts("recorded CPU", 2, 2, isa_features("fpu sse sse2 avx avx2 fma avx512f avx512_bf16".split()))
    monkeypatch.setattr(hwconfig, "machine_inputs", lambda *a, **k: hwconfig.MachineInputs(cpu, None, times))


AUTO = {"name": "auto", "recipe": "auto", "options": {"workload": "decode-heavy"}}


def test_auto_without_compile_keeps_the_compile_it_chose_after_the_round_trip(slow_machine, tmp_path):
    import json

    from variantlab.models.loading import BUILTIN_MODELS
    from variantlab.variants.decode_step import runs_config
    step_runs = runs_config(json.loads((Path(BUILTIN_MODELS["tiny-structured"]) / "config.json").read_text()))
    path = write(tmp_path, {"variants": [{"name": "base"}, AUTO], "workload": SMALL})
    # auto chose it, unless our decode step runs the model (then compiling would only swap the step out)
    assert plan_suite_file(path).variant("auto").definition.compile is (not step_runs)
    plans_alike_after_a_round_trip(path)
    path = write(tmp_path, {"variants": [{"name": "base"}, AUTO | {"compile": False}], "workload": SMALL})
    assert plan_suite_file(path).variant("auto").definition.compile is False       # given: the variant's own wins
    plans_alike_after_a_round_trip(path)


@pytest.mark.parametrize("compile_", [None, True])
def test_a_run_with_an_auto_variant_resumes(slow_machine, tmp_path, compile_):
    """Its plan holds what auto resolved to (tuples in memory, lists in the store): compared as the store holds it."""
    auto = AUTO if compile_ is None else AUTO | {"compile": compile_}
    path = write(tmp_path, {"variants": [{"name": "base"}, auto], "workload": SMALL})
    stored, again = stored_then_replanned(path, tmp_path / "store.sqlite")
    assert stored["variants"][1]["resolved"]["resolved_to"] == again["variants"][1]["recipe"]
    assert again == stored


# ---------------------------------------------------------------- runs stored by the previous version

def previous_versions_dump(suite) -> dict:
    """What the previous version stored: the full dump with the defaults written out as if given."""
    dump = json.loads(json.dumps(suite.model_dump(mode="json")))
    for dataset in (dump["workload"]["dataset"], dump["calibration"]):
        if dataset is not None and dataset["n"] is None:
            dataset["n"] = 64
    for v in dump["variants"]:
        v["recipe"] = "fp32" if v["recipe"] is None else v["recipe"]
        v["compile"] = bool(v["compile"])
    return dump


def stored_by_the_previous_version_then_replanned(path: Path, store_file: Path) -> tuple[dict, dict]:
    plan = plan_suite_file(path)
    with Store(store_file) as store:
        store.create_run("run-0", previous_versions_dump(plan.suite), str(path.resolve()), plan.to_json(), {},
                         str(path.parent))
        row = store.run("run-0")
    return plan.to_json(), replan(row, store_file).to_json()


@pytest.mark.parametrize("case", ["generated", "short file", "endpoint", "analysis words", "auto"])
def test_a_run_stored_by_the_previous_version_resumes(slow_machine, tmp_path, case):
    """The previous version wrote n: 64, recipe: fp32 and compile: false for keys not given: runs that resumed
    still resume, and those it refused (each case but the first) resume now."""
    (tmp_path / "data.jsonl").write_text(GOOD_LINE * 4, encoding="utf-8")
    variant = {"generated": {"name": "half", "recipe": "bf16"}, "short file": {"name": "half", "recipe": "bf16"},
               "endpoint": {"name": "served", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"},
               "analysis words": {"name": "flash", "weight_dtype": "int4", "activation_dtype": "int8"},
               "auto": AUTO}[case]
    dataset = {"path": "data.jsonl"} if case == "short file" else {"generator": "structured"}
    path = write(tmp_path, {"variants": [{"name": "base"}, variant], "workload": SMALL | {"dataset": dataset}})
    stored, again = stored_by_the_previous_version_then_replanned(path, tmp_path / "store.sqlite")
    assert again == stored


def test_a_given_n_is_kept_and_a_file_cut_below_it_refuses_the_resume(tmp_path):
    (tmp_path / "data.jsonl").write_text(GOOD_LINE * 5, encoding="utf-8")
    path = write(tmp_path, {"variants": [{"name": "base"}],
                            "workload": SMALL | {"dataset": {"path": "data.jsonl", "n": 5}}})
    plan = plan_suite_file(path)
    with Store(tmp_path / "store.sqlite") as store:
        store.create_run("run-1", plan.suite.model_dump(mode="json"), str(path), plan.to_json(), {}, str(tmp_path))
        row = store.run("run-1")
    (tmp_path / "data.jsonl").write_text(GOOD_LINE * 4, encoding="utf-8")
    with pytest.raises(VariantlabError, match="the file has 4 records, fewer than the n: 5 asked for"):
        replan(row, tmp_path / "store.sqlite")


def test_a_given_compile_false_resumes_on_transformers_modules(tmp_path):
    """`compile: false`, given, plans transformers' modules (no decode step); resuming keeps it so, while a
    previous version's written-out default `compile: false` resumes as not given (our decode step)."""
    path = write(tmp_path, {"variants": [{"name": "base"}, {"name": "eager", "recipe": "fp32", "compile": False}],
                            "workload": SMALL})
    stored, again = stored_then_replanned(path, tmp_path / "store.sqlite")
    assert again == stored
    assert [v["decode_step"] for v in again["variants"]] == [True, False]
