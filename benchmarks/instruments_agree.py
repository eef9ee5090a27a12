"""Do the two instruments agree? `variantlab bench` and benchmarks/decode_vs_llamacpp.py on the same variants,
in adjacent runs, their decode TPOT compared per variant (issue 25: within 5%).

The unit is one pair of the peer benchmark (decode_vs_llamacpp.PAIRS): a GGUF type and the recipe it pairs with
(F32: fp32; Q4_0: int4 and w4a8 g32 symmetric). Each repetition, for each pair, runs `variantlab bench` (one
round of a suite of the pair's two variants: single-stream, 6 requests of 64 new tokens, no stop string, so that,
as in the script, an id set (EOS) alone decides and the engine decodes each request in one C++ call) and
decode_vs_llamacpp.py (--script-pairs pairs of the same two) back to back, on the same checkpoint and GGUF files,
alternating which goes first. Every variant is built once, before the first repetition (`variantlab build`), and
each bench reuses those artifacts (`--artifacts`) and writes its run folder to a temporary one, so a
repetition measures and builds nothing: the two instruments run seconds apart, and the disk does not fill with
a copy of every variant per repetition. The machine's memory bandwidth here moves between levels over tens of
seconds (the 115M fp32 model decodes at about 10.5 or 14 ms a token, for both runtimes alike), so a figure from
one instrument is compared with the other's from the adjacent seconds, never with a median taken minutes away:
per variant and repetition the ratio bench TPOT p50 / script TPOT (1 / its tok/s), then the median of those
ratios with their min and max, its bootstrap 95% interval, and whether the median is within 5%. A GGUF type
that pairs with two recipes is measured in both units, so it has two ratios a repetition. With --aa each unit
also runs the script a second time, the three runs in rotating order, and the same figures for script again /
script are printed: what one instrument shows against itself here, the floor under any bench / script ratio.

    python benchmarks/instruments_agree.py --workdir DIR [--shape 115m] [--reps 8]
        [--recipes fp32,int4,w4a8] [--precisions F32,Q4_0] [--script-pairs 3] [--aa]

--workdir: where decode_vs_llamacpp.py --workdir keeps the checkpoint and GGUFs (made here when missing); the
bench's store (instruments.sqlite) is kept there too. Never part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from decode_vs_llamacpp import PAIRS, Pair, make_checkpoint  # noqa: E402

CLI = [sys.executable, "-c", "from variantlab.cli import app; app()"]
BOUND_S = 1800      # one bench, build or script run at most


def suite(model: Path, pair: Pair) -> dict:
    """The pair's two variants as a one-round suite: ours built as decode_vs_llamacpp.py builds it, and the GGUF."""
    ours = {"name": pair.recipe, "recipe": pair.recipe, **({"options": dict(pair.options)} if pair.options else {})}
    peer = {"name": f"gguf-{pair.gguf.lower()}", "backend": "llamacpp", "gguf_type": pair.gguf}
    return {"name": f"instruments-{pair.gguf.lower()}-{pair.recipe}", "model": str(model), "baseline": pair.recipe,
            "rounds": 1, "variants": [ours, peer],
            "workload": {"dataset": {"generator": "structured", "n": 8, "seed": 0}, "max_new_tokens": 64,
                         "stop": [], "scenarios": [{"type": "single-stream", "requests": 6, "warmup": 2}],
                         "accuracy": {"samples": 0, "graded": 0}}}


