"""The hardware-aware configuration: what to run on this machine for a workload, each choice with its reason.

`hardware_config(facts, ceilings, kernel_times, workload)` is a pure function of what the machine is
(device_facts), what it gives (hardware.Ceilings) and what each recipe's kernels take here
(kernel_times.KernelTimes, measured), so recorded facts of other machines test the mapping:

- dtype (what quantized recipes compute in): bf16 where the CPU has AVX-512 BF16 or AMX-BF16 or the GPU
  is Ampere or later (8.0+); fp16 on Volta/Turing (fp16 tensor cores, no bf16). On any other CPU the
  kernels are timed in fp32 and in bf16 (timed_dtypes: our kernels widen bf16 in registers there) and
  the dtype whose best quantized recipe is faster for the workload wins; fp32 where nothing decides it.
  On a CPU the bf16 recipe is timed whatever the dtype (kernel_times.paths_for): the recipe choice
  weighs it.
- recipe: the timed path with the least estimated linear-layer time over the workload's phases
  (decode steps at M = batch rows, prefills at M = batch × prompt tokens); beside it the fastest path
  at decode (M = 1) and at the workload's batch, and the crossover: the first M where the best
  weight-only path (int8, int4) stops beating the best dense or w8a8/w4a8 path.
- TF32 on CUDA 8.0+ (fp32 matmuls on tensor cores); fp8: available on 8.9+ (Ada, Hopper, Blackwell),
  but no recipe uses it yet, and the configuration says so.
- compile: a rule, not a measurement (compiling takes seconds per process): it pays off when the
  workload's decode steps × the saving per step (COMPILE_SAVING of the step's estimated linear
  time) exceed COMPILE_S.
- threads: the cores this process may use.

Unknown hardware (no instruction-set flags, an unknown GPU architecture, kernel times that could not
be measured) gets the safe fallback — fp32, no quantization, eager — and a note; never an exception.
`machine_config` gathers this machine's facts, ceilings and kernel times (cached) and calls it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .variants.registry import group_wise, int8_activations, kernel_recipes, takes_compute_dtype

# The compile rule's figures (docs/engine.md; benchmarks/engine_decode.py --compile on a 115M
# Llama): compiling takes 5-30 s in every worker and decodes 1.2-1.6x as fast as eager.
COMPILE_S = 15.0
COMPILE_SAVING = 0.15     # 1 - 1/1.2, rounded down: the saving per decode step the rule assumes
NEAR_TIE = 0.05          # estimates closer than this are called a near tie in the recipe's reason
FP8_CAPABILITY = (8, 9)
BF16_CAPABILITY = (8, 0)
FP16_CAPABILITY = (7, 0)


@dataclass(frozen=True)
class Choice:
    name: str
    value: Any
    reason: str          # plain words, with the figures that decided it

    def line(self) -> str:
        v = {True: "on", False: "off", None: "—"}.get(self.value, self.value) if isinstance(
            self.value, (bool, type(None))) else self.value
        return f"{self.name}: {v} — {self.reason}"


@dataclass(frozen=True)
class Phase:
    """Calls of every linear layer at one activation row count, per measuring process."""

    what: str            # "decode, batch 1"
    rows: int            # activation rows per call (M)
    calls: int           # forward passes at these rows
    decode: bool = True  # a decode step (compile's saving applies), else a prefill


@dataclass(frozen=True)
class Workload:
    """What a process will run, as linear-layer calls: phases, and the model's size in timed layers."""

    name: str
    phases: tuple[Phase, ...]
    layers: float = 64.0          # the model's linear weights ÷ the timed layer's (a forward's layer calls)

    @property
    def decode_steps(self) -> int:
        return sum(p.calls for p in self.phases if p.decode)

    @property
    def batch_rows(self) -> int:
        """The rows of the decode phase that decodes the most tokens."""
        dec = [p for p in self.phases if p.decode] or list(self.phases)
        return max(dec, key=lambda p: p.rows * p.calls).rows if dec else 1


