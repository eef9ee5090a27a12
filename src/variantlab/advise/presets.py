"""Requirement presets named after the analysis's deployment scenarios.

Each preset is a set of requirement fields a user can read (`variantlab requirements PRESET`) and
override: a field set in the suite wins over the preset's. Accuracy floors follow the analysis's
"accuracy loss" column (loss below 1% → retention ≥ 0.99, …); the analysis's guessed scheme and
speedup stay beside them so the measured selection matrix can be read against the guess.
Latency limits are not preset: seconds depend on the model and the machine, so a preset only says
what to optimize; give `max_e2el_s` and the like in the suite.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    fields: dict = field(default_factory=dict)
    analysis_scheme: str = ""          # what the analysis's selection matrix guessed
    analysis_loss: str = ""
    analysis_speedup: str = ""


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("high-precision", "accuracy first: lose under 1% of task accuracy and stay close to the baseline's "
                             "distributions; then the lowest p95 latency",
           {"min_accuracy_retention": 0.99, "max_kld": 0.01, "objective": "e2el_p95"},
           "FP16 hybrid", "<1%", "1.2–1.5×"),
    Preset("balanced", "lose at most 3% of task accuracy; then the best balance of p95 latency and throughput "
                       "(equal weights on their log ratios to the baseline)",
           {"min_accuracy_retention": 0.97, "objective": {"e2el_p95": 1.0, "throughput": 1.0}},
           "INT8 symmetric", "1–3%", "2–3×"),
    Preset("resource-constrained", "lose at most 8% of task accuracy; then the least peak memory and the smallest "
                                   "weights (equal weights)",
           {"min_accuracy_retention": 0.92, "objective": {"memory": 1.0, "size": 1.0}},
           "INT4 asymmetric", "3–8%", "3–5×"),
    Preset("extreme-compression", "lose at most 15% of task accuracy; then the smallest weights",
           {"min_accuracy_retention": 0.85, "objective": "size"},
           "Dynamic + sparsity", "8–15%", "5–10×"),
    Preset("real-time", "lose at most 3% of task accuracy; then the lowest tail latency a token (p95 TPOT), "
                        "which is what a streaming user feels",
           {"min_accuracy_retention": 0.97, "objective": "tpot_p95"},
           "sliding-window attention", "", ""),
)}


def expand(requirements):
    """`requirements` with its preset's fields filled in where the suite left them unset."""
    if requirements.preset is None:
        return requirements
    preset = PRESETS[requirements.preset]
    unset = {k: v for k, v in preset.fields.items() if getattr(requirements, k) is None}
    return requirements.model_copy(update=unset)


def preset_yaml(name: str) -> str:
    """The preset as a suite's `requirements:` block, with what each line means."""
    import yaml
    p = PRESETS[name]
    body = yaml.safe_dump({"requirements": {"preset": name, **p.fields}}, sort_keys=False, default_flow_style=False)
    head = [f"# {name}: {p.summary}."]
    if p.analysis_scheme:
        guess = ", ".join(x for x in (p.analysis_scheme, p.analysis_loss and f"{p.analysis_loss} accuracy loss",
                                      p.analysis_speedup and f"{p.analysis_speedup} speedup") if x)
        head.append(f"# The analysis guessed: {guess}. `variantlab recommend RUN` measures it.")
    head.append("# Any field set in your suite overrides the preset's; add limits such as max_e2el_s: {p95: 0.5}.")
    return "\n".join(head) + "\n" + body
