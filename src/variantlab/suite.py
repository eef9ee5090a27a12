"""The suite file: what to build, how to load it, and what counts as good enough.

A suite is YAML validated by the pydantic models below (frozen, unknown keys rejected).
`load_suite` turns every problem into a `SuiteError` that names the file, the field path and
what would be accepted, so the CLI can print one line and exit 2. `variantlab schema` prints
`suite_json_schema()`.
"""
from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import SuiteError, VariantlabError
from .measure.backend_kinds import BUILD_FIELDS, backend_kind, backend_names
from .measure.backend_kinds import accepted as backend_accepted
from .measure.limits import ACCEPTED_SIZE, parse_size
from .measure.scenarios import SCENARIO_SPECS
from .sizes import (MAX_BATCH, MAX_DURATION_S, MAX_SAMPLES, MAX_STOP_STRINGS, MAX_THREADS, MAX_TIMEOUT_S,
                    MAX_TOKENS, SEED_MAX, SEED_MIN)
from .spec_model import BOOL_FOR_NUMBER, SpecModel
from .variants.attention_kinds import accepted as attention_accepted


DEFAULT_ROUNDS = 5
DEFAULT_SAMPLES = 64      # a dataset's n when the suite gives none
RESERVED_NAMES = ("cold_start", "memory", "facts", "stability", "grading", "scoring")


class _Frozen(SpecModel):
    # allow_inf_nan=False: `timeout_s: .inf` or `ttft_s: .nan` is a typo, not a limit (nan passed `gt=0` checks
    # by failing every comparison). Every size-like field has an upper bound: sizes.py says why each.
    model_config = ConfigDict(allow_inf_nan=False)


class DatasetSpec(_Frozen):
    """Where the workload's samples come from: the built-in generator or a JSONL file."""

    generator: Literal["structured"] | None = Field(
        None, description="built-in generator of structured samples (orders, invoices, logs, products)")
    path: str | None = Field(None, description="JSONL file with string fields 'prompt' and 'answer'")
    # "not given" is None, not pydantic's fields-set: a stored suite (a full dump, every default written out)
    # must re-parse to the same meaning (`bench --resume` plans again from it)
    n: int | None = Field(None, ge=1, le=MAX_SAMPLES, description="number of samples (generator) or the first n "
                          "lines (path; a file with fewer is an error); absent or null: "
                          f"{DEFAULT_SAMPLES}, or every line of a shorter file")
    seed: int = Field(0, ge=SEED_MIN, le=SEED_MAX, description="generator seed")

    @property
    def count(self) -> int:
        """The samples asked for: n, else the default (a file may then hold fewer)."""
        return DEFAULT_SAMPLES if self.n is None else self.n

    @model_validator(mode="after")
    def _one_source(self) -> "DatasetSpec":
        if (self.generator is None) == (self.path is None):
            raise ValueError("give exactly one of 'generator: structured' or 'path: FILE.jsonl'")
        return self


ScenarioSpec = Annotated[Union[tuple(SCENARIO_SPECS.values())], Field(discriminator="type")]


class AccuracySpec(_Frozen):
    """Accuracy, measured once per variant: teacher-forced against the baseline, and graded answers."""

    samples: int = Field(32, ge=0, le=MAX_SAMPLES, description="samples scored teacher-forced against the baseline: "
                                                                "KLD, top-1 agreement, PPL ratio (0 turns it off)")
    graded: int | None = Field(None, ge=0, le=MAX_SAMPLES, description="samples whose greedy answers are graded by "
                                                                        "exact match, the same ones for every variant "
                                                                        "(default: all; 0: off)")
    batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="batch size of the graded answers")


