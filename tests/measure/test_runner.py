"""End to end: `variantlab bench` on the shipped reference model, each variant in its own process."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import variantlab
from variantlab.models.loading import BUILTIN_MODELS

pytestmark = pytest.mark.e2e

TINY_WORKLOAD = {
    "dataset": {"generator": "structured", "n": 6, "seed": 0},
    "max_new_tokens": 6,
    "scenarios": [{"type": "single-stream", "requests": 3, "warmup": 1},
                  {"type": "offline", "batch_size": 4, "passes": 2, "warmup": 1}],
    "accuracy": {"samples": 3},
}


def _write_suite(tmp_path: Path, variants: list[dict], **extra) -> Path:
    suite = {"name": "t", "model": "builtin:tiny-structured", "variants": variants, "workload": TINY_WORKLOAD,
             "threads": 1, "output": {"dir": str(tmp_path / "runs"), "store": str(tmp_path / "store.sqlite")}}
    suite.update(extra)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


@pytest.fixture(scope="module")
def broken_model_dir(tmp_path_factory) -> Path:
    """A directory that passes the cheap checks (config names a causal LM, safetensors intact) but
    whose weights do not fit its config, so loading fails inside the worker."""
    d = tmp_path_factory.mktemp("broken")
    for f in BUILTIN_MODELS["tiny-structured"].iterdir():
        shutil.copy(f, d / f.name)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] *= 2
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_bench_api_compares_variants_and_records_a_failure(tmp_path, broken_model_dir):
    suite = _write_suite(tmp_path, [{"name": "fp32"}, {"name": "bf16", "recipe": "bf16"},
                                    {"name": "broken", "model": str(broken_model_dir)}])
    result = variantlab.bench(suite)
    c = result.comparison
    assert c.baseline == "fp32" and c.variants == ("fp32", "bf16", "broken")
    assert c.status == {"fp32": "ok", "bf16": "ok", "broken": "failed"}
    assert c.reasons["broken"]  # the reason is recorded
    # every metric of the table has a value for the variants that ran
    for key in ("single_task_latency", "e2el_p50", "ttft_p50", "tpot_p50", "output_throughput", "peak_memory",
                "cold_start_total", "model_size", "kld_mean", "top1_agreement", "ppl_ratio", "task_accuracy"):
        row = c.row(key)
        assert row.cells["fp32"] is not None and row.cells["fp32"].value is not None, key
        assert row.cells["bf16"] is not None and row.cells["bf16"].value is not None, key
        assert row.cells["broken"] is None
    assert c.row("kld_mean").cells["fp32"].value == 0.0
    assert c.row("model_size").deltas["bf16"].pct == pytest.approx(-50.0, abs=0.5)
    assert c.row("bits_per_weight").cells["bf16"].value == pytest.approx(16.0)
    # reports and the store
    for name in ("report.md", "results.json", "results.csv"):
        assert (result.output_dir / name).is_file()
    assert "| Metric | fp32 (baseline) | bf16 | broken |" in (result.output_dir / "report.md").read_text()
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        rows = db.execute("SELECT variant, status FROM measurements WHERE run_id=?", (result.run_id,)).fetchall()
        assert sorted(rows) == [("bf16", "ok"), ("broken", "failed"), ("fp32", "ok")]
        assert db.execute("SELECT status FROM runs WHERE run_id=?", (result.run_id,)).fetchone() == ("done",)
    # the environment fingerprint is stored with the run and with each measurement
    assert result.environment["cpu_model"] and result.environment["packages"]["torch"]
    assert result.results["fp32"]["environment"]["threads"] == 1


def test_bench_cli_prints_table_and_show_reprints_it(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"}], baseline="base")
    env = os.environ | {"COLUMNS": "250"}
    out = subprocess.run([sys.executable, "-m", "variantlab.cli", "bench", str(suite)], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "TPOT p50" in out.stdout and "Delta" in out.stdout and "base (baseline)" in out.stdout
    store = str(tmp_path / "store.sqlite")
    runs = subprocess.run([sys.executable, "-m", "variantlab.cli", "runs", "--store", store], capture_output=True,
                          text=True, env=env, timeout=120)
    assert runs.returncode == 0 and "base (ok)" in runs.stdout
    run_id = next(p.name for p in (tmp_path / "runs").iterdir())
    show = subprocess.run([sys.executable, "-m", "variantlab.cli", "show", run_id, "--store", store,
                           "--markdown"], capture_output=True, text=True, env=env, timeout=120)
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
    assert c.status == {"ref": "ok", "other": "ok"}
    assert c.tokenizers["ref"] != c.tokenizers["other"]
    for key in ("kld_mean", "top1_agreement", "ppl_ratio"):
        row = c.row(key)
        assert row.cells["other"] is None or row.cells["other"].value is None
        assert "not comparable" in row.note and "tokenizer" in row.note
    assert c.row("bits_per_byte").cells["other"].value > 0
    assert c.row("bits_per_byte").deltas["other"] is not None
    assert c.row("task_accuracy").cells["other"] is not None


def test_attention_variants_compose_with_recipes_and_report_kv_cache(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "base"},
                                    {"name": "gqa2", "attention": "gqa:2"},
                                    {"name": "lin-int8", "recipe": "int8", "attention": "linear"}])
    result = variantlab.bench(suite)
    c = result.comparison
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
    assert c.status == {"base": "ok", "lin16": "ok"}, c.reasons
    for key in ("prefill_32", "decode_32", "prefill_2048", "decode_2048"):
        assert c.row(key).cells["base"].value > 0 and c.row(key).cells["lin16"].value > 0
    # linear attention with its state in fp16 overflows by 2,048 tokens at this head shape: the report says so
    assert any(w.startswith("lin16: attention in fp16 at 2048 tokens is") for w in c.warnings), c.warnings
    assert not any(w.startswith("base: attention") for w in c.warnings)


def test_compiled_variant_reports_compile_time_apart(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "eager"}, {"name": "compiled", "compile": True}])
    c = variantlab.bench(suite).comparison
    assert c.status == {"eager": "ok", "compiled": "ok"}, c.reasons
    assert c.row("cold_start_compile").cells["compiled"].value > 0
    assert c.row("cold_start_compile").cells["eager"] is None  # not compiled: no such stage
    assert any("torch.compile" in k for k in c.builds["compiled"]["kernels"])
