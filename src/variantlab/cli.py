"""The `variantlab` command: verbs → functions. No logic of its own.

Every user-fixable problem is a VariantlabError: printed as one line on stderr, exit status 2.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from .errors import VariantlabError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Build model variants from one checkpoint, measure them side by side, and say which to run.")
dataset_app = typer.Typer(no_args_is_help=True, help="Make or check datasets.")
app.add_typer(dataset_app, name="dataset")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _plugins_imported() -> None:
    """A plugin of VARIANTLAB_PLUGINS that did not import is bad input, before any verb runs."""
    from .plugins import ENV, error
    if error() is not None:
        _fail(VariantlabError(error(), field=ENV, accepted="comma-separated importable module names"))


def _open_store(path: Path):
    """An existing results store (reading never creates one)."""
    from .store import Store
    if not path.exists():
        raise VariantlabError("no results store here", file=str(path),
                              accepted="the path of a store written by `variantlab bench` (--store)")
    return Store(path)


def _fail(e: VariantlabError) -> None:
    err_console.print(f"[bold red]error:[/] {e.one_line()}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _print_comparison(comparison, title: str, all_rows: bool) -> None:
    from .report.format import status_lines, visible_rows
    from .report.table import comparison_tables, note_lines

    for table in comparison_tables(comparison, title=title, all_rows=all_rows):
        console.print(table)
    for line in note_lines(comparison, all_rows):
        console.print(escape(line), highlight=False, soft_wrap=True)
    rows = visible_rows(comparison, headline_only=not all_rows)
    for line in status_lines(comparison, rows, full=all_rows):
        console.print(escape(line), highlight=False, soft_wrap=True)
    if not all_rows:
        console.print("(headline rows; --all prints every row, report.md has intervals)", style="dim",
                      highlight=False)


def _print_plan_warnings(plan) -> None:
    """What planning let through but the user should know before measuring: the lines --skip-bad-lines skipped,
    the layers a recipe cannot quantize as asked (mixed: those int4 cannot hold)."""
    for line in plan.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)


def _print_resolved(plan) -> None:
    """What each `recipe: auto` variant resolved to, and why (the run's stored plan records it too)."""
    for v in plan.variants:
        if v.resolved:
            err_console.print(escape(f"{v.name}: auto → {v.resolved['summary']}"), highlight=False, soft_wrap=True)


def _progress_events(progress, task):
    """runner.Events that drive a rich progress bar: one step per job (build or measurement)."""
    from .measure.runner import Events
    state = {"done": 0}

    def on_start(total: int) -> None:
        progress.update(task, total=total)

    def on_progress(label: str, stage: str, fraction: float) -> None:
        progress.update(task, completed=state["done"] + min(fraction, 0.99), description=f"{label}: {stage}")

    def on_done(label: str, record) -> None:
        state["done"] += 1
        progress.update(task, completed=state["done"], description=f"{label}: {record.status}")
        if record.status != "ok":
            progress.console.print(f"[yellow]{escape(label)} {record.status}:[/] {escape(record.reason or '')}",
                                   highlight=False)

    return Events(on_start=on_start, on_job=lambda label: progress.update(task, description=label),
                  on_progress=on_progress, on_done=on_done,
                  on_note=lambda line: progress.console.print(escape(line), highlight=False, soft_wrap=True))


def _plain_events():
    """runner.Events for a stderr that is not a terminal (a file, a pipe, a CI log), where a live bar would
    write nothing until the end: one plain line per finished build or measurement, with its status, the time
    it took (from its start; none for an artifact reused) and how far the run is."""
    from .measure.runner import Events
    t0 = time.monotonic()
    state: dict = {"done": 0, "total": "?", "started": {}}

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def on_start(total: int) -> None:
        state["total"] = total
        say(f"{total} builds and measurements to run; a line as each finishes")

    def on_done(label: str, record) -> None:
        state["done"] += 1
        started = state["started"].pop(label, None)
        took = f" in {time.monotonic() - started:.1f} s" if started is not None else ""
        reason = f": {record.reason}" if record.status != "ok" and record.reason else ""
        say(f"{label}: {record.status}{took} ({state['done']}/{state['total']} done, "
            f"{time.monotonic() - t0:.0f} s elapsed){reason}")

    return Events(on_start=on_start, on_job=lambda label: state["started"].__setitem__(label, time.monotonic()),
                  on_done=on_done)


def _terminate_as_interrupt() -> None:
    """SIGTERM ends a run the way Ctrl-C does: its worker ended, the run marked interrupted."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


@app.command()
def bench(suite: Optional[Path] = typer.Argument(None, help="suite file (YAML); not with --resume"),
          store: Optional[Path] = typer.Option(None, help="results store (SQLite); default ./variantlab.sqlite"),
          output: Optional[Path] = typer.Option(None, "--output", "-o", help="folder for run outputs (default: suite output.dir)"),
          artifacts: Optional[Path] = typer.Option(None, "--artifacts", help="reuse the matching artifacts of "
                                                   "`variantlab build --out DIR` (others are built in the run folder)"),
          rounds: Optional[int] = typer.Option(None, "--rounds", min=1, max=1000, help="fresh processes per "
                                               "variant, each round in an order of its own (default: the suite's rounds)"),
          all_rows: bool = typer.Option(False, "--all", help="print every row, not only the headline figures"),
          skip_bad_lines: bool = typer.Option(False, "--skip-bad-lines", help="skip a JSONL dataset's bad lines "
                                              "(invalid JSON, a missing field, not UTF-8) instead of stopping at the "
                                              "first; says which it skipped"),
          as_json: bool = typer.Option(False, "--json", help="print the results as JSON instead of a table"),
          executor: str = typer.Option("local", "--executor", help="local: each job in a fresh process here, one at "
                                       "a time | ray: each job a Ray task (pip install 'variantlab\\[ray]')"),
          address: Optional[str] = typer.Option(None, "--address", help="with --executor ray: the cluster to join "
                                                "(auto: the one this machine belongs to); default: a local one"),
          resume: Optional[str] = typer.Option(None, "--resume", help="finish run RUN (killed or interrupted): keep "
                                               "what it measured, run only what has no record")) -> None:
    """Measure every variant of SUITE in interleaved rounds of fresh processes, and print the comparison."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from .measure.plan import plan_suite_file
    from .measure.ray_executor import make_executor
    from .measure.runner import RunInterrupted, check_artifacts_dir
    from .pipeline import resume_run, run_plan

    _terminate_as_interrupt()
    runner = None
    try:
        if resume is not None:
            _check_resume_options(suite, output, artifacts, rounds)
        elif suite is None:
            raise VariantlabError("no suite file given", field="SUITE",
                                  accepted="variantlab bench SUITE.yaml, or variantlab bench --resume RUN")
        else:
            plan = plan_suite_file(suite, skip_bad_lines)
            if rounds:
                plan = plan.with_rounds(rounds)
            _print_plan_warnings(plan)
            _print_resolved(plan)
            check_artifacts_dir(artifacts)
        runner = make_executor(executor, address)
        live = err_console.is_terminal      # else (a file, a pipe) one plain line per finished job instead
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err_console,
                      disable=as_json or not live, transient=False) as progress:
            task = progress.add_task("planning", total=None)
            events = _progress_events(progress, task) if live else _plain_events()
            if resume is not None:
                result = resume_run(resume, store_path=store, executor=runner, events=events)
            else:
                result = run_plan(plan, store_path=store, output_dir=output, artifacts_dir=artifacts,
                                  executor=runner, events=events)
    except VariantlabError as e:
        _fail(e)
    except RunInterrupted as e:
        err_console.print(f"interrupted: run {e.run_id} kept {e.kept} finished records in {e.store_path}; "
                          f"`variantlab show {e.run_id}` shows what was measured", highlight=False)
        raise typer.Exit(130)
    except KeyboardInterrupt:   # before the run started: nothing was measured
        err_console.print("interrupted before anything was measured", highlight=False)
        raise typer.Exit(130)
    finally:
        if runner is not None:
            runner.close()
    if as_json:
        from .report.files import results_json_text
        print(results_json_text(result.to_json()))     # results.json's text: schema variantlab.results/1
        _exit_unless_all_ok(result.comparison.status)
        return
    _print_comparison(result.comparison, f"{result.suite_name} — run {result.run_id}", all_rows)
    _print_explanations(result)
    if result.recommendation is not None:
        console.print("Recommendation", style="bold")
        _print_recommendation(result.recommendation)
    console.print(f"wrote {result.output_dir}/report.md, results.json, results.csv; "
                  f"stored run {result.run_id} in {result.store_path} ({result.wall_s:.1f} s)",
                  highlight=False)
    _exit_unless_all_ok(result.comparison.status)


