"""A round in turns against one process after another: the same A/A suite, both ways, run by run.

The A/A suite of aa_false_positives.py (three identical fp32 variants of the reference model, single-stream 16
requests and offline batch 8) is run `--pairs` times with `interleave: requests` and as often with
`interleave: processes`, alternating A B B A, at `--rounds` rounds. Prints per run each single-stream median
row's value per variant and the largest gap between identical variants in any median row; then, per mode, the
median of those largest gaps, and per row the ratio turns ÷ processes of the runs' values (the median over
runs and variants): what taking turns changes in the figures themselves (1.00: nothing). "Over chance":
the single-stream median rows whose gap passed what chance alone gives (aa_false_positives.chance_gap).

    python benchmarks/interleave_modes.py [--pairs 4] [--rounds 3] [--keep DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aa_false_positives import SUITE, chance_gap, median_gap  # noqa: E402 - the one A/A suite, beside this script

ROWS = ("e2el_p50", "ttft_p50", "tpot_p50", "itl_p50")
MODES = ("requests", "processes")


def single_stream_medians(comparison) -> dict[str, dict[str, float]]:
    """Row label → variant → value (ms), for the single-stream median rows."""
    out = {}
    for row in comparison.rows:
        if row.is_timing and row.key.endswith(ROWS) and row.key.startswith("single-stream."):
            out[row.label.split(" [")[0]] = {n: 1e3 * c.value for n, c in row.cells.items()
                                             if c is not None and c.value}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4, help="runs of each mode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", default=None, help="keep the runs and their store in this folder")
    args = ap.parse_args()
    import yaml

    from variantlab.measure.plan import plan_suite_file
    from variantlab.measure.runner import run_build
    from variantlab.pipeline import run_plan

    gaps: dict[str, list[float]] = {m: [] for m in MODES}
    over: dict[str, list[int]] = {m: [] for m in MODES}
    values: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        plans = {}
        for mode in MODES:
            suite = dict(SUITE, interleave=mode, output={"dir": f"{tmp}/runs", "store": f"{tmp}/s.sqlite"})
            path = tmp / f"{mode}.yaml"
            path.write_text(yaml.safe_dump(suite))
            plans[mode] = plan_suite_file(path).with_rounds(args.rounds)
        run_build(plans[MODES[0]], f"{tmp}/artifacts")     # built once; every run reuses the artifacts
        for i in range(args.pairs):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                t0 = time.perf_counter()
                result = run_plan(plans[mode], artifacts_dir=f"{tmp}/artifacts")
                gap, where = median_gap(result.comparison)
                gaps[mode].append(gap)
                over[mode].append(chance_gap(str(tmp / "s.sqlite"), result.run_id)[3])
                rows = single_stream_medians(result.comparison)
                for label, cells in rows.items():
                    values[mode].setdefault(label, []).extend(cells.values())
                print(f"pair {i + 1} {mode:<9} ({time.perf_counter() - t0:.0f} s): largest median gap {gap:.1f}% "
                      f"({where}), {over[mode][-1]} of 4 rows over chance; " + "; ".join(f"{label} " + "/".join(f"{v:.2f}" for v in cells.values()) + " ms"
                                                  for label, cells in rows.items()), flush=True)
    print(f"\nA/A suite at rounds {args.rounds}, {args.pairs} runs of each mode, alternating")
    for mode in MODES:
        print(f"interleave: {mode:<9} largest median gap per run: median {statistics.median(gaps[mode]):.1f}%, "
              f"worst {max(gaps[mode]):.1f}%; single-stream median rows over chance: {sum(over[mode])} of "
              f"{4 * len(over[mode])}")
    for label in values[MODES[0]]:
        ratio = statistics.median(values["requests"][label]) / statistics.median(values["processes"][label])
        print(f"{label}: turns ÷ processes {ratio:.3f}")


if __name__ == "__main__":
    main()
