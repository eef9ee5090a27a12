"""The bench and build verbs: suite → plan → executor → results → comparison → store and reports.

`run_bench` is what `variantlab bench` and `variantlab.bench()` call. Input problems are raised
before anything runs (VariantlabError); a variant that fails while running is recorded as
failed with its reason and the others go on.

A variant whose recipe changes the weights (every recipe but the dtype ones) is measured from its
artifact (variants/artifact.py): before measuring it, the runner reuses a matching artifact (from
`artifacts_dir`, then the run folder) or builds one in a separate worker process, and the measuring
worker loads that — so cold start is the artifact's load and model size its size on disk. The build
is recorded apart from the measurement (result "build", "build_s"). `run_build` is `variantlab build`:
every variant of a suite built and saved, each in a fresh process.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from ..data.jsonl import load_jsonl
from ..data.structured import generate_samples
from ..environment import host_fingerprint
from ..errors import VariantlabError
from ..models.loading import check_model_dir, resolve_model_path
from ..store import DEFAULT_STORE, Store
from ..suite import Suite, load_suite
from ..variants.artifact import META_FILE, artifact_problem, needs_artifact, read_variant_json
from ..variants.registry import get_recipe, resolve_variant_attention, resolve_variant_recipe
from .analysis import Comparison, accuracy_facts, compare_variants, distribution_facts
from .executor import Executor, LocalProcessExecutor
from .worker import RESULT_VERSION


@dataclass(frozen=True)
class PlannedVariant:
    name: str
    recipe: str
    options: dict
    model_path: Path
    attention: str | None = None
    attention_options: dict | None = None
    compile: bool = False

    def to_spec(self) -> dict:
        """The variant as a worker reads it."""
        return {"name": self.name, "recipe": self.recipe, "options": self.options,
                "model_path": str(self.model_path), "attention": self.attention,
                "attention_options": self.attention_options or {}, "compile": self.compile}


@dataclass(frozen=True)
class Plan:
    suite: Suite
    suite_path: str
    variants: tuple[PlannedVariant, ...]   # baseline first
    samples: tuple[dict, ...]


@dataclass(frozen=True)
class BenchResult:
    """What a bench run produced: the comparison table and where everything was written."""

    run_id: str
    suite_name: str
    output_dir: Path
    store_path: Path
    environment: dict
    comparison: Comparison
    results: dict[str, dict]

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "suite": self.suite_name, "output_dir": str(self.output_dir),
                "environment": self.environment, "comparison": self.comparison.to_json()}


def make_plan(suite: Suite, suite_path: str, base_dir: Path) -> Plan:
    """Resolve and check every model and recipe, and load the dataset; raise on bad input."""
    base_model = resolve_model_path(suite.model, base_dir, file=suite_path, field="model")
    check_model_dir(base_model, file=suite_path, field="model")
    planned = []
    for i, v in enumerate(suite.variants):
        field = f"variants[{i}]"
        recipe, options = resolve_variant_recipe(v, file=suite_path, field=field)
        attention = resolve_variant_attention(v, file=suite_path, field=field)
        path = base_model
        if v.model is not None:
            path = resolve_model_path(v.model, base_dir, file=suite_path, field=f"{field}.model")
            check_model_dir(path, file=suite_path, field=f"{field}.model")
        planned.append(PlannedVariant(v.name, recipe, options, path, attention, dict(v.attention_options),
                                      v.compile))
    planned.sort(key=lambda p: p.name != suite.baseline_name)
    ds = suite.workload.dataset
    if ds.path is not None:
        p = Path(ds.path)
        samples = load_jsonl(p if p.is_absolute() else base_dir / p, limit=ds.n)
    else:
        samples = generate_samples(ds.n, ds.seed)
    return Plan(suite, suite_path, tuple(planned), tuple(samples))


def new_run_id() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def plan_suite_file(suite_path: str | Path) -> Plan:
    """Load and check a suite file: every input problem is raised here, before anything runs."""
    suite_path = str(suite_path)
    return make_plan(load_suite(suite_path), suite_path, Path(suite_path).resolve().parent)


def run_bench(suite_path: str | Path, **kwargs) -> BenchResult:
    """Measure every variant of a suite file; return the comparison (also stored and reported)."""
    return run_plan(plan_suite_file(suite_path), **kwargs)


def run_plan(plan: Plan, *, store_path: str | Path | None = None,
             output_dir: str | Path | None = None, executor: Executor | None = None,
             artifacts_dir: str | Path | None = None,
             on_progress: Callable[[str, str, float], None] | None = None,
             on_variant_done: Callable[[str, dict], None] | None = None) -> BenchResult:
    """Measure a checked plan's variants in order, storing each result as it finishes.

    `artifacts_dir` (e.g. what `variantlab build` wrote): a valid artifact in artifacts_dir/<variant>
    is reused; a missing or stale one is built into the run folder (artifacts_dir is never written)."""
    suite, suite_path = plan.suite, plan.suite_path
    check_artifacts_dir(artifacts_dir)
    executor = executor or LocalProcessExecutor()
    run_id = new_run_id()
    out = Path(output_dir or suite.output.dir) / run_id
    out.mkdir(parents=True, exist_ok=True)
    samples_path = out / "samples.jsonl"
    samples_path.write_text("".join(json.dumps(s) + "\n" for s in plan.samples))
    env = host_fingerprint()
    store_file = Path(store_path or suite.output.store or DEFAULT_STORE)
    results: dict[str, dict] = {}
    with Store(store_file) as store:
        store.create_run(run_id, suite.model_dump(mode="json"), suite_path, env, str(out))
        for v in plan.variants:
            spec = _worker_spec(plan, v) | {
                "samples_path": str(samples_path.resolve()),
                "scenarios": [s.model_dump(mode="json") for s in suite.workload.scenarios],
                "max_new_tokens": suite.workload.max_new_tokens,
                "accuracy_samples": suite.workload.accuracy.samples,
                "logprobs_path": str((out / "variants" / v.name / "logprobs.safetensors").resolve()),
            }
            progress = (lambda stage, f, name=v.name: on_progress(name, stage, f)) if on_progress else None
            build = None
            if needs_artifact(get_recipe(v.recipe)):
                build = _artifact_for(plan, v, out / "variants" / v.name, executor, artifacts_dir, on_progress)
                spec["variant"]["artifact_path"] = build.get("artifact_path")
            if build is not None and build["status"] != "ok":
                result = {"version": RESULT_VERSION, "status": build["status"], "reason": f"build: {build['reason']}"}
            else:
                result = executor.run(spec, out / "variants" / v.name, suite.timeout_s, progress)
            if build is not None:
                result["build"], result["build_s"] = build, build.get("build_s")
            results[v.name] = result
            store.put_measurement(run_id, v.name, result)
            if on_variant_done:
                on_variant_done(v.name, result)
        add_accuracy(results, plan.samples, suite.baseline_name)
        for name, r in results.items():
            store.put_measurement(run_id, name, r)
        comparison = compare_variants(results, suite.baseline_name)
        store.finish_run(run_id, comparison.to_json())
    result = BenchResult(run_id, suite.name, out, store_file, env, comparison, results)
    from ..report.files import write_reports
    write_reports(result)
    return result


def check_artifacts_dir(artifacts_dir: str | Path | None) -> None:
    """Raise (bad input) when an artifacts folder is given and is not a folder."""
    if artifacts_dir is not None and not Path(artifacts_dir).is_dir():
        raise VariantlabError(f"artifacts folder {artifacts_dir} does not exist", field="--artifacts",
                              accepted="a folder of variant artifacts written by `variantlab build --out DIR`")


def _build_spec(plan: Plan, v: PlannedVariant, artifact_dir: Path) -> dict:
    return _worker_spec(plan, v) | {"mode": "build", "artifact_dir": str(artifact_dir.resolve())}


def _worker_spec(plan: Plan, v: PlannedVariant) -> dict:
    """What every worker job of a variant needs: the variant, device, threads and seed."""
    suite = plan.suite
    return {"variant": v.to_spec(), "device": suite.device, "threads": suite.threads or os.cpu_count(),
            "seed": suite.seed}


def _build_record(result: dict, reused: bool, skipped: list[str]) -> dict:
    """What a bench result keeps of its variant's build (or of the artifact it reused)."""
    record = {"status": result.get("status", "failed"), "reason": result.get("reason"), "reused": reused,
              "artifact_path": result.get("artifact_path"), "build_s": result.get("build_s"),
              "bytes_on_disk": result.get("bytes_on_disk")}
    if skipped:
        record["not_reused"] = skipped
    return record


