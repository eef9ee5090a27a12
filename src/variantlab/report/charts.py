"""The HTML report's charts: plotly figures built from a stored comparison, nothing else.

Five charts, each left out with a one-line reason when the run lacks its data:
- trade-off: accuracy (accuracy retention, else KLD) against latency (single-stream E2EL p95, else the
  first latency row there is), one point per variant with its intervals as error bars, the Pareto front
  highlighted (the recommendation's front when there is one, else the front of the two figures plotted);
- percentiles: E2EL p50/p90/p95/p99, TTFT and TPOT per variant, one chart per scenario with those rows;
- throughput: offline output throughput against batch size (single-stream counts as batch 1);
- length: prefill time and decode time per token against prompt length (length-sweep rows), one line
  per variant, dashed by attention kind;
- explain: per explained pair and phase, B − A in ms/token stacked by operator category.
A point whose cell is missing, a problem or not finite is skipped and named in the chart's notes; so is a
variant without figures, with its status and reason ("skipped int4: not reached — the run ended before its
build").
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..measure.analysis import Comparison, Row
from ..measure.stats import Estimate
from .format import fmt_value

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
LATENCY_PREFERENCE = ("e2el_p95", "e2el_p50", "tpot_p50", "ttft_p50", "single_task_latency")
PERCENTILES = (("E2EL", ("e2el_p50", "e2el_p90", "e2el_p95", "e2el_p99")),
               ("TTFT", ("ttft_p50", "ttft_p95", "ttft_p99")),
               ("TPOT", ("tpot_p50", "tpot_p95")))
LAYOUT = {"template": "plotly_white", "height": 460, "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
          "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif", "size": 13}}


@dataclass(frozen=True)
class Chart:
    key: str                    # the chart's id in the page, e.g. "tradeoff", "percentiles-single-stream"
    title: str
    figure: object | None       # a plotly Figure; None when the run lacks the data (notes say why)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Point:
    value: float
    low: float | None
    high: float | None


def point(e: Estimate | None) -> Point | None:
    """A cell's value and interval when the value is a finite number; a non-finite bound is dropped."""
    if e is None or not _finite(e.value):
        return None
    ok = _finite(e.low) and _finite(e.high)
    return Point(float(e.value), float(e.low) if ok else None, float(e.high) if ok else None)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def why_missing(c: Comparison, row: Row, variant: str) -> str:
    """Why `variant` has no point on `row`, in a few words."""
    if c.status.get(variant) != "ok":
        why = c.reasons.get(variant)
        return f"{c.status.get(variant) or 'not run'}" + (f" — {why}" if why else "")
    e = row.cells.get(variant)
    if e is None:
        return "not measured"
    if e.value is None:
        return e.problem or "no value"
    return f"{e.value} is not a finite number"


def _skipped(c: Comparison, row: Row, variants: Sequence[str]) -> list[str]:
    return [f"skipped {v} on {row.label}: {why_missing(c, row, v)}" for v in variants]


def colours(c: Comparison) -> dict[str, str]:
    """One colour per variant, the same in every chart."""
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(c.variants)}


def _rows_by_key(c: Comparison) -> dict[str, Row]:
    return {r.key: r for r in c.rows}


def _has_values(row: Row) -> bool:
    return any(point(e) is not None for e in row.cells.values())


def _time_scale(values: Sequence[float]) -> tuple[float, str]:
    """Seconds shown as ms when every value is under a second."""
    return (1e3, "ms") if values and max(abs(v) for v in values) < 1 else (1.0, "s")


def _scale(unit: str, values: Sequence[float]) -> tuple[float, str]:
    if unit == "s":
        return _time_scale(values)
    if unit == "B":
        return 1 / 2**20, "MiB"
    return 1.0, unit


def _error(points: Sequence[Point | None], factor: float) -> dict:
    """Asymmetric error bars from the intervals (0 where a point has none)."""
    plus = [(p.high - p.value) * factor if p and p.high is not None else 0 for p in points]
    minus = [(p.value - p.low) * factor if p and p.low is not None else 0 for p in points]
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "visible": any(plus + minus)}


def _layout(fig, title: str, **kw) -> None:
    fig.update_layout(**LAYOUT, title={"text": title, "x": 0.01}, **kw)


# ------------------------------------------------------------------ (a) accuracy against latency

