"""Deadline-aware admission: refuse (429) newcomers while the server already runs late on its TTFT SLO.

Past capacity a queue only grows, and every request in it misses its TTFT; a server that keeps
accepting them also slows the ones already running (measured: the 115M Llama at 3 req/s, 1.5x its
capacity, answered nothing within its SLOs). So a server that keeps a TTFT SLO (the adaptive policy)
judges its queue by how long its head has waited, as CoDel does, not by its length: while the oldest
request not yet admitted has waited SHED_AT of the SLO or more, a newcomer is refused with 429 and
Retry-After. It would join behind requests that are late already, and at the rate the server admits,
it would be late too. No rate estimate is needed, so a burst that the server absorbs in time refuses
nothing, and the queue's own bound still holds.

SHED_AT lies above the adaptive policy's HOLD (how long it may hold newcomers to prefill them
together: a held request is not late) and its URGENT (past which it prefills whole groups, at the
running rows' expense, to catch up): a server sheds only once catching up has not been enough. It
leaves the rest of the SLO for the newcomer's own prefill. Measured through HTTP on the reference model
(the router's view of a queue head is a Load report up to 20 ms old plus the time since): at 0.4 the
adaptive server met its SLOs for only 87-91% of requests at 60-80 req/s while its p95 TTFT and TPOT
stayed inside them (68-84 ms, 11-14 ms): it refused requests that would have made it. At 0.6, 99% at
100 req/s, 11 of 1,494 refused.
"""
from __future__ import annotations

SHED_AT = 0.6
RETRY_AFTER_S = 1.0       # Retry-After is whole seconds; a late queue drains within one TTFT SLO


def refusal(oldest_wait_s: float | None, ttft_slo_s: float | None) -> str | None:
    """Why a newcomer is refused now (the 429's message), or None when it may join: the oldest waiting
    request has waited `oldest_wait_s` (None: nobody waits) under a TTFT SLO of `ttft_slo_s` (None: none
    kept, nothing refused)."""
    if ttft_slo_s is None or oldest_wait_s is None or oldest_wait_s < SHED_AT * ttft_slo_s:
        return None
    return (f"the oldest waiting request has waited {1e3 * oldest_wait_s:.0f} ms, {SHED_AT:.0%} or more of the "
            f"TTFT SLO ({1e3 * ttft_slo_s:g} ms): a newcomer would be late")
