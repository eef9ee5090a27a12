"""End to end: `variantlab bench` on the shipped reference model, in interleaved rounds of fresh processes."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import variantlab
from variantlab.models.loading import BUILTIN_MODELS
from variantlab.store import Store

from conftest import nan_model_copy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TINY_WORKLOAD = {
    "dataset": {"generator": "structured", "n": 6, "seed": 0},
    "max_new_tokens": 6,
    "scenarios": [{"type": "single-stream", "requests": 3, "warmup": 1},
                  {"type": "offline", "batch_size": 4, "passes": 2, "warmup": 1}],
    "accuracy": {"samples": 3},
}


def _write_suite(tmp_path: Path, variants: list[dict], **extra) -> Path:
    suite = {"name": "t", "model": "builtin:tiny-structured", "variants": variants, "workload": TINY_WORKLOAD,
             "threads": 1, "rounds": 1,
             "output": {"dir": str(tmp_path / "runs"), "store": str(tmp_path / "store.sqlite")}}
    suite.update(extra)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def _cli(*args, timeout=600, **kw):
    env = os.environ | {"COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "variantlab.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, **kw)


def test_each_variant_is_measured_in_every_round_in_rotated_order(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"},
                                    {"name": "q8", "recipe": "int8"}], rounds=2, order="rotate")
    result = variantlab.bench(suite)
    c = result.comparison
    assert c.status == {"base": "ok", "half": "ok", "q8": "ok"}, c.reasons
    with Store(result.store_path) as store:
        builds = store.records(result.run_id, "build")
        measured = store.records(result.run_id, "measure")
        assert store.run(result.run_id).status == "done"
    assert [b.variant for b in builds] == ["base", "half", "q8"] and all(b.status == "ok" for b in builds)
    assert [(m.variant, m.round) for m in measured] == [("base", 0), ("half", 0), ("q8", 0),
                                                        ("half", 1), ("q8", 1), ("base", 1)]
    assert [m.ran_once for m in measured] == [True, True, True, False, False, False]
    assert c.rounds["half"] == {"ok": 2, "failed": 0}
    tpot = c.row("single-stream.tpot_p50")
    assert tpot.cells["half"].rounds == 2 and tpot.deltas["half"].method.startswith("paired over 2 rounds")
    # every variant loads from its own artifact (dtype variants too), so model size is what it stores
    assert c.row("model_size").cells["half"].value < 0.6 * c.row("model_size").cells["base"].value
    assert "round" in (result.output_dir / "report.md").read_text()


@pytest.fixture(scope="module")
def broken_model_dir(tmp_path_factory) -> Path:
    """A directory that passes the cheap checks (config names a causal LM, safetensors intact) but
    whose weights do not fit its config, so loading fails inside the worker."""
    d = tmp_path_factory.mktemp("broken")
    for f in BUILTIN_MODELS["tiny-structured"].iterdir():
        shutil.copy(f, d / f.name)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] *= 2     # planning checks the embedding's shape and the layer count, not the MLP
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_a_failing_variant_is_recorded_with_its_reason_and_the_others_go_on(tmp_path, broken_model_dir):
    """…through the CLI, which then exits 1 (0: all measured; 1: some variant failed; 2: bad input)."""
    suite = _write_suite(tmp_path, [{"name": "base"}, {"name": "broken", "model": str(broken_model_dir)}])
    proc = _cli("bench", suite, "--json")
    assert proc.returncode == 1, proc.stderr
    assert "1 of 2 variants did not finish: broken (failed); exit status 1" in proc.stderr
    c = json.loads(proc.stdout)["comparison"]
    assert c["status"] == {"base": "ok", "broken": "failed"}
    assert "do not match" in c["reasons"]["broken"] or "shape" in c["reasons"]["broken"], c["reasons"]["broken"]
    assert {r["key"]: r for r in c["rows"]}["single-stream.tpot_p50"]["cells"]["base"]["value"] > 0


def test_cli_prints_the_headline_table_within_100_columns_and_show_reprints_it(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"}], baseline="base")
    full = _cli("bench", suite, "--all")          # one bench (CI's time): every row; `show` prints the headline
    assert full.returncode == 0, full.stderr
    assert "E2EL p90" in full.stdout and "ITL p50" in full.stdout
    store = tmp_path / "store.sqlite"
    runs = _cli("runs", "--store", store)
    assert runs.returncode == 0 and "base (ok)" in runs.stdout
    run_id = sorted(p.name for p in (tmp_path / "runs").iterdir())[0]
    out = _cli("show", run_id, "--store", store)
    assert out.returncode == 0, out.stderr
    table = out.stdout.split("rounds measured")[0]
    assert max(len(line) for line in table.splitlines()) <= 100
    for label in ("Accuracy retention", "KLD mean", "Single-task latency", "TTFT p50", "TPOT p50",
                  "Output throughput", "Peak memory", "Cold start", "Model size"):
        assert label in out.stdout, label
    assert "E2EL p90" not in out.stdout and "base (baseline)" in out.stdout
    show = _cli("show", run_id, "--store", store, "--markdown")
    assert show.returncode == 0, show.stderr
    assert show.stdout.startswith("| Metric | base (baseline) | half | Delta |")


@pytest.fixture(scope="module")
def other_tokenizer_model_dir(tmp_path_factory) -> Path:
    """The reference weights behind a different (byte-level BPE) tokenizer of no larger a vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("othertok")
    for f in BUILTIN_MODELS["tiny-structured"].iterdir():
        if f.name.endswith(".safetensors") or f.name in ("config.json", "generation_config.json"):
            shutil.copy(f, d / f.name)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(d)
    return d


