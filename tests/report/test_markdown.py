"""report.md's extra sections: what `recipe: auto` resolved to, and `explain: true`'s notes (unit)."""
from __future__ import annotations

from pathlib import Path

from variantlab.measure.analysis import Comparison
from variantlab.measure.runner import BenchResult
from variantlab.report.markdown import report_markdown


def _result(**kw) -> BenchResult:
    c = Comparison("fp32", ("fp32", "auto"), {"fp32": "ok", "auto": "ok"}, {"fp32": None, "auto": None}, ())
    return BenchResult("r1", "s", Path("."), Path("s.sqlite"), {"rounds": 1}, c, **kw)


def test_the_report_says_what_auto_resolved_to():
    text = report_markdown(_result(resolved={"auto": "bf16 (least estimated time: bf16 0.1 s < fp32 0.2 s)"}))
    assert "- auto: recipe auto → bf16 (least estimated time" in text
    assert _result(resolved={"auto": "bf16"}).to_json()["resolved"] == {"auto": "bf16"}


def test_the_report_carries_explain_notes_and_none_without_explain():
    text = report_markdown(_result(explain_notes=("explain: no variant was slower than the baseline beyond its "
                                                  "interval; nothing to explain",)))
    assert "## Why the slower variants are slower (explain: true)" in text and "nothing to explain" in text
    assert "explain: true" not in report_markdown(_result())
    assert "explanations" not in _result().to_json()
