"""Task accuracy: greedy answers to one declared set of samples, graded by exact match.

Every variant answers the same samples (the first `samples` of the dataset; all of them by
default), in batches, with the workload's stop rules, so that accuracy never depends on which
scenarios ran or how many requests they sent; the table shows n. Accuracy retention is the
variant's accuracy over the baseline's on that set, with a paired bootstrap interval over the samples
(which ones a variant gets right is what varies, not the clock). Deterministic: measured once per variant.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...backends.base import run_requests
from .. import accuracy as acc
from ..stats import Estimate
from ..tracker import MetricDef, Output, Problem, TrackerBase, WorkloadSettings
from ..scenarios.common import requests_for


class GradingOutput(Output):
    ids: tuple[str, ...]
    outputs: tuple[str, ...]
    correct: tuple[bool, ...]
    errors: int = 0

    @property
    def accuracy(self) -> float | None:
        return sum(self.correct) / len(self.correct) if self.correct else None


@dataclass(frozen=True)
class Grading(TrackerBase):
    samples: int | None = None            # None: the whole dataset
    batch_size: int = 16
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    kind = "grading"
    name = "grading"
    once = True
    needs_local_model = False   # generated answers: any backend, an endpoint's included
    output_model = GradingOutput

    def config(self) -> dict:
        return {"samples": self.samples, "batch_size": self.batch_size, "workload": self.workload.to_json()}

    @classmethod
    def from_config(cls, config: dict) -> "Grading":
        return cls(config.get("samples"), config.get("batch_size", 16), WorkloadSettings.from_json(config["workload"]))

    def metrics(self) -> tuple[MetricDef, ...]:
        n = "all samples" if self.samples is None else f"n={self.samples}"
        if self.samples is not None and self.samples == 0:
            return ()
        return (
            MetricDef("accuracy_retention", "Accuracy retention (vs baseline)", "ratio", False, "versus", headline=1),
            MetricDef("task_accuracy", f"Task accuracy (exact match, {n})", "ratio", False, "fact",
                      lambda out: [] if out.accuracy is None else [out.accuracy]),
        )

    def run(self, ctx) -> GradingOutput:
        chosen = ctx.samples[:self.samples] if self.samples is not None else ctx.samples
        requests = requests_for(chosen, len(chosen), self.workload)
        ids, outputs, correct, errors = [], [], [], 0
        for k in range(0, len(requests), self.batch_size):
            for s, rec in zip(chosen[k:k + self.batch_size],
                              run_requests(ctx.backend, requests[k:k + self.batch_size])):
                ids.append(str(s.get("id", len(ids))))
                outputs.append(rec.output_text)
                correct.append(rec.ok and acc.exact_match(rec.output_text, s["answer"]))
                errors += not rec.ok
            ctx.progress(self.name, min(1.0, (k + self.batch_size) / len(requests)))
        return GradingOutput(ids=tuple(ids), outputs=tuple(outputs), correct=tuple(correct), errors=errors)

    def compare(self, base: GradingOutput, var: GradingOutput, blobs) -> dict:
        if base.ids != var.ids:
            return {"accuracy_retention": Problem("graded different samples than the baseline")}
        if not base.accuracy:
            return {"accuracy_retention": Problem("the baseline answered no sample correctly")}
        interval = acc.retention_interval(base.correct, var.correct)
        low, high = interval if interval else (None, None)
        return {"accuracy_retention": Estimate(value=var.accuracy / base.accuracy, low=low, high=high,
                                               n=len(var.correct), cv=None, unit="ratio",
                                               method=f"paired bootstrap over {len(var.correct)} samples")}
