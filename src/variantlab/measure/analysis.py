"""From raw worker results to the comparison table: every metric of DESIGN.md, with deltas.

Pure functions: `compare_variants` takes the worker results (JSON dicts), the dataset's answers
and the baseline's name, and returns a `Comparison` — rows of estimates per variant and deltas
against the baseline. The reports and the store only render or save what this returns.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from . import accuracy as acc
from . import metrics as m
from .records import ScenarioPass
from .stats import Delta, Estimate, estimate, exact_delta, median, quantile, relative_delta


@dataclass(frozen=True)
class MetricDef:
    key: str
    label: str
    unit: str
    lower_is_better: bool | None       # None: neither (a fact such as bits per weight)
    samples: Callable[[dict], list[float]]  # from one variant's analysed data
    statistic: Callable = median
    scenario: str | None = None          # which scenario the samples come from, for the label
    # Repeated measurements of one quantity (passes, per-token times), whose spread says whether the
    # machine was steady; per-request E2EL/TTFT differ by prompt by design and are not checked.
    checks_stability: bool = False
    with_delta: bool = True               # False: a percent change says nothing (errors near 0)


def _passes(r: dict, scenario: str) -> list[ScenarioPass]:
    return [ScenarioPass.from_json(p) for p in r.get("passes", {}).get(scenario, [])]


def _records(r: dict, scenario: str):
    return [rec for p in _passes(r, scenario) for rec in p.records]


def _throughput_passes(r: dict) -> list[ScenarioPass]:
    return _passes(r, "offline") or _passes(r, "single-stream")


def _attention(r: dict) -> dict:
    return r.get("facts", {}).get("extra", {}).get("attention") or {}


def _one(v) -> list[float]:
    return [] if v is None else [float(v)]


METRICS: tuple[MetricDef, ...] = (
    MetricDef("single_task_latency", "Single-task latency (whole dataset)", "s", True,
              lambda r: [p.wall_time for p in _passes(r, "offline")], scenario="offline", checks_stability=True),
    MetricDef("e2el_p50", "E2EL p50", "s", True, lambda r: m.e2el(_records(r, "single-stream")),
              quantile(50), "single-stream"),
    MetricDef("e2el_p95", "E2EL p95", "s", True, lambda r: m.e2el(_records(r, "single-stream")),
              quantile(95), "single-stream"),
    MetricDef("e2el_p99", "E2EL p99", "s", True, lambda r: m.e2el(_records(r, "single-stream")),
              quantile(99), "single-stream"),
    MetricDef("ttft_p50", "TTFT p50", "s", True, lambda r: m.ttft(_records(r, "single-stream")),
              quantile(50), "single-stream"),
    MetricDef("ttft_p95", "TTFT p95", "s", True, lambda r: m.ttft(_records(r, "single-stream")),
              quantile(95), "single-stream"),
    MetricDef("tpot_p50", "TPOT p50", "s", True, lambda r: m.tpot(_records(r, "single-stream")),
              quantile(50), "single-stream", checks_stability=True),
    MetricDef("output_throughput", "Output throughput", "tok/s", False,
              lambda r: [x for p in _throughput_passes(r) if (x := m.output_throughput(p)) is not None],
              checks_stability=True),
    MetricDef("peak_throughput", "Peak throughput (best 1 s)", "tok/s", False,
              lambda r: [x for p in _throughput_passes(r) if (x := m.peak_throughput(p.records)) is not None],
              checks_stability=True),
    MetricDef("peak_memory", "Peak memory", "B", True,
              lambda r: _one(r.get("memory", {}).get("peak_bytes"))),
    MetricDef("memory_utilization", "Memory utilization", "%", True,
              lambda r: _one(r.get("memory", {}).get("utilization_pct"))),
    MetricDef("cold_start_import", "Cold start: import", "s", True,
              lambda r: _one(r.get("cold_start", {}).get("import_s"))),
    MetricDef("cold_start_load", "Cold start: load", "s", True,
              lambda r: _one(r.get("cold_start", {}).get("load_s"))),
    MetricDef("cold_start_compile", "Cold start: compile", "s", True,
              lambda r: _one(r.get("cold_start", {}).get("compile_s"))),
    MetricDef("cold_start_first_token", "Cold start: first token", "s", True,
              lambda r: _one(r.get("cold_start", {}).get("first_token_s"))),
    MetricDef("cold_start_total", "Cold start: total", "s", True,
              lambda r: _one(r.get("cold_start", {}).get("total_s"))),
    MetricDef("kv_cache_per_token", "KV cache per token", "B", True,
              lambda r: _one(_attention(r).get("kv_cache_bytes_per_token"))),
    MetricDef("kv_cache_2048", "KV cache (or state) per 2048-token sequence", "B", True,
              lambda r: _one(_attention(r).get("kv_cache_bytes_per_sequence", {}).get("2048"))),
    MetricDef("model_size", "Model size", "B", True,
              lambda r: _one(r.get("facts", {}).get("weight_bytes"))),
    MetricDef("bits_per_weight", "Bits per weight", "bits", None,
              lambda r: _one(r.get("facts", {}).get("bits_per_weight"))),
    MetricDef("kld_mean", "KLD mean (vs baseline)", "nats", True, lambda r: _one(r.get("kld_mean"))),
    MetricDef("kld_p99", "KLD p99 (vs baseline)", "nats", True, lambda r: _one(r.get("kld_p99"))),
    MetricDef("top1_agreement", "Top-1 agreement", "ratio", False, lambda r: _one(r.get("top1_agreement"))),
    MetricDef("ppl_ratio", "PPL ratio", "ratio", True, lambda r: _one(r.get("ppl_ratio"))),
    MetricDef("bits_per_byte", "Bits per byte (eval text)", "bits", True, lambda r: _one(r.get("bits_per_byte"))),
    MetricDef("task_accuracy", "Task accuracy (exact match)", "ratio", False,
              lambda r: _one(r.get("task_accuracy"))),
    MetricDef("accuracy_retention", "Accuracy retention", "ratio", False,
              lambda r: _one(r.get("accuracy_retention"))),
)
METRIC_KEYS = {d.key: d for d in METRICS}


def _sweep(r: dict, length: int, metric) -> list[float]:
    return metric([rec for rec in _records(r, "length-sweep") if rec.tokens_in == length])


def sweep_metrics(results: dict[str, dict]) -> tuple[MetricDef, ...]:
    """Rows for a length sweep: prefill time and per-token decode time at each prompt length measured."""
    lengths = sorted({rec.tokens_in for r in results.values() for rec in _records(r, "length-sweep")})
    return tuple(d for n in lengths for d in (
        MetricDef(f"prefill_{n}", f"Prefill @{n} tokens", "s", True, lambda r, n=n: _sweep(r, n, m.ttft),
                  scenario="length-sweep"),
        MetricDef(f"decode_{n}", f"Decode per token @{n}", "s", True, lambda r, n=n: _sweep(r, n, m.tpot),
                  scenario="length-sweep")))


def _stability_error(r: dict) -> list[float]:
    """Attention's relative error vs float64 at the longest length checked (inf when not finite)."""
    rows = r.get("stability") or []
    if not rows:
        return []
    last = max(rows, key=lambda x: x["length"])
    return [float("inf") if last["rel_error"] is None else last["rel_error"]]


