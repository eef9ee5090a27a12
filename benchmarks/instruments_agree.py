"""Do the two instruments agree? `variantlab bench` and benchmarks/decode_vs_llamacpp.py on the same variants,
in adjacent runs, their decode TPOT compared per variant (issue 25: within 5%).

The unit is one pair of the peer benchmark (decode_vs_llamacpp.PAIRS): a GGUF type and the recipe it pairs with
(F32: fp32; Q4_0: int4 and w4a8 g32 symmetric). Each repetition, for each pair, runs `variantlab bench` (one
round of a suite of the pair's two variants) and decode_vs_llamacpp.py (--script-pairs pairs of the same two) back
to back, on the same checkpoint and GGUF files, alternating which goes first. Both get one workload: the script's
prompt (its 64 token ids, given to the bench as a one-line JSONL dataset whose text encodes back to exactly those
ids), 64 new tokens, no stop string (so that, as in the script, EOS alone decides and the engine decodes each
request in one C++ call), one full warm-up request, and --script-pairs measured requests of each variant.
Every variant is built once, before the first repetition (`variantlab build`), and each bench reuses those
artifacts (`--artifacts`) and writes its run folder to a temporary one, so a repetition measures and builds
nothing: the two instruments run seconds apart, and the disk does not fill with
a copy of every variant per repetition. The machine's memory bandwidth here moves between levels over tens of
seconds (the 115M fp32 model decodes at about 10.5 or 14 ms a token, for both runtimes alike), so a figure from
one instrument is compared with the other's from the adjacent seconds, never with a median taken minutes away:
per variant and repetition the ratio bench TPOT p50 / script TPOT (1 / its tok/s), then the median of those
ratios with their min and max, its bootstrap 95% interval, and whether the median is within 5%. A GGUF type
that pairs with two recipes is measured in both units, so it has two ratios a repetition. With --aa each unit
also runs the script a second time, the three runs in rotating order, and the same figures for script again /
script are printed: what one instrument shows against itself here, the floor under any bench / script ratio.

Around every run the host's memory bandwidth is probed (HostProbe, 0.1 s; on stderr), and the output says around
how many unit runs it stayed within 10%. On the 2-core EPYC (2026-12-07) it did around 9 of 36: the level moves
every 10-40 s, within one process as much as between processes (the 115M fp32 model at 10 or 15 ms a token in one
process, minute to minute), faster than either instrument's run, and a unit that stayed steady at its probes
still swung ±25%. There the repetitions can be pooled (each repetition's ratio is printed), but what decides is
benchmarks/instrument_workers.py: both instruments' workers alive at once and asked in turn, so the drift cancels.

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
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from decode_vs_llamacpp import PAIRS, Pair, make_checkpoint, prompt_ids  # noqa: E402

CLI = [sys.executable, "-c", "from variantlab.cli import app; app()"]
BOUND_S = 1800      # one bench, build or script run at most
PROMPT_TOKENS = NEW_TOKENS = 64     # the script's defaults


def script_prompt(model: Path, workdir: Path) -> Path:
    """The script's prompt as a one-line JSONL dataset, so that the bench sends the very same token ids: the
    script's first PROMPT_TOKENS ids (BOS included), decoded. Raises where the text does not encode back to them."""
    from transformers import AutoTokenizer

    ids = prompt_ids(model, PROMPT_TOKENS, 0)
    tok = AutoTokenizer.from_pretrained(model)
    text = tok.decode(ids, skip_special_tokens=True)
    if tok(text, add_special_tokens=True).input_ids != ids:
        raise SystemExit(f"{model}: the script's {PROMPT_TOKENS} prompt ids do not survive decode and encode; the "
                         f"bench could not send the same prompt")
    path = workdir / "instruments-prompt.jsonl"
    path.write_text(json.dumps({"prompt": text, "answer": ""}) + "\n")
    return path


