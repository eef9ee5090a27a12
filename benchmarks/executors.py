"""Sweep wall time with the local executor and with the Ray executor: the same 6-variant suite, run
again and again, the two executors interleaved (local, ray, local, ray, …) so that whatever the
machine does over the minutes lands on both.

    python benchmarks/executors.py [--pairs 2] [--rounds 1]

Each sweep builds 6 variants of the shipped reference model and measures them `rounds` times, each job
in a fresh worker process. The ray executor starts a local Ray cluster of this machine's cores once
(as `variantlab bench --executor ray` does each time; its start is timed apart) and runs every job as a
Ray task; with `threads` at its default (every core) one job runs at a time on either executor, so
the difference is what Ray adds per job. Prints each sweep's wall time, the mean of each executor, the
ray/local ratio and Ray's fixed overhead per job and per sweep.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

import variantlab
from variantlab.measure.plan import available_cores

VARIANTS = [{"name": "fp32"}, {"name": "bf16", "recipe": "bf16"}, {"name": "int8", "recipe": "int8"},
            {"name": "int4", "recipe": "int4"}, {"name": "gqa", "attention": "gqa:2"},
            {"name": "int8-gqa", "recipe": "int8", "attention": "gqa:2"}]


def suite_file(folder: Path, rounds: int) -> Path:
    suite = {"name": "sweep", "model": "builtin:tiny-structured", "variants": VARIANTS, "rounds": rounds,
             "workload": {"dataset": {"generator": "structured", "n": 16, "seed": 0}, "max_new_tokens": 8,
                          "scenarios": [{"type": "single-stream", "requests": 4, "warmup": 1}],
                          "accuracy": {"samples": 4, "graded": 4}},
             "output": {"dir": str(folder / "runs"), "store": str(folder / "store.sqlite")}}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    import ray

    from variantlab.measure.ray_executor import RayExecutor
    t = time.perf_counter()
    ray.init(num_cpus=available_cores(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    start_s = time.perf_counter() - t
    jobs = len(VARIANTS) * (1 + args.rounds)
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    colds: dict[str, list[float]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory() as tmp:
        suite = suite_file(Path(tmp), args.rounds)
        for i in range(args.pairs):
            for name in ("local", "ray"):
                executor = RayExecutor() if name == "ray" else None
                t = time.perf_counter()
                result = variantlab.bench(suite, executor=executor)
                walls[name].append(time.perf_counter() - t)
                bad = {n: s for n, s in result.comparison.status.items() if s != "ok"}
                cold = [c.value for c in result.comparison.row("cold_start.total").cells.values() if c]
                colds[name] += cold
                print(f"pair {i + 1} {name:5s}: {walls[name][-1]:6.1f} s  ({jobs} jobs; mean cold start "
                      f"{statistics.mean(cold):.2f} s{'; not ok: ' + str(bad) if bad else ''})", flush=True)
    ray.shutdown()
    local, on_ray = statistics.mean(walls["local"]), statistics.mean(walls["ray"])
    print(f"\n6-variant sweep, {args.rounds} round(s), {jobs} jobs a sweep, {args.pairs} pairs interleaved:")
    print(f"  local {local:.1f} s   ray {on_ray:.1f} s   ray/local {on_ray / local:.3f}")
    print(f"  a worker's cold start (process start -> first token), mean: local "
          f"{statistics.mean(colds['local']):.2f} s, ray {statistics.mean(colds['ray']):.2f} s")
    print(f"  ray adds {on_ray - local:+.1f} s a sweep ({(on_ray - local) / jobs * 1000:+.0f} ms a job), plus "
          f"{start_s:.1f} s to start a local cluster once per bench")


if __name__ == "__main__":
    main()