def _check_resume_options(suite: Optional[Path], output: Optional[Path], artifacts: Optional[Path],
                          rounds: Optional[int]) -> None:
    """--resume finishes a run as it was planned: options that would plan it otherwise are refused."""
    given = [name for name, v in (("SUITE", suite), ("--output", output), ("--artifacts", artifacts),
                                  ("--rounds", rounds)) if v is not None]
    if given:
        raise VariantlabError(f"--resume finishes a run as it was planned; {', '.join(given)} cannot change it",
                              field=given[0], accepted="variantlab bench --resume RUN [--store PATH] "
                                                       "[--executor local|ray]")


def _exit_unless_all_ok(status: dict[str, str]) -> None:
    """bench's and build's exit status: 0 when every variant was measured (or built), 1 when any failed or
    was unsupported (the others' results are kept and printed all the same), 2 for bad input (`_fail`)."""
    bad = {n: s for n, s in status.items() if s != "ok"}
    if bad:
        err_console.print(f"{len(bad)} of {len(status)} variants did not finish: "
                          + ", ".join(f"{n} ({s})" for n, s in bad.items()) + "; exit status 1", highlight=False)
        raise typer.Exit(1)


@app.command()
def build(suite: Path = typer.Argument(..., help="suite file (YAML)"),
          out: Optional[Path] = typer.Option(None, "--out", "-o", help="folder for the artifacts, one per variant "
                                             "(default: ./artifacts/<suite name>/)"),
          skip_bad_lines: bool = typer.Option(False, "--skip-bad-lines", help="skip a JSONL dataset's bad lines "
                                              "(invalid JSON, a missing field, not UTF-8) instead of stopping at the "
                                              "first; says which it skipped"),
          executor: str = typer.Option("local", "--executor", help="local: one build at a time here | ray: each "
                                       "build a Ray task, side by side where the cluster has room"),
          address: Optional[str] = typer.Option(None, "--address", help="with --executor ray: the cluster to join "
                                                "(auto: the one this machine belongs to); default: a local one")) -> None:
    """Build every variant of SUITE, each in a fresh process, and save it as an artifact (safetensors + JSON)."""
    from rich.table import Table

    from .measure.plan import plan_suite_file
    from .measure.ray_executor import make_executor
    from .measure.runner import Events, default_artifacts_dir, run_build
    from .report.format import fmt_value

    _terminate_as_interrupt()
    runner = None
    try:
        plan = plan_suite_file(suite, skip_bad_lines)
        _print_plan_warnings(plan)
        _print_resolved(plan)
        out_dir = out if out is not None else default_artifacts_dir(plan)
        runner = make_executor(executor, address)
        t0 = time.perf_counter()
        with err_console.status("building") as status:
            events = Events(on_job=lambda label: status.update(label),
                            on_note=lambda line: err_console.print(escape(line), highlight=False, soft_wrap=True))
            results = run_build(plan, out_dir, executor=runner, events=events)
    except VariantlabError as e:
        _fail(e)
    except KeyboardInterrupt:   # the executor has ended the workers; finished artifacts stay
        err_console.print("interrupted: the artifacts finished so far are kept", highlight=False)
        raise typer.Exit(130)
    finally:
        if runner is not None:
            runner.close()
    t = Table("variant", "recipe", "bits per weight", "size on disk", "build time", "status",
              title=f"{plan.suite.name} — artifacts in {out_dir}")
    for v in plan.variants:
        r = results[v.name]
        ok = r.status == "ok"
        bits = 8 * r.bytes_on_disk / r.facts.parameters if ok and r.facts and r.facts.parameters else None
        t.add_row(v.name, v.definition.recipe, fmt_value(bits, "bits") if ok else "—",
                  fmt_value(r.bytes_on_disk, "B") if ok else "—",
                  fmt_value(r.timings.get("build_s"), "s") if ok else "—",
                  "ok" if ok else f"{r.status}: {r.reason}")
    console.print(t)
    built = sum(r.status == "ok" for r in results.values())
    console.print(f"built {built} of {len(results)} variants into {out_dir} ({time.perf_counter() - t0:.1f} s)",
                  highlight=False)
    _exit_unless_all_ok({n: r.status for n, r in results.items()})


