"""The comparison as a Markdown report (report.md): every row, with intervals and verdicts."""
from __future__ import annotations

from ..measure.analysis import Comparison
from .format import header, row_cells, status_lines, visible_rows


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def comparison_markdown(c: Comparison, all_rows: bool = True) -> str:
    cols = header(c)
    lines = [_md_row(cols), "|" + "---|" * len(cols)]
    lines += [_md_row(row_cells(c, r)) for r in visible_rows(c, headline_only=not all_rows)]
    return "\n".join(lines)


def report_markdown(result) -> str:
    c = result.comparison
    env = result.environment
    parts = [
        f"# variantlab bench: {result.suite_name}",
        "",
        f"Run `{result.run_id}` on {env.cpu_model} ({env.cpu_count} cores, "
        f"{env.threads_per_worker} threads per worker), {env.rounds} rounds, "
        f"torch {env.packages.get('torch')}, transformers {env.packages.get('transformers')}.",
        "",
        comparison_markdown(c),
        "",
        "Values are over all rounds, with 95% intervals in brackets: the hull of a hierarchical bootstrap "
        "(rounds, then requests within a round) and a t-interval over the per-round figures; quantiles are "
        "bounded by order statistics too, and say so when the requests are too few. Delta is (variant − "
        "baseline) / baseline: for timings and per-process figures, the geometric mean of per-round paired "
        "ratios with a t-interval over rounds (so drift a round shares cancels); (n.s.) marks a difference "
        "the interval does not support, and a significant one under 1% is negligible. With one round, "
        "requests are bootstrapped for an interval but drift is not controlled, so there is no verdict; a "
        "single sample gets none either. A fact's delta (size, accuracy on a fixed set) is a plain difference "
        "with no verdict. ⚠ marks a figure that varied over 10% from round to round.",
        "",
    ]
    parts += [f"- {line}" for line in status_lines(c, visible_rows(c))]
    parts += [f"- {name}: recipe auto → {summary}" for name, summary in getattr(result, "resolved", {}).items()]
    recommendation = getattr(result, "recommendation", None)
    if recommendation is not None:
        parts += ["", "## Recommendation", ""] + [f"- {line}" for line in recommendation.lines()]
    explanations = getattr(result, "explanations", ())
    notes = getattr(result, "explain_notes", ())
    if explanations or notes:
        from ..explain.render import explanation_markdown
        parts += ["", "## Why the slower variants are slower (explain: true)", ""]
        parts += [f"- {n}" for n in notes]
        for e in explanations:
            parts += ["", explanation_markdown(e, base_level=3)]
    return "\n".join(parts) + "\n"
