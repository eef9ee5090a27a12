"""A stored run's suite, read as the user wrote it.

A run stores its suite whole (`runs.suite_json`: the suite's full dump, every field written out); `bench
--resume` and `explain` parse it again. A key the user left out is null in that dump (a dataset's `n`, a
variant's `recipe` and `compile`: suite.py), so the stored suite re-parses to what the user meant. Runs
stored before that wrote the defaults out as if given (`n: 64`, `recipe: fp32`, `compile: false`), which
read again meant something else: a JSONL file shorter than 64 lines became an error, an endpoint or an
analysis-vocabulary variant was refused, an auto variant lost the compile it chose. `as_given` turns such a
default back into null where the run's stored plan shows it was not given: each rule fires only on what a run
could not have been stored with, had the key been given (planning refuses it), so today's dumps pass unchanged.
"""
from __future__ import annotations

import copy

from ..suite import DEFAULT_SAMPLES, Suite, parse_suite
from .backend_kinds import backend_kind, backend_names

_ANALYSIS_WORDS = ("weight_dtype", "activation_dtype", "quant_scheme")


def as_given(suite: dict, plan: dict) -> dict:
    """The stored suite with the defaults a previous version wrote out for keys not given made null again."""
    suite = copy.deepcopy(suite)
    dataset = (suite.get("workload") or {}).get("dataset") or {}
    samples = plan.get("samples")
    if dataset.get("path") is not None and isinstance(dataset.get("n"), int) and isinstance(samples, int) \
            and samples < dataset["n"]:
        dataset["n"] = None           # a given n refuses a shorter file: the run would not exist
    planned = {v.get("name"): v for v in plan.get("variants") or () if isinstance(v, dict)}
    for v in suite.get("variants") or ():
        backend = v.get("backend", "torch")
        if backend in backend_names() and "recipe" not in backend_kind(backend).takes:   # given, refused there
            v.update({k: None for k, old in (("recipe", "fp32"), ("compile", False)) if v.get(k) == old})
        elif any(v.get(w) is not None for w in _ANALYSIS_WORDS) and v.get("recipe") == "fp32":
            v["recipe"] = None                        # given beside weight_dtype, a recipe is refused
        elif v.get("recipe") == "auto" and v.get("compile") is False \
                and (planned.get(v.get("name")) or {}).get("compile") is True:
            v["compile"] = None                       # given, the variant's own compile wins over auto's
        if v.get("compile") is False and (planned.get(v.get("name")) or {}).get("decode_step", True) is True:
            v["compile"] = None                       # given, `compile: false` would have planned transformers'
                                                      # modules (decode_step false): this one was a default
    return suite


def stored_suite(row, file: str) -> Suite:
    """A store's run row's suite (SuiteError when it no longer parses: a suite of another version)."""
    return parse_suite(as_given(row.suite, row.plan or {}), file)


def workload_as_measured(suite: dict) -> dict:
    """A stored suite's workload with the dataset's default n written in, so that a run stored with `n: 64`
    written out (a previous version's dump) and one with it left out compare as the same workload."""
    workload = copy.deepcopy(suite.get("workload") or {})
    dataset = workload.get("dataset")
    if isinstance(dataset, dict) and dataset.get("n") is None:
        dataset["n"] = DEFAULT_SAMPLES
    return workload
