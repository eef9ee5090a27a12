"""Bad input tried by the thousand (issue 13): generated suite files, valid and broken, through the planner.

Every document either plans (a Plan) or fails with a VariantlabError whose text is one line naming a
file — never another exception. Valid suites are built from the real schema (the shipped reference
model, real recipes and attention kinds, every scenario type), then broken: wrong types, missing and
unknown keys, unknown recipes, absurd numbers (huge ints, 1e308, inf, nan), unicode, deep nesting,
anchors and aliases, a non-mapping top level, duplicate keys, raw text and binary junk.

The fast tier runs a few hundred cases; the slow tier (`-m slow`, and the default `pytest -q`) runs
thousands. `recipe: auto` is left out: it resolves by timing kernels (torch) and is tested in its own
module. Run with `--hypothesis-show-statistics` to see how many cases ran.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from variantlab.errors import VariantlabError
from variantlab.measure.plan import Plan, plan_suite_file

FAST_EXAMPLES = 300
SLOW_EXAMPLES = 2000    # 3,000 took 116 s of a CI run that must stay under 30 minutes
RECIPES = ["fp32", "bf16", "fp16", "int8", "int4", "w8a8", "w4a8"]
ATTENTION = ["sdpa", "gqa:1", "gqa:2", "linear", "sliding:8", "sliding:64"]
TOP_LEVEL_KEYS = ["max_memory", "threads", "seed", "calibration", "explain", "output", "requirements", "baseline",
                  "device", "order", "compile", "backend", "base_url", "slo", "sequence_length", "objective"]
PRESETS = ["high-precision", "balanced", "resource-constrained", "extreme-compression", "real-time"]
GOOD_LINE = '{"prompt": "a: 1\\nQ: What is the a?\\nA:", "answer": "1"}\n'


# ---------------------------------------------------------------- valid suites, from the schema

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True)


@st.composite
def variants(draw):
    out = []
    for name in draw(st.lists(names, min_size=1, max_size=4, unique=True)):
        v: dict = {"name": name}
        if draw(st.booleans()):
            v["weight_dtype"], v["activation_dtype"] = draw(st.sampled_from(
                [("int8", "fp16"), ("int4", "int8"), ("int8", "int8"), ("int4", "bf16"), ("bf16", "bf16")]))
        else:
            v["recipe"] = draw(st.sampled_from(RECIPES))
            if v["recipe"] in ("int4", "w4a8") and draw(st.booleans()):
                v["options"] = {"group_size": draw(st.sampled_from([32, 64, 128]))}
        if draw(st.booleans()):
            v["attention"] = draw(st.sampled_from(ATTENTION))
            if v["attention"] == "linear" and draw(st.booleans()):
                v["attention_options"] = {"linear_chunk": draw(st.integers(1, 128))}
        out.append(v)
    return out


scenarios = st.one_of(
    st.fixed_dictionaries({"type": st.just("single-stream")},
                          optional={"requests": st.integers(1, 64), "warmup": st.integers(0, 4),
                                    "min_duration_s": st.floats(0, 5)}),
    st.fixed_dictionaries({"type": st.just("offline")},
                          optional={"batch_size": st.integers(1, 64), "passes": st.integers(1, 5),
                                    "warmup": st.integers(0, 2)}),
    st.fixed_dictionaries({"type": st.just("length-sweep")},
                          optional={"lengths": st.lists(st.integers(1, 4096), min_size=1, max_size=4),
                                    "decode_tokens": st.integers(2, 64), "repeats": st.integers(1, 5)}),
    st.fixed_dictionaries({"type": st.just("server"), "rate": st.floats(0.5, 100)},
                          optional={"duration_s": st.floats(0.5, 30), "policy": st.sampled_from(
                              ["single", "static", "adaptive"]), "max_batch": st.integers(1, 64)}),
)


@st.composite
def valid_suites(draw) -> dict:
    scs = draw(st.lists(scenarios, min_size=1, max_size=3, unique_by=lambda s: s["type"]))
    doc = {"name": draw(names), "model": "builtin:tiny-structured", "variants": draw(variants()),
           "workload": {"dataset": {"generator": "structured", "n": draw(st.integers(1, 24)),
                                    "seed": draw(st.integers(0, 2**32))},
                        "max_new_tokens": draw(st.integers(1, 64)), "scenarios": scs,
                        "accuracy": {"samples": draw(st.integers(0, 32))}},
           "rounds": draw(st.integers(1, 10)), "order": draw(st.sampled_from(["rotate", "random"])),
           "device": draw(st.sampled_from(["auto", "cpu"])), "timeout_s": draw(st.floats(1, 3600))}
    if draw(st.booleans()):
        doc["workload"]["dataset"] = {"path": "data.jsonl", "n": draw(st.integers(1, 6))}
    if draw(st.booleans()):
        doc["requirements"] = {"preset": draw(st.sampled_from(PRESETS))}
    if draw(st.booleans()):
        doc["baseline"] = doc["variants"][-1]["name"]
    if draw(st.booleans()):
        doc["max_memory"] = draw(st.sampled_from(["4GiB", "512 MiB", "2GB", 1 << 30]))
    return doc


# ---------------------------------------------------------------- ways to break one

huge_ints = st.one_of(st.integers(10**6, 10**12), st.integers(-(10**12), -1),
                      st.builds(lambda k: 10**k, st.integers(18, 400)),
                      st.builds(lambda k: -(10**k), st.integers(18, 400)))
odd_floats = st.sampled_from([1e308, -1e308, math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-320, 2.5])
unicode_text = st.text(min_size=0, max_size=40)
junk = st.recursive(
    st.one_of(st.none(), st.booleans(), huge_ints, st.integers(-3, 3), odd_floats, unicode_text,
              st.sampled_from(["int3", "gqa:0", "gqa:999999", "sliding:-1", "gqa:" + "9" * 5000, "fp32 ", "AUTO",
                               "../../etc", "builtin:nope", "", "\u202e", "🤖", "linear", "sliding:1", "9" * 400,
                               "1e400", "4 PiB", "NaN", "a\x00b", "x" * 300, "a/" * 3000])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(unicode_text, inner, max_size=3)),
    max_leaves=8)


def paths_of(doc, prefix=()):
    """Every (path, value) inside a nested document, the root included."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths_of(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths_of(v, prefix + (i,))