class Workload(_Frozen):
    dataset: DatasetSpec = DatasetSpec(generator="structured")
    scenarios: list[ScenarioSpec] = Field(
        default_factory=lambda: [SCENARIO_SPECS["single-stream"](type="single-stream"),
                                 SCENARIO_SPECS["offline"](type="offline")],
        min_length=1)
    max_new_tokens: int = Field(24, ge=1, le=MAX_TOKENS)
    stop: list[str] = Field(default_factory=lambda: ["\n"], max_length=MAX_STOP_STRINGS,
                            description="stop strings: an answer ends at the first (the dataset's answers are "
                                        "one line); EOS always ends it")
    accuracy: AccuracySpec = AccuracySpec()

    @field_validator("stop")
    @classmethod
    def _nonempty_stops(cls, v: list[str]) -> list[str]:
        if any(not s for s in v):
            raise ValueError("a stop string cannot be empty")
        return v


def backend_help() -> str:
    return "; ".join(f"{name}: {backend_kind(name).help}" for name in backend_names())


class VariantSpec(_Frozen):
    """One variant: a recipe applied to the suite's model, or another checkpoint of its own."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    # recipe and compile: None is "not given" (see DatasetSpec.n): an endpoint refuses them given, weight_dtype
    # refuses a recipe given beside it, and `recipe: auto` chooses compile only when it is not given
    recipe: str | None = Field(None, description="recipe name: see `variantlab recipes`; absent or null: fp32, "
                                                 "or what weight_dtype/activation_dtype map to")
    options: dict[str, Any] = Field(default_factory=dict, description="recipe options")
    model: str | None = Field(None, description="a checkpoint of this variant's own (local directory)")
    # The analysis's vocabulary, mapped to the same recipes (int4 weights + int8 activations → w4a8).
    weight_dtype: str | None = Field(None, description="int8 | int4 | bf16 | fp16 | fp32 (instead of recipe)")
    activation_dtype: str | None = Field(None, description="int8 | bf16 | fp16 | fp32 (with weight_dtype)")
    quant_scheme: str | None = Field(None, description="symmetric | asymmetric (with weight_dtype)")
    attention: str | None = Field(None, description=f"{attention_accepted()}; applied before the recipe")
    attention_options: dict[str, Any] = Field(default_factory=dict,
                                              description="linear_state_dtype: fp32 | model, linear_chunk")
    compile: bool | None = Field(None, description="true: torch.compile transformers' decode step (static shapes; "
                                 "its compile time reported apart from warm figures); false: transformers' eager "
                                 "modules every step; absent or null: variantlab's decode step where it runs the "
                                 "model (Llama, Mistral, Qwen2 on an AVX-512 or AVX2 CPU), else transformers' eager modules, "
                                 "or what recipe: auto chooses")
    backend: str = Field("torch", description=f"the runtime it runs on: {backend_help()}",
                         json_schema_extra=lambda schema: schema.update(enum=list(backend_names())))
    base_url: str | None = Field(None, pattern=r"^https?://", description="openai: the endpoint, e.g. "
                                 "http://127.0.0.1:8000/v1")
    served_model: str | None = Field(None, description="openai: the `model` to send (default: auto)")
    api_key_env: str | None = Field(None, description="openai: the environment variable that holds its API key")
    gguf_type: str | None = Field(None, description="llamacpp: the GGUF type llama.cpp's tools make from the "
                                  "checkpoint (F32 | BF16 | F16 | Q8_0 | Q6_K | Q5_K_M | Q4_K_M | Q4_0 | IQ4_XS | …)")

    @model_validator(mode="after")
    def _backend(self) -> "VariantSpec":
        """What the backend takes: the fields another backend owns are refused, and so are the fields that
        make a variant from a checkpoint where this backend is not built from one; then its own check."""
        try:
            kind = backend_kind(self.backend)
        except VariantlabError:
            raise ValueError(f"unknown backend {self.backend!r} (accepted: {backend_accepted()})") from None
        for other in (backend_kind(n) for n in backend_names() if n != kind.name):
            extra = [k for k in other.fields if k not in kind.fields and getattr(self, k) is not None]
            if extra:
                raise ValueError(f"{', '.join(extra)} is for backend: {other.name} (this variant's backend is "
                                 f"{kind.name})")
        kind.check(self)
        built = [k for k in BUILD_FIELDS if k not in kind.takes and getattr(self, k) not in (None, {})]
        if built:
            raise ValueError(f"{kind.refusal}: {', '.join(built)} cannot apply to backend: {kind.name}")
        return self

    @property
    def builds(self) -> bool:
        """Whether this variant is built from a checkpoint (the suite's model, or its own)."""
        return backend_kind(self.backend).builds


class SLOSpec(_Frozen):
    """Per-request service-level objectives used for goodput."""

    ttft_s: float | None = Field(None, gt=0, le=MAX_DURATION_S)
    tpot_s: float | None = Field(None, gt=0, le=MAX_DURATION_S)
    e2el_s: float | None = Field(None, gt=0, le=MAX_DURATION_S)


Percentile = Literal["p50", "p90", "p95", "p99", "mean"]


class SequenceRange(_Frozen):
    """Prompt lengths the deployment must serve: latency limits also hold at every swept length inside."""

    min: int = Field(1, ge=1, le=MAX_TOKENS)
    max: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> "SequenceRange":
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


Objective = Union[str, dict[str, float]]


class Requirements(_Frozen):
    """What the chosen variant must meet, and what to optimize among those that do (`variantlab recommend`).

    A preset (`variantlab requirements PRESET` prints it) fills every field left unset here; SLOs also
    give the goodput rows. Latency limits read `scenario` (default: the first scenario with that row)."""

    preset: str | None = Field(None, description="high-precision | balanced | resource-constrained | "
                                                  "extreme-compression | real-time")
    min_task_accuracy: float | None = Field(None, ge=0, le=1, description="exact-match accuracy, 0–1")
    min_accuracy_retention: float | None = Field(None, ge=0, description="task accuracy ÷ the baseline's")
    max_kld: float | None = Field(None, ge=0, description="mean KL divergence from the baseline, nats")
    max_ppl_ratio: float | None = Field(None, ge=0)
    max_e2el_s: dict[Percentile, float] | None = Field(None, description="per-request latency limits, e.g. "
                                                                          "{p95: 0.5}")
    max_ttft_s: dict[Percentile, float] | None = Field(None, description="time-to-first-token limits, e.g. {p95: 0.1}")
    max_tpot_s: dict[Percentile, float] | None = Field(None, description="time-per-output-token limits, e.g. "
                                                                          "{p50: 0.02}")
    min_output_throughput: float | None = Field(None, gt=0, description="tok/s of the throughput scenario")
    min_goodput: float | None = Field(None, gt=0, description="req/s meeting every SLO")
    max_peak_memory_mib: float | None = Field(None, gt=0, description="peak memory of the measuring process")
    max_model_size_mib: float | None = Field(None, gt=0, description="weights as stored")
    sequence_length: SequenceRange | None = Field(None, description="{min, max} prompt tokens to serve")
    scenario: str | None = Field(None, description="the scenario whose latency rows the limits read")
    throughput_scenario: str | None = Field(None, description="the scenario whose throughput the limit reads")
    objective: Objective | None = Field(None, description="what to optimize among the variants that pass: "
                                                          "latency | e2el_p95 | ttft_p95 | tpot_p50 | throughput | "
                                                          "goodput | memory | size | accuracy | cold_start, "
                                                          "or weights {throughput: 1, size: 0.5}")
    slo: SLOSpec = SLOSpec()

    @field_validator("max_e2el_s", "max_ttft_s", "max_tpot_s")
    @classmethod
    def _positive_limits(cls, v: dict | None) -> dict | None:
        if v is not None and any(not (x > 0) for x in v.values()):
            raise ValueError("every latency limit must be a number of seconds above 0")
        return v

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        from .advise.presets import PRESETS
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; accepted: {' | '.join(PRESETS)}")
        return v

    @field_validator("objective")
    @classmethod
    def _known_objective(cls, v: Objective | None) -> Objective | None:
        from .advise.objectives import check_objective
        if v is not None:
            check_objective(v)
        return v

    @property
    def given(self) -> bool:
        """True when anything beyond the SLOs is set: then `bench` ends with a recommendation."""
        return any(getattr(self, f) is not None for f in type(self).model_fields if f != "slo")


class OutputSpec(_Frozen):
    dir: str = Field("runs", description="each run writes into DIR/<run id>/")
    store: str | None = Field(None, description="SQLite results store (default: variantlab.sqlite in the current folder)")


class Suite(_Frozen):
    """A suite: the model, its variants, the workload and the requirements."""

    name: str = Field("suite", pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$", max_length=64,
                      description="the suite's name; also its artifacts folder (./artifacts/NAME), so no path "
                                  "separators and no leading dot: '../../x' would write outside ./artifacts")
    model: str | None = Field(None, description="'builtin:tiny-structured' or a local Hugging Face causal-LM "
                                                "directory (needed unless every variant is an endpoint or has its own)")
    baseline: str | None = Field(None, description="name of the baseline variant (default: the first)")
    variants: list[VariantSpec] = Field(min_length=1)
    workload: Workload = Workload()
    calibration: DatasetSpec | None = Field(None, description="calibration text for recipes that use it "
                                                              "(mixed); default: the workload's own samples")
    requirements: Requirements = Requirements()
    output: OutputSpec = OutputSpec()
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1, le=MAX_THREADS, description="torch threads in each worker (default: the "
                                                                         "cores this process may use)")
    rounds: int = Field(DEFAULT_ROUNDS, ge=1, le=1000,
                        description="fresh processes per variant, every round in an order of its own, so that "
                                    "drift lands on all of them alike")
    order: Literal["random", "rotate"] = Field("random", description="random: shuffled every round, drawn afresh "
                                                                    "for every run (from the suite's seed and the "
                                                                    "run); rotate: A B C, B C A, …")
    interleave: Literal["requests", "processes"] = Field(
        "requests", description="requests: a round's variants stay resident and take the machine in turn, "
                                "request by request (A B C A B C …), so that the host's drift over seconds lands "
                                "on all alike; processes: one variant's process after another")
    seed: int = Field(0, ge=SEED_MIN, le=SEED_MAX)
    timeout_s: float = Field(900, gt=0, le=MAX_TIMEOUT_S, description="a variant still running after this is recorded "
                                                                      "as failed")
    max_memory: str | None = Field(None, description="resident memory a measurement's worker may hold (the "
                                                    "worker and what it starts), e.g. 4GiB or 512MiB; past it "
                                                    "the measurement is ended and recorded as failed")
    trust_remote_code: bool = Field(False, description="let a checkpoint's own Python (config.json auto_map) run "
                                                        "when it loads; off: such a checkpoint is refused at planning")
    explain: bool = Field(False, description="after the run, profile the baseline and every variant slower than it "
                                             "beyond its interval, and add why to the report (`variantlab explain`)")

    @property
    def baseline_name(self) -> str:
        return self.baseline or self.variants[0].name

    @field_validator("max_memory", mode="before")
    @classmethod
    def _a_size(cls, v: object) -> str | None:
        if v is None:
            return None
        if not isinstance(v, (str, int)) or isinstance(v, bool):
            raise ValueError(f"expected {ACCEPTED_SIZE}, got {type(v).__name__}")
        parse_size(v)
        return str(v)

    @property
    def max_memory_bytes(self) -> int | None:
        return None if self.max_memory is None else parse_size(self.max_memory)




