"""Every tracker a measurement can host, by kind: one line to add one.

`standard_trackers(suite, n_samples)` is the list a bench plan runs, in order: cold start, the
machine's yardstick (trackers/machine.py), the suite's scenarios, memory (read after them), the
variant's facts, the attention-error check, grading and scoring (once per variant). The worker rebuilds each from (kind, config) with `tracker_from_config`.
"""
from __future__ import annotations

from ..scenarios import SCENARIOS, scenario_tracker
from ..tracker import WorkloadSettings
from .cold_start import ColdStart
from .facts import Facts
from .grading import Grading
from .machine import Machine
from .memory import Memory
from .profile import Profile
from .scoring import Scoring
from .stability import DEFAULT_LENGTHS, Stability, stability_within

TRACKERS = {cls.kind: cls for cls in (*SCENARIOS.values(), ColdStart, Machine, Memory, Facts, Stability, Grading,
                                 Scoring, Profile)}


def tracker_from_config(kind: str, config: dict):
    return TRACKERS[kind].from_config(config)


def workload_settings(suite) -> WorkloadSettings:
    w = suite.workload
    return WorkloadSettings(w.max_new_tokens, tuple(w.stop), suite.requirements.slo.model_dump())


def standard_trackers(suite, n_samples: int, position_limit: tuple[int, str] | None = None,
                      endpoint: bool = False) -> list:
    """The trackers a bench measurement runs, in order (`n_samples`: the dataset's size, as loaded;
    `position_limit`: (positions, why) of the smallest learned position table among the variants' models,
    which caps the attention-error check's lengths; `endpoint`: a variant is measured through an endpoint,
    so the local variants' scoring carries the token texts its top-k log-probabilities are matched by)."""
    w = suite.workload
    settings = workload_settings(suite)
    lengths = sorted({n for s in w.scenarios for n in s.context_lengths()}) or list(DEFAULT_LENGTHS)
    trackers = [ColdStart(), Machine(), *(scenario_tracker(s, settings) for s in w.scenarios), Memory(), Facts(),
                stability_within(lengths, position_limit)]
    if w.accuracy.graded != 0:
        graded = n_samples if w.accuracy.graded is None else min(w.accuracy.graded, n_samples)
        trackers.append(Grading(graded, w.accuracy.batch_size, settings))
    if w.accuracy.samples:
        trackers.append(Scoring(min(w.accuracy.samples, n_samples), token_texts=endpoint))
    return trackers
