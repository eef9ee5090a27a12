"""`variantlab explain RUN A B`: why B's time differs from A's, measured, in fresh workers.

    explain_run("variantlab.sqlite", "20261201-0801-ab12", "bf16", "flash-quant")

Both variants' artifacts from the stored run are loaded in fresh worker processes (the bench's own
executor and worker host), A B then B A over `rounds` rounds, each hosting only the profiling tracker
(measure/trackers/profile.py) on the run's own workload: its prompts, its max_new_tokens, one
single-stream workload and one offline batch where the suite has those scenarios. Profiling never
runs beside a timed measurement, so it touches no figure of the run.

The result (`Explanation`) holds, per workload and phase: the attribution of B − A to categories and
operators (explain/attribution.py), each variant's place on the roofline (roofline.py: bytes and
FLOPs a token must move and do, the machine's ceilings the worker measured or cached), hardware
counters or why there are none, and the run's own figures for the same phases, so that the
explanation can be held against what was measured without the profiler.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..errors import VariantlabError
from ..variants.artifact import META_FILE
from ..variants.registry import int8_activations
from .roofline import ModelShape, Roofline, StepCost, per_token_decode_cost, per_token_prefill_cost, roofline
from .attribution import PhaseAttribution, attribute, phase_times

DEFAULT_ROUNDS = 2


class ExplainFailed(Exception):
    """A profiling worker failed for every round of a variant: nothing to compare. The message says why."""


def profile_tracker(suite, n_samples: int, reps: int = 3):
    """The profiling tracker for a suite's workload: each scenario's own profiled work (its
    `profile_workload`: single-stream one request at a time, offline one batch), each shape once."""
    from ..measure.scenarios import SCENARIOS
    from ..measure.trackers.profile import Profile, WorkloadSpec
    specs: list[WorkloadSpec] = []
    for s in suite.workload.scenarios:
        shape = SCENARIOS[s.type].profile_workload(s, n_samples)
        if shape is None:
            continue
        spec = WorkloadSpec(s.type, *shape)
        if spec not in specs:
            specs.append(spec)
    if not specs:      # a length-sweep-only suite: decode as the one-at-a-time scenario does
        one = one_at_a_time()
        specs.append(WorkloadSpec(one.kind, *one.profile_workload(None, n_samples)))
    return Profile(tuple(specs), suite.workload.max_new_tokens, reps)


def one_at_a_time():
    """The scenario class whose requests run one at a time (single-stream): the run's TPOT explain checks."""
    from ..measure.scenarios import SCENARIOS
    return next(cls for cls in SCENARIOS.values() if cls.one_at_a_time)


@dataclass(frozen=True)
class Target:
    """A variant to profile: its definition as planned and the artifact its build saved."""

    name: str
    definition: dict
    artifact_dir: str


def profile_variants(targets: tuple[Target, Target], tracker, samples, *, device: str, threads: int, seed: int,
                     rounds: int, workdir: Path, timeout_s: float, executor=None,
                     on_job: Callable[[str], None] = lambda label: None,
                     trust_remote_code: bool = False) -> dict[str, list]:
    """name → its ProfileOutputs, one per round that succeeded; A B, then B A, round by round.
    Raises ExplainFailed when every round of a variant failed."""
    from ..measure.executor import LocalProcessExecutor
    from ..measure.trackers.profile import ProfileOutput
    from ..measure.wire import MeasureJob, TrackerJob
    from ..variants import kernels
    executor = executor or LocalProcessExecutor()
    kernels.prepare(None, device)     # a build of our CPU kernels happens here, not in a profiled worker
    got: dict[str, list] = {t.name: [] for t in targets}
    failures: dict[str, list[str]] = {t.name: [] for t in targets}
    for r in range(rounds):
        for t in (targets if r % 2 == 0 else targets[::-1]):
            job = MeasureJob(variant=t.definition, artifact_dir=t.artifact_dir, round=r, device=device,
                             threads=threads, seed=seed, samples=tuple(samples),
                             trackers=(TrackerJob(kind=tracker.kind, config=tracker.config()),), run_once=False,
                             trust_remote_code=trust_remote_code)
            on_job(f"profiling {t.name} · round {r + 1}/{rounds}")
            record, _ = executor.run(job, workdir / f"{t.name}-r{r + 1}", timeout_s)
            result = next((o for o in record.outputs if o.name == tracker.name), None) if record.status == "ok" else None
            if result is None or result.error:
                failures[t.name].append(record.reason or (result.error if result else "no profile in the record"))
                continue
            got[t.name].append(ProfileOutput.model_validate(result.data))
    for name, outs in got.items():
        if not outs:
            raise ExplainFailed(f"profiling {name} failed in every round: {failures[name][0]}")
    return got