@app.command()
def explain(run: str = typer.Argument(..., help="run id (or a unique prefix)"),
            a: str = typer.Argument(..., help="the variant to compare against (e.g. the baseline)"),
            b: str = typer.Argument(..., help="the variant whose difference is explained"),
            store: Path = typer.Option(Path("variantlab.sqlite"), help="results store (SQLite)"),
            rounds: int = typer.Option(2, "--rounds", min=1, help="profiled fresh workers per variant, A B then B A"),
            ops: bool = typer.Option(False, "--ops", help="also print the operators that moved most"),
            as_json: bool = typer.Option(False, "--json", help="print the explanation as JSON")) -> None:
    """Profile two variants of a stored run in fresh workers and attribute B's per-token time against A's, per
    phase, to operator categories; place each on its roofline."""
    from .explain.render import explanation_blocks
    from .explain.run import ExplainFailed, explain_run
    _terminate_as_interrupt()
    try:
        with err_console.status("profiling") as status:
            explanation, folder = explain_run(store, run, a, b, rounds=rounds, on_job=status.update)
    except VariantlabError as e:
        _fail(e)
    except ExplainFailed as e:
        err_console.print(f"[bold red]explain failed:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    except KeyboardInterrupt:
        err_console.print("interrupted: nothing was explained", highlight=False)
        raise typer.Exit(130)
    if as_json:
        from .explain.run import finite
        print(json.dumps(finite(explanation.to_json()), indent=2))
        return
    _print_blocks(explanation_blocks(explanation, ops))
    console.print(f"wrote {folder}/explanation.md and explanation.json", highlight=False)


def _print_explanations(result) -> None:
    """`explain: true`: each explained variant's headline per phase; report.md has the tables."""
    from .explain.render import headline
    for note in result.explain_notes:
        console.print(escape(note), highlight=False, soft_wrap=True)
    for e in result.explanations:
        console.print(f"why {escape(e.b)} is slower than {escape(e.a)} (explain/{escape(e.a)}-vs-{escape(e.b)}/):",
                      style="bold", highlight=False)
        for p in e.phases:
            console.print("  " + escape(headline(p, e.a, e.b)), highlight=False, soft_wrap=True)


def _print_blocks(blocks) -> None:
    from rich import box
    from rich.table import Table

    from .explain.render import Text
    for blk in blocks:
        if isinstance(blk, Text):
            console.print(escape(blk.text), style="bold" if blk.heading else None, highlight=False, soft_wrap=True)
            continue
        t = Table(*blk.headers, box=box.SIMPLE_HEAD)
        for row in blk.rows:
            t.add_row(*map(escape, row))
        console.print(t)


@app.command()
def schema() -> None:
    """Print the suite file's JSON schema."""
    from .suite import suite_json_schema
    print(json.dumps(suite_json_schema(), indent=2))


@app.command()
def hw(refresh: bool = typer.Option(False, "--refresh", help="measure the ceilings and kernel times again instead "
                                    "of reading the cache"),
       threads: Optional[int] = typer.Option(None, min=1, help="torch threads to measure with (default: torch's)"),
       as_json: bool = typer.Option(False, "--json", help="print the facts, ceilings, kernel times and "
                                    "configuration as JSON")) -> None:
    """Print this machine's facts (CPU, instruction sets, GPUs), which of our CPU kernels it runs, its measured
    ceilings (memory bandwidth, matmul rates) and kernel times, measured once per machine and cached, and the
    hardware-aware configuration (what `recipe: auto` picks) for a decode-heavy and a batch-heavy workload."""
    import torch

    from .device_facts import device_facts
    from .hardware import cache_dir, cached_ceilings
    from .hwconfig import BATCH_HEAVY, DECODE_HEAVY, machine_config, machine_inputs
    from .variants import kernels as vk
    if threads:
        torch.set_num_threads(threads)
    facts = device_facts()
    ours = vk.prepare()   # built here (once), before anything is timed, as bench does
    source = f" ({vk.ISA.source.name})" if ours.available and vk.ISA else ""
    ours_line = f"our CPU kernels: {ours.reason}{source}"
    devices = ["cpu"] + [f"cuda:{i}" for i in range(len(facts.gpus))]
    measured = {d: cached_ceilings(d, refresh=refresh) for d in devices}
    inputs = {d: machine_inputs(d, threads=torch.get_num_threads(), refresh=refresh, ceilings=measured[d][0])
              for d in devices}
    configs = {d: [machine_config(w, device=d, inputs=inputs[d]) for w in (DECODE_HEAVY, BATCH_HEAVY)]
               for d in devices}
    if as_json:
        print(json.dumps({"facts": facts.to_json(),
                          "cpu_kernels": {"available": ours.available, "reason": ours.reason},
                          "ceilings": {d: c.to_json() | {"cached": hit} for d, (c, hit) in measured.items()},
                          "kernel_times": {d: [kt.to_json() for kt in m.kernel_times] for d, m in inputs.items()},
                          "configuration": {d: {"decode-heavy": a.to_json(), "batch-heavy": b.to_json()}
                                            for d, (a, b) in configs.items()}},
                         indent=2))
        return
    for line in facts.lines() + [ours_line]:
        console.print(escape(line), soft_wrap=True)
    for d, (c, hit) in measured.items():
        for line in c.lines():
            console.print(escape(line), soft_wrap=True)
        console.print(f"({'read from' if hit else 'measured now, kept in'} {escape(str(cache_dir()))}; "
                      "--refresh measures again)")
        kt_lines = [line for kt in inputs[d].kernel_times for line in kt.lines()]
        for line in kt_lines + [c2 for cfg in configs[d] for c2 in cfg.lines()]:
            console.print(escape(line), soft_wrap=True, highlight=False)


@app.command()
def recipes() -> None:
    """List the recipes a variant can name."""
    from rich.table import Table

    from .measure import auto_recipe  # noqa: F401 - registers the planning-time recipe
    from .variants.registry import PLAN_TIME, RECIPES
    t = Table("recipe", "what it builds", "options")
    for name, r in (RECIPES | PLAN_TIME).items():
        t.add_row(name, r.description, ", ".join(r.options_model.model_fields) or "—")
    console.print(t)


@app.command()
def runs(store: Path = typer.Option(Path("variantlab.sqlite"), help="results store (SQLite)"),
         limit: int = typer.Option(20, help="how many runs, newest first")) -> None:
    """List the runs in the results store."""
    from rich.table import Table

    try:
        with _open_store(store) as s:
            rows = s.runs(limit)
    except VariantlabError as e:
        _fail(e)
    t = Table()
    # the run id is what every other verb takes: never cut nor folded, however narrow the terminal
    t.add_column("run", no_wrap=True, min_width=max((len(r.run_id) for r in rows), default=3))
    t.add_column("created (UTC)", no_wrap=True, min_width=16)
    for name in ("suite", "status", "variants"):
        t.add_column(name, overflow="fold")
    for r in rows:
        t.add_row(r.run_id, r.created[:16].replace("T", " "), r.suite_name, r.status,
                  ", ".join(f"{n} ({st})" for n, st in r.variants))
    console.print(t)


@app.command()
def show(run: str = typer.Argument(..., help="run id (or a unique prefix)"),
         store: Path = typer.Option(Path("variantlab.sqlite"), help="results store (SQLite)"),
         all_rows: bool = typer.Option(False, "--all", help="print every row, not only the headline figures"),
         fmt: str = typer.Option("table", "--format", help="table | markdown (every row, with intervals) | json "
                                 "(results.json's content, schema variantlab.results/1) | csv (one line per metric "
                                 "and variant)"),
         markdown: bool = typer.Option(False, "--markdown", help="the same as --format markdown")) -> None:
    """Reprint a stored run's comparison (an interrupted or running run: what it measured so far)."""
    from .measure.runs import stored_comparison
    from .report.files import results_csv, results_json_text
    from .report.markdown import comparison_markdown
    from .report.stored import stored_results
    try:
        fmt = _show_format(fmt, markdown)
        with _open_store(store) as s:
            if fmt == "json":
                print(results_json_text(stored_results(s, run)))
                return
            comparison, row = stored_comparison(s, run)
    except VariantlabError as e:
        _fail(e)
    if fmt == "markdown":
        print(comparison_markdown(comparison))
    elif fmt == "csv":
        sys.stdout.write(results_csv(comparison))
    else:
        _print_comparison(comparison, f"{row.suite_name} — run {row.run_id} ({row.status})", all_rows)


SHOW_FORMATS = ("table", "markdown", "json", "csv")


def _show_format(fmt: str, markdown: bool) -> str:
    """--format checked; --markdown is --format markdown."""
    fmt = fmt.lower()
    if fmt not in SHOW_FORMATS:
        raise VariantlabError(f"unknown format '{fmt}'", field="--format", accepted=" | ".join(SHOW_FORMATS))
    if markdown and fmt not in ("table", "markdown"):
        raise VariantlabError(f"--markdown asks for markdown but --format asks for {fmt}", field="--format",
                              accepted="one of them")
    return "markdown" if markdown else fmt


@app.command()
def report(run: str = typer.Argument(..., help="run id (or a unique prefix)"),
           output: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file to write (default: "
                                                 "report.html in the run's folder)"),
           store: Path = typer.Option(Path("variantlab.sqlite"), help="results store (SQLite)"),
           requirements: Optional[Path] = typer.Option(None, "--requirements", "-r", help="YAML requirements for "
                                                       "the recommendation (default: the run's suite's)")) -> None:
    """Write a stored run's report as one self-contained HTML file (it opens offline and fetches nothing): the
    comparison table with deltas, charts (accuracy against latency with the Pareto front, latency percentiles,
    throughput against batch size, latency against prompt length, explain's categories) and the recommendation."""
    from .report.files import check_output_file, write_page
    from .report.html import report_html
    from .report.stored import run_page, stored_recommendation
    try:
        if output is not None:
            check_output_file(output)
        with _open_store(store) as s:
            page = run_page(s, run)
            recommendation = stored_recommendation(s, page.run_id, requirements)
            folder = s.run(page.run_id).output_dir
        if output is None and not folder:
            raise VariantlabError(f"run {page.run_id} has no folder to write report.html into", field="--output",
                                  accepted="an HTML file path (-o report.html)")
        path = output if output is not None else Path(folder) / "report.html"
        write_page(path, report_html(page, recommendation))
    except VariantlabError as e:
        _fail(e)
    console.print(f"wrote {path} (run {page.run_id}, {path.stat().st_size / 2**20:.1f} MiB, self-contained)",
                  highlight=False, soft_wrap=True)


@app.command()
def recommend(run: str = typer.Argument(..., help="run id (or a unique prefix)"),
              store: Path = typer.Option(Path("variantlab.sqlite"), help="results store (SQLite)"),
              requirements: Optional[Path] = typer.Option(None, "--requirements", "-r", help="YAML requirements "
                                                          "(default: the run's suite's); see `variantlab requirements`"),
              preset: Optional[str] = typer.Option(None, "--preset", help="a preset on top of the requirements: "
                                                   "high-precision | balanced | resource-constrained | "
                                                   "extreme-compression | real-time"),
              as_json: bool = typer.Option(False, "--json", help="print the recommendation as JSON")) -> None:
    """The variant of a stored run that meets the requirements: the pick and why, the Pareto front, what each
    other variant misses and by how much; then the measured selection matrix and attention guideline."""
    from .advise.matrix import ANALYSIS_GUIDELINE, attention_guideline, selection_matrix
    from .advise.presets import PRESETS
    from .advise.recommend import recommend_stored, run_scenarios
    try:
        if preset is not None and preset not in PRESETS:
            raise VariantlabError(f"unknown preset {preset!r}", field="--preset", accepted=" | ".join(PRESETS))
        with _open_store(store) as s:
            rec, comparison, row = recommend_stored(s, run, requirements, preset)
    except VariantlabError as e:
        _fail(e)
    scenarios = run_scenarios(row.suite)
    matrix = selection_matrix(comparison, scenarios)
    lines, crossovers = attention_guideline(comparison, scenarios)
    if as_json:
        print(json.dumps({**rec.to_json(), "run_id": row.run_id, "selection_matrix": [m.to_json() for m in matrix],
                          "attention": {"lines": lines, "crossovers": [c.to_json() for c in crossovers]}}, indent=2))
        return
    console.print(f"{escape(row.suite_name)} — run {row.run_id}: recommendation", style="bold", highlight=False)
    _print_recommendation(rec)
    _print_matrix(matrix, comparison.baseline)
    if lines:
        console.print(f"Attention, measured (the analysis guessed: {ANALYSIS_GUIDELINE})", style="bold",
                      highlight=False, soft_wrap=True)
        for line in lines:
            console.print("  " + escape(line), highlight=False, soft_wrap=True)


def _print_recommendation(rec) -> None:
    for line in rec.lines():
        top = line.startswith(("caution:", "requirements:", "pick:", "no pick"))
        console.print(("" if top else "  ") + escape(line), highlight=False, soft_wrap=True,
                      style="bold yellow" if line.startswith("caution:") else
                      "bold" if line.startswith(("pick:", "no pick")) else None)


def _print_matrix(matrix, baseline: str) -> None:
    console.print(f"Selection matrix, measured (accuracy loss and speedup against {baseline}), beside the "
                  "analysis's guess", style="bold", highlight=False)
    for line in (m.line() for m in matrix):
        console.print("  " + escape(line), highlight=False, soft_wrap=True)


@app.command("requirements")
def requirements_cmd(preset: Optional[str] = typer.Argument(None, help="a preset; none: list them")) -> None:
    """Print a preset as the `requirements:` block it expands into (copy it into a suite and override any field),
    or list the presets."""
    from .advise.presets import PRESETS, preset_yaml
    if preset is None:
        for name, p in PRESETS.items():
            console.print(f"[bold]{name}[/]: {escape(p.summary)}", highlight=False, soft_wrap=True)
        return
    if preset not in PRESETS:
        _fail(VariantlabError(f"unknown preset {preset!r}", field="PRESET", accepted=" | ".join(PRESETS)))
    print(preset_yaml(preset), end="")


@app.command()
def compare(run_a: str = typer.Argument(..., help="the reference run: id or a unique prefix"),
            run_b: str = typer.Argument(..., help="the run judged against it"),
            store: Path = typer.Option(Path("variantlab.sqlite"), help="results store (SQLite) of run A"),
            store_b: Optional[Path] = typer.Option(None, "--store-b", help="results store of run B (default: --store)"),
            force: bool = typer.Option(False, "--force", help="compare runs whose environments differ on a key field "
                                       "(CPU, GPU, device, torch/transformers major, Python, threads)"),
            fail_on_regression: Optional[str] = typer.Option(None, "--fail-on-regression", metavar="PERCENT",
                                                             help="exit 1 when a metric of a variant is worse in B by "
                                                             "more than PERCENT (5% or 5) with a verdict"),
            all_rows: bool = typer.Option(False, "--all", help="print every row, not only the headline figures and "
                                          "the rows that changed"),
            as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON "
                                         "(schema variantlab.compare/1)")) -> None:
    """Compare run B with run A, variant by variant: B/A per metric with its interval, and a verdict ("1.23x
    slower", "not significant") only when the change clears both the interval and the runs' own noise."""
    from .advise.compare import blocks, compare_stored, parse_threshold, regressions
    try:
        threshold = None if fail_on_regression is None else parse_threshold(fail_on_regression)
        with _open_store(store) as sa:
            if store_b is None or store_b == store:
                result = compare_stored(sa, run_a, sa, run_b, force=force)
            else:
                with _open_store(store_b) as sb:
                    result = compare_stored(sa, run_a, sb, run_b, force=force)
    except VariantlabError as e:
        _fail(e)
    if as_json:
        print(json.dumps(result.to_json(threshold), indent=2))
    else:
        _print_blocks(blocks(result, threshold, all_rows))
    if threshold is not None and regressions(result, threshold):
        raise typer.Exit(1)


