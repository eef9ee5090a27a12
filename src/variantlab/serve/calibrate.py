"""A variant's decode-step time at each batch size, measured on this machine at server start.

The adaptive policy switches variant where these curves cross (weight-only int4 is 2-2.5x faster
than bf16 at one row and ~10x slower at a few dozen on our CPUs: docs/benchmarks.md's kernel figures), so
they are measured, not assumed: for each batch size, that many dummy requests with a prompt of
`context` tokens are prefilled into the variant's own lane and decoded for WARM + TIMED steps;
the step time is the fastest timed step (the others carry the machine's noise). Prefill's cost is a
line through those groups' prefills: a fixed part per call and a part per token (`prefill_line`). The sweep runs
twice and keeps each size's faster figure: the first pass carries every shape's one-off costs
(264 ms for a 1.7 ms step, measured). Under a second for the reference model.
"""
from __future__ import annotations

import time

from .lane import Lane, Row
from .policies import StepCost
from .sampling import SamplingParams

WARM, TIMED = 2, 4
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


class _Dummy:
    def __init__(self, i: int, ids: tuple[int, ...]):
        self.request_id, self.prompt_ids, self.sampling = f"calibrate-{i}", ids, SamplingParams()


def step_cost(lane: Lane, context: int = 64, clock=time.perf_counter, passes: int = 2) -> StepCost:
    """The lane's decode-step seconds at every power-of-two batch up to its max_rows."""
    tok = lane.engine.pad_id + 1 if lane.engine.pad_id + 1 < lane.model.config.vocab_size else 0
    ids = tuple([tok] * max(1, min(context, lane.max_len - WARM - TIMED - 1)))
    seconds: dict[int, float] = {}
    prefill: dict[int, float] = {}                      # tokens → the fastest prefill of that many
    for b in [b for _ in range(passes) for b in BATCH_SIZES if b <= lane.max_rows]:
        lane.start_group([_Dummy(i, ids) for i in range(b)])
        t0 = clock()
        while not lane.prefill_chunk():
            pass
        prefill[b * len(ids)] = min(clock() - t0, prefill.get(b * len(ids), float("inf")))
        rows = [row for row, _ in lane.join(lambda req, gen, first: Row(req, None, gen, 0, 0, first))]
        times = []
        for i in range(WARM + TIMED):
            t0 = clock()
            lane.step()
            if i >= WARM:
                times.append(clock() - t0)
        for row in rows:
            lane.release(row)
        seconds[b] = min(times + [seconds.get(b, float("inf"))])
    fixed, per_token = prefill_line(prefill)
    return StepCost(lane.name, monotone(seconds), per_token, fixed)


def monotone(seconds: dict[int, float]) -> dict[int, float]:
    """Each batch size's step time no higher than any larger batch's: a step of 16 rows cannot really take
    longer than one of 32, so a figure above a larger batch's is noise (7.8 ms at 16 against 4.9 ms at 32,
    measured once here) and the larger batch's stands for it."""
    out, best = {}, float("inf")
    for b in sorted(seconds, reverse=True):
        best = min(best, seconds[b])
        out[b] = best
    return dict(sorted(out.items()))


def prefill_line(points: dict[int, float]) -> tuple[float, float]:
    """(fixed seconds a prefill call costs, seconds per token) by least squares over (tokens, seconds);
    both kept >= 0. A small model's prefill is mostly the fixed part (3 ms of 4.7 ms for one 128-token
    prompt here), so a cost per token alone would make every small chunk look cheap."""
    xs, ys = list(points), [points[x] for x in points]
    if len(xs) < 2:
        return 0.0, (ys[0] / xs[0]) if xs else 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx) if sxx else 0.0
    return max(0.0, my - slope * mx), slope
