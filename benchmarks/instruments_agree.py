"""Do the two instruments agree? `variantlab bench` and benchmarks/decode_vs_llamacpp.py on the same variants,
in adjacent runs, their decode TPOT compared per variant (issue 25: within 5%).

The variants go in groups, one per GGUF type with the torch recipes it pairs with (F32: fp32; Q4_0: int4 and
w4a8 g32 symmetric). Each repetition, for each group, runs `variantlab bench` (one round of a suite of the
group: single-stream, 6 requests of 64 new tokens, no stop string that can occur) and decode_vs_llamacpp.py
(--script-pairs pairs per recipe of the group) back to back, on the same checkpoint and GGUF files,
alternating which goes first. The machine's memory bandwidth here moves between two levels (about 10.5 and
14 ms a token on the 115M fp32 model, for both runtimes alike) over tens of seconds, so a figure from one
instrument is compared with the other's from the adjacent minute, never with a median taken minutes away:
per variant and repetition the ratio bench TPOT p50 / script TPOT (1 / its tok/s), then the median of those
ratios with their min and max, and whether the median is within 5%.

    python benchmarks/instruments_agree.py --workdir DIR [--shape 115m] [--reps 5]
        [--recipes fp32,int4,w4a8] [--precisions F32,Q4_0] [--script-pairs 3]

--workdir: where decode_vs_llamacpp.py --workdir keeps the checkpoint and GGUFs (made here when missing).
Never part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from decode_vs_llamacpp import PAIRS, make_checkpoint  # noqa: E402


def options_of(recipe: str, ggufs: list[str]) -> dict:
    """The options decode_vs_llamacpp.py builds `recipe` with when paired with one of `ggufs` (int4 and w4a8
    with Q4_0: group 32, symmetric; with Q4_1: group 32): the bench's variant is the very same."""
    return next((dict(p.options) for p in PAIRS if p.recipe == recipe and p.gguf in ggufs), {})


def suite(model: Path, recipes: list[str], ggufs: list[str]) -> dict:
    variants = [{"name": r, "recipe": r, **({"options": o} if (o := options_of(r, ggufs)) else {})} for r in recipes]
    variants += [{"name": f"gguf-{g.lower()}", "backend": "llamacpp", "gguf_type": g} for g in ggufs]
    return {"name": f"instruments-{'-'.join(g.lower() for g in ggufs)}", "model": str(model),
            "baseline": recipes[0], "rounds": 1, "variants": variants,
            "workload": {"dataset": {"generator": "structured", "n": 8, "seed": 0}, "max_new_tokens": 64,
                         "stop": ["@@@@"], "scenarios": [{"type": "single-stream", "requests": 6, "warmup": 2}],
                         "accuracy": {"samples": 0, "graded": 0}}}


def bench_tpot(suite_path: Path, store: Path) -> dict[str, float]:
    cli = [sys.executable, "-c", "from variantlab.cli import app; app()"]
    out = subprocess.run(cli + ["bench", str(suite_path), "--store", str(store), "--json"], capture_output=True,
                         text=True, timeout=1800, cwd=suite_path.parent)
    if out.returncode:
        raise SystemExit(f"variantlab bench failed: {out.stderr.strip().splitlines()[-1:]}")
    data = json.loads(out.stdout)
    row = next(r for r in data["comparison"]["rows"] if r["key"].startswith("single-stream.tpot_p50"))
    return {name: cell["value"] for name, cell in row["cells"].items() if cell.get("value") is not None}


