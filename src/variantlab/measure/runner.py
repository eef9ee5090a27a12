"""The bench and build verbs carried out: plan → builds → interleaved rounds → store → comparison.

`measure_plan` (and `measure_resumed`) is what pipeline.run_plan — which `variantlab bench` and
`variantlab.bench()` call — runs, attaching the steps after a run (explain, recommend, the reports: each in
its own layer above this one, docs/architecture.md). Input problems are raised
before anything runs (VariantlabError). Then:
1. every variant's artifact is reused (from `artifacts_dir` or the run folder, when it matches) or
   built in a fresh worker — every variant, dtype ones too, so that each measurement loads weights
   already stored in its own dtype and cold start and memory compare like with like;
2. round by round, in the plan's order, each variant is measured in a fresh worker; the once-per-
   variant trackers run in its first good round. With `interleave: requests` (the default) a round's
   workers stay resident and take the machine in turn, request by request (measure/turns.py);
3. every record is committed to the store the moment it arrives; the comparison is computed from
   the stored records (measure/analysis.py) and reported.
A variant that fails is recorded with its reason and the others go on. An interrupted run
(SIGINT, SIGTERM) ends its worker, is marked `interrupted` and keeps what it finished.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

from ..environment import HostEnvironment, host_fingerprint
from ..errors import StoreError, VariantlabError
from ..store import DEFAULT_STORE, DONE, INTERRUPTED, Store
from ..variants.artifact import META_FILE, artifact_problem
from ..variants.build import calibration_digest
from ..variants.page_cache import settle_files
from .analysis import Comparison, analyse
from .backend_kinds import backend_kind
from .disk_budget import build_budget, check_disk, disk_budget, say_disk, to_stderr
from .executor import Executor, LocalProcessExecutor, Task
from .limits import Limits, format_bytes
from .plan import Plan, PlannedVariant, available_cores
from .plan_record import PlanRecord
from .reference import ReferenceMissing, open_reference
from .run_lock import run_lock
from .runs import RESULTS_SCHEMA
from .wire import BuildJob, BuildRecord, MeasureJob, TrackerJob


PROCESS_BYTES = 640 * 2**20   # a measuring worker beside its weights (torch, the tokenizer, buffers): for interleave
MEMORY_SHARE = 0.7            # of the memory available, what a round in turns may plan to hold


def available_memory() -> int | None:
    """Memory this machine has available now (psutil), or None where it cannot be read."""
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no figure: nothing is refused for it
        return None


def why_not_in_turns(local: bool, weights: Sequence[int], free: int | None) -> str | None:
    """Why a round cannot run in turns, or None: it needs an executor that keeps workers on this machine (`local`)
    and room in memory for every variant at once (its artifact's bytes, `weights`, and PROCESS_BYTES a process)
    within MEMORY_SHARE of what is `free` (unknown: nothing refused)."""
    if not local:
        return "this executor runs each job on its own, not a round's workers resident on this machine"
    need = sum(weights) + PROCESS_BYTES * len(weights)
    if free is not None and need > MEMORY_SHARE * free:
        return (f"holding every variant at once needs about {format_bytes(need)}, and this machine has "
                f"{format_bytes(free)} available")
    return None


class RunInterrupted(Exception):
    """The run was stopped (SIGINT/SIGTERM); what it finished is stored and the run is `interrupted`."""

    def __init__(self, run_id: str, store_path: Path, kept: int):
        self.run_id, self.store_path, self.kept = run_id, store_path, kept
        super().__init__(f"run {run_id} interrupted; {kept} records kept in {store_path}")


@dataclass
class Events:
    """What the CLI's progress display hears; every callback optional."""

    on_start: Callable[[int], None] = lambda total_jobs: None
    on_job: Callable[[str], None] = lambda label: None
    on_progress: Callable[[str, str, float], None] = lambda label, stage, fraction: None
    on_done: Callable[[str, object], None] = lambda label, record: None
    on_note: Callable[[str], None] | None = None   # a line before the jobs (our kernels being built); None: stderr


@dataclass(frozen=True)
class BenchResult:
    """What a bench run produced: the comparison table and where everything was written."""

    run_id: str
    suite_name: str
    output_dir: Path
    store_path: Path
    environment: HostEnvironment
    comparison: Comparison
    wall_s: float = 0.0
    explanations: tuple = ()          # explain.run.Explanation, with `explain: true`
    explain_notes: tuple[str, ...] = ()
    resolved: dict = field(default_factory=dict)   # variant → what `recipe: auto` chose and why (its summary)
    recommendation: object = None     # advise.recommend.Recommendation, when the suite has requirements

    def __post_init__(self) -> None:  # given as the JSON it is stored as: the typed payload
        object.__setattr__(self, "environment", HostEnvironment.model_validate(self.environment))

    def to_json(self) -> dict:
        out = {"schema": RESULTS_SCHEMA, "run_id": self.run_id, "suite": self.suite_name,
               "output_dir": str(self.output_dir), "environment": self.environment.to_json(),
               "comparison": self.comparison.to_json()}
        if self.resolved:
            out["resolved"] = dict(self.resolved)
        if self.recommendation is not None:
            out["recommendation"] = self.recommendation.to_json()
        if self.explanations or self.explain_notes:
            out["explanations"] = [e.to_json() for e in self.explanations]
            out["explain_notes"] = list(self.explain_notes)
        return out


@dataclass(frozen=True)
class FinishedRun:
    """What a step after a run (AfterRun) may use beside the result: the plan, the builds, and the run's own
    executor, threads and events (explain's profiling runs through them)."""

    plan: Plan
    run_id: str
    out: Path
    builds: dict          # variant → BuildRecord
    executor: Executor
    threads: int
    events: Events


AfterRun = Callable[[FinishedRun, BenchResult], BenchResult]
"""A step after a run: the result with what it adds (explanations, a recommendation) or having written
something (the reports). pipeline.AFTER_RUN holds the bench's own: explain, recommend, reports."""


def new_run_id() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def make_folder(path: Path, what: str, field: str, accepted: str) -> Path:
    """mkdir -p `path`; an OS error (a file in the way, no permission) is bad input: one line, exit 2."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise VariantlabError(f"cannot create {what}: {e.strerror}", file=str(path), field=field,
                              accepted=accepted) from None
    return path


def check_artifacts_dir(artifacts_dir: str | Path | None) -> None:
    """Raise (bad input) when an artifacts folder is given and is not a folder."""
    if artifacts_dir is not None and not Path(artifacts_dir).is_dir():
        raise VariantlabError(f"artifacts folder {artifacts_dir} does not exist", field="--artifacts",
                              accepted="a folder of variant artifacts written by `variantlab build --out DIR`")


def machine_warnings(threads: int, machine_cores: int | None = None, load: float | None = None) -> list[str]:
    """Plain-words warnings about the machine before measuring: an oversubscribed CPU. The load average
    counts every runnable process of the machine, so it is compared with the machine's cores; `threads` is
    what each of this run's workers uses (the suite's `threads`)."""
    machine_cores = machine_cores or os.cpu_count() or threads
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            return []
    if load > machine_cores - 0.5:
        return [f"the machine was busy when the run started: load average {load:.1f} on {machine_cores} cores "
                f"(this run's workers use {threads} thread{'s' if threads != 1 else ''}); timings carry other "
                "jobs' load (rounds spread it over every variant; the noise line says how much)"]
    return []


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM ignored inside (main thread only; elsewhere nothing changes)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def measure_plan(plan: Plan, *, store_path: str | Path | None = None, output_dir: str | Path | None = None,
                 executor: Executor | None = None, artifacts_dir: str | Path | None = None,
                 events: Events | None = None, after: Sequence[AfterRun] = ()) -> BenchResult:
    """Build, then measure a checked plan round by round, storing each record as it arrives; then the steps
    `after` the run, in order (pipeline.run_plan attaches explain, recommend and the reports).

    `artifacts_dir` (e.g. what `variantlab build` wrote): a valid artifact in artifacts_dir/<variant>
    is reused; a missing or stale one is built into the run folder (artifacts_dir is never written)."""
    t0 = time.perf_counter()
    suite = plan.suite
    check_artifacts_dir(artifacts_dir)
    run_id = new_run_id()
    plan = plan.for_run(run_id)
    threads = suite.threads or available_cores()
    env = HostEnvironment.model_validate(host_fingerprint() | {"threads_per_worker": threads, "rounds": plan.rounds})
    store_file = Path(store_path or suite.output.store or DEFAULT_STORE)
    # the disk first: a run it cannot hold is refused before the store or the run folder is touched
    disk = check_disk(disk_budget(plan, Path(output_dir or suite.output.dir) / run_id, store_file,
                                  artifacts_dir=artifacts_dir))
    # the store is checked before the run folder is made: a refused store leaves no empty folder behind
    with Store(store_file) as store, run_lock(store_file, run_id):
        out = make_folder(Path(output_dir or suite.output.dir) / run_id, "the run folder", "output.dir",
                          "a writable folder (--output DIR)")
        say_disk(disk, events.on_note if events else None)
        # the suite and the run folder stored as absolute paths: a resume started from another folder reads the
        # suite's relative model and dataset paths from the suite's own folder and writes into this same folder
        store.create_run(run_id, suite.model_dump(mode="json"), str(Path(plan.suite_path).resolve()),
                         plan.to_json(), env.to_json(), str(out.resolve()))
        run = _Run(plan, run_id, out, store, store_file, executor or LocalProcessExecutor(), events or Events(),
                   threads, env, machine_warnings(threads), artifacts_dir, after)
        return run.carry_out(t0)


def measure_resumed(run_id: str, *, store_path: str | Path | None = None, executor: Executor | None = None,
                    events: Events | None = None, after: Sequence[AfterRun] = ()) -> BenchResult:
    """Finish a run that did not end (its bench was killed, or interrupted): the plan is made again from the
    stored suite and must match the stored one; what finished is kept as it is, and only the builds and
    measurements without a record run, with the run's own threads."""
    t0 = time.perf_counter()
    store_file = Path(store_path or DEFAULT_STORE)
    if not store_file.is_file():
        raise StoreError("no results store here", file=str(store_file),
                         accepted="the store the run was written to (--store PATH)")
    with Store(store_file) as store:
        run_id = store.run(run_id).run_id      # a prefix made whole: the lock is the run's
        # the lock first, then the status: read before it, a run whose bench was just finishing would be reopened
        with run_lock(store_file, run_id):
            row = store.run(run_id)
            if row.status == DONE:
                raise VariantlabError(f"run {row.run_id} finished; there is nothing to resume", field="--resume",
                                      accepted="a run whose status is running (its bench was killed) or "
                                               "interrupted (`variantlab runs` lists them)")
            plan = replan(row, store_file)
            disk = check_disk(disk_budget(plan, Path(row.output_dir), store_file, stored=store.records(row.run_id)))
            out = make_folder(Path(row.output_dir), "the run folder", "output.dir", "a writable folder")
            say_disk(disk, events.on_note if events else None)
            threads = row.environment.threads_per_worker or available_cores()
            store.reopen_run(row.run_id)
            run = _Run(plan, row.run_id, out, store, store_file, executor or LocalProcessExecutor(),
                       events or Events(), threads, row.environment, machine_warnings(threads), None, after)
            return run.carry_out(t0, resumed=True)


