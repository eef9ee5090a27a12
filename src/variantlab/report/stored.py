"""What the reports of a stored run read besides its comparison.

`run_page`: the HTML page's inputs (report/html.py's RunPage) — the plan's scenarios and dataset size,
each variant's attention kind, the explanation.json files in the run's folder
(<output_dir>/explain/<A>-vs-<B>/explanation.json). `stored_results`: the run as results.json holds it
(schema variantlab.results/1), for `variantlab show --format json`. `stored_recommendation`: the
recommendation's JSON when the suite (or a requirements file) asks for one, and advise is there.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..explain.run import finite
from ..measure.build_summary import BuildSummary
from ..measure.runs import RESULTS_SCHEMA, stored_comparison
from .html import RunPage


def explanations_in(output_dir: str | Path | None) -> list[dict]:
    """The explanation.json files under <output_dir>/explain/, in name order; an unreadable one is skipped."""
    if not output_dir:
        return []
    out = []
    for path in sorted(Path(output_dir).glob("explain/*/explanation.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def scenario_specs(plan: dict, suite: dict) -> tuple[dict, ...]:
    """The scenario entries the run measured (from its plan; the suite's list for a plan without them)."""
    specs = [t["config"]["spec"] for t in plan.get("trackers") or ()
             if isinstance(t.get("config"), dict) and isinstance(t["config"].get("spec"), dict)]
    return tuple(specs or ((suite.get("workload") or {}).get("scenarios") or ()))


def attention_kinds(comparison, plan: dict) -> dict[str, str]:
    """variant → its attention kind: what its build reports, else the plan's, else the model's own."""
    planned = {v.get("name"): v.get("attention") for v in plan.get("variants") or ()}
    return {v: (comparison.builds.get(v) or BuildSummary()).attention or planned.get(v) or "model's own"
            for v in comparison.variants}


def about_lines(row, comparison) -> tuple[str, ...]:
    env = row.environment
    lines = [f"run {row.run_id} ({row.status}), created {row.created}, suite {row.suite_name}; "
             f"baseline {comparison.baseline}"]
    if env.cpu_model:
        lines.append(f"{env.cpu_model} ({env.cpu_count} cores, {env.threads_per_worker} threads "
                     f"per worker), {env.rounds} round(s), torch {env.packages.get('torch')}, "
                     f"transformers {env.packages.get('transformers')}")
    return tuple(lines)


def run_page(store, run_id: str) -> RunPage:
    comparison, row = stored_comparison(store, run_id)
    return RunPage(comparison, f"variantlab report: {row.suite_name}", row.run_id, about_lines(row, comparison),
                   scenario_specs(row.plan, row.suite), row.plan.samples, attention_kinds(comparison, row.plan),
                   tuple(explanations_in(row.output_dir)))


def stored_results(store, run_id: str) -> dict:
    """The run as results.json holds it, from the store (a running or interrupted run: what it measured so
    far; its status says which); explanations from the run's folder."""
    comparison, row = stored_comparison(store, run_id)
    out = {"schema": RESULTS_SCHEMA, "run_id": row.run_id, "suite": row.suite_name, "output_dir": row.output_dir,
           "status": row.status, "environment": row.environment.to_json(), "comparison": comparison.to_json()}
    resolved = {v["name"]: v["resolved"]["summary"] for v in row.plan.variants
                if isinstance(v.get("resolved"), dict) and "summary" in v["resolved"]}
    if resolved:
        out["resolved"] = resolved
    recommendation = stored_recommendation(store, row.run_id)
    if recommendation is not None:
        out["recommendation"] = recommendation
    explanations = explanations_in(row.output_dir)
    if explanations:
        out["explanations"] = explanations
    return finite(out)


def has_requirements(suite: dict) -> bool:
    """True when the suite sets a requirement beyond its SLOs."""
    return any(v is not None for k, v in (suite.get("requirements") or {}).items() if k != "slo")


def stored_recommendation(store, run_id: str, requirements_path: str | Path | None = None) -> dict | None:
    """The recommendation's JSON for a stored run; None when nothing asks for one (no requirements in the
    suite and no file) or this variantlab has no recommender."""
    row = store.run(run_id)
    if requirements_path is None and not has_requirements(row.suite):
        return None
    try:
        from ..advise.recommend import recommend_stored
    except ImportError:
        return None
    got = recommend_stored(store, row.run_id, requirements_path)
    rec = got[0] if isinstance(got, tuple) else got     # (recommendation, comparison, row) or the recommendation
    return finite(rec.to_json())