def test_variants_with_different_tokenizers_compare_by_bits_per_byte(tmp_path, other_tokenizer_model_dir):
    suite = _write_suite(tmp_path, [{"name": "ref"}, {"name": "other", "model": str(other_tokenizer_model_dir)}])
    c = variantlab.bench(suite).comparison
    assert c.status == {"ref": "ok", "other": "ok"}, c.reasons
    for key in ("kld_mean", "top1_agreement", "ppl_ratio"):
        cell = c.row(key).cells["other"]
        assert cell.value is None and "not comparable" in cell.problem
    assert c.row("bits_per_byte").cells["other"].value > 0
    assert c.row("task_accuracy").cells["other"] is not None


def test_attention_variants_compose_with_recipes_and_report_kv_cache(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "base"},
                                    {"name": "gqa2", "attention": "gqa:2"},
                                    {"name": "lin-int8", "recipe": "int8", "attention": "linear"}])
    c = variantlab.bench(suite).comparison
    assert c.status == {"base": "ok", "gqa2": "ok", "lin-int8": "ok"}, c.reasons
    per_token = c.row("kv_cache_per_token").cells
    heads = json.loads((BUILTIN_MODELS["tiny-structured"] / "config.json").read_text())["num_attention_heads"]
    assert per_token["gqa2"].value == per_token["base"].value * 2 / heads
    assert per_token["lin-int8"].value == 0  # linear attention keeps a constant-size state instead
    assert c.row("kv_cache_2048").cells["lin-int8"].value > 0
    assert c.builds["lin-int8"]["attention"] == "linear" and c.builds["lin-int8"]["build_s"] > 0
    assert any("_weight_int8pack_mm" in k for k in c.builds["lin-int8"]["kernels"])


