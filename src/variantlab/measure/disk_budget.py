"""The disk a run will take, stated before anything is built or measured; a run the disk cannot hold is refused.

A real model's run fills a disk fast (docs/bench.md, "Disk", gives a Qwen2.5-0.5B-shaped run's figures): its
artifacts take gigabytes, and its baseline reference (measure/reference.py) as much again while the rounds run.
What a run writes, and how each part is counted:

- each variant's artifact, in <run folder>/variants/<name>/artifact: estimated by its backend kind from the
  checkpoint's safetensors headers (`BackendKind.artifact_size`: the recipe's layout, variants/artifact_size.py;
  a GGUF type's bits, variants/gguf_convert.py), with MARGIN on top; and what one build holds beside its
  artifact for a while (a GGUF's F32 intermediate: the largest counts, as builds run one at a time here).
  Nothing for a variant reused from --artifacts DIR (one with an artifact there: a stale one found later is
  built all the same), one whose backend builds nothing (an endpoint), or one whose build a resumed run stored;
- the baseline's reference, when the plan scores (a tracker `writes_reference`) and the baseline runs here:
  positions × vocabulary × 4 bytes, exactly, the positions counted by the baseline checkpoint's own tokenizer
  on the evaluation texts as the reference job splits them (`prompt_token_counts`, planning's path), the
  vocabulary read from its config.json; less what an earlier try of a resumed run left in its folder; and its
  header (every text's ids; every token's text where an endpoint is scored against it);
- a record in the store for each build and measurement still to make (RECORD_BYTES each at most), and a folder
  per job (its job file, which carries the samples and calibration texts, its result and its stderr).

The run is refused (one line, VariantlabError, exit status 2) when what lands on the run folder's filesystem,
plus KEEP_FREE, is more than its free space (`shutil.disk_usage` of the run folder's nearest folder that
exists); the store's part is checked against its own filesystem where that is another. VARIANTLAB_DISK_CHECK=0
states the estimate and runs anyway. The refusal comes before the store or the run folder is touched
(`check_disk`); the line is said once they are made (`say_disk`), so that any other bad input stays one line.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..errors import VariantlabError
from ..models.loading import prompt_token_counts
from ..variants.artifact import META_FILE
from .backend_kinds import backend_kind
from .plan import Plan
from .reference import LOGPROBS, reference_bytes

ENV = "VARIANTLAB_DISK_CHECK"           # "0": state the estimate, never refuse
MARGIN = 1.10                           # on top of each artifact's estimate
RECORD_BYTES = 1 << 20                  # a stored record, at most (a few KB today)
JOB_BYTES = 1 << 20                     # a job folder's result and stderr, beside its job file
REFERENCE_HEADER_BYTES = 1 << 20        # reference.json (every text's ids), at most
TOKEN_TEXT_BYTES = 32                   # vocabulary.json, a token's text (written where an endpoint is scored)
KEEP_FREE = 1 << 30                     # left free at least: 1 GiB, or 5% of a smaller filesystem


@dataclass(frozen=True)
class Disk:
    """A filesystem the run writes to: the folder asked (its nearest folder that exists), its free bytes, size."""

    folder: Path
    free: int
    size: int

    @property
    def keep_free(self) -> int:
        return min(KEEP_FREE, self.size // 20)


@dataclass(frozen=True)
class DiskBudget:
    """What a run (or a build) will write, estimated before it starts, and where."""

    artifacts: dict[str, int]           # variant → its artifact's bytes, margin included (only those it builds)
    transient: int                      # held beside the artifacts while one builds (a GGUF's F32 intermediate)
    reference: int                      # the baseline's reference rows (positions × vocabulary × 4)
    store: int                          # the records to be stored
    files: int                          # job folders, the reference's header
    disk: Disk                          # where the run folder lands
    store_disk: Disk | None = None      # the store's, where it is another filesystem
    not_estimated: tuple[str, ...] = () # variants (or the reference) whose bytes are not known here
    what: str = "this run"              # what needs it ("these builds": `variantlab build`)
    field: str = "output.dir"           # where its folder is asked for
    fixes: str = ("or fewer variants, a smaller workload.accuracy.samples, --artifacts DIR to reuse builds")

    @property
    def on_disk(self) -> int:
        """What lands on the run folder's filesystem."""
        return (sum(self.artifacts.values()) + self.transient + self.reference + self.files
                + (0 if self.store_disk else self.store))

    @property
    def total(self) -> int:
        return self.on_disk + (self.store if self.store_disk else 0)

    def need(self) -> str:
        """'about 10.3 GB, an estimate (artifacts …, baseline reference …, store and job files …)'."""
        n = len(self.artifacts)
        parts = [(f"artifacts {size(sum(self.artifacts.values()))} for {n} variant{'s' * (n != 1)}"
                  + (f", {size(self.transient)} more while one builds" if self.transient else "")) if n
                 else "no artifact to build"]
        if self.reference:
            parts.append(f"baseline reference {size(self.reference)}")
        if self.store or self.files:
            parts.append(f"{'store and ' if self.store else ''}job files {size(self.store + self.files)}")
        unknown = f"; not estimated: {', '.join(self.not_estimated)}" if self.not_estimated else ""
        return f"about {size(self.total)}, an estimate ({', '.join(parts)}{unknown})"

    def line(self) -> str:
        """One line: what the run needs, of what, where, and what is free there."""
        text = f"disk: {self.what} will take {self.need()} in {self.disk.folder}; {size(self.disk.free)} free"
        if self.store_disk is not None:
            text += f"; the store's {size(self.store)} in {self.store_disk.folder}, {size(self.store_disk.free)} free"
        return text

    def problem(self) -> VariantlabError | None:
        """Why the disk cannot hold the run (None: it can): one line, with what would."""
        need, disk = self.on_disk, self.disk
        if need + disk.keep_free > disk.free:
            return VariantlabError(
                f"the disk cannot hold {self.what}: it will take {self.need()}, and {size(disk.free)} is free there, "
                f"{size(disk.keep_free)} of which is kept free", file=str(disk.folder), field=self.field,
                accepted=f"a disk with at least {size(need + disk.keep_free)} free ({self.field}), {self.fixes}; "
                         f"{ENV}=0 runs anyway")
        store = self.store_disk
        if store is not None and self.store + store.keep_free > store.free:
            return VariantlabError(
                f"the disk cannot hold {self.what}'s records: about {size(self.store)}, and {size(store.free)} is "
                f"free there, {size(store.keep_free)} of which is kept free", file=str(store.folder), field="--store",
                accepted=f"a store on a disk with at least {size(self.store + store.keep_free)} free, or fewer "
                         f"variants or rounds; {ENV}=0 runs anyway")
        return None


