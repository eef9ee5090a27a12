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

from .errors import VariantlabError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Build model variants from one checkpoint, measure them side by side, and say which to run.")
dataset_app = typer.Typer(no_args_is_help=True, help="Make or check datasets.")
app.add_typer(dataset_app, name="dataset")
console = Console()
err_console = Console(stderr=True)


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


@app.command()
def bench(suite: Path = typer.Argument(..., help="suite file (YAML)"),
          store: Optional[Path] = typer.Option(None, help="results store (SQLite); default ./variantlab.sqlite"),
          output: Optional[Path] = typer.Option(None, "--output", "-o", help="folder for run outputs (default: suite output.dir)"),
          artifacts: Optional[Path] = typer.Option(None, "--artifacts", help="reuse the matching artifacts of "
                                                   "`variantlab build --out DIR` (others are built in the run folder)"),
          as_json: bool = typer.Option(False, "--json", help="print the results as JSON instead of a table")) -> None:
    """Measure every variant of SUITE, each in a fresh process, and print the comparison."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from .measure.runner import check_artifacts_dir, plan_suite_file, run_plan
    from .report.format import status_lines
    from .report.table import comparison_table

    try:
        plan = plan_suite_file(suite)
        check_artifacts_dir(artifacts)
        n_variants = len(plan.variants)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err_console,
                      disable=as_json, transient=False) as progress:
            task = progress.add_task("variants", total=n_variants)
            state = {"done": 0}

            def on_progress(name: str, stage: str, fraction: float) -> None:
                progress.update(task, completed=state["done"] + fraction, description=f"{name}: {stage}")

            def on_done(name: str, result: dict) -> None:
                state["done"] += 1
                progress.update(task, completed=state["done"], description=f"{name}: {result.get('status')}")
                if result.get("status") != "ok":
                    progress.console.print(f"[yellow]{name} {result.get('status')}:[/] {result.get('reason')}",
                                           highlight=False)

            t0 = time.perf_counter()
            result = run_plan(plan, store_path=store, output_dir=output, artifacts_dir=artifacts,
                              on_progress=on_progress, on_variant_done=on_done)
    except VariantlabError as e:
        _fail(e)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    console.print(comparison_table(result.comparison, title=f"{result.suite_name} — run {result.run_id}"))
    for line in status_lines(result.comparison):
        console.print(line, highlight=False)
    console.print(f"wrote {result.output_dir}/report.md, results.json, results.csv; "
                  f"stored run {result.run_id} in {result.store_path} ({time.perf_counter() - t0:.1f} s)",
                  highlight=False)


@app.command()
def build(suite: Path = typer.Argument(..., help="suite file (YAML)"),
          out: Optional[Path] = typer.Option(None, "--out", "-o", help="folder for the artifacts, one per variant "
                                             "(default: ./artifacts/<suite name>/)")) -> None:
    """Build every variant of SUITE, each in a fresh process, and save it as an artifact (safetensors + JSON)."""
    from rich.table import Table

    from .measure.runner import default_artifacts_dir, plan_suite_file, run_build
    from .report.format import fmt_value

    try:
        plan = plan_suite_file(suite)
        out_dir = out if out is not None else default_artifacts_dir(plan)
        t0 = time.perf_counter()
        with err_console.status("building") as status:
            results = run_build(plan, out_dir, on_variant_start=lambda name: status.update(f"building {name}"))
    except VariantlabError as e:
        _fail(e)
    t = Table("variant", "recipe", "bits per weight", "size on disk", "build time", "status",
              title=f"{plan.suite.name} — artifacts in {out_dir}")
    for v in plan.variants:
        r = results[v.name]
        ok = r.get("status") == "ok"
        bits = (r.get("facts") or {}).get("bits_per_weight")
        t.add_row(v.name, v.recipe, fmt_value(bits, "bits") if ok else "—",
                  fmt_value(r.get("bytes_on_disk"), "B") if ok else "—",
                  fmt_value(r.get("build_s"), "s") if ok else "—",
                  "ok" if ok else f"{r.get('status')}: {r.get('reason')}")
    console.print(t)
    built = sum(r.get("status") == "ok" for r in results.values())
    console.print(f"built {built} of {len(results)} variants into {out_dir} ({time.perf_counter() - t0:.1f} s)",
                  highlight=False)
    if not built:
        raise typer.Exit(1)


@app.command()
def schema() -> None:
    """Print the suite file's JSON schema."""
    from .suite import suite_json_schema
    print(json.dumps(suite_json_schema(), indent=2))


@app.command()
def recipes() -> None:
    """List the recipes a variant can name."""
    from rich.table import Table

    from .variants.registry import RECIPES
    t = Table("recipe", "what it builds", "options")
    for name, r in RECIPES.items():
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
    t = Table("run", "created", "suite", "status", "variants")
    for r in rows:
        t.add_row(r.run_id, r.created, r.suite_name, r.status, ", ".join(f"{n} ({st})" for n, st in r.variants))
    console.print(t)


@app.command()
def show(run: str = typer.Argument(..., help="run id (or a unique prefix)"),
         store: Path = typer.Option(Path("variantlab.sqlite"), help="results store (SQLite)"),
         markdown: bool = typer.Option(False, "--markdown", help="print the Markdown table")) -> None:
    """Reprint a stored run's comparison table."""
    from .measure.analysis import Comparison, compare_variants
    from .report.format import status_lines
    from .report.markdown import comparison_markdown
    from .report.table import comparison_table
    try:
        with _open_store(store) as s:
            row = s.run(run)
            if row.comparison:
                comparison = Comparison.from_json(row.comparison)
            else:  # an unfinished run: compare what was measured
                base = row.suite.get("baseline") or row.suite["variants"][0]["name"]
                comparison = compare_variants(s.measurements(row.run_id), base)
    except VariantlabError as e:
        _fail(e)
    if markdown:
        print(comparison_markdown(comparison))
    else:
        console.print(comparison_table(comparison, title=f"{row.suite_name} — run {row.run_id} ({row.status})"))
    for line in status_lines(comparison):
        console.print(line, highlight=False)


@dataset_app.command("make")
def dataset_make(n: int = typer.Option(100_000, "--n", min=1, help="number of samples"),
                 seed: int = typer.Option(0, help="generator seed"),
                 out: Path = typer.Option(..., "-o", "--out", help="JSONL file to write")) -> None:
    """Write N structured samples (prompt, answer, kind, format, task) as JSONL."""
    from .data.structured import generate_samples, write_jsonl
    t0 = time.perf_counter()
    write_jsonl(generate_samples(n, seed), out)
    err_console.print(f"wrote {n:,} samples to {out} in {time.perf_counter() - t0:.2f} s", highlight=False)


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
