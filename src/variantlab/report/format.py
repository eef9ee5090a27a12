"""Formatting numbers for people: one place that knows each unit, each verdict and the status lines.

Every report (terminal, Markdown, CSV, HTML) formats through these functions so that the same
value reads the same everywhere.
"""
from __future__ import annotations

from ..measure.analysis import NOT_COMPARABLE, Comparison, Row
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
    if unit == "req/s":
        return f"{value:,.2f} req/s"
    if unit == "GB/s":
        return f"{value:,.1f} GB/s"
    if unit == "%":
        return f"{value:.2f}%"
    if unit == "ratio":
        return f"{value:.4f}"
    if unit == "rel":
        return f"{value:.2e}"
    if unit in ("nats", "bits"):
        return f"{value:.3g}"
    return f"{value:.4g}"


def fmt_estimate(e: Estimate | None, with_ci: bool = True, check_stability: bool = True) -> str:
    """"1.23 ms [1.20 ms, 1.27 ms]"; a problem reads as its words; ⚠ marks an unstable measurement."""
    if e is None:
        return "—"
    if e.value is None:
        return e.problem or "—"
    text = fmt_value(e.value, e.unit)
    if with_ci and e.low is not None and e.high is not None and e.low != e.high:
        text += f" [{fmt_value(e.low, e.unit)}, {fmt_value(e.high, e.unit)}]"
    elif with_ci and e.problem:
        text += f" ({e.problem})"
    if check_stability and e.unstable:
        text += " ⚠"
    return text


def fmt_delta(d: Delta | None, with_ci: bool = True) -> str:
    """"+5.1% [+2.0, +8.3]", "+0.4% (n.s.)", or the bare percent of a fact; "—" when there is none. A delta
    withheld because the two figures are not comparable says so: its reason in full, or (not with_ci) its
    first words, "not comparable"."""
    if d is not None and d.pct is None and d.method == NOT_COMPARABLE and d.problem:
        return d.problem if with_ci else NOT_COMPARABLE
    if d is None or d.pct is None:
        return "—"
    if with_ci:
        return d.label()
    text = f"{d.pct:+.1f}%"
    if d.significant is False:
        text += " n.s."
    elif d.problem:
        text += " ?"
    return text


MIN_EFFECT_PCT = 1.0
"""A significant change smaller than this is reported as negligible, not better or worse (pyperf's rule)."""


def verdict(row: Row, variant: str) -> str | None:
    """"better" or "worse" (significant, at least MIN_EFFECT_PCT), "negligible" (significant, smaller),
    "same" (not significant) or None (no verdict: a fact, a single sample, one round, no direction)."""
    d = row.deltas.get(variant)
    if d is None or d.pct is None or row.lower_is_better is None or d.significant is None:
        return None
    if not d.significant:
        return "same"
    if abs(d.pct) < MIN_EFFECT_PCT:
        return "negligible"
    return "better" if (d.pct < 0) == row.lower_is_better else "worse"


def visible_rows(c: Comparison, headline_only: bool = False) -> list[Row]:
    """Rows with a value or a problem for some variant; headline_only: the default table's rows, in order."""
    rows = [r for r in c.rows if any(e is not None and (e.value is not None or e.problem) for e in r.cells.values())]
    if headline_only:
        rows = sorted((r for r in rows if r.headline is not None), key=lambda r: (r.headline, r.key))
    return rows


def delta_columns(c: Comparison) -> list[str]:
    """One Delta column per non-baseline variant."""
    return [v for v in c.variants if v != c.baseline]


def column_name(c: Comparison, v: str) -> str:
    """A variant's column heading: its name, "(baseline)", and its runtime when the table mixes runtimes."""
    runtimes = {v: b.runtime for v, b in c.builds.items() if b.runtime}
    mixed = len(set(runtimes.values())) > 1
    return v + (" (baseline)" if v == c.baseline else "") + (f" [{runtimes[v]}]" if mixed and v in runtimes else "")


