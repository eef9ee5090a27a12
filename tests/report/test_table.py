"""The terminal comparison (report/table.py) and the formatting every report shares (report/format.py),
on hand-built comparisons: within 100 columns, headline rows by default, colour only where a delta
is significant, problems and failures in words."""
from __future__ import annotations

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from variantlab.measure.analysis import Comparison, Row
from variantlab.measure.stats import Delta, Estimate
from variantlab.report.format import (fmt_delta, fmt_estimate, fmt_value, noise_line, rounds_line, status_lines,
                                      verdict, visible_rows)
from variantlab.report.table import WIDTH, comparison_tables, note_lines

P99_PROBLEM = "too few requests for p99 (80 pooled; 368 needed for a 95% interval)"


def est(value, unit="s", *, low=None, high=None, cv=0.01, problem=None) -> Estimate:
    return Estimate(value=value, low=low, high=high, n=1 if value is None else 20, cv=cv, unit=unit,
                    problem=problem)


def sig(pct, significant=True) -> Delta:
    return Delta(pct=pct, low=pct - 1, high=pct + 1, significant=significant, method="paired over 5 rounds",
                 rounds=5)


def fact_delta(pct) -> Delta:
    return Delta(pct=pct, low=None, high=None, significant=None, method="exact")


def row(key, label, unit, lower, kind, cells, deltas=None, **kw) -> Row:
    deltas = {n: None for n in cells} | (deltas or {})
    return Row(key, label, unit, lower, kind, cells, deltas, **kw)


def comparison(names=("fp32", "bf16", "int8"), status=None, reasons=None, extra_rows=(), **kw) -> Comparison:
    """Rows listed out of headline order; fp32 is the baseline."""
    base, *others = names
    every = lambda f: {n: f(i) for i, n in enumerate(names)}   # noqa: E731
    rows = (
        row("facts.model_size", "Model size (weights as stored)", "B", True, "fact",
            every(lambda i: est(4 * 2**20 / (i + 1), "B")), {n: fact_delta(-50.0) for n in others}, headline=9),
        row("single-stream.tpot_p50", "TPOT p50", "s", True, "samples", every(lambda i: est(0.010 + i * 0.001)),
            {others[0]: sig(-20.0), **{n: sig(30.0) for n in others[1:]}}, headline=5, noise=0.03, is_timing=True,
            warnings=("TPOT p50: shown warning",)),
        row("grading.accuracy_retention", "Accuracy retention (vs baseline)", "ratio", False, "versus",
            every(lambda i: est(1.0 - i / 100, "ratio")), headline=1),
        row("offline.output_throughput", "Output throughput", "tok/s", False, "samples",
            every(lambda i: est(1000.0 + 100 * i, "tok/s")),
            {others[0]: sig(10.0), **{n: sig(-2.0, False) for n in others[1:]}}, headline=6),
        row("single-stream.e2el_p99", "E2EL p99", "s", True, "samples",
            every(lambda i: est(None, problem="no samples")), warnings=("E2EL p99: hidden warning",)),
        row("facts.bits_per_weight", "Bits per weight (as stored)", "bits", None, "fact",
            every(lambda i: est(32.0 / (i + 1), "bits")), {n: fact_delta(-50.0) for n in others}),
        row("cold_start.compile", "Cold start: compile", "s", True, "process", every(lambda i: None)),
        row("scoring.kld_mean", "KLD mean (vs baseline)", "nats", True, "versus",
            every(lambda i: est(0.001 * i, "nats")), headline=2),
        *extra_rows,
    )
    return Comparison(base, tuple(names), status or {n: "ok" for n in names}, reasons or {n: None for n in names},
                      rows, **kw)


def render(c: Comparison, **kw) -> list[str]:
    console = Console(width=200, record=True, color_system="truecolor")
    for t in comparison_tables(c, **kw):
        console.print(t)
    return console.export_text().splitlines()


def column(table, header: str) -> list[Text]:
    col = next(col for col in table.columns if col.header == header)
    return [Text.from_markup(cell) for cell in col.cells]


def labels(table) -> list[str]:
    return [Text.from_markup(cell).plain for cell in table.columns[0].cells]


