"""Peak memory: what the variant costs, apart from what the process costs.

`import torch, transformers` alone is about 250 MiB of resident memory, against a few MiB of
weights for the reference model; so the worker reads the process's resident set right after its
imports (the baseline) and this tracker reports the peak above it — weights, activations, KV
caches and per-shape kernel caches — beside the whole-process peak. The peak is the kernel's
high-water mark (getrusage ru_maxrss) on the CPU and torch's peak allocation on a GPU; it is read
after the scenarios and before scoring (whose full-vocabulary logits are not serving memory), and
the row says which workload shapes it covered.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..stats import mean
from ..tracker import MetricDef, Output, Unconfigured


class MemoryOutput(Output):
    peak_bytes: int                 # the process's (or device's) high-water mark
    baseline_bytes: int             # after the imports, before loading anything
    total_bytes: int                # the device's memory
    instrument: str
    covered: tuple[str, ...]        # the shapes the scenarios sent before the reading

    @property
    def above_baseline(self) -> int:
        return max(0, self.peak_bytes - self.baseline_bytes)


def read_peak(device: str) -> tuple[int, int, str]:
    """(peak bytes, total bytes, instrument) of this process on `device`."""
    import resource

    import psutil
    if device.startswith("cuda"):
        import torch
        return (int(torch.cuda.max_memory_allocated()), int(torch.cuda.get_device_properties(0).total_memory),
                "device: torch.cuda.max_memory_allocated")
    # Linux reports KiB, and updates its high-water mark lazily: the resident set read now can be above it
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, psutil.Process().memory_info().rss)
    return int(peak), int(psutil.virtual_memory().total), "process peak RSS (getrusage ru_maxrss)"


def current_bytes(device: str) -> int:
    """What the process holds now: resident set (CPU) or allocated device memory (GPU)."""
    if device.startswith("cuda"):
        import torch
        return int(torch.cuda.memory_allocated())
    import psutil
    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class Memory(Unconfigured):
    kind = "memory"
    remote_reason = "the endpoint's memory is not visible from the client"
    name = "memory"
    output_model = MemoryOutput

    def metrics(self) -> tuple[MetricDef, ...]:
        return (
            MetricDef("peak", "Peak memory above the post-import baseline", "B", True, "process",
                      lambda out: [out.above_baseline], mean, headline=8,
                      note=lambda out: f"read after {'; '.join(out.covered) or 'no scenario'} "
                                       f"({out.instrument}; baseline: the process after its imports)"),
            MetricDef("process_peak", "Peak memory of the process", "B", True, "process",
                      lambda out: [out.peak_bytes], mean),
            MetricDef("baseline", "Process memory after imports", "B", True, "process",
                      lambda out: [out.baseline_bytes], mean),
            MetricDef("utilization", "Memory utilization (process peak / device)", "%", True, "process",
                      lambda out: [100.0 * out.peak_bytes / out.total_bytes] if out.total_bytes else [], mean),
        )

    def run(self, ctx) -> MemoryOutput:
        peak, total, instrument = read_peak(ctx.device)
        return MemoryOutput(peak_bytes=peak, baseline_bytes=ctx.baseline_bytes, total_bytes=total,
                            instrument=instrument, covered=tuple(ctx.shapes))