def replan(row, store_file: Path) -> Plan:
    """The plan of a stored run, made again from its stored suite; bad input when it no longer comes out the
    same (a dataset or model that changed, an `auto` recipe that now chooses otherwise)."""
    from .plan import make_plan
    from .stored_suite import stored_suite
    suite_path = row.suite_path or "<stored suite>"
    base_dir = Path(row.suite_path).resolve().parent if row.suite_path else Path.cwd()
    stored = PlanRecord.model_validate(row.plan)     # in today's shape (the store upgrades an older one)
    plan = make_plan(stored_suite(row, suite_path), suite_path, base_dir,
                     stored.skip_bad_lines).with_rounds(stored.rounds).for_run(row.run_id)
    stored = stored.to_json()
    if plan.to_json()["order"] != stored.get("order"):   # a run stored before orders were drawn from the run
        plan = plan.for_run("")
    now = json.loads(json.dumps(plan.to_json()))     # as the store holds it: an auto recipe's tuples are lists
    changed = [k for k in sorted(set(now) | set(stored)) if now.get(k) != stored.get(k)]
    if changed:
        raise VariantlabError(f"run {row.run_id} cannot be resumed: its plan made again today differs in "
                              f"{', '.join(changed)} (the suite's model, dataset or recipes changed since)",
                              file=str(store_file), field="--resume",
                              accepted="a run whose suite, model and dataset are as they were; else start a new run")
    return plan