def replace_at(doc, path, value):
    if not path:
        return value
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return doc


@st.composite
def broken_suites(draw) -> dict:
    doc = draw(valid_suites())
    for _ in range(draw(st.integers(1, 3))):
        spots = list(paths_of(doc))
        path, value = draw(st.sampled_from(spots))
        how = draw(st.sampled_from(["replace", "delete", "extra", "absurd", "nest"]))
        if how == "replace" or not path:
            doc = replace_at(doc, path, draw(junk))
        elif how == "delete":
            parent = doc
            for p in path[:-1]:
                parent = parent[p]
            del parent[path[-1]]
        elif how == "extra" and isinstance(value, dict):
            value[draw(st.one_of(unicode_text, st.sampled_from(TOP_LEVEL_KEYS)))] = draw(junk)
        elif how == "absurd":
            doc = replace_at(doc, path, draw(st.one_of(huge_ints, odd_floats)))
        else:
            deep = draw(junk)
            for _ in range(draw(st.integers(10, 120))):
                deep = [deep] if draw(st.booleans()) else {"a": deep}
            doc = replace_at(doc, path, deep)
    return doc


def as_yaml(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


@st.composite
def text_mutations(draw) -> str:
    """Breaks only YAML text can hold: duplicate keys, anchors and aliases, deep flow nesting, cut text."""
    text = as_yaml(draw(valid_suites()))
    how = draw(st.sampled_from(["duplicate", "alias", "cycle", "laughs", "deep", "cut", "tag", "top"]))
    if how == "duplicate":
        lines = text.splitlines()
        i = draw(st.integers(0, len(lines) - 1))
        return "\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:]) + "\n"
    if how == "alias":
        return text.replace("variants:\n", "variants:\n- {name: zz-anchored, recipe: int8, options: &o {compute_dtype: "
                            "fp16}}\n- {name: zz-alias, recipe: int4, options: *o}\n", 1)
    if how == "cycle":    # an alias inside its own anchor: a structure that contains itself
        where = draw(st.sampled_from(["- name: ", "workload:\n"]))
        cyclic = "- options: &c {a: [*c]}\n  name: " if where == "- name: " else "workload: &w\n  w: *w\n"
        return text.replace(where, cyclic, 1)
    if how == "laughs":   # aliases share one object: small in memory, 9**9 leaves when expanded
        anchors = ["&l0 [a, a, a, a, a, a, a, a, a]"]
        anchors += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
        laughs = "[" + ", ".join(anchors) + "]"
        where = draw(st.sampled_from(["rounds: ", "  max_new_tokens: ", "- name: ", "top"]))
        if where == "top":
            return laughs + "\n"
        if where == "- name: ":
            return text.replace("- name: ", f"- options: {laughs}\n  name: ", 1)
        return text.replace(where, f"{where}{laughs}\n{where.replace(':', '_was:')}", 1)
    if how == "deep":
        depth = draw(st.sampled_from([50, 400, 700]))
        return text + "workload_extra: " + "[" * depth + "]" * depth + "\n"
    if how == "cut":
        return text[:draw(st.integers(0, len(text)))]
    if how == "tag":
        tag = draw(st.sampled_from(["0x" + "f" * 5000, "1" * 5000, "0b" + "1" * 20000, "!!python/object:os.system x",
                                    "!!timestamp 2020-99-99", "!!binary xx",
                                    "!!int 0x_", "!!float .nan", "!!set {a, b}", "!!omap [a: 1]", "!custom 1",
                                    "!!timestamp 2001-13-14t21:59:43.10-05:00", "!!int 99999999999999999999999"]))
        return text.replace("rounds:", f"rounds: {tag}\nrounds_was:", 1)
    return as_yaml(draw(st.one_of(st.lists(junk, max_size=3), unicode_text, huge_ints, odd_floats, st.none())))


suite_documents = st.one_of(
    valid_suites().map(as_yaml),
    broken_suites().map(as_yaml),
    text_mutations(),
    st.text(max_size=200),
    st.binary(max_size=200),
)


# ---------------------------------------------------------------- the property

def plans_or_fails_in_one_line(folder: Path, document: str | bytes) -> None:
    path = folder / "suite.yaml"
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document, encoding="utf-8", errors="surrogatepass")
    try:
        plan = plan_suite_file(path)
    except VariantlabError as e:
        text = str(e)
        assert "\n" not in text and "\r" not in text, f"error text spans lines: {text!r}"
        assert e.file and e.file in text, f"error names no file: {text!r}"
        return
    assert isinstance(plan, Plan)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder with a good JSONL dataset beside the suite file (suites may name `path: data.jsonl`)."""
    d = tmp_path_factory.mktemp("fuzz")
    (d / "data.jsonl").write_text(GOOD_LINE * 8, encoding="utf-8")
    return d


def fuzz_settings(n: int):
    """n cases, no per-case deadline (a 700-deep YAML document takes ~0.1 s on a busy 2-core machine)."""
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example])


@fuzz_settings(FAST_EXAMPLES)
@given(document=suite_documents)
def test_generated_suites_plan_or_fail_in_one_line(folder, document):
    plans_or_fails_in_one_line(folder, document)


@pytest.mark.slow
@fuzz_settings(SLOW_EXAMPLES)
@given(document=suite_documents)
def test_thousands_of_generated_suites_plan_or_fail_in_one_line(folder, document):
    plans_or_fails_in_one_line(folder, document)


@fuzz_settings(100)
@given(doc=valid_suites())
def test_suites_built_from_the_schema_plan(folder, doc):
    """The valid half really is valid: a fuzz whose every case failed would prove nothing."""
    assert isinstance(plan_suite_file(_write(folder, as_yaml(doc))), Plan)


def _write(folder: Path, text: str) -> Path:
    path = folder / "valid.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- the same, as a user meets it

CLI_CASES = {
    "absurd n": "model: builtin:tiny-structured\nvariants: [{name: a}]\nworkload: {dataset: {generator: structured, "
                "n: 1000000000}}\n",
    "deep nesting": "model: builtin:tiny-structured\nvariants: [{name: a}]\nworkload: " + "[" * 3000 + "]" * 3000,
    "bad timestamp": "model: builtin:tiny-structured\nvariants: [{name: a}]\nseed: !!timestamp 2020-99-99\n",
    "nan": "model: builtin:tiny-structured\nvariants: [{name: a}]\ntimeout_s: .nan\n",
    "binary": "\x00\x01\x02junk",
    "top-level list": "- model: builtin:tiny-structured\n",
}


@pytest.mark.e2e
@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_broken_suites_through_the_cli_exit_2_with_one_line(tmp_path, case):
    path = tmp_path / "suite.yaml"
    path.write_text(CLI_CASES[case], encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "variantlab.cli", "bench", str(path), "--store",
                           str(tmp_path / "s.sqlite")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=os.environ | {"COLUMNS": "400", "NO_COLOR": "1"})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    line = proc.stderr.rstrip("\n")
    assert line.startswith("error: ") and "\n" not in line and str(path) in line, proc.stderr
