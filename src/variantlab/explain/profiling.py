"""Profiling one variant on one workload, in the worker: where its prefill and decode time goes.

`profile_workload` runs the same requests (the workload's prompts, every one generating exactly
max_new_tokens: no stop rule, so two variants do the same work) several times without the
profiler, timing each phase on the host clock (prefill: request start → first token; decode: first
token → last), interleaved with runs under `torch.profiler` (CPU activity, and CUDA activity on a
GPU) with each phase and each marked module's forward inside a `record_function` range. The plain
runs give the phase times that are attributed; a profiled run gives, per operator, its self time
and call count, charged to a category by its name and the innermost module region it ran in
(explain/categories.py). The profiler's own cost is recorded (profiled − plain), never attributed.

Regions are marked with forward pre/post hooks that open and close a `record_function` range, added
for the profiled run only and removed after it, so the plain runs (and every bench measurement)
carry no marking cost. On a compiled variant the decode step runs as one compiled graph; its
prefill is eager and still marked.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Iterator, Sequence

import torch

from .categories import ATTENTION_REGION, LINEAR, NORM_REGION, PHASE_MARK, QUANT_LINEAR, REGION_MARK, categorize, \
    is_mark, region_from_mark

PHASES = ("prefill", "decode")


def region_kind(module) -> str | None:
    """The region a module's forward is marked as, or None (not marked)."""
    from transformers.pytorch_utils import Conv1D

    from ..variants.quant_linear import QuantLinear
    if isinstance(module, QuantLinear):
        return QUANT_LINEAR
    if isinstance(module, (torch.nn.Linear, Conv1D)):
        return LINEAR
    name = type(module).__name__
    if "Norm" in name:
        return NORM_REGION
    if name.endswith("Attention"):
        return ATTENTION_REGION
    return None


@contextlib.contextmanager
def regions_marked(model) -> Iterator[int]:
    """Inside: each markable module's forward runs in a record_function range named for its region.
    Yields the number of modules marked; the hooks are removed on the way out."""
    handles = []
    for module in model.modules() if model is not None else ():    # another runtime's model has no modules
        kind = region_kind(module)
        if kind is None:
            continue
        label = f"{REGION_MARK}{kind}::{type(module).__name__}"
        stack: list = []

        def enter(mod, args, label=label, stack=stack):
            rf = torch.autograd.profiler.record_function(label)
            rf.__enter__()
            stack.append(rf)

        def leave(mod, args, out, stack=stack):
            stack.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield len(handles) // 2
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def runtime_marked(engine) -> Iterator[None]:
    """Inside: a backend that runs another runtime's step (`op_range`, `op_name`: llama.cpp's llama_decode) has each
    call in a record_function range, which the profiler times as one operator; plain runs carry no mark."""
    if not hasattr(engine, "op_range"):
        yield
        return
    engine.op_range = lambda: torch.autograd.profiler.record_function(engine.op_name)
    try:
        yield
    finally:
        engine.op_range = contextlib.nullcontext


def _phase_range(phase: str, marked: bool):
    return torch.autograd.profiler.record_function(PHASE_MARK + phase) if marked else contextlib.nullcontext()


def phase_times(engine, batches: Sequence[Sequence], marked: bool, clock=time.perf_counter) -> dict[str, float]:
    """Run every batch through the engine; seconds spent in each phase (summed over batches)."""
    spent = {p: 0.0 for p in PHASES}
    for batch in batches:
        it = engine.stream(batch)
        t0 = clock()
        with _phase_range("prefill", marked):
            next(it)
        t1 = clock()
        with _phase_range("decode", marked):
            for _ in it:
                pass
        t2 = clock()
        spent["prefill"] += t1 - t0
        spent["decode"] += t2 - t1
    return spent


def aggregate_events(events, device_time: bool) -> dict[str, dict[tuple[str, str, str | None], list]]:
    """phase → (op name, category, region) → [self seconds, calls], from a profiler's FunctionEvents.

    An op belongs to the phase range and the innermost region range among its ancestors; ops outside
    every phase range (none, when the profiler wraps only the workload) are left out. `device_time`:
    charge each op its self device time (CUDA kernels it launched) instead of its self CPU time."""
    out: dict[str, dict] = {p: defaultdict(lambda: [0.0, 0]) for p in PHASES}
    for ev in events:
        if is_mark(ev.name):
            continue
        phase = region = None
        parent = ev.cpu_parent
        while parent is not None:
            if region is None:
                region = region_from_mark(parent.name)
            if parent.name.startswith(PHASE_MARK):
                phase = parent.name[len(PHASE_MARK):]
                break
            parent = parent.cpu_parent
        if phase not in out:
            continue
        us = ev.self_device_time_total if device_time else ev.self_cpu_time_total
        slot = out[phase][(ev.name, categorize(ev.name, region), region)]
        slot[0] += us / 1e6
        slot[1] += 1
    return out


def profile_workload(engine, model, batches: Sequence[Sequence], reps: int, device: str,
                     profiled_reps: int = 2) -> dict:
    """`reps` plain runs and `profiled_reps` profiled ones, interleaved (plain first and last), after a warm-up.

    On a shared machine one run can be disturbed many-fold (another process's threads preempting
    ours); the attribution takes the least-disturbed run of each kind, so every run is kept.
    Returns {"plain": {phase: [s, ...]}, "profiled": [{"seconds": {phase: s}, "ops": {phase: {(name, cat,
    region): [s, calls]}}}, ...], "marked_modules": n}."""
    from torch.profiler import ProfilerActivity, profile
    phase_times(engine, batches, marked=False)          # warm: caches sized, kernels loaded, graphs compiled
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    plain: dict[str, list[float]] = {p: [] for p in PHASES}
    profiled, n_marked = [], 0
    order = ["plain"] + ["profiled", "plain"] * profiled_reps
    order += ["plain"] * max(reps - order.count("plain"), 0)
    for kind in order:
        if kind == "plain":
            for p, s in phase_times(engine, batches, marked=False).items():
                plain[p].append(s)
            continue
        with regions_marked(model) as n_marked, runtime_marked(engine):
            with profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False) as prof:
                seconds = phase_times(engine, batches, marked=True)
        profiled.append({"seconds": seconds, "ops": aggregate_events(prof.events(), device_time=cuda)})
    return {"plain": plain, "profiled": profiled, "marked_modules": n_marked}
