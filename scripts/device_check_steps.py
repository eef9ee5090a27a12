"""The device check's steps but serving: environment, the cuda tests, hw, the benches and explain. Each takes
the Check and the seconds it may use and returns a StepResult (scripts/device_check.py runs them in order)."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from device_check_run import DRIVER, ROOT, Check, StepResult, cli, python, run, status_of

PINS = {"torch": "2.13.0", "transformers": "5.23.0"}
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pydantic", "pydantic_core", "fastapi",
            "starlette", "uvicorn", "httptools", "uvloop", "httpx2", "plotly", "typer", "rich", "prometheus_client",
            "triton", "pytest")
# what our code calls that an older or newer torch may lack, and who calls it
TORCH_APIS = {
    "torch.ops.aten._weight_int4pack_mm": "int4 on CUDA (tinygemm)",
    "torch.ops.aten._convert_weight_to_int4pack": "int4 packing on CUDA",
    "torch.ops.aten._weight_int4pack_mm_for_cpu": "int4 on the CPU",
    "torch.ops.aten._convert_weight_to_int4pack_for_cpu": "int4 packing on the CPU",
    "torch.ops.aten._weight_int8pack_mm": "int8 on the CPU",
    "torch._int_mm": "w8a8, w4a8",
    "torch._cslt_compress": "sparse (cuSPARSELt)",
    "torch._cslt_sparse_mm": "sparse (cuSPARSELt)",
    "torch.backends.cusparselt.is_available": "sparse: is cuSPARSELt there",
    "torch.compiler.skip_guard_on_all_nn_modules_unsafe": "compile: true (guard_filter_fn)",
    "torch.library.register_fake": "our CPU kernels under torch.compile",
    "torch.cuda._sleep": "the cuda tests' synchronisation checks",
}
GIB = 2**30



# ---------------------------------------------------------------------------------------------- 1. environment

def probe() -> dict:
    """What this Python has: run in a subprocess (`--probe`), so that a broken import cannot stop the check."""
    import importlib
    import importlib.metadata as md
    import pkgutil

    info: dict = {"python": sys.version.split()[0], "packages": {}, "apis_missing": {}, "imports_failed": {}}
    for p in PACKAGES:
        try:
            info["packages"][p] = md.version(p.replace("_", "-"))
        except md.PackageNotFoundError:
            info["packages"][p] = None
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        info["torch_error"] = f"{type(e).__name__}: {e}"
        return info
    info["cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    info["cusparselt"] = torch.backends.cusparselt.version() if torch.backends.cusparselt.is_available() else None
    if info["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / GIB, 1),
                       "multiprocessors": p.multi_processor_count, "count": torch.cuda.device_count()}
    for name, who in TORCH_APIS.items():
        obj, ok = torch, True
        for part in name.split(".")[1:]:
            try:
                obj = getattr(obj, part)
            except (AttributeError, RuntimeError):
                ok = False
                break
        if not ok:
            info["apis_missing"][name] = who
    sys.path.insert(0, str(ROOT / "src"))
    import variantlab
    for m in pkgutil.walk_packages(variantlab.__path__, "variantlab."):
        if m.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(m.name)
        except Exception as e:  # noqa: BLE001
            info["imports_failed"][m.name] = f"{type(e).__name__}: {e}"
    info["variantlab"] = str(Path(variantlab.__file__).parent)
    return info


def step_environment(check: Check, limit: float) -> StepResult:
    r = StepResult("environment")
    ran = run(check, python(DRIVER, "--probe"), limit)
    r.seconds, r.status = ran.seconds, status_of(ran)
    try:
        info = json.loads(ran.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        r.status, r.tail = "failed", ran.tail()
        return r
    r.figures = info
    pk = info["packages"]
    smi = run(check, ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
                      "--format=csv,noheader"], 15) if info.get("cuda_available") else None
    info["nvidia_smi"] = smi.stdout.strip() if smi is not None and smi.ok else None
    gpu = info.get("gpu")
    differs = [f"{p} {pk.get(p)} (pinned {v})" for p, v in PINS.items() if (pk.get(p) or "").split("+")[0] != v]
    missing = [p for p in ("pydantic", "fastapi", "uvicorn", "httpx2", "plotly") if not pk.get(p)]
    r.summary = "; ".join(filter(None, [
        f"{gpu['name']} ({gpu['capability']}), {gpu['memory_gib']} GiB, CUDA {info['cuda']}" if gpu else
        f"no CUDA (torch {pk.get('torch')}, CUDA build: {info.get('cuda') or 'none'})",
        f"cuSPARSELt {info.get('cusparselt')}" if gpu else "",
        ", ".join(differs) and "differs from our pins: " + ", ".join(differs),
        missing and "missing: " + ", ".join(missing),
        info["apis_missing"] and f"{len(info['apis_missing'])} torch APIs missing",
        info["imports_failed"] and f"{len(info['imports_failed'])} modules fail to import"]))
    r.details += [f"- python {info['python']}; " + ", ".join(f"{p} {v or '—'}" for p, v in pk.items()),
                  f"- variantlab from {info.get('variantlab')}; carried wheels: {os.environ.get('DEVICE_CHECK_WHEELS', 'none')}",
                  f"- nvidia-smi: {info.get('nvidia_smi') or '—'}"]
    r.details += [f"- torch API missing: `{a}` ({who})" for a, who in info["apis_missing"].items()]
    r.details += [f"- import failed: `{m}`: {why}" for m, why in info["imports_failed"].items()]
    if info.get("torch_error") or info["apis_missing"] or info["imports_failed"]:
        r.status = "failed"
        r.tail = "\n".join(r.details[3:]) or info.get("torch_error", "")
    return r


# ---------------------------------------------------------------------------------------------- 2. tests

def step_cuda_tests(check: Check, limit: float) -> StepResult:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_cuda_*.py"))
    r, ran, counts = pytest_step(check, "cuda-tests", files, limit)
    if check.dry and ran.ok and counts.get("skipped") and not counts.get("passed"):
        r.status = "skipped: no CUDA"
        r.summary += " (collected and skipped here, as the CPU CI does)"
    if r.status != "passed" and not r.status.startswith("skipped"):
        r.tail = ran.tail(60)
    return r


def pytest_step(check: Check, name: str, files: list[str], limit: float, env: dict | None = None):
    """pytest over `files` in one process, as a step: (its StepResult, the run, the count of each outcome)."""
    r = StepResult(name)
    # addopts emptied: one process (the device may lack pytest-xdist), and the "-v" lines counted below
    ran = run(check, python("-m", "pytest", "-o", "addopts=", "-v", "-p", "no:cacheprovider", "-rfEs", "--durations=5",
                            *files), limit, env=env)
    r.seconds, r.status = ran.seconds, status_of(ran)
    # one line a test as it finishes ("tests/x.py::test_y[a] PASSED [ 3%]"): counted even if the run is cut off
    outcomes = dict(re.findall(r"^(tests/\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", ran.stdout, re.M))
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    r.figures = {"files": files, "counts": counts, "tests": outcomes}
    r.summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no test finished"
    r.details = [f"- `{line}`" for line in ran.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    r.details += [f"- slowest: `{line.strip()}`" for line in ran.stdout.splitlines()
                  if re.match(r"\s*[\d.]+s (call|setup|teardown) ", line)]
    return r, ran, counts


# ---------------------------------------------------------------------------------------------- 3. hw

def step_hw(check: Check, limit: float) -> StepResult:
    r = StepResult("hw")
    ran = run(check, cli("hw", "--json"), limit)
    r.seconds, r.status = ran.seconds, status_of(ran)
    if not ran.ok:
        r.tail = ran.tail()
        return r
    (check.out / "hw.json").write_text(ran.stdout)
    data = json.loads(ran.stdout)
    text = run(check, cli("hw"), max(5.0, limit - ran.seconds))   # the same, read from the cache, as users see it
    r.seconds += text.seconds
    device = "cuda:0" if data["facts"].get("gpus") else "cpu"
    c = data["ceilings"][device]
    configs = data["configuration"][device]
    r.figures = {"device": device, "ceilings": c, "configuration": {w: {x["name"]: x["value"] for x in cfg["choices"]}
                                                                    for w, cfg in configs.items()},
                 "kernel_times_failed": {kt["compute_dtype"]: kt["failed"]          # one per compute dtype timed
                                         for kt in data["kernel_times"].get(device) or ()}}
    mm = ", ".join(f"{d} {v:.1f}" if v else f"{d} —" for d, v in c["matmul_tflops"].items())
    picks = "; ".join(f"{w}: {cfg['recipe']}" for w, cfg in configs.items())
    r.summary = (f"{device}: copy {c['copy_gbps']:.0f} GB/s, matmul TFLOP/s {mm}, int8 "
                 f"{c['int8_tops'] or 0:.1f} TOP/s; auto picks {picks}")
    r.details = ["```", *text.stdout.rstrip().splitlines(), "```"] if text.ok else [f"(`hw` text: {status_of(text)})"]
    if not data["facts"].get("gpus") and not check.dry:
        r.status, r.tail = "failed", "`variantlab hw` saw no GPU"
    return r


# ---------------------------------------------------------------------------------------------- 4, 7. benches

LLAMA_115M = dict(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=12,
                  intermediate_size=2048, vocab_size=1024, max_position_embeddings=1024)   # benchmarks/engine_decode.py
LLAMA_DRY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=128, vocab_size=1024, max_position_embeddings=512)


def make_llama(folder: str, dry: bool) -> None:
    """A random-weight Llama (115M parameters; a 2-layer stand-in when dry) with the reference model's tokenizer."""
    sys.path.insert(0, str(ROOT / "src"))
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from variantlab.models.loading import BUILTIN_MODELS
    tok = AutoTokenizer.from_pretrained(BUILTIN_MODELS["tiny-structured"])
    torch.manual_seed(0)
    config = LlamaConfig(**(LLAMA_DRY if dry else LLAMA_115M), bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters())}))