def size(n: float) -> str:
    """Bytes as people read a disk's size: 8.6 GB, 420.0 MB, 12.0 KB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def nearest_folder(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (a run folder not made yet lands there)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_of(path: Path, usage: Callable | None = None) -> Disk:
    folder = nearest_folder(path)
    u = (usage or shutil.disk_usage)(folder)
    return Disk(folder, u.free, u.total)


def disk_budget(plan: Plan, run_folder: Path, store_file: Path, *, artifacts_dir: str | Path | None = None,
                stored: Iterable = (), usage: Callable | None = None) -> DiskBudget:
    """What a bench run of `plan` will write into `run_folder` and `store_file`, before it starts.

    Args:
        artifacts_dir: --artifacts DIR: a variant with an artifact there is reused (writes nothing).
        stored: the run's records already stored (a resumed run): builds there are not made again, and only
            the records and jobs without one are still to come.
        usage: shutil.disk_usage (None), or a stand-in (the tests').
    Returns: the DiskBudget; `problem()` says whether the disk holds it. Raises nothing on a size it cannot
    estimate: the budget names it (`not_estimated`)."""
    stored = list(stored)
    built = {r.variant for r in stored if r.kind == "build"}
    measured = sum(r.kind == "measure" for r in stored)
    reused = {v.name for v in plan.variants
              if artifacts_dir is not None and (Path(artifacts_dir) / v.name / META_FILE).is_file()}
    artifacts, transient, unknown = _artifacts(plan, built | reused)
    builds = len(artifacts) + len(unknown)
    reference, header, reference_unknown = _reference(plan, run_folder)
    measures = len(plan.variants) * plan.rounds - measured
    jobs = builds + measures + (reference > 0)
    job_file = len(json.dumps([list(plan.samples), list(plan.calibration_texts)]).encode())
    records = len(plan.variants) * (1 + plan.rounds) - len(stored)
    disk, store_disk = disk_of(run_folder, usage), disk_of(store_file.parent, usage)
    other = os.stat(store_disk.folder).st_dev != os.stat(disk.folder).st_dev
    return DiskBudget(artifacts, transient, reference, max(records, 0) * RECORD_BYTES,
                      jobs * (JOB_BYTES + job_file) + header, disk,
                      store_disk if other else None, tuple(unknown) + reference_unknown)


def build_budget(plan: Plan, out_dir: Path, usage: Callable | None = None) -> DiskBudget:
    """What `variantlab build` of `plan` will write into out_dir: every artifact it builds, and its logs."""
    artifacts, transient, unknown = _artifacts(plan, set())
    job_file = len(json.dumps(list(plan.calibration_texts)).encode())
    return DiskBudget(artifacts, transient, 0, 0, (len(artifacts) + len(unknown)) * (JOB_BYTES + job_file),
                      disk_of(out_dir, usage), None, tuple(unknown), what="these builds", field="--out",
                      fixes="or fewer variants")


def _artifacts(plan: Plan, not_built: set[str]) -> tuple[dict[str, int], int, list[str]]:
    """({variant: its artifact's bytes, MARGIN included}, the largest transient, variants not estimated) of the
    variants the run builds."""
    out, transient, unknown = {}, 0, []
    for v in plan.variants:
        kind = backend_kind(v.definition.backend)
        if not kind.builds or v.name in not_built:
            continue
        if kind.artifact_size is None:
            unknown.append(f"{v.name} (backend {kind.name})")
            continue
        try:
            est = kind.artifact_size(v.definition, v.source)
        except (OSError, ValueError, KeyError, VariantlabError) as e:     # its build will say what is wrong
            unknown.append(f"{v.name} ({type(e).__name__})")
            continue
        out[v.name] = math.ceil(est.bytes * MARGIN)
        transient = max(transient, math.ceil(est.transient * MARGIN))
    return out, transient, unknown


def _reference(plan: Plan, run_folder: Path) -> tuple[int, int, tuple[str, ...]]:
    """The bytes of rows the baseline's reference will add (0 where the run writes none), of its header, and what
    could not be counted."""
    writers = [t for t in plan.trackers if getattr(t, "writes_reference", False)]
    base = plan.variant(plan.baseline)
    if not writers or not backend_kind(base.definition.backend).local_model:
        return 0, 0, ()
    try:
        config = json.loads((base.source / "config.json").read_text(encoding="utf-8"))
        vocab = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
        counts = prompt_token_counts(base.source, writers[0].texts(plan.samples),
                                     trust_remote_code=plan.suite.trust_remote_code, file=plan.suite_path)
    except (OSError, ValueError, KeyError, TypeError, VariantlabError):
        return 0, 0, ("the baseline reference (no checkpoint tokenizer or vocab_size to count it by)",)
    rows = reference_bytes(sum(max(0, n - 1) for n in counts), vocab)
    there = run_folder / "reference" / LOGPROBS
    header = REFERENCE_HEADER_BYTES + (vocab * TOKEN_TEXT_BYTES if getattr(writers[0], "token_texts", False) else 0)
    return max(0, rows - (there.stat().st_size if there.is_file() else 0)), header, ()


def check_disk(budget: DiskBudget) -> DiskBudget:
    """Refuse a run the disk cannot hold (its one-line error says the estimate), unless VARIANTLAB_DISK_CHECK=0;
    called before anything of the run is made."""
    problem = budget.problem()
    if problem is not None and os.environ.get(ENV, "1").strip() != "0":
        raise problem
    return budget


def say_disk(budget: DiskBudget, say: Callable[[str], None] | None = None) -> None:
    """The budget's line, said (`say`: the run's notes; default stderr) once the run's folders are made: after
    every other input problem, so that each of those stays one line."""
    over = f" (not enough: {ENV}=0, not refused)" if budget.problem() is not None else ""
    (say or to_stderr)(budget.line() + over)


def to_stderr(line: str) -> None:
    """A note line where the run has no display of its own."""
    print(line, file=sys.stderr, flush=True)