@app.command()
def serve(suite: Path = typer.Argument(..., help="suite file (YAML): the model, its variants, the requirements"),
          variants: Optional[str] = typer.Option(None, "--variants", help="comma-separated variants to serve "
                                                 "(default: all; single and static serve the first)"),
          policy: str = typer.Option("adaptive", "--policy", help="single | static | adaptive"),
          host: str = typer.Option("127.0.0.1", help="address to bind (default: loopback only)"),
          port: int = typer.Option(8000, help="port to listen on"),
          api_key: Optional[str] = typer.Option(None, "--api-key", envvar="VARIANTLAB_API_KEY",
                                                help="require Authorization: Bearer KEY on /v1/ routes"),
          max_batch: int = typer.Option(32, "--max-batch", min=1, help="rows a variant decodes together at most"),
          batch_size: int = typer.Option(8, "--batch-size", min=1, help="static: the batch it waits for"),
          max_wait_ms: float = typer.Option(20.0, "--max-wait-ms", min=0, help="static: the longest wait for a batch"),
          max_queue: int = typer.Option(256, "--max-queue", min=1, help="waiting requests beyond this get 429"),
          max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="a request's max_tokens at most"),
          context: int = typer.Option(512, "--context", min=8, help="prompt + output tokens a request may use"),
          tpot_slo_ms: Optional[float] = typer.Option(None, "--tpot-slo-ms", help="adaptive: the TPOT to keep "
                                                      "(default: the suite's max_tpot_s, else slo.tpot_s)"),
          threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch threads (per worker; default: "
                                                "the CPU workers share the cores)"),
          workers: Optional[int] = typer.Option(None, "--workers", min=1, help="serving processes, each holding the "
                                                "variants, requests routed by queue and expected cost "
                                                "(default: one per --devices entry, else 1)"),
          devices: Optional[str] = typer.Option(None, "--devices", help="comma-separated device per worker, e.g. "
                                                "cpu,cuda:0 (default: cpu)"),
          in_process: bool = typer.Option(False, "--in-process", help="run the engine in the HTTP server's own "
                                          "process (one worker; slower under load: both need Python's GIL)"),
          shutdown_grace_s: float = typer.Option(5.0, "--shutdown-grace-s", min=0, help="on SIGTERM or Ctrl-C, how "
                                                 "long requests in flight get to finish before they fail with "
                                                 "503")) -> None:
    """Serve the suite's variants behind an OpenAI-compatible API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics), batching continuously; `adaptive` switches variant with load. With
    --workers N (or several --devices) N worker processes serve side by side behind one router; the engine
    always runs in a process of its own, apart from HTTP, unless --in-process. SIGTERM and Ctrl-C end it
    cleanly (exit 0): it stops accepting, lets the requests in flight finish within --shutdown-grace-s,
    fails the rest with 503 and stops its worker processes."""
    from .measure.plan import plan_suite_file
    from .serve.app import ServerLimits
    from .serve.server import ServeOptions, build_server
    _terminate_as_interrupt()    # while it starts; once it serves, the listener handles both (serve/listener.py)

    def log(line: str) -> None:
        err_console.print(escape(line), highlight=False, soft_wrap=True)
    device_list = tuple(d.strip() for d in (devices or "").split(",") if d.strip())
    n_workers = workers or len(device_list) or 1
    try:
        options = ServeOptions(policy=policy, variants=tuple(v.strip() for v in (variants or "").split(",") if v.strip()),
                               max_batch=max_batch, batch_size=batch_size, max_wait_s=max_wait_ms / 1e3,
                               max_queue=max_queue, context=context, limits=ServerLimits(max_tokens=max_tokens),
                               api_key=api_key, threads=threads,
                               tpot_slo_s=None if tpot_slo_ms is None else tpot_slo_ms / 1e3,
                               workers=n_workers, devices=device_list, engine_process=not in_process,
                               device=device_list[0] if n_workers == 1 and device_list else "cpu")
        plan = plan_suite_file(suite)
        handle = build_server(plan, options, log=log)
    except VariantlabError as e:
        _fail(e)
    except KeyboardInterrupt:    # while building: build_server has ended the workers it started
        err_console.print("interrupted while starting; nothing was served", highlight=False)
        raise typer.Exit(130)
    err_console.print(f"serving {', '.join(handle.engine.lanes)} ({policy}"
                      + (f", {n_workers} workers" if n_workers > 1 else "") + f") on http://{host}:{port}/v1"
                      + (" (bearer key required)" if api_key else ""), highlight=False, soft_wrap=True)
    handle.serve(host, port, grace_s=shutdown_grace_s, log=log)
    err_console.print("stopped", highlight=False)