def variant_lines(variants: list[dict]) -> str:
    return "\n".join("  - " + json.dumps(v) for v in variants)


def suite_yaml(name: str, model: str, baseline: str, variants: list[dict], rounds: int, device: str,
               max_new_tokens: int, stop: list[str], samples: int, graded: int | None, batch: int = 8) -> str:
    return f"""name: {name}
model: {json.dumps(model)}
baseline: {baseline}
rounds: {rounds}
device: {device}
timeout_s: 240
variants:
{variant_lines(variants)}
workload:
  dataset: {{generator: structured, n: 16, seed: 0}}
  max_new_tokens: {max_new_tokens}
  stop: {json.dumps(stop)}
  scenarios:
    - {{type: single-stream, requests: 6, warmup: 1, min_duration_s: 0}}
    - {{type: offline, batch_size: {batch}, passes: 1, warmup: 1}}
  accuracy: {{samples: {samples}, graded: {json.dumps(graded)}}}
output: {{dir: runs}}
"""


def llama_variants(dry: bool) -> list[dict]:
    if dry:
        return [{"name": "fp32", "recipe": "fp32"}, {"name": "bf16", "recipe": "bf16"}]
    return [{"name": "bf16", "recipe": "bf16"}, {"name": "fp16", "recipe": "fp16"},
            {"name": "int8", "recipe": "int8"}, {"name": "int4", "recipe": "int4", "options": {"group_size": 64}},
            {"name": "w8a8", "recipe": "w8a8"}, {"name": "w4a8", "recipe": "w4a8", "options": {"group_size": 64}},
            {"name": "sparse", "recipe": "sparse"}, {"name": "bf16-gqa4", "recipe": "bf16", "attention": "gqa:4"},
            {"name": "bf16-compiled", "recipe": "bf16", "compile": True}, {"name": "auto", "recipe": "auto"}]