def suite(model: Path, pair: Pair, prompt: Path, requests: int) -> dict:
    """The pair's two variants as a one-round suite: ours built as decode_vs_llamacpp.py builds it, and the GGUF;
    the script's workload: its prompt, NEW_TOKENS new tokens, no stop string, one full warm-up request."""
    ours = {"name": pair.recipe, "recipe": pair.recipe, **({"options": dict(pair.options)} if pair.options else {})}
    peer = {"name": f"gguf-{pair.gguf.lower()}", "backend": "llamacpp", "gguf_type": pair.gguf}
    return {"name": f"instruments-{pair.gguf.lower()}-{pair.recipe}", "model": str(model), "baseline": pair.recipe,
            "rounds": 1, "variants": [ours, peer],
            "workload": {"dataset": {"path": str(prompt)}, "max_new_tokens": NEW_TOKENS, "stop": [],
                         "scenarios": [{"type": "single-stream", "requests": requests, "warmup": 1}],
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


def add_common(ap: argparse.ArgumentParser) -> None:
    """The options this script and instrument_workers.py share: where, which shape, which pairs."""
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--shape", default="115m")
    ap.add_argument("--recipes", default="fp32,int4,w4a8")
    ap.add_argument("--precisions", default="F32,Q4_0")


def prepare(args) -> tuple[Path, list[Pair], Path]:
    """The checkpoint (made where missing), the chosen pairs and the script's prompt as a dataset."""
    pairs = chosen_pairs(args.recipes.split(","), args.precisions.split(","))
    if not pairs:
        raise SystemExit(f"no pair of the peer benchmark has a recipe of {args.recipes} and a GGUF type of "
                         f"{args.precisions}; its pairs: {', '.join(p.label for p in PAIRS)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = args.workdir / f"checkpoint-{args.shape}-seed0"
    if not (model / "config.json").is_file():
        make_checkpoint(model, 0, args.shape)
    return model, pairs, script_prompt(model, args.workdir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common(ap)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--script-pairs", type=int, default=3,
                    help="pairs the script runs per repetition (its TPOT: the median over them)")
    ap.add_argument("--aa", action="store_true",
                    help="also run the script a second time in each unit and print script again / script: the "
                         "noise floor an instrument shows against itself on this host")
    args = ap.parse_args()
    model, pairs, prompt = prepare(args)
    probe = HostProbe(threads=2)
    obs: list[Obs] = []
    with tempfile.TemporaryDirectory(prefix="instruments-artifacts-") as art:
        units: list[tuple[Pair, Path, Path]] = []
        for pair in pairs:
            path = args.workdir / f"instruments-{pair.gguf.lower()}-{pair.recipe}.yaml"
            path.write_text(yaml.safe_dump(suite(model, pair, prompt, args.script_pairs)))
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
                got, gbps = {}, [probe()]
                for a in arms[k:] + arms[:k]:
                    got[a] = runs[a]()
                    gbps.append(probe())
                steady = max(gbps) / min(gbps) <= 1 + STEADY
                print(f"  repetition {rep + 1}/{args.reps}, {pair.label}: host {' '.join(f'{g:.0f}' for g in gbps)}"
                      f" GB/s around {', '.join(arms[k:] + arms[:k])}{'' if steady else ' (not steady)'}",
                      file=sys.stderr, flush=True)
                for name, b in got["bench"].items():
                    if name in got["script"]:
                        obs.append(Obs(name, pair.recipe, b, got["script"][name], got.get("script again", {}).get(name),
                                       steady))
    report(obs, args)


STEADY = 0.10   # a unit is steady when the host's bandwidth, probed around each of its runs, stays within 10%:
#                 this host's two levels lie about 35% apart (30-36 and 44-49 GB/s)


class HostProbe:
    """The host's memory bandwidth now, in GB/s: STREAM's add (c = a + b) over three 128 MiB arrays with the
    instruments' 2 threads, the median of 8 passes, about 0.1 s. On this host it tracks the levels decode moves
    between (115M fp32, our engine: about 11 ms a token at 44-49 GB/s, 14-16 ms at 30-36), which a probe around
    each instrument run detects; a unit whose probes differ by more than STEADY changed level while it ran."""

    def __init__(self, threads: int) -> None:
        import torch
        torch.set_num_threads(threads)
        self.torch = torch
        self.a, self.b, self.c = (torch.rand(32 << 20) for _ in range(3))

    def __call__(self) -> float:
        times = []
        for _ in range(8):
            t = time.perf_counter()
            self.torch.add(self.a, self.b, out=self.c)
            times.append(time.perf_counter() - t)
        return 3 * self.a.numel() * self.a.element_size() / statistics.median(times) / 1e9


@dataclass(frozen=True)
class Obs:
    """One variant in one unit run: its TPOT by each instrument (and the script's second run, with --aa), and
    whether the host held one bandwidth level throughout."""
    name: str           # the variant: a recipe or gguf-<type>
    unit: str           # the unit's recipe (a GGUF type pairing with two recipes is in two units)
    bench: float
    script: float
    again: float | None
    steady: bool


def report(obs: list[Obs], args) -> None:
    print(f"{args.shape}, {args.reps} repetitions of (bench, script) back to back per pair; TPOT medians, ms; "
          f"ratio = median over repetitions of bench / script [min, max], its bootstrap 95% interval")
    print(f"{'variant':12} {'n':>3} {'bench':>8} {'script':>8} {'bench/script [min, max]':>24} {'95% interval':>15}"
          f"  within 5%")
    for name in dict.fromkeys(o.name for o in obs):
        mine = [o for o in obs if o.name == name]
        rs = [o.bench / o.script for o in mine]
        r = statistics.median(rs)
        lo, hi = bootstrap_median_ci(rs)
        b, s = statistics.median(o.bench for o in mine), statistics.median(o.script for o in mine)
        print(f"{name:12} {len(mine):3} {1e3 * b:8.2f} {1e3 * s:8.2f} {r:>8.3f} [{min(rs):.3f}, {max(rs):.3f}] "
              f"  [{lo:.3f}, {hi:.3f}]  {'yes' if abs(r - 1) <= 0.05 else 'NO'}")
    floor = [o for o in obs if o.again is not None]
    if floor:
        print("noise floor, script again / script in the same units (median [min, max], its 95% interval):")
        for name in dict.fromkeys(o.name for o in floor):
            rs = [o.again / o.script for o in floor if o.name == name]
            lo, hi = bootstrap_median_ci(rs)
            print(f"  {name:12} {statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]  [{lo:.3f}, {hi:.3f}]")
    unit_runs = [o for o in obs if o.name == o.unit]
    print(f"the host's bandwidth stayed within {STEADY:.0%} around {sum(o.steady for o in unit_runs)} of "
          f"{len(unit_runs)} unit runs (probes before and after each run, on stderr); where it moves this often, "
          f"benchmarks/instrument_workers.py, the two instruments' workers asked in turn, is the check that decides")
    print("each repetition's bench / script, * where the host was steady (to pool runs):")
    for name in dict.fromkeys(o.name for o in obs):
        marked = (f"{o.bench / o.script:.3f}{'*' if o.steady else ''}" for o in obs if o.name == name)
        print(f"  {name}: {' '.join(marked)}")
    # What each instrument says of ours against llama.cpp, within one run of it: the host's drift cancels there.
    by_unit: dict[str, list[Obs]] = {}
    for o in obs:
        by_unit.setdefault(o.unit, []).append(o)
    print("ours ÷ llama.cpp TPOT as each instrument measures it (median over repetitions; within one run):")
    for unit, os_ in by_unit.items():
        ours, peers = [o for o in os_ if o.name == unit], [o for o in os_ if o.name != unit]
        if ours and len(peers) == len(ours):
            b = statistics.median(o.bench / p.bench for o, p in zip(ours, peers))
            s = statistics.median(o.script / p.script for o, p in zip(ours, peers))
            print(f"  {unit} ÷ {peers[0].name}: bench {b:.3f}, script {s:.3f}, bench/script {b / s:.3f}")


def bootstrap_median_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


if __name__ == "__main__":
    main()
