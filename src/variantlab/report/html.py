"""The comparison as one self-contained HTML page: the table, the charts and the recommendation.

Pure: `report_html(page, recommendation)` takes what the store holds (a `RunPage`, built by
report/stored.py) and the recommendation's JSON (advise, or None) and returns the page as a string.
The page opens offline: plotly.js is inlined once in the head, there is no CDN, font or stylesheet
link, and a Content-Security-Policy forbids every fetch (scripts and styles inline only).
Every figure comes from the stored run; a chart the run has no data for is left out with a line
saying why, and points that cannot be drawn (failed or unmeasured variants, problem or non-finite
cells) are named under their chart (report/charts.py). A variant's cells that have no figure read its
status: a failure's in red, a variant the run never measured ("not measured (interrupted)", "not
reached") in grey; the reason on hover.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field, replace

from ..measure.analysis import Comparison, Row, never_measured
from ..measure.stats import Estimate
from .charts import Chart, all_charts
from .format import delta_columns, fmt_delta, fmt_estimate, header, status_lines, verdict, visible_rows

NO_REQUIREMENTS = "no requirements given"
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 24px 32px;
       color: #1b1f24; background: #fff; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #d0d7de; }
.about { color: #57606a; margin: 0.1em 0; }
table.comparison { border-collapse: collapse; font-size: 13px; width: 100%; }
table.comparison th, table.comparison td { border: 1px solid #d0d7de; padding: 4px 8px; vertical-align: top; }
table.comparison thead th { background: #f6f8fa; position: sticky; top: 0; text-align: left; }
table.comparison td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.comparison tr.group th { background: #eef2f6; text-align: left; font-weight: 600; }
table.comparison tr.headline td:first-child { font-weight: 600; }
td.better { color: #116329; background: #eaf7ee; } td.worse { color: #a40e26; background: #fdecee; }
td.same, td.negligible { color: #6e7781; } td.problem { color: #9a6700; font-size: 12px; }
td.failed { color: #a40e26; font-style: italic; } td.unmeasured { color: #6e7781; font-style: italic; }
span.why { color: #8c959f; font-size: 11px; }
.notes { color: #57606a; font-size: 13px; } .notes li { margin: 2px 0; }
.left-out { color: #6e7781; font-style: italic; }
.recommendation { background: #f6f8fa; border-left: 4px solid #0969da; padding: 8px 14px; white-space: pre-wrap;
                  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; }
.chart { margin: 12px 0 28px; }
footer { margin-top: 3em; color: #8c959f; font-size: 12px; }
"""


@dataclass(frozen=True)
class RunPage:
    """What the page shows besides the recommendation, read from the store beforehand."""

    comparison: Comparison
    title: str
    run_id: str = ""
    about: tuple[str, ...] = ()                 # lines under the title: the run, the machine
    scenarios: tuple[dict, ...] = ()            # the plan's scenario specs (type, name, batch_size, lengths)
    samples: int | None = None                  # dataset size: an offline batch is at most this
    attention: dict[str, str] = field(default_factory=dict)   # variant → attention kind
    explanations: tuple[dict, ...] = ()         # explanation.json files of the run's folder


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _group(key: str) -> str:
    return key.rpartition(".")[0] or key


def table_html(c: Comparison) -> str:
    """Every row with a value: value [low, high] per variant, then delta % [low, high] with its verdict."""
    rows = visible_rows(c)
    if not rows:
        return '<p class="left-out">no row has a value: nothing was measured</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in header(c))
    body, last = [], None
    for r in rows:
        if _group(r.key) != last:
            last = _group(r.key)
            body.append(f'<tr class="group"><th colspan="{len(header(c))}">{_e(last)}</th></tr>')
        body.append(_row_html(c, r))
    return (f'<table class="comparison"><thead><tr>{head}</tr></thead><tbody>' + "\n".join(body)
            + "</tbody></table>")


def _row_html(c: Comparison, r: Row) -> str:
    cells = [f'<td title="{_e(r.key)}">{_e(r.label)}</td>']
    for v in c.variants:
        if c.status.get(v) != "ok":   # a variant the run never measured is grey, not a failure's red
            kind = "unmeasured" if never_measured(c.status.get(v)) else "failed"
            cells.append(f'<td class="{kind}" title="{_e(c.reasons.get(v) or "")}">{_e(c.status.get(v) or "—")}</td>')
            continue
        cells.append(_cell_html(r.cells.get(v), r.checks_stability))
    for v in delta_columns(c):
        d = r.deltas.get(v)
        tip = f' title="{_e(d.method)}"' if d is not None and d.method else ""
        cells.append(f'<td class="num {verdict(r, v) or ""}"{tip}>{_e(fmt_delta(d))}</td>')
    return f'<tr class="{"headline" if r.headline is not None else ""}">' + "".join(cells) + "</tr>"


