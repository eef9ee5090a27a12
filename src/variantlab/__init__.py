"""variantlab: build variants of one model, measure them side by side, say which to run and why.

Python API (the CLI calls the same functions):

    import variantlab
    result = variantlab.bench("examples/quickstart.yaml")
    print(result.comparison.row("tpot_p50").deltas["bf16"].label())
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["bench", "load_suite", "__version__"]

from . import plugins as _plugins  # noqa: E402 - before any registry is read: VARIANTLAB_PLUGINS register kinds

_plugins.load()


def bench(suite_path, *, store=None, output_dir=None, artifacts=None, rounds=None, skip_bad_lines=False,
          executor=None):
    """Measure every variant of a suite file in interleaved rounds; returns the BenchResult the CLI prints.

    artifacts: a folder written by `variantlab build` whose artifacts are reused when they match;
    rounds: fresh processes per variant (default: the suite's `rounds`);
    skip_bad_lines: skip a JSONL dataset's bad lines instead of raising at the first; each file's skipped
    lines are reported as a UserWarning (what the CLI prints before measuring);
    executor: "local" (the default), "ray" (a local Ray cluster, or the one ray.init joined), or an executor
    object (measure/executor.py's Executor, e.g. measure.ray_executor.RayExecutor("auto"))."""
    import warnings

    from .measure.plan import plan_suite_file
    from .pipeline import run_plan
    plan = plan_suite_file(suite_path, skip_bad_lines=skip_bad_lines)
    for line in plan.warnings:
        warnings.warn(line, stacklevel=2)
    made = None
    if isinstance(executor, str):
        from .measure.ray_executor import make_executor
        executor = made = make_executor(executor)
    try:
        return run_plan(plan.with_rounds(rounds) if rounds is not None else plan, store_path=store,
                        output_dir=output_dir, artifacts_dir=artifacts, executor=executor)
    finally:
        if made is not None:
            made.close()     # a local Ray cluster it started


def load_suite(path):
    from .suite import load_suite as _load
    return _load(path)
