"""Issue 49, end to end: a bench of a model with Qwen2.5's 151,936-token vocabulary (2 tiny layers, random
weights: models/synthetic.py) keeps every record small, gives KLD exactly as full distributions do, and compares
a GGUF made from the checkpoint on the baseline's token ids, although the GGUF's folder would load the
checkpoint's tokenizer.json as another class that splits the text otherwise."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import yaml

import variantlab
from variantlab.measure import accuracy as acc
from variantlab.measure.backend_kinds import backend_kind
from variantlab.measure.trackers.scoring import Scoring
from variantlab.measure.wire import MeasureJob
from variantlab.models.synthetic import write_checkpoint
from variantlab.store import Store

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAMPLES = 8
SPLITS = "Done.\n\nThe end: 12\nA:"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A Qwen2 checkpoint whose tokenizer.json is plain byte-level BPE (GPT-2's split), as users' often are."""
    path = tmp_path_factory.mktemp("qwen-vocab")
    write_checkpoint(path, "qwen2-vocab-tiny")
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    (path / "tokenizer.json").write_text(json.dumps(spec))
    return path


def test_the_checkpoints_tokenizer_loads_as_another_class_elsewhere_and_splits_otherwise(checkpoint, tmp_path):
    """The precondition the GGUF test stands on (transformers 5.23)."""
    from transformers import AutoTokenizer
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (bare / f).write_bytes((checkpoint / f).read_bytes())
    ours, theirs = (AutoTokenizer.from_pretrained(p, local_files_only=True) for p in (checkpoint, bare))
    assert type(ours).__name__ == "Qwen2Tokenizer" and type(theirs).__name__ == "TokenizersBackend"
    assert ours(SPLITS).input_ids != theirs(SPLITS).input_ids


def suite(tmp_path: Path, checkpoint: Path) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({
        "name": "vocab", "model": str(checkpoint), "threads": 1, "rounds": 1,
        "variants": [{"name": "fp32"}, {"name": "int8", "recipe": "int8"},
                     {"name": "q8", "backend": "llamacpp", "gguf_type": "Q8_0"}],
        "workload": {"dataset": {"generator": "structured", "n": SAMPLES, "seed": 0}, "max_new_tokens": 4,
                     "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 1}],
                     "accuracy": {"samples": SAMPLES}},
        "output": {"dir": str(tmp_path / "runs"), "store": str(tmp_path / "store.sqlite")}}))
    return path


def full_distributions(job: MeasureJob, ids=None):
    """A variant's whole next-token distributions over the evaluation texts, opened as a worker opens it: on
    its own split, or on `ids` (each text's token ids) with their predicted bytes."""
    opened = backend_kind(job.variant.backend).open(job, 0.0)
    try:
        with opened.context():
            texts = Scoring(SAMPLES).texts(job.samples)
            scored = (opened.backend.score(texts) if ids is None
                      else [opened.backend.score_ids(i, n) for i, n in ids])
            return scored, type(getattr(opened.backend, "tokenizer", None) or opened.backend.text.tokenizer).__name__
    finally:
        opened.close()


def test_a_real_vocabulary_bench_keeps_records_small_and_kld_exact_on_the_baselines_ids(checkpoint, tmp_path):
    result = variantlab.bench(suite(tmp_path, checkpoint))
    c = result.comparison
    assert c.status == {"fp32": "ok", "int8": "ok", "q8": "ok"}, c.reasons
    with sqlite3.connect(result.store_path) as db:
        sizes = db.execute("SELECT length(record_json) FROM records").fetchall()
        blobs = db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0]
    assert len(sizes) == 6 and max(s for (s,) in sizes) <= 1 << 20 and blobs == 0   # ≤ 1 MB each, no blob
    assert not (result.output_dir / "reference").exists()          # the reference's 10s of MB given back

    with Store(result.store_path) as store:
        builds = {b.variant: b for b in store.records(result.run_id, "build")}
        measured = {m.variant: m for m in store.records(result.run_id, "measure")}
    plan_job = measured["fp32"]

    def job(name: str) -> MeasureJob:
        defs = {v["name"]: v for v in store_plan(result)["variants"]}
        return MeasureJob(variant={k: v for k, v in defs[name].items() if k not in ("source", "resolved")},
                          artifact_dir=builds[name].artifact_dir, round=0, device="cpu", threads=1, seed=0,
                          samples=store_samples(result), trackers=(), run_once=False)

    base, base_class = full_distributions(job("fp32"))
    ids = [(s.token_ids, s.n_bytes) for s in base]
    base_lp = np.concatenate([s.logprobs for s in base])
    assert base_lp.shape[1] == 151_936 and plan_job.status == "ok"
    kld = c.row("scoring.kld_mean").cells
    top1 = c.row("scoring.top1_agreement").cells
    for name in ("int8", "q8"):
        var, var_class = full_distributions(job(name), ids)
        var_lp = np.concatenate([s.logprobs for s in var])
        full = acc.kld_summary(base_lp, var_lp)
        assert kld[name].value == pytest.approx(full["mean"], rel=1e-9) and kld[name].value > 0
        assert top1[name].value == acc.top1_agreement(base_lp, var_lp)
        scoring = measured[name].output("scoring").data
        assert scoring["split"] == "reference" and scoring["versus"] is None
        assert var_class == base_class == "Qwen2Tokenizer"           # the GGUF's folder: the class pinned
    assert kld["fp32"].value == 0.0
    ppl_ratio = c.row("scoring.ppl_ratio").cells["q8"]
    assert ppl_ratio.problem is None and 0.5 < ppl_ratio.value < 2.0


def store_plan(result) -> dict:
    with Store(result.store_path) as store:
        return store.run(result.run_id).plan.to_json()


def store_samples(result) -> tuple:
    from variantlab.measure.plan import plan_suite_file
    return plan_suite_file(result.output_dir.parent.parent / "suite.yaml").samples