@dataset_app.command("make")
def dataset_make(n: int = typer.Option(100_000, "--n", min=1, help="number of samples"),
                 seed: int = typer.Option(0, help="generator seed"),
                 out: Path = typer.Option(..., "-o", "--out", help="JSONL file to write")) -> None:
    """Write N structured samples (prompt, answer, kind, format, task) as JSONL."""
    from .data.structured import generate_samples, write_jsonl
    from .report.files import check_output_file
    t0 = time.perf_counter()
    try:
        check_output_file(out, "--out")          # a missing folder, a file in the path: one line, exit 2
        write_jsonl(generate_samples(n, seed), out)
    except VariantlabError as e:
        _fail(e)
    except OSError as e:
        _fail(VariantlabError(f"cannot write it: {e.strerror}", file=str(out), field="--out",
                              accepted="a writable file path"))
    err_console.print(f"wrote {n:,} samples to {out} in {time.perf_counter() - t0:.2f} s", highlight=False)


@app.command("make-checkpoint")
def make_checkpoint(out: Path = typer.Argument(..., help="folder to write (made if missing)"),
                    shape: str = typer.Option(..., "--shape", help="a deployed shape, e.g. qwen2.5-0.5b, "
                                              "llama-3.2-1b, smollm2-360m, llama-2-style-32k, qwen2-vocab-tiny"),
                    seed: int = typer.Option(0, help="seeds the random weights"),
                    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
                    tokenizer_class: Optional[str] = typer.Option(None, "--tokenizer-class", help="the class "
                                                                  "tokenizer_config.json names, e.g. Qwen2Tokenizer")
                    ) -> None:
    """Write a random-weight checkpoint of a real model's shape, with a tokenizer of its vocabulary size."""
    from .models.synthetic import describe, write_checkpoint
    try:
        done = write_checkpoint(out, shape, seed=seed, dtype=dtype, tokenizer_class=tokenizer_class)
    except VariantlabError as e:
        _fail(e)
    except OSError as e:
        _fail(VariantlabError(f"cannot write it: {e.strerror}", file=str(out), accepted="a writable folder"))
    console.print(describe(out, done), highlight=False, soft_wrap=True)


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