def accuracy_row(c: Comparison) -> Row | None:
    """Accuracy retention when some variant has it, else KLD mean."""
    for suffix in ("accuracy_retention", "kld_mean"):
        found = [r for r in c.rows if r.key.endswith("." + suffix) and _has_values(r)]
        if found:
            return found[0]
    return None


def _kind(s: dict):
    """A stored scenario entry's class (measure/scenarios' registry), or None for a type this version lacks."""
    from ..measure.scenarios import SCENARIOS
    return SCENARIOS.get(s.get("type"))


def _role(s: dict) -> str:
    return getattr(_kind(s), "role", "")


def _declares(s: dict, what: str) -> bool:
    return bool(getattr(_kind(s), what, False))


def latency_row(c: Comparison, scenarios: Sequence[dict] = ()) -> Row | None:
    """The single-stream scenario's E2EL p95; else the first row there is of LATENCY_PREFERENCE; else the first
    timing row with a value."""
    single = [_scenario_name(s) for s in scenarios if _declares(s, "one_at_a_time")]
    rows = _rows_by_key(c)
    for name in single:
        if f"{name}.e2el_p95" in rows and _has_values(rows[f"{name}.e2el_p95"]):
            return rows[f"{name}.e2el_p95"]
    for suffix in LATENCY_PREFERENCE:
        for r in c.rows:
            if r.key.endswith("." + suffix) and _has_values(r):
                return r
    return next((r for r in c.rows if r.is_timing and r.unit == "s" and _has_values(r)), None)


def front_of(points: Mapping[str, tuple[Point, Point]], lower_is_better: tuple[bool, bool]) -> list[str]:
    """The variants no other dominates on the two point values (no worse on both, better on one)."""
    def better_or_equal(a: float, b: float, lower: bool) -> bool:
        return a <= b if lower else a >= b

    def dominates(p, q) -> bool:
        no_worse = all(better_or_equal(p[i].value, q[i].value, lower_is_better[i]) for i in (0, 1))
        return no_worse and any(p[i].value != q[i].value for i in (0, 1))
    return [n for n, p in points.items() if not any(dominates(q, p) for m, q in points.items() if m != n)]


def tradeoff_chart(c: Comparison, scenarios: Sequence[dict] = (), front: Sequence[str] | None = None,
                   pick: str | None = None, front_over: Sequence[str] = ()) -> Chart:
    """`front`: the recommendation's Pareto front (over the dimensions `front_over` names); without one, the
    front of the two figures plotted."""
    import plotly.graph_objects as go
    title = "Accuracy against latency"
    acc, lat = accuracy_row(c), latency_row(c, scenarios)
    if acc is None or lat is None:
        missing = " and ".join(w for w, r in (("an accuracy row (accuracy retention or KLD)", acc),
                                                ("a latency row", lat)) if r is None)
        return Chart("tradeoff", title, None, (f"no {missing} in this run",))
    points: dict[str, tuple[Point, Point]] = {}
    notes = []
    for v in c.variants:
        x, y = point(lat.cells.get(v)) if c.status.get(v) == "ok" else None, point(acc.cells.get(v))
        if c.status.get(v) != "ok":
            notes.append(f"skipped {v}: {why_missing(c, lat, v)}")
        elif x is None or y is None:
            notes += _skipped(c, lat if x is None else acc, [v])
        else:
            points[v] = (x, y)
    if not points:
        return Chart("tradeoff", title, None, ("no variant has both figures", *notes))
    lower = (True, bool(acc.lower_is_better))
    if front is not None:
        shown = [n for n in front if n in points]
        over = f" (over {', '.join(front_over)})" if front_over else ""
        notes.append(f"Pareto front from the recommendation{over}: " + (", ".join(front) or "—"))
    else:
        shown = front_of(points, lower)
        notes.append(f"Pareto front of these two figures (point values; no recommendation): {', '.join(shown)}")
    fx, xunit = _scale(lat.unit, [p[0].value for p in points.values()])
    fy, yunit = _scale(acc.unit, [p[1].value for p in points.values()])
    fig = go.Figure()
    col = colours(c)
    for v, (x, y) in points.items():
        on = v in shown
        fig.add_trace(go.Scatter(
            x=[x.value * fx], y=[y.value * fy], mode="markers+text", name=v + (" ★ front" if on else ""),
            text=[v + (" (pick)" if v == pick else "")], textposition="top center",
            error_x=_error([x], fx), error_y=_error([y], fy),
            marker={"size": 18 if on else 11, "color": col[v], "symbol": "diamond" if on else "circle",
                    "opacity": 1.0 if on else 0.55,
                    "line": {"width": 3 if on else 1, "color": "#111" if on else col[v]}},
            hovertext=[f"{v}<br>{lat.label}: {fmt_value(x.value, lat.unit)}<br>{acc.label}: "
                       f"{fmt_value(y.value, acc.unit)}" + ("<br>on the Pareto front" if on else "")],
            hoverinfo="text"))
    if len(shown) > 1:
        ordered = sorted(shown, key=lambda n: points[n][0].value)
        fig.add_trace(go.Scatter(x=[points[n][0].value * fx for n in ordered],
                                 y=[points[n][1].value * fy for n in ordered], mode="lines", name="Pareto front",
                                 line={"color": "#111", "dash": "dash", "width": 1.5}, hoverinfo="skip"))
    better = "lower is better" if acc.lower_is_better else "higher is better"
    _layout(fig, title, xaxis_title=f"{lat.label} ({xunit}, lower is better)",
            yaxis_title=f"{acc.label} ({yunit}, {better})", legend_title_text="variant")
    return Chart("tradeoff", title, fig, tuple(notes))