def cell(c: Comparison, key: str, variant: str, **kw) -> Text:
    rows = visible_rows(c, headline_only=not kw.get("all_rows", False))
    header = f"{variant} (baseline)" if variant == c.baseline else variant
    table = next(t for t in comparison_tables(c, **kw) if header in [col.header for col in t.columns])
    return column(table, header)[[r.key for r in rows].index(key)]


def delta_styles(text: Text) -> set[str]:
    """Styles of the spans on the delta line (the second line of a cell)."""
    start = text.plain.index("\n") + 1 if "\n" in text.plain else len(text.plain)
    return {str(s.style) for s in text.spans if s.end > start}


# ---------------------------------------------------------------- width

def test_three_variants_fit_in_100_columns_in_one_table():
    c = comparison()
    assert len(comparison_tables(c)) == 1 and len(comparison_tables(c, all_rows=True)) == 1
    for all_rows in (False, True):
        lines = render(c, all_rows=all_rows)
        assert max(cell_len(line) for line in lines) <= WIDTH
    assert any("fp32 (baseline)" in line and "bf16" in line and "int8" in line for line in render(c))


LONG = ("fp32", *(f"int4-group{g}-gqa2-sliding-4096-{k}" for k, g in enumerate((32, 64, 128, 256, 32, 64))))
LONGEST = ("fp32", *(f"{k}-" + "x" * 62 for k in range(6)))         # the longest names a suite accepts (64)


@pytest.mark.parametrize("all_rows", [False, True])
def test_seven_long_named_variants_split_into_tables_that_fit_each_repeating_the_baseline(all_rows):
    c = comparison(LONG)
    tables = comparison_tables(c, title="bench", all_rows=all_rows)
    assert len(tables) > 1
    seen = []
    for k, t in enumerate(tables):
        headers = [col.header for col in t.columns]
        assert headers[:2] == ["Metric", "fp32 (baseline)"]
        seen += headers[2:]
        assert t.title == f"bench ({k + 1}/{len(tables)})"
    assert seen == list(LONG[1:])                      # each variant once, in order
    lines = render(c, all_rows=all_rows)
    assert max(cell_len(line) for line in lines) <= WIDTH


def test_the_longest_variant_names_still_fit_in_100_columns():
    assert max(cell_len(line) for line in render(comparison(LONGEST))) <= WIDTH


def test_a_long_problem_in_a_headline_row_still_fits_in_100_columns():
    why = ("not comparable: PreTrainedTokenizerFast split the evaluation text differently from the baseline's "
           "LlamaTokenizerFast (fingerprint 0123456789ab vs ba9876543210); compare bits per byte and task accuracy")
    kld = row("scoring.kld_mean", "KLD mean (vs baseline)", "nats", True, "versus",
              {"fp32": est(0.0, "nats"), "bf16": est(None, "nats", problem=why), "int8": est(0.01, "nats")},
              headline=2)
    c = comparison()
    c = Comparison(c.baseline, c.variants, c.status, c.reasons,
                   tuple(r for r in c.rows if r.key != "scoring.kld_mean") + (kld,))
    assert max(cell_len(line) for line in render(c)) <= WIDTH


def test_a_withheld_perplexity_delta_reads_not_comparable_in_every_report():
    why = ("not comparable: Tok split the evaluation text differently from the baseline's Tok (fingerprint b vs "
           "a); compare bits per byte and task accuracy")
    withheld = Delta(None, None, None, None, "not comparable", problem=why)
    ppl = row("scoring.ppl", "Perplexity (eval text)", "ratio", True, "fact",
              {"fp32": est(9.0, "ratio"), "bf16": est(9.3, "ratio"), "int8": est(9.1, "ratio")},
              {"bf16": withheld, "int8": fact_delta(1.1)})
    c = comparison(extra_rows=(ppl,))
    assert cell(c, "scoring.ppl", "bf16", all_rows=True).plain == "9.3000\nnot comparable"
    assert cell(c, "scoring.ppl", "int8", all_rows=True).plain == "9.1000\n+1.1%"     # same split: compared
    assert fmt_delta(withheld) == why and verdict(ppl, "bf16") is None            # report.md and HTML: the reason
    from variantlab.report.markdown import comparison_markdown
    md = next(line for line in comparison_markdown(c).splitlines() if line.startswith("| Perplexity"))
    assert md == f"| Perplexity (eval text) | 9.0000 | 9.3000 | 9.1000 | {why} | +1.1% |"