@dataclass(frozen=True)
class PhaseRoofline:
    variant: str
    scenario: str
    phase: str
    cost: StepCost            # per token
    place: Roofline | None
    problem: str | None = None


@dataclass(frozen=True)
class Explanation:
    run_id: str | None
    a: str
    b: str
    rounds: dict[str, int]                     # profiled rounds that succeeded, per variant
    phases: tuple[PhaseAttribution, ...]
    rooflines: tuple[PhaseRoofline, ...]
    counters: dict[str, dict[str, dict]]       # variant → scenario → {"reason", "per_token": {event: n}}
    measured: dict[str, tuple[str, ...]]       # "scenario/phase" → the run's own figures for it, in words
    kernels: dict[str, tuple[str, ...]]
    ceilings: dict
    profiler_cost: dict[str, dict[str, float]] = field(default_factory=dict)   # variant → "scenario/phase" → share
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        def phase(p: PhaseAttribution) -> dict:
            return {"scenario": p.scenario, "phase": p.phase, "a_s_per_token": p.a.total, "b_s_per_token": p.b.total,
                    "difference_s_per_token": p.diff, "near_zero": p.near_zero, "notes": list(p.notes),
                    "accounted": dict(zip(("categories", "share"), p.accounted())),
                    "categories": [{"category": r.category, "a": r.a, "b": r.b, "difference": r.diff,
                                    "share": r.share, "top_op": r.top_op,
                                    "top_op_calls_per_token": list(r.top_op_calls) if r.top_op_calls else None}
                                   for r in p.rows],
                    "ops": [{"name": o.name, "category": o.category, "a_s": o.a.seconds, "b_s": o.b.seconds,
                             "a_calls": o.a.calls, "b_calls": o.b.calls} for o in p.ops]}
        return {"run_id": self.run_id, "a": self.a, "b": self.b, "rounds": self.rounds,
                "phases": [phase(p) for p in self.phases],
                "rooflines": [{"variant": r.variant, "scenario": r.scenario, "phase": r.phase,
                               "bytes_per_token": r.cost.bytes, "flops_per_token": r.cost.flops,
                               "problem": r.problem,
                               "place": None if r.place is None else {
                                   "verdict": r.place.verdict, "bound": r.place.bound,
                                   "fraction_of_floor": r.place.fraction_of_floor,
                                   "achieved_gbps": r.place.achieved_gbps,
                                   "achieved_tflops": r.place.achieved_tflops}} for r in self.rooflines],
                "counters": self.counters, "measured": {k: list(v) for k, v in self.measured.items()},
                "kernels": {k: list(v) for k, v in self.kernels.items()}, "ceilings": self.ceilings,
                "profiler_cost": self.profiler_cost, "warnings": list(self.warnings)}


def _peak(ceilings: dict, recipe: str, dtype: str) -> float | None:
    """The compute ceiling a recipe's matmuls run against: int8 ones for w8a8/w4a8, else its dtype's."""
    if int8_activations(recipe):
        return ceilings.get("int8_tops")
    return (ceilings.get("matmul_tflops") or {}).get(dtype)


def place_on_roofline(variant: str, out, workload, phase: str, seconds: float) -> PhaseRoofline:
    """One variant's phase per token against the ceilings its worker recorded."""
    shape = ModelShape(**out.shape)
    if phase == "decode":
        cost = per_token_decode_cost(shape, workload.mean_prompt_tokens + (workload.new_tokens - 1) / 2,
                                     workload.batch)
    else:
        cost = per_token_prefill_cost(shape, max(workload.mean_prompt_tokens, 1), workload.batch)
    read = out.ceilings.get("read_gbps")
    if not (isinstance(read, (int, float)) and math.isfinite(read) and read > 0 and seconds > 0):
        return PhaseRoofline(variant, workload.scenario, phase, cost, None, "no measured read bandwidth")
    return PhaseRoofline(variant, workload.scenario, phase, cost,
                         roofline(cost, seconds, read, _peak(out.ceilings, out.recipe, out.dtype)))


