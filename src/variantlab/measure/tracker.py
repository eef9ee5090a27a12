"""The tracker seam: one piece of a measurement that the worker hosts, and the metrics it owns.

A measurement is a fresh process that loads one variant and runs the trackers its job names, in
order: the scenarios (single-stream, offline, length-sweep: measure/scenarios/), then memory,
the variant's facts, the attention-error check, grading and scoring (measure/trackers/). Each
tracker returns one typed output (a frozen pydantic model, validated again when the record is
read) and declares the metrics it owns as `MetricDef`s, so that analysis never looks at a
tracker's name: it asks each tracker for its rows and how to get their samples out of an output.

Kinds of metric, by how they are judged (measure/analysis.py):
- "samples": many samples per round (per-request latencies, per-pass times): the value comes from
  a hierarchical bootstrap over rounds then samples, the delta from per-round paired ratios;
- "process": one value per round (cold start, peak memory): intervals over rounds; with one
  round a single sample with no verdict;
- "fact": deterministic, measured once per variant (model size, task accuracy on a fixed set):
  a value and a plain percent change, never a significance verdict;
- "versus": defined against the baseline (KLD, top-1 agreement, PPL ratio, accuracy retention):
  the tracker's `compare(base, variant, blobs)` computes them.

Adding a tracker is one module (its class, its output model, its metrics), one line in
measure/trackers/__init__.py and one test.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence

from pydantic import BaseModel, ConfigDict

from .stats import Statistic, median

MetricKind = Literal["samples", "process", "fact", "versus"]
TIMING_UNITS = ("s", "tok/s", "req/s", "GB/s")


class Output(BaseModel):
    """Base of every tracker output: frozen, unknown keys rejected (a version skew is an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


@dataclass(frozen=True)
class Problem:
    """A value that cannot be given, and why: "NaN logits from position 37", "not comparable: …"."""

    text: str


@dataclass(frozen=True)
class MetricDef:
    key: str                        # unique within its tracker; a row's key is "<tracker name>.<key>"
    label: str
    unit: str                       # s, tok/s, req/s, B, %, ratio, bits, nats, rel
    lower_is_better: bool | None    # None: neither (bits per weight is a fact, not a goal)
    kind: MetricKind
    samples: Callable[[Any], Sequence[float] | Problem] | None = None   # one round's output → samples
    statistic: Statistic = median
    headline: int | None = None     # position among the rows the terminal table shows by default
    checks_stability: bool = False  # repeated measurements of one quantity: warn when they spread
    with_delta: bool = True         # False where a percent change says nothing (errors near 0)
    sample_name: str = "samples"    # what one sample is, for "too few requests for p99"
    note: Callable[[Any], str | None] | None = None   # a round's output → what the figure covers, in words
    # a once tracker's (baseline output, variant output) → why the two figures cannot be compared (then the row
    # gives the variant no delta, and says why), or None when they can: a perplexity per token across tokenizers
    comparable: Callable[[Any, Any], Problem | None] | None = None

    @property
    def is_timing(self) -> bool:
        return self.unit in TIMING_UNITS and self.kind in ("samples", "process")


class HostContext(Protocol):
    """What the worker gives a tracker (measure/worker.py builds it)."""

    backend: Any                    # backends.base.Backend: the variant, loaded, behind the streaming engine
    built: Any                      # variants.build.BuiltVariant
    samples: tuple[dict, ...]       # the workload's samples: id, prompt, answer
    device: str
    cold_start: Any                 # trackers.cold_start.ColdStartOutput, timed by the host itself
    baseline_bytes: int             # the process's memory right after its imports
    shapes: list[str]               # what the scenarios have sent so far, for memory's coverage note
    outputs: dict[str, BaseModel]   # what the trackers before this one returned
    reference_dir: str | None       # the run's baseline reference (measure/reference.py), where scoring reads it
    writes_reference: bool          # this job writes that reference (the baseline's, before the rounds)
    same_checkpoint: bool           # the variant comes from the baseline's checkpoint (its ids are the baseline's)

    def progress(self, stage: str, fraction: float) -> None: ...

    def turn(self, tag: str) -> float:
        """Wait here while the round's other variants take their turn (measure/turns.py); the seconds waited.
        A scenario calls it before its warm-up and before each timed request or pass."""

    def add_blob(self, data: bytes) -> str: ...


class Tracker(Protocol):
    kind: str                        # registry key (measure/trackers/__init__.py)
    name: str                        # unique in a plan; the key of its output in a record
    once: bool                       # deterministic: run in each variant's first good round only
    output_model: type[Output]

    def config(self) -> dict:
        """JSON from which the registry rebuilds this tracker in the worker."""

    def metrics(self) -> tuple[MetricDef, ...]:
        """The rows this tracker owns."""

    def run(self, ctx: HostContext) -> Output:
        """Measure, in the worker."""

    def compare(self, base: Output, variant: Output, blobs: Callable[[str], bytes]) -> dict[str, float | Problem]:
        """Its "versus" rows: each key → a value or a Problem, from the baseline's and a variant's outputs."""

    def warnings(self, variant: str, output: Output) -> list[str]:
        """Plain-words warnings about one variant's output (an attention path that overflowed)."""


NOT_MEASURED = "not measured"
"""A tracker result's error that starts with this is a row the backend cannot give, not a failure."""


class NotMeasured(Exception):
    """Raised by a tracker's run when this backend (or endpoint) cannot give its rows: the worker records
    `not measured for this backend: <the message>` (NOT_MEASURED), not a failure."""


class TrackerBase:
    """The seam's defaults: measured every round, no comparison with the baseline, no warnings, and the
    variant's model needed in this process (an endpoint variant's measurement skips the tracker and says
    why: `remote_reason`)."""

    once = False
    writes_reference = False     # hosted alone by the baseline's reference job before the rounds (scoring)
    needs_local_model = True
    needs_torch_model = False    # reads our torch modules (not measured for a model another runtime runs)
    remote_reason = "it needs the model in the measuring process"

    def compare(self, base, variant, blobs) -> dict:
        return {}

    def warnings(self, variant: str, output) -> list[str]:
        return []


class Unconfigured(TrackerBase):
    """A tracker with nothing to configure: its config is {} and the worker rebuilds it as cls()."""

    def config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config: dict):
        return cls()


def blob_id(data: bytes) -> str:
    """Content address of a blob: its sha256, hex."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class WorkloadSettings:
    """What every scenario shares: stop rules and output length from the suite's workload, and SLOs."""

    max_new_tokens: int = 24
    stop: tuple[str, ...] = ("\n",)
    slo: dict = field(default_factory=dict)      # ttft_s, tpot_s, e2el_s (None or absent: no objective)

    def to_json(self) -> dict:
        return {"max_new_tokens": self.max_new_tokens, "stop": list(self.stop), "slo": dict(self.slo)}

    @classmethod
    def from_json(cls, d: dict) -> "WorkloadSettings":
        return cls(d["max_new_tokens"], tuple(d["stop"]), dict(d.get("slo") or {}))
