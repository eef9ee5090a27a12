"""The two instruments' workers, alive at once and asked in turn: do `variantlab bench` and
benchmarks/decode_vs_llamacpp.py measure the same TPOT for the same variant? (issue 25: within 5%)

instruments_agree.py runs the two instruments one after the other, and on this host the memory's speed moves
between levels every 10-40 s (the 115M fp32 model decodes at about 10.5 or 15 ms a token, within one process),
faster than either instrument's run: its repetitions swing ±25% both ways, the script against itself as much.
Here the drift cancels instead. For each variant two workers are brought up and kept alive:

  bench   the bench's own measuring worker as far as its scenario: a `variantlab bench` run (one round, the
          instruments_agree.py suite: the script's prompt, 64 new tokens, no stop string) is made in this process
          with every worker job it sends kept; a worker then decodes that job (measure/wire.py), opens the variant
          with its backend kind as measure/worker.py does (threads, seed, the variantlab kernels, the artifact
          loaded from disk, the cold-start request), runs the job's trackers that come before its first
          scenario (the machine yardstick), and sends the scenario's own request (`requests_for`: the prompt as
          text, the workload's stop rules) through `run_requests`;
  script  decode_vs_llamacpp.py's worker for that side (_run_variantlab builds the variant from the checkpoint;
          _run_llama loads the script's GGUF), sending the prompt ids.

After one full warm-up request each, they are asked for one request at a time, the order rotating, --pairs
times; both TPOTs come from measure.metrics.tpot over the request's record. A process's own speed can sit off
the next one's for its whole life, by where its memory landed: two copies of one llama.cpp BF16 worker read 6%
apart over 20 rounds, and our int8 read 5-18% apart until the kernels' scratch rows were aligned to a cache line
(docs/engine.md). So this is done with --processes fresh sets of workers per variant. Printed per variant: each
side's median TPOT, the median of the per-round ratios bench / script over every set with their min and max and
a bootstrap 95% interval, whether it is within 5%, each set's own median ratio, and with --aa the script's
worker against a second copy of itself, the floor.

    python benchmarks/instrument_workers.py --workdir DIR [--shape 115m] [--pairs 20] [--processes 3]
        [--recipes fp32,int4,w4a8] [--precisions F32,Q4_0] [--aa]

--workdir: as for instruments_agree.py (the checkpoint and GGUFs of decode_vs_llamacpp.py --workdir). Never part
of the test suite.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from decode_vs_llamacpp import Worker, _run_llama, _run_variantlab, prompt_ids  # noqa: E402
from instruments_agree import _run, add_common, bootstrap_median_ci, build, prepare, suite  # noqa: E402

NEW_TOKENS = 64


def bench_jobs(suite_path: Path, artifacts: Path, store: Path) -> dict[str, bytes]:
    """Run `variantlab bench` on the suite in this process, keeping each worker job the executor sends: variant
    name -> the job's bytes (measure/wire.py)."""
    from variantlab.cli import app
    from variantlab.measure import executor

    kept: dict[str, bytes] = {}
    encode = executor.encode_job

    def keep(job):
        data = encode(job)
        kept.setdefault(job.variant.name, data)
        return data

    executor.encode_job = keep
    try:
        with tempfile.TemporaryDirectory(prefix="instrument-workers-run-") as output, \
                contextlib.redirect_stdout(io.StringIO()):      # its --json table: the jobs are what is wanted
            app(["bench", str(suite_path), "--store", str(store), "--artifacts", str(artifacts), "--output", output,
                 "--json"], standalone_mode=False)
    finally:
        executor.encode_job = encode
    return kept


def script_gguf(workdir: Path, model: Path, pair) -> Path:
    """The pair's GGUF as decode_vs_llamacpp.py --model MODEL --workdir WORKDIR measures it (made by one short run
    of it where missing), in the page cache as the script leaves it (read back from disk)."""
    from variantlab.variants.page_cache import as_read_from_disk

    path = workdir / f"model-{pair.gguf}.gguf"
    if not path.is_file():
        _run([sys.executable, str(HERE / "decode_vs_llamacpp.py"), "--model", str(model), "--workdir", str(workdir),
              "--pairs", "1", "--precisions", pair.gguf, "--recipes", pair.recipe], "decode_vs_llamacpp.py")
    as_read_from_disk(path)
    return path


def _bench_worker(conn, job_bytes: bytes) -> None:
    """Worker: the bench's measuring worker (measure/worker.py run_measure) up to its first scenario, then the
    scenario's request, on demand."""
    from variantlab.backends.base import run_requests
    from variantlab.measure.backend_kinds import backend_kind
    from variantlab.measure.process import process_start_time
    from variantlab.measure.scenarios.common import Scenario, requests_for
    from variantlab.measure.trackers import tracker_from_config
    from variantlab.measure.wire import decode_job
    from variantlab.measure.worker import Host

    job = decode_job(job_bytes)
    with contextlib.redirect_stdout(io.StringIO()):       # its progress lines, for the bench's parent
        opened = backend_kind(job.variant.backend).open(job, process_start_time())
    host = Host(opened.backend, opened.built, job.samples, opened.device, opened.cold, opened.baseline_bytes)
    with opened.context():
        scenario = None
        for tj in job.trackers:
            tracker = tracker_from_config(tj.kind, tj.config)
            if isinstance(tracker, Scenario):
                scenario = tracker
                break
            host.outputs[tracker.name] = tracker.run(host)
        if scenario is None:
            raise SystemExit(f"{job.variant.name}: its job has no scenario")
        conn.send({"trackers before the scenario": list(host.outputs)})
        while conn.recv() is not None:     # the script's (ids, n): the scenario sends its own request instead
            conn.send(run_requests(opened.backend, requests_for(job.samples, 1, scenario.workload))[0])
    opened.close()