def explain_profiles(a: str, b: str, profiles: dict[str, list], *, run_id: str | None = None,
                     comparison=None) -> Explanation:
    """The explanation of B against A from their profiles (several rounds each); `comparison`: the run's own
    measured rows, quoted beside the attribution."""
    pa, pb = profiles[a], profiles[b]
    phases, places, costs = [], [], {a: {}, b: {}}
    counters: dict[str, dict] = {a: {}, b: {}}
    for w in pa[0].workloads:
        if not all(any(x.scenario == w.scenario for x in p.workloads) for p in (*pa, *pb)):
            continue
        per = {n: [next(x for x in p.workloads if x.scenario == w.scenario) for p in profiles[n]] for n in (a, b)}
        for phase_name in ("prefill", "decode"):
            times = {n: phase_times([next(ph for ph in x.phases if ph.phase == phase_name) for x in per[n]])
                     for n in (a, b)}
            phases.append(attribute(w.scenario, phase_name, times[a], times[b]))
            for n in (a, b):
                places.append(place_on_roofline(n, profiles[n][0], per[n][0], phase_name, times[n].plain))
                costs[n][f"{w.scenario}/{phase_name}"] = times[n].profiled / times[n].plain - 1
        for n in (a, b):
            c = per[n][0].counters
            counters[n][w.scenario] = {"reason": c.reason,
                                       "per_token": {k: v / c.tokens for k, v in c.counts.items()} if not c.reason
                                       else {}}
    return Explanation(run_id, a, b, {a: len(pa), b: len(pb)}, tuple(phases), tuple(places), counters,
                       measured_figures(comparison, a, b) if comparison is not None else {},
                       {a: pa[0].kernels, b: pb[0].kernels}, pa[0].ceilings, costs,
                       disagreements(comparison, phases, a, b) if comparison is not None else ())


def measured_rows() -> dict:
    """The run's rows quoted beside each phase: (scenario, phase) → ((row key suffix, what it is), …), as each
    scenario declares them (its `measured_rows`)."""
    from ..measure.scenarios import SCENARIOS
    return {(kind, phase): rows for kind, cls in SCENARIOS.items() for phase, rows in cls.measured_rows.items()}


AGREE_WITHIN = 1.5     # a profiled worker's plain decode over the run's TPOT, beyond which the machine differed


def measured_figures(comparison, a: str, b: str) -> dict[str, tuple[str, ...]]:
    """"scenario/phase" → "TPOT p50: A 0.71 ms, B 2.05 ms (+189% of A)" lines from the run's comparison."""
    from ..report.format import fmt_value
    out: dict[str, tuple[str, ...]] = {}
    for (scenario, phase), rows in measured_rows().items():
        lines = []
        for suffix, label in rows:
            try:
                row = comparison.row(f"{scenario}.{suffix}")
            except KeyError:
                continue
            ca, cb = row.cells.get(a), row.cells.get(b)
            if ca is None or cb is None or ca.value is None or cb.value is None:
                continue
            text = f"{label}: {a} {fmt_value(ca.value, row.unit)}, {b} {fmt_value(cb.value, row.unit)}"
            if ca.value:
                text += f" ({cb.value / ca.value - 1:+.0%} of {a})"
            lines.append(text)
        if lines:
            out[f"{scenario}/{phase}"] = tuple(lines)
    return out


def disagreements(comparison, phases: Sequence[PhaseAttribution], a: str, b: str) -> tuple[str, ...]:
    """Where a profiling worker's plain per-token decode time is over AGREE_WITHIN× off the run's own TPOT p50:
    the machine was not the same (busier, most often), and the explanation says so."""
    out = []
    one = one_at_a_time().kind
    try:
        row = comparison.row(f"{one}.tpot_p50")
    except KeyError:
        return ()
    for p in phases:
        if (p.scenario, p.phase) != (one, "decode"):
            continue
        for name, t in ((a, p.a), (b, p.b)):
            cell = row.cells.get(name)
            if cell is None or not cell.value:
                continue
            ratio = t.plain / cell.value
            if not 1 / AGREE_WITHIN <= ratio <= AGREE_WITHIN:
                out.append(f"{name}'s decode ran at {ratio:.2f}× the run's TPOT p50 in the profiling workers: the "
                           "machine was not as it was during the run (other load); the shares describe the profiled "
                           "workers, compare the run's own figures with care")
    return tuple(out)


