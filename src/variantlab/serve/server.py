"""A server assembled from a suite: its variants built through the library call, held to the suite's
accuracy floor, measured for the adaptive policy, behind the HTTP API.

`build_server(plan, options)` is what `variantlab serve` runs, and what the bench's server scenario and
benchmarks/serve_policies.py run in-process (first, our CPU kernels are built here, once, when missing:
variants/kernels.prepare, so that no worker builds them and no calibration times it):
1. build each chosen variant (`variants.build`, the same call bench and explain use);
2. the accuracy floor: when the suite's requirements (their preset expanded) set
   min_accuracy_retention or min_task_accuracy, grade every variant and the baseline on the suite's
   samples by exact match (the Grading tracker) and drop those that miss it — the policy never sees
   them, and the server says which and why;
3. one Lane per variant; for `adaptive`, each lane's decode-step time per batch size measured here
   (serve/calibrate.py) and the TPOT SLO from the suite (max_tpot_s p95, else slo.tpot_s);
4. the engine and the FastAPI app.
`ServerHandle.start_http()` runs uvicorn on a thread (loopback, a free port by default): the tests and
benchmarks talk to a real server over real HTTP. `ServerHandle.serve()` runs it in the main thread until
SIGTERM or SIGINT (what `variantlab serve` does). Both end through serve/listener.py's shutdown: stop
accepting, let the requests in flight finish within a grace, fail the rest with 503, stop the engine
and its worker processes.

With `workers` > 1, or `engine_process` (what `variantlab serve` runs), steps 1 and 3-4 run in worker
processes instead (serve/workers.py): each builds its own variants through the same two helpers
(`build_engines`, `assemble_engine`) on its own device and threads, and the handle's `.engine` is the
Router in front of them. One process for HTTP and one for the engine is what holds up under load: the
HTTP event loop and the engine thread fight over Python's GIL in one process (measured on the reference
model at 80 req/s: TTFT p50 1.4 s with both in one process, 46 ms with the engine apart). The accuracy floor (step 2) is
graded here, on the first worker's device, before the workers start; its models are freed after.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from ..errors import VariantlabError
from .app import create_app
from .engine import ServeEngine
from .assembly import ServeOptions, allowed_by_floor, assemble_engine, build_engines  # noqa: F401 - re-exported
from .listener import GRACE_S, Listener
from .policy_kinds import policy_kind

@dataclass
class ServerHandle:
    engine: ServeEngine                     # or, with workers > 1, the Router (serve/workers.py)
    app: object
    text: object                            # the shared TorchEngine (tokenizer)
    accuracy: dict = field(default_factory=dict)      # variant → {accuracy, retention, allowed, why}
    calibration: dict = field(default_factory=dict)   # variant → step seconds by batch size (routed: worker → that)
    tpot_slo_s: float | None = None
    _listener: Listener | None = None
    _thread: threading.Thread | None = None
    port: int | None = None

    def start_http(self, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                   grace_s: float = 1.0) -> str:
        """Serve on host:port (0: a free port) from a background thread; the base URL once it answers.
        `grace_s`: what close() gives the requests in flight (serve/listener.py)."""
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self._listener = Listener(self.app, self.engine.stop, host, port, grace_s=grace_s, log_level=log_level)
        self._thread = threading.Thread(target=self._listener.run, name="variantlab-http", daemon=True)
        self._thread.start()
        deadline = time.time() + 30
        while not self._listener.started:
            if time.time() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the HTTP server did not start on {host}:{port}")
            time.sleep(0.02)
        self.port = port
        return f"http://{host}:{port}"

    def serve(self, host: str, port: int, grace_s: float = GRACE_S, log=print) -> int | None:
        """Serve on host:port in this (the main) thread until SIGTERM or SIGINT, then shut down (serve/
        listener.py) and stop the engine; the signal that ended it."""
        self._listener = Listener(self.app, self.engine.stop, host, port, grace_s=grace_s, log=log)
        try:
            return self._listener.run()
        finally:
            self.engine.stop()

    def close(self) -> None:
        """Shut the HTTP server down (serve/listener.py) and stop the engine."""
        if self._listener is not None:
            self._listener.stop()
            if self._thread is not None:
                self._thread.join(self._listener.grace_s + 30)   # the drain, the engine's stop, the last answers
        self.engine.stop()


def tpot_slo(suite) -> float | None:
    """The TPOT the adaptive policy keeps: the requirements' p95 limit, else their p50, else the SLO."""
    from ..advise.presets import expand
    req = expand(suite.requirements)
    limits = req.max_tpot_s or {}
    return limits.get("p95") or limits.get("p50") or req.slo.tpot_s