# ------------------------------------------------------------------ (b) latency percentiles

def _scenario_name(spec: dict) -> str:
    return spec.get("name") or spec.get("type") or "?"


def _prefixes_with(c: Comparison, suffixes: Sequence[str]) -> list[str]:
    """Row-key prefixes (scenario names), in row order, that have a row for some suffix."""
    out: list[str] = []
    for r in c.rows:
        prefix, _, suffix = r.key.rpartition(".")
        if suffix in suffixes and prefix not in out:
            out.append(prefix)
    return out


def percentile_charts(c: Comparison) -> list[Chart]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    wanted = [k for _, keys in PERCENTILES for k in keys]
    prefixes = _prefixes_with(c, wanted)
    if not prefixes:
        return [Chart("percentiles", "Latency percentiles", None,
                      ("no per-request latency rows (E2EL, TTFT, TPOT) in this run",))]
    rows = _rows_by_key(c)
    col = colours(c)
    charts = []
    for prefix in prefixes:
        title = f"Latency percentiles [{prefix}]"
        groups = [(name, [rows[f"{prefix}.{k}"] for k in keys if f"{prefix}.{k}" in rows])
                  for name, keys in PERCENTILES]
        groups = [(name, rs) for name, rs in groups if rs]
        notes: list[str] = []
        values = [p.value for _, rs in groups for r in rs for e in r.cells.values() if (p := point(e))]
        if not values:
            charts.append(Chart(f"percentiles-{prefix}", title, None, (f"no latency value in {prefix}",)))
            continue
        factor, unit = _time_scale(values)
        fig = make_subplots(rows=1, cols=len(groups), subplot_titles=[g for g, _ in groups], horizontal_spacing=0.07)
        for i, (_, rs) in enumerate(groups, start=1):
            for v in c.variants:
                pts = [point(r.cells.get(v)) if c.status.get(v) == "ok" else None for r in rs]
                if c.status.get(v) != "ok":
                    notes.append(f"skipped {v}: {why_missing(c, rs[0], v)}")
                    continue
                notes += [f"skipped {v} on {r.label}: {why_missing(c, r, v)}" for r, p in zip(rs, pts) if p is None]
                if all(p is None for p in pts):
                    continue
                fig.add_trace(go.Bar(
                    x=[r.key.rpartition(".")[2].split("_")[-1] for r in rs],
                    y=[p.value * factor if p else None for p in pts], error_y=_error(pts, factor), name=v,
                    legendgroup=v, showlegend=i == 1, marker_color=col[v],
                    hovertext=[f"{v} {r.label}: {fmt_value(p.value, 's') if p else '—'}" for r, p in zip(rs, pts)],
                    hoverinfo="text"), row=1, col=i)
            fig.update_yaxes(title_text=unit if i == 1 else None, rangemode="tozero", row=1, col=i)
        _layout(fig, title, barmode="group", legend_title_text="variant")
        charts.append(Chart(f"percentiles-{prefix}", title, fig, tuple(dict.fromkeys(notes))))
    return charts


# ------------------------------------------------------------------ (c) throughput against batch size