def script_tpot(args, model: Path) -> dict[str, float]:
    cmd = [sys.executable, str(HERE / "decode_vs_llamacpp.py"), "--model", str(model), "--workdir", str(args.workdir),
           "--pairs", str(args.script_pairs), "--recipes", args.recipes, "--precisions", args.precisions]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"decode_vs_llamacpp.py failed: {out.stderr.strip().splitlines()[-1:]}")
    got: dict[str, float] = {}
    for line in out.stdout.splitlines():
        m = re.match(r"^(\S+) <-> (\S+)(?: g\d+)?(?: sym)?\s+([\d.]+)\s+([\d.]+)\s", line)
        if m:
            got[f"gguf-{m.group(1).lower()}"] = 1 / float(m.group(3))
            got[m.group(2)] = 1 / float(m.group(4))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--shape", default="115m")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--recipes", default="fp32,int4,w4a8")
    ap.add_argument("--precisions", default="F32,Q4_0")
    ap.add_argument("--script-pairs", type=int, default=3,
                    help="pairs the script runs per repetition (its TPOT: the median over them)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = args.workdir / f"checkpoint-{args.shape}-seed0"
    if not (model / "config.json").is_file():
        make_checkpoint(model, 0, args.shape)
    recipes = args.recipes.split(",")
    groups = [(g, [r for r in recipes if any(p.recipe == r and p.gguf == g for p in PAIRS)])
              for g in args.precisions.split(",")]
    ratios: dict[str, list[float]] = {}
    tpots: dict[str, tuple[list[float], list[float]]] = {}
    for rep in range(args.reps):
        for i, (gguf, group) in enumerate(groups):
            path = args.workdir / f"instruments-{gguf.lower()}.yaml"
            path.write_text(yaml.safe_dump(suite(model, group, [gguf])))
            one = argparse.Namespace(**{**vars(args), "recipes": ",".join(group), "precisions": gguf})
            runs = {"bench": lambda: bench_tpot(path, args.workdir / "instruments.sqlite"),
                    "script": lambda: script_tpot(one, model)}
            got = {k: runs[k]() for k in (("bench", "script") if (rep + i) % 2 == 0 else ("script", "bench"))}
            for name, b in got["bench"].items():
                if name in got["script"]:
                    ratios.setdefault(name, []).append(b / got["script"][name])
                    bs, ss = tpots.setdefault(name, ([], []))
                    bs.append(b)
                    ss.append(got["script"][name])
        print(f"  repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    print(f"{args.shape}, {args.reps} repetitions of (bench, script) back to back per group; TPOT medians, ms; "
          f"ratio = median over repetitions of bench / script [min, max], its bootstrap 95% interval")
    print(f"{'variant':12} {'bench':>8} {'script':>8} {'bench/script [min, max]':>24} {'95% interval':>15}  within 5%")
    for name, rs in ratios.items():
        b, s = (statistics.median(x) for x in tpots[name])
        r = statistics.median(rs)
        lo, hi = bootstrap_median_ci(rs)
        print(f"{name:12} {1e3 * b:8.2f} {1e3 * s:8.2f} {r:>8.3f} [{min(rs):.3f}, {max(rs):.3f}] "
              f"  [{lo:.3f}, {hi:.3f}]  {'yes' if abs(r - 1) <= 0.05 else 'NO'}")
    print("each repetition's bench / script (to pool runs):")
    for name, rs in ratios.items():
        print(f"  {name}: {' '.join(f'{x:.3f}' for x in rs)}")
    # What each instrument says of ours against llama.cpp, within one run of it: the host's drift cancels there.
    pairs = [(p.recipe, f"gguf-{p.gguf.lower()}") for p in PAIRS
             if p.recipe in tpots and f"gguf-{p.gguf.lower()}" in tpots]
    if pairs:
        print("ours ÷ llama.cpp TPOT as each instrument measures it (median over repetitions; within one run):")
        for ours, peer in pairs:
            by = [statistics.median(o / q for o, q in zip(tpots[ours][k], tpots[peer][k])) for k in (0, 1)]
            print(f"  {ours} ÷ {peer}: bench {by[0]:.3f}, script {by[1]:.3f}, bench/script {by[0] / by[1]:.3f}")


def bootstrap_median_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


if __name__ == "__main__":
    main()