def reference_variants(dry: bool) -> list[dict]:
    if dry:
        return [{"name": "fp32", "recipe": "fp32"}]
    return [{"name": "fp32", "recipe": "fp32"}, {"name": "bf16", "recipe": "bf16"},
            {"name": "int4", "recipe": "int4", "options": {"group_size": 64}}, {"name": "sparse", "recipe": "sparse"}]


def step_bench_llama(check: Check, limit: float) -> StepResult:
    r = StepResult("bench-llama")
    folder = check.work / ("llama-dry" if check.dry else "llama-115m")
    made = run(check, python(DRIVER, "--make-llama", folder, *(["--dry"] if check.dry else [])), min(120.0, limit))
    if not made.ok:
        r.seconds, r.status, r.tail = made.seconds, status_of(made), made.tail()
        return r
    params = json.loads(made.stdout.strip().splitlines()[-1])["parameters"]
    variants = llama_variants(check.dry)
    suite = suite_yaml("device-llama", str(folder), variants[0]["name"], variants, 1 if check.dry else 2,
                       check.device, 8 if check.dry else 32, [], 4, 0, 4 if check.dry else 8)
    r = bench(check, r, suite, limit - made.seconds, "bench-llama.json")
    r.seconds += made.seconds
    r.summary = f"{params / 1e6:.1f}M-parameter random Llama; " + r.summary
    return r


