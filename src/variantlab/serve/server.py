"""A server assembled from a suite: its variants built through the library call, held to the suite's
accuracy floor, measured for the adaptive policy, behind the HTTP API.

`build_server(plan, options)` is what `variantlab serve` runs, and what the bench's server scenario and
benchmarks/serve_policies.py run in-process:
1. build each chosen variant (`variants.build`, the same call bench and explain use);
2. the accuracy floor: when the suite's requirements (their preset expanded) set
   min_accuracy_retention or min_task_accuracy, grade every variant and the baseline on the suite's
   samples by exact match (the Grading tracker) and drop those that miss it — the policy never sees
   them, and the server says which and why;
3. one Lane per variant; for `adaptive`, each lane's decode-step time per batch size measured here
   (serve/calibrate.py) and the TPOT SLO from the suite (max_tpot_s p95, else slo.tpot_s);
4. the engine and the FastAPI app.
`ServerHandle.start_http()` runs uvicorn on a thread (loopback, a free port by default): the tests and
benchmarks talk to a real server over real HTTP.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from ..errors import VariantlabError
from .app import ServerLimits, create_app
from .engine import ServeEngine
from .lane import Lane
from .policies import POLICIES, AdaptivePolicy, SinglePolicy, StaticPolicy


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

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise VariantlabError(f"unknown policy {self.policy!r}", field="--policy", accepted=" | ".join(POLICIES))


@dataclass
class ServerHandle:
    engine: ServeEngine
    app: object
    text: object                            # the shared TorchEngine (tokenizer)
    accuracy: dict = field(default_factory=dict)      # variant → {accuracy, retention, allowed, why}
    calibration: dict = field(default_factory=dict)   # variant → step seconds by batch size
    tpot_slo_s: float | None = None
    _server: object = None
    _thread: threading.Thread | None = None
    port: int | None = None

    def start_http(self, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> str:
        """Serve on host:port (0: a free port) from a background thread; the base URL once it answers."""
        import uvicorn
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="variantlab-http", daemon=True)
        self._thread.start()
        deadline = time.time() + 30
        while not self._server.started:
            if time.time() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the HTTP server did not start on {host}:{port}")
            time.sleep(0.02)
        self.port = port
        return f"http://{host}:{port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(10)
        self.engine.stop()


def tpot_slo(suite) -> float | None:
    """The TPOT the adaptive policy keeps: the requirements' p95 limit, else their p50, else the SLO."""
    from ..advise.presets import expand
    req = expand(suite.requirements)
    limits = req.max_tpot_s or {}
    return limits.get("p95") or limits.get("p50") or req.slo.tpot_s


def build_server(plan, options: ServeOptions = ServeOptions(), log=print) -> ServerHandle:
    """Everything but the HTTP listener (module doc)."""
    import torch

    from ..backends.torch_engine import TorchEngine
    from ..variants import build as variants
    if options.threads:
        torch.set_num_threads(options.threads)
    names = list(options.variants) or [v.name for v in plan.variants]
    unknown = [n for n in names if n not in {v.name for v in plan.variants}]
    if unknown:
        raise VariantlabError(f"no variant named {', '.join(map(repr, unknown))} in the suite", field="--variants",
                              accepted=", ".join(v.name for v in plan.variants))
    if options.policy != "adaptive":
        names = names[:1]
    from ..advise.presets import expand
    req = expand(plan.suite.requirements)
    floor = req.min_accuracy_retention is not None or req.min_task_accuracy is not None
    engines = {}
    for name in dict.fromkeys([*names, *([plan.baseline] if floor else [])]):
        pv = plan.variant(name)
        built = variants.build(str(pv.source), pv.definition, options.device,
                               calibration_texts=plan.calibration_texts)
        engines[name] = TorchEngine(built.model, built.tokenizer, options.device)
        log(f"built {name}: {built.facts.recipe}, {', '.join(built.facts.kernels[:2])}")
    accuracy = accuracy_floor(plan, engines, options.accuracy_samples)
    for name, a in accuracy.items():
        log(f"accuracy floor: {name} {'serves' if a['allowed'] else 'is not served'}: {a['why']}")
    allowed = [n for n in names if accuracy.get(n, {}).get("allowed", True)]
    if not allowed:
        raise VariantlabError("no variant meets the suite's accuracy floor: "
                              + "; ".join(f"{n}: {accuracy[n]['why']}" for n in names), field="requirements",
                              accepted="a lower floor, or variants that keep the task")
    lanes = {}
    for n in allowed:
        try:
            lanes[n] = Lane(n, engines[n], max_rows=options.max_batch, max_len=options.context,
                            chunk=options.prefill_chunk)
        except ValueError as e:
            raise VariantlabError(str(e), field="--variants", accepted="variants with the model's own or gqa "
                                  "attention") from None
    slo = options.tpot_slo_s if options.tpot_slo_s is not None else tpot_slo(plan.suite)
    calibration = {}
    first = allowed[0]
    if options.policy == "single":
        policy = SinglePolicy(first)
    elif options.policy == "static":
        policy = StaticPolicy(first, options.batch_size, options.max_wait_s)
    else:
        from .calibrate import step_cost
        costs = {n: step_cost(lane) for n, lane in lanes.items()}
        calibration = {n: c.to_json()["seconds"] for n, c in costs.items()}
        for n, c in costs.items():
            log(f"measured {n}: decode step " + ", ".join(f"{b}: {1e3 * s:.2f} ms" for b, s in sorted(c.seconds.items())))
        policy = AdaptivePolicy(costs, tpot_slo_s=slo, max_rows=options.max_batch)
    engine = ServeEngine(lanes, policy, max_queue=options.max_queue)
    text = engines[first]
    info = {"tpot_slo_s": slo, "accuracy_floor": accuracy}
    app = create_app(engine, text, api_key=options.api_key, limits=options.limits, info=info)
    engine.start()
    return ServerHandle(engine, app, text, accuracy, calibration, slo)


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
