"""False positives of the timing verdicts: an A/A suite (identical variants) run again and again.

Three variants that are all plain fp32 of the shipped reference model (`a`, `b`, `c`) are benchmarked
several times, with and without a background load that switches on and off every few seconds (CPU-burning
processes this script starts, pauses and resumes itself; by default one, on one core, as issue 50's run had),
for each rounds count asked (by default 3 and 5). Any timing difference called significant between identical
variants is a false positive; at the 95% level the share should be at most 5%, and no identical variant's
median should sit more than 5% from another's. The conditions are interleaved run by run, so that whatever
the machine does over the minutes lands on all of them.

    python benchmarks/aa_false_positives.py [--runs 6] [--conditions 3:off,3:on,5:off,5:on] [--period 4]
        [--load-cores 1] [--isa avx2] [--trace]

`--reanalyse DIR [DIR ...]` (folders kept with `--keep`) judges the runs they hold again with today's
statistics, beside the verdicts stored when they ran: the same measurements, the statistics before and after.

`--isa avx2` runs the AVX2 kernels (ours and torch's: VARIANTLAB_ISA and ATEN_CPU_CAPABILITY, set before
anything imports torch) on an AVX-512 host, as an AVX2 machine runs them. `--trace` prints, for every variant
and round, what share of its timed single-stream requests the load was on for, and its median E2EL: the
round order against the load's phase.

Prints, per condition: the timing comparisons judged, how many were called significant, the share with its
95% Wilson interval, those with no verdict (too few requests for a percentile, a warning that the rounds
cannot separate the noise), the largest gap between identical variants in any median row, and how many
single-stream median rows had a gap between pooled medians beyond what chance alone gives in 95% of draws
(each variant's requests drawn again, as many, from all of them together: the requests' own spread).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SUITE = {
    "name": "aa", "model": "builtin:tiny-structured", "baseline": "a",
    "variants": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
    "workload": {"dataset": {"generator": "structured", "n": 32, "seed": 0}, "max_new_tokens": 24,
                 "scenarios": [{"type": "single-stream", "requests": 16, "warmup": 2},
                               {"type": "offline", "batch_size": 8, "passes": 2, "warmup": 1}],
                 "accuracy": {"samples": 0, "graded": 0}},
}


class Load:
    """`cores` CPU burners, resumed for `period` seconds and paused for `period` while switched on; the times
    each phase began (time.perf_counter, CLOCK_MONOTONIC: the workers' request times are on the same clock)."""

    def __init__(self, period: float, cores: int):
        self.period = period
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
        self._signal(signal.SIGSTOP)
        self.phases: list[tuple[float, bool]] = [(time.perf_counter(), False)]   # (since, running)
        self._on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._toggle, daemon=True)
        self._thread.start()

    def _signal(self, sig) -> None:
        for p in self.procs:
            os.kill(p.pid, sig)

    def _toggle(self) -> None:
        running = False
        while not self._stop.is_set():
            want = self._on.is_set() and not running
            if want != running:
                self._signal(signal.SIGCONT if want else signal.SIGSTOP)
                self.phases.append((time.perf_counter(), want))
            running = want
            self._stop.wait(self.period)

    def running_share(self, start: float, end: float) -> float:
        """The share of [start, end] the burners ran for."""
        if end <= start:
            return float(self.running_at(start))
        edges = self.phases + [(math.inf, False)]
        on = sum(max(0.0, min(end, nxt) - max(start, since))
                 for (since, running), (nxt, _) in zip(edges, edges[1:]) if running)
        return on / (end - start)

    def running_at(self, t: float) -> bool:
        return self.phase_at(t)[1]

    def phase_at(self, t: float) -> tuple[float, bool]:
        """(seconds since the phase that holds t began, whether the burners ran in it)."""
        since, running = next(((since, running) for since, running in reversed(self.phases) if since <= t),
                              (self.phases[0][0], False))
        return t - since, running

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
            if d.low is None or d.high is None or d.significant is None:
                none += 1
            else:
                total += 1
                sig += bool(d.significant)
    return sig, total, none


