"""The disk a run will take, stated before it starts, and a run the disk cannot hold refused (measure/disk_budget.py,
variants/artifact_size.py, each recipe's `artifact_bytes`, gguf_convert.estimate).

The estimates are checked against the real artifacts of the shipped tiny model (built once, in this process,
as a worker builds them) and the reference's size against a reference written by the reference job; the refusal
through `measure_plan`, `run_build` and `variantlab bench` on a disk made to look (or be) small."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from variantlab.errors import VariantlabError
from variantlab.measure import disk_budget as db
from variantlab.measure.backend_kinds import backend_kind
from variantlab.measure.plan import plan_suite_file
from variantlab.measure.reference import LOGPROBS
from variantlab.models.loading import BUILTIN_MODELS
from variantlab.variants.artifact_size import int4_bytes, int8_bytes, read_weights
from variantlab.variants.build import VariantDefinition
from variantlab.variants.registry import get_recipe, parse_options

TINY = BUILTIN_MODELS["tiny-structured"]
Usage = namedtuple("Usage", "total used free")
MB = 10**6

DTYPES = {"F32": 4, "BF16": 2}


def write_checkpoint(folder: Path, tensors: dict[str, tuple[int, ...]], config: dict, dtype: str = "F32") -> Path:
    """A checkpoint folder whose safetensors file holds `tensors` (zeros): headers are what the estimate reads."""
    folder.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = DTYPES[dtype] * _numel(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def llama_like(vocab=100, hidden=64, inter=96, tied=False, head_in_file=True) -> tuple[dict, dict]:
    t = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(2):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (32, hidden),
              p + "self_attn.v_proj.weight": (32, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
              p + "self_attn.q_proj.bias": (hidden,), p + "mlp.gate_proj.weight": (inter, hidden),
              p + "mlp.up_proj.weight": (inter, hidden), p + "mlp.down_proj.weight": (hidden, inter),
              p + "input_layernorm.weight": (hidden,)}
    if head_in_file:
        t["lm_head.weight"] = (vocab, hidden)
    return t, {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "tie_word_embeddings": tied}


# ---------------------------------------------------------------- the estimates, no model

def test_the_tables_and_the_linears_are_told_apart_by_their_rows_and_a_tied_head_counts_once(tmp_path):
    tensors, config = llama_like()
    w = read_weights(write_checkpoint(tmp_path / "untied", tensors, config))
    assert (w.embedding, w.head, w.tied) == ("model.embed_tokens.weight", "lm_head.weight", False)
    assert len(w.linears()) == 14 and "model.layers.0.self_attn.q_proj.bias" not in w.linears()
    assert w.parameters == sum(_numel(s) for s in tensors.values())
    # tied in config.json with the head written too: one storage, written once (artifact._unique_tensors)
    tied = read_weights(write_checkpoint(tmp_path / "tied", tensors, config | {"tie_word_embeddings": True}))
    assert tied.tied and tied.parameters == w.parameters - 100 * 64
    # no head in the file (Qwen2.5-0.5B, GPT-2): the embedding is the head
    gone = read_weights(write_checkpoint(tmp_path / "gone", *llama_like(head_in_file=False)))
    assert gone.tied and gone.head is None and gone.parameters == tied.parameters


def test_each_recipe_lays_out_its_weights_file_as_its_modules_store_it(tmp_path):
    tensors, config = llama_like()
    w = read_weights(write_checkpoint(tmp_path / "m", tensors, config))
    linears = w.linears()
    rest = w.parameters - sum(_numel(s) for s in linears.values())          # tables, norms, biases
    est = lambda recipe, **o: get_recipe(recipe).artifact_bytes(parse_options(get_recipe(recipe), o), w)  # noqa: E731
    assert est("fp32") == 4 * w.parameters and est("bf16") == est("fp16") == 2 * w.parameters
    # int8: int8 [N, K] + a bf16 scale a row; the embedding, the head and the rest in bf16
    assert est("int8") == sum(n * k + 2 * n for n, k in linears.values()) + 2 * rest == est("w8a8")
    # int4: K to the group, N to 16, a scale and a zero a group
    assert est("int4", group_size=32) == sum(int4_bytes(s, 32, 2) for s in linears.values()) + 2 * rest
    assert int4_bytes((32, 96), 32, 2) == 32 * 96 // 2 + 32 * 3 * 4
    assert int4_bytes((20, 64), 64, 4) == 32 * 32 + 32 * 1 * 8                     # rows padded to 16
    # the LM head quantized, the embeddings in int8 rows, fp32 compute
    head = (100, 64)
    assert (est("int8", quantize_lm_head=True) - est("int8")) == int8_bytes(head, 2) - 2 * _numel(head)
    assert (est("int8", quantize_embeddings=True, compute_dtype="fp32")
            == est("int8", compute_dtype="fp32") - 4 * 6400 + int8_bytes(head, 4))
    # mixed, before its calibration: every linear at its widest candidate
    assert est("mixed") == est("bf16") and est("mixed", candidates=[4, 8]) == est("int8")


def test_a_quantized_side_of_a_tie_stores_both_tables(tmp_path):
    w = read_weights(write_checkpoint(tmp_path / "m", *llama_like(head_in_file=False, tied=True)))
    est = lambda **o: get_recipe("int8").artifact_bytes(parse_options(get_recipe("int8"), o), w)  # noqa: E731
    table = 100 * 64
    assert est(quantize_lm_head=True) - est() == int8_bytes((100, 64), 2)            # a quantized copy beside it
    assert est(quantize_embeddings=True) - est() == int8_bytes((100, 64), 2)         # the head keeps the bf16 one
    assert est(quantize_embeddings=True, quantize_lm_head=True) - est() == 2 * int8_bytes((100, 64), 2) - 2 * table


def test_a_gguf_type_takes_its_bits_its_output_q6_k_and_a_quantized_type_holds_its_f32_beside_it(tmp_path):
    from variantlab.variants.gguf_convert import estimate
    tensors, config = llama_like(vocab=256, hidden=256, inter=512)
    w = read_weights(write_checkpoint(tmp_path / "m", tensors, config))
    one_d = sum(_numel(s) for s in tensors.values() if len(s) == 1)
    two_d = w.parameters - one_d
    f16 = estimate("F16", w)
    assert f16.bytes == 2 * two_d + 4 * one_d and f16.transient == 0
    q8 = estimate("Q8_0", w, metadata_bytes=1000)
    assert q8.bytes == pytest.approx(1000 + 4 * one_d + two_d * 8.5 / 8, abs=1)
    assert q8.transient == 4 * w.parameters + 1000
    q4 = estimate("Q4_0", w)    # the output head at Q6_K's 6.5625 bits, every other weight at 4.5
    assert q4.bytes == pytest.approx(4 * one_d + (two_d - 256 * 256) * 4.5 / 8 + 256 * 256 * 6.5625 / 8, abs=1)


def test_the_line_and_the_refusal_name_the_parts_the_folder_and_what_fits(tmp_path):
    disk = db.Disk(tmp_path, free=4 * 10**9, size=100 * 10**9)
    ok = db.DiskBudget({"a": 10**9, "b": 5 * 10**8}, 2 * 10**8, 6 * 10**8, 10**7, 10**6, disk)
    assert ok.total == 10**9 + 5 * 10**8 + 2 * 10**8 + 6 * 10**8 + 11 * 10**6
    assert ok.line() == ("disk: this run will take about 2.3 GB, an estimate (artifacts 1.5 GB for 2 variants, "
                         "200.0 MB more while one builds, baseline reference 600.0 MB, store and job files 11.0 MB) "
                         f"in {tmp_path}; 4.0 GB free")
    assert ok.problem() is None
    tight = db.DiskBudget({"a": 3 * 10**9}, 0, 6 * 10**8, 10**7, 10**6, disk)      # 3.6 GB + 1 GiB kept free
    err = tight.problem()
    assert err.file == str(tmp_path) and err.field == "output.dir"
    assert err.detail.startswith("the disk cannot hold this run: it will take about 3.6 GB, an estimate (artifacts")
    assert err.detail.endswith("and 4.0 GB is free there, 1.1 GB of which is kept free")
    assert "a disk with at least 4.7 GB free" in err.accepted and "--artifacts DIR" in err.accepted
    assert "workload.accuracy.samples" in err.accepted and "\n" not in err.one_line()
    # a store on another filesystem is checked against its own
    store = db.Disk(tmp_path / "s", free=5 * 10**6, size=10**8)
    split = db.DiskBudget({"a": 10**6}, 0, 0, 10**7, 0, disk, store)
    assert split.on_disk == 10**6 and "the store's 10.0 MB in" in split.line()
    assert split.problem().field == "--store"


def test_check_disk_refuses_unless_the_check_is_off_and_say_disk_says_the_line(tmp_path, monkeypatch):
    fits = db.DiskBudget({"a": 10**9}, 0, 0, 0, 0, db.Disk(tmp_path, free=10**10, size=10**11))
    said = []
    db.say_disk(db.check_disk(fits), said.append)
    assert said == [fits.line()]
    tight = db.DiskBudget({"a": 10**9}, 0, 0, 0, 0, db.Disk(tmp_path, free=10**8, size=10**10))
    with pytest.raises(VariantlabError, match="cannot hold"):
        db.check_disk(tight)
    monkeypatch.setenv(db.ENV, "0")
    db.say_disk(db.check_disk(tight), said.append)
    assert said[-1] == tight.line() + " (not enough: VARIANTLAB_DISK_CHECK=0, not refused)"


# ---------------------------------------------------------------- plans: what is built, reused, resumed

def _suite(tmp_path: Path, variants: list[dict], samples: int = 3, **extra) -> Path:
    suite = {"name": "t", "model": "builtin:tiny-structured", "baseline": variants[0]["name"], "variants": variants,
             "threads": 1, "rounds": 2,
             "workload": {"dataset": {"generator": "structured", "n": 6, "seed": 0}, "max_new_tokens": 4,
                          "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 0}],
                          "accuracy": {"samples": samples}},
             "output": {"dir": str(tmp_path / "runs"), "store": str(tmp_path / "store.sqlite")}} | extra
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def roomy(path):
    return Usage(10**12, 0, 5 * 10**11)


def small(path):
    return Usage(10**9, 10**9 - 3 * MB, 3 * MB)


@pytest.mark.model
def test_a_plan_counts_what_it_builds_not_what_it_reuses_or_stored(tmp_path):
    plan = plan_suite_file(_suite(tmp_path, [{"name": "base"}, {"name": "q8", "recipe": "int8"},
                                             {"name": "ep", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}]))
    b = db.disk_budget(plan, tmp_path / "runs" / "r1", tmp_path / "store.sqlite", usage=roomy)
    assert set(b.artifacts) == {"base", "q8"} and b.artifacts["base"] > 2 * b.artifacts["q8"]   # no endpoint
    assert b.store == 3 * 3 * db.RECORD_BYTES and b.reference > 0 and b.disk.folder == tmp_path
    assert b.problem() is None and not b.not_estimated
    # a build in --artifacts DIR is reused; a resumed run's stored builds and records are not made again
    (tmp_path / "arts" / "q8").mkdir(parents=True)
    (tmp_path / "arts" / "q8" / "variant.json").write_text("{}")
    assert set(db.disk_budget(plan, tmp_path / "r", tmp_path / "s.sqlite", artifacts_dir=tmp_path / "arts",
                              usage=roomy).artifacts) == {"base"}
    stored = [SimpleNamespace(kind="build", variant="base"), SimpleNamespace(kind="measure", variant="base")]
    run = tmp_path / "runs" / "r1"
    (run / "reference").mkdir(parents=True)
    (run / "reference" / LOGPROBS).write_bytes(b"\0" * 4096)   # what a first try left
    resumed = db.disk_budget(plan, run, tmp_path / "store.sqlite", stored=stored, usage=roomy)
    assert set(resumed.artifacts) == {"q8"} and resumed.store == 7 * db.RECORD_BYTES
    assert resumed.reference == b.reference - 4096 and resumed.disk.folder == run


@pytest.mark.model
def test_a_run_the_disk_cannot_hold_is_refused_before_anything_is_made(tmp_path, monkeypatch):
    from variantlab.measure.runner import Events, RunInterrupted, measure_plan, run_build
    plan = plan_suite_file(_suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"}]))
    monkeypatch.setattr(shutil, "disk_usage", small)
    said = []
    with pytest.raises(VariantlabError) as e:
        measure_plan(plan, executor=SimpleNamespace(), events=Events(on_note=said.append))
    assert e.value.field == "output.dir" and "the disk cannot hold this run: it will take about" in str(e.value)
    assert "3.0 MB is free there" in str(e.value) and said == []
    assert not (tmp_path / "runs").exists() and not (tmp_path / "store.sqlite").exists()
    with pytest.raises(VariantlabError, match="the disk cannot hold these builds") as e:
        run_build(plan, tmp_path / "arts", events=Events(on_note=said.append))
    assert e.value.field == "--out" and not (tmp_path / "arts").exists() and said == []
    # room enough: the line is said, and the run goes on to its builds (here an executor that stops it there)
    monkeypatch.setattr(shutil, "disk_usage", roomy)

    def builds(*args, **kwargs):
        raise KeyboardInterrupt
    with pytest.raises(RunInterrupted):
        measure_plan(plan, executor=SimpleNamespace(run_all=builds, kill=lambda: None),
                     events=Events(on_note=said.append))
    assert said[0].startswith("disk: this run will take about") and said[0].endswith("500.0 GB free")


def _can_mount_tmpfs(folder: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


@pytest.mark.e2e
@pytest.mark.model
def test_bench_on_a_disk_too_small_says_one_line_and_exits_2(tmp_path):
    """A real small disk (a 4 MB tmpfs, where this process may mount one): the run folder would land there."""
    disk = tmp_path / "small"
    if not _can_mount_tmpfs(disk):
        pytest.skip("cannot mount a tmpfs here (needs root): the refusal is tested on a disk_usage stand-in above")
    try:
        suite = _suite(tmp_path, [{"name": "base"}, {"name": "half", "recipe": "bf16"}],
                       output={"dir": str(disk / "runs"), "store": str(tmp_path / "store.sqlite")})
        done = subprocess.run([sys.executable, "-m", "variantlab.cli", "bench", str(suite)], capture_output=True,
                              text=True, timeout=300, env=os.environ | {"COLUMNS": "200"})
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert lines[-1].startswith(f"error: {disk}: output.dir: the disk cannot hold this run: it will take about")
        assert "(accepted: a disk with at least" in lines[-1]
        assert not (disk / "runs").exists() and not (tmp_path / "store.sqlite").exists()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# ---------------------------------------------------------------- against real artifacts

VARIANTS = {"fp32": VariantDefinition("fp32", "fp32"), "bf16": VariantDefinition("bf16", "bf16"),
            "int8": VariantDefinition("int8", "int8"), "int4": VariantDefinition("int4", "int4", {"group_size": 32}),
            "w4a8": VariantDefinition("w4a8", "w4a8", {"group_size": 32})}
GGUFS = ("F16", "Q8_0", "Q4_K_M")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The tiny model's artifacts, each built once as a build worker builds it (GGUFs where llama.cpp's tools are)."""
    from variantlab.measure.wire import BuildJob
    from variantlab.measure.worker import run_job
    root, out = tmp_path_factory.mktemp("built"), {}
    definitions = dict(VARIANTS)
    try:
        from variantlab.variants import gguf_convert
        gguf_convert.find_converter()
        import llama_cpp  # noqa: F401
        definitions |= {f"gguf-{t}": VariantDefinition(f"gguf-{t}", f"gguf:{t}", backend="llamacpp",
                                                       backend_config={"gguf_type": t}) for t in GGUFS}
    except (ImportError, VariantlabError):
        pass
    for name, d in definitions.items():
        record, _ = run_job(BuildJob(variant=d.to_json(), source=str(TINY), artifact_dir=str(root / name),
                                     device="cpu", threads=1, seed=0))
        assert record.status == "ok", record.reason
        out[name] = root / name
    return out


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


