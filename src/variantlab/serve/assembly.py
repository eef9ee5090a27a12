"""What a served engine is made of, shared by the server (serve/server.py) and its worker processes
(serve/worker.py): the serving options, each variant built through the library call, the accuracy floor's
verdict applied, and the engine over one Lane per variant with the options' policy (serve/policy_kinds.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import VariantlabError
from .app import ServerLimits
from .engine import ServeEngine
from .lane import Lane
from .policy_kinds import PolicySettings, make_policy, policy_kind

DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class ServeOptions:
    policy: str = "adaptive"
    variants: tuple[str, ...] = ()         # () : every variant of the suite (single/static: the first)
    max_batch: int = 32
    batch_size: int = 8                    # static
    max_wait_s: float = 0.02               # static
    max_queue: int = 256
    context: int = 512                     # prompt + output tokens a request may use
    prefill_chunk: int = 256
    limits: ServerLimits = ServerLimits()
    api_key: str | None = None
    device: str = "cpu"
    threads: int | None = None
    accuracy_samples: int = 64             # graded for the accuracy floor
    tpot_slo_s: float | None = None        # overrides the suite's
    ttft_slo_s: float | None = None        # overrides the suite's (max_ttft_s p95, else slo.ttft_s)
    workers: int = 1                       # serving processes (engine_process or > 1: behind a router)
    engine_process: bool = False           # the engine in a worker process, apart from HTTP (the CLI's default)
    devices: tuple[str, ...] = ()          # one per worker ("cpu", "cuda:N"); (): every worker on the CPU
    worker_variants: tuple[tuple[str, ...], ...] = ()   # one set per worker; (): every worker holds all

    def __post_init__(self) -> None:
        policy_kind(self.policy)
        if self.workers < 1:
            raise VariantlabError(f"at least one worker is needed, got {self.workers}", field="--workers")
        if self.devices and len(self.devices) != self.workers:
            raise VariantlabError(f"{len(self.devices)} devices for {self.workers} workers", field="--devices",
                                  accepted="one device per worker, e.g. --workers 2 --devices cpu,cuda:0")
        for d in self.devices:
            if not DEVICE_PATTERN.fullmatch(d):
                raise VariantlabError(f"unknown device {d!r}", field="--devices", accepted="cpu | cuda | cuda:N")
        if self.worker_variants and len(self.worker_variants) != self.workers:
            raise VariantlabError(f"{len(self.worker_variants)} variant sets for {self.workers} workers",
                                  field="worker_variants", accepted="one set of variants per worker")



def build_engines(planned, calibration_texts, device: str, log=print, trust_remote_code: bool = False) -> dict:
    """name → TorchEngine, each variant built by the library call (`variants.build`) on `device`;
    `trust_remote_code`: the suite's switch."""
    from ..backends.torch_engine import TorchEngine
    from ..variants import build as variants
    engines = {}
    for pv in planned:
        built = variants.build(str(pv.source), pv.definition, device, calibration_texts=calibration_texts,
                               trust_remote_code=trust_remote_code)
        engines[pv.name] = TorchEngine(built.model, built.tokenizer, device)
        log(f"built {pv.name}: {built.facts.recipe}, {', '.join(built.facts.kernels[:2])}")
    return engines


def allowed_by_floor(names: list[str], accuracy: dict, log=print) -> list[str]:
    for name, a in accuracy.items():
        log(f"accuracy floor: {name} {'serves' if a['allowed'] else 'is not served'}: {a['why']}")
    allowed = [n for n in names if accuracy.get(n, {}).get("allowed", True)]
    if not allowed:
        raise VariantlabError("no variant meets the suite's accuracy floor: "
                              + "; ".join(f"{n}: {accuracy[n]['why']}" for n in names), field="requirements",
                              accepted="a lower floor, or variants that keep the task")
    return allowed


def assemble_engine(engines: dict, names: list[str], options: ServeOptions, slo: float | None, log=print):
    """(ServeEngine, variant → StepCost) over one Lane per name, with the options' policy; the step costs
    are measured here for `adaptive` only ({} otherwise). The engine is not started."""
    lanes = {}
    for n in names:
        try:
            lanes[n] = Lane(n, engines[n], max_rows=options.max_batch, max_len=options.context,
                            chunk=options.prefill_chunk)
        except ValueError as e:
            raise VariantlabError(str(e), field="--variants", accepted="variants with the model's own or gqa "
                                  "attention") from None
    settings = PolicySettings(max_rows=options.max_batch, batch_size=options.batch_size,
                              max_wait_s=options.max_wait_s, tpot_slo_s=slo, ttft_slo_s=options.ttft_slo_s)
    policy, costs = make_policy(options.policy, lanes, settings, log)
    engine = ServeEngine(lanes, policy, max_queue=options.max_queue)
    engine.on_switch = log            # every switch, with its reason, where the server's log goes
    return engine, costs