def ttft_slo(suite) -> float | None:
    """The TTFT past which the adaptive policy admits before protecting TPOT: as tpot_slo, for TTFT."""
    from ..advise.presets import expand
    req = expand(suite.requirements)
    limits = req.max_ttft_s or {}
    return limits.get("p95") or limits.get("p50") or req.slo.ttft_s


def build_server(plan, options: ServeOptions = ServeOptions(), log=print) -> ServerHandle:
    """Everything but the HTTP listener (module doc)."""
    import dataclasses

    import torch
    if options.ttft_slo_s is None:
        options = dataclasses.replace(options, ttft_slo_s=ttft_slo(plan.suite))
    if options.devices:
        check_devices(options.devices)
    from ..variants import kernels
    for device in dict.fromkeys(options.devices or (options.device,)):
        kernels.prepare(log, device)   # built once here, before calibration times anything and workers load them
    if options.workers > 1 or options.engine_process:
        return _build_routed(plan, options, log)
    if options.threads:
        torch.set_num_threads(options.threads)
    names = served_names(plan, options)
    floor = has_accuracy_floor(plan)
    engines = build_engines([plan.variant(n) for n in dict.fromkeys([*names, *([plan.baseline] if floor else [])])],
                            plan.calibration_texts, options.device, log, plan.suite.trust_remote_code)
    accuracy = accuracy_floor(plan, engines, options.accuracy_samples)
    allowed = allowed_by_floor(names, accuracy, log)
    slo = options.tpot_slo_s if options.tpot_slo_s is not None else tpot_slo(plan.suite)
    engine, costs = assemble_engine(engines, allowed, options, slo, log)
    calibration = {n: c.to_json()["seconds"] for n, c in costs.items()}
    text = engines[allowed[0]]
    info = {"tpot_slo_s": slo, "accuracy_floor": accuracy}
    app = create_app(engine, text, api_key=options.api_key, limits=options.limits, info=info)
    engine.start()
    return ServerHandle(engine, app, text, accuracy, calibration, slo)


def served_names(plan, options: ServeOptions) -> list[str]:
    """The variants asked for (by default all of the suite's that our engine can host: not an endpoint),
    checked against the suite; single and static serve the first."""
    from ..measure.backend_kinds import backend_kind
    hosted = [v.name for v in plan.variants if backend_kind(v.definition.backend).serves]
    names = list(options.variants) or hosted
    unknown = [n for n in names if n not in {v.name for v in plan.variants}]
    if unknown:
        raise VariantlabError(f"no variant named {', '.join(map(repr, unknown))} in the suite", field="--variants",
                              accepted=", ".join(v.name for v in plan.variants))
    elsewhere = [n for n in names if n not in hosted]
    if elsewhere:
        raise VariantlabError(f"variant {elsewhere[0]!r} runs on backend: {plan.variant(elsewhere[0]).definition.backend}"
                              ", which `variantlab serve` cannot host", field="--variants",
                              accepted=", ".join(hosted) or "a suite with a backend: torch variant")
    if not names:
        raise VariantlabError("no variant of the suite runs on a backend `variantlab serve` can host",
                              field="--variants", accepted="a suite with a backend: torch variant")
    if not policy_kind(options.policy).routes:
        names = names[:1]
    return names


def has_accuracy_floor(plan) -> bool:
    from ..advise.presets import expand
    req = expand(plan.suite.requirements)
    return req.min_accuracy_retention is not None or req.min_task_accuracy is not None


