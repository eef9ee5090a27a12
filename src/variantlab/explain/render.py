"""An explanation in words and tables: blocks that the terminal (rich) and Markdown both render.

Per workload and phase: the headline ("decode: +1.34 ms/token (+189%); 59% of it in
quantize/dequantize/pack (aten::mul 40 → 96 calls a token)"), how many of the largest categories
account for 90% of it, the category table, each variant on its roofline, the run's own figures for
the same workload, the profiler's cost, and hardware counters or why there are none. With `ops`,
the operators that moved most.
"""
from __future__ import annotations

from dataclasses import dataclass

from .attribution import ACCOUNT_FOR, PhaseAttribution
from .categories import DESCRIPTIONS

OPS_SHOWN = 15


@dataclass(frozen=True)
class Text:
    text: str
    heading: int = 0          # 0: a paragraph; 1, 2: a heading level


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _signed_ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.3f}"


def _calls(calls: tuple[float, float] | None) -> str:
    if not calls:
        return ""
    a, b = (_count(c) for c in calls)
    return f"{a} → {b} calls a token" if a != b else f"{b} calls a token"


def _count(c: float) -> str:
    """Calls a token: whole numbers as they are, fractions (batched prefill: one call covers many tokens) to 2 digits."""
    return f"{c:.0f}" if c >= 10 or c == int(c) else f"{c:.2g}"


def headline(p: PhaseAttribution, a: str, b: str) -> str:
    pct = f" ({p.diff / p.a.total:+.0%})" if p.a.total > 0 else ""
    text = (f"{p.scenario} · {p.phase}: {b} {_ms(p.b.total)} ms/token against {a} {_ms(p.a.total)}: "
            f"{_signed_ms(p.diff)} ms/token{pct}")
    if p.near_zero or not p.rows:
        return text + "; within the noise, nothing to attribute"
    top = p.rows[0]
    where = f" ({top.top_op}: {_calls(top.top_op_calls)})" if top.top_op else ""
    return text + f"; {top.share:.0%} of it in {top.category}{where}"


def phase_blocks(p: PhaseAttribution, e, ops: bool) -> list:
    a, b = e.a, e.b
    blocks: list = [Text(headline(p, a, b), heading=2)]
    if not p.near_zero:
        k, share = p.accounted()
        blocks.append(Text(f"The {k} largest categor{'y accounts' if k == 1 else 'ies account'} for {share:.0%} of "
                           f"the difference (listed until {ACCOUNT_FOR:.0%})."))
    blocks.append(Table(("category", f"{a} ms/token", f"{b} ms/token", "difference", "share", "moved most"),
                        tuple((r.category, _ms(r.a), _ms(r.b), _signed_ms(r.diff),
                               "—" if r.share is None else f"{r.share:.0%}",
                               f"{r.top_op} ({_calls(r.top_op_calls)})" if r.top_op else "")
                              for r in p.rows)))
    for note in p.notes:
        blocks.append(Text(f"Note: {note}."))
    for r in e.rooflines:
        if r.scenario == p.scenario and r.phase == p.phase:
            where = r.problem if r.place is None else r.place.line()
            blocks.append(Text(f"Roofline, {r.variant}: {r.cost.bytes / 2**20:.2f} MiB and "
                               f"{r.cost.flops / 1e6:.1f} MFLOP a token; {where}."))
    for line in e.measured.get(f"{p.scenario}/{p.phase}", ()):
        blocks.append(Text(f"The run measured (no profiler) {line}."))
    for name, t in ((a, p.a), (b, p.b)):
        if t.disturbance > 0.10:
            blocks.append(Text(f"{name}'s median plain run was {t.disturbance:.0%} slower than its fastest of "
                               f"{t.runs}: other load on the machine; the fastest is used."))
    cost = {n: e.profiler_cost.get(n, {}).get(f"{p.scenario}/{p.phase}") for n in (a, b)}
    if all(c is not None for c in cost.values()):
        blocks.append(Text("Plain runs timed the phase; the profiled run took "
                           + ", ".join(f"{c:+.0%} ({n})" for n, c in cost.items())
                           + " longer (the profiler's own cost, not attributed)."))
    if ops:
        shown = p.ops[:OPS_SHOWN]
        blocks.append(Table(("operator", "category", f"{a} µs/token", f"{b} µs/token", "difference", "calls a token"),
                            tuple((o.name, o.category, f"{o.a.seconds * 1e6:.1f}", f"{o.b.seconds * 1e6:.1f}",
                                   f"{o.diff * 1e6:+.1f}", f"{_count(o.a.calls)} → {_count(o.b.calls)}")
                                  for o in shown)))
        if len(p.ops) > len(shown):
            blocks.append(Text(f"({len(p.ops) - len(shown)} more operators in explanation.json)"))
    return blocks


def explanation_blocks(e, ops: bool = False) -> list:
    run = f" (run {e.run_id})" if e.run_id else ""
    blocks: list = [Text(f"Why {e.b} differs from {e.a}{run}", heading=1),
                    Text(f"Profiled in fresh workers apart from the timed run: {e.rounds[e.a]} round(s) of {e.a}, "
                         f"{e.rounds[e.b]} of {e.b}, interleaved. Times are per token; a category is the self time "
                         "of its operators under the profiler, framework overhead the rest of the plain phase.")]
    for w in e.warnings:
        blocks.append(Text(f"Warning: {w}."))
    for name in (e.a, e.b):
        blocks.append(Text(f"Kernels, {name}: " + ("; ".join(e.kernels.get(name, ())) or "—")))
    for p in e.phases:
        blocks += phase_blocks(p, e, ops)
    blocks.append(Text("Hardware counters", heading=2))
    for name in (e.a, e.b):
        for scenario, c in e.counters.get(name, {}).items():
            if c["reason"]:
                blocks.append(Text(f"{name}, {scenario}: unavailable: {c['reason']}."))
            else:
                blocks.append(Text(f"{name}, {scenario}: " + ", ".join(f"{k.split(':')[0]} {v:,.0f} a token"
                                                                        for k, v in c["per_token"].items())))
    blocks.append(Text("Categories: " + "; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()) + "."))
    return blocks


def explanation_markdown(e, ops: bool = False, base_level: int = 1) -> str:
    """Markdown of an explanation; its title is a heading of `base_level` (1: "#"), its phases one below."""
    out: list[str] = []
    for blk in explanation_blocks(e, ops):
        if isinstance(blk, Table):
            out.append("| " + " | ".join(blk.headers) + " |")
            out.append("|" + "---|" * len(blk.headers))
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in blk.rows]
            out.append("")
        elif blk.heading:
            out += ["#" * (blk.heading + base_level - 1) + " " + blk.text, ""]
        else:
            out += [blk.text, ""]
    return "\n".join(out)