def compare(workers: dict[str, Worker], ids: list[int], pairs: int) -> dict[str, list[float]]:
    """One warm-up each, then `pairs` rounds of one request from every worker, the order rotating; TPOT per
    worker (Worker.run checks each request made NEW_TOKENS tokens)."""
    from variantlab.measure.metrics import tpot

    for w in workers.values():
        w.run(ids, NEW_TOKENS)
    names = list(workers)
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(pairs):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            out[n].extend(tpot([workers[n].run(ids, NEW_TOKENS)]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common(ap)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--processes", type=int, default=3,
                    help="fresh sets of workers per variant: a process's own speed can differ from the next one's "
                         "for its whole life (llama.cpp's by up to 6%% here), so one set could read a lucky or "
                         "unlucky process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--aa", action="store_true", help="also a second script worker: script again / script")
    args = ap.parse_args()
    if args.pairs < 2 or args.processes < 1:
        raise SystemExit("--pairs: at least 2; --processes: at least 1")
    model, pairs, prompt = prepare(args)
    ids = prompt_ids(model, 64, 0)
    rows: list[tuple[str, list[float], list[float], list[float] | None, list[float]]] = []
    done: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="instrument-workers-") as art:
        for pair in pairs:
            path = args.workdir / f"instruments-{pair.gguf.lower()}-{pair.recipe}.yaml"
            path.write_text(yaml.safe_dump(suite(model, pair, prompt, 3)))
            artifacts = Path(art) / path.stem
            print(f"  building and benching {pair.label} once, keeping its worker jobs", file=sys.stderr, flush=True)
            build(path, artifacts)
            jobs = bench_jobs(path, artifacts, Path(art) / "store.sqlite")
            peer = f"gguf-{pair.gguf.lower()}"
            gguf = script_gguf(args.workdir, model, pair)
            for name in (pair.recipe, peer):
                if name in done:
                    continue
                done.add(name)
                script = ((_run_llama, str(gguf), str(model), args.threads) if name == peer else
                          (_run_variantlab, str(model), pair.recipe, dict(pair.options), args.threads, "default"))
                got: dict[str, list[float]] = {}
                per_process: list[float] = []
                if name not in jobs:
                    raise SystemExit(f"variantlab bench sent no worker job for {name}: its run failed before "
                                     f"measuring it (run the bench on {path} to see why)")
                for n_set in range(args.processes):
                    workers = {"bench": Worker(f"bench {name}", _bench_worker, jobs[name]),
                               "script": Worker(f"script {name}", *script)}
                    if args.aa:
                        workers["script again"] = Worker(f"script again {name}", *script)
                    try:
                        print(f"  {name}: {', '.join(workers)} alive ({n_set + 1}/{args.processes}); {args.pairs} rounds",
                              file=sys.stderr, flush=True)
                        these = compare(workers, ids, args.pairs)
                    finally:
                        for w in workers.values():
                            w.close()
                    per_process.append(statistics.median(x / y for x, y in zip(these["bench"], these["script"])))
                    for side, xs in these.items():
                        got.setdefault(side, []).extend(xs)
                rows.append((name, got["bench"], got["script"], got.get("script again"), per_process))
    print(f"{args.shape}: each variant's bench worker and script worker alive at once, {args.pairs} rounds of one "
          f"request each (order rotating), in {args.processes} fresh sets of workers; prompt 64 tokens, {NEW_TOKENS} "
          f"new; TPOT medians, ms; ratio per round, pooled; then each set's median ratio")
    print(f"{'variant':12} {'bench':>8} {'script':>8} {'bench/script [min, max]':>24} {'95% interval':>15}  within 5%"
          + ("   script again/script [95%]" if args.aa else ""))
    for name, b, s, again, per_process in rows:
        rs = [x / y for x, y in zip(b, s)]
        lo, hi = bootstrap_median_ci(rs)
        r = statistics.median(rs)
        line = (f"{name:12} {1e3 * statistics.median(b):8.2f} {1e3 * statistics.median(s):8.2f} {r:>8.3f} "
                f"[{min(rs):.3f}, {max(rs):.3f}]   [{lo:.3f}, {hi:.3f}]  {'yes' if abs(r - 1) <= 0.05 else 'NO'}")
        if again:
            aa = [x / y for x, y in zip(again, s)]
            alo, ahi = bootstrap_median_ci(aa)
            line += f"   {statistics.median(aa):.3f} [{alo:.3f}, {ahi:.3f}]"
        print(line + f"   per set: {' '.join(f'{x:.3f}' for x in per_process)}")


if __name__ == "__main__":
    main()
