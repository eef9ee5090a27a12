"""Loading user JSONL datasets: good files load; every bad one raises DatasetError naming the file
and the line."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from variantlab.data.jsonl import MAX_LINE_BYTES, load_jsonl, read_jsonl, summarize_skipped
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


# ---------------------------------------------------------------- bad lines, one at a time and by the thousand

def write_bytes(tmp_path, lines: list[bytes], name: str = "data.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_the_first_bad_line_names_the_flag_that_skips_it(tmp_path):
    path = write_lines(tmp_path, [json.dumps(GOOD), "{oops"])
    with pytest.raises(DatasetError) as caught:
        load_jsonl(path)
    assert caught.value.field == "line 2" and "--skip-bad-lines" in str(caught.value)


def test_skip_bad_lines_keeps_the_good_ones_and_says_which_it_skipped(tmp_path):
    path = write_lines(tmp_path, [json.dumps(GOOD), "{oops", "", json.dumps({"prompt": "p"}), "7",
                                  json.dumps(GOOD)])
    read = read_jsonl(path, skip_bad_lines=True)
    assert read.records == [GOOD, GOOD]
    assert [s.line_number for s in read.skipped] == [2, 4, 5]
    assert "invalid JSON" in read.skipped[0].reason and read.skipped[1].reason == "missing field 'answer'"
    assert str(read.skipped[2]) == "line 5: expected a JSON object, got int"
    assert summarize_skipped(read.skipped, shown=2) == (f"line 2: {read.skipped[0].reason}, line 4: missing field "
                                                         "'answer', and 1 more")


def test_skip_bad_lines_counts_its_limit_in_good_records(tmp_path):
    path = write_lines(tmp_path, ["[]", json.dumps(GOOD), "[]", json.dumps(GOOD), "[]"])
    read = read_jsonl(path, limit=2, skip_bad_lines=True)
    assert read.records == [GOOD, GOOD] and [s.line_number for s in read.skipped] == [1, 3]


def test_a_file_of_bad_lines_only_is_still_an_error_with_the_flag(tmp_path):
    path = write_lines(tmp_path, ["{", "", "[1]"])
    with pytest.raises(DatasetError, match="no good records") as caught:
        read_jsonl(path, skip_bad_lines=True)
    assert "line 1: invalid JSON" in str(caught.value) and "line 3" in str(caught.value)


def test_a_line_that_is_not_utf8_is_named_by_its_number(tmp_path):
    path = write_bytes(tmp_path, [json.dumps(GOOD).encode(), b'{"prompt": "\xff", "answer": "1"}'])
    with pytest.raises(DatasetError) as caught:
        load_jsonl(path)
    assert caught.value.field == "line 2" and "not UTF-8" in str(caught.value) and "0xff" in str(caught.value)
    assert read_jsonl(path, skip_bad_lines=True).records == [GOOD]


def test_a_byte_order_mark_is_skipped(tmp_path):
    path = write_bytes(tmp_path, [b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), json.dumps(GOOD).encode()])
    assert load_jsonl(path) == [GOOD, GOOD]


@pytest.mark.parametrize("line, detail", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),                 # was RecursionError
    ('{"prompt": "a", "answer": "1", "x": ' + "9" * 5000 + "}", "invalid JSON"),   # was ValueError (int digits)
    ('{"prompt": "\\ud800", "answer": "1"}', "unpaired surrogate"),
    ('{"prompt": "  ", "answer": "1"}', "field 'prompt' is empty"),
])
def test_lines_that_crashed_or_would_crash_later_are_bad_lines(tmp_path, line, detail):
    path = write_lines(tmp_path, [json.dumps(GOOD), line])
    with pytest.raises(DatasetError, match=detail) as caught:
        load_jsonl(path)
    assert caught.value.field.startswith("line 2")


def test_a_line_past_the_size_limit_is_reported_not_held(tmp_path):
    huge = json.dumps({"prompt": "x" * (MAX_LINE_BYTES + 10), "answer": "1"}).encode()
    path = write_bytes(tmp_path, [huge, json.dumps(GOOD).encode()])
    with pytest.raises(DatasetError, match="line longer than 16 MiB") as caught:
        load_jsonl(path)
    assert caught.value.field == "line 1"
    read = read_jsonl(path, skip_bad_lines=True)
    assert read.records == [GOOD] and [s.line_number for s in read.skipped] == [1]


good_records = st.fixed_dictionaries(
    {"prompt": st.text(min_size=1).filter(str.strip), "answer": st.text()},
    optional={"id": st.text(max_size=5), "extra": st.one_of(st.integers(), st.floats(allow_nan=False), st.none())})
one_line_text = st.text(max_size=40).map(lambda t: t.replace("\n", " "))
bad_lines = st.one_of(
    one_line_text.map(lambda t: ("{" + t).encode("utf-8", "surrogatepass")),                   # invalid JSON
    st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=5), st.none())
    .map(lambda v: json.dumps(v).encode()),                                                      # not an object
    good_records.map(lambda r: json.dumps({k: v for k, v in r.items() if k != "answer"}).encode()),  # missing
    good_records.map(lambda r: json.dumps(r | {"answer": 1}).encode()),                          # not a string
    st.binary(max_size=20).map(lambda b: b"\xff" + b.replace(b"\n", b" ")),                     # not UTF-8
    st.sampled_from([b"[" * 5000, b'{"prompt": "\\udc00", "answer": "a"}', b'{"prompt": "", "answer": "a"}']),
)
lines_of_a_file = st.lists(st.one_of(
    good_records.map(lambda r: ("good", r)),
    bad_lines.map(lambda b: ("bad", b)),
    st.sampled_from([b"", b"   ", b"\t", b"\r"]).map(lambda b: ("blank", b))), max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(lines=lines_of_a_file, bom=st.booleans())
def test_random_files_load_or_name_their_first_bad_line(tmp_path, lines, bom):
    """Thousands of lines over 300 files: good, bad in every way, blank. Strict loading returns the good records
    or names the first bad line; skipping returns the good records and names every bad line."""
    raw = [json.dumps(v, ensure_ascii=False).encode() if kind == "good" else v for kind, v in lines]
    if bom and raw:
        raw[0] = b"\xef\xbb\xbf" + raw[0]
    path = write_bytes(tmp_path, raw or [b""])
    good = [v for kind, v in lines if kind == "good"]
    bad = [i for i, (kind, _) in enumerate(lines, start=1) if kind == "bad"]
    try:
        records = load_jsonl(path)
    except DatasetError as e:
        expected = f"line {bad[0]}" if bad else None
        assert (e.field or "").split(":")[0] == expected or (not bad and not good), str(e)
        assert "\n" not in str(e) and str(path) in str(e)
    else:
        assert not bad and records == good
    try:
        read = read_jsonl(path, skip_bad_lines=True)
    except DatasetError as e:
        assert not good and "\n" not in str(e) and str(path) in str(e)
    else:
        assert read.records == good and [s.line_number for s in read.skipped] == bad
