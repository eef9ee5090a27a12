"""The plan: a checked suite turned into what will run — variants, samples, trackers, rounds, order.

Interleaved rounds: each variant is measured in `rounds` fresh processes; round r runs the
variants in a rotated order (A B C, then B C A, then C A B, …) or, with `order: random`, in an
order shuffled by the suite's seed. Anything that drifts on the machine between minutes (another
job, a frequency change) then lands on every variant alike, and per-round paired ratios cancel
what a round shares (asv and Google Benchmark interleave for the same reason).

`make_plan` raises every input problem (VariantlabError) before anything runs — all of them at once,
in one line, so that a variant with two problems (int4 options and a gqa that does not divide the
heads) is not fixed and rerun twice. Planning imports torch only for a recipe resolved at plan time
(`recipe: auto`, measure/auto_recipe.py: it times this machine's kernels once, then reads them from the
cache), for `device: cuda`, and for a model whose learned position table bounds the sequence (GPT-2):
its tokenizer counts the dataset's prompts (`check_positions`), once per checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..data.jsonl import read_jsonl, summarize_skipped
from ..device_facts import available_cores  # noqa: F401 - where planning and its callers read it
from ..errors import DatasetError, RecipeError, SuiteError, VariantlabError
from ..data.structured import generate_samples
from ..models.loading import ModelDirInfo, check_model_dir, prompt_token_counts, resolve_model_path
from ..suite import Suite, load_suite
from ..variants.build import VariantDefinition
from ..variants.registry import get_recipe, resolve_variant_attention, resolve_variant_recipe
from . import auto_recipe  # noqa: F401 - registers `recipe: auto` with the recipe registry
from .backend_kinds import backend_kind
from .trackers import standard_trackers

CALIBRATION_LIMIT = 512   # texts handed to a build job at most
MIN_CALIBRATION = 16      # samples left after the scored ones, for the workload to calibrate on them


@dataclass(frozen=True)
class PlannedVariant:
    definition: VariantDefinition
    source: Path                      # the checkpoint it is built from
    resolved: dict | None = None      # what a plan-time recipe (auto) chose and why: measure/auto_recipe.Resolution
    position_limit: tuple[int, str] | None = None   # its model's learned position table: (positions, why)

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True)
class Plan:
    suite: Suite
    suite_path: str
    variants: tuple[PlannedVariant, ...]     # baseline first
    samples: tuple[dict, ...]
    calibration_texts: tuple[str, ...]
    trackers: tuple
    rounds: int
    warnings: tuple[str, ...] = ()           # said before measuring: the JSONL lines --skip-bad-lines skipped,
                                             # what a recipe's check of config.json found (mixed: no int4 for …)
    skip_bad_lines: bool = False             # how its datasets were read (a resumed run reads them alike)
    run_id: str = ""                         # the run it is carried out as: `order: random` draws from it

    @property
    def baseline(self) -> str:
        return self.suite.baseline_name

    def variant(self, name: str) -> PlannedVariant:
        return next(v for v in self.variants if v.name == name)

    def order(self, round_index: int) -> list[str]:
        """The variants in the order round `round_index` measures them. `random`: a permutation of its own every
        round, drawn from the suite's seed and the run (`run_id`), so that two runs of one suite are not laid
        out alike either (randomized multiple interleaved trials: Abedi & Brecht, "Conducting Repeatable
        Experiments in Highly Variable Cloud Computing Environments", ICPE 2017). A fixed rotation keeps each
        variant on one beat of the job sequence: of three variants over three rounds, one always holds the
        even slots (A B C, B C A, C A B: C is job 2, 4 and 6), and a load that switches with the jobs' own
        period lands on that variant every round (issue 50)."""
        names = [v.name for v in self.variants]
        if self.suite.order == "random":
            seed = (f"{self.suite.seed}:{self.run_id}:{round_index}" if self.run_id
                    else self.suite.seed * 1_000_003 + round_index)   # a plan of no run: as runs before run ids drew
            random.Random(seed).shuffle(names)
            return names
        k = round_index % len(names)
        return names[k:] + names[:k]

    def for_run(self, run_id: str) -> "Plan":
        """This plan as run `run_id` carries it out (its random order drawn from it)."""
        return dataclasses.replace(self, run_id=run_id)

    def with_rounds(self, rounds: int) -> "Plan":
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        return dataclasses.replace(self, rounds=rounds)

    def to_json(self) -> dict:
        out = {"baseline": self.baseline, "rounds": self.rounds,
               "variants": [v.definition.to_json() | {"source": str(v.source)}
                            | ({"resolved": v.resolved} if v.resolved else {}) for v in self.variants],
               "order": [self.order(r) for r in range(self.rounds)],
               "trackers": [{"kind": t.kind, "config": t.config()} for t in self.trackers],
               "samples": len(self.samples), "samples_sha256": samples_digest(self.samples)}
        if self.skip_bad_lines:
            out["skip_bad_lines"] = True
        return out


def samples_digest(samples) -> str:
    """sha256 of the samples as JSON: a resumed run checks that its dataset is the one it began with."""
    import hashlib
    return hashlib.sha256(json.dumps(list(samples), sort_keys=True).encode()).hexdigest()


def dataset_samples(ds, base_dir: Path, field: str = "workload.dataset") -> list[dict]:
    """The dataset's samples, each with a string id; a bad JSONL line raises (load_dataset)."""
    return load_dataset(ds, base_dir, field)[0]


def load_dataset(ds, base_dir: Path, field: str = "workload.dataset",
                 skip_bad_lines: bool = False) -> tuple[list[dict], tuple[str, ...]]:
    """The dataset's samples, each with a string id, and warnings: with `skip_bad_lines` the JSONL lines
    skipped, and why. A JSONL file shorter than an `n` the suite gives explicitly (counting its good lines)
    is an error (it measured fewer samples than asked, silently); without `n`, a file may be shorter than
    the default."""
    warnings: tuple[str, ...] = ()
    if ds.path is not None:
        p = Path(ds.path)
        path = p if p.is_absolute() else base_dir / p
        read = read_jsonl(path, limit=ds.count, skip_bad_lines=skip_bad_lines)
        samples, skipped = read.records, read.skipped
        if skipped:
            warnings = (f"{field}: skipped {len(skipped)} bad line{'s' * (len(skipped) > 1)} of {ds.path} "
                        f"({summarize_skipped(skipped)})",)
        if ds.n is not None and len(samples) < ds.n:
            good = f"{len(samples)} good records ({len(skipped)} bad lines skipped)" if skipped else \
                f"{len(samples)} records"
            raise DatasetError(f"the file has {good}, fewer than the n: {ds.n} asked for",
                               file=str(path), field=f"{field}.n",
                               accepted=f"n: {len(samples)} or less, or a file with {ds.n} records")
    else:
        samples = generate_samples(ds.count, ds.seed)
    return [dict(s) | {"id": str(s.get("id", i))} for i, s in enumerate(samples)], warnings


def _calibration(suite: Suite, base_dir: Path, samples: list[dict],
                 skip_bad_lines: bool = False) -> tuple[list[dict], tuple[str, ...]]:
    """The suite's `calibration:` dataset (and its warnings); else the workload's samples that teacher-forced
    scoring does not use (so that a calibrated recipe's KLD is not measured on its own calibration text), or
    all of them when fewer than MIN_CALIBRATION would be left."""
    if suite.calibration:
        return load_dataset(suite.calibration, base_dir, "calibration", skip_bad_lines)
    rest = samples[suite.workload.accuracy.samples:]
    return (rest if len(rest) >= MIN_CALIBRATION else samples), ()


def check_cuda(suite_path: str) -> None:
    """`device: cuda` on a machine where torch sees no CUDA device is bad input, found while planning: it
    was every variant "failed: AssertionError: Torch not compiled with CUDA enabled", each after its own
    worker started. torch is imported here only for this check (planning otherwise never imports it)."""
    import torch
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise SuiteError(f"cuda asked for, but {why} (torch {torch.__version__})", file=suite_path, field="device",
                         accepted="auto (CUDA when present, else the CPU) | cpu; or a CUDA build of torch on a "
                                  "machine with a GPU (README)")


def check_positions(suite: Suite, info: ModelDirInfo, *, file: str, samples: Sequence[dict] = (),
                    prompt_tokens: Callable[[ModelDirInfo], list[int]] | None = None) -> list[VariantlabError]:
    """Every scenario length (prompt + tokens decoded after it) beyond a learned position table: GPT-2's
    1,024 positions against a 1,100-token length-sweep prompt raised IndexError in the worker; so did the
    dataset's prompts + max_new_tokens (66–146 + 1,000), which `prompt_tokens(info)` (each sample's prompt
    in tokens, as the engine sends it) lets this check. Models without a table (rotary, ALiBi) compute
    positions for any length, so nothing is refused for them (and nothing is tokenized)."""
    limit = info.position_limit()
    if limit is None:
        return []
    most, why = limit
    problems: list[VariantlabError] = []
    new = suite.workload.max_new_tokens
    for i, sc in enumerate(suite.workload.scenarios):
        decoded = getattr(sc, "decode_tokens", new)     # a sweep decodes its own count, the others the workload's
        over = [n for n in sc.context_lengths() if n + decoded > most]
        if over:
            problems.append(SuiteError(
                f"{sc.type} length{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} + {decoded} decoded "
                f"tokens need {max(over) + decoded} positions; {info.path} ({info.architecture}) has {most}: {why}",
                file=file, field=f"workload.scenarios[{i}].lengths", accepted=f"lengths up to {most - decoded}"))
    if new + 1 > most:      # a prompt has one token at least
        problems.append(SuiteError(
            f"max_new_tokens {new} after a prompt of one token at least needs {new + 1} positions; {info.path} "
            f"({info.architecture}) has {most}: {why}", file=file, field="workload.max_new_tokens",
            accepted=f"max_new_tokens up to {most - 1}"))
    elif samples and prompt_tokens is not None:
        problems.extend(check_prompt_positions(suite, info, samples, prompt_tokens(info), file=file))
    return problems


def check_prompt_positions(suite: Suite, info: ModelDirInfo, samples: Sequence[dict], counts: Sequence[int], *,
                           file: str) -> list[VariantlabError]:
    """The dataset's longest prompt (`counts`: each sample's, in tokens) + max_new_tokens beyond the model's
    learned position table: one problem naming that sample, on max_new_tokens when a smaller one would fit,
    else on the dataset (a prompt that fills the table leaves no room for one token)."""
    most, why = info.position_limit()
    new = suite.workload.max_new_tokens
    longest = max(range(len(counts)), key=counts.__getitem__)
    n = counts[longest]
    if n + new <= most:
        return []
    ds = suite.workload.dataset
    name = ds.path if ds.path is not None else f"the {ds.generator} dataset (n {ds.count}, seed {ds.seed})"
    over = sum(c + new > most for c in counts)
    detail = (f"{over} of {len(counts)} prompts of {name} + max_new_tokens {new} need more positions than the model "
              f"has; the longest, sample {samples[longest]['id']!r}, is {n} tokens and needs {n + new}; {info.path} "
              f"({info.architecture}) has {most}: {why}")
    if n < most:
        return [SuiteError(detail, file=file, field="workload.max_new_tokens",
                           accepted=f"max_new_tokens up to {most - n}, or prompts of at most {most - new} tokens")]
    return [DatasetError(detail, file=file, field="workload.dataset", accepted=f"prompts of at most {most - new} tokens")]


def check_baseline_buildable(suite: Suite, recipe: str, *, file: str, field: str) -> RecipeError | None:
    """A baseline that cannot be built here leaves nothing to compare against: refused when the device alone
    says so (a CUDA-only recipe with `device: cpu`). Another variant that cannot run is measured as
    'unsupported' instead, which the report shows. `device: auto` is resolved only by torch, in the worker."""
    if suite.device != "cpu":
        return None
    reason = getattr(get_recipe(recipe), "device_reason", lambda device: None)("cpu")
    if reason is None:
        return None
    return RecipeError(f"the baseline cannot be built: {reason}", file=file, field=f"{field}.recipe",
                       accepted="a baseline recipe this device runs (fp32 | bf16 | int8 | …), or device: cuda "
                                "on a machine with a GPU")


def one_error(problems: list[VariantlabError], file: str) -> VariantlabError:
    """One problem as it is; several as one line, '<file>: N problems: <field>: … ; <field>: …', of their class
    where they share one. `.problems` keeps them apart."""
    unique = list({p.one_line(): p for p in problems}.values())
    if len(unique) == 1:
        return unique[0]
    kinds = {type(p) for p in unique}
    cls = kinds.pop() if len(kinds) == 1 else VariantlabError
    parts = [VariantlabError(p.detail, field=p.field, accepted=p.accepted).one_line() for p in unique]
    err = cls(f"{len(unique)} problems: " + "; ".join(parts), file=file)
    err.problems = tuple(unique)
    return err


def check_recipe_config(recipe: str, options: dict, info: ModelDirInfo, name: str, *, file: str,
                        field: str) -> tuple[str, ...]:
    """A recipe's own check of its options against the checkpoint's config.json (no torch; a group size that
    divides no layer width is refused here, not when the variant is built); returns what to say before
    measuring. Recipes without such a check (`check_config`) pass."""
    check = getattr(get_recipe(recipe), "check_config", None)
    if check is None or not info.config:
        return ()
    return tuple(check(options, info.config, variant=name, file=file, field=field))


def _plan_variant(suite: Suite, i: int, base: ModelDirInfo | None, samples: list[dict], suite_path: str,
                  base_dir: Path, problems: list[VariantlabError], warnings: list[str],
                  prompt_tokens: Callable[[ModelDirInfo], list[int]] | None = None) -> PlannedVariant | None:
    """Variant i resolved and checked; its problems are appended to `problems` (None when it has any), what
    to say before measuring to `warnings`."""
    v, field = suite.variants[i], f"variants[{i}]"
    found = len(problems)
    try:   # a backend that plans its own variants (an endpoint: nothing to build or check here)
        own = backend_kind(v.backend).plan_variant(v, base_dir, suite_path, field)
    except VariantlabError as e:
        problems.append(e)
        return None
    if own is not None:
        return PlannedVariant(own, base.path if base else Path("."))
    recipe = options = None
    try:
        recipe, options = resolve_variant_recipe(v, file=suite_path, field=field)
    except VariantlabError as e:
        problems.append(e)
    info = base
    if v.model is not None:
        try:
            path = resolve_model_path(v.model, base_dir, file=suite_path, field=f"{field}.model")
            info = check_model_dir(path, file=suite_path, field=f"{field}.model",
                                   trust_remote_code=suite.trust_remote_code)
        except VariantlabError as e:
            problems.append(e)
            info = None
    try:
        attention = resolve_variant_attention(v, config=info.config if info else None, file=suite_path, field=field)
    except VariantlabError as e:
        problems.append(e)
    if recipe is not None and v.name == suite.baseline_name:
        if (e := check_baseline_buildable(suite, recipe, file=suite_path, field=field)) is not None:
            problems.append(e)
    if info is not None:
        problems.extend(check_positions(suite, info, file=suite_path, samples=samples, prompt_tokens=prompt_tokens))
    resolve = getattr(get_recipe(recipe), "resolve", None) if recipe is not None else None  # chosen at plan time (auto)
    if recipe is not None and info is not None and resolve is None:
        try:
            warnings.extend(check_recipe_config(recipe, options, info, v.name, file=suite_path, field=field))
        except VariantlabError as e:
            problems.append(e)
    if len(problems) > found:
        return None
    compile_, resolved = bool(v.compile), None
    if resolve is not None:
        try:
            r = resolve(options, suite=suite, samples=samples, config=info.config, model_dir=info.path,
                        file=suite_path, field=field)
            warnings.extend(check_recipe_config(r.recipe, r.options, info, v.name, file=suite_path, field=field))
        except VariantlabError as e:
            problems.append(e)
            return None
        recipe, options, resolved = r.recipe, r.options, r.to_json()
        if v.compile is None:   # the variant's own compile: wins over the choice
            compile_ = r.compile
    # `compile: false`, given: transformers' own modules every step; absent: our decode step where it runs
    return PlannedVariant(VariantDefinition(v.name, recipe, options, attention, dict(v.attention_options), compile_,
                                            decode_step=v.compile is not False),
                          info.path, resolved, info.position_limit())


def make_plan(suite: Suite, suite_path: str, base_dir: Path, skip_bad_lines: bool = False) -> Plan:
    """Resolve and check every model and recipe, and load the datasets; raise every problem found, as one error.

    `skip_bad_lines`: a JSONL dataset's bad lines are skipped, and the plan's warnings say which."""
    if suite.device == "cuda":
        check_cuda(suite_path)
    base = None
    if suite.model is not None:
        base_model = resolve_model_path(suite.model, base_dir, file=suite_path, field="model")
        base = check_model_dir(base_model, file=suite_path, field="model", trust_remote_code=suite.trust_remote_code)
    samples, warnings = load_dataset(suite.workload.dataset, base_dir, skip_bad_lines=skip_bad_lines)
    problems: list[VariantlabError] = []
    recipe_warnings: list[str] = []
    counted: dict[Path, list[int]] = {}

    def prompt_tokens(info: ModelDirInfo) -> list[int]:    # each checkpoint's tokenizer counts the prompts once
        if info.path not in counted:
            counted[info.path] = prompt_token_counts(info.path, [s["prompt"] for s in samples],
                                                     trust_remote_code=suite.trust_remote_code, file=suite_path)
        return counted[info.path]
    planned = [_plan_variant(suite, i, base, samples, suite_path, base_dir, problems, recipe_warnings, prompt_tokens)
               for i in range(len(suite.variants))]
    if problems:
        raise one_error(problems, suite_path)
    planned.sort(key=lambda p: p.name != suite.baseline_name)
    calibration, calibration_warnings = _calibration(suite, base_dir, samples, skip_bad_lines)
    texts = tuple(s["prompt"] + " " + s["answer"] for s in calibration[:CALIBRATION_LIMIT])
    limits = [p.position_limit for p in planned if p.position_limit is not None]
    endpoint = any(not backend_kind(v.backend).local_model for v in suite.variants)   # scored by top-k texts
    trackers = standard_trackers(suite, len(samples), min(limits, default=None, key=lambda limit: limit[0]),
                                 endpoint)
    return Plan(suite, suite_path, tuple(planned), tuple(samples), texts, tuple(trackers),
                suite.rounds, warnings + tuple(recipe_warnings) + calibration_warnings, skip_bad_lines)


def plan_suite_file(suite_path: str | Path, skip_bad_lines: bool = False) -> Plan:
    """Load and check a suite file: every input problem is raised here, before anything runs.

    `skip_bad_lines` (`--skip-bad-lines`): skip a JSONL dataset's bad lines instead of stopping at the first;
    `Plan.warnings` lists them."""
    suite_path = str(suite_path)
    return make_plan(load_suite(suite_path), suite_path, Path(suite_path).resolve().parent, skip_bad_lines)
