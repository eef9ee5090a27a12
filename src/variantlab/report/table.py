"""The comparison for the terminal: one column per variant holding its value and its delta, within
100 columns.

By default the table shows the analysis's headline figures (accuracy retention, KLD, single-task
latency, TTFT and TPOT p50, output throughput, peak memory, cold start, size); `--all` shows every
row. Each variant's cell is its value, and below it (for every variant but the baseline) its delta;
only a significant delta of at least 1% is coloured — green when the variant is better, red when
worse — a non-significant one is dim and says "n.s.", a significant one under 1% is dim, and a
fact's percent change (or a delta with no verdict: one round, a single sample) is plain, and a delta
withheld between figures that measure different things (perplexities over texts two tokenizers split
differently) reads "not comparable". A value that cannot be given shows a short reason, or a
numbered note printed under the table when the reason is long. Intervals are in report.md. When
the variants do not fit in 100 columns they are split over several tables, each repeating the
baseline.
"""
from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..measure.analysis import Comparison, Row
from .format import column_name, fmt_delta, fmt_estimate, verdict, visible_rows

WIDTH = 100
SHORT_PROBLEM = 18          # a reason this long or shorter stays in its cell
_STYLE = {"better": "green", "worse": "red", "same": "dim", "negligible": "dim"}
_METRIC_WIDTH = 30
_GAP = 2                    # column separator and padding of the SIMPLE_HEAD box


def problem_notes(c: Comparison, rows: list[Row]) -> dict[tuple[str, str], int]:
    """(row key, variant) → note number, for every long reason a cell of `rows` shows."""
    notes: dict[tuple[str, str], int] = {}
    for r in rows:
        for v in c.variants:
            e = r.cells.get(v)
            if c.status.get(v) == "ok" and e is not None and e.value is None and e.problem \
                    and len(e.problem) > SHORT_PROBLEM:
                notes[(r.key, v)] = len(notes) + 1
    return notes


def note_lines(c: Comparison, all_rows: bool = False) -> list[str]:
    """The numbered notes under the table: "(1) bf16, KLD mean (vs baseline): not comparable: …"."""
    rows = visible_rows(c, headline_only=not all_rows)
    by_key = {r.key: r for r in rows}
    return [f"({n}) {v}, {by_key[key].label}: {by_key[key].cells[v].problem}"
            for (key, v), n in problem_notes(c, rows).items()]


def _cell(c: Comparison, row: Row, v: str, notes: dict) -> str:
    if c.status.get(v) != "ok":
        return escape(c.status.get(v) or "—")
    e = row.cells.get(v)
    if (row.key, v) in notes:
        text = f"see ({notes[(row.key, v)]})"
    else:
        text = escape(fmt_estimate(e, with_ci=False, check_stability=row.checks_stability))
    if v == c.baseline:
        return text
    d = row.deltas.get(v)
    if d is None or (d.pct is None and fmt_delta(d) == "—"):   # a withheld delta says why: "not comparable"
        return text
    delta = escape(fmt_delta(d, with_ci=False))
    style = _STYLE.get(verdict(row, v) or "")
    return text + "\n" + (f"[{style}]{delta}[/{style}]" if style else delta)


def _width(c: Comparison, rows: list[Row], v: str, notes: dict) -> int:
    title = cell_len(v) + (11 if v == c.baseline else 0)
    lines = [cell_len(line) for r in rows for line in Text.from_markup(_cell(c, r, v, notes)).plain.splitlines()]
    return max([title, *lines]) + _GAP


def _groups(c: Comparison, rows: list[Row], width: int, notes: dict) -> tuple[list[list[str]], int]:
    """The non-baseline variants packed into tables that fit `width` beside Metric and the baseline;
    and the widest a variant column may be (a longer name folds)."""
    base = min(_width(c, rows, c.baseline, notes), (width - _METRIC_WIDTH - _GAP) // 2)
    room = width - _METRIC_WIDTH - base - 2 * _GAP   # the rule and the edges
    groups: list[list[str]] = [[]]
    used = 0
    for v in c.variants:
        if v == c.baseline:
            continue
        w = min(_width(c, rows, v, notes), room)
        if groups[-1] and used + w > room:
            groups.append([])
            used = 0
        groups[-1].append(v)
        used += w
    return groups, room


def comparison_tables(c: Comparison, title: str | None = None, all_rows: bool = False,
                      width: int = WIDTH) -> list[Table]:
    rows = visible_rows(c, headline_only=not all_rows)
    notes = problem_notes(c, rows)
    groups, room = _groups(c, rows, width, notes)
    tables = []
    for k, group in enumerate(groups):
        part = f" ({k + 1}/{len(groups)})" if len(groups) > 1 else ""
        t = Table(title=(title or "") + part if title else None, header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False, width=None)
        t.add_column("Metric", justify="left", max_width=_METRIC_WIDTH, overflow="fold")
        columns = ([c.baseline] if c.baseline in c.variants else []) + group
        for v in columns:
            t.add_column(escape(column_name(c, v)), justify="right", overflow="fold",
                         max_width=room - _GAP)
        for r in rows:
            t.add_row(escape(r.label), *(_cell(c, r, v, notes) for v in columns))
        tables.append(t)
    return tables
