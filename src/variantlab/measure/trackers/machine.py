"""The machine's own speed, measured in every measurement: a fixed yardstick that is not the variant.

Within a run, interleaved rounds cancel the machine's drift: every variant meets the same slow
minutes. Across runs nothing cancels it. On these shared VMs whole minutes run 1.5x slower than
others (two quickstart runs three minutes apart: TPOT 1.61 vs 2.68 ms, cold-start imports 1.1-1.3x
slower, with the same code), so `variantlab compare` needs to know how much the machine itself
changed between two runs before it calls anything slower.

The yardstick is fixed work that uses neither variantlab's code nor the variant (a change to our
engine must not read as the machine slowing down): a small torch MLP run one row at a time, the
way a small model's decode step dispatches its operators, and a pure-Python loop, the interpreter
work around it. Each is timed REPEATS times after one untimed pass; each timing is a sample.
About 60 ms a measurement.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..tracker import MetricDef, Output, Unconfigured

REPEATS = 5
MLP_LAYERS, MLP_WIDTH, MLP_PASSES = 8, 256, 50
PYTHON_ITERATIONS = 100_000


class MachineOutput(Output):
    small_ops_s: tuple[float, ...]     # one timing per repeat: MLP_PASSES passes of the MLP
    python_s: tuple[float, ...]        # one timing per repeat: PYTHON_ITERATIONS of the loop
    threads: int


def small_ops_once(layers, x) -> None:
    import torch
    with torch.inference_mode():
        for _ in range(MLP_PASSES):
            h = x
            for layer in layers:
                h = torch.relu(layer(h))


def python_once() -> int:
    total = 0
    for i in range(PYTHON_ITERATIONS):
        total += i * i % 7
    return total


def timings(work, repeats: int = REPEATS, clock=time.perf_counter) -> tuple[float, ...]:
    """One untimed pass, then `repeats` timed ones."""
    work()
    out = []
    for _ in range(repeats):
        t = clock()
        work()
        out.append(clock() - t)
    return tuple(out)


@dataclass(frozen=True)
class Machine(Unconfigured):
    kind = "machine"
    name = "machine"
    output_model = MachineOutput
    needs_local_model = False

    def metrics(self) -> tuple[MetricDef, ...]:
        note = "fixed work, not the variant: how fast this machine ran in each measurement process"
        return (
            MetricDef("small_ops", f"Machine yardstick: small torch ops ({MLP_PASSES} passes of a "
                      f"{MLP_LAYERS}-layer {MLP_WIDTH}-wide MLP, one row)", "s", True, "samples",
                      lambda out: list(out.small_ops_s), sample_name="timings", note=lambda out: note),
            MetricDef("python", f"Machine yardstick: Python loop ({PYTHON_ITERATIONS:,} iterations)", "s", True,
                      "samples", lambda out: list(out.python_s), sample_name="timings"),
        )

    def run(self, ctx) -> MachineOutput:
        import torch
        gen = torch.Generator().manual_seed(0)
        layers = [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH) for _ in range(MLP_LAYERS)]
        with torch.no_grad():
            for layer in layers:
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) / MLP_WIDTH ** 0.5)
        x = torch.randn(1, MLP_WIDTH, generator=gen)
        return MachineOutput(small_ops_s=timings(lambda: small_ops_once(layers, x)), python_s=timings(python_once),
                             threads=torch.get_num_threads())