STABILITY_METRIC = MetricDef("attention_error", "Attention rel. error vs fp64 (longest length)", "rel", True,
                             _stability_error, with_delta=False)


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    lower_is_better: bool | None
    cells: dict[str, Estimate | None]
    deltas: dict[str, Delta | None]
    note: str | None = None
    checks_stability: bool = False

    def to_json(self) -> dict:
        return {"key": self.key, "label": self.label, "unit": self.unit, "lower_is_better": self.lower_is_better,
                "cells": {k: (v.to_json() if v else None) for k, v in self.cells.items()},
                "deltas": {k: (v.to_json() if v else None) for k, v in self.deltas.items()}, "note": self.note,
                "checks_stability": self.checks_stability}

    @classmethod
    def from_json(cls, d: dict) -> "Row":
        return cls(d["key"], d["label"], d["unit"], d["lower_is_better"],
                   {k: (Estimate.from_json(v) if v else None) for k, v in d["cells"].items()},
                   {k: (Delta.from_json(v) if v else None) for k, v in d["deltas"].items()}, d.get("note"),
                   d.get("checks_stability", False))


@dataclass(frozen=True)
class Comparison:
    baseline: str
    variants: tuple[str, ...]
    status: dict[str, str]
    reasons: dict[str, str | None]
    tokenizers: dict[str, str | None]
    rows: tuple[Row, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)
    builds: dict[str, dict] = field(default_factory=dict)   # per variant: recipe, device, kernels, notes

    def row(self, key: str) -> Row:
        return next(r for r in self.rows if r.key == key)

    def to_json(self) -> dict:
        return {"baseline": self.baseline, "variants": list(self.variants), "status": self.status,
                "reasons": self.reasons, "tokenizers": self.tokenizers,
                "rows": [r.to_json() for r in self.rows], "warnings": list(self.warnings), "builds": self.builds}

    @classmethod
    def from_json(cls, d: dict) -> "Comparison":
        return cls(d["baseline"], tuple(d["variants"]), d["status"], d["reasons"], d["tokenizers"],
                   tuple(Row.from_json(r) for r in d["rows"]), tuple(d.get("warnings", ())), d.get("builds", {}))