# ---------------------------------------------------------------- which rows

def test_default_shows_only_headline_rows_in_headline_order():
    (table,) = comparison_tables(comparison())
    assert labels(table) == ["Accuracy retention (vs baseline)", "KLD mean (vs baseline)", "TPOT p50",
                             "Output throughput", "Model size (weights as stored)"]


def test_all_rows_shows_every_row_with_a_value_or_a_problem_in_the_comparisons_order():
    (table,) = comparison_tables(comparison(), all_rows=True)
    assert labels(table) == ["Model size (weights as stored)", "TPOT p50", "Accuracy retention (vs baseline)",
                             "Output throughput", "E2EL p99", "Bits per weight (as stored)",
                             "KLD mean (vs baseline)"]     # not "Cold start: compile": no value, no problem


def test_a_cell_with_a_problem_shows_the_problem():
    c = comparison()
    assert cell(c, "single-stream.e2el_p99", "fp32", all_rows=True).plain == "no samples"
    p99 = row("single-stream.ttft_p99", "TTFT p99", "s", True, "samples",
              {"fp32": est(None, problem=P99_PROBLEM), "bf16": est(None, problem=P99_PROBLEM), "int8": est(0.5)},
              headline=11)
    c = comparison(extra_rows=(p99,))
    assert cell(c, "single-stream.ttft_p99", "fp32").plain == "see (1)"        # a long reason: a numbered note
    assert note_lines(c)[0] == f"(1) fp32, TTFT p99: {P99_PROBLEM}"
    assert cell(c, "single-stream.ttft_p99", "bf16").plain == "see (2)"
    assert cell(c, "single-stream.ttft_p99", "int8").plain == "500.00 ms"


# ---------------------------------------------------------------- colour only where significant

def test_a_significant_improvement_is_green_and_a_regression_red():
    c = comparison()
    faster = cell(c, "single-stream.tpot_p50", "bf16")
    assert faster.plain == "11.00 ms\n-20.0%" and delta_styles(faster) == {"green"}
    slower = cell(c, "single-stream.tpot_p50", "int8")
    assert slower.plain == "12.00 ms\n+30.0%" and delta_styles(slower) == {"red"}
    more = cell(c, "offline.output_throughput", "bf16")           # higher is better here
    assert more.plain.endswith("+10.0%") and delta_styles(more) == {"green"}


def test_a_non_significant_delta_is_dim_and_says_so():
    same = cell(comparison(), "offline.output_throughput", "int8")
    assert same.plain.endswith("-2.0% n.s.") and delta_styles(same) == {"dim"}


def test_a_facts_delta_has_no_colour():
    c = comparison()
    size = cell(c, "facts.model_size", "bf16")
    assert size.plain == "2.00 MiB\n-50.0%" and size.spans == []
    bits = cell(c, "facts.bits_per_weight", "int8", all_rows=True)
    assert bits.plain.endswith("-50.0%") and bits.spans == []


def test_the_baseline_and_versus_rows_carry_no_delta():
    c = comparison()
    assert cell(c, "single-stream.tpot_p50", "fp32").plain == "10.00 ms"
    assert cell(c, "grading.accuracy_retention", "bf16").plain == "0.9900"


def test_rendered_colours_match_the_verdicts():
    console = Console(width=200, record=True, color_system="truecolor")
    for t in comparison_tables(comparison()):
        console.print(t)
    styled = console.export_text(styles=True)
    assert "\x1b[32m-20.0%\x1b[0m" in styled          # green
    assert "\x1b[31m+30.0%\x1b[0m" in styled          # red
    assert "\x1b[2m-2.0% n.s.\x1b[0m" in styled       # dim
    assert "-50.0%" in styled and "m-50.0%" not in styled   # a fact's delta: no escape sequence before it


def test_markup_in_names_and_labels_is_not_interpreted():
    extra = row("x.y", "Odd [bold]label[/bold]", "s", True, "samples",
                {n: est(1.0) for n in ("fp32", "bf16", "int8")}, headline=10)
    (table,) = comparison_tables(comparison(extra_rows=(extra,)))
    assert labels(table)[-1] == "Odd [bold]label[/bold]"


