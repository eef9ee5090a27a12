"""The layers of docs/architecture.md, checked on the source: every import (those inside functions too) goes
to the importing module's own layer or one below, and no module is in an import circle. Should an exception
ever be needed, it is listed here by name (KNOWN_UPWARD, KNOWN_CIRCLES, empty today), and the lists may only
shrink: a new one fails, and one that is gone must be struck off. The graph is built from the source with
`ast` (imports inside functions and under TYPE_CHECKING count); nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "variantlab"

# low to high; a module belongs to the first layer whose prefixes (dotted, below variantlab) match it best
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("errors", "plugins", "payloads", "sizes", "spec_model", "device_facts", "environment", "data", "models",
              "measure.records", "measure.stats", "measure.accuracy")),   # typed request records, pure numerics
    ("variants", ("variants",)),
    ("machine", ("hardware", "kernel_times", "hwconfig")),
    ("backends", ("backends",)),
    ("serving engine", ("serve.lane", "serve.engine", "serve.policies", "serve.calibrate", "serve.policy_kinds",
                        "serve.sampling", "serve.detok", "serve.shedding", "serve.admission", "serve.protocol",
                        "serve.body", "serve.metrics", "serve.scoring")),
    ("measure", ("measure", "store",                 # measure.runs: the runs read-model
                 # explain's instruments, which the profile tracker runs in a worker (its analysis is layer 8)
                 "explain.categories", "explain.profiling", "explain.counters", "explain.roofline")),
    ("suite and plan", ("suite", "advise.objectives", "advise.presets", "measure.plan", "measure.auto_recipe",
                        "measure.stored_suite")),
    ("orchestration", ("measure.runner", "measure.run_lock", "measure.ray_executor", "measure.disk_budget")),
    ("analysis and outputs", ("explain", "advise", "report")),
    ("interfaces", ("cli", "pipeline", "serve", "variantlab")),
)

# (importer, imported): upward imports allowed for now (none); strike each off as it goes
KNOWN_UPWARD: set[tuple[str, str]] = set()

# the import circles still to be broken (none: the list may only shrink, and a new circle fails)
KNOWN_CIRCLES: list[set[str]] = []


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts) or "variantlab"] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its source (function bodies included)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "variantlab":
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name.removeprefix("variantlab.") for a in node.names if a.name.startswith("variantlab.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("variantlab"):
                module = node.module.removeprefix("variantlab").removeprefix(".")
            else:
                continue
            # `from x import y`: the module x.y when there is one, else x (y a name in it)
            targets = [f"{module}.{a.name}".strip(".") if f"{module}.{a.name}".strip(".") in known else module
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer_of(name: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"module variantlab.{name} is in no layer: add it to LAYERS (docs/architecture.md)")
    return best


def upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in edges.items() for b in targets if layer_of(b) > layer_of(a)}


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_every_module_is_in_a_layer():
    for name in graph():
        layer_of(name)


def test_no_new_import_goes_up_a_layer_and_every_listed_one_is_still_there():
    found = upward(graph())
    new = sorted(found - KNOWN_UPWARD)
    assert not new, ("imports that go up a layer (docs/architecture.md): "
                     + "; ".join(f"{a} → {b} ({LAYERS[layer_of(a)][0]} → {LAYERS[layer_of(b)][0]})" for a, b in new))
    gone = sorted(KNOWN_UPWARD - found)
    assert not gone, f"no longer imported, strike them off KNOWN_UPWARD: {gone}"


def test_no_import_circle_but_the_listed_ones_and_every_listed_one_is_still_there():
    found = circles(graph())
    assert [sorted(c) for c in found if c not in KNOWN_CIRCLES] == []
    assert [sorted(c) for c in KNOWN_CIRCLES if c not in found] == [], "a circle is gone: strike it off KNOWN_CIRCLES"


def test_the_checker_finds_a_circle_and_an_upward_import():
    edges = {"errors": {"variants.build"}, "variants.build": {"errors"}, "cli": set()}
    assert circles(edges) == [{"errors", "variants.build"}]
    assert upward(edges) == {("errors", "variants.build")}
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("nowhere")