def throughput_chart(c: Comparison, scenarios: Sequence[dict], samples: int | None = None) -> Chart:
    import plotly.graph_objects as go
    title = "Output throughput against batch size"
    rows = _rows_by_key(c)
    offline = [s for s in scenarios if _role(s) == "throughput" and f"{_scenario_name(s)}.output_throughput" in rows]
    if not offline:
        return Chart("throughput", title, None, ("no offline scenario in this run: no throughput at a batch size",))
    # (batch size, row, what the point is)
    sources = [(1, rows[f"{_scenario_name(s)}.output_throughput"], f"{_scenario_name(s)}: one request at a time")
               for s in scenarios if _declares(s, "one_at_a_time")
               and f"{_scenario_name(s)}.output_throughput" in rows]
    notes = []
    for s in offline:
        size = int(s.get("batch_size") or 1)
        batch = min(size, samples) if samples else size
        what = f"{_scenario_name(s)}: batches of {batch}"
        if batch != size:
            what += f" (batch_size {size}, dataset of {samples})"
            notes.append(f"{_scenario_name(s)}: batch_size {size} but the dataset has {samples} samples: "
                         f"plotted at {batch}, the batch it ran")
        sources.append((batch, rows[f"{_scenario_name(s)}.output_throughput"], what))
    sources.sort(key=lambda t: t[0])
    col = colours(c)
    fig = go.Figure()
    for v in c.variants:
        if c.status.get(v) != "ok":
            notes.append(f"skipped {v}: {why_missing(c, sources[0][1], v)}")
            continue
        pts = [(b, point(r.cells.get(v)), r, what) for b, r, what in sources]
        notes += [f"skipped {v} on {r.label} [{what}]: {why_missing(c, r, v)}" for b, p, r, what in pts if p is None]
        pts = [t for t in pts if t[1] is not None]
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[b for b, *_ in pts], y=[p.value for _, p, *_ in pts], error_y=_error([p for _, p, *_ in pts], 1.0),
            mode="lines+markers", name=v, marker={"size": 10, "color": col[v]}, line={"color": col[v]},
            hovertext=[f"{v} · {what}: {fmt_value(p.value, r.unit)}" for _, p, r, what in pts], hoverinfo="text"))
    sizes = sorted({b for b, *_ in sources})
    if any(_declares(s, "one_at_a_time") for s in scenarios) and 1 in sizes:
        notes.append("batch 1 is the single-stream scenario (one request at a time)")
    _layout(fig, title, xaxis={"title": {"text": "batch size (requests decoded together)"}, "tickvals": sizes,
                               "type": "log" if len(sizes) > 2 and sizes[-1] / sizes[0] >= 8 else "linear"},
            yaxis={"title": {"text": "output throughput (tok/s, higher is better)"}, "rangemode": "tozero"},
            legend_title_text="variant")
    return Chart("throughput", title, fig, tuple(dict.fromkeys(notes)))


# ------------------------------------------------------------------ (d) latency against sequence length

_LENGTH_KEY = re.compile(r"^(?P<scenario>.+)\.(?P<phase>prefill|decode)_(?P<n>\d+)$")