# ---------------------------------------------------------------- failed variants

def test_failed_variants_show_their_status_in_every_row():
    names = ("fp32", "bf16", "int8")
    status = {"fp32": "ok", "bf16": "failed", "int8": "unsupported"}
    c = comparison(names, status, {"fp32": None, "bf16": "worker exited with status 1: boom", "int8": "no kernel"})
    (table,) = comparison_tables(c)
    assert {t.plain for t in column(table, "bf16")} == {"failed"}
    assert {t.plain for t in column(table, "int8")} == {"unsupported"}
    assert max(cell_len(line) for line in render(c)) <= WIDTH


# ---------------------------------------------------------------- format.py

@pytest.mark.parametrize("value, unit, text", [
    (None, "s", "—"),
    (2.5e-4, "s", "250 µs"),
    (1e-3, "s", "1.00 ms"),
    (0.5, "s", "500.00 ms"),
    (1.5, "s", "1.50 s"),
    (119.99, "s", "119.99 s"),
    (150.0, "s", "2.5 min"),
    (-0.002, "s", "-2.00 ms"),
    (1023, "B", "1023 B"),
    (1024, "B", "1.00 KiB"),
    (3 * 2**20, "B", "3.00 MiB"),
    (1.5 * 2**30, "B", "1.50 GiB"),
    (12345.678, "tok/s", "12,345.7 tok/s"),
    (3.14159, "req/s", "3.14 req/s"),
    (42.123, "%", "42.12%"),
    (0.98765, "ratio", "0.9877"),
    (1.23e-7, "rel", "1.23e-07"),
    (0.012345, "nats", "0.0123"),
    (16.0, "bits", "16"),
    (123.456, "widgets", "123.5"),
])
def test_fmt_value_knows_each_unit(value, unit, text):
    assert fmt_value(value, unit) == text


def test_fmt_estimate():
    assert fmt_estimate(None) == "—"
    assert fmt_estimate(est(None, problem="no samples")) == "no samples"
    assert fmt_estimate(est(None)) == "—"
    assert fmt_estimate(est(0.002, low=0.0019, high=0.0021)) == "2.00 ms [1.90 ms, 2.10 ms]"
    assert fmt_estimate(est(0.002, low=0.0019, high=0.0021), with_ci=False) == "2.00 ms"
    assert fmt_estimate(est(0.002, problem=P99_PROBLEM)) == f"2.00 ms ({P99_PROBLEM})"
    assert fmt_estimate(est(0.002, cv=0.5)) == "2.00 ms ⚠"
    assert fmt_estimate(est(0.002, cv=0.5), check_stability=False) == "2.00 ms"


def test_fmt_delta():
    assert fmt_delta(None) == "—"
    assert fmt_delta(Delta(None, None, None, None)) == "—"
    assert fmt_delta(sig(5.0), with_ci=False) == "+5.0%"
    assert fmt_delta(sig(5.0)) == "+5.0% [+4.0, +6.0]"
    assert fmt_delta(sig(0.4, False), with_ci=False) == "+0.4% n.s."
    assert fmt_delta(Delta(5.0, None, None, None, problem="single sample"), with_ci=False) == "+5.0% ?"
    assert fmt_delta(fact_delta(-50.0), with_ci=False) == "-50.0%"


def test_verdict():
    r = row("k", "K", "s", True, "samples", {"a": est(1.0), "b": est(1.0)},
            {"b": sig(-5.0)})
    assert verdict(r, "b") == "better" and verdict(r, "a") is None
    assert verdict(row("k", "K", "tok/s", False, "samples", {}, {"b": sig(-5.0)}), "b") == "worse"
    assert verdict(row("k", "K", "s", True, "samples", {}, {"b": sig(-5.0, False)}), "b") == "same"
    # significant but under 1%: negligible (dim), not better or worse
    assert verdict(row("k", "K", "s", True, "samples", {}, {"b": sig(-0.4)}), "b") == "negligible"
    assert verdict(row("k", "K", "bits", None, "fact", {}, {"b": sig(-5.0)}), "b") is None
    assert verdict(row("k", "K", "B", True, "fact", {}, {"b": fact_delta(-5.0)}), "b") is None


