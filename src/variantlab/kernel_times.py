"""Measured time of each recipe's weight kernels per activation row count: what `recipe: auto` decides by.

One linear layer of a representative shape (the suite model's hidden → intermediate projection, or
1024 → 1024 for `variantlab hw`) is built the way each recipe builds it — the recipe's own `apply`
on a one-layer nn.Sequential, then `use_decode_kernels`, so our CPU kernels run exactly where a
built variant runs them — and timed at M = 1 … 256 activation rows (M = 1 is single-stream decode,
M = batch size is batched decode, M = batch × prompt tokens is prefill).

Weights are as cold as in the model they stand for: each path holds as many copies of its layer as
the model has layer-equivalents of weights (capped at MAX_COPIES), and consecutive calls read
successive copies, so a decode-shaped call reads its weights from memory when the model's weights
exceed the caches and from cache when they do not (the shipped tiny model). Rounds interleave
every (path, M) in an order rotated each round; the figure is the best over rounds (as the ceilings
are: on a shared machine a median still carried other jobs' load, 10x at some M here while a bench
ran beside it). The load average when measuring is kept, and the configuration notes a busy machine.

Measured once per machine, shape, compute dtype and thread count and kept beside the ceilings
(hardware.cache_dir(), keyed with hardware.machine_key); `refresh` measures again. A path that
cannot run here (no kernel, a shape its recipe refuses) is recorded as failed, with why.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass

from .variants.registry import kernel_recipes

DENSE = ("fp32",)                                  # plus bf16 on a CPU and the compute dtype (paths_for)
QUANTIZED = kernel_recipes()                      # int8, int4, w8a8, w4a8 (sparse: CUDA only, not timed)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SHAPE = (1024, 1024)                               # in → out features when no model is given
PARAMETERS = 64 * 1024 * 1024                      # linear weights of the model a default run stands for
MAX_COPIES = 96
ROUNDS = 7
SAMPLE_S = 2e-3                                    # consecutive calls per timed sample: about this long
VERSION = 3                                        # bump when what is measured changes (old caches are ignored)


@dataclass(frozen=True)
class KernelTimes:
    """Seconds per call of each path's layer at each row count (the best over rounds), as measured here."""

    device: str
    threads: int
    in_features: int
    out_features: int
    compute_dtype: str
    copies: int                                   # layer copies cycled (the model's layer-equivalents, capped)
    rows: tuple[int, ...]
    seconds: dict[str, tuple[float, ...]]         # path → seconds per call at each of `rows`
    kernels: dict[str, tuple[str, ...]]           # path → what its layer ran (the built layer's labels)
    failed: dict[str, str]                        # path → why it could not be timed here
    measured_at: str
    took_s: float
    load_average: float | None = None             # 1-minute load average when measuring (None: unknown)

    @property
    def shape(self) -> str:
        return f"{self.in_features}→{self.out_features}"

    def at(self, path: str, m: float) -> float:
        """Seconds per call of `path` at `m` rows: measured, linear between measured row counts, and past
        the last one proportional to m (a compute-bound call: an extrapolation, said where it is used)."""
        ts, rows = self.seconds[path], self.rows
        if m <= rows[0]:
            return ts[0]
        if m >= rows[-1]:
            return ts[-1] * m / rows[-1]
        i = next(i for i, r in enumerate(rows) if r >= m)
        f = (m - rows[i - 1]) / (rows[i] - rows[i - 1])
        return ts[i - 1] + f * (ts[i] - ts[i - 1])

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "KernelTimes":
        d = dict(d)
        d["rows"] = tuple(d["rows"])
        d["seconds"] = {k: tuple(v) for k, v in d["seconds"].items()}
        d["kernels"] = {k: tuple(v) for k, v in d["kernels"].items()}
        return cls(**d)

    def lines(self) -> list[str]:
        """A table in words: one line per path, ms per call at each M."""
        head = (f"{self.shape} linear, {self.threads} threads, {self.device}, quantized recipes computing in "
                f"{self.compute_dtype}, ms per call at M =")
        out = [head + " " + " ".join(f"{m:>6}" for m in self.rows)]
        for p, ts in self.seconds.items():
            out.append(f"  {p:<5} " + " ".join(f"{t * 1e3:6.3f}" for t in ts))
        out += [f"  {p:<5} not timed: {why}" for p, why in self.failed.items()]
        return out


def paths_for(compute_dtype: str, device: str = "cpu") -> tuple[str, ...]:
    """The recipes timed for a compute dtype: fp32, the compute dtype's dense recipe, the quantized ones;
    on a CPU bf16 as well, whatever the compute dtype: where the CPU has no bf16 dot products (AVX2) our
    kernels widen bf16 weights in registers, so they still read half fp32's bytes, and only the timing
    says which of the two a workload should run."""
    cpu_bf16 = ("bf16",) if not device.startswith("cuda") else ()
    return tuple(dict.fromkeys(DENSE + cpu_bf16 + ((compute_dtype,) if compute_dtype != "fp32" else ())
                               + QUANTIZED))


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def build_layer(path: str, weight, compute_dtype: str, device: str):
    """(module, activation dtype, kernel labels): `weight` [N, K] as recipe `path` builds it on `device`,
    by the recipe's own apply and the decode kernels a built variant gets. Raises what the recipe raises."""
    import torch
    from torch import nn

    from .errors import UnsupportedOnHardware
    from .variants.decode_kernels import use_decode_kernels
    from .variants.registry import get_recipe, parse_options

    recipe = get_recipe(path)
    options = parse_options(recipe, {"compute_dtype": compute_dtype} if path in QUANTIZED else {})
    reason = recipe.unsupported_reason(device)
    if reason:
        raise UnsupportedOnHardware(reason)
    dtype = recipe.load_dtype(options)
    n, k = weight.shape
    linear = nn.Linear(k, n, bias=False, device="meta")
    linear.weight = nn.Parameter(weight.to(device=device, dtype=dtype), requires_grad=False)
    model = nn.Sequential(linear)
    facts = recipe.apply(model, options, device)
    labels, _ = use_decode_kernels(model)
    return model.eval(), dtype, tuple(facts.kernels) + labels


