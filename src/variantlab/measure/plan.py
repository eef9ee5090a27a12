"""The plan: a checked suite turned into what will run — variants, samples, trackers, rounds, order.

Interleaved rounds: each variant is measured in `rounds` fresh processes; round r runs the
variants in a rotated order (A B C, then B C A, then C A B, …) or, with `order: random`, in an
order shuffled by the suite's seed. Anything that drifts on the machine between minutes (another
job, a frequency change) then lands on every variant alike, and per-round paired ratios cancel
what a round shares (asv and Google Benchmark interleave for the same reason).

`make_plan` raises every input problem (VariantlabError) before anything runs; planning imports
torch only for a recipe resolved at plan time (`recipe: auto`, variants/auto.py: it times this
machine's kernels once, then reads them from the cache).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from ..data.jsonl import load_jsonl
from ..errors import DatasetError, SuiteError
from ..data.structured import generate_samples
from ..models.loading import check_model_dir, resolve_model_path
from ..suite import Suite, load_suite
from ..variants.build import VariantDefinition
from ..variants.registry import get_recipe, resolve_variant_attention, resolve_variant_recipe
from .trackers import standard_trackers

CALIBRATION_LIMIT = 512   # texts handed to a build job at most
MIN_CALIBRATION = 16      # samples left after the scored ones, for the workload to calibrate on them


@dataclass(frozen=True)
class PlannedVariant:
    definition: VariantDefinition
    source: Path                      # the checkpoint it is built from
    resolved: dict | None = None      # what a plan-time recipe (auto) chose and why: variants/auto.Resolution

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True)
class Plan:
    suite: Suite
    suite_path: str
    variants: tuple[PlannedVariant, ...]     # baseline first
    samples: tuple[dict, ...]
    calibration_texts: tuple[str, ...]
    trackers: tuple
    rounds: int

    @property
    def baseline(self) -> str:
        return self.suite.baseline_name

    def variant(self, name: str) -> PlannedVariant:
        return next(v for v in self.variants if v.name == name)

    def order(self, round_index: int) -> list[str]:
        """The variants in the order round `round_index` measures them."""
        names = [v.name for v in self.variants]
        if self.suite.order == "random":
            random.Random(self.suite.seed * 1_000_003 + round_index).shuffle(names)
            return names
        k = round_index % len(names)
        return names[k:] + names[:k]

    def with_rounds(self, rounds: int) -> "Plan":
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        return dataclasses.replace(self, rounds=rounds)

    def to_json(self) -> dict:
        return {"baseline": self.baseline, "rounds": self.rounds,
                "variants": [v.definition.to_json() | {"source": str(v.source)}
                             | ({"resolved": v.resolved} if v.resolved else {}) for v in self.variants],
                "order": [self.order(r) for r in range(self.rounds)],
                "trackers": [{"kind": t.kind, "config": t.config()} for t in self.trackers],
                "samples": len(self.samples)}


def available_cores(cpu_max: str | Path = "/sys/fs/cgroup/cpu.max") -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a container
    started with --cpus=2 on a 64-core machine gets 2), not every core of the machine."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def dataset_samples(ds, base_dir: Path, field: str = "workload.dataset") -> list[dict]:
    """The dataset's samples, each with a string id. A JSONL file shorter than an `n` the suite gives
    explicitly is an error (it measured fewer samples than asked, silently); without `n`, a file may be
    shorter than the default."""
    if ds.path is not None:
        p = Path(ds.path)
        path = p if p.is_absolute() else base_dir / p
        samples = load_jsonl(path, limit=ds.n)
        if "n" in ds.model_fields_set and len(samples) < ds.n:
            raise DatasetError(f"the file has {len(samples)} records, fewer than the n: {ds.n} asked for",
                               file=str(path), field=f"{field}.n",
                               accepted=f"n: {len(samples)} or less, or a file with {ds.n} records")
    else:
        samples = generate_samples(ds.n, ds.seed)
    return [dict(s) | {"id": str(s.get("id", i))} for i, s in enumerate(samples)]


def _calibration(suite: Suite, base_dir: Path, samples: list[dict]) -> list[dict]:
    """The suite's `calibration:` dataset; else the workload's samples that teacher-forced scoring does not
    use (so that a calibrated recipe's KLD is not measured on its own calibration text), or all of them
    when fewer than MIN_CALIBRATION would be left."""
    if suite.calibration:
        return dataset_samples(suite.calibration, base_dir, "calibration")
    rest = samples[suite.workload.accuracy.samples:]
    return rest if len(rest) >= MIN_CALIBRATION else samples


def check_cuda(suite_path: str) -> None:
    """`device: cuda` on a machine where torch sees no CUDA device is bad input, found while planning: it
    was every variant "failed: AssertionError: Torch not compiled with CUDA enabled", each after its own
    worker started. torch is imported here only for this check (planning otherwise never imports it)."""
    import torch
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise SuiteError(f"cuda asked for, but {why} (torch {torch.__version__})", file=suite_path, field="device",
                         accepted="auto (CUDA when present, else the CPU) | cpu; or a CUDA build of torch on a "
                                  "machine with a GPU (README)")


def make_plan(suite: Suite, suite_path: str, base_dir: Path) -> Plan:
    """Resolve and check every model and recipe, and load the datasets; raise on bad input."""
    if suite.device == "cuda":
        check_cuda(suite_path)
    base_model = Path(".")
    if suite.model is not None:
        base_model = resolve_model_path(suite.model, base_dir, file=suite_path, field="model")
        check_model_dir(base_model, file=suite_path, field="model")
    samples = dataset_samples(suite.workload.dataset, base_dir)
    planned = []
    for i, v in enumerate(suite.variants):
        field = f"variants[{i}]"
        if v.endpoint is not None:   # measured as it serves: nothing to build or check here
            planned.append(PlannedVariant(VariantDefinition(v.name, endpoint=v.endpoint), base_model))
            continue
        recipe, options = resolve_variant_recipe(v, file=suite_path, field=field)
        path = base_model
        if v.model is not None:
            path = resolve_model_path(v.model, base_dir, file=suite_path, field=f"{field}.model")
            check_model_dir(path, file=suite_path, field=f"{field}.model")
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))  # check_model_dir parsed it
        attention = resolve_variant_attention(v, config=config, file=suite_path, field=field)
        compile_, resolved = v.compile, None
        resolve = getattr(get_recipe(recipe), "resolve", None)   # a recipe chosen at plan time (auto)
        if resolve is not None:
            r = resolve(options, suite=suite, samples=samples, config=config, model_dir=path, file=suite_path,
                        field=field)
            recipe, options, resolved = r.recipe, r.options, r.to_json()
            if "compile" not in v.model_fields_set:   # the variant's own compile: wins over the choice
                compile_ = r.compile
        planned.append(PlannedVariant(VariantDefinition(v.name, recipe, options, attention, dict(v.attention_options),
                                                        compile_), path, resolved))
    planned.sort(key=lambda p: p.name != suite.baseline_name)
    texts = tuple(s["prompt"] + " " + s["answer"] for s in _calibration(suite, base_dir, samples)[:CALIBRATION_LIMIT])
    return Plan(suite, suite_path, tuple(planned), tuple(samples), texts, tuple(standard_trackers(suite, len(samples))),
                suite.rounds)


def plan_suite_file(suite_path: str | Path) -> Plan:
    """Load and check a suite file: every input problem is raised here, before anything runs."""
    suite_path = str(suite_path)
    return make_plan(load_suite(suite_path), suite_path, Path(suite_path).resolve().parent)
