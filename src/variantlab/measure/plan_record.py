"""A run's plan as the store holds it (measure/plan.Plan.to_json): a typed payload (payloads.OpenPayload).

Read by attribute (`row.plan.rounds`) or by key (`row.plan["trackers"]`); its JSON is what was stored. The
store upgrades a plan of an earlier format as it reads it (store.COLUMN_FORMATS), so that readers see one
shape: format 1 named an endpoint variant's server `endpoint`; from format 2 a variant names its `backend`
and `backend_config`."""
from __future__ import annotations

from typing import Any

from ..payloads import OpenPayload
from ..variants.build import upgraded

FORMAT = 2


class PlanRecord(OpenPayload):
    baseline: str | None = None
    rounds: int = 1
    variants: tuple[dict[str, Any], ...] = ()       # VariantDefinition.to_json() + source (+ resolved, for auto)
    order: tuple[tuple[str, ...], ...] = ()         # the variants' order in each round
    trackers: tuple[dict[str, Any], ...] = ()       # {"kind", "config"}
    samples: int | None = None
    samples_sha256: str | None = None
    skip_bad_lines: bool = False

    def variant(self, name: str) -> dict[str, Any] | None:
        return next((v for v in self.variants if v.get("name") == name), None)


def upgrade_plan(plan: dict, version: int) -> dict:
    """A stored plan of format `version`, in today's shape (FORMAT)."""
    if version < 2:
        plan = {**plan, "variants": [upgraded(v) for v in plan.get("variants") or ()]}
    return plan
