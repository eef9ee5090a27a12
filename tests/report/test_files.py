"""Writing report files (report/files.py): results.json as strict JSON under its schema, and the checks
on where an HTML page may be written (unit)."""
from __future__ import annotations

import json

import jsonschema
import pytest

from variantlab.errors import VariantlabError
from variantlab.measure.runs import RESULTS_SCHEMA
from variantlab.report.files import check_output_file, results_json_schema, results_json_text, write_page


def test_the_schema_is_a_valid_draft_2020_12_schema_for_this_version():
    schema = results_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema"]["const"] == RESULTS_SCHEMA == "variantlab.results/1"


def test_results_json_is_strict_json_with_null_for_non_finite_numbers():
    text = results_json_text({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": {"d": None}}
    assert "NaN" not in text and "Infinity" not in text


def test_the_schema_rejects_a_document_without_its_version():
    doc = {"run_id": "r", "suite": "s", "output_dir": None, "environment": {},
           "comparison": {"baseline": "a", "variants": ["a"], "status": {"a": "ok"}, "reasons": {"a": None},
                          "rows": []}}
    validator = jsonschema.Draft202012Validator(results_json_schema())
    assert not validator.is_valid(doc)
    assert validator.is_valid(doc | {"schema": RESULTS_SCHEMA})
    assert not validator.is_valid(doc | {"schema": "variantlab.results/2"})


@pytest.mark.parametrize("where, words", [
    ("missing/x.html", "folder"), ("a-file/x.html", "is a file, not a folder"),
    ("a-file/deeper/x.html", "is a file, not a folder"), (".", "this is a folder")])
def test_an_output_path_that_cannot_be_a_file_is_a_one_line_error(tmp_path, where, words):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(VariantlabError) as e:
        check_output_file(tmp_path / where)
    line = e.value.one_line()
    assert words in line and str(tmp_path / where) in line and "--output" in line and "\n" not in line


def test_write_page_writes_into_an_existing_folder(tmp_path):
    write_page(tmp_path / "r.html", "<html></html>")
    assert (tmp_path / "r.html").read_text() == "<html></html>"