def median_gap(comparison) -> tuple[float, str]:
    """The largest gap, in %, between two identical variants' values in a median row (p50, or a median
    statistic), and where."""
    worst, where = 0.0, ""
    for row in comparison.rows:
        if not row.is_timing or not ("p50" in row.key or "median" in row.label.lower()):
            continue
        values = {n: e.value for n, e in row.cells.items() if e is not None and e.value}
        for x, vx in values.items():
            for y, vy in values.items():
                gap = 100.0 * abs(vy / vx - 1.0)
                if x < y and gap > worst:
                    worst, where = gap, f"{row.label} {x}/{y}"
    return worst, where


def request_figures(record) -> dict[str, list[float]]:
    """A measurement's single-stream figures request by request (token gap by token gap for ITL)."""
    out = next((o for o in record.outputs if o.kind == "single-stream"), None)
    reqs = [r for p in (out.data.get("passes", ()) if out and not out.error else ()) for r in p.get("records", ())
            if not r.get("error") and r.get("token_times")]
    ttft = [r["token_times"][0] - r["send_time"] for r in reqs]
    return {"E2EL p50": [r["end_time"] - r["send_time"] for r in reqs], "TTFT p50": ttft,
            "TPOT p50": [(r["end_time"] - r["token_times"][0]) / (len(r["token_times"]) - 1)
                         for r in reqs if len(r["token_times"]) > 1],
            "ITL p50": [b - a for r in reqs for a, b in zip(r["token_times"], r["token_times"][1:])]}


def chance_gap(store_path: str, run_id: str, draws: int = 2000, seed: int = 0) -> tuple[float, float, str, int]:
    """Between identical variants' pooled single-stream medians (every round's requests together), per row: the
    largest gap, in %, and the gap chance alone gives in 95% of draws (each variant's requests drawn again, as
    many, from every variant's pooled together: a bootstrap of the null that they are one distribution). Returns
    the row with the largest gap: (its gap, its chance bound, its name), and how many rows passed their bound.
    A gap under the bound is the requests' own spread, not a difference a better bench could remove."""
    import numpy as np

    from variantlab.store import Store
    per: dict[str, dict[str, list[float]]] = {}
    with Store(store_path) as store:
        for rec in store.records(run_id, kind="measure"):
            for row, xs in request_figures(rec).items():
                per.setdefault(row, {}).setdefault(rec.variant, []).extend(xs)
    rng = np.random.default_rng(seed)
    rows = []
    for row, by_variant in per.items():
        sets = [np.asarray(v) for v in by_variant.values() if len(v)]
        if len(sets) < 2:
            continue
        medians = [np.median(x) for x in sets]
        pooled = np.concatenate(sets)
        null = np.array([np.median(rng.choice(pooled, (draws, len(x))), axis=1) for x in sets])
        null_gap = 100 * (null.max(axis=0) / null.min(axis=0) - 1)
        rows.append((float(100 * (max(medians) / min(medians) - 1)), float(np.quantile(null_gap, 0.95)), row))
    if not rows:
        return 0.0, 0.0, "", 0
    gap, bound, row = max(rows)
    return gap, bound, row, sum(g > b for g, b, _ in rows)


def trace(store_path: str, run_id: str, load: Load) -> list[str]:
    """Per variant and round: the share of its timed single-stream requests sent while the load ran, and their
    median E2EL."""
    from variantlab.store import Store

    lines = []
    with Store(store_path) as store:
        for rec in store.records(run_id, kind="measure"):
            out = next((o for o in rec.outputs if o.kind == "single-stream"), None)
            if out is None or out.error:
                continue
            reqs = [r for p in out.data.get("passes", ()) for r in p.get("records", ())]
            if not reqs:
                continue
            shares = [load.running_share(r["send_time"], r["end_time"]) for r in reqs]
            e2el = sorted(r["end_time"] - r["send_time"] for r in reqs)
            into, running = load.phase_at(reqs[0]["send_time"])
            lines.append(f"    round {rec.round} {rec.variant}: load ran {100 * sum(shares) / len(shares):3.0f}% of its "
                         f"requests' time (began {into:.1f} s into an {'on' if running else 'off'} phase), E2EL p50 "
                         f"{1e3 * e2el[len(e2el) // 2]:.1f} ms, mean {1e3 * sum(e2el) / len(e2el):.1f} ms")
    return lines