def preset(name: str, batch: int, prompt_tokens: int = 64, new_tokens: int = 128, requests: int = 64,
           layers: float = 64.0) -> Workload:
    """A workload of `requests` requests in batches of `batch`: one prefill and new_tokens - 1 decode
    steps per batch."""
    batches = -(-requests // batch)
    return Workload(f"{name} ({requests} requests of {prompt_tokens} prompt + {new_tokens} new tokens, "
                    f"batch {batch})",
                    (Phase(f"prefill, batch {batch} × {prompt_tokens} tokens", batch * prompt_tokens, batches, False),
                     Phase(f"decode, batch {batch}", batch, batches * (new_tokens - 1))), layers)


DECODE_HEAVY = preset("decode-heavy: single stream", 1)
BATCH_HEAVY = preset("batch-heavy: offline", 64)


@dataclass(frozen=True)
class HardwareConfig:
    device: str
    workload: str
    choices: tuple[Choice, ...]
    recipe: str                   # a concrete recipe a suite variant can name
    options: dict = field(default_factory=dict)
    compile: bool = False
    notes: tuple[str, ...] = ()
    fallback: bool = False        # the safe fallback was taken (the notes say why)

    def choice(self, name: str) -> Choice:
        return next(c for c in self.choices if c.name == name)

    def summary(self) -> str:
        """'int8 (reason)': what `recipe: auto` resolves to, in one line."""
        opts = ", ".join(f"{k}: {v}" for k, v in self.options.items())
        return (f"{self.recipe}" + (f" {{{opts}}}" if opts else "") + (", compiled" if self.compile else "")
                + f" ({self.choice('recipe').reason})")

    def lines(self) -> list[str]:
        return ([f"configuration for {self.workload} on {self.device}:"] + [f"  {c.line()}" for c in self.choices]
                + [f"  note: {n}" for n in self.notes])

    def to_json(self) -> dict:
        return asdict(self)


# --- the mapping: pure functions of recorded facts ------------------------------------------------

def _capability(gpu) -> tuple[int, int] | None:
    try:
        major, minor = (int(x) for x in str(_get(gpu, "capability")).split(".")[:2])
        return major, minor
    except ValueError:
        return None


def _get(facts, name: str, default=None):
    return facts.get(name, default) if isinstance(facts, dict) else getattr(facts, name, default)


def _gpu(facts, device: str):
    gpus = _get(facts, "gpus", ()) or ()
    index = device.partition(":")[2] or "0"
    return gpus[int(index)] if index.isdigit() and int(index) < len(gpus) else None


def _known_architecture(gpu) -> bool:
    return not str(_get(gpu, "architecture") or "unknown").startswith("unknown")


def choose_dtype(facts, ceilings=None, device: str = "cpu") -> tuple[Choice, str | None]:
    """(the dtype choice, a fallback note or None)."""
    if device.startswith("cuda"):
        gpu = _gpu(facts, device)
        cap = _capability(gpu) if gpu is not None else None
        if gpu is None or cap is None or not _known_architecture(gpu):
            what = "no GPU facts" if gpu is None else f"compute capability {_get(gpu, 'capability')} " \
                                                     f"({_get(gpu, 'architecture')})"
            return (Choice("dtype", "fp32", f"{what}: fp32, the safe fallback"),
                    f"unknown GPU ({what}): fp32, no quantization, eager")
        arch, c = _get(gpu, "architecture"), f"{cap[0]}.{cap[1]}"
        if cap >= BF16_CAPABILITY:
            return Choice("dtype", "bf16", f"{arch} (compute capability {c} ≥ 8.0) has bf16 tensor cores: "
                                           "fp32's range at half the bytes"), None
        if cap >= FP16_CAPABILITY:
            return Choice("dtype", "fp16", f"{arch} (compute capability {c}) has fp16 tensor cores but no "
                                           "bf16 (8.0+)"), None
        return Choice("dtype", "fp32", f"{arch} (compute capability {c} < 7.0) has no 16-bit tensor cores"), None
    isa = _get(facts, "isa", {}) or {}
    if not any(isa.values()):
        return (Choice("dtype", "fp32", "no instruction-set flags known for this CPU: fp32, the safe fallback"),
                "unknown CPU (no instruction-set flags): fp32, no quantization, eager")
    rates = (_get(ceilings, "matmul_tflops", {}) or {}) if ceilings is not None else {}
    measured = ""
    if rates.get("bf16") and rates.get("fp32"):
        measured = f"; measured 1024² matmul: bf16 {rates['bf16']:.2f} vs fp32 {rates['fp32']:.2f} TFLOP/s"
    native = [n for n in ("AMX-BF16", "AVX-512 BF16") if isa.get(n)]
    if native:
        return Choice("dtype", "bf16", f"the CPU has {' and '.join(native)} (native bf16 dot products): "
                                       f"half the bytes of fp32 per weight{measured}"), None
    return Choice("dtype", "fp32", "the CPU has neither AVX-512 BF16 nor AMX-BF16 (bf16 dot products would be "
                                   f"emulated): fp32, unless kernel times in both dtypes say otherwise{measured}"), None


def timed_dtypes(facts, ceilings=None, device: str = "cpu") -> tuple[str, ...]:
    """The compute dtypes a configuration's kernel times are measured in: the rule's (choose_dtype); on a
    CPU whose rule says fp32, bf16 too: our kernels take bf16 activations there as well (widened in
    registers), aten's int4 kernel is fast only with them, and only the timing says which dtype a workload
    should compute in. () for hardware the rule does not know (the fallback)."""
    dtype, unknown = choose_dtype(facts, ceilings, device)
    if unknown:
        return ()
    return ("fp32", "bf16") if dtype.value == "fp32" and not device.startswith("cuda") else (dtype.value,)


def _measured_dtype(rule: Choice, kts, workload: Workload, candidates) -> tuple[Choice, Any]:
    """(the dtype choice, its kernel times) where kernel times in several compute dtypes were measured: the
    dtype whose best quantized recipe has the least estimated time for the workload; the rule's dtype
    where no quantized recipe among the candidates was timed (the dense recipes do not compute in it)."""
    best = []
    for kt in kts:
        quantized = [p for p in kt.seconds if takes_compute_dtype(p) and (candidates is None or p in candidates)]
        if quantized:
            p, s = min(((p, _estimate(kt, p, workload)) for p in quantized), key=lambda ps: ps[1])
            best.append((s, kt.compute_dtype, p, kt))
    if not best:
        return rule, next((kt for kt in kts if kt.compute_dtype == rule.value), kts[0])
    best.sort(key=lambda b: b[0])
    figures = " < ".join(f"{d}: {p} {s:.3g} s" for s, d, p, _ in best)
    if len(best) > 1 and best[1][0] < best[0][0] * (1 + NEAR_TIE):
        figures += f" (a near tie: within {NEAR_TIE:.0%}, which a noisy machine can reverse)"
    return Choice("dtype", best[0][1], f"measured: quantized recipes timed computing in "
                                       f"{' and '.join(kt.compute_dtype for kt in kts)} (the rule alone: "
                                       f"{rule.value}); the least estimated linear-layer time for this workload, "
                                       f"each dtype's best: {figures}"), best[0][3]


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


# the crossover weighs the weight-only kernels (int8, int4) against the dense recipes and w8a8
WEIGHT_ONLY = tuple(r for r in kernel_recipes() if not int8_activations(r))
DENSE_OR_W8A8 = ("fp32", "bf16", "fp16") + tuple(r for r in kernel_recipes()
                                                if int8_activations(r) and not group_wise(r))


def _fastest(kt, paths, m: float) -> tuple[str, float]:
    return min(((p, kt.at(p, m)) for p in paths), key=lambda pt: pt[1])


def _ranking(kt, paths, m: int, n: int = 4) -> str:
    ranked = sorted(((p, kt.at(p, m)) for p in paths), key=lambda pt: pt[1])
    return " < ".join(f"{p} {_ms(t)}" for p, t in ranked[:n])


def crossover(kt, paths) -> int | None:
    """The first measured M from which the best weight-only path (int8, int4) no longer beats the best
    dense or w8a8 path, for good (None: weight-only wins at every M measured, or one side was not timed)."""
    wo = [p for p in paths if p in WEIGHT_ONLY]
    other = [p for p in paths if p in DENSE_OR_W8A8]
    if not wo or not other:
        return None
    loses = [_fastest(kt, wo, m)[1] >= _fastest(kt, other, m)[1] for m in kt.rows]
    return next((m for i, m in enumerate(kt.rows) if all(loses[i:])), None)


def _estimate(kt, path: str, workload: Workload) -> float:
    return sum(p.calls * workload.layers * kt.at(path, p.rows) for p in workload.phases)


def _crossover_choice(kt, paths) -> Choice | None:
    wo = [p for p in paths if p in WEIGHT_ONLY]
    other = [p for p in paths if p in DENSE_OR_W8A8]
    if not wo or not other:
        return None
    x = crossover(kt, paths)
    if x is None:
        return Choice("crossover M", None, f"weight-only ({', '.join(wo)}) beats {', '.join(other)} at every M "
                                           f"measured (1–{kt.rows[-1]})")
    (w, ws), (o, os_) = _fastest(kt, wo, x), _fastest(kt, other, x)
    if x == kt.rows[0]:
        return Choice("crossover M", x, f"weight-only never wins here: at M=1 {w} {_ms(ws)} vs {o} {_ms(os_)}")
    return Choice("crossover M", x, f"weight-only ({', '.join(wo)}) beats {', '.join(other)} below M={x}; at "
                                    f"M={x} {w} {_ms(ws)} vs {o} {_ms(os_)}")


def _recipe_choices(kt, workload: Workload, paths: list[str]) -> list[Choice]:
    """The recipe choice (least estimated time over the workload), then the regimes and the crossover."""
    where = f"{kt.shape} linear, {kt.threads} threads"
    est = sorted(((p, _estimate(kt, p, workload)) for p in paths), key=lambda pe: pe[1])
    parts = ", ".join(f"{p.what} × {p.calls}" for p in workload.phases)
    beyond = [p for p in workload.phases if p.rows > kt.rows[-1]]
    extrap = f"; M > {kt.rows[-1]} extrapolated in proportion to M" if beyond else ""
    ranking = " < ".join(f"{p} {s:.3g} s" for p, s in est)
    if len(est) > 1 and est[1][1] < est[0][1] * (1 + NEAR_TIE):
        ranking += f" (a near tie with {est[1][0]}: within {NEAR_TIE:.0%}, which a noisy machine can reverse)"
    rows = workload.batch_rows if workload.batch_rows > 1 else 64
    out = [Choice("recipe", est[0][0], f"least estimated linear-layer time for this workload ({parts}; "
                                       f"{workload.layers:.0f} layer-equivalents a forward, each timed as one "
                                       f"{where}{extrap}): {ranking}"),
           Choice("decode kernel (M=1)", _fastest(kt, paths, 1)[0], f"at M=1: {_ranking(kt, paths, 1)}"),
           Choice(f"batched kernel (M={rows})", _fastest(kt, paths, rows)[0],
                  f"at M={rows}: {_ranking(kt, paths, rows)}")]
    x = _crossover_choice(kt, paths)
    return out + ([x] if x else [])


def _compile_choice(kt, workload: Workload, recipe: str, fallback: bool) -> Choice:
    if fallback or kt is None:
        return Choice("compile", False, "eager: the safe fallback (nothing measured to weigh compiling against)")
    step_s = sum(p.calls * workload.layers * kt.at(recipe, p.rows) for p in workload.phases if p.decode)
    saving = COMPILE_SAVING * step_s
    pays = saving > COMPILE_S
    return Choice("compile", pays, f"a rule, not measured here: compiling costs ≈{COMPILE_S:.0f} s a process "
                                   f"and saves ≈{COMPILE_SAVING:.0%} of a decode step (docs/engine.md: 5–30 s, 1.2–1.6× on "
                                   f"a 115M Llama); this workload's {workload.decode_steps} decode steps take "
                                   f"≈{step_s:.3g} s of {recipe} linear time, so it would save ≈{saving:.3g} s "
                                   f"{'>' if pays else '<'} {COMPILE_S:.0f} s")


def _kernel_times(kernel_times) -> tuple:
    """None, one KernelTimes (or its JSON) or a sequence of them (one per compute dtype) → a tuple."""
    from .kernel_times import KernelTimes
    if kernel_times is None:
        return ()
    many = kernel_times if isinstance(kernel_times, (list, tuple)) else (kernel_times,)
    return tuple(KernelTimes.from_json(k) if isinstance(k, dict) else k for k in many)


def hardware_config(facts, ceilings, kernel_times, workload: Workload, *, device: str | None = None,
                    candidates=None) -> HardwareConfig:
    """The configuration for `workload` on `device` (default: the first GPU in facts, else the CPU).
    Pure: facts, ceilings and kernel times are recorded data (dicts or the dataclasses; kernel times one
    record, or one per compute dtype timed, from which the dtype is then chosen). Never raises
    for hardware it does not know: it falls back to fp32, no quantization, eager, with a note."""
    if device is None:
        device = "cuda:0" if _get(facts, "gpus") else "cpu"
    kts = _kernel_times(kernel_times)
    notes: list[str] = []
    dtype, unknown = choose_dtype(facts, ceilings, device)
    if unknown:
        notes.append(unknown)
        kt = None
    elif len(kts) > 1:
        dtype, kt = _measured_dtype(dtype, kts, workload, candidates)
    else:
        kt = kts[0] if kts else None
    paths = []
    if kt is not None:
        paths = [p for p in kt.seconds if candidates is None or p in candidates]
        if kt.compute_dtype != dtype.value and dtype.value != "fp32":
            notes.append(f"kernel times were measured with compute dtype {kt.compute_dtype}, not {dtype.value}")
        if kt.load_average is not None and kt.load_average > max(kt.threads, 1):
            notes.append(f"kernel times were measured on a busy machine (load average {kt.load_average:.1f} on "
                         f"{kt.threads} threads): `variantlab hw --refresh` on a quiet one measures them again")
        if kt.failed:
            notes.append("not timed here: " + "; ".join(f"{p}: {why}" for p, why in kt.failed.items()))
        if not paths:
            notes.append("no timed recipe among the candidates" + (f" ({', '.join(candidates)})" if candidates else ""))
    elif not unknown:
        notes.append("kernel times could not be measured: fp32, no quantization, eager")
    fallback = not paths
    choices = [dtype]
    if fallback:
        choices.append(Choice("recipe", "fp32", "fp32, no quantization: the safe fallback (see the notes)"))
        recipe, options = "fp32", {}
    else:
        choices += _recipe_choices(kt, workload, paths)
        recipe = choices[1].value
        options = {"compute_dtype": kt.compute_dtype} if takes_compute_dtype(recipe) else {}
    cuda = device.startswith("cuda") and not unknown
    cap = _capability(_gpu(facts, device)) if cuda else None
    if cuda:
        arch = _get(_gpu(facts, device), "architecture")
        tf32 = cap >= BF16_CAPABILITY
        choices.append(Choice("TF32", tf32, f"{arch} ({cap[0]}.{cap[1]}) " + (
            "runs fp32 matmuls on tensor cores in TF32 (torch.backends.cuda.matmul.allow_tf32); recorded here, "
            "the measuring worker does not switch it" if tf32 else "has no TF32 (8.0+)")))
        fp8 = cap >= FP8_CAPABILITY
        choices.append(Choice("fp8", "available, no fp8 recipe yet" if fp8 else "not available",
                              f"{arch} ({cap[0]}.{cap[1]}) " + ("has fp8 tensor cores (8.9+); no variantlab recipe "
                                                                "runs fp8, so none is chosen" if fp8
                                                                else "has no fp8 tensor cores (8.9+)")))
    else:
        choices.append(Choice("TF32", False, "CUDA only (8.0+)" if not unknown else "the safe fallback"))
        choices.append(Choice("fp8", "not available", "no fp8 matmul on this device" if not unknown
                              else "the safe fallback"))
    compile_choice = _compile_choice(kt, workload, recipe, fallback)
    choices.append(compile_choice)
    cores = _get(facts, "cores")
    choices.append(Choice("threads", cores or 1, f"the cores this process may use (CPU affinity, cgroup quota): "
                                                 f"{cores}" if cores else "core count unknown: 1, the safe fallback"))
    return HardwareConfig(device, workload.name, tuple(choices), recipe, options, compile_choice.value,
                          tuple(notes), fallback)


# --- this machine ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MachineInputs:
    """What this machine's configuration is computed from, with notes on what could not be measured."""

    facts: Any
    ceilings: Any
    kernel_times: tuple        # one KernelTimes per compute dtype timed (timed_dtypes); () where none was
    notes: tuple[str, ...] = ()


def machine_inputs(device: str = "cpu", *, shape: tuple[int, int] | None = None, parameters: int | None = None,
                   threads: int | None = None, refresh: bool = False, ceilings=None) -> MachineInputs:
    """This machine's facts, cached ceilings (unless given) and cached kernel times (measured on first
    use: seconds). A measurement that fails leaves None and a note (never an exception)."""
    from .device_facts import device_facts
    from .hardware import cached_ceilings
    from .kernel_times import PARAMETERS, SHAPE, cached_kernel_times

    facts = device_facts(with_gpus=device.startswith("cuda"))
    notes: list[str] = []
    kts = []
    try:
        ceilings = ceilings or cached_ceilings(device, refresh=refresh)[0]
    except Exception as e:   # noqa: BLE001 - a configuration never crashes on the machine it describes
        notes.append(f"ceilings not measured: {type(e).__name__}: {e}")
    for dtype in timed_dtypes(facts, ceilings, device):
        try:
            k, n = shape or SHAPE
            kts.append(cached_kernel_times(k, n, device=device, compute_dtype=dtype,
                                           parameters=parameters or PARAMETERS, threads=threads, refresh=refresh)[0])
        except Exception as e:   # noqa: BLE001 - likewise: the fallback, and a note saying why
            first = str(e).splitlines()[0] if str(e) else ""
            notes.append(f"kernel micro-benchmark failed: {type(e).__name__}: {first}")
            break
    return MachineInputs(facts, ceilings, tuple(kts), tuple(notes))


def machine_config(workload: Workload, *, device: str = "cpu", shape: tuple[int, int] | None = None,
                   parameters: int | None = None, threads: int | None = None, candidates=None,
                   refresh: bool = False, inputs: MachineInputs | None = None) -> HardwareConfig:
    """This machine's configuration for `workload` (machine_inputs, then hardware_config)."""
    from dataclasses import replace

    m = inputs or machine_inputs(device, shape=shape, parameters=parameters, threads=threads, refresh=refresh)
    config = hardware_config(m.facts, m.ceilings, m.kernel_times, workload, device=device, candidates=candidates)
    return replace(config, notes=m.notes + config.notes) if m.notes else config