@dataclass
class _Run:
    """One run being carried out (new or resumed): builds, then the measurements without a record, each record
    committed as it arrives; then the comparison, and the steps after the run its caller attached."""

    plan: Plan
    run_id: str
    out: Path
    store: Store
    store_file: Path
    executor: Executor
    events: Events
    threads: int
    env: dict
    warnings: list[str]
    artifacts_dir: str | Path | None
    after: Sequence[AfterRun] = ()
    kept: int = 0

    def carry_out(self, t0: float, resumed: bool = False) -> BenchResult:
        plan, store, run_id = self.plan, self.store, self.run_id
        try:
            finished = {(r.variant, r.kind, getattr(r, "round", 0)): r for r in store.records(run_id)}
            self.kept = len(finished)
            self.events.on_start(len(plan.variants) * (1 + plan.rounds) - len(finished)
                                 + any(t.writes_reference for t in plan.trackers))
            prepare_kernels(plan, self.events)
            builds = self._build_all(finished)
            self._settle(builds)
            reference = self._reference(builds)
            self._measure_all(builds, finished, reference)
            records = store.records(run_id, "measure")
            if resumed:
                self.warnings.append(f"resumed: {len(finished)} records were kept from before the resume, the "
                                     "rest measured after it")
            comparison = analyse(plan.trackers, [v.name for v in plan.variants], plan.baseline,
                                 list(builds.values()), records, store.blob, extra_warnings=self.warnings)
            store.finish_run(run_id, comparison.to_json(), DONE)
            if reference is not None:   # every comparison with it is in the records now: its disk is given back
                shutil.rmtree(reference, ignore_errors=True)
        except BaseException as e:  # never left as `running`: what finished stays, the run says it did not end
            with _signals_held():   # a second Ctrl-C must not stop the clean-up half way
                self.executor.kill()
                store.finish_run(run_id, None, INTERRUPTED)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise RunInterrupted(run_id, self.store_file, self.kept) from e
            raise
        return self._report(t0, builds, comparison)

    def _build_all(self, finished: dict) -> dict[str, BuildRecord]:
        """Every variant's build, in the plan's order: a stored one (resuming) whose artifact is still as built,
        an endpoint's, one reused from the artifacts folder, else built in a worker — those through the
        executor's run_all (side by side on a cluster). A stored failure stays the variant's status: resuming
        finishes a run, it does not retry it."""
        plan, builds, pending = self.plan, {}, {}
        for v in plan.variants:
            stored = finished.get((v.name, "build", 0))
            kind = backend_kind(v.definition.backend)
            if stored is not None and (stored.status != "ok" or not kind.builds
                                       or mismatch(plan, v, Path(stored.artifact_dir)) is None):
                builds[v.name] = stored
                continue
            record, not_reused = ((nothing_built_record(v), ()) if not kind.builds
                                  else reused_artifact(plan, v, self.artifacts_dir))
            if record is not None:
                self._keep_build(f"{v.name} · artifact reused" if record.reused else f"{v.name} · {kind.label}",
                                 record, builds)
                continue
            folder = self.out / "variants" / v.name
            task = build_task(plan, v, folder / "artifact", folder / "build", self.threads, self.events)
            pending[task.label] = (task, not_reused)
        self.executor.run_all(
            [task for task, _ in pending.values()], Limits(plan.suite.timeout_s),
            lambda task, record, _: self._keep_build(task.label, record.model_copy(
                update={"not_reused": pending[task.label][1]}), builds),
            on_start=lambda task: self.events.on_job(task.label))
        return {v.name: builds[v.name] for v in plan.variants}

    def _settle(self, builds: dict[str, BuildRecord]) -> None:
        """Every variant's files in one page-cache state before anything is measured: each dropped from the cache
        and read from disk once (variants/page_cache.py). Otherwise one variant's artifact was written a moment
        ago (4 KiB pages), another's reused from an artifacts folder and half evicted, a third's read whole: the
        same bytes loading at different speeds (issue 50: an A/A run's load stage read 37% apart)."""
        paths = []
        for v in self.plan.variants:
            b = builds.get(v.name)
            if b is not None and b.status == "ok" and b.artifact_dir:
                paths.append(Path(b.artifact_dir))
                if (v.definition.backend_config or {}).get("gguf_file"):
                    paths.append(Path(v.definition.backend_config["gguf_file"]))
        t = time.perf_counter()
        files, size = settle_files(paths)
        if files:
            (self.events.on_note or to_stderr)(f"page cache: the variants' {files} files ({format_bytes(size)}) read from disk once, "
                                f"so that every variant starts from them as a read from disk leaves them "
                                f"({time.perf_counter() - t:.1f} s)")

    def _keep_build(self, label: str, record: BuildRecord, builds: dict) -> None:
        self.store.put_record(self.run_id, record)
        self.kept += 1
        builds[record.variant] = record
        self.events.on_done(label, record)

    def _reference(self, builds: dict[str, BuildRecord]) -> Path | None:
        """The baseline's reference (measure/reference.py): its next-token distributions over the evaluation
        text, written once, before the rounds, by a job of its own that hosts only the trackers that write it
        (scoring), so that every variant's worker compares its own with them and no record carries one. Kept
        from before a resume when it is whole; None when the plan scores nothing, or its baseline cannot give
        full distributions (an endpoint: its comparisons say so) or did not build."""
        plan = self.plan
        writers = [t for t in plan.trackers if t.writes_reference]
        base = builds.get(plan.baseline)
        if not writers or base is None or base.status != "ok" \
                or not backend_kind(plan.variant(plan.baseline).definition.backend).local_model:
            return None
        folder = self.out / "reference"
        try:
            open_reference(folder, writers[0].texts(plan.samples))
            return folder
        except ReferenceMissing:
            pass
        label = f"{plan.baseline} · reference"
        job = self._measure_job(plan.baseline, -1, base, True).model_copy(update={
            "trackers": tuple(TrackerJob(kind=t.kind, config=t.config()) for t in writers),
            "reference_dir": str(folder.resolve()), "writes_reference": True, "same_checkpoint": True})
        done: list = []
        self.executor.run_all([Task(label, job, self.out / "jobs" / f"{plan.baseline}-reference",
                                    lambda stage, f: self.events.on_progress(label, stage, f))],
                              Limits(plan.suite.timeout_s, plan.suite.max_memory_bytes),
                              lambda task, record, blobs: done.append(record),
                              on_start=lambda task: self.events.on_job(label))
        record = done[0] if done else None
        if record is not None:
            self.events.on_done(label, record)
        why = ("no result" if record is None else record.reason if record.status != "ok"
               else next((o.error for o in record.outputs if o.error), None))
        if why is not None:         # the variants' scoring rows then say there is no reference; this says why
            self.warnings.append(f"the baseline's reference distributions could not be made ({why}): KLD, top-1 "
                                 "agreement and the PPL ratio are not measured")
        return folder

    def _same_checkpoint(self, name: str) -> bool:
        """Whether variant `name` comes from the baseline's checkpoint, so its tokenizer's ids are the baseline's."""
        def checkpoint(v: PlannedVariant) -> Path:     # a GGUF may be made from a checkpoint of its own
            return Path((v.definition.backend_config or {}).get("checkpoint", v.source)).resolve()
        return checkpoint(self.plan.variant(name)) == checkpoint(self.plan.variant(self.plan.baseline))

    def _measure_all(self, builds: dict[str, BuildRecord], finished: dict, reference: Path | None = None) -> None:
        """Every (variant, round) without a record, in the plan's order, through the executor's run_all. A
        variant's once-per-variant trackers ride on its first round that is made while none of its rounds
        has run them (or is running them) yet."""
        plan = self.plan
        once_done = {r.variant for r in finished.values() if r.kind == "measure" and r.status == "ok" and r.ran_once}
        once_running: set[str] = set()

        in_turns = self._in_turns(builds)

        def task(name: str, r: int) -> Task:
            run_once = name not in once_done and name not in once_running
            if run_once:
                once_running.add(name)
            label = f"{name} · round {r + 1}/{plan.rounds}"
            job = self._measure_job(name, r, builds[name], run_once)
            if reference is not None and run_once:
                job = job.model_copy(update={"reference_dir": str(reference.resolve()),
                                             "same_checkpoint": self._same_checkpoint(name)})
            return Task(label, job, self.out / "jobs" / f"{name}-r{r + 1}",
                        lambda stage, f, label=label: self.events.on_progress(label, stage, f))

        def tasks():
            for r in range(plan.rounds):
                names = [name for name in plan.order(r)
                         if (name, "measure", r) not in finished and builds[name].status == "ok"]
                if not in_turns:        # each made as a slot frees: it sees every result before it
                    yield from (task(name, r) for name in names)
                    continue
                # in turns: the round's tasks made at its start, which reads only the rounds before it
                made = [task(name, r) for name in names]
                if made:
                    yield dataclasses.replace(made[0], together=len(made))
                    yield from made[1:]

        def on_done(task: Task, record, blobs) -> None:
            self.store.put_record(self.run_id, record, blobs)
            self.kept += 1
            if task.job.run_once:
                once_running.discard(record.variant)
                if record.status == "ok" and record.ran_once:
                    once_done.add(record.variant)
            self.events.on_done(task.label, record)

        self.executor.run_all(tasks(), Limits(plan.suite.timeout_s, plan.suite.max_memory_bytes), on_done,
                              on_start=lambda task: self.events.on_job(task.label))

    def _in_turns(self, builds: dict[str, BuildRecord]) -> bool:
        """Whether a round's variants stay resident and take turns (suite field interleave, measure/turns.py);
        when the suite asks for it and it cannot be, a note says why."""
        if self.plan.suite.interleave != "requests" or sum(b.status == "ok" for b in builds.values()) < 2:
            return False
        why = why_not_in_turns(isinstance(self.executor, LocalProcessExecutor),
                               [b.bytes_on_disk or 0 for b in builds.values() if b.status == "ok"], available_memory())
        if why is not None:
            (self.events.on_note or to_stderr)(f"interleave: requests: {why}: the variants ran one process after "
                                               "another (interleave: processes says so without this note)")
        return why is None

    def _measure_job(self, name: str, r: int, build: BuildRecord, run_once: bool) -> MeasureJob:
        plan, suite = self.plan, self.plan.suite
        return MeasureJob(variant=plan.variant(name).definition, artifact_dir=build.artifact_dir, round=r,
                          device=suite.device, threads=self.threads, seed=suite.seed, samples=plan.samples,
                          trackers=tuple(TrackerJob(kind=t.kind, config=t.config()) for t in plan.trackers),
                          run_once=run_once, trust_remote_code=suite.trust_remote_code)

    def _report(self, t0: float, builds: dict, comparison: Comparison) -> BenchResult:
        """The result, then each step after the run in order (explain, recommend, the reports: what the caller
        attached), each seeing what the steps before it added; wall_s counts up to each step's end."""
        plan = self.plan
        result = BenchResult(self.run_id, plan.suite.name, self.out, self.store_file, self.env, comparison,
                             time.perf_counter() - t0,
                             resolved={v.name: v.resolved["summary"] for v in plan.variants if v.resolved})
        finished = FinishedRun(plan, self.run_id, self.out, builds, self.executor, self.threads, self.events)
        for step in self.after:
            result = dataclasses.replace(step(finished, result), wall_s=time.perf_counter() - t0)
        return result