def step_bench_reference(check: Check, limit: float) -> StepResult:
    variants = reference_variants(check.dry)
    suite = suite_yaml("device-reference", "builtin:tiny-structured", "fp32", variants, 1 if check.dry else 2,
                       check.device, 24, ["\n"], 8, None)
    return bench(check, StepResult("bench-reference"), suite, limit, "bench-reference.json")


def bench(check: Check, r: StepResult, suite: str, limit: float, out_name: str) -> StepResult:
    folder = check.work / r.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.yaml").write_text(suite)
    store = folder / "store.sqlite"
    ran = run(check, cli("bench", folder / "suite.yaml", "--store", store, "-o", folder / "runs", "--json"),
              limit - 20, cwd=folder)
    r.seconds, r.status = ran.seconds, status_of(ran)
    found = re.search(r'"run_id": "([^"]+)"', ran.stdout) or re.search(r"run (\d{8}-\d{6}-[0-9a-f]+)", ran.stderr)
    shown = run(check, cli("show", found.group(1) if found else "", "--store", store, "--format", "json"), 20,
                cwd=folder) if store.exists() else None
    r.seconds += shown.seconds if shown else 0
    r.details = [f"- auto: {line.strip()}" for line in ran.stderr.splitlines() if "auto →" in line]
    if shown is None or not shown.ok:
        r.status, r.tail = ("failed" if r.status == "passed" else r.status), ran.tail(40)
        return r
    (check.out / out_name).write_text(shown.stdout)
    data = json.loads(shown.stdout)
    check.runs[r.name] = (store, data["run_id"])
    rows, figures = bench_table(data)
    worker_env = measured_environment(store, data["run_id"])
    r.figures = {"run_id": data["run_id"], "variants": figures, "environment": data.get("environment"),
                 "worker_environment": worker_env}
    r.details += rows + [f"- a measuring worker's environment: {json.dumps(worker_env)}"]
    ok = [v for v, f in figures.items() if f["status"] == "ok"]
    r.summary = f"{len(ok)} of {len(figures)} variants measured" + "".join(
        f"; {v}: {f['tok_s']:.0f} tok/s" for v, f in figures.items() if f.get("tok_s") is not None)
    if r.status == "failed" and ran.rc == 1:     # bench's "some variant did not finish": say which
        r.tail = "\n".join(f"{v}: {f['status']}: {f['reason']}" for v, f in figures.items() if f["status"] != "ok")
    elif r.status != "passed":
        r.tail = ran.tail(40)
    return r