def _run(cmd: list[str], what: str, **kw) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND_S, **kw)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what}: no result in {BOUND_S} s")
    if out.returncode:
        raise SystemExit(f"{what} failed: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout


def build(suite_path: Path, artifacts: Path) -> None:
    _run(CLI + ["build", str(suite_path), "--out", str(artifacts)], f"variantlab build {suite_path.name}",
         cwd=suite_path.parent)


def bench_tpot(suite_path: Path, artifacts: Path, store: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="instruments-run-") as output:
        out = _run(CLI + ["bench", str(suite_path), "--store", str(store), "--artifacts", str(artifacts),
                          "--output", output, "--json"], "variantlab bench", cwd=suite_path.parent)
    data = json.loads(out)
    row = next(r for r in data["comparison"]["rows"] if r["key"].startswith("single-stream.tpot_p50"))
    return {name: cell["value"] for name, cell in row["cells"].items() if cell and cell.get("value") is not None}


def script_tpot(args, model: Path, pair: Pair) -> dict[str, float]:
    cmd = [sys.executable, str(HERE / "decode_vs_llamacpp.py"), "--model", str(model), "--workdir", str(args.workdir),
           "--pairs", str(args.script_pairs), "--recipes", pair.recipe, "--precisions", pair.gguf]
    got: dict[str, float] = {}
    for line in _run(cmd, "decode_vs_llamacpp.py").splitlines():
        m = re.match(r"^(\S+) <-> (\S+)(?: g\d+)?(?: sym)?\s+([\d.]+)\s+([\d.]+)\s", line)
        if m and m.group(1) == pair.gguf and m.group(2) == pair.recipe:
            got[f"gguf-{m.group(1).lower()}"] = 1 / float(m.group(3))
            got[m.group(2)] = 1 / float(m.group(4))
    if len(got) != 2:
        raise SystemExit(f"decode_vs_llamacpp.py printed no row for {pair.label}")
    return got


def chosen_pairs(recipes: list[str], precisions: list[str]) -> list[Pair]:
    """The peer benchmark's pairs of these recipes and GGUF types, in its order; each recipe paired with the first
    GGUF type it pairs with (int4 with Q4_0 where both Q4_0 and Q4_1 are asked for, once)."""
    out: list[Pair] = []
    for p in PAIRS:
        if p.recipe in recipes and p.gguf in precisions and all(q.recipe != p.recipe for q in out):
            out.append(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--shape", default="115m")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--recipes", default="fp32,int4,w4a8")
    ap.add_argument("--precisions", default="F32,Q4_0")
    ap.add_argument("--script-pairs", type=int, default=3,
                    help="pairs the script runs per repetition (its TPOT: the median over them)")
    ap.add_argument("--aa", action="store_true",
                    help="also run the script a second time in each unit and print script again / script: the "
                         "noise floor an instrument shows against itself on this host")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = args.workdir / f"checkpoint-{args.shape}-seed0"
    if not (model / "config.json").is_file():
        make_checkpoint(model, 0, args.shape)
    pairs = chosen_pairs(args.recipes.split(","), args.precisions.split(","))
    if not pairs:
        raise SystemExit(f"no pair of the peer benchmark has a recipe of {args.recipes} and a GGUF type of "
                         f"{args.precisions}; its pairs: {', '.join(p.label for p in PAIRS)}")
    ratios: dict[str, list[float]] = {}
    tpots: dict[str, tuple[list[float], list[float]]] = {}
    verdicts: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    floor: dict[str, list[float]] = {}
    units: list[tuple[Pair, Path, Path]] = []
    with tempfile.TemporaryDirectory(prefix="instruments-artifacts-") as art:
        for pair in pairs:
            path = args.workdir / f"instruments-{pair.gguf.lower()}-{pair.recipe}.yaml"
            path.write_text(yaml.safe_dump(suite(model, pair)))
            artifacts = Path(art) / path.stem
            print(f"  building {pair.label}", file=sys.stderr, flush=True)
            build(path, artifacts)
            units.append((pair, path, artifacts))
        for rep in range(args.reps):
            for i, (pair, path, artifacts) in enumerate(units):
                runs = {"bench": lambda: bench_tpot(path, artifacts, args.workdir / "instruments.sqlite"),
                        "script": lambda: script_tpot(args, model, pair),
                        "script again": lambda: script_tpot(args, model, pair)}
                arms = list(runs)[:3 if args.aa else 2]
                k = (rep + i) % len(arms)           # each arm takes each place in the order equally often
                got = {a: runs[a]() for a in arms[k:] + arms[:k]}
                for name, b in got["bench"].items():
                    if name in got["script"]:
                        ratios.setdefault(name, []).append(b / got["script"][name])
                        bs, ss = tpots.setdefault(name, ([], []))
                        bs.append(b)
                        ss.append(got["script"][name])
                        if args.aa:
                            floor.setdefault(name, []).append(got["script again"][name] / got["script"][name])
                peer = f"gguf-{pair.gguf.lower()}"
                if pair.recipe in got["bench"] and peer in got["bench"]:
                    for side, k in zip(verdicts.setdefault((pair.recipe, peer), ([], [])), ("bench", "script")):
                        side.append(got[k][pair.recipe] / got[k][peer])
            print(f"  repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    print(f"{args.shape}, {args.reps} repetitions of (bench, script) back to back per pair; TPOT medians, ms; "
          f"ratio = median over repetitions of bench / script [min, max], its bootstrap 95% interval")
    print(f"{'variant':12} {'bench':>8} {'script':>8} {'bench/script [min, max]':>24} {'95% interval':>15}  within 5%")
    for name, rs in ratios.items():
        b, s = (statistics.median(x) for x in tpots[name])
        r = statistics.median(rs)
        lo, hi = bootstrap_median_ci(rs)
        print(f"{name:12} {1e3 * b:8.2f} {1e3 * s:8.2f} {r:>8.3f} [{min(rs):.3f}, {max(rs):.3f}] "
              f"  [{lo:.3f}, {hi:.3f}]  {'yes' if abs(r - 1) <= 0.05 else 'NO'}")
    if floor:
        print("noise floor, script again / script in the same units (median [min, max], its 95% interval):")
        for name, rs in floor.items():
            lo, hi = bootstrap_median_ci(rs)
            print(f"  {name:12} {statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]  [{lo:.3f}, {hi:.3f}]")
    print("each repetition's bench / script (to pool runs):")
    for name, rs in ratios.items():
        print(f"  {name}: {' '.join(f'{x:.3f}' for x in rs)}")
    # What each instrument says of ours against llama.cpp, within one run of it: the host's drift cancels there.
    if verdicts:
        print("ours ÷ llama.cpp TPOT as each instrument measures it (median over repetitions; within one run):")
        for (ours, peer), (by_bench, by_script) in verdicts.items():
            b, s = statistics.median(by_bench), statistics.median(by_script)
            print(f"  {ours} ÷ {peer}: bench {b:.3f}, script {s:.3f}, bench/script {b / s:.3f}")


def bootstrap_median_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


if __name__ == "__main__":
    main()
