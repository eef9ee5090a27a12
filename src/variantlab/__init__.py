"""variantlab: build variants of one model, measure them side by side, say which to run and why.

Python API (the CLI calls the same functions):

    import variantlab
    result = variantlab.bench("examples/quickstart.yaml")
    print(result.comparison.row("tpot_p50").deltas["bf16"].label())
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["bench", "load_suite", "__version__"]


def bench(suite_path, *, store=None, output_dir=None, artifacts=None, rounds=None):
    """Measure every variant of a suite file in interleaved rounds; returns the BenchResult the CLI prints.

    artifacts: a folder written by `variantlab build` whose artifacts are reused when they match;
    rounds: fresh processes per variant (default: the suite's `rounds`)."""
    from .measure.runner import run_bench
    return run_bench(suite_path, store_path=store, output_dir=output_dir, artifacts_dir=artifacts, rounds=rounds)


def load_suite(path):
    from .suite import load_suite as _load
    return _load(path)
