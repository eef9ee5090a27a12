"""Deadline-aware admission (serve/shedding.py): a pure rule on the queue head's wait; no model, no clock."""
from __future__ import annotations

from variantlab.serve.policies import HOLD, URGENT
from variantlab.serve.shedding import SHED_AT, refusal


def test_a_newcomer_is_refused_only_while_the_queue_head_is_late():
    assert refusal(None, 0.1) is None                          # nobody waits
    assert refusal(0.059, 0.1) is None                         # 59 ms of a 100 ms SLO: it may join
    why = refusal(0.061, 0.1)
    assert why is not None and "61 ms" in why and "100 ms" in why
    assert refusal(10.0, None) is None                         # no TTFT SLO kept: the queue bound alone


def test_a_held_request_is_never_late_and_the_policy_catches_up_before_anything_is_refused():
    assert HOLD < URGENT < SHED_AT < 1