BENCH_ROWS = (("tok_s", "single-stream.output_throughput", "tok/s single-stream", 1.0, "{:.1f}"),
              ("offline_tok_s", "offline.output_throughput", "tok/s offline (batch 8)", 1.0, "{:.1f}"),
              ("ttft_ms", "single-stream.ttft_p50", "TTFT p50 ms", 1e3, "{:.2f}"),
              ("tpot_ms", "single-stream.tpot_p50", "TPOT p50 ms", 1e3, "{:.2f}"),
              ("peak_mib", "memory.peak", "peak memory MiB", 1 / 2**20, "{:.0f}"),
              ("cold_start_s", "cold_start.total", "cold start s", 1.0, "{:.1f}"),
              ("size_mib", "facts.model_size", "size MiB", 1 / 2**20, "{:.1f}"),
              ("kld", "scoring.kld_mean", "KLD vs baseline", 1.0, "{:.2g}"),
              ("accuracy", "grading.accuracy_retention", "accuracy retention", 1.0, "{:.3f}"))


def measured_environment(store: Path, run_id: str) -> dict | None:
    """One good measurement's environment record (torch, device, GPU, capability, CUDA, driver): what the
    run's results.json leaves to the store. Read with sqlite3, so that the driver needs no variantlab."""
    import sqlite3
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            row = db.execute("SELECT record_json FROM records WHERE run_id=? AND kind='measure' AND status='ok' "
                             "ORDER BY id LIMIT 1", (run_id,)).fetchone()
        return json.loads(row[0]).get("environment") if row else None
    except (sqlite3.Error, ValueError):
        return None


def bench_table(data: dict) -> tuple[list[str], dict]:
    """A run's results (variantlab.results/1) → (Markdown table lines, variant → figures)."""
    c = data["comparison"]
    rows = {row["key"]: row for row in c["rows"]}
    figures = {v: {"status": c["status"].get(v), "reason": c["reasons"].get(v),
                   "kernels": (c["builds"].get(v) or {}).get("kernels")} for v in c["variants"]}
    shown = [spec for spec in BENCH_ROWS if spec[1] in rows]
    for v in c["variants"]:
        for name, key, _, scale, _ in shown:
            cell = rows[key]["cells"].get(v)
            figures[v][name] = None if not cell or cell.get("value") is None else cell["value"] * scale
    lines = ["", "| variant | status | " + " | ".join(s[2] for s in shown) + " |",
             "|---|---|" + "---|" * len(shown)]
    for v, f in figures.items():
        cells = ["—" if f[s[0]] is None else s[4].format(f[s[0]]) for s in shown]
        lines.append(f"| {v} | {f['status']} | " + " | ".join(cells) + " |")
    lines.append("")
    if "memory.peak" in rows:
        note = rows["memory.peak"].get("note") or ""
        lines.append(f"- peak memory read with: {note[note.find('(') + 1:].rstrip(')') or note or '—'}")
    for v, f in figures.items():
        if f["status"] != "ok":
            lines.append(f"- {v} {f['status']}: {f['reason']}")
        elif f["kernels"]:
            lines.append(f"- {v} ran: {', '.join(f['kernels'])}")
    env = data.get("environment") or {}
    lines.append(f"- the run's environment: {json.dumps({k: env.get(k) for k in ('cpu_model', 'cpu_count', 'python', 'packages', 'threads_per_worker', 'rounds')})}")
    return lines, figures


# ---------------------------------------------------------------------------------------------- 5. explain

