"""What the reports read from a stored run (report/stored.py), on a store written by hand: the page's
inputs, show's JSON under its schema, and the recommendation only when something asks for one (unit);
a run stopped before it measured every variant, written through Store.put_record as a bench writes it,
read back in every format with the variants it never measured not called failed (issue 49)."""
from __future__ import annotations

import json
import sys
import types

import csv
import io

import jsonschema
import pytest
from rich.console import Console
from rich.text import Text

from tests.measure.test_analysis import OFF, SS, record
from tests.report.test_html import comparison
from variantlab.measure.analysis import NOT_MEASURED_INTERRUPTED, NOT_REACHED
from variantlab.measure.runs import RESULTS_SCHEMA, stored_comparison
from variantlab.measure.trackers import ColdStart, Memory
from variantlab.measure.wire import BuildRecord, MeasurementRecord
from variantlab.report.files import results_csv, results_json_schema, results_json_text
from variantlab.report.format import status_lines
from variantlab.report.html import report_html
from variantlab.report.markdown import comparison_markdown
from variantlab.report.stored import (explanations_in, has_requirements, run_page, scenario_specs,
                                      stored_recommendation, stored_results)
from variantlab.report.table import comparison_tables
from variantlab.store import DONE, INTERRUPTED, RUNNING, Store

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


# --------------------------------------------------------------------------- a run stopped part way (issue 49)

STOPPED = "20260102-090000-beef"
STOPPED_TRACKERS = (ColdStart(), SS, OFF, Memory())
UNMEASURED = ("late", "never")      # built but no round run; not even built
FAILED = {"broken": "build: out of memory", "crashed": "worker exited with status -9"}
WHY = {"late": "built, but the run was interrupted before any of its rounds",
       "never": "the run was interrupted before its build"}


def store_with_stopped_run(tmp_path, status: str = INTERRUPTED):
    """A two-round run stopped part way, its records written as a bench writes them (Store.put_record): base
    measured in both rounds, half in one, late built but never measured, never not even built; broken's build
    failed and crashed's one round failed. `status`: how the run was left (RUNNING: its bench was killed)."""
    names = ("base", "half", "late", "never", "broken", "crashed")
    plan = {"baseline": "base", "rounds": 2, "samples": 5, "variants": [{"name": n} for n in names],
            "trackers": [{"kind": t.kind, "config": t.config()} for t in STOPPED_TRACKERS]}
    path = tmp_path / "stopped.sqlite"
    with Store(path) as s:
        s.create_run(STOPPED, {"name": "demo"}, None, plan, {"cpu_model": "CPU", "cpu_count": 2, "rounds": 2},
                     str(tmp_path / "runs" / STOPPED))
        for n in ("base", "half", "late", "crashed"):
            s.put_record(STOPPED, BuildRecord(variant=n, status="ok", artifact_dir=f"/a/{n}",
                                              facts={"recipe": "fp32", "kernels": ["mm"]}, timings={"build_s": 1.0}))
        s.put_record(STOPPED, BuildRecord(variant="broken", status="failed", reason="out of memory"))
        for rec, blobs in (record("base", 0), record("half", 0, scale=0.8), record("base", 1)):
            s.put_record(STOPPED, rec, blobs)
        s.put_record(STOPPED, MeasurementRecord(variant="crashed", round=0, status="failed",
                                                reason=FAILED["crashed"]))
        if status != RUNNING:
            s.finish_run(STOPPED, None, status)
    return path


@pytest.mark.parametrize("status", [INTERRUPTED, RUNNING])
def test_a_stopped_run_says_which_variants_it_never_measured_and_which_failed(tmp_path, status):
    with Store(store_with_stopped_run(tmp_path, status)) as s:
        c, row = stored_comparison(s, STOPPED)
    assert row.status == status and row.comparison is None          # analysed now, from its records
    assert c.status == {"base": "ok", "half": "ok", "late": NOT_MEASURED_INTERRUPTED,
                        "never": NOT_MEASURED_INTERRUPTED, "broken": "failed", "crashed": "failed"}
    assert {v: c.reasons[v] for v in (*UNMEASURED, *FAILED)} == WHY | FAILED
    assert c.rounds["half"] == {"ok": 1, "failed": 0}                # a round missing: still ok
    lines = status_lines(c)
    assert [line for line in lines if line.startswith(("late:", "never:", "broken:", "crashed:"))] == [
        f"late: {NOT_MEASURED_INTERRUPTED} — {WHY['late']}", f"never: {NOT_MEASURED_INTERRUPTED} — {WHY['never']}",
        f"broken: failed — {FAILED['broken']}", f"crashed: failed — {FAILED['crashed']}"]