def _device_type(device: str) -> str:
    if device != "auto":
        return device.split(":")[0]
    import torch  # only to resolve "auto" when there is an artifact to check against it
    return "cuda" if torch.cuda.is_available() else "cpu"


def _artifact_for(plan: Plan, v: PlannedVariant, variant_dir: Path, executor: Executor,
                  artifacts_dir: str | Path | None, on_progress) -> dict:
    """A valid artifact of `v`: reused from artifacts_dir/<name> or the run folder, else built there
    in a fresh worker process. Returns its build record ("status" not "ok" when the build failed)."""
    own = variant_dir / "artifact"
    candidates = ([Path(artifacts_dir) / v.name] if artifacts_dir is not None else []) + [own]
    skipped: list[str] = []
    for c in candidates:
        if not (c / META_FILE).is_file():
            if c != own:
                skipped.append(f"{c}: no artifact there")
            continue
        problem = artifact_problem(c, v.recipe, v.options, v.model_path, _device_type(plan.suite.device),
                                   attention=v.attention, attention_options=v.attention_options)
        if problem is None:
            meta = read_variant_json(c)
            return _build_record({"status": "ok", "artifact_path": str(c.resolve()),
                                  "build_s": meta.get("build", {}).get("build_s"),
                                  "bytes_on_disk": meta["weights"]["bytes_on_disk"]}, True, skipped)
        skipped.append(f"{c}: {problem}")
    if on_progress:
        on_progress(v.name, "build", 0.0)
    progress = (lambda stage, f: on_progress(v.name, f"build: {stage}", 0.0)) if on_progress else None
    result = executor.run(_build_spec(plan, v, own), variant_dir / "build", plan.suite.timeout_s, progress)
    return _build_record(result, False, skipped)


