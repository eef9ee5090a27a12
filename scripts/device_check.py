"""The GPU device check: every CUDA path of variantlab, run as one bounded command, summed up in one report.

    bash scripts/device_check.sh                      # on the GPU machine (DEVELOPERS.md: the `run` call)
    DEVICE_CHECK_DRY=1 bash scripts/device_check.sh   # anywhere: the CPU-possible parts, quickly

Steps, in order of what matters most; each is a subprocess under its own time limit inside one overall
budget (DEVICE_CHECK_BUDGET_S, default 480 s). A step that fails or runs out of time is recorded with
the tail of its output and the next one runs; steps past the budget are recorded as not run.

1. environment  versions against our pins (torch 2.13, transformers 5.23), the GPU, driver, CUDA,
                cuSPARSELt, the torch APIs our recipes call, every variantlab module imported
2. cuda-tests   pytest over tests/**/test_cuda_*.py (the tests marked `cuda`)
3. hw           `variantlab hw` (--json too): facts, ceilings, kernel times, the configuration
4. bench-llama  a random-weight 115M-parameter Llama: bf16, fp16, int8, int4, w8a8, w4a8, sparse,
                gqa:4, compiled bf16 and `recipe: auto`, 2 interleaved rounds
5. explain      `variantlab explain` of bf16 against int4 from that run (device time per operator)
6. serve        `variantlab serve --devices cuda:0` (adaptive: its calibration on the GPU), a few requests
7. bench-reference  the shipped reference model: fp32, bf16, int4, sparse, 2 rounds (accuracy on CUDA)
8. cpu-kernels  our CPU kernels' tests (kernels, decode step, decode kernels) on the machine's own CPU, whose
                instruction set the report names: a GPU machine's server CPU may have the AVX-512 our own
                machines have lacked for sessions (there the AVX-512 kernels run on an emulated CPU: right,
                not fast); last, so the CUDA steps keep their time. Dry, test_kernels.py alone

Without CUDA (or DEVICE_CHECK_DRY=1) the same steps run on the CPU where they can — smaller models,
fewer variants, one round — and the report says which were skipped for lack of CUDA. Our CPU kernels stay
off (VARIANTLAB_KERNELS=0) in every step but cpu-kernels: the other steps are about CUDA.

Writes into --out: device_check.md (the summary), device_check.json (the same as data), steps.log
(every command and its whole output), hw.json, bench-llama.json, bench-reference.json, explain.md:
seven files, one folder, as the device tool brings back (at most 8 files, 2 folders deep).
Standard library only (variantlab runs in the steps' subprocesses): the driver runs even where a package
is missing, and says so. device_check_run.py runs commands under their limits, device_check_steps.py and
device_check_serve.py are the steps, this file orders them and writes the report.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # its sibling modules, also when imported by path
from device_check_run import ROOT, Check, Ran, StepResult, Stopped, run, stop_on_signals  # noqa: E402,F401
from device_check_serve import step_serve   # noqa: E402
from device_check_steps import (make_llama, probe, step_bench_llama, step_bench_reference, step_cpu_kernels,
                                step_cuda_tests, step_environment, step_explain, step_hw)   # noqa: E402

# name, step, and the most seconds it may take on the device; dry, a step may take whatever the budget has
# left (on 2 busy CPU cores, profiling the stand-in model in `explain` took 93-113 s, measuring the CPU's
# kernel times in `hw` 63 s once per machine, and a bench of two variants 100 s at a load average of 7)
STEPS = (("environment", step_environment, 30), ("cuda-tests", step_cuda_tests, 120), ("hw", step_hw, 60),
         ("bench-llama", step_bench_llama, 180), ("explain", step_explain, 60), ("serve", step_serve, 45),
         ("bench-reference", step_bench_reference, 90), ("cpu-kernels", step_cpu_kernels, 120))
MIN_STEP_S = 20.0        # a step is not started with less than this left of the budget
DRY_SKIPS = ("the tests marked cuda (collected, each skipped with its reason); the 115M-parameter Llama (a 2-layer "
             "stand-in runs instead); the recipes but fp32 and bf16 (sparse is CUDA only); gqa, compile: true and "
             "recipe: auto in the bench; two rounds (one here); serving on cuda:0 (the CPU serves)")



def report(check: Check, finished: bool) -> None:
    """Write device_check.md and device_check.json from the results so far (after every step)."""
    env = next((r for r in check.results if r.name == "environment"), None)
    gpu = (env.figures.get("gpu") or {}).get("name") if env else None
    elapsed = time.monotonic() - check.start
    counts: dict[str, int] = {}
    for r in check.results:
        counts[r.status.split(":")[0]] = counts.get(r.status.split(":")[0], 0) + 1
    head = [f"# variantlab device check, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "",
            f"- mode: {'dry: no CUDA here, the CPU-possible parts on the CPU' if check.dry else 'device: CUDA'}"
            f" ({gpu or 'no GPU'}); our CPU kernels off (VARIANTLAB_KERNELS=0) but in cpu-kernels",
            *([f"- skipped for lack of CUDA: {DRY_SKIPS}"] if check.dry else []),
            f"- {elapsed:.0f} s of a {check.budget_s:.0f} s budget" + ("" if finished else " (still running)")
            + "; " + ", ".join(f"{n} {k}" for k, n in counts.items()),
            "- files: device_check.json (this, as data), steps.log (every command's whole output), hw.json, "
            "bench-llama.json, bench-reference.json (results, schema variantlab.results/1), explain.md",
            "", "| step | status | seconds | key figures |", "|---|---|---|---|"]
    head += [f"| {r.name} | {r.status} | {r.seconds:.1f} | {r.summary.replace('|', '/')} |" for r in check.results]
    body = []
    for r in check.results:
        body += ["", f"## {r.name}: {r.status}", *r.details]
        if r.tail:
            body += ["", "```", r.tail.rstrip(), "```"]
    (check.out / "device_check.md").write_text("\n".join(head + body) + "\n")
    (check.out / "device_check.json").write_text(json.dumps(
        {"mode": "dry" if check.dry else "device", "budget_s": check.budget_s, "elapsed_s": elapsed,
         "finished": finished, "steps": [asdict(r) for r in check.results]}, indent=2, default=str))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "device_check")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder, kept (default: a temporary one, "
                    "removed at the end unless DEVICE_CHECK_KEEP=1)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--make-llama", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dry", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe()))
        return 0
    if args.make_llama:
        make_llama(args.make_llama, args.dry)
        return 0
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    own_work = args.work is None          # a scratch folder of its own, removed at the end
    work = Path(tempfile.mkdtemp(prefix="variantlab-device-check-")) if own_work else args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    wanted = {s for s in os.environ.get("DEVICE_CHECK_STEPS", "").split(",") if s}
    env = os.environ | {"VARIANTLAB_KERNELS": "0", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
                        "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error", "COLUMNS": "200"}
    check = Check(args.out, work, dry=False, budget_s=float(os.environ.get("DEVICE_CHECK_BUDGET_S", 480)), env=env)
    stop_on_signals()
    stopped = None
    with (args.out / "steps.log").open("w") as log:
        check.log = log
        try:
            stopped = run_steps(check, wanted)
        except Stopped as e:
            stopped = f"the check was ended ({e}) during step {len(check.results) + 1}; what runs was ended"
            name = STEPS[min(len(check.results), len(STEPS) - 1)][0]
            check.results.append(StepResult(name, "timed out", tail=stopped))
    report(check, finished=stopped is None)
    if own_work and os.environ.get("DEVICE_CHECK_KEEP") != "1":
        shutil.rmtree(work, ignore_errors=True)
    print((args.out / "device_check.md").read_text())
    bad = [r for r in check.results if r.status in ("failed", "timed out")]
    return 124 if stopped else 1 if bad else 0


def run_steps(check: Check, wanted: set[str]) -> None:
    """Every step in order, each within what the budget has left; the report rewritten after each."""
    for name, fn, cap in STEPS:
        if wanted and name not in wanted and name != "environment":
            check.results.append(StepResult(name, "not run: not in DEVICE_CHECK_STEPS"))
            continue
        left = check.remaining()
        if left < MIN_STEP_S:
            check.results.append(StepResult(name, f"not run: {left:.0f} s of the budget left"))
            continue
        try:
            result = fn(check, left if check.dry else min(cap, left))
        except Exception as e:  # noqa: BLE001 - the driver's own bug in one step: recorded, the rest run
            result = StepResult(name, "failed", tail=f"the check itself failed: {type(e).__name__}: {e}")
        check.results.append(result)
        if name == "environment":
            check.dry = os.environ.get("DEVICE_CHECK_DRY") == "1" or not result.figures.get("cuda_available")
        report(check, finished=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
