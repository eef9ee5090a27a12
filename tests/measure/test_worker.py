"""The measuring host (measure/worker.py), run in this process on a tiny model's artifact.

`run_job` is what a worker process (and next a Ray task) runs: these tests call it directly, so the
records it returns are checked without a subprocess; the executor tests cover the process around it.
"""
from __future__ import annotations

import pytest

from variantlab.measure.scenarios import SCENARIO_SPECS, scenario_tracker
from variantlab.measure.tracker import WorkloadSettings
from variantlab.measure.trackers import ColdStart, Facts, Grading, Memory, Scoring, Stability
from variantlab.measure.wire import BuildJob, MeasureJob, TrackerJob, decode_result, encode_result, job_trackers
from variantlab.measure.worker import failure_reason, run_job
from variantlab.variants.build import VariantDefinition

from conftest import nan_model_copy

pytestmark = pytest.mark.model

SAMPLES = tuple({"id": str(i), "prompt": f"a: {i}\nQ: What is the a?\nA:", "answer": str(i)} for i in range(4))
SETTINGS = WorkloadSettings(max_new_tokens=4, stop=("\n",))
TRACKERS = (ColdStart(), scenario_tracker(SCENARIO_SPECS["single-stream"](type="single-stream", requests=2, warmup=0),
                                          SETTINGS),
            Memory(), Facts(), Stability((16, 32)), Grading(4, 2, SETTINGS), Scoring(2))


