"""Repeatability of `variantlab bench`: run a suite N times, print wall time and run-to-run spread.

For each variant: the output throughput (median over the run's passes) of every run, and its
coefficient of variation across runs — how far two runs of the same command disagree.

    python benchmarks/quickstart_repeat.py [examples/quickstart.yaml] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import variantlab
from variantlab.report.markdown import comparison_markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", nargs="?", default="examples/quickstart.yaml")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    per_variant: dict[str, list[float]] = {}
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            t0 = time.perf_counter()
            result = variantlab.bench(args.suite, store=f"{tmp}/store.sqlite", output_dir=tmp)
            walls.append(time.perf_counter() - t0)
            row = result.comparison.row("offline.output_throughput")
            for v, est in row.cells.items():
                if est is not None and est.value is not None:
                    per_variant.setdefault(v, []).append(est.value)
            print(f"run {i + 1}: {walls[-1]:.1f} s wall; output throughput "
                  + ", ".join(f"{v} {row.cells[v].value:.1f} tok/s" for v in row.cells if row.cells[v]))
    print("\nlast run's table:\n" + comparison_markdown(result.comparison))
    print(f"wall time per run: median {statistics.median(walls):.1f} s (min {min(walls):.1f}, max {max(walls):.1f})")
    for v, xs in per_variant.items():
        cv = statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else float("nan")
        print(f"{v}: output throughput across {len(xs)} runs: mean {statistics.mean(xs):.1f} tok/s, CV {100 * cv:.1f}%")


if __name__ == "__main__":
    main()
