"""The comparison as a Markdown report (report.md)."""
from __future__ import annotations

from ..measure.analysis import Comparison
from .format import header, row_cells, status_lines, visible_rows


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def comparison_markdown(c: Comparison) -> str:
    cols = header(c)
    lines = [_md_row(cols), "|" + "---|" * len(cols)]
    lines += [_md_row(row_cells(c, r)) for r in visible_rows(c)]
    return "\n".join(lines)


def report_markdown(result) -> str:
    c = result.comparison
    env = result.environment
    parts = [
        f"# variantlab bench: {result.suite_name}",
        "",
        f"Run `{result.run_id}` on {env.get('cpu_model')} ({env.get('cpu_count')} cores), "
        f"torch {env.get('packages', {}).get('torch')}, transformers {env.get('packages', {}).get('transformers')}.",
        "",
        comparison_markdown(c),
        "",
        "Values are medians with 95% bootstrap confidence intervals in brackets; Delta is "
        "(variant − baseline) / baseline with its interval; (n.s.) marks a difference the intervals "
        "do not support; ⚠ marks a measurement whose coefficient of variation exceeds 10%.",
        "",
    ]
    parts += [f"- {line}" for line in status_lines(c)]
    return "\n".join(parts) + "\n"