@pytest.fixture(scope="module")
def artifact(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("artifact") / "int8"
    job = BuildJob(variant=VariantDefinition("int8", "int8").to_json(), source=str(tiny_model_dir),
                   artifact_dir=str(out), device="cpu", threads=1, seed=0)
    record, _ = run_job(job)
    assert record.status == "ok", record.reason
    return out


def measure(artifact, run_once: bool, variant=None, run=True, **fields):
    job = MeasureJob(variant=(variant or VariantDefinition("int8", "int8")).to_json(), artifact_dir=str(artifact),
                     round=1, device="cpu", threads=1, seed=0, samples=SAMPLES,
                     trackers=tuple(TrackerJob(kind=t.kind, config=t.config()) for t in TRACKERS), run_once=run_once,
                     **fields)
    return job, (run_job(job) if run else None)


def test_a_measurement_hosts_every_tracker_and_its_record_validates(artifact, tmp_path):
    reference = tmp_path / "reference"
    made, _ = run_job(MeasureJob(variant=VariantDefinition("int8", "int8").to_json(), artifact_dir=str(artifact),
                                 round=-1, device="cpu", threads=1, seed=0, samples=SAMPLES,
                                 trackers=(TrackerJob(kind="scoring", config=Scoring(2).config()),), run_once=True,
                                 reference_dir=str(reference), writes_reference=True))
    assert made.status == "ok" and made.output("scoring").error is None
    job, (record, blobs) = measure(artifact, run_once=True, reference_dir=str(reference), same_checkpoint=True)
    assert record.status == "ok", record.reason
    assert [o.name for o in record.outputs] == [t.name for t in TRACKERS]
    assert record.round == 1 and record.ran_once and record.device == "cpu"
    assert any("_weight_int8pack_mm" in k for k in record.kernels)
    # the read-bandwidth probe ran after every tracker (its buffer is not in the memory peak), into the scenario
    single = record.output("single-stream").data
    assert single["read_gbps"] > 0 and single["weight_bytes_per_token"] > 0
    # scoring compared itself with the reference in the worker: figures travel, no distribution (issue 49)
    scoring = record.output("scoring").data
    assert blobs == {} and record.blobs == {} and scoring["logprobs_blob"] is None
    assert scoring["reference"] == made.output("scoring").data["reference"] and scoring["split"] == "reference"
    assert scoring["kld_mean"] == pytest.approx(0.0, abs=1e-12) and scoring["top1_agreement"] == 1.0
    again, again_blobs = decode_result(encode_result(record, blobs), job_trackers(job))
    assert again == record and again_blobs == blobs


def test_cold_start_is_timed_in_stages_from_the_process_start(artifact):
    _, (record, _) = measure(artifact, run_once=False)
    cold = record.output("cold_start").data
    stages = ("import_s", "tokenizer_s", "load_s", "first_token_s")
    assert all(cold[s] > 0 for s in stages) and cold["compile_s"] is None
    assert cold["total_s"] == pytest.approx(sum(cold[s] for s in stages))
    assert "process's own start" in cold["clock"]


def test_cold_start_counts_from_the_workers_own_start_not_a_rounded_boot_time(artifact, tmp_path):
    """In a fresh worker process: its start, as the kernel records it, lies between the parent's call and
    the call's return (psutil's create_time put it 0.4 s early here: boot time is whole seconds)."""
    from variantlab.measure.executor import LocalProcessExecutor
    from variantlab.measure.worker import process_clock

    job, _ = measure(artifact, run_once=False, run=False)
    before = process_clock()
    record, _ = LocalProcessExecutor().run(job, tmp_path / "job", 300)
    after = process_clock()
    assert record.status == "ok", record.reason
    cold = record.output("cold_start").data
    assert before - 0.011 <= cold["process_start"] <= before + 2.0   # the kernel's 10 ms ticks
    assert 0 < cold["import_s"] < cold["total_s"] < after - before


def test_memory_is_read_above_the_post_import_baseline_and_names_what_it_covered(artifact):
    _, (record, _) = measure(artifact, run_once=False)
    mem = record.output("memory").data
    assert 0 < mem["baseline_bytes"] <= mem["peak_bytes"]
    assert mem["covered"] and mem["covered"][0].startswith("single-stream: batches of 1 ×")


def test_once_per_variant_trackers_run_only_when_asked(artifact):
    _, (record, blobs) = measure(artifact, run_once=False)
    assert [o.name for o in record.outputs] == ["cold_start", "single-stream", "memory"]
    assert not record.ran_once and blobs == {}


def test_a_kernel_that_raises_is_a_failed_measurement_with_the_tail_of_its_traceback(artifact, monkeypatch):
    from variantlab.variants import quant_linear

    def broken(self, x):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr(quant_linear.Int8WeightOnly, "_mm", broken)
    _, (record, _) = measure(artifact, run_once=False)
    assert record.status == "failed"
    assert record.reason.startswith("RuntimeError: kernel exploded (at test_worker.py:")
    assert "quant_linear.py" in record.reason


def test_only_a_capability_check_says_unsupported(tiny_model_dir, tmp_path):
    job = BuildJob(variant=VariantDefinition("sparse", "sparse").to_json(), source=str(tiny_model_dir),
                   artifact_dir=str(tmp_path / "sparse"), device="cpu", threads=1, seed=0)
    record, _ = run_job(job)
    assert record.status == "unsupported" and "unsupported on this hardware" in record.reason


def test_failure_reason_of_a_library_error_is_its_one_line():
    from variantlab.errors import RecipeError
    assert failure_reason(RecipeError("bad", field="x", accepted="y")) == "x: bad (accepted: y)"


def test_a_once_per_variant_check_that_raises_keeps_the_rounds_timing(artifact, monkeypatch):
    def broken(self, ctx):
        raise RuntimeError("scoring exploded")
    monkeypatch.setattr(Scoring, "run", broken)
    _, (record, blobs) = measure(artifact, run_once=True)
    assert record.status == "ok" and blobs == {}
    scoring = record.output("scoring")
    assert scoring.data == {} and scoring.error.startswith("RuntimeError: scoring exploded")
    assert record.output("single-stream").error is None and record.output("grading") is not None


def test_a_scenario_that_raises_keeps_the_rounds_other_trackers(artifact, monkeypatch):
    """A failing scenario is that scenario's error; the trackers before and after it keep their results
    (issue 13: the valid results of the variant were lost with it). Here it is the round's only scenario, so
    the round measured none of the workload: failed, with its reason (issue 22), its record still whole."""
    scenario = type(TRACKERS[1])

    def broken(self, ctx):
        raise IndexError("index out of range in self")
    monkeypatch.setattr(scenario, "run", broken)
    _, (record, _) = measure(artifact, run_once=False)
    assert record.status == "failed"
    assert record.reason.startswith("every scenario failed; single-stream: IndexError: index out of range in self")
    assert record.output("single-stream").error.startswith("IndexError: index out of range in self")
    assert record.output("cold_start").error is None and record.output("memory").error is None


@pytest.fixture(scope="module")
def gpt2_artifact(family_dirs, tmp_path_factory):
    """An fp32 artifact of the tiny GPT-2 (a learned position table of 128 rows)."""
    out = tmp_path_factory.mktemp("gpt2-artifact") / "fp32"
    record, _ = run_job(BuildJob(variant=VariantDefinition("fp32", "fp32").to_json(), source=str(family_dirs["gpt2"]),
                                 artifact_dir=str(out), device="cpu", threads=1, seed=0))
    assert record.status == "ok", record.reason
    return out


def measure_gpt2(artifact, *scenarios):
    """A once round of the tiny GPT-2 whose scenarios decode 200 tokens (no stop string) after the SAMPLES'
    prompts: past its 128 positions, as max_new_tokens 1,000 was past GPT-2's 1,024 (issue 22)."""
    past = WorkloadSettings(max_new_tokens=200, stop=())
    specs = {"single-stream": {"requests": 1, "warmup": 0}, "offline": {"batch_size": 2, "passes": 1, "warmup": 0},
             "length-sweep": {"lengths": [16], "decode_tokens": 4, "repeats": 1, "warmup": 0}}
    trackers = (ColdStart(), *(scenario_tracker(SCENARIO_SPECS[k](type=k, **specs[k]), past) for k in scenarios),
                Memory(), Facts(), Stability((16, 32)))
    job = MeasureJob(variant=VariantDefinition("fp32", "fp32").to_json(), artifact_dir=str(artifact), round=0,
                     device="cpu", threads=1, seed=0, samples=SAMPLES,
                     trackers=tuple(TrackerJob(kind=t.kind, config=t.config()) for t in trackers), run_once=True)
    return job, run_job(job)


def test_a_round_whose_every_scenario_raised_is_failed_and_keeps_what_it_measured(gpt2_artifact):
    """Issue 22: every scenario raised IndexError (GPT-2, prompt + max_new_tokens past its table) and the round
    was "ok", so the run read `fp32 (ok)` and exited 0. Now: failed, with the first scenario's reason; the
    record (stored as it is) keeps the other trackers' results."""
    job, (record, blobs) = measure_gpt2(gpt2_artifact, "single-stream", "offline")
    assert record.status == "failed"
    assert record.reason.startswith("every scenario failed; single-stream: IndexError: index out of range in self")
    assert [o.name for o in record.outputs] == ["cold_start", "single-stream", "offline", "memory", "facts",
                                                "stability"]
    assert all(record.output(n).error.startswith("IndexError") for n in ("single-stream", "offline"))
    assert all(record.output(n).error is None for n in ("cold_start", "memory", "facts", "stability"))
    assert record.ran_once and record.kernels
    again, _ = decode_result(encode_result(record, blobs), job_trackers(job))    # what the executor reads back
    assert again == record


def test_one_scenario_that_ran_keeps_the_round(gpt2_artifact):
    """A length sweep within the table ran; the single-stream past it raised: the round is "ok" and the
    single-stream's error is its own (the report warns about it)."""
    _, (record, _) = measure_gpt2(gpt2_artifact, "single-stream", "length-sweep")
    assert record.status == "ok" and record.reason is None
    assert record.output("single-stream").error.startswith("IndexError: index out of range in self")
    assert record.output("length-sweep").error is None and record.output("length-sweep").data["passes"]


@pytest.fixture(scope="module")
def nan_artifact(tiny_model_dir, tmp_path_factory):
    """An fp32 artifact of the tiny model whose LM head has one row of NaN: every position's logits hold a NaN."""
    src = nan_model_copy(tiny_model_dir, tmp_path_factory.mktemp("nan-model"))
    out = tmp_path_factory.mktemp("nan-artifact") / "fp32"
    record, _ = run_job(BuildJob(variant=VariantDefinition("fp32", "fp32").to_json(), source=str(src),
                                 artifact_dir=str(out), device="cpu", threads=1, seed=0))
    assert record.status == "ok", record.reason
    return out


def test_nan_logits_fail_the_measurement_with_the_reason(nan_artifact):
    _, (record, blobs) = measure(nan_artifact, run_once=True, variant=VariantDefinition("fp32", "fp32"))
    assert (record.status, blobs) == ("failed", {})
    assert record.reason.startswith("NonFiniteLogits: NaN or inf logits after the prompt of 1 request(s)")


# ---------------------------------------------------------------- one tracker loop for every backend

class Explodes:
    """A registered tracker that raises when it runs, on any backend."""
    kind = name = "explodes"
    once = False
    needs_local_model = False

    def config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config: dict):
        return cls()

    def run(self, ctx):
        raise RuntimeError("this tracker always raises")