def step_explain(check: Check, limit: float) -> StepResult:
    r = StepResult("explain")
    bench = next((x for x in check.results if x.name == "bench-llama"), None)
    measured = [v for v, f in (bench.figures.get("variants") or {}).items() if f["status"] == "ok"] if bench else []
    wanted = ["fp32", "bf16"] if check.dry else ["bf16", "int4"]
    pair = wanted if set(wanted) <= set(measured) else measured[:2]   # else the first two the run measured
    if "bench-llama" not in check.runs or len(pair) < 2:
        r.status = "not run: bench-llama measured no two variants"
        return r
    a, b = pair
    store, run_id = check.runs["bench-llama"]
    ran = run(check, cli("explain", run_id, a, b, "--rounds", "1", "--ops", "--store", store), limit,
              cwd=store.parent)
    r.seconds, r.status = ran.seconds, status_of(ran)
    if not ran.ok:
        r.tail = ran.tail(40)
        return r
    written = sorted(store.parent.glob(f"runs/{run_id}/explain/*/explanation.md"))
    if written:
        (check.out / "explain.md").write_text(written[-1].read_text())
    heads = [line.strip() for line in ran.stdout.splitlines() if re.match(r"\s*\S+ · (prefill|decode):", line)]
    r.figures = {"pair": [a, b], "headlines": heads, "device": check.device}
    r.summary = f"{b} against {a}: " + (heads[0] if heads else "no headline printed")
    r.details = [f"- {h}" for h in heads] + ["- the whole explanation: explain.md"]
    return r


# ---------------------------------------------------------------------------------------------- 8. cpu-kernels

KERNEL_TESTS = ("tests/variants/test_kernels.py", "tests/variants/test_decode_step.py",
                "tests/variants/test_decode_kernels.py")
# which of our kernel libraries this CPU builds, built (or loaded) here with the kernels switched on, as JSON
KERNEL_PROBE = """import json, time
from variantlab.device_facts import this_cpu
from variantlab.variants import kernels
from variantlab.variants.kernels import _build
t = time.perf_counter()
st = kernels.status()
print(json.dumps({"cpu": this_cpu()[0], "isa": _build.ISA.name if _build.ISA else None,
                  "avx512": sorted(f for f in _build.cpu_flags() if f.startswith("avx512")),
                  "available": st.available, "reason": st.reason, "seconds": time.perf_counter() - t}))"""


def step_cpu_kernels(check: Check, limit: float) -> StepResult:
    """Our CPU kernels' tests on this machine's own CPU, the kernels switched on for them alone: where a GPU
    machine's CPU has AVX-512, our AVX-512 kernels and their torch glue run natively, which the sessions' own
    machines (AVX2 alone, lately) cannot do; the emulated CPU of test_avx512_emulated.py runs only the kernels."""
    on = {"VARIANTLAB_KERNELS": "1"}
    probe_run = run(check, python("-c", KERNEL_PROBE), limit, env=on)      # the first build happens here
    if not probe_run.ok:
        return StepResult("cpu-kernels", status_of(probe_run), seconds=probe_run.seconds, tail=probe_run.tail())
    found = json.loads(probe_run.stdout.strip().splitlines()[-1])
    if not found["available"]:
        return StepResult("cpu-kernels", f"skipped: {found['reason']}", seconds=probe_run.seconds,
                          summary=found["cpu"], figures=found)
    files = list(KERNEL_TESTS if not check.dry else KERNEL_TESTS[:1])   # dry: CI runs all three anyway
    r, ran, _ = pytest_step(check, "cpu-kernels", files, limit - probe_run.seconds, env=on)
    r.seconds += probe_run.seconds
    r.figures |= {k: v for k, v in found.items() if k != "available"}
    r.summary = f"{found['isa']} kernels on {found['cpu']} (built or loaded in {found['seconds']:.0f} s): {r.summary}"
    if found["isa"] != "AVX-512":
        r.summary += "; no AVX-512 on this CPU, so its AVX2 kernels ran (as in CI)"
    if r.status != "passed":
        r.tail = ran.tail(60)
    return r