def header(c: Comparison) -> list[str]:
    cols = ["Metric"] + [column_name(c, v) for v in c.variants]
    others = delta_columns(c)
    cols += ["Delta" if len(others) == 1 else f"Δ {v}" for v in others]
    return cols


def row_cells(c: Comparison, row: Row, with_ci: bool = True) -> list[str]:
    cells = [row.label]
    for v in c.variants:
        status = c.status.get(v)
        cells.append(fmt_estimate(row.cells.get(v), with_ci, row.checks_stability) if status == "ok"
                     else status or "—")
    cells += [fmt_delta(row.deltas.get(v), with_ci) for v in delta_columns(c)]
    return cells


def rounds_line(c: Comparison) -> str:
    """How many rounds each variant was measured in."""
    parts = []
    for v in c.variants:
        r = c.rounds.get(v) or {}
        if c.status.get(v) == "ok":
            parts.append(f"{v} {r.get('ok', 0)}" + (f" (+{r['failed']} failed)" if r.get("failed") else ""))
    return "rounds measured: " + ", ".join(parts) if parts else "no variant was measured"


def noise_line(c: Comparison, rows: list[Row]) -> str | None:
    """The machine's noise: the baseline's round-to-round coefficient of variation on the timing rows shown."""
    noisy = [f"{r.label} {100 * r.noise:.1f}%" for r in rows if r.noise is not None]
    if not noisy:
        return None
    return f"noise: {c.baseline} varied from round to round by " + ", ".join(noisy)


UNSTABLE_LEGEND = ("⚠: the figure varied over 10% from round to round (across its samples, with one round); "
                   "its warning below says by how much")


def unstable_shown(c: Comparison, rows: list[Row]) -> bool:
    """Whether some cell of `rows` carries the ⚠ mark (fmt_estimate's rule), so that its legend is due."""
    return any(r.checks_stability and c.status.get(v) == "ok" and e is not None and e.value is not None
               and e.unstable for r in rows for v, e in r.cells.items())


def status_lines(c: Comparison, rows: list[Row] | None = None, full: bool = True) -> list[str]:
    """Each variant without figures, with its status and reason (failed or unsupported; or not measured:
    the run was interrupted before it, or ended before it), the rounds, the noise, the ⚠ mark's legend when
    a row shown carries it, where artifacts came from (reused or rebuilt, and why), then (full) builds,
    warnings and notes."""
    rows = visible_rows(c) if rows is None else rows
    lines = [f"{v}: {c.status[v]} — {c.reasons.get(v) or 'no reason given'}"
             for v in c.variants if c.status.get(v) != "ok"]
    lines.append(rounds_line(c))
    noise = noise_line(c, rows)
    if noise:
        lines.append(noise)
    if unstable_shown(c, rows):
        lines.append(UNSTABLE_LEGEND)
    lines += [f"{v}: {b.artifact}" for v, b in c.builds.items() if b.artifact]
    if full:
        for v, b in c.builds.items():
            if c.status.get(v) != "ok":
                continue
            attention = b.attention
            lines.append(f"{v}: {b.recipe}" + (f" + attention {attention}"
                                               if attention not in (None, "model's own") else "")
                         + (f" on {b.device}" if b.device else "")
                         + (" (artifact reused)" if b.reused else
                            f", built in {b.build_s:.1f} s" if b.build_s else "")
                         + f"; kernels: {', '.join(b.kernels) or 'n/a'}")
            lines += [f"  note: {note}" for note in b.notes]
            if "artifact" not in b.model_fields_set:   # a comparison stored before the artifact line
                lines += [f"  artifact not reused: {why}" for why in b.not_reused]
    lines += [f"note: {r.label}: {r.note}" for r in rows if r.note]
    lines += [f"warning: {w}" for w in (*c.warnings, *(w for r in rows for w in r.warnings))]
    return lines