def slower_than_baseline(comparison: Comparison) -> list[str]:
    """The variants measured slower than the baseline beyond the interval on some headline timing row."""
    slower = []
    for name in comparison.variants:
        if name == comparison.baseline or comparison.status.get(name) != "ok":
            continue
        for row in comparison.rows:
            d = row.deltas.get(name)
            if not (row.is_timing and row.headline is not None and d is not None and d.significant and d.pct):
                continue
            if (d.pct > 0) == bool(row.lower_is_better):
                slower.append(name)
                break
    return slower


def mismatch(plan: Plan, v: PlannedVariant, artifact: Path) -> str | None:
    """Why the artifact in `artifact` is not v's, as planned (None: it is, its content hashes verified)."""
    d = v.definition
    own = backend_kind(d.backend).artifact_problem
    if own is not None:
        return own(artifact, d, v.source, plan)
    return artifact_problem(artifact, d.recipe, d.options, v.source, _device_type(plan.suite.device),
                            attention=d.attention, attention_options=d.attention_options,
                            calibration_sha256=calibration_digest(plan.calibration_texts),
                            trust_remote_code=plan.suite.trust_remote_code)


def reused_artifact(plan: Plan, v: PlannedVariant,
                    artifacts_dir: str | Path | None) -> tuple[BuildRecord | None, tuple[str, ...]]:
    """v's artifact in artifacts_dir/<name> when it matches, hashes verified (a build record saying it was
    reused); else (None, why none was reused)."""
    if artifacts_dir is None:
        return None, ()
    c = Path(artifacts_dir) / v.name
    if not (c / META_FILE).is_file():
        return None, (f"{c}: no artifact there",)
    problem = mismatch(plan, v, c)
    if problem is not None:
        return None, (f"{c}: {problem}",)
    meta = json.loads((c / META_FILE).read_text(encoding="utf-8"))   # checked by mismatch: any backend's
    return BuildRecord(variant=v.name, status="ok", artifact_dir=str(c.resolve()), reused=True,
                       facts=meta.get("facts"), bytes_on_disk=meta["weights"]["bytes_on_disk"],
                       timings=meta.get("build", {})), ()


