"""The serve-policy registry: each policy a `PolicyKind` that says what it is and makes itself over lanes.

`variantlab serve --policy NAME` (serve/assembly.py), the router's shedding (serve/workers.py) and the
bench's server scenario (measure/scenarios/server.py) all go through here, so none of them matches a
policy by name. Adding a policy is one module that defines its class (serve/policies.py holds the
built-in three), one `register_policy(PolicyKind(...))` and its tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import VariantlabError
from .calibrate import step_cost
from .policies import AdaptivePolicy, Policy, SinglePolicy, StaticPolicy, StepCost


@dataclass(frozen=True)
class PolicySettings:
    """What a policy is made with; each kind reads the fields it needs."""
    max_rows: int = 32                 # a lane's largest batch
    batch_size: int = 8                # static
    max_wait_s: float = 0.02           # static
    tpot_slo_s: float | None = None    # adaptive
    ttft_slo_s: float | None = None    # adaptive


Made = tuple[Policy, dict[str, StepCost]]   # the policy, and the step costs it measured to decide ({} if none)


@dataclass(frozen=True)
class PolicyKind:
    name: str
    help: str
    make: Callable[[dict, PolicySettings, Callable[[str], None]], Made]   # (lanes by variant, settings, log)
    routes: bool = False          # chooses among several variants; else it serves the first one given
    batches: bool = True          # runs several requests at once; else one at a time (a one-row lane will do)
    keeps_slos: bool = False      # holds the TTFT SLO it is given, by which a router may shed newcomers


_KINDS: dict[str, PolicyKind] = {}


def register_policy(kind: PolicyKind) -> PolicyKind:
    if kind.name in _KINDS:
        raise ValueError(f"a serve policy named {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    return kind


def policy_names() -> tuple[str, ...]:
    return tuple(_KINDS)


def policy_kind(name: str, field: str = "--policy") -> PolicyKind:
    """The registered kind; bad input naming `field` for any other name."""
    try:
        return _KINDS[name]
    except KeyError:
        raise VariantlabError(f"unknown policy {name!r}", field=field, accepted=" | ".join(_KINDS)) from None


def make_policy(name: str, lanes: dict, settings: PolicySettings, log: Callable[[str], None] = lambda _: None) -> Made:
    return policy_kind(name).make(lanes, settings, log)


def _single(lanes: dict, settings: PolicySettings, log) -> Made:
    return SinglePolicy(next(iter(lanes))), {}


def _static(lanes: dict, settings: PolicySettings, log) -> Made:
    return StaticPolicy(next(iter(lanes)), settings.batch_size, settings.max_wait_s), {}


def _adaptive(lanes: dict, settings: PolicySettings, log) -> Made:
    costs = {n: step_cost(lane) for n, lane in lanes.items()}
    for n, c in costs.items():
        log(f"measured {n}: decode step " + ", ".join(f"{b}: {1e3 * s:.2f} ms" for b, s in sorted(c.seconds.items())))
    return AdaptivePolicy(costs, tpot_slo_s=settings.tpot_slo_s, ttft_slo_s=settings.ttft_slo_s,
                          max_rows=settings.max_rows), costs


register_policy(PolicyKind("single", "one request at a time, in the first variant", _single, batches=False))
register_policy(PolicyKind("static", "a fixed batch of the first variant, started when full or after a wait",
                           _static))
register_policy(PolicyKind("adaptive", "continuous batching that keeps the TPOT SLO and switches variant with load",
                           _adaptive, routes=True, keeps_slos=True))
