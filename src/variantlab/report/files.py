"""Writing a run's report files: report.md, results.json, results.csv; and the HTML page where asked.

results.json carries "schema": "variantlab.results/1" (measure/runner.RESULTS_SCHEMA); the JSON Schema
that describes it ships beside this module (results.schema.json, `results_json_schema()`).
"""
from __future__ import annotations

import csv
import io
import json
from importlib import resources
from pathlib import Path

from ..errors import VariantlabError
from .markdown import report_markdown

RESULTS_SCHEMA_FILE = "results.schema.json"


def results_csv(comparison) -> str:
    """Long format: one line per (metric, variant) with value, interval and delta."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["metric", "label", "unit", "kind", "variant", "status", "value", "ci_low", "ci_high", "n", "rounds",
                "cv", "round_cv", "method", "problem", "delta_pct", "delta_low", "delta_high", "significant",
                "delta_method"])
    for r in comparison.rows:
        for v in comparison.variants:
            e, d = r.cells.get(v), r.deltas.get(v)
            w.writerow([r.key, r.label, r.unit, r.kind, v, comparison.status.get(v),
                        *(("",) * 9 if e is None else (e.value, e.low, e.high, e.n, e.rounds, e.cv, e.round_cv,
                                                       e.method, e.problem)),
                        *(("",) * 5 if d is None else (d.pct, d.low, d.high, d.significant, d.method))])
    return buf.getvalue()


def results_json_text(data: dict) -> str:
    """results.json's text: strict JSON (a non-finite float, which JSON cannot hold, is written as null)."""
    from ..explain.run import finite
    return json.dumps(finite(data), indent=2, allow_nan=False)


def results_json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of results.json."""
    return json.loads(resources.files(__package__).joinpath(RESULTS_SCHEMA_FILE).read_text(encoding="utf-8"))


def write_reports(result) -> None:
    out = result.output_dir
    (out / "report.md").write_text(report_markdown(result), encoding="utf-8")
    (out / "results.json").write_text(results_json_text(result.to_json()), encoding="utf-8")
    (out / "results.csv").write_text(results_csv(result.comparison), encoding="utf-8")


def reports_step(run, result):
    """The last step after a run (measure/runner.AfterRun): report.md, results.json and results.csv in the run
    folder; an OS error is bad input naming the folder (the run is stored all the same)."""
    try:
        write_reports(result)
    except OSError as e:
        raise VariantlabError(f"cannot write the run's reports ({e.strerror}); the run is stored as "
                              f"{result.run_id}", file=str(result.output_dir), accepted="a writable folder") from None
    return result


def check_output_file(path: Path, option: str = "--output") -> None:
    """Raise (bad input) unless `path` can be written as a file: its folder exists and is a folder, and it is
    not a folder itself."""
    parent = path.parent
    accepted = "a file path in an existing folder"
    for p in (parent, *parent.parents):
        if p.exists() and not p.is_dir():
            raise VariantlabError(f"{p} is a file, not a folder", file=str(path), field=option, accepted=accepted)
    if not parent.is_dir():
        raise VariantlabError(f"folder {parent} does not exist", file=str(path), field=option, accepted=accepted)
    if path.is_dir():
        raise VariantlabError("this is a folder, not a file", file=str(path), field=option, accepted=accepted)


def write_page(path: Path, text: str, option: str = "--output") -> None:
    """Write an HTML page (or any text report) to `path`, checked first; an OS error is a one-line error."""
    check_output_file(path, option)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise VariantlabError(f"cannot write it: {e.strerror}", file=str(path), field=option,
                              accepted="a writable file path") from None
