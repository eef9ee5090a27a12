"""Writing a run's report files: report.md, results.json, results.csv."""
from __future__ import annotations

import csv
import io
import json

from .markdown import report_markdown


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


def write_reports(result) -> None:
    out = result.output_dir
    (out / "report.md").write_text(report_markdown(result), encoding="utf-8")
    (out / "results.json").write_text(json.dumps(result.to_json(), indent=2), encoding="utf-8")
    (out / "results.csv").write_text(results_csv(result.comparison), encoding="utf-8")
