"""Formatting numbers for people: one place that knows each unit.

Every report (terminal, Markdown, HTML) formats through these functions so the same value reads
the same everywhere.
"""
from __future__ import annotations

from ..measure.analysis import Comparison, Row
from ..measure.stats import Delta, Estimate


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        if abs(value) < 1e-3:
            return f"{value * 1e6:.0f} µs"
        if abs(value) < 1:
            return f"{value * 1e3:.2f} ms"
        if abs(value) < 120:
            return f"{value:.2f} s"
        return f"{value / 60:.1f} min"
    if unit == "B":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {name}"
        return f"{value:.0f} B"
    if unit == "tok/s":
        return f"{value:,.1f} tok/s"
    if unit == "%":
        return f"{value:.2f}%"
    if unit == "ratio":
        return f"{value:.4f}"
    if unit == "rel":
        return f"{value:.2e}"
    if unit == "nats":
        return f"{value:.3g}"
    if unit == "bits":
        return f"{value:.3g}"
    return f"{value:.4g}"


def fmt_estimate(e: Estimate | None, with_ci: bool = True, check_stability: bool = True) -> str:
    if e is None or e.value is None:
        return "—"
    text = fmt_value(e.value, e.unit)
    if with_ci and e.low is not None and e.high is not None and e.low != e.high:
        text += f" [{fmt_value(e.low, e.unit)}, {fmt_value(e.high, e.unit)}]"
    if check_stability and e.unstable:
        text += " ⚠"
    return text


def fmt_delta(d: Delta | None) -> str:
    return "—" if d is None or d.pct is None else d.label()


def visible_rows(c: Comparison) -> list[Row]:
    """Rows with a value for some variant, or a note (a compile row without compiled variants is left out)."""
    return [r for r in c.rows if r.note or any(e is not None and e.value is not None for e in r.cells.values())
            or all(c.status.get(v) != "ok" for v in c.variants)]


def delta_columns(c: Comparison) -> list[str]:
    """One Delta column per non-baseline variant."""
    return [v for v in c.variants if v != c.baseline]


def header(c: Comparison) -> list[str]:
    cols = ["Metric"] + [f"{v} (baseline)" if v == c.baseline else v for v in c.variants]
    others = delta_columns(c)
    cols += ["Delta" if len(others) == 1 else f"Δ {v}" for v in others]
    return cols


def row_cells(c: Comparison, row: Row, with_ci: bool = True) -> list[str]:
    cells = [row.label]
    for v in c.variants:
        status = c.status.get(v)
        cells.append(fmt_estimate(row.cells.get(v), with_ci, row.checks_stability) if status == "ok"
                     else status or "—")
    cells += [fmt_delta(row.deltas.get(v)) for v in delta_columns(c)]
    return cells


def status_lines(c: Comparison) -> list[str]:
    """Failed and unsupported variants with their reasons, then warnings and notes."""
    lines = [f"{v}: {c.status[v]} — {c.reasons.get(v) or 'no reason given'}"
             for v in c.variants if c.status.get(v) != "ok"]
    toks = {t for t in c.tokenizers.values() if t}
    lines.append("token counts use tokenizer " + ", ".join(
        f"{v}={c.tokenizers[v]}" for v in c.variants if c.tokenizers.get(v)) if len(toks) > 1 else
        f"token counts use tokenizer {next(iter(toks))} (all variants)" if toks else "no variant ran")
    for v, b in c.builds.items():
        attention = b.get("attention")
        lines.append(f"{v}: {b['recipe']}" + (f" + attention {attention}" if attention not in (None, "model's own") else "")
                     + f" on {b['device']}" + (f", built in {b['build_s']:.1f} s" if b.get("build_s") else "")
                     + f"; kernels: {', '.join(b['kernels']) or 'n/a'}")
        lines += [f"  note: {note}" for note in b.get("notes", ())]
    lines += [f"warning: {w}" for w in c.warnings]
    lines += [f"note: {r.label}: {r.note}" for r in c.rows if r.note]
    return lines
