"""Per-layer cost of each quantization recipe against bf16: one linear layer, M rows of activations.

For each layer shape (4096×4096, and the reference model's hidden→hidden, hidden→intermediate,
intermediate→hidden from models/tiny_structured/config.json) and each variant (fp32, bf16, int8,
w8a8, int4 g32/g64/g128, w4a8 g64, int8 with dequant=python) it prints the median time at
M = 1, 8, 64, 256 divided by bf16's (< 1 is faster; fp32 and bf16 in absolute ms), and the M
where the variant stops beating bf16 (interpolated between the measured M, log-log). M = 1 is
single-stream decode; larger M is batched decode or prefill. The last column is the weight read
rate at M = 1 (stored bytes / time), the number that explains a memory-bound speedup.

Quantized layers are the modules `apply` swaps in (variants/quant_linear.py), compute dtype bf16.
A group size that does not divide in_features (688 in the reference model) is run with
pad_to_group (zero-padded K), as the recipe would with that option.

    python benchmarks/quant_kernels.py [--threads 1] [--quick] [--min-time 0.2] [--torchao]

--torchao adds torchao's int8 weight-only layer, eager and compiled, so that "prefer torchao where
it runs correctly and faster" is a measurement (torchao is not a dependency; install it to compare).

Timing: torch.utils.benchmark.Timer.blocked_autorange (warm-up, then blocks until --min-time),
median per call; one thread by default. Ratios come from one run on a
possibly busy machine: re-run before quoting them; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.benchmark import Timer

from variantlab.variants import quant_linear as ql

CONFIG = Path(__file__).resolve().parents[1] / "src/variantlab/models/tiny_structured/config.json"


def _torchao(config_name: str, compiled: bool):
    """A torchao-quantized bf16 linear (torchao is optional: `pip install torchao==0.18.0`)."""
    def build(lin):
        import torchao.quantization as tq
        lin = lin.to(torch.bfloat16)
        tq.quantize_(lin, getattr(tq, config_name)())
        return torch.compile(lin, dynamic=True) if compiled else lin
    return build


def variants(with_torchao: bool = False):
    """(label, build(linear) -> callable module, compute dtype)."""
    bf = torch.bfloat16
    extra = [("torchao int8wo eager", _torchao("Int8WeightOnlyConfig", False), bf),
             ("torchao int8wo compiled", _torchao("Int8WeightOnlyConfig", True), bf)] if with_torchao else []
    return extra + [
        ("fp32", lambda lin: lin, torch.float32),
        ("bf16", lambda lin: lin.to(bf), bf),
        ("int8", lambda lin: ql.Int8WeightOnly(lin, bf), bf),
        ("w8a8", lambda lin: ql.W8A8(lin, bf), bf),
        ("int4 g32", lambda lin: ql.Int4WeightOnly(lin, bf, group_size=32), bf),
        ("int4 g64", lambda lin: ql.Int4WeightOnly(lin, bf, group_size=64), bf),
        ("int4 g128", lambda lin: ql.Int4WeightOnly(lin, bf, group_size=128), bf),
        ("w4a8 g64", lambda lin: ql.W4A8(lin, bf, group_size=64), bf),
        ("int8 dequant=python", lambda lin: ql.Int8WeightOnly(lin, bf, "python"), bf),
    ]


def shapes(quick: bool):
    cfg = json.loads(CONFIG.read_text())
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    ref = [(f"ref hidden→hidden {h}→{h}", h, h), (f"ref hidden→inter {h}→{i}", h, i),
           (f"ref inter→hidden {i}→{h}", i, h)]
    big = [("4096→4096", 4096, 4096)]
    return big + ref[2:] if quick else big + ref


def median_s(fn, x, min_time: float) -> float:
    with torch.inference_mode():
        fn(x)  # warm-up (first-call allocations, oneDNN primitive creation)
        return Timer("fn(x)", globals={"fn": fn, "x": x}).blocked_autorange(min_run_time=min_time).median


def crossover(ms: list[int], ratios: list[float]) -> str:
    """M at which ratio crosses 1 going up, interpolated in log-log between the measured M."""
    if ratios[0] >= 1:
        return "never (slower at M=1)"
    for (m0, r0), (m1, r1) in zip(zip(ms, ratios), zip(ms[1:], ratios[1:])):
        if r1 >= 1:
            t = -math.log(r0) / (math.log(r1) - math.log(r0))
            return f"≈{round(math.exp(math.log(m0) + t * (math.log(m1) - math.log(m0))))} ({m0}–{m1})"
    return f"> {ms[-1]}"


def stored_bytes(mod) -> int:
    return sum(t.numel() * t.element_size() for t in mod.state_dict().values())


def bench_shape(label: str, k: int, n: int, ms: list[int], min_time: float, with_torchao: bool = False) -> None:
    torch.manual_seed(0)
    base = nn.Linear(k, n, bias=False)
    nn.init.normal_(base.weight, std=0.02)
    rows, times = [], {}
    for name, build, dtype in variants(with_torchao):
        lin = nn.Linear(k, n, bias=False)
        lin.load_state_dict(base.state_dict())
        try:
            mod = build(lin)
        except (RuntimeError, ImportError, AttributeError) as e:
            rows.append((name, None, str(e).splitlines()[0]))
            continue
        t = [median_s(mod, torch.randn(m, k, dtype=dtype), min_time) for m in ms]
        times[name] = t
        rows.append((name, mod, t))
    bf = times["bf16"]
    print(f"\n{label}  (K={k} → N={n}; time / bf16, < 1 is faster)")
    head = f"{'variant':<22}{'bits':>6}" + "".join(f"{'M=' + str(m):>9}" for m in ms)
    print(head + f"  {'stops beating bf16 at M':<26}{'GB/s @M=1':>9}")
    for ref in ("fp32", "bf16"):
        print(f"{ref + ' (ms)':<22}{'':>6}" + "".join(f"{1e3 * v:>9.3f}" for v in times[ref]))
    for name, mod, t in rows:
        if mod is None:
            print(f"{name:<22}  failed: {t}")
            continue
        nbytes = stored_bytes(mod)
        bits = 8 * nbytes / (k * n)
        ratios = [a / b for a, b in zip(t, bf)]
        cross = "—" if name == "bf16" else crossover(ms, ratios)
        pad = " (K padded)" if getattr(mod, "k_pad", 0) else ""
        print(f"{name + pad:<22}{bits:>6.2f}" + "".join(f"{r:>8.2f}x" for r in ratios)
              + f"  {cross:<26}{nbytes / t[0] / 1e9:>9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="smoke run: two shapes, M = 1 and 64, short timings")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per timing (default 0.2, quick 0.03)")
    ap.add_argument("--torchao", action="store_true",
                    help="also time torchao 0.18's Int8WeightOnlyConfig, eager and under torch.compile")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ms = [1, 64] if args.quick else [1, 8, 64, 256]
    min_time = args.min_time or (0.03 if args.quick else 0.2)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, threads={args.threads}, "
          f"min_time={min_time}s; compute dtype of quantized layers: bf16")
    t0 = time.perf_counter()
    for label, k, n in shapes(args.quick):
        bench_shape(label, k, n, ms, min_time, args.torchao)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