def test_length_sweep_rows_and_an_unstable_attention_is_flagged(tmp_path):
    workload = TINY_WORKLOAD | {"scenarios": [{"type": "length-sweep", "lengths": [32, 2048], "decode_tokens": 3,
                                               "repeats": 1, "warmup": 0}]}
    suite = _write_suite(tmp_path, [{"name": "base"},
                                    {"name": "lin16", "recipe": "fp16", "attention": "linear",
                                     "attention_options": {"linear_state_dtype": "model"}}], workload=workload)
    c = variantlab.bench(suite).comparison
    for key in ("prefill_32", "decode_32", "prefill_2048", "decode_2048"):
        assert c.row(key).cells["base"].value > 0
    assert not any(w.startswith("base: attention") for w in c.warnings)
    assert "2048" in c.row("stability.attention_error").label
    # linear attention with its state in fp16 overflows by 2,048 tokens at this head shape: its logits are
    # NaN there, so its answers would be garbage and the variant fails, saying where (issue 13)
    assert c.status == {"base": "ok", "lin16": "failed"}, c.reasons
    assert "NaN or inf logits after the prompt of 1 request(s) (2048 tokens)" in c.reasons["lin16"]


def test_compiled_variant_reports_compile_time_apart(tmp_path):
    # single-stream alone, no accuracy: the compiled step gets one graph a (batch, cache length), each compiled
    # cold on a fresh CI machine; fewer shapes, fewer graphs (alone, a fresh inductor cache: 83 s → 72 s)
    workload = TINY_WORKLOAD | {"scenarios": [{"type": "single-stream", "requests": 2, "warmup": 1}],
                                "accuracy": {"samples": 0, "graded": 0}}
    suite = _write_suite(tmp_path, [{"name": "eager"}, {"name": "compiled", "compile": True}], workload=workload)
    c = variantlab.bench(suite).comparison
    assert c.status == {"eager": "ok", "compiled": "ok"}, c.reasons
    assert c.row("cold_start.compile").cells["compiled"].value > 0
    assert c.row("cold_start.compile").cells["eager"] is None  # not compiled: no such stage
    assert any("torch.compile" in k for k in c.builds["compiled"]["kernels"])


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory) -> Path:
    """The reference model whose LM head has one row of NaN: every position's logits hold a NaN."""
    return nan_model_copy(BUILTIN_MODELS["tiny-structured"], tmp_path_factory.mktemp("nan"))


def test_nan_logits_fail_the_variant_with_the_reason_and_the_run_stays_readable(tmp_path, nan_model_dir):
    suite = _write_suite(tmp_path, [{"name": "base"}, {"name": "nan", "model": str(nan_model_dir)}])
    result = variantlab.bench(suite)
    assert result.comparison.status == {"base": "ok", "nan": "failed"}
    assert "NaN or inf logits" in result.comparison.reasons["nan"]
    show = _cli("show", result.run_id, "--store", result.store_path, "--all")
    assert show.returncode == 0, show.stderr
    assert "NaN or inf logits" in show.stdout


