"""Loading user JSONL datasets: good files load; every bad one raises DatasetError naming the file
and the line."""
from __future__ import annotations

import json

import pytest

from variantlab.data.jsonl import load_jsonl
from variantlab.errors import DatasetError

GOOD = {"prompt": "a: 1\nQ: What is the a?\nA:", "answer": "1"}


def write_lines(tmp_path, lines: list[str]):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_loads_records_keeps_extra_fields_and_skips_blank_lines(tmp_path):
    extra = {**GOOD, "id": "x", "task": "extract"}
    path = write_lines(tmp_path, [json.dumps(GOOD), "", "   ", json.dumps(extra)])
    assert load_jsonl(path) == [GOOD, extra]


def test_limit_stops_early_without_reading_bad_lines(tmp_path):
    path = write_lines(tmp_path, [json.dumps(GOOD), json.dumps(GOOD), "not json"])
    assert load_jsonl(path, limit=2) == [GOOD, GOOD]


def test_unicode_is_kept(tmp_path):
    record = {"prompt": "名前: 東京 🎉\nQ: ?\nA:", "answer": "東京"}
    path = write_lines(tmp_path, [json.dumps(record, ensure_ascii=False)])
    assert load_jsonl(path) == [record]


@pytest.mark.parametrize("lines, line_number, field, detail", [
    ([json.dumps(GOOD), "{not json"], 2, "line 2", "invalid JSON"),
    ([json.dumps(GOOD), "", '["a list"]'], 3, "line 3", "expected a JSON object"),
    ([json.dumps({"answer": "1"})], 1, "line 1: prompt", "missing field 'prompt'"),
    ([json.dumps(GOOD)] * 6 + [json.dumps({"prompt": "p", "answer": 7})], 7, "line 7: answer",
     "must be a string"),
])
def test_bad_lines_name_file_line_and_what_is_accepted(tmp_path, lines, line_number, field,
                                                       detail):
    path = write_lines(tmp_path, lines)
    with pytest.raises(DatasetError) as caught:
        load_jsonl(path)
    error = caught.value
    assert error.file == str(path) and error.field == field
    message = str(error)
    assert str(path) in message and f"line {line_number}" in message and detail in message
    assert "'prompt' and 'answer'" in message


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match="file not found") as caught:
        load_jsonl(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match="no records") as caught:
        load_jsonl(path)
    assert str(path) in str(caught.value)
