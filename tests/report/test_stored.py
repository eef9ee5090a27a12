"""What the reports read from a stored run (report/stored.py), on a store written by hand: the page's
inputs, show's JSON under its schema, and the recommendation only when something asks for one (unit)."""
from __future__ import annotations

import json
import sys
import types

import jsonschema
import pytest

from tests.report.test_html import comparison
from variantlab.measure.runs import RESULTS_SCHEMA
from variantlab.report.files import results_json_schema, results_json_text
from variantlab.report.stored import (explanations_in, has_requirements, run_page, scenario_specs,
                                      stored_recommendation, stored_results)
from variantlab.store import Store

RUN = "20260101-120000-abcd"
PLAN = {"baseline": "base", "samples": 8,
        "variants": [{"name": "base", "attention": None}, {"name": "lin-int8", "attention": "linear"},
                     {"name": "half", "attention": None},
                     {"name": "broken", "attention": "gqa:2", "resolved": {"summary": "bf16 (least time)"}}],
        "trackers": [{"kind": "cold_start", "config": {}},
                     {"kind": "offline", "config": {"spec": {"type": "offline", "name": None, "batch_size": 4}}}]}


def store_with_run(tmp_path, requirements=None, explanation=True):
    folder = tmp_path / "runs" / RUN
    if explanation:
        (folder / "explain" / "base-vs-lin-int8").mkdir(parents=True)
        (folder / "explain" / "base-vs-lin-int8" / "explanation.json").write_text(json.dumps(
            {"a": "base", "b": "lin-int8", "phases": []}))
        (folder / "explain" / "bad").mkdir()
        (folder / "explain" / "bad" / "explanation.json").write_text("{not json")
    suite = {"name": "demo", "workload": {"scenarios": [{"type": "single-stream"}]},
             "requirements": {"slo": {"ttft_s": None}, "max_kld": None} | (requirements or {})}
    path = tmp_path / "s.sqlite"
    with Store(path) as s:
        s.create_run(RUN, suite, None, PLAN, {"cpu_model": "CPU", "cpu_count": 2, "rounds": 1}, str(folder))
        s.finish_run(RUN, comparison().to_json())
    return path


def test_the_page_reads_scenarios_attention_samples_and_the_readable_explanations(tmp_path):
    with Store(store_with_run(tmp_path)) as s:
        page = run_page(s, "2026")
    assert page.run_id == RUN and page.samples == 8
    assert page.scenarios == ({"type": "offline", "name": None, "batch_size": 4},)
    # the build's attention first, else the plan's
    assert page.attention == {"base": "model's own", "lin-int8": "linear", "half": "model's own", "broken": "gqa:2"}
    assert [e["b"] for e in page.explanations] == ["lin-int8"]       # the unreadable one is skipped
    assert "run 20260101-120000-abcd (done)" in page.about[0] and "CPU (2 cores" in page.about[1]


def test_scenarios_fall_back_to_the_suites_list_and_no_folder_has_no_explanations():
    assert scenario_specs({}, {"workload": {"scenarios": [{"type": "offline"}]}}) == ({"type": "offline"},)
    assert explanations_in(None) == [] and explanations_in("/no/such/folder") == []


def test_shows_json_follows_the_results_schema(tmp_path):
    with Store(store_with_run(tmp_path)) as s:
        doc = json.loads(results_json_text(stored_results(s, RUN)))
    jsonschema.validate(doc, results_json_schema(), cls=jsonschema.Draft202012Validator)
    assert doc["schema"] == RESULTS_SCHEMA and doc["status"] == "done" and doc["suite"] == "demo"
    assert doc["resolved"] == {"broken": "bf16 (least time)"} and len(doc["explanations"]) == 1
    half = next(r for r in doc["comparison"]["rows"] if r["key"] == "single-stream.e2el_p95")["cells"]["half"]
    assert half["value"] is None                                      # NaN in the store: null in JSON


def test_no_requirements_no_recommendation(tmp_path):
    assert not has_requirements({"requirements": {"slo": {"ttft_s": 1.0}, "max_kld": None}})
    assert has_requirements({"requirements": {"max_kld": 0.1}})
    with Store(store_with_run(tmp_path)) as s:
        assert stored_recommendation(s, RUN) is None


def test_the_recommendation_is_asked_for_when_the_suite_has_requirements(tmp_path, monkeypatch):
    class Rec:
        def to_json(self):
            return {"pick": "half", "reason": "r", "front": ["half"], "dimensions": [], "lines": ["pick: half"],
                    "score": float("nan")}
    calls = []

    def recommend_stored(store, run_id, requirements_path=None):
        calls.append((run_id, requirements_path))
        return Rec(), None, None                                      # (recommendation, comparison, row)
    monkeypatch.setitem(sys.modules, "variantlab.advise.recommend",
                        types.SimpleNamespace(recommend_stored=recommend_stored))
    with Store(store_with_run(tmp_path, {"max_kld": 0.5})) as s:
        got = stored_recommendation(s, "2026")
        assert stored_recommendation(s, RUN, "req.yaml")["lines"] == ["pick: half"]
    assert got["front"] == ["half"] and got["score"] is None
    assert calls == [(RUN, None), (RUN, "req.yaml")]


def test_without_a_recommender_the_section_says_no_requirements(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "variantlab.advise.recommend", None)   # import fails
    with Store(store_with_run(tmp_path, {"max_kld": 0.5})) as s:
        assert stored_recommendation(s, RUN) is None


@pytest.mark.parametrize("run_id", ["zzz"])
def test_an_unknown_run_is_a_store_error(tmp_path, run_id):
    from variantlab.errors import StoreError
    with Store(store_with_run(tmp_path)) as s, pytest.raises(StoreError):
        run_page(s, run_id)