def default_artifacts_dir(plan: Plan) -> Path:
    """Where `variantlab build` saves a suite's artifacts unless told: ./artifacts/<suite name>/."""
    return Path.cwd() / "artifacts" / plan.suite.name


def run_build(plan: Plan, out_dir: str | Path | None = None, *, executor: Executor | None = None,
              on_variant_start: Callable[[str], None] | None = None,
              on_variant_done: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
    """Build every variant of a checked plan, each in a fresh process, into out_dir/<variant name>/.

    Returns the worker result per variant: status, reason, artifact_path, facts, bytes_on_disk,
    build_s. A failing variant is recorded with its reason and the others go on."""
    out = Path(out_dir) if out_dir is not None else default_artifacts_dir(plan)
    out.mkdir(parents=True, exist_ok=True)
    executor = executor or LocalProcessExecutor()
    results: dict[str, dict] = {}
    for v in plan.variants:
        if on_variant_start:
            on_variant_start(v.name)
        logs = out / ".logs" / v.name  # the worker's spec, result and stderr
        result = executor.run(_build_spec(plan, v, out / v.name), logs, plan.suite.timeout_s)
        result.setdefault("artifact_path", None)
        results[v.name] = result
        if on_variant_done:
            on_variant_done(v.name, result)
    return results


def add_accuracy(results: dict[str, dict], samples, baseline: str) -> None:
    """Enrich each ok result with task accuracy, bits per byte, and (vs baseline) KLD, top-1, PPL ratio."""
    from safetensors.numpy import load_file

    for r in results.values():
        if r.get("status") == "ok":
            r.update(accuracy_facts(r, samples))
    base = results.get(baseline, {})
    if base.get("status") != "ok":
        return
    base_lp = _load_logprobs(base, load_file)
    for name, r in results.items():
        if r.get("status") != "ok":
            continue
        if "task_accuracy" in r and base.get("task_accuracy"):
            r["accuracy_retention"] = r["task_accuracy"] / base["task_accuracy"]
        if r.get("tokenizer_id") != base.get("tokenizer_id"):
            r["not_comparable"] = (f"tokenizer {r.get('tokenizer_id')} differs from the baseline's "
                                   f"{base.get('tokenizer_id')}; compare bits per byte and task accuracy")
            continue
        if "ppl" in r and base.get("ppl"):
            r["ppl_ratio"] = r["ppl"] / base["ppl"]
        var_lp = _load_logprobs(r, load_file)
        if base_lp is not None and var_lp is not None:
            facts = distribution_facts(base_lp["logprobs"], base_lp["targets"], var_lp["logprobs"], var_lp["targets"])
            r.update(facts)
    for r in results.values():  # the log-prob files are large; the numbers above are what we keep
        path = (r.get("accuracy") or {}).get("logprobs_path")
        if path and r is not base:
            Path(path).unlink(missing_ok=True)
    path = (base.get("accuracy") or {}).get("logprobs_path")
    if path:
        Path(path).unlink(missing_ok=True)


def _load_logprobs(result: dict, load_file):
    path = (result.get("accuracy") or {}).get("logprobs_path")
    if not path or not Path(path).is_file():
        return None
    return load_file(path)
