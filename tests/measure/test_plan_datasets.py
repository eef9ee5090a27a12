"""The plan's datasets (measure/plan.py: load_dataset) with bad JSONL lines: without --skip-bad-lines the first
bad line is the one-line error; with it the bad lines are skipped and the plan's warnings say which."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from variantlab.errors import DatasetError
from variantlab.measure.plan import plan_suite_file

GOOD = [json.dumps({"prompt": f"{i}?", "answer": str(i)}) for i in range(4)]


def suite_over(tmp_path: Path, lines: list[str], **dataset) -> Path:
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    suite = {"model": "builtin:tiny-structured", "variants": [{"name": "fp32"}],
             "workload": {"dataset": {"path": "data.jsonl", **dataset}, "max_new_tokens": 2,
                          "scenarios": [{"type": "single-stream", "requests": 1, "warmup": 0}]}}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite), encoding="utf-8")
    return path


def test_without_the_flag_the_first_bad_line_is_the_error(tmp_path):
    path = suite_over(tmp_path, [GOOD[0], "{not json", GOOD[1], '{"prompt": "p"}'])
    with pytest.raises(DatasetError) as caught:
        plan_suite_file(path)
    text = caught.value.one_line()
    assert caught.value.field == "line 2" and "invalid JSON" in text and "--skip-bad-lines" in text
    assert str(tmp_path / "data.jsonl") in text


def test_with_the_flag_bad_lines_are_skipped_and_named_in_the_warnings(tmp_path):
    path = suite_over(tmp_path, [GOOD[0], "{not json", GOOD[1], '{"prompt": "p"}', GOOD[2]])
    plan = plan_suite_file(path, skip_bad_lines=True)
    assert [s["prompt"] for s in plan.samples] == ["0?", "1?", "2?"]
    assert [s["id"] for s in plan.samples] == ["0", "1", "2"]
    (warning,) = plan.warnings
    assert warning.startswith("workload.dataset: skipped 2 bad lines of data.jsonl (line 2: invalid JSON")
    assert "line 4: missing field 'answer'" in warning
    assert plan_suite_file(suite_over(tmp_path, GOOD), skip_bad_lines=True).warnings == ()


def test_an_explicit_n_counts_good_lines_only(tmp_path):
    path = suite_over(tmp_path, [GOOD[0], "[]", GOOD[1], "[]", GOOD[2]], n=4)
    with pytest.raises(DatasetError) as caught:
        plan_suite_file(path, skip_bad_lines=True)
    assert caught.value.field == "workload.dataset.n"
    assert "3 good records (2 bad lines skipped), fewer than the n: 4" in caught.value.one_line()
    assert len(plan_suite_file(suite_over(tmp_path, [GOOD[0], "[]", GOOD[1], "[]", GOOD[2]], n=3),
                               skip_bad_lines=True).samples) == 3


def test_with_the_flag_a_file_without_a_good_line_is_still_an_error(tmp_path):
    with pytest.raises(DatasetError, match="no good records"):
        plan_suite_file(suite_over(tmp_path, ["[]", "{", "7"]), skip_bad_lines=True)


def test_the_calibration_dataset_skips_too(tmp_path):
    path = suite_over(tmp_path, GOOD)
    (tmp_path / "calib.jsonl").write_text("\n".join([GOOD[3], "nope"]) + "\n", encoding="utf-8")
    suite = yaml.safe_load(path.read_text()) | {"calibration": {"path": "calib.jsonl"}}
    path.write_text(yaml.safe_dump(suite), encoding="utf-8")
    with pytest.raises(DatasetError, match="line 2"):
        plan_suite_file(path)
    plan = plan_suite_file(path, skip_bad_lines=True)
    assert plan.calibration_texts == ("3? 3",)
    assert plan.warnings == ("calibration: skipped 1 bad line of calib.jsonl (line 2: invalid JSON (Expecting value "
                             "at column 1))",)