def nothing_built_record(v: PlannedVariant) -> BuildRecord:
    """The build record of a variant whose backend builds nothing (an endpoint): what it is, in its facts."""
    d = v.definition
    return BuildRecord(variant=v.name, status="ok", artifact_dir="",
                       facts=backend_kind(d.backend).describe(d.backend_config))


def build_task(plan: Plan, v: PlannedVariant, artifact_dir: Path, workdir: Path, threads: int,
               events: Events) -> Task:
    """The job that builds v into artifact_dir (its worker's files in workdir), labelled for the display."""
    label = f"{v.name} · build"
    job = BuildJob(variant=v.definition, source=str(v.source), artifact_dir=str(artifact_dir.resolve()),
                   device=plan.suite.device, threads=threads, seed=plan.suite.seed,
                   calibration_texts=plan.calibration_texts, trust_remote_code=plan.suite.trust_remote_code)
    return Task(label, job, workdir, lambda stage, f: events.on_progress(label, stage, f))


def prepare_kernels(plan: Plan, events: Events) -> None:
    """variantlab's CPU kernels built here, once, before the first worker (which then only loads them), so that
    no build lands inside a timed stage: when a variant runs on this machine's CPU (variants/kernels.prepare)."""
    if any(backend_kind(v.definition.backend).our_kernels for v in plan.variants):
        from ..variants import kernels
        kernels.prepare(events.on_note, plan.suite.device)


