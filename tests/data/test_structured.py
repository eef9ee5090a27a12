"""The structured-sample generator: determinism, prefix stability, shape, and answers that are
recomputed from the rendered record text (so a rendering bug cannot hide behind its own answer)."""
from __future__ import annotations

import json
import re

import pytest

from variantlab.data.jsonl import load_jsonl
from variantlab.data.structured import (FORMATS, KINDS, TASKS, generate_samples, iter_samples,
                                        make_sample, write_jsonl)

FIELDS = ("id", "kind", "format", "task", "prompt", "answer")
PROMPT_SHAPE = re.compile(r"^(?P<record>.+)\nQ: (?P<question>[^\n]+)\nA:$", re.DOTALL)
LOOKUP = re.compile(r"^What is the (?P<field>\w+) (?:of|at) (?P<key>\S+)\?$")
COUNT = re.compile(r"^How many \w+ have (?P<field>\w+) (?P<value>\S+)\?$")


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return generate_samples(600, seed=11)


def split_prompt(prompt: str) -> tuple[str, str]:
    match = PROMPT_SHAPE.match(prompt)
    assert match, prompt
    return match["record"], match["question"]


def parse_rows(record: str, fmt: str) -> list[dict[str, str]]:
    """Independent reader of every rendering: JSON, 'k: v' / 'k=v' lines, ' | ' or ',' tables."""
    if fmt == "json":
        data = json.loads(record)
        rows = data if isinstance(data, list) else [data]
        return [{k: str(v) if not isinstance(v, float) else f"{v:.2f}" for k, v in r.items()}
                for r in rows]
    lines = record.split("\n")
    if fmt == "kv" and "=" not in lines[0]:
        return [dict(line.split(": ", 1) for line in lines)]
    if fmt == "kv":
        separator = "; " if "; " in lines[0] else " "
        return [dict(cell.split("=", 1) for cell in line.split(separator)) for line in lines]
    delimiter = " | " if " | " in lines[0] else ","
    header = lines[0].split(delimiter)
    return [dict(zip(header, line.split(delimiter))) for line in lines[1:]]


def test_same_seed_gives_identical_samples():
    first = [json.dumps(s) for s in generate_samples(200, seed=3)]
    second = [json.dumps(s) for s in generate_samples(200, seed=3)]
    assert first == second


def test_different_seeds_give_different_samples():
    assert generate_samples(20, seed=3) != generate_samples(20, seed=4)


def test_first_k_samples_do_not_depend_on_n():
    assert generate_samples(500, seed=0)[:64] == generate_samples(64, seed=0)
    assert list(iter_samples(10, seed=2)) == generate_samples(10, seed=2)
    assert make_sample(2, 7) == generate_samples(8, seed=2)[7]


def test_golden_count_sample_is_stable_and_correct():
    # Seed 0 is the benchmark suite's seed: a change here changes every published number.
    sample = make_sample(0, 1)
    assert sample["prompt"] == (
        '[{"invoice":"INV-65887","currency":"GBP","due":"2024-07-13","paid":"yes"},'
        '{"invoice":"INV-76796","currency":"EUR","due":"2024-04-16","paid":"yes"}]\n'
        "Q: How many invoices have paid yes?\nA:")
    assert (sample["task"], sample["answer"]) == ("count", "2")


def test_handcrafted_records_parse_as_expected():
    table = "time | level\n01:00:00 | ERROR\n02:00:00 | INFO\n03:00:00 | ERROR"
    assert sum(r["level"] == "ERROR" for r in parse_rows(table, "table")) == 2
    logfmt = "time=01:00:00 level=WARN\ntime=02:00:00 level=WARN"
    assert [r["level"] for r in parse_rows(logfmt, "kv")] == ["WARN", "WARN"]


def test_fields_and_types(samples):
    for sample in samples:
        assert tuple(sample) == FIELDS
        assert all(isinstance(sample[f], str) for f in FIELDS)
        assert sample["kind"] in KINDS and sample["format"] in FORMATS
        assert sample["task"] in TASKS
        assert sample["answer"] and sample["answer"] == sample["answer"].strip()
        assert "\n" not in sample["answer"] and len(sample["answer"].split()) <= 4
        split_prompt(sample["prompt"])


def test_every_kind_format_and_task_occurs(samples):
    assert {s["kind"] for s in samples} == set(KINDS)
    assert {s["format"] for s in samples} == set(FORMATS)
    assert {s["task"] for s in samples} == set(TASKS)


def test_prompts_are_mostly_80_to_260_characters(samples):
    in_range = sum(80 <= len(s["prompt"]) <= 260 for s in samples)
    assert in_range / len(samples) > 0.8


def test_extract_answer_is_the_records_field(samples):
    for sample in (s for s in samples if s["task"] == "extract"):
        record, question = split_prompt(sample["prompt"])
        field = re.fullmatch(r"What is the (\w+)\?", question)[1]
        (row,) = parse_rows(record, sample["format"])
        assert row[field] == sample["answer"], sample


def test_lookup_answer_is_the_keyed_rows_field(samples):
    for sample in (s for s in samples if s["task"] == "lookup"):
        record, question = split_prompt(sample["prompt"])
        match = LOOKUP.match(question)
        rows = parse_rows(record, sample["format"])
        assert 2 <= len(rows) <= 5
        (row,) = [r for r in rows if match["key"] in r.values()]
        assert row[match["field"]] == sample["answer"], sample


def test_count_answer_is_recomputed_from_the_record(samples):
    counts = set()
    for sample in (s for s in samples if s["task"] == "count"):
        record, question = split_prompt(sample["prompt"])
        match = COUNT.match(question)
        rows = parse_rows(record, sample["format"])
        assert 2 <= len(rows) <= 5
        assert str(sum(r[match["field"]] == match["value"] for r in rows)) == sample["answer"]
        counts.add(int(sample["answer"]))
    assert counts <= set(range(6)) and {0, 1, 2, 3} <= counts


def test_write_jsonl_round_trips_through_load_jsonl(tmp_path):
    samples = generate_samples(30, seed=5)
    path = write_jsonl(samples, tmp_path / "samples.jsonl")
    assert load_jsonl(path) == samples
