"""No module outside a registry decides by a kind's name: a comparison (==, !=, in, not in) of anything with
a registered scenario type, serve-policy name, attention kind or backend is allowed only in the modules that
define and register them (measure/scenarios/, serve/policies.py + serve/policy_kinds.py,
variants/attention_kinds.py, measure/backend_kinds/).
Everywhere else reads what the kind declares (a scenario's role, one_at_a_time, time_row, measured_rows,
profile_workload; a policy's routes, batches, keeps_slos; an attention kind's arg, needs_family,
swaps_modules and its hooks; a backend's builds, local_model, takes, fields and its hooks), so adding a kind is one module and one registration (docs/architecture.md).
Checked on the source with `ast`."""
from __future__ import annotations

import ast
from pathlib import Path

from variantlab.measure.backend_kinds import backend_names
from variantlab.measure.scenarios import SCENARIOS
from variantlab.serve.policy_kinds import policy_names
from variantlab.variants.attention_kinds import attention_kinds

SRC = Path(__file__).resolve().parents[1] / "src" / "variantlab"
REGISTRIES = {"scenario": ("measure/scenarios/",), "policy": ("serve/policies.py", "serve/policy_kinds.py"),
              "attention": ("variants/attention_kinds.py",), "backend": ("measure/backend_kinds/",)}


def names() -> dict[str, str]:
    return {**{k: "scenario" for k in SCENARIOS}, **{p: "policy" for p in policy_names()},
            **{k.name: "attention" for k in attention_kinds()}, **{b: "backend" for b in backend_names()}}


def constants(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for e in node.elts for v in constants(e)]
    return []


def dispatches(source: str, kinds: dict[str, str]) -> list[tuple[int, str, str]]:
    """(line, name, its kind) for each comparison of something with a registered kind's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            continue
        for side in (node.left, *node.comparators):
            found += [(node.lineno, v, kinds[v]) for v in constants(side) if v in kinds]
    return found


def test_no_module_but_a_registry_compares_with_a_scenario_policy_attention_or_backend_name():
    kinds, bad = names(), []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for line, name, kind in dispatches(path.read_text(), kinds):
            if not rel.startswith(REGISTRIES[kind]):
                bad.append(f"{rel}:{line}: compares with the {kind} name {name!r}")
    assert not bad, "; ".join(bad)


def test_the_check_finds_a_comparison_by_name():
    kinds = names()
    assert dispatches('if s.type == "offline":\n    pass\n', kinds) == [(1, "offline", "scenario")]
    assert dispatches('x = p in ("single", "static")\n', kinds) == [(1, "single", "policy"), (1, "static", "policy")]
    assert dispatches('if spec.kind in ("linear", "sliding"): pass\n', kinds) == [(1, "linear", "attention"),
                                                                                 (1, "sliding", "attention")]
    assert dispatches('if v.backend == "openai": pass\n', kinds) == [(1, "openai", "backend")]
    assert dispatches('label = "offline"\n', kinds) == []      # a name as data is no dispatch