def _device_type(device: str) -> str:
    if device != "auto":
        return device.split(":")[0]
    import torch  # only to resolve "auto" when there is an artifact to check against it
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_artifacts_dir(plan: Plan) -> Path:
    """Where `variantlab build` saves a suite's artifacts unless told: ./artifacts/<suite name>/."""
    return Path.cwd() / "artifacts" / plan.suite.name


def run_build(plan: Plan, out_dir: str | Path | None = None, *, executor: Executor | None = None,
              events: Events | None = None) -> dict[str, BuildRecord]:
    """Build every variant of a checked plan, each in a fresh process, into out_dir/<variant name>/.
    A failing variant is recorded with its reason and the others go on."""
    out = Path(out_dir) if out_dir is not None else default_artifacts_dir(plan)
    events = events or Events()
    disk = check_disk(build_budget(plan, out))     # before the folder is made
    out = make_folder(out, "the artifacts folder", "--out", "a writable folder (default ./artifacts/<suite name>)")
    say_disk(disk, events.on_note)
    executor = executor or LocalProcessExecutor()
    threads = plan.suite.threads or available_cores()
    results: dict[str, BuildRecord] = {v.name: nothing_built_record(v) for v in plan.variants
                                       if not backend_kind(v.definition.backend).builds}
    tasks = [build_task(plan, v, out / v.name, out / ".logs" / v.name, threads, events)
             for v in plan.variants if backend_kind(v.definition.backend).builds]

    def on_done(task: Task, record, _) -> None:
        results[record.variant] = record
        events.on_done(task.label, record)

    try:
        prepare_kernels(plan, events)
        executor.run_all(tasks, Limits(plan.suite.timeout_s), on_done, on_start=lambda task: events.on_job(task.label))
    except BaseException:   # Ctrl-C: no build outlives the command (finished artifacts stay)
        executor.kill()
        raise
    return {v.name: results[v.name] for v in plan.variants}