def reanalyse_kept(folders: list[str], conditions: str) -> None:
    """The runs kept in `folders`, judged as stored and afresh, per condition (conditions.json, else the runs in
    the order they were made, cycling through `conditions`)."""
    from variantlab.measure.analysis import Comparison
    from variantlab.measure.runs import reanalyse
    from variantlab.store import Store

    cycle = [(int(r), load == "on") for r, load in (c.split(":") for c in conditions.split(","))]
    table: dict[tuple, list] = {}
    for folder in map(Path, folders):
        kept = folder / "conditions.json"
        known = json.loads(kept.read_text()) if kept.is_file() else {}
        with Store(folder / "s.sqlite") as store:
            rows = sorted(store.runs(limit=10_000), key=lambda r: r.created)
            for i, row in enumerate(rows):
                if row.status != "done":
                    continue
                rounds, loaded = known.get(row.run_id, cycle[i % len(cycle)])
                stored, afresh = Comparison.from_json(row.comparison), reanalyse(store, row)[0]
                counts = table.setdefault((rounds, loaded), [[0, 0, 0], [0, 0, 0], 0.0, 0, 0])
                for k, comparison in enumerate((stored, afresh)):
                    for j, x in enumerate(judged(comparison)):
                        counts[k][j] += x
                counts[2] = max(counts[2], median_gap(afresh)[0])
                counts[3] += 1
                counts[4] += chance_gap(str(folder / "s.sqlite"), row.run_id)[3]
    print(f"{'rounds':>6} {'load':>5} {'runs':>5} {'as stored':>22} {'today':>22} {'median gap':>11} "
          f"{'over chance':>12}")
    for (rounds, loaded), (was, now, gap, runs, over) in sorted(table.items()):
        cells = []
        for s_, n, _ in (was, now):
            lo, hi = wilson(s_, n)
            cells.append(f"{s_:>3}/{n:<4} {100 * s_ / max(n, 1):4.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]")
        print(f"{rounds:>6} {'on' if loaded else 'off':>5} {runs:>5} {cells[0]:>22} {cells[1]:>22} {gap:>10.1f}% "
              f"{over:>5} / {4 * runs:<4}")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6, help="runs of the A/A suite per condition")
    ap.add_argument("--conditions", default="3:off,3:on,5:off,5:on",
                    help="rounds:load pairs to run, interleaved run by run")
    ap.add_argument("--period", type=float, default=4.0, help="seconds the load stays on, then off")
    ap.add_argument("--load-cores", type=int, default=1, help="cores the switching load burns (default 1)")
    ap.add_argument("--isa", default=None, help="force these kernels (avx2: what an AVX2 machine runs)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--interleave", choices=("requests", "processes"), default="requests",
                    help="the suite's interleave: variants taking turns request by request (the default), or one "
                         "process after another")
    ap.add_argument("--keep", default=None, help="keep the runs and their store in this folder")
    ap.add_argument("--verbose", action="store_true", help="print every comparison called significant")
    ap.add_argument("--trace", action="store_true", help="print each round's load share and median E2EL")
    ap.add_argument("--reanalyse", nargs="+", metavar="DIR", help="judge the runs kept in these folders again")
    args = ap.parse_args()
    if args.reanalyse:
        reanalyse_kept(args.reanalyse, args.conditions)
        return
    if args.isa:   # before anything imports torch or our kernels, so that this process and its workers agree
        os.environ["VARIANTLAB_ISA"] = args.isa
        os.environ["ATEN_CPU_CAPABILITY"] = args.isa.lower().replace("-", "")
    import yaml

    import variantlab
    from variantlab.measure.plan import available_cores, plan_suite_file
    from variantlab.measure.runner import run_build
    from variantlab.pipeline import run_plan
    from variantlab.variants import kernels

    conditions = [(int(r), load == "on") for r, load in (c.split(":") for c in args.conditions.split(","))]
    counts = {c: [0, 0, 0] for c in conditions}
    walls = {c: [] for c in conditions}
    gaps = {c: (0.0, "") for c in conditions}
    chance: dict[tuple, list[int]] = {c: [] for c in conditions}
    load = Load(args.period, args.load_cores)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = args.keep or scratch
            Path(tmp).mkdir(parents=True, exist_ok=True)
            suite = dict(SUITE, threads=args.threads, interleave=args.interleave,
                         output={"dir": f"{tmp}/runs", "store": f"{tmp}/s.sqlite"})
            path = Path(tmp) / "aa.yaml"
            path.write_text(yaml.safe_dump(suite))
            plan = plan_suite_file(path)
            print(f"kernels: {kernels.prepare().reason}", flush=True)
            run_build(plan, f"{tmp}/artifacts")     # built once; every run reuses the artifacts
            for i in range(args.runs):
                for rounds, loaded in conditions:
                    (load.on if loaded else load.off)()
                    t0 = time.perf_counter()
                    result = run_plan(plan.with_rounds(rounds), artifacts_dir=f"{tmp}/artifacts")
                    walls[(rounds, loaded)].append(time.perf_counter() - t0)
                    kept = Path(tmp) / "conditions.json"
                    known = json.loads(kept.read_text()) if kept.is_file() else {}
                    kept.write_text(json.dumps(known | {result.run_id: [rounds, loaded]}))
                    s, n, none = judged(result.comparison)
                    for k, x in enumerate((s, n, none)):
                        counts[(rounds, loaded)][k] += x
                    gap = median_gap(result.comparison)
                    gaps[(rounds, loaded)] = max(gaps[(rounds, loaded)], gap)
                    pooled, by_chance, row, over = chance_gap(suite["output"]["store"], result.run_id)
                    chance[(rounds, loaded)].append(over)
                    print(f"run {i + 1}: rounds {rounds}, load {'on ' if loaded else 'off'}: {s}/{n} timing "
                          f"comparisons called significant, largest median gap {gap[0]:.1f}% ({gap[1]}); "
                          f"{row} {pooled:.1f}% where chance alone gives up to {by_chance:.1f}%, {over} of 4 rows "
                          f"over chance ({walls[(rounds, loaded)][-1]:.0f} s, run {result.run_id})", flush=True)
                    if args.verbose:
                        for row in result.comparison.rows:
                            for v, d in row.deltas.items():
                                if row.is_timing and d is not None and d.significant:
                                    print(f"    {row.label} {v}: {d.label()} ({d.method})", flush=True)
                    if args.trace:
                        print("\n".join(trace(suite["output"]["store"], result.run_id, load)), flush=True)
    finally:
        load.close()
    from variantlab.variants.kernels import ISA_NAME
    print(f"\nA/A suite: 3 identical fp32 variants of the reference model, {args.runs} runs per condition, "
          f"load on {args.load_cores} of {available_cores()} cores, {args.period:g} s on / {args.period:g} s off; "
          f"kernels {ISA_NAME}, torch {os.environ.get('ATEN_CPU_CAPABILITY', 'default')} "
          f"(variantlab {variantlab.__version__})")
    print(f"{'rounds':>6} {'load':>5} {'significant':>12} {'share':>7} {'95% interval':>16} {'no verdict':>11} "
          f"{'median gap':>11} {'over chance':>12} {'wall/run':>9}")
    for (rounds, loaded), (s, n, none) in counts.items():
        lo, hi = wilson(s, n)
        share = s / n if n else math.nan
        wall = sum(walls[(rounds, loaded)]) / len(walls[(rounds, loaded)])
        print(f"{rounds:>6} {'on' if loaded else 'off':>5} {s:>5} / {n:<5} {100 * share:>6.1f}% "
              f"[{100 * lo:5.1f}, {100 * hi:5.1f}]% {none:>11} {gaps[(rounds, loaded)][0]:>10.1f}% "
              f"{sum(chance[(rounds, loaded)]):>5} / {4 * len(chance[(rounds, loaded)]):<4} "
              f"{wall:>8.0f}s")
    print("goal: at most 5% significant over at least 200 comparisons at rounds 3 with the load on, "
          "and no median gap over 5%")
    print("over chance: single-stream median rows (E2EL, TTFT, TPOT, ITL p50; 4 a run) whose largest gap between "
          "pooled medians passed what chance alone gives in 95% of draws (each variant's requests drawn again from "
          "all of them): about 5% of rows by chance")


if __name__ == "__main__":
    main()