def _cell_html(e: Estimate | None, check_stability: bool) -> str:
    """The value and its interval; a problem beside a value (why there is no interval) in small print."""
    if e is not None and e.value is None and e.problem:
        return f'<td class="problem">{_e(e.problem)}</td>'
    if e is not None and e.problem and (e.low is None or e.high is None or e.low == e.high):
        text = fmt_estimate(replace(e, problem=None), True, check_stability)
        return f'<td class="num">{_e(text)}<br><span class="why">({_e(e.problem)})</span></td>'
    return f'<td class="num">{_e(fmt_estimate(e, True, check_stability))}</td>'


def recommendation_html(recommendation: dict | None) -> str:
    if not recommendation:
        return f'<p class="left-out">{NO_REQUIREMENTS}</p>'
    lines = (recommendation.get("lines")
             or [f"pick: {recommendation.get('pick')} — {recommendation.get('reason', '')}"])
    return f'<div class="recommendation">{_e(chr(10).join(map(str, lines)))}</div>'


def _chart_id(key: str) -> str:
    return "chart-" + re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")


def chart_html(chart: Chart) -> str:
    notes = "".join(f"<li>{_e(n)}</li>" for n in chart.notes)
    opening = (f'<section class="chart" id="{_chart_id(chart.key)}-section" data-chart="{_e(chart.key)}" '
               f'data-drawn="{"no" if chart.figure is None else "yes"}">')
    if chart.figure is None:
        return (f'{opening}<h3>{_e(chart.title)}</h3>'
                f'<p class="left-out">left out: {_e("; ".join(chart.notes) or "no data")}</p></section>')
    div = chart.figure.to_html(full_html=False, include_plotlyjs=False, div_id=_chart_id(chart.key),
                               config=PLOT_CONFIG, default_width="100%",
                               default_height=f"{chart.figure.layout.height}px")
    return (f'{opening}{div}'
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + "</section>")


def _plotly_js() -> str:
    import plotly.offline
    return "window.PlotlyConfig = {MathJaxConfig: 'local'};\n" + plotly.offline.get_plotlyjs()


def report_html(page: RunPage, recommendation: dict | None = None) -> str:
    """The whole page. `recommendation`: Recommendation.to_json() (its "lines", "front", "pick"), or None."""
    c = page.comparison
    rec = recommendation or None
    charts = all_charts(c, scenarios=page.scenarios, samples=page.samples, attention=page.attention,
                        explanations=page.explanations, front=rec.get("front") if rec else None,
                        pick=rec.get("pick") if rec else None,
                        front_over=[d.get("label", d.get("key", "?")) for d in (rec or {}).get("dimensions") or ()
                                    if isinstance(d, dict)])
    drawn = [ch for ch in charts if ch.figure is not None]
    status = "".join(f"<li>{_e(line)}</li>" for line in status_lines(c, visible_rows(c)))
    about = "".join(f'<p class="about">{_e(line)}</p>' for line in page.about)
    script = f"<script>{_plotly_js()}</script>" if drawn else ""
    import plotly
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(page.title)}</title>
<style>{STYLE}</style>
{script}
</head>
<body>
<h1>{_e(page.title)}</h1>
{about}
<h2 id="recommendation">Recommendation</h2>
{recommendation_html(rec)}
<h2 id="comparison">Comparison (baseline: {_e(c.baseline)})</h2>
<p class="notes">Values with 95% intervals in brackets; delta is (variant − baseline) / baseline with its interval;
(n.s.) marks a difference the interval does not support. Green: significantly better by at least 1%; red: worse.</p>
{table_html(c)}
<ul class="notes">{status}</ul>
<h2 id="charts">Charts</h2>
{"".join(chart_html(ch) for ch in charts)}
<footer>variantlab report{f" of run {_e(page.run_id)}" if page.run_id else ""}; one self-contained file
(plotly {_e(plotly.__version__)} inlined), nothing fetched from the network.</footer>
</body>
</html>
"""