def length_chart(c: Comparison, attention: Mapping[str, str] | None = None) -> Chart:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    title = "Latency against prompt length, per attention kind"
    found: dict[tuple[str, str], list[tuple[int, Row]]] = {}
    for r in c.rows:
        m = _LENGTH_KEY.match(r.key)
        if m:
            found.setdefault((m["scenario"], m["phase"]), []).append((int(m["n"]), r))
    if not found:
        return Chart("length", title, None, ("no length sweep in this run",))
    attention = dict(attention or {})
    kinds = list(dict.fromkeys(attention.get(v) or "model's own" for v in c.variants))
    dash = {k: DASHES[i % len(DASHES)] for i, k in enumerate(kinds)}
    phases = [p for p in ("prefill", "decode") if any(ph == p for _, ph in found)]
    subtitles = {"prefill": "prefill (whole prompt)", "decode": "decode, per token"}
    fig = make_subplots(rows=1, cols=len(phases), subplot_titles=[subtitles[p] for p in phases],
                        horizontal_spacing=0.09)
    col = colours(c)
    notes, lengths, values = [], set(), []
    for (scenario, phase), series in found.items():
        series.sort(key=lambda t: t[0])
        values += [p.value for _, r in series for e in r.cells.values() if (p := point(e))]
    factor, unit = _time_scale(values)
    for (scenario, phase), series in found.items():
        i = phases.index(phase) + 1
        for v in c.variants:
            if c.status.get(v) != "ok":
                notes.append(f"skipped {v}: {why_missing(c, series[0][1], v)}")
                continue
            pts = [(n, point(r.cells.get(v)), r) for n, r in series]
            notes += [f"skipped {v} on {r.label} [{scenario}]: {why_missing(c, r, v)}" for n, p, r in pts if p is None]
            pts = [t for t in pts if t[1] is not None]
            if not pts:
                continue
            kind = attention.get(v) or "model's own"
            lengths.update(n for n, *_ in pts)
            name = f"{v} ({kind})" + (f" [{scenario}]" if len({s for s, _ in found}) > 1 else "")
            fig.add_trace(go.Scatter(
                x=[n for n, *_ in pts], y=[p.value * factor for _, p, _ in pts],
                error_y=_error([p for _, p, _ in pts], factor), mode="lines+markers", name=name,
                legendgroup=name, showlegend=i == 1 or "prefill" not in phases, legendgrouptitle_text=None,
                line={"color": col[v], "dash": dash[kind]}, marker={"size": 9, "color": col[v]},
                hovertext=[f"{name} @{n} tokens: {fmt_value(p.value, 's')}" for n, p, _ in pts], hoverinfo="text"),
                row=1, col=i)
    ticks = sorted(lengths)
    log = len(ticks) > 1 and ticks[-1] / max(ticks[0], 1) >= 8
    for i in range(1, len(phases) + 1):
        fig.update_xaxes(title_text="prompt tokens", type="log" if log else "linear", tickvals=ticks, row=1, col=i)
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=i)
    notes.append("attention kinds: " + ", ".join(f"{k} ({dash[k]} line)" for k in kinds))
    _layout(fig, title, legend_title_text="variant (attention)")
    return Chart("length", title, fig, tuple(dict.fromkeys(notes)))


# ------------------------------------------------------------------ (e) explain: per category

def explain_chart(explanations: Sequence[dict]) -> Chart:
    import plotly.graph_objects as go
    title = "Where the time went: B − A per operator category (explain)"
    if not explanations:
        return Chart("explain", title, None, ("no explanation in this run's folder (`variantlab explain RUN A B` "
                                              "or `explain: true` writes one)",))
    bars: list[str] = []
    by_category: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    notes = []
    for e in explanations:
        a, b = e.get("a", "A"), e.get("b", "B")
        for p in e.get("phases") or ():
            bar = f"{b} vs {a}<br>{p.get('scenario')} · {p.get('phase')}"
            bars.append(bar)
            if _finite(p.get("difference_s_per_token")):
                totals[bar] = p["difference_s_per_token"] * 1e3
            for cat in p.get("categories") or ():
                d = cat.get("difference")
                if _finite(d):
                    by_category.setdefault(cat.get("category", "?"), {})[bar] = d * 1e3
                else:
                    notes.append(f"skipped {cat.get('category')} in {b} vs {a} {p.get('scenario')} · "
                                 f"{p.get('phase')}: no finite difference")
    if not bars:
        return Chart("explain", title, None, ("the explanations in this run's folder hold no phase",))
    fig = go.Figure()
    for i, (cat, ys) in enumerate(by_category.items()):
        fig.add_trace(go.Bar(x=bars, y=[ys.get(bar) for bar in bars], name=cat, marker_color=PALETTE[i % len(PALETTE)],
                             hovertemplate=f"{cat}: %{{y:+.3f}} ms/token<extra></extra>"))
    if totals:
        fig.add_trace(go.Scatter(x=list(totals), y=list(totals.values()), mode="markers", name="total B − A",
                                 marker={"symbol": "line-ew-open", "size": 34, "color": "#111",
                                         "line": {"width": 3, "color": "#111"}},
                                 hovertemplate="total: %{y:+.3f} ms/token<extra></extra>"))
    _layout(fig, title, barmode="relative", yaxis_title="B − A (ms/token; above 0: B is slower)",
            legend_title_text="category")
    return Chart("explain", title, fig, tuple(dict.fromkeys(notes)))


def all_charts(c: Comparison, *, scenarios: Sequence[dict] = (), samples: int | None = None,
               attention: Mapping[str, str] | None = None, explanations: Sequence[dict] = (),
               front: Sequence[str] | None = None, pick: str | None = None,
               front_over: Sequence[str] = ()) -> list[Chart]:
    """Every chart of the page, in order; those the run lacks data for have no figure and say why."""
    return [tradeoff_chart(c, scenarios, front, pick, front_over), *percentile_charts(c),
            throughput_chart(c, scenarios, samples),
            length_chart(c, attention), explain_chart(explanations)]