def test_status_lines_name_failures_rounds_noise_and_the_warnings_of_the_rows_shown():
    status = {"fp32": "ok", "bf16": "ok", "int8": "failed"}
    c = comparison(status=status, reasons={"fp32": None, "bf16": None, "int8": "worker killed by signal 9"},
                   warnings=("the machine was busy",),
                   rounds={"fp32": {"ok": 5, "failed": 0}, "bf16": {"ok": 4, "failed": 1},
                           "int8": {"ok": 0, "failed": 5}})
    shown = visible_rows(c, headline_only=True)
    lines = status_lines(c, shown, full=False)
    assert lines[0] == "int8: failed — worker killed by signal 9"
    assert "rounds measured: fp32 5, bf16 4 (+1 failed)" in lines
    assert "noise: fp32 varied from round to round by TPOT p50 3.0%" in lines
    assert "warning: the machine was busy" in lines
    assert "warning: TPOT p50: shown warning" in lines
    assert not any("hidden warning" in line for line in lines)        # E2EL p99 is not a headline row
    assert any("hidden warning" in line for line in status_lines(c, visible_rows(c), full=False))


def test_status_lines_give_a_reason_even_when_none_was_recorded():
    c = comparison(status={"fp32": "ok", "bf16": "unsupported", "int8": "ok"})
    assert "bf16: unsupported — no reason given" in status_lines(c, [], full=False)


def test_status_lines_describe_each_build_when_full():
    builds = {"fp32": {"recipe": "fp32", "kernels": ["aten.mm"], "notes": ["dense"], "reused": True,
                       "device": "cpu"},
              "bf16": {"recipe": "bf16", "attention": "gqa:2", "kernels": [], "build_s": 2.25},
              "int8": {"recipe": "int8", "kernels": ["_weight_int8pack_mm"]}}
    c = comparison(builds=builds, status={"fp32": "ok", "bf16": "ok", "int8": "failed"})
    lines = status_lines(c, [], full=True)
    assert "fp32: fp32 on cpu (artifact reused); kernels: aten.mm" in lines
    assert "  note: dense" in lines
    assert "bf16: bf16 + attention gqa:2, built in 2.2 s; kernels: n/a" in lines
    assert not any(line.startswith("int8: int8") for line in lines)   # a failed variant's build is not described
    assert not any("kernels" in line for line in status_lines(c, [], full=False))


def test_rounds_and_noise_lines_when_nothing_was_measured():
    c = comparison(status={"fp32": "failed", "bf16": "failed", "int8": "failed"})
    assert rounds_line(c) == "no variant was measured"
    assert noise_line(c, [r for r in c.rows if r.noise is None]) is None


def test_the_unstable_mark_has_a_legend_under_the_table_when_a_row_shown_carries_it():
    """Issue 22: a ⚠ in the table is explained in the lines under it (terminal, report.md and HTML share them);
    no legend when no row shown carries the mark (the unstable row here is not a headline row)."""
    shaky = row("single-stream.ttft_p50", "TTFT p50", "s", True, "samples",
                {"fp32": est(0.002), "bf16": est(0.003, cv=0.5), "int8": est(0.004)}, checks_stability=True,
                headline=4)
    hidden = row("single-stream.ttft_p90", "TTFT p90", "s", True, "samples",
                 {"fp32": est(0.002), "bf16": est(0.003, cv=0.5), "int8": est(0.004)}, checks_stability=True)
    c = comparison(extra_rows=(shaky,))
    shown = visible_rows(c, headline_only=True)
    assert any("⚠" in line for line in render(c))
    legend = [line for line in status_lines(c, shown, full=False) if line.startswith("⚠")]
    assert legend == ["⚠: the figure varied over 10% from round to round (across its samples, with one round); "
                      "its warning below says by how much"]
    quiet = comparison(extra_rows=(hidden,))
    assert not any("⚠" in line for line in render(quiet))
    assert not any("⚠" in line for line in status_lines(quiet, visible_rows(quiet, headline_only=True), full=False))
    assert any(line.startswith("⚠") for line in status_lines(quiet, visible_rows(quiet), full=True))   # --all
