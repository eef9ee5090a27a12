"""A bench end to end: a run carried out (measure/runner.py), then the steps after it — the explanations
(`explain: true`), the recommendation (a suite with requirements), the reports. `variantlab bench` and
`variantlab.bench()` call these; the runner itself knows none of the steps, which live in the layers above
it (docs/architecture.md). A step of your own is a function (FinishedRun, BenchResult) → BenchResult, passed
in `after` (measure/runner.AfterRun).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .advise.recommend import recommend_step
from .explain.run import explain_step
from .measure.plan import plan_suite_file
from .measure.runner import AfterRun, BenchResult, measure_plan, measure_resumed
from .report.files import reports_step

AFTER_RUN: tuple[AfterRun, ...] = (explain_step, recommend_step, reports_step)


def run_plan(plan, *, after: Sequence[AfterRun] = AFTER_RUN, **kwargs) -> BenchResult:
    """Build and measure a checked plan (measure/runner.measure_plan's arguments), then the steps after it."""
    return measure_plan(plan, after=after, **kwargs)


def resume_run(run_id: str, *, after: Sequence[AfterRun] = AFTER_RUN, **kwargs) -> BenchResult:
    """Finish a run that did not end (measure/runner.measure_resumed), then the steps after it."""
    return measure_resumed(run_id, after=after, **kwargs)


def run_bench(suite_path: str | Path, *, rounds: int | None = None, **kwargs) -> BenchResult:
    """Measure every variant of a suite file; return the comparison (also stored and reported)."""
    plan = plan_suite_file(suite_path)
    return run_plan(plan.with_rounds(rounds) if rounds is not None else plan, **kwargs)