@pytest.mark.model
@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_torch_estimate_is_the_weights_file_within_a_percent_and_holds_the_whole_artifact(built, name):
    d, weights = VARIANTS[name], read_weights(TINY)
    recipe = get_recipe(d.recipe)
    file = (built[name] / "model.safetensors").stat().st_size
    assert recipe.artifact_bytes(parse_options(recipe, d.options), weights) == pytest.approx(file, rel=0.01)
    whole = backend_kind("torch").artifact_size(d, TINY)
    assert folder_bytes(built[name]) <= whole.bytes <= folder_bytes(built[name]) + (2 << 20)


@pytest.mark.model
@pytest.mark.parametrize("gguf_type", GGUFS)
def test_a_gguf_estimate_is_within_a_fifth_of_the_file_and_with_the_margin_holds_the_artifact(built, gguf_type):
    from variantlab.variants.artifact import copied_bytes
    from variantlab.variants.gguf_convert import estimate
    if f"gguf-{gguf_type}" not in built:
        pytest.skip("llama.cpp's converter or llama-cpp-python is not installed (bash scripts/install_llamacpp.sh)")
    folder = built[f"gguf-{gguf_type}"]
    est = estimate(gguf_type, read_weights(TINY), copied_bytes(TINY))
    assert est.bytes == pytest.approx((folder / "model.gguf").stat().st_size, rel=0.2)
    d = VariantDefinition("g", f"gguf:{gguf_type}", backend="llamacpp", backend_config={"gguf_type": gguf_type})
    assert folder_bytes(folder) <= backend_kind("llamacpp").artifact_size(d, TINY).bytes * db.MARGIN


@pytest.mark.model
def test_the_reference_estimate_is_the_size_of_the_reference_the_job_writes(built, tmp_path):
    from variantlab.measure.wire import MeasureJob, TrackerJob
    from variantlab.measure.worker import run_job
    plan = plan_suite_file(_suite(tmp_path, [{"name": "base"}], samples=3))
    scoring = next(t for t in plan.trackers if t.writes_reference)
    budget = db.disk_budget(plan, tmp_path / "run", tmp_path / "s.sqlite", usage=roomy)
    record, _ = run_job(MeasureJob(variant=VARIANTS["fp32"].to_json(), artifact_dir=str(built["fp32"]), round=-1,
                                   device="cpu", threads=1, seed=0, samples=plan.samples,
                                   trackers=(TrackerJob(kind=scoring.kind, config=scoring.config()),), run_once=True,
                                   reference_dir=str(tmp_path / "reference"), writes_reference=True))
    assert record.status == "ok", record.reason
    assert budget.reference == (tmp_path / "reference" / LOGPROBS).stat().st_size > 0