def test_an_interrupted_run_is_marked_keeps_what_it_finished_and_leaves_no_worker(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"}], rounds=4)
    env = os.environ | {"COLUMNS": "100"}
    # SIGINT as a terminal sends it, even where this test's own launcher ignores it (a background job of a
    # non-interactive shell starts with SIGINT ignored, and Python then installs no handler for it)
    proc = subprocess.Popen([sys.executable, "-m", "variantlab.cli", "bench", str(suite)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    store = tmp_path / "store.sqlite"
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.5)
        if store.exists():
            with sqlite3.connect(store) as db:
                try:
                    if db.execute("SELECT COUNT(*) FROM records WHERE kind='measure'").fetchone()[0] >= 1:
                        break
                except sqlite3.OperationalError:
                    pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    with Store(store) as s:
        (run,) = s.runs()
        assert run.status == "interrupted"
        kept = s.records(run.run_id, "measure")
        assert 1 <= len(kept) < 8 and all(r.status == "ok" for r in kept)
    import psutil
    workers = [p for p in psutil.process_iter(["cmdline"])
               if "variantlab.measure.worker" in " ".join(p.info["cmdline"] or ()) and str(tmp_path) in
               " ".join(p.info["cmdline"] or ())]
    assert not workers
    show = _cli("show", run.run_id, "--store", store)
    assert show.returncode == 0 and "(interrupted)" in show.stdout


def test_the_machine_warning_compares_the_load_with_the_machines_cores():
    from variantlab.measure.runner import machine_warnings
    assert machine_warnings(2, machine_cores=2, load=0.3) == []
    (w,) = machine_warnings(2, machine_cores=2, load=3.4)
    assert "load average 3.4 on 2 cores" in w
    assert machine_warnings(2, machine_cores=64, load=3.4) == []   # a big machine with room to spare


def test_with_stderr_in_a_file_bench_writes_a_line_per_finished_job_and_a_busy_warning_counts_its_threads(tmp_path):
    """Issue 22: stderr redirected to a file gets one plain line per finished build and measurement (a live bar
    there wrote nothing until the end); and on a busy machine the warning names the suite's `threads: 1`, not the
    cores the bench may use. The load average is the one input set here (the machine's own load is whatever it is)."""
    suite = _write_suite(tmp_path, [{"name": "base"}], workload={
        "dataset": {"generator": "structured", "n": 2, "seed": 0}, "max_new_tokens": 1,
        "scenarios": [{"type": "single-stream", "requests": 1, "warmup": 0}], "accuracy": {"samples": 0}})
    busy = ("import os, runpy; os.getloadavg = lambda: (99.0, 99.0, 99.0); "
            "runpy.run_module('variantlab.cli', run_name='__main__')")
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.run([sys.executable, "-c", busy, "bench", str(suite)], stdout=subprocess.PIPE, stderr=err,
                              text=True, env=os.environ | {"COLUMNS": "100"}, timeout=600)
    lines = (tmp_path / "stderr.txt").read_text().splitlines()
    assert proc.returncode == 0, lines
    assert lines[0].startswith("disk: this run will take about ") and lines[0].endswith(" free")   # said first
    assert lines[1] == "2 builds and measurements to run; a line as each finishes"
    assert re.fullmatch(r"base · build: ok in [0-9.]+ s \(1/2 done, \d+ s elapsed\)", lines[2]), lines
    assert lines[3].startswith("page cache: the variants' 7 files (")   # read once, before the first round
    assert re.fullmatch(r"base · round 1/1: ok in [0-9.]+ s \(2/2 done, \d+ s elapsed\)", lines[4]), lines
    assert len(lines) == 5 and "━" not in "".join(lines)                   # no bar drawn into the file
    assert "(this run's workers use 1 thread);" in " ".join(proc.stdout.split())


# --- explain: true picks the variants slower than the baseline beyond the interval (unit) -----------------

def _comparison_with(deltas: dict, lower_is_better=True, headline=1, is_timing=True, status=None):
    from variantlab.measure.analysis import Comparison, Row
    from variantlab.measure.stats import Delta
    names = ("base", *deltas)
    row = Row("single-stream.tpot_p50", "TPOT p50", "s" if is_timing else "B", lower_is_better, "samples",
              {n: None for n in names}, {"base": None, **{n: Delta(*d) for n, d in deltas.items()}},
              headline=headline, is_timing=is_timing)
    return Comparison("base", names, status or {n: "ok" for n in names}, {n: None for n in names}, (row,))


def test_slower_than_baseline_needs_a_significant_worse_headline_timing():
    from variantlab.measure.runner import slower_than_baseline
    c = _comparison_with({"slow": (50.0, 40.0, 60.0, True), "fast": (-30.0, -40.0, -20.0, True),
                          "unsure": (20.0, -5.0, 45.0, False), "one-round": (80.0, None, None, None)})
    assert slower_than_baseline(c) == ["slow"]
    # higher is better (throughput): a significant drop is slower
    c = _comparison_with({"drop": (-25.0, -30.0, -20.0, True), "gain": (25.0, 20.0, 30.0, True)},
                         lower_is_better=False)
    assert slower_than_baseline(c) == ["drop"]
    # not a headline row, or not a timing: no trigger; a failed variant is never explained
    assert slower_than_baseline(_comparison_with({"slow": (50.0, 40.0, 60.0, True)}, headline=None)) == []
    assert slower_than_baseline(_comparison_with({"slow": (50.0, 40.0, 60.0, True)}, is_timing=False)) == []
    assert slower_than_baseline(_comparison_with({"slow": (50.0, 40.0, 60.0, True)},
                                                 status={"base": "ok", "slow": "failed"})) == []


# --- a learned position table (GPT-2; issue 22) ------------------------------------------------------------

def _gpt2_suite(tmp_path: Path, model_dir: Path, max_new_tokens: int, **extra) -> Path:
    """A suite over short prompts (a JSONL dataset) on the tiny GPT-2 (128 positions)."""
    lines = [{"id": f"s{i}", "prompt": f"order ORD-{i} is pending.\nQ: What is the status?\nA:", "answer": "pending"}
             for i in range(4)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    workload = {"dataset": {"path": "data.jsonl"}, "max_new_tokens": max_new_tokens,
                "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 0}], "accuracy": {"samples": 2}}
    return _write_suite(tmp_path, [{"name": "fp32"}], model=str(model_dir), workload=workload, **extra)


def test_gpt2_prompts_past_the_table_are_refused_and_the_attention_check_stops_at_it(tmp_path, family_dirs):
    """Through the CLI: a prompt + max_new_tokens past GPT-2's table is bad input (exit 2, one line, before
    anything runs); within it the suite runs, and the attention-error row (2,048 tokens by default, which
    raised IndexError) is measured at the table's length with a note saying so."""
    refused = _cli("bench", _gpt2_suite(tmp_path, family_dirs["gpt2"], max_new_tokens=120))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "workload.max_new_tokens: 4 of 4 prompts of data.jsonl + max_new_tokens 120" in refused.stderr
    assert not (tmp_path / "store.sqlite").exists()                       # nothing ran
    proc = _cli("bench", _gpt2_suite(tmp_path, family_dirs["gpt2"], max_new_tokens=8), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["key"]: r for r in json.loads(proc.stdout)["comparison"]["rows"]}
    row = rows["stability.attention_error"]
    assert row["label"] == "Attention rel. error vs fp64 @128 tokens" and row["cells"]["fp32"]["value"] < 1e-5
    assert row["note"].startswith("capped at the model's 128 positions") and "not 512, 2048" in row["note"]


def test_a_variant_whose_every_scenario_raised_fails_and_keeps_its_record(tmp_path, family_dirs):
    """Issue 22: every scenario of GPT-2 raised IndexError (prompt + max_new_tokens past its table) and the run
    was stored with `fp32 (ok)`, exit 0. Planning now refuses that suite, so the plan is made within the table
    and its scenarios then asked to decode 200 tokens: the variant is failed with the first scenario's reason
    (the CLI exits 1 for it), the run is done, and the stored record keeps what the round did measure."""
    import dataclasses

    from variantlab.measure.plan import plan_suite_file
    from variantlab.pipeline import run_plan
    from variantlab.measure.scenarios.common import Scenario
    from variantlab.measure.tracker import WorkloadSettings

    plan = plan_suite_file(_gpt2_suite(tmp_path, family_dirs["gpt2"], max_new_tokens=4))
    past = WorkloadSettings(max_new_tokens=200, stop=())
    plan = dataclasses.replace(plan, trackers=tuple(dataclasses.replace(t, workload=past) if isinstance(t, Scenario)
                                                    else t for t in plan.trackers))
    result = run_plan(plan)
    c = result.comparison
    assert c.status == {"fp32": "failed"}
    assert c.reasons["fp32"].startswith("every scenario failed; single-stream: IndexError: index out of range")
    with Store(result.store_path) as store:
        assert store.run(result.run_id).status == "done"
        (record,) = store.records(result.run_id, "measure")
    assert record.status == "failed" and record.ran_once
    kept = {o.name for o in record.outputs if o.error is None}
    assert {"cold_start", "memory", "facts", "stability", "grading", "scoring"} <= kept
    assert not record.blobs and (result.output_dir / "report.md").is_file()   # figures, no distributions


def test_every_variants_files_are_read_from_disk_once_before_the_rounds(tmp_path):
    """Issue 50: one variant's artifact just written, another's reused and half evicted, load at different speeds;
    so before the first round every variant's files are dropped from the page cache and read once, and the run
    says so. (Builds stand in here; the executor stops the run at its first measurement.)"""
    from types import SimpleNamespace

    from variantlab.measure.plan import plan_suite_file
    from variantlab.measure.runner import Events, RunInterrupted, measure_plan
    from variantlab.measure.wire import BuildJob, BuildRecord
    plan = plan_suite_file(_write_suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"}],
                                        workload=TINY_WORKLOAD | {"accuracy": {"samples": 0, "graded": 0}}))
    measured = []

    def run_all(tasks, limits, on_done, on_start=None):
        for t in tasks:
            if not isinstance(t.job, BuildJob):
                measured.append(len(said))      # the notes said before the first measurement
                raise KeyboardInterrupt
            folder = Path(t.job.artifact_dir)
            folder.mkdir(parents=True)
            (folder / "model.safetensors").write_bytes(b"w" * 3000)
            (folder / "variant.json").write_text("{}")
            on_done(t, BuildRecord(variant=t.job.variant.name, status="ok", artifact_dir=str(folder)), {})
    said = []
    with pytest.raises(RunInterrupted):
        measure_plan(plan, executor=SimpleNamespace(run_all=run_all, kill=lambda: None),
                     events=Events(on_note=said.append))
    settled = [line for line in said if line.startswith("page cache:")]
    assert len(settled) == 1 and "the variants' 4 files (5.9 KiB) read from disk once" in settled[0]
    assert measured and said.index(settled[0]) < measured[0]      # before any measurement


def test_a_round_in_turns_interleaves_the_variants_requests_and_leaves_the_waits_out_of_its_times(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"}], rounds=1)
    result = variantlab.bench(suite)
    assert result.comparison.status == {"base": "ok", "half": "ok"}, result.comparison.reasons
    turns = []
    for name in ("base", "half"):
        for line in (result.output_dir / "jobs" / f"{name}-r1" / "turns.txt").read_text().splitlines():
            n, tag, _ = line.split("\t")
            turns.append((int(n), name, tag))
    turns.sort()
    first = turns[0][1]
    other = "half" if first == "base" else "base"
    # each scenario's warm-up, each single-stream request and each offline pass, variant by variant in turn
    tags = ["single-stream warm-up", *(f"single-stream request {i}" for i in (1, 2, 3)), "offline warm-up",
            "offline pass 1", "offline pass 2"]
    assert [(name, tag) for _, name, tag in turns] == [(v, t) for t in tags for v in (first, other)]
    with Store(result.store_path) as store:
        for rec in store.records(result.run_id, "measure"):
            (p,) = rec.output("single-stream").data["passes"]
            reqs = p["records"]
            assert 0 < p["paused"] < p["end"] - p["start"]
            busy = sum(r["end_time"] - r["send_time"] for r in reqs)
            assert busy <= p["end"] - p["start"] - p["paused"]     # the requests' time is within the pass's own


def test_a_round_runs_in_turns_only_with_a_local_executor_and_room_for_every_variant():
    from variantlab.measure.runner import PROCESS_BYTES, why_not_in_turns
    assert why_not_in_turns(True, [10 * 2**20] * 3, 64 * 2**30) is None
    assert why_not_in_turns(True, [10 * 2**20] * 3, None) is None
    assert "this executor runs each job on its own" in why_not_in_turns(False, [0, 0], 64 * 2**30)
    need = 2 * (2**30 + PROCESS_BYTES)
    why = why_not_in_turns(True, [2**30, 2**30], 2 * 2**30)
    assert why == (f"holding every variant at once needs about {need / 2**30:.1f} GiB, and this machine has "
                   "2.0 GiB available")
