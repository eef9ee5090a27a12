"""Task accuracy: greedy answers to one declared set of samples, graded by exact match.

Every variant answers the same samples (the first `samples` of the dataset; all of them by
default), in batches, with the workload's stop rules, so that accuracy never depends on which
scenarios ran or how many requests they sent; the table shows n. Accuracy retention is the
variant's accuracy over the baseline's on that set. Deterministic: measured once per variant.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...backends.base import run_requests
from .. import accuracy as acc
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
        return {"accuracy_retention": var.accuracy / base.accuracy}