def test_an_endpoints_raising_tracker_is_its_own_error_as_it_is_for_a_local_variant(monkeypatch):
    """Issue 23: the endpoint's tracker loop was a copy in which one raising tracker failed the whole
    measurement; both now run measure/worker.run_trackers: that tracker's error, the others' results, and a
    tracker needing the model in-process says why it was not measured."""
    from variantlab.backends.openai_http import Endpoint, OpenAIBackend
    from variantlab.measure import trackers
    from variantlab.measure.worker import Host, run_trackers
    monkeypatch.setitem(trackers.TRACKERS, "explodes", Explodes)
    backend = OpenAIBackend(Endpoint("http://127.0.0.1:9/v1", "auto", None, 5.0))   # nothing listens there
    samples = ({"id": "0", "prompt": "p", "answer": "a"},)
    job = MeasureJob(variant={"name": "e"}, artifact_dir="", round=0, device="cpu", threads=1, seed=0,
                     samples=samples, trackers=(TrackerJob(kind="explodes"), TrackerJob(kind="memory"),
                                                TrackerJob(kind="machine"),
                                                TrackerJob(kind="scoring", config={"samples": 1})), run_once=True)
    try:
        results, scenarios = run_trackers(Host(backend, None, samples, "endpoint", None, 0), job, remote=True)
    finally:
        backend.close()
    by = {r.name: r for r in results}
    assert by["explodes"].error.startswith("RuntimeError: this tracker always raises") and by["explodes"].data == {}
    assert by["memory"].error.startswith("not measured for an endpoint: ")
    # scoring asks the endpoint for top-k log-probabilities (issue 24); one that gives none is one line
    assert by["scoring"].error.startswith("not measured for an endpoint: the endpoint returned no prompt "
                                          "log-probabilities") and "\n" not in by["scoring"].error
    assert by["machine"].error is None and by["machine"].data["small_ops_s"] and scenarios == []