def measure_kernel_times(in_features: int = SHAPE[0], out_features: int = SHAPE[1], *, device: str = "cpu",
                         compute_dtype: str = "bf16", parameters: int = PARAMETERS, rows=ROWS,
                         rounds: int = ROUNDS, threads: int | None = None) -> KernelTimes:
    """Time every path of `paths_for(compute_dtype, device)` at every row count (module docstring); with
    `threads` torch threads (default: torch's), restored after."""
    import copy
    import datetime

    import torch

    from .errors import VariantlabError

    t_start = time.perf_counter()
    saved_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(out_features, in_features, generator=gen) * 0.05
        copies_wanted = max(1, min(MAX_COPIES, math.ceil(parameters / (in_features * out_features))))
        built, failed, kernels = {}, {}, {}
        for path in paths_for(compute_dtype, device):
            try:
                module, dtype, labels = build_layer(path, weight, compute_dtype, device)
            except (VariantlabError, RuntimeError, NotImplementedError) as e:
                failed[path] = str(e).splitlines()[0] if str(e) else type(e).__name__
                continue
            copies = [module] + [copy.deepcopy(module) for _ in range(copies_wanted - 1)]
            xs = {m: torch.randn(m, in_features, generator=gen).to(device=device, dtype=dtype) for m in rows}
            built[path], kernels[path] = (copies, xs, [0]), labels
            del module
        calls: dict[tuple[str, int], int] = {}
        with torch.inference_mode():
            for path, (copies, xs, _) in built.items():       # warm-up: every shape once, then one pass
                for m, x in xs.items():
                    t0 = time.perf_counter()
                    copies[0](x)
                    _sync(device)
                    calls[path, m] = max(1, min(len(copies), math.ceil(SAMPLE_S / max(time.perf_counter() - t0,
                                                                                       1e-7))))
                for c in copies:
                    c(xs[rows[0]])
            keys = list(calls)
            samples: dict[tuple[str, int], list[float]] = {k: [] for k in keys}
            for r in range(rounds + 1):                       # the first round settles the caches: dropped
                order = keys[(r * 7) % len(keys):] + keys[:(r * 7) % len(keys)] if keys else []
                for path, m in order:
                    copies, xs, at = built[path]
                    x, n = xs[m], calls[path, m]
                    _sync(device)
                    t0 = time.perf_counter()
                    for _ in range(n):
                        copies[at[0]](x)
                        at[0] = (at[0] + 1) % len(copies)
                    _sync(device)
                    if r:
                        samples[path, m].append((time.perf_counter() - t0) / n)
        seconds = {p: tuple(min(samples[p, m]) for m in rows) for p in built}
    finally:
        torch.set_num_threads(saved_threads)
    return KernelTimes(device, threads or saved_threads, in_features, out_features, compute_dtype,
                       copies_wanted, tuple(rows), seconds, kernels, failed,
                       datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       time.perf_counter() - t_start, _load_average())


def cached_kernel_times(in_features: int = SHAPE[0], out_features: int = SHAPE[1], *, device: str = "cpu",
                        compute_dtype: str = "bf16", parameters: int = PARAMETERS, threads: int | None = None,
                        refresh: bool = False) -> tuple[KernelTimes, bool]:
    """(kernel times, whether they came from the cache): measured once per machine key (hardware.machine_key
    with the threads measured at), shape, compute dtype, copies and whether our kernels run; then read back.
    A cache file that cannot be read is measured again and rewritten."""
    import torch

    from .device_facts import device_facts
    from .hardware import cache_dir, cached_measurement, machine_key

    n_threads = threads or torch.get_num_threads()
    copies = max(1, min(MAX_COPIES, math.ceil(parameters / (in_features * out_features))))
    facts = device_facts(with_gpus=device.startswith("cuda")).to_json()
    key = machine_key(facts, device, n_threads, torch.__version__)
    from .variants import kernels as vk
    ours = "ours" if device == "cpu" and vk.available() else "aten"   # VARIANTLAB_KERNELS=0 times other kernels
    path = cache_dir() / f"kernels-v{VERSION}-{key}-{in_features}x{out_features}-{compute_dtype}-{copies}-{ours}.json"
    return cached_measurement(path, "kernel_times", facts,
                              lambda: measure_kernel_times(in_features, out_features, device=device,
                                                           compute_dtype=compute_dtype, parameters=parameters,
                                                           threads=n_threads),
                              KernelTimes.from_json, KernelTimes.to_json, refresh=refresh)
