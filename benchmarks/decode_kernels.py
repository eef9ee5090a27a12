"""Decode-shaped matmuls (M = 1..8 rows) of bf16, int8 and int4 weights: aten against the alternatives.

For each layer shape K→N of a 100M+ Llama (768→768, 768→2048, 2048→768) and 4096→4096, each M and
each thread count, every option of a weight format runs on the same activations, and the script
prints, per option: time per call, GB/s of weight bytes read (weights + scales + zeros as the
option holds them), the speedup over aten's current kernel for that format (×aten > 1: faster)
and the fraction of the machine's copy bandwidth it reaches (×copy).

Formats and options (the baseline, aten's current kernel, first):

| format | aten today (variants/quant_linear.py)     | alternatives                                     |
|--------|-------------------------------------------|--------------------------------------------------|
| fp32   | aten linear                               | ours fp32_mm                                     |
| bf16   | aten linear                               | ours bf16_mm                                     |
| int8   | aten::_weight_int8pack_mm (W8A16)         | ours int8_mm; inductor; torchao                  |
| int4   | aten::_weight_int4pack_mm_for_cpu (W4A16) | ours int4_mm; inductor; torchao                  |
| w8a8   | per-token quant + torch._int_mm           | ours w8a8_mm                                     |
| w4a8   | W4A8 module: G × torch._int_mm            | ours w4a8_mm                                     |

"ours" is variants/kernels (AVX-512, compiled on first use; its compile or load time is printed).
"inductor" is torch.compile of a plain-PyTorch dequantize-and-reduce (Σ_k x·q, then scales): the
one formulation inductor fuses into a single vectorised loop; `F.linear(x, q.to(bf16)) * s`
compiles to a whole-weight dequantize plus aten mm, and with freezing to aten::_weight_int8pack_mm,
so neither is listed. Compiled once per (shape, M, threads): its compile time is printed.
"torchao" is torchao 0.18 (not a dependency: `pip install torchao==0.18.0`); on x86 its wheel has
no CPU kernels of its own, so int8 weight-only dequantizes per call and int4 calls aten's kernel.

Weights are cold, as in decode: each option holds enough copies of its weights to fill
--working-set MB (several times the last-level cache) and a timed pass calls every copy once.
Rounds interleave the options (order rotated each round); the figure is the median over rounds of
pass time / copies. The ceiling is measured first, per thread count: a 256 MB tensor copy (read +
write bytes) and a read-only sum, interleaved. Load average is printed: on a shared machine re-run
before quoting; nothing here is asserted.

    python benchmarks/decode_kernels.py [--threads 1,2] [--m 1,2,4,8] [--shapes 768x768,...]
        [--formats bf16,int8,int4,w8a8,w4a8] [--group-size 64] [--inductor] [--torchao]
        [--rounds 9] [--working-set 160]
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from variantlab.variants import kernels as vk
from variantlab.variants import quant_linear as ql
from variantlab.variants import quant_packing as qp

BF16 = torch.bfloat16


@dataclass(frozen=True)
class Built:
    fn: Callable          # fn(x, *state) -> y
    state: tuple          # the tensors (or module) one copy of the weights is
    nbytes: int           # bytes the option reads per call
    setup_s: float = 0.0  # compile time (first call), for compiled options


@dataclass(frozen=True)
class Option:
    fmt: str
    label: str
    build: Callable[[torch.Tensor, int, int], Built]  # (w fp32 [N, K], group size, M) -> Built
    x_dtype: torch.dtype = BF16


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _plain(fn, *state) -> Built:
    return Built(fn, state, _nbytes(*state))


def _first_call_s(fn, state, k: int, m: int, dtype) -> float:
    t0 = time.perf_counter()
    fn(torch.randn(m, k).to(dtype), *state)
    return time.perf_counter() - t0


# --- builders ----------------------------------------------------------------------------------

def fp32_aten(w, gs, m):
    return _plain(F.linear, w.contiguous())


def fp32_ours(w, gs, m):
    return _plain(vk.fp32_mm, w.contiguous())


def bf16_aten(w, gs, m):
    return _plain(F.linear, w.to(BF16))


def bf16_ours(w, gs, m):
    return _plain(vk.bf16_mm, w.to(BF16))


def int8_aten(w, gs, m):
    return _plain(torch.ops.aten._weight_int8pack_mm, *qp.quantize_int8_per_channel(w, BF16))


def int8_ours(w, gs, m):
    return _plain(vk.int8_mm, *qp.quantize_int8_per_channel(w, BF16))


def _int8_reduce(x, q, s):
    """Σ_k x·q in fp32, times the channel scale: one fused, vectorised reduction under inductor."""
    return ((x.float()[:, None, :] * q.float()[None]).sum(-1) * s.float()).to(x.dtype)


def int8_inductor(w, gs, m):
    state = qp.quantize_int8_per_channel(w, BF16)
    fn = torch.compile(_int8_reduce, dynamic=False)
    return Built(fn, state, _nbytes(*state), _first_call_s(fn, state, w.shape[1], m, BF16))


def _torchao(config: str, kw):
    """Eager only: a compiled module guards on its own weights, so cold copies would each recompile
    (and compiled, int8 weight-only is the whole-weight dequantize + mm described above)."""
    def build(w, gs, m):
        import torchao.quantization as tq
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False).to(BF16)
        lin.weight.data = w.to(BF16)
        tq.quantize_(lin, getattr(tq, config)(**kw(gs)))
        return Built(lambda x, mod: mod(x), (lin,), sum(_nbytes(t) for t in _leaf_tensors(lin.weight)))
    return build


def _leaf_tensors(t):
    if type(t) in (torch.Tensor, nn.Parameter):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [leaf for name in names for leaf in _leaf_tensors(getattr(t, name))]


def int4_aten(w, gs, m):
    n_pad = -w.shape[0] % 16
    q, s, z = qp.quantize_int4_groupwise(F.pad(w, (0, 0, 0, n_pad)), gs, BF16)
    packed, sz = qp.pack_int4_for_cpu(q), qp.scales_and_zeros(s, z)
    n = w.shape[0]

    def fn(x, packed, sz):
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, gs, sz)
        return y[:, :n] if n_pad else y
    return _plain(fn, packed, sz)


def _int4_canonical(w, gs):
    return qp.quantize_int4_groupwise(w, gs, BF16)


def int4_ours(w, gs, m):
    q, s, z = _int4_canonical(w, gs)
    n = w.shape[0]
    return _plain(lambda x, p, sz: vk.int4_mm(x, p, sz, gs, n), vk.pack_int4_bf16(q), vk.pack_scales_zeros(s, z))


def _int4_reduce(x, p, s, z):
    """int4 (quant_packing's nibbles [N, K/2], s, z [N, G]) dequantize-and-reduce in plain PyTorch."""
    m, k = x.shape
    n, g = s.shape
    gs = k // g
    xf = x.float().reshape(m, 1, g, gs // 2, 2)
    lo = (p & 15).reshape(1, n, g, gs // 2).float()
    hi = (p >> 4).reshape(1, n, g, gs // 2).float()
    dot = (lo * xf[..., 0] + hi * xf[..., 1]).sum(-1)                    # [M, N, G]: Σ q·x per group
    xs = xf.sum((-1, -2))                                                 # [M, 1, G]: Σ x per group
    return (dot * s.float() + (z.float() - 8 * s.float()) * xs).sum(-1).to(x.dtype)


def int4_inductor(w, gs, m):
    q, s, z = _int4_canonical(w, gs)
    state = (qp.pack_nibbles(q), s, z)
    fn = torch.compile(_int4_reduce, dynamic=False)
    return Built(fn, state, _nbytes(*state), _first_call_s(fn, state, w.shape[1], m, BF16))


def w8a8_aten(w, gs, m):
    def fn(x, q, s):
        xq, a = qp.quantize_int8_per_token(x)
        return (ql.int_mm(xq, q.t()) * a * s.float()).to(x.dtype)
    return _plain(fn, *qp.quantize_int8_per_channel(w, BF16))


def w8a8_ours(w, gs, m):
    return _plain(vk.w8a8_mm, *qp.quantize_int8_per_channel(w, BF16))


def w4a8_module(w, gs, m):
    """The W4A8 module as it runs without our kernels: int4 unpacked to int8, one torch._int_mm per group."""
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data = w
    with vk.switched_off("the group-major layout, for comparison"):
        mod = ql.W4A8(lin, BF16, "kernel", gs)
    return Built(lambda x, mod: mod._mm(x), (mod,), _nbytes(*mod.buffers()))


def w4a8_ours(w, gs, m):
    q, s, z = _int4_canonical(w, gs)
    n = w.shape[0]
    return _plain(lambda x, p, sz: vk.w4a8_mm(x, p, sz, gs, n), vk.pack_int4_vnni(q), vk.pack_scales_zeros(s, z))


def options(fmts: list[str], inductor: bool, torchao: bool) -> list[Option]:
    """The first option of each format is its baseline (aten's kernel today)."""
    ours = vk.available()
    table = {
        "fp32": [Option("fp32", "aten linear fp32", fp32_aten, torch.float32)]
        + ([Option("fp32", "ours fp32_mm", fp32_ours, torch.float32)] if ours else []),
        "bf16": [Option("bf16", "aten linear", bf16_aten)] + ([Option("bf16", "ours bf16_mm", bf16_ours)] if ours else []),
        "int8": [Option("int8", "aten _weight_int8pack_mm", int8_aten)]
        + ([Option("int8", "ours int8_mm", int8_ours)] if ours else [])
        + ([Option("int8", "inductor dequant-reduce", int8_inductor)] if inductor else [])
        + ([Option("int8", "torchao int8wo", _torchao("Int8WeightOnlyConfig", kw=lambda gs: {}))] if torchao else []),
        "int4": [Option("int4", "aten _weight_int4pack_mm_for_cpu", int4_aten)]
        + ([Option("int4", "ours int4_mm", int4_ours)] if ours else [])
        + ([Option("int4", "inductor dequant-reduce", int4_inductor)] if inductor else [])
        + ([Option("int4", "torchao int4wo opaque", _torchao(
            "Int4WeightOnlyConfig", kw=lambda gs: {"group_size": gs, "int4_packing_format": "opaque"}))]
           if torchao else []),
        "w8a8": [Option("w8a8", "aten quant + torch._int_mm", w8a8_aten)]
        + ([Option("w8a8", "ours w8a8_mm", w8a8_ours)] if ours else []),
        "w4a8": [Option("w4a8", "W4A8 module (G x _int_mm)", w4a8_module)]
        + ([Option("w4a8", "ours w4a8_mm", w4a8_ours)] if ours else []),
    }
    return [o for f in fmts for o in table[f]]


# --- measuring ---------------------------------------------------------------------------------

def ceiling(rounds: int) -> tuple[float, float]:
    """(copy GB/s counting read + write, read-only GB/s): 256 MB tensors, interleaved, medians."""
    a = torch.randn(64 * 1024 * 1024)
    b = torch.empty_like(a)
    copy_s, read_s = [], []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        b.copy_(a)
        t1 = time.perf_counter()
        a.sum()
        t2 = time.perf_counter()
        copy_s.append(t1 - t0)
        read_s.append(t2 - t1)
    return 2 * a.nbytes / statistics.median(copy_s[1:]) / 1e9, a.nbytes / statistics.median(read_s[1:]) / 1e9


def measure(opts: list[Option], n: int, k: int, m: int, gs: int, args) -> list[tuple[Option, Built, float]]:
    """Median seconds per call of each option, cold weights, interleaved rounds."""
    torch.manual_seed(0)
    w = torch.randn(n, k) * 0.05
    xs = {dt: torch.randn(m, k).to(dt) for dt in (BF16, torch.float32)}
    built, copies = [], []
    for o in opts:  # under inference_mode (main), as timed: compiled options compile once
        b = o.build(w, gs, m)
        c = max(1, min(4000, math.ceil(args.working_set * 1e6 / b.nbytes)))
        copies.append([b.state] + [copy.deepcopy(b.state) for _ in range(c - 1)])
        built.append(b)
    times: list[list[float]] = [[] for _ in opts]
    for i, o in enumerate(opts):                                      # warm-up pass
        for st in copies[i]:
            built[i].fn(xs[o.x_dtype], *st)
    for r in range(args.rounds):
        order = list(range(len(opts)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            fn, x, sts = built[i].fn, xs[opts[i].x_dtype], copies[i]
            t0 = time.perf_counter()
            for st in sts:
                fn(x, *st)
            times[i].append((time.perf_counter() - t0) / len(sts))
    return [(o, b, statistics.median(t)) for o, b, t in zip(opts, built, times)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--m", default="1,2,4,8")
    ap.add_argument("--shapes", default="768x768,768x2048,2048x768,4096x4096", help="KxN, in→out features")
    ap.add_argument("--formats", default="fp32,bf16,int8,int4,w8a8,w4a8")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument("--torchao", action="store_true")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--working-set", type=float, default=160.0, help="MB of weights each option cycles through")
    args = ap.parse_args()

    st = vk.status()
    print(f"kernels: {st.reason} (load {st.load_s:.1f} s)")
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"group size {args.group_size}, {args.rounds} rounds, working set {args.working_set:.0f} MB per option")
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    opts = options(args.formats.split(","), args.inductor, args.torchao)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        copy_bw, read_bw = ceiling(args.rounds)
        print(f"\n== {threads} thread(s): copy {copy_bw:.1f} GB/s (read + write), read-only sum {read_bw:.1f} GB/s; "
              f"load {os.getloadavg()[0]:.2f}")
        print(f"{'K->N':>10} {'M':>2} {'fmt':5} {'option':34} {'us/call':>9} {'GB/s':>6} {'x aten':>7} {'x copy':>7}"
              f"  {'compile s':>9}")
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            for m in (int(v) for v in args.m.split(",")):
                with torch.inference_mode():
                    rows = measure(opts, n, k, m, args.group_size, args)
                base = {}
                for o, b, t in rows:
                    base.setdefault(o.fmt, t)
                    gbs = b.nbytes / t / 1e9
                    setup = f"{b.setup_s:9.1f}" if b.setup_s else ""
                    print(f"{shape:>10} {m:2d} {o.fmt:5} {o.label:34} {t * 1e6:9.1f} {gbs:6.1f} "
                          f"{base[o.fmt] / t:7.2f} {gbs / copy_bw:7.2f}  {setup}", flush=True)
    print(f"\nload average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