def check_devices(devices) -> None:
    """Every device asked for exists here: a one-line VariantlabError naming --devices when not."""
    import torch
    for d in devices:
        if not d.startswith("cuda"):
            continue
        if not torch.cuda.is_available():
            raise VariantlabError(f"device {d!r} asked for, but this machine has no CUDA device (torch "
                                  f"{torch.__version__})", field="--devices", accepted="cpu")
        index = int(d.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise VariantlabError(f"device {d!r} asked for, but this machine has {torch.cuda.device_count()} "
                                  "CUDA device(s)", field="--devices",
                                  accepted="cpu, " + ", ".join(f"cuda:{i}" for i in range(torch.cuda.device_count())))


def _build_routed(plan, options: ServeOptions, log=print) -> ServerHandle:
    """workers > 1: the accuracy floor graded here, then the Router and its worker processes."""
    import dataclasses
    import gc

    import torch

    from .workers import Router, WorkerSpec, tokenizer_text
    names = served_names(plan, options)
    devices = options.devices or ("cpu",) * options.workers
    sets = options.worker_variants or (tuple(names),) * options.workers
    for i, s in enumerate(sets):
        unknown = [n for n in s if n not in names]
        if unknown or not s:
            raise VariantlabError(f"worker {i}'s variants {', '.join(map(repr, unknown)) or '(none)'} are not served",
                                  field="worker_variants", accepted=", ".join(names))
    accuracy = {}
    if has_accuracy_floor(plan):
        graded = build_engines([plan.variant(n) for n in dict.fromkeys([*names, plan.baseline])],
                               plan.calibration_texts, devices[0], log, plan.suite.trust_remote_code)
        accuracy = accuracy_floor(plan, graded, options.accuracy_samples)
        del graded                          # the workers build their own; none stays in this process
        gc.collect()
        if devices[0].startswith("cuda"):
            torch.cuda.empty_cache()
    allowed = allowed_by_floor(names, accuracy, log)
    slo = options.tpot_slo_s if options.tpot_slo_s is not None else tpot_slo(plan.suite)
    threads = worker_threads(devices, options.threads)
    specs = []
    for i, (device, s) in enumerate(zip(devices, sets)):
        held = [n for n in s if n in allowed]
        if not held:
            raise VariantlabError(f"worker {i} holds no variant that meets the accuracy floor", field="worker_variants",
                                  accepted=", ".join(allowed))
        worker_options = dataclasses.replace(options, device=device, threads=threads[i], workers=1, devices=(),
                                             worker_variants=(), variants=tuple(held))
        specs.append(WorkerSpec(i, tuple(plan.variant(n) for n in held), plan.calibration_texts, worker_options, slo,
                                plan.suite.trust_remote_code))
    router = Router(specs, max_queue=options.max_queue, log=log).start()
    text = tokenizer_text(plan.variant(allowed[0]).source, plan.suite.trust_remote_code)
    info = {"tpot_slo_s": slo, "accuracy_floor": accuracy,
            "workers": [{"worker": s.index, "device": s.options.device, "threads": s.options.threads,
                         "variants": list(s.options.variants)} for s in specs]}
    app = create_app(router, text, api_key=options.api_key, limits=options.limits, info=info)
    return ServerHandle(router, app, text, accuracy, router.calibration(), slo)


def worker_threads(devices, threads: int | None) -> list[int]:
    """Torch threads per worker: `threads` when given; else the CPU workers share this process's cores
    (at least one each) and a CUDA worker, whose host thread only launches kernels, takes one."""
    if threads:
        return [threads] * len(devices)
    from ..device_facts import available_cores
    n_cpu = sum(1 for d in devices if d == "cpu")
    share = max(1, available_cores() // max(1, n_cpu))
    return [share if d == "cpu" else 1 for d in devices]


def accuracy_floor(plan, engines: dict, n_samples: int) -> dict:
    """variant → {accuracy, retention, allowed, why}; {} when the suite sets no accuracy floor."""
    from ..advise.presets import expand
    from ..measure.tracker import WorkloadSettings
    from ..measure.trackers.grading import Grading
    req = expand(plan.suite.requirements)
    if req.min_accuracy_retention is None and req.min_task_accuracy is None:
        return {}
    w = plan.suite.workload
    grading = Grading(min(n_samples, len(plan.samples)), w.accuracy.batch_size,
                      WorkloadSettings(w.max_new_tokens, tuple(w.stop), {}))
    acc = {n: grading.run(_GradingHost(e, plan.samples)).accuracy for n, e in engines.items()}
    base = acc.get(plan.baseline)
    out = {}
    for n, a in acc.items():
        retention = a / base if base else None
        misses = []
        if req.min_task_accuracy is not None and (a or 0) < req.min_task_accuracy:
            misses.append(f"task accuracy {a:.3f} < {req.min_task_accuracy}")
        if req.min_accuracy_retention is not None:
            if retention is None:
                misses.append("the baseline answered nothing correctly, so retention is unknown")
            elif retention < req.min_accuracy_retention:
                misses.append(f"retention {retention:.3f} < {req.min_accuracy_retention}")
        why = "; ".join(misses) or (f"task accuracy {a:.3f}" + (f", retention {retention:.3f}" if retention is not None
                                                                 else "") + f" on {grading.samples} samples")
        out[n] = {"accuracy": a, "retention": retention, "allowed": not misses, "why": why}
    return out


@dataclass
class _GradingHost:
    backend: object
    samples: tuple

    def progress(self, stage: str, fraction: float) -> None:
        return None
