"""The three serving policies under the same Poisson load sweep: goodput at the SLO and the highest rate
each sustains, as ratios to `single`; then the adaptive server at twice its sustainable rate.

For each model (the shipped reference model; a random-weight 115M Llama, benchmarks/engine_decode.py's):
1. three real servers, `variantlab serve` in subprocesses on loopback, one per policy:
     single     bf16, one request at a time
     static     bf16, batches of --static-batch, waiting up to 20 ms for one
     adaptive   bf16, int8 and int4 (weight-only; int4 group 32), continuous batching; it measures each
                variant's decode step at start and switches between them with load, holding the TPOT SLO
2. for each rate of the sweep, --rounds rounds; in each round the three policies in a rotated order
   (A B C, B C A, …), each one phase of --duration s of Poisson arrivals after 1 s of warm-up, from
   this process over HTTP (backends/openai_http.py: client-side times, usage token counts). The
   requests cycle through the suite's dataset (the structured samples; their answers are one line,
   stop "\\n", at most 24 new tokens on the reference model; the random model gets 32 tokens and no
   stop, since its text is noise).
3. per policy and rate: goodput (requests/s meeting every SLO), SLO attainment and p95 TTFT and TPOT,
   pooled over rounds; per round, goodput ÷ single's in the same round (the ratio's median and range);
   the max sustainable rate: the highest rate whose pooled attainment reaches 95%.
4. overload: the adaptive server (queue bound --max-queue) at twice its sustainable rate for
   --overload s: the share answered 429, whether every accepted request was answered, and the server
   process's peak resident memory (VmHWM).

    python benchmarks/serve_policies.py [--models reference,llama115m] [--rates 10,20,40]
        [--duration 10] [--rounds 2] [--overload 60] [--threads 2]

Nothing here is asserted; the load average is printed. Client and servers share this machine's cores.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from variantlab.backends.openai_http import Endpoint, OpenAIBackend  # noqa: E402
from variantlab.measure import metrics as m  # noqa: E402
from variantlab.measure.scenarios.server import Server, ServerSpec  # noqa: E402
from variantlab.measure.tracker import WorkloadSettings  # noqa: E402

POLICIES = ("single", "static", "adaptive")
MODELS = {
    # SLOs a user of each would set: the reference model answers in ~4 tokens, ~15 ms alone; the 115M
    # Llama decodes a token in ~10 ms alone (both on this 2-core machine)
    "reference": {"slo": {"ttft_s": 0.1, "tpot_s": 0.025}, "max_new_tokens": 24, "stop": ["\n"],
                  "rates": [10, 20, 40, 60, 80, 100, 120, 160], "duration": 5,
                  "requirements": {"min_accuracy_retention": 0.97}},
    "llama115m": {"slo": {"ttft_s": 0.5, "tpot_s": 0.1}, "max_new_tokens": 32, "stop": [], "requirements": {},
                  "rates": [0.25, 0.5, 1, 1.5, 2, 3], "duration": 20},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def suite_file(folder: Path, model: str) -> Path:
    spec = MODELS[model]
    if model == "reference":
        source = "builtin:tiny-structured"
    else:
        from engine_decode import make_checkpoint
        source = str(make_checkpoint(folder / "llama115m"))
    suite = {"name": f"serve-{model}", "model": source, "baseline": "bf16",
             "variants": [{"name": "bf16", "recipe": "bf16"}, {"name": "int8", "recipe": "int8"},
                          {"name": "int4", "recipe": "int4", "options": {"group_size": 32}}],
             "workload": {"dataset": {"generator": "structured", "n": 64, "seed": 0},
                          "max_new_tokens": spec["max_new_tokens"], "stop": spec["stop"]},
             "requirements": {**spec["requirements"], "slo": spec["slo"],
                              "max_tpot_s": {"p95": spec["slo"]["tpot_s"]}}}
    path = folder / f"{model}.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


class ServerProcess:
    def __init__(self, suite: Path, policy: str, threads: int, max_queue: int, static_batch: int, log: Path):
        self.policy, self.port = policy, free_port()
        variants = "bf16,int8,int4" if policy == "adaptive" else "bf16"
        cmd = [sys.executable, "-m", "variantlab.cli", "serve", str(suite), "--policy", policy, "--variants",
               variants, "--port", str(self.port), "--threads", str(threads), "--max-queue", str(max_queue),
               "--batch-size", str(static_batch)]
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def wait(self, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.policy} server exited: see {self.log.name}")
            try:
                urllib.request.urlopen(self.url.removesuffix("/v1") + "/health", timeout=1).read()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the {self.policy} server did not come up in {timeout} s")

    def peak_rss_mib(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


class Host:
    def __init__(self, backend, samples):
        self.backend, self.samples, self.shapes, self.outputs = backend, samples, [], {}

    def progress(self, stage, fraction):
        pass


def phase(url: str, samples, settings: WorkloadSettings, rate: float, duration: float, warmup: float = 1.0):
    """One Poisson phase against a server: its records (after `warmup` s of unrecorded arrivals)."""
    backend = OpenAIBackend(Endpoint(url))
    try:
        spec = ServerSpec(type="server", rate=rate, duration_s=duration, warmup_s=warmup, drain_s=120)
        out = Server(spec, settings).run(Host(backend, samples))
    finally:
        backend.close()
    p = out.passes[0]
    return p.records, p.end - p.start


def summary(records, wall: float, slo: m.SLO) -> dict:
    tt, tp = m.ttft(records), m.tpot(records)
    return {"goodput": m.goodput(records, wall, slo) or 0.0, "attainment": m.slo_attainment(records, slo) or 0.0,
            "ttft_p95": m.stats.percentile(tt, 95) if tt else None,
            "tpot_p95": m.stats.percentile(tp, 95) if tp else None,
            "refused": sum(1 for r in records if r.error and "429" in r.error), "n": len(records)}


def fmt_ms(x) -> str:
    return "—" if x is None else f"{1e3 * x:.1f}"


def run_model(model: str, args, folder: Path) -> None:
    from variantlab.measure.plan import plan_suite_file
    suite = suite_file(folder, model)
    plan = plan_suite_file(suite)
    spec = MODELS[model]
    slo = m.SLO(**spec["slo"])
    args = argparse.Namespace(**{**vars(args), "rates": args.rates or spec["rates"],
                                 "duration": args.duration or spec["duration"]})
    settings = WorkloadSettings(spec["max_new_tokens"], tuple(spec["stop"]), spec["slo"])
    print(f"\n== {model}: SLO TTFT ≤ {slo.ttft_s * 1e3:g} ms, TPOT ≤ {slo.tpot_s * 1e3:g} ms; "
          f"{spec['max_new_tokens']} new tokens at most; rates {args.rates} req/s, {args.duration:g} s a phase, "
          f"{args.rounds} rounds, policies rotated", flush=True)
    servers = {}
    try:
        for p in POLICIES:     # one at a time: a server measures its decode steps at start, on a quiet machine
            servers[p] = ServerProcess(suite, p, args.threads, args.max_queue, args.static_batch,
                                       folder / f"{model}-{p}.log")
            servers[p].wait()
        for line in (folder / f"{model}-adaptive.log").read_text().splitlines():
            if "measured" in line or line.startswith(("accuracy floor", "serving")):
                print("  adaptive server: " + line.strip())
        pooled = {(p, r): [] for p in POLICIES for r in args.rates}
        walls = {(p, r): 0.0 for p in POLICIES for r in args.rates}
        ratios = {(p, r): [] for p in POLICIES for r in args.rates}
        for rate in args.rates:
            for rnd in range(args.rounds):
                order = POLICIES[rnd % 3:] + POLICIES[:rnd % 3]
                good = {}
                for p in order:
                    recs, wall = phase(servers[p].url, plan.samples, settings, rate, args.duration)
                    pooled[(p, rate)] += recs
                    walls[(p, rate)] += wall
                    good[p] = m.goodput(recs, wall, slo) or 0.0
                for p in POLICIES:
                    ratios[(p, rate)].append(good[p] / good["single"] if good["single"] > 0 else float("inf"))
            row = {p: summary(pooled[(p, rate)], walls[(p, rate)], slo) for p in POLICIES}
            cells = "  ".join(f"{p} {row[p]['goodput']:6.2f} req/s ({100 * row[p]['attainment']:3.0f}%, "
                              f"p95 TTFT {fmt_ms(row[p]['ttft_p95'])} ms, TPOT {fmt_ms(row[p]['tpot_p95'])} ms, "
                              f"{100 * row[p]['refused'] / max(1, row[p]['n']):.0f}% 429)" for p in POLICIES)
            print(f"  rate {rate:g} req/s: {cells}", flush=True)
            for p in ("static", "adaptive"):
                rs = ratios[(p, rate)]
                print(f"      {p} ÷ single goodput: median {statistics.median(rs):.2f} [{min(rs):.2f}, {max(rs):.2f}]")
        sustained = {p: max((r for r in args.rates if summary(pooled[(p, r)], walls[(p, r)], slo)["attainment"]
                             >= 0.95), default=0.0) for p in POLICIES}
        best = {p: max(summary(pooled[(p, r)], walls[(p, r)], slo)["goodput"] for r in args.rates) for p in POLICIES}
        print(f"  best goodput over the sweep: " + ", ".join(
            f"{p} {best[p]:.2f} req/s ({best[p] / best['single']:.2f}× single)" if best["single"] else
            f"{p} {best[p]:.2f} req/s" for p in POLICIES))
        print(f"  max sustainable rate (attainment ≥ 95%): " + ", ".join(
            f"{p} {sustained[p]:g} req/s" + (f" ({sustained[p] / sustained['single']:.2f}× single)"
                                              if sustained["single"] else "") for p in POLICIES))
        above = all(summary(pooled[("adaptive", r)], walls[("adaptive", r)], slo)["goodput"] >
                    summary(pooled[("static", r)], walls[("static", r)], slo)["goodput"] for r in args.rates)
        print(f"  adaptive above static in goodput at every rate: {'yes' if above else 'no'}")
        if args.overload > 0:
            rate = 2 * (sustained["adaptive"] or args.rates[0])
            adaptive = servers["adaptive"]
            recs, wall = phase(adaptive.url, plan.samples, settings, rate, args.overload, warmup=0)
            refused = [r for r in recs if r.error and "429" in r.error]
            accepted = [r for r in recs if r not in refused]
            lost = [r for r in accepted if not r.ok]
            print(f"  overload: adaptive at {rate:g} req/s (2× its sustainable rate) for {args.overload:g} s: "
                  f"{len(recs)} sent, {100 * len(refused) / max(1, len(recs)):.1f}% answered 429, "
                  f"{len(accepted)} accepted, {len(lost)} of them lost"
                  + (f" ({lost[0].error})" if lost else "")
                  + f"; server peak memory {adaptive.peak_rss_mib():.0f} MiB (VmHWM)", flush=True)
    finally:
        for s in servers.values():
            s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="reference,llama115m")
    ap.add_argument("--rates", default=None, type=lambda s: [float(x) for x in s.split(",")],
                    help="req/s (default: per model: 10…160 for the reference model, 0.25…3 for the 115M)")
    ap.add_argument("--duration", type=float, default=None, help="seconds a phase (default: 5 for the reference "
                    "model, 20 for the 115M, whose requests take a second or more)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--overload", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--static-batch", type=int, default=8)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; servers use {args.threads} torch "
          "threads each; this process sends the load")
    with tempfile.TemporaryDirectory() as d:
        for model in args.models.split(","):
            run_model(model, args, Path(d))


if __name__ == "__main__":
    main()
