"""One row at a time or four: how our M = 1 AVX-512 kernels read a model's weights (variants/kernels/gemv_avx512.cpp).

Builds the kernels twice, as shipped and with -DVK_NO_ROW1 (four rows at once, the layout before issue 25), each
in a namespace of its own, then runs every linear of a model's decode step at M = 1 (16 layers of a hidden-768,
intermediate-2048 Llama: quant_decode.py's 115M shape; the weights cycle, so they come from memory), both builds
A B A B, and prints the GB/s each reads at, median of --reps:

    python benchmarks/kernel_rows.py [--reps 12] [--hidden 768 --intermediate 2048 --layers 16]

Measured 2026-12-05 on the 2-core AVX-512 EPYC: fp32 27.1 → 28.7 GB/s, bf16 23.6 → 29.4, int8 14.5 → 21.9,
w8a8 16.3 → 28.4. Never part of the test suite.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from variantlab.variants.kernels import _build
from variantlab.variants.kernels._build import AVX512, OPS_SOURCE

BUILDS = {"four rows (-DVK_NO_ROW1)": ["-DVK_NO_ROW1"], "one row (shipped)": []}
OPS = ("fp32", "bf16", "int8", "w8a8")


def load(name: str, extra: list[str], folder: str) -> None:
    from torch.utils import cpp_extension
    cpp_extension.load(name=name, sources=[str(AVX512.source), str(OPS_SOURCE)],
                       extra_cflags=list(AVX512.cflags) + extra + [f"-DVK_NS={name}"],
                       extra_ldflags=["-fopenmp"], is_python_module=False, build_directory=folder, verbose=False)


def weights(kind: str, shapes):
    if kind in ("fp32", "bf16"):
        dt = torch.float32 if kind == "fp32" else torch.bfloat16
        return [(torch.randn(n, k, dtype=dt),) for n, k in shapes], dt
    return [(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n, dtype=torch.bfloat16) / 100)
            for n, k in shapes], torch.bfloat16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if _build.ISA is not AVX512:
        raise SystemExit("kernel_rows.py compares two builds of gemv_avx512.cpp: it needs a CPU with "
                         + ", ".join(AVX512.cpu_flags) + " (this one has not all of them)")
    torch.set_num_threads(args.threads)
    h, i = args.hidden, args.intermediate
    shapes = [(h, h)] * 4 + [(i, h), (i, h), (h, i)]
    shapes = shapes * args.layers
    names = {}
    with tempfile.TemporaryDirectory() as tmp:
        for j, (label, extra) in enumerate(BUILDS.items()):
            names[label] = f"vk_rows_{j}"
            folder = f"{tmp}/{j}"
            os.makedirs(folder)
            load(names[label], extra, folder)
    print(f"{len(shapes)} linears (hidden {h}, intermediate {i}, {args.layers} layers) at M = 1, {args.threads} "
          f"threads, {args.reps} interleaved reps; GB/s of weights read (median)")
    for kind in OPS:
        ws, dt = weights(kind, shapes)
        xs = {k: torch.randn(1, k, dtype=dt) for k in (h, i)}
        nbytes = sum(w[0].numel() * w[0].element_size() for w in ws)
        got: dict[str, list[float]] = {label: [] for label in BUILDS}
        for _ in range(args.reps):
            for label, name in names.items():
                op = getattr(getattr(torch.ops, name), f"{kind}_mm")
                t = time.perf_counter()
                for w in ws:
                    op(xs[w[0].shape[1]], *w)
                got[label].append(nbytes / (time.perf_counter() - t) / 1e9)
        print(f"  {kind:5} " + "   ".join(f"{label}: {statistics.median(v):5.1f}" for label, v in got.items()))


if __name__ == "__main__":
    main()
