"""The comparison as a rich table for the terminal.

Cells show medians (intervals are in report.md); a significant delta is green when the variant
is better and red when it is worse; a non-significant one is dim.
"""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..measure.analysis import Comparison, Row
from .format import delta_columns, header, row_cells, visible_rows


def _delta_style(row: Row, variant: str) -> str | None:
    d = row.deltas.get(variant)
    if d is None or d.pct is None or row.lower_is_better is None:
        return None
    if d.significant is False:
        return "dim"
    if d.significant is None and d.low is None and row.unit in ("s", "tok/s"):
        return None
    better = (d.pct < 0) == row.lower_is_better
    return "green" if better else "red"


def comparison_table(c: Comparison, title: str | None = None) -> Table:
    t = Table(title=title, header_style="bold")
    for i, col in enumerate(header(c)):
        t.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    n_values = 1 + len(c.variants)
    for r in visible_rows(c):
        cells = [escape(x) for x in row_cells(c, r, with_ci=False)]
        for k, v in enumerate(delta_columns(c)):
            style = _delta_style(r, v)
            if style and cells[n_values + k] != "—":
                cells[n_values + k] = f"[{style}]{cells[n_values + k]}[/{style}]"
        t.add_row(*cells)
    return t