def suite_json_schema() -> dict:
    return Suite.model_json_schema()


# ---------------------------------------------------------------- loading and error messages

class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, where: str):
        super().__init__(f"duplicate key {key!r} at {where}")
        self.key, self.where = key, where


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader, except that a key given twice in one mapping is an error, not silently the last
    one (`rounds: 5` then `rounds: 1` further down ran one round)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue                  # SafeLoader's own error for an unhashable key follows
            if key in seen:
                mark = key_node.start_mark
                raise DuplicateKey(str(key), f"line {mark.line + 1}, column {mark.column + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, file: str) -> Any:
    """YAML text → data, every failure a one-line SuiteError naming the file (and the line where YAML knows it):
    a duplicate key, malformed YAML, nesting too deep for the parser (RecursionError), a tagged scalar that
    does not convert (`!!timestamp 2020-99-99` raised ValueError from inside the loader)."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)   # noqa: S506 - a SafeLoader that refuses duplicate keys
    except DuplicateKey as e:
        raise SuiteError(f"the key '{e.key}' appears twice in one mapping (YAML would keep only the last)",
                         file=file, field=e.where, accepted="each key once per mapping") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SuiteError(f"malformed YAML: {problem}", file=file, field=where,
                         accepted="valid YAML mapping") from None
    except RecursionError:
        raise SuiteError("YAML nested too deeply to read", file=file,
                         accepted="a YAML mapping nested as the schema is, a few levels (`variantlab schema`)"
                         ) from None
    except (ValueError, TypeError, OverflowError) as e:   # a scalar YAML parsed but could not convert
        raise SuiteError(f"malformed YAML value: {_shown(str(e))}", file=file,
                         accepted="valid YAML mapping (plain scalars; !!timestamp etc. must be valid)") from None


def load_suite(path: str | Path) -> Suite:
    """Read, parse and validate a suite file; every failure is a one-line SuiteError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SuiteError("no such suite file", file=str(path), accepted="a path to a YAML suite file") from None
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as e:
        raise SuiteError(f"cannot read suite file: {e.__class__.__name__}", file=str(path),
                         accepted="a UTF-8 YAML file") from None
    data = parse_yaml(text, file=str(path))
    if not isinstance(data, dict):
        raise SuiteError(f"the suite must be a YAML mapping, got {type(data).__name__}", file=str(path),
                         accepted=", ".join(Suite.model_fields))
    return parse_suite(data, file=str(path))


def parse_suite(data: dict, file: str = "<suite>") -> Suite:
    try:
        suite = Suite.model_validate(data)
    except ValidationError as e:
        raise _suite_error(e, file) from None
    _check_names(suite, file)
    return suite


def _check_names(suite: Suite, file: str) -> None:
    if suite.model is None:
        needs = [v.name for v in suite.variants if v.builds and v.model is None]
        if needs:
            raise SuiteError(f"required field is missing: variant '{needs[0]}' is built from the suite's model",
                             file=file, field="model", accepted="a model directory or builtin:tiny-structured "
                             "(or give that variant a model: of its own, or backend: openai)")
    names = [v.name for v in suite.variants]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise SuiteError(f"variant name '{n}' is used twice", file=file, field=f"variants[{i}].name",
                             accepted="a name no other variant has")
    seen: list[str] = []
    for i, sc in enumerate(suite.workload.scenarios):
        n = sc.name or sc.type
        if n in seen or n in RESERVED_NAMES:
            raise SuiteError(f"two scenarios are named '{n}'" if n in seen else f"'{n}' is a reserved name",
                             file=file, field=f"workload.scenarios[{i}].name",
                             accepted="a name no other scenario has (name: …), not " + ", ".join(RESERVED_NAMES))
        seen.append(n)
    for key in ("scenario", "throughput_scenario"):
        chosen = getattr(suite.requirements, key)
        if chosen is not None and chosen not in seen:
            raise SuiteError(f"no scenario is named '{chosen}'", file=file, field=f"requirements.{key}",
                             accepted=" | ".join(seen))
    if suite.baseline is not None and suite.baseline not in names:
        raise SuiteError(f"baseline '{suite.baseline}' is not a variant", file=file, field="baseline",
                         accepted=" | ".join(names))


def _suite_error(e: ValidationError, file: str) -> SuiteError:
    err = e.errors()[0]
    loc = tuple(err["loc"])
    field = _loc_to_path(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(Suite, loc[:-1])
        accepted = ", ".join(parent.model_fields) if parent else None
        return SuiteError(f"unknown key '{loc[-1]}'", file=file, field=field, accepted=accepted)
    if kind == "missing":
        return SuiteError("required field is missing", file=file, field=field)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return SuiteError("unknown or missing scenario type", file=file, field=field,
                          accepted="type: " + " | ".join(SCENARIO_SPECS))
    accepted = _accepted_for(loc)
    if kind.startswith(NUMBER_ERRORS) and (bounds := _range_at(loc)):
        accepted = f"{bounds}; {accepted}" if accepted else bounds
    msg = err["msg"].removeprefix("Value error, ")
    if "input" in err and kind not in ("value_error",) and not isinstance(err["input"], (dict, list)):
        msg += f", got {_shown(err['input'])}"
    return SuiteError(msg, file=file, field=field or None, accepted=accepted)


def _shown(value: Any, limit: int = 60) -> str:
    """A bad value as the error quotes it: its repr, cut to `limit` characters (a 5,000-digit int has no repr
    at all: Python refuses to convert it, ValueError); a boolean as YAML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"     # as the YAML says it, not Python's True
    if isinstance(value, int) and abs(value) >= 10**limit:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _loc_to_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in SCENARIO_SPECS or part == "[key]":
            continue  # tags pydantic inserts (a scenario's discriminator, a mapping's key); the user never wrote them
        else:
            out += ("." if out else "") + str(part)
    return out


def _inner_models(annotation: Any) -> list[type[BaseModel]]:
    """BaseModel classes reachable through Optional / list / Union / Annotated wrappers."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin is Annotated:
        args = args[:1]
    found: list[type[BaseModel]] = []
    for a in args:
        found += _inner_models(a)
    return found


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        if part in SCENARIO_SPECS:
            model = SCENARIO_SPECS[part]
            continue
        f = model.model_fields.get(str(part))
        if f is None:
            return None
        candidates = _inner_models(f.annotation)
        model = candidates[0] if len(candidates) == 1 else (candidates[0] if candidates else None)
    return model


# pydantic's error types (their prefixes) for a number out of its range or not a (finite) number at all, and ours
# for a boolean where a number belongs (spec_model.py)
NUMBER_ERRORS = ("greater_than", "less_than", "finite_number", "int_", "float_", BOOL_FOR_NUMBER)


def _range_at(loc: tuple) -> str | None:
    """The accepted range of the number field at `loc` from its bounds, e.g. 'an integer from 1 to 100000'."""
    parent = _model_at(Suite, loc[:-1]) if loc else None
    f = parent.model_fields.get(str(loc[-1])) if parent else None
    if f is None:
        return None
    bound = {k: f"{v:g}" if isinstance(v, float) else str(v)
             for m in f.metadata for k in ("ge", "gt", "le", "lt") if (v := getattr(m, k, None)) is not None}
    if not bound:
        return None
    what = "an integer" if int in (f.annotation, *typing.get_args(f.annotation)) else "a finite number"
    if "ge" in bound and "le" in bound:
        return f"{what} from {bound['ge']} to {bound['le']}"
    words = {"ge": "at least", "gt": "above", "le": "at most", "lt": "below"}
    return f"{what} " + " and ".join(f"{words[k]} {bound[k]}" for k in words if k in bound)


def _accepted_for(loc: tuple) -> str | None:
    if not loc:
        return None
    parent = _model_at(Suite, loc[:-1])
    if parent is None:
        return None
    f = parent.model_fields.get(str(loc[-1]))
    if f is None:
        return None
    ann = f.annotation
    if typing.get_origin(ann) in (Union, types.UnionType):
        lits = [a for a in typing.get_args(ann) if typing.get_origin(a) is Literal]
        if lits:
            return " | ".join(str(v) for v in typing.get_args(lits[0]))
    if typing.get_origin(ann) is Literal:
        return " | ".join(str(v) for v in typing.get_args(ann))
    return f.description