# ------------------------------------------------------------------ accuracy against the baseline

def accuracy_facts(result: dict, samples: Sequence[dict]) -> dict:
    """Task accuracy (exact match of the generated answers) and bits per byte, from one result."""
    answers = {str(s.get("id", i)): s["answer"] for i, s in enumerate(samples)}
    records = _records(result, "offline")[:len(samples)] or _records(result, "single-stream")
    seen: dict[str, str] = {}
    for rec in records:
        if rec.ok and rec.request_id in answers and rec.request_id not in seen:
            seen[rec.request_id] = rec.output_text
    out: dict = {"graded": len(seen)}
    if seen:
        out["task_accuracy"] = acc.task_accuracy(list(seen.values()), [answers[k] for k in seen])
    a = result.get("accuracy")
    if a and a.get("n_bytes"):
        out["bits_per_byte"] = acc.bits_per_byte(a["nll_nats"], a["n_bytes"])
        out["ppl"] = math.exp(a["nll_nats"] / max(a["positions"], 1))
    return out


def distribution_facts(base_logprobs, base_targets, var_logprobs, var_targets) -> dict:
    """KLD, top-1 agreement from teacher-forced log-probs over the same tokens."""
    if base_logprobs.shape != var_logprobs.shape or (base_targets != var_targets).any():
        return {"not_comparable": "the two variants tokenised the evaluation text differently"}
    k = acc.kld_summary(base_logprobs, var_logprobs)
    return {"kld_mean": k["mean"], "kld_p99": k["p99"], "top1_agreement": acc.top1_agreement(base_logprobs, var_logprobs)}


# ------------------------------------------------------------------ the table

def compare_variants(results: dict[str, dict], baseline: str) -> Comparison:
    """Rows of every metric for every variant; deltas against `baseline`.

    `results[name]` is the worker result enriched with accuracy facts (task_accuracy,
    bits_per_byte, kld_mean, …) by the runner.
    """
    names = tuple(results)
    ok = {n for n, r in results.items() if r.get("status") == "ok"}
    base = results.get(baseline) if baseline in ok else None
    rows, warnings = [], []
    for d in METRICS + sweep_metrics(results) + (STABILITY_METRIC,):
        cells: dict[str, Estimate | None] = {}
        deltas: dict[str, Delta | None] = {}
        base_samples = d.samples(base) if base else []
        unstable: list[str] = []
        for n in names:
            if n not in ok:
                cells[n] = deltas[n] = None
                continue
            s = d.samples(results[n])
            cells[n] = est = estimate(s, d.unit, d.statistic) if s else None
            if est is not None and est.unstable and d.checks_stability:
                unstable.append(f"{n} {100 * est.cv:.0f}%")
            if n == baseline or not s or not base_samples or not d.with_delta:
                deltas[n] = None
            elif len(s) == 1 and len(base_samples) == 1:
                deltas[n] = exact_delta(base_samples[0], s[0]) if base_samples[0] else None
            else:
                deltas[n] = relative_delta(base_samples, s, d.statistic)
        if unstable:
            warnings.append(f"{d.label} is unstable (coefficient of variation over 10%): {', '.join(unstable)}")
        note = None
        if d.key in ("kld_mean", "kld_p99", "top1_agreement", "ppl_ratio"):
            why = {n: results[n].get("not_comparable") for n in names if results[n].get("not_comparable")}
            if why:
                note = "; ".join(f"{n}: not comparable ({w})" for n, w in why.items())
        rows.append(Row(d.key, d.label + (f" [{d.scenario}]" if d.scenario else ""), d.unit,
                        d.lower_is_better, cells, deltas, note, d.checks_stability))
    builds = {n: build_summary(results[n]) for n in names if n in ok}
    for n in names:
        for row in results[n].get("stability") or []:
            if row["status"] != "ok":
                err = "not finite" if row["rel_error"] is None else f"{row['rel_error']:.3g}"
                warnings.append(f"{n}: attention in {row['dtype']} at {row['length']} tokens is {row['status']} "
                                f"(relative error {err} against float64)")
    return Comparison(baseline, names, {n: results[n].get("status", "failed") for n in names},
                      {n: results[n].get("reason") for n in names},
                      {n: results[n].get("tokenizer_id") for n in names}, tuple(rows), tuple(warnings), builds)


def build_summary(result: dict) -> dict:
    """What ran: recipe, dtype, device and the kernels the layers used, with any fallback notes."""
    facts = result.get("facts", {})
    return {"recipe": facts.get("recipe"), "dtype": facts.get("dtype"), "device": result.get("device"),
            "attention": _attention(result).get("attention"), "build_s": result.get("build_s"),
            "kernels": list(facts.get("kernels", ())), "notes": list(facts.get("notes", ()))}