def test_a_run_that_ended_without_measuring_a_variant_says_it_was_not_reached(tmp_path):
    with Store(store_with_stopped_run(tmp_path, DONE)) as s:
        c, _ = stored_comparison(s, STOPPED)
    assert c.status["late"] == c.status["never"] == NOT_REACHED and c.status["broken"] == "failed"
    assert c.reasons["late"] == "built, but the run ended before any of its rounds"
    assert c.reasons["never"] == "the run ended before its build"


def _cells_of(table, header_start: str) -> set[str]:
    col = next(col for col in table.columns if Text.from_markup(col.header).plain.startswith(header_start))
    return {Text.from_markup(cell).plain for cell in col.cells}


def test_an_interrupted_run_reads_the_same_in_every_format(tmp_path):
    """The terminal table, Markdown, JSON, CSV and HTML all say "not measured (interrupted)" for the variants
    the run never measured, and "failed" only for the two that did fail."""
    with Store(store_with_stopped_run(tmp_path)) as s:
        c, _ = stored_comparison(s, STOPPED)
        doc = json.loads(results_json_text(stored_results(s, STOPPED)))
        page = report_html(run_page(s, STOPPED))
    expected = {"base": None, "half": None, "late": NOT_MEASURED_INTERRUPTED, "never": NOT_MEASURED_INTERRUPTED,
                "broken": "failed", "crashed": "failed"}
    # the terminal: every cell of the variant's column, whichever of the split tables holds it
    tables = comparison_tables(c, all_rows=True)
    for v, label in expected.items():
        if label is not None:
            assert {cells for t in tables if any(Text.from_markup(col.header).plain.startswith(v) for col in t.columns)
                    for cells in _cells_of(t, v)} == {label}
    console = Console(width=100, record=True)
    for t in tables:
        console.print(t)
    assert NOT_MEASURED_INTERRUPTED in console.export_text()
    # Markdown: the variant's column in every row
    lines = comparison_markdown(c).splitlines()
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    for row in lines[2:]:
        cells = [x.strip() for x in row.strip("|").split("|")]
        for v, label in expected.items():
            if label is not None:
                assert cells[header.index(v if v != "base" else "base (baseline)")] == label, row
    # JSON (show --format json, results.json), under its schema
    jsonschema.validate(doc, results_json_schema(), cls=jsonschema.Draft202012Validator)
    assert doc["status"] == "interrupted"
    assert doc["comparison"]["status"] == {v: label or "ok" for v, label in expected.items()}
    assert {v: doc["comparison"]["reasons"][v] for v in UNMEASURED} == WHY
    # CSV: every line of the variant
    by_variant: dict[str, set] = {}
    for line in csv.DictReader(io.StringIO(results_csv(c))):
        by_variant.setdefault(line["variant"], set()).add(line["status"])
    assert by_variant == {v: {label or "ok"} for v, label in expected.items()}
    # HTML: grey cells with the reason on hover; red ones only for the failures; the charts say why they skip
    rows = page.count('<tr class="headline">') + page.count('<tr class="">')
    for v in UNMEASURED:
        cell = f'<td class="unmeasured" title="{WHY[v]}">{NOT_MEASURED_INTERRUPTED}</td>'
        assert page.count(cell) == rows > 0
    assert page.count('<td class="failed"') == 2 * rows
    assert f"skipped late: {NOT_MEASURED_INTERRUPTED} — {WHY['late']}" in page
    assert "skipped late: failed" not in page and "skipped never: failed" not in page