def explain_run(store_path: str | Path, run_id: str, a: str, b: str, *, rounds: int = DEFAULT_ROUNDS,
                executor=None, on_job: Callable[[str], None] = lambda label: None) -> tuple[Explanation, Path]:
    """Profile A and B of a stored run and explain B against A; write explain/<A>-vs-<B>.{json,md} in the
    run's folder. Returns (explanation, folder)."""
    from ..measure.plan import available_cores, dataset_samples
    from ..measure.runs import stored_comparison
    from ..measure.stored_suite import stored_suite
    from ..store import Store

    store_path = Path(store_path)
    if not store_path.exists():
        raise VariantlabError("no results store here", file=str(store_path),
                              accepted="the path of a store written by `variantlab bench` (--store)")
    with Store(store_path) as store:
        row = store.run(run_id)
        comparison, _ = stored_comparison(store, row.run_id)
        builds = {r.variant: r for r in store.records(row.run_id, "build")}
    names = [v["name"] for v in row.plan.variants]
    for field_name, name in (("A", a), ("B", b)):
        if name not in names:
            raise VariantlabError(f"run {row.run_id} has no variant '{name}'", field=field_name,
                                  accepted=", ".join(names))
    if a == b:
        raise VariantlabError("A and B are the same variant", field="B", accepted="two different variants of the run")
    targets = []
    for name in (a, b):
        build = builds.get(name)
        if build is None or build.status != "ok":
            raise VariantlabError(f"variant '{name}' was not built in run {row.run_id}"
                                  + (f" ({build.status}: {build.reason})" if build else ""),
                                  field="A" if name == a else "B", accepted="a variant the run measured")
        if not Path(build.artifact_dir, META_FILE).is_file():
            raise VariantlabError(f"the artifact of '{name}' is gone", file=build.artifact_dir,
                                  accepted="a run whose folder is still there (run `variantlab bench` again)")
        definition = row.plan.variant(name)
        targets.append(Target(name, {k: v for k, v in definition.items() if k != "source"}, build.artifact_dir))
    suite = stored_suite(row, row.suite_path or "<stored suite>")
    base_dir = Path(row.suite_path).resolve().parent if row.suite_path else Path.cwd()
    samples = dataset_samples(suite.workload.dataset, base_dir)
    out_dir = Path(row.output_dir or ".") / "explain" / f"{a}-vs-{b}"
    threads = row.environment.threads_per_worker or suite.threads or available_cores()
    explanation = explain_pair(tuple(targets), suite, samples, threads=threads, rounds=rounds, folder=out_dir,
                               run_id=row.run_id, comparison=comparison, executor=executor, on_job=on_job)
    return explanation, out_dir


def explain_pair(targets: tuple[Target, Target], suite, samples, *, threads: int, folder: Path,
                 rounds: int = DEFAULT_ROUNDS, run_id: str | None = None, comparison=None, executor=None,
                 on_job: Callable[[str], None] = lambda label: None) -> Explanation:
    """Profile targets[0] (A) and targets[1] (B) on the suite's workload, explain B against A, and write
    explanation.{json,md} into `folder` (the workers' files under folder/jobs). Raises ExplainFailed."""
    profiles = profile_variants(targets, profile_tracker(suite, len(samples)), samples, device=suite.device,
                                threads=threads, seed=suite.seed, rounds=rounds, workdir=folder / "jobs",
                                timeout_s=suite.timeout_s, executor=executor, on_job=on_job,
                                trust_remote_code=suite.trust_remote_code)
    explanation = explain_profiles(targets[0].name, targets[1].name, profiles, run_id=run_id, comparison=comparison)
    write_explanation(explanation, folder)
    return explanation


def explain_step(run, result):
    """The step after a run for `explain: true` (measure/runner.AfterRun): every variant measured slower than
    the baseline explained against it. A variant whose profiling fails, or Ctrl-C while profiling, leaves a
    note; the measured run is already stored."""
    import dataclasses

    from ..measure.runner import slower_than_baseline
    plan = run.plan
    if not plan.suite.explain:
        return result
    base = plan.baseline
    slower = slower_than_baseline(result.comparison)
    if not slower:
        return dataclasses.replace(result, explain_notes=(
            "explain: no variant was slower than the baseline beyond its interval; nothing to explain",))
    done, notes = [], []
    for name in slower:
        targets = tuple(Target(n, plan.variant(n).definition.to_json(), run.builds[n].artifact_dir) for n in (base, name))
        try:
            done.append(explain_pair(targets, plan.suite, plan.samples, threads=run.threads,
                                     folder=run.out / "explain" / f"{base}-vs-{name}", run_id=run.out.name,
                                     comparison=result.comparison, executor=run.executor, on_job=run.events.on_job))
        except ExplainFailed as e:
            notes.append(f"explain {name}: {e}")
        except KeyboardInterrupt:
            run.executor.kill()
            notes.append("explain: interrupted; the run itself is complete and stored")
            break
    return dataclasses.replace(result, explanations=tuple(done), explain_notes=tuple(notes))


def finite(obj):
    """JSON-safe: every non-finite float (a NaN, an infinity) becomes None, never an invalid NaN token."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_explanation(explanation: Explanation, out_dir: Path) -> None:
    from .render import explanation_markdown
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "explanation.json").write_text(json.dumps(finite(explanation.to_json()), indent=2, allow_nan=False))
    (out_dir / "explanation.md").write_text(explanation_markdown(explanation, True))
