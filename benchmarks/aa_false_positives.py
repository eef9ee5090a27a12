"""False positives of the timing verdicts: an A/A suite (identical variants) run again and again.

Three variants that are all plain fp32 of the shipped reference model are benchmarked several
times, with and without a background load that switches on and off every few seconds (CPU-burning
processes this script starts, pauses and resumes itself), for `rounds: 1` (each variant measured once,
one after another: what variantlab did before interleaved rounds) and for the default rounds. Any
timing difference called significant between identical variants is a false positive; at the 95%
level the share should be at most 5%. The four conditions are interleaved run by run, so that
whatever the machine does over the minutes lands on all of them.

    python benchmarks/aa_false_positives.py [--runs 4] [--rounds 5] [--period 3]

Prints, per condition: the timing comparisons judged, how many were called significant, the share
with its 95% Wilson interval, and those with no verdict (single samples, too few requests).
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

import variantlab
from variantlab.measure.plan import available_cores, plan_suite_file
from variantlab.measure.runner import run_build
from variantlab.pipeline import run_plan
from variantlab.suite import DEFAULT_ROUNDS

SUITE = {
    "name": "aa", "model": "builtin:tiny-structured", "baseline": "a",
    "variants": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
    "workload": {"dataset": {"generator": "structured", "n": 32, "seed": 0}, "max_new_tokens": 24,
                 "scenarios": [{"type": "single-stream", "requests": 16, "warmup": 2},
                               {"type": "offline", "batch_size": 16, "passes": 2, "warmup": 1}],
                 "accuracy": {"samples": 0, "graded": 0}},
}


class Load:
    """CPU burners, one per core, paused and resumed every `period` seconds while switched on."""

    def __init__(self, period: float):
        self.period = period
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(available_cores())]
        self._pause()
        self._on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._toggle, daemon=True)
        self._thread.start()

    def _signal(self, sig) -> None:
        for p in self.procs:
            os.kill(p.pid, sig)

    def _pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def _toggle(self) -> None:
        running = False
        while not self._stop.is_set():
            want = self._on.is_set() and not running
            if want:
                self._signal(signal.SIGCONT)
            elif running:
                self._pause()
            running = want
            self._stop.wait(self.period)

    def on(self) -> None:
        self._on.set()

    def off(self) -> None:
        self._on.clear()
        time.sleep(self.period * 1.1)   # the toggler pauses the burners within one period

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for p in self.procs:
            p.kill()
            p.wait()


def judged(comparison) -> tuple[int, int, int]:
    """(interval excludes 0, with an interval, without one) over the timing rows, for every variant but
    the baseline. With rounds that is the verdict variantlab prints; with one round variantlab prints no
    verdict (it cannot tell drift from a difference), and this counts what its interval would claim."""
    sig = total = none = 0
    for row in comparison.rows:
        if not row.is_timing:
            continue
        for v, d in row.deltas.items():
            if v == comparison.baseline or d is None or d.pct is None:
                continue
            if d.low is None or d.high is None:
                none += 1
            else:
                total += 1
                sig += bool(d.low > 0.0 or d.high < 0.0)
    return sig, total, none


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="runs of the A/A suite per condition")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="the default rounds to compare with 1")
    ap.add_argument("--period", type=float, default=3.0, help="seconds the load stays on, then off")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--conditions", default="1:off,R:off,1:on,R:on",
                    help="rounds:load pairs to run, interleaved (R: the --rounds)")
    ap.add_argument("--keep", default=None, help="keep the runs and their store in this folder")
    ap.add_argument("--verbose", action="store_true", help="print every comparison called significant")
    args = ap.parse_args()
    conditions = [(args.rounds if r == "R" else int(r), load == "on")
                  for r, load in (c.split(":") for c in args.conditions.split(","))]
    counts = {c: [0, 0, 0] for c in conditions}
    walls = {c: [] for c in conditions}
    load = Load(args.period)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = args.keep or scratch
            Path(tmp).mkdir(parents=True, exist_ok=True)
            suite = dict(SUITE, threads=args.threads, output={"dir": f"{tmp}/runs", "store": f"{tmp}/s.sqlite"})
            path = Path(tmp) / "aa.yaml"
            path.write_text(yaml.safe_dump(suite))
            plan = plan_suite_file(path)
            run_build(plan, f"{tmp}/artifacts")     # built once; every run reuses the artifacts
            for i in range(args.runs):
                for rounds, loaded in conditions:
                    (load.on if loaded else load.off)()
                    t0 = time.perf_counter()
                    result = run_plan(plan.with_rounds(rounds), artifacts_dir=f"{tmp}/artifacts")
                    walls[(rounds, loaded)].append(time.perf_counter() - t0)
                    for k, x in enumerate(judged(result.comparison)):
                        counts[(rounds, loaded)][k] += x
                    s, n, _ = judged(result.comparison)
                    print(f"run {i + 1}: rounds {rounds}, load {'on ' if loaded else 'off'}: {s}/{n} timing "
                          f"comparisons called significant ({walls[(rounds, loaded)][-1]:.0f} s, "
                          f"run {result.run_id})", flush=True)
                    if args.verbose:
                        for row in result.comparison.rows:
                            for v, d in row.deltas.items():
                                if row.is_timing and d is not None and d.significant:
                                    print(f"    {row.label} {v}: {d.label()} ({d.method})", flush=True)
    finally:
        load.close()
    print(f"\nA/A suite: 3 identical fp32 variants of the reference model, {args.runs} runs per condition, "
          f"load {args.period:g} s on / {args.period:g} s off on {available_cores()} cores "
          f"(variantlab {variantlab.__version__})")
    print(f"{'rounds':>6} {'load':>5} {'significant':>12} {'share':>7} {'95% interval':>16} {'no verdict':>11} "
          f"{'wall/run':>9}")
    for (rounds, loaded), (s, n, none) in counts.items():
        lo, hi = wilson(s, n)
        share = s / n if n else math.nan
        wall = sum(walls[(rounds, loaded)]) / len(walls[(rounds, loaded)])
        print(f"{rounds:>6} {'on' if loaded else 'off':>5} {s:>5} / {n:<5} {100 * share:>6.1f}% "
              f"[{100 * lo:5.1f}, {100 * hi:5.1f}]% {none:>11} {wall:>8.0f}s")
    print("goal: at most 5% at the 95% level with the load on, at the default rounds")


if __name__ == "__main__":
    main()
