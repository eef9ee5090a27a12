"""Our CPU kernels are built by the command, once, before anything is timed (runner.prepare_kernels,
kernels.prepare): `variantlab build` and `bench` have them built before their first worker starts; a worker
that still has to build them (or wait for another process's build) leaves that time out of its cold start,
and the comparison says so. Driven with the tiny_kernels fixture (a one-function library through the
same build path), since gemv_avx512.cpp needs AVX-512."""
from __future__ import annotations

import pytest

from variantlab.measure.analysis import analyse
from variantlab.measure.executor import LocalProcessExecutor
from variantlab.measure.plan import plan_suite_file
from variantlab.measure.runner import Events, run_build
from variantlab.pipeline import run_plan
from variantlab.measure.trackers import ColdStart
from variantlab.measure.wire import BuildJob, MeasureJob, TrackerJob
from variantlab.measure.worker import run_job
from variantlab.variants import kernels
from variantlab.variants.build import VariantDefinition
from variantlab.variants.kernels import _build, _cache

from test_plan import write_suite

pytestmark = pytest.mark.model


class Stop(Exception):
    pass


class SeesKernelsFirst(LocalProcessExecutor):
    """The real local executor, stopped at its first batch of jobs: what the kernels' status was by then."""

    seen: object = "never called"

    def run_all(self, tasks, limits, on_done, on_start=None):
        self.seen = kernels._status
        raise Stop


def test_build_has_our_kernels_built_before_its_first_worker(tiny_kernels, tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, names=("fp32", "bf16")))
    said, executor = [], SeesKernelsFirst()
    with pytest.raises(Stop):
        run_build(plan, tmp_path / "artifacts", executor=executor, events=Events(on_note=said.append))
    assert executor.seen is not None and executor.seen.available and executor.seen.action == "built"
    assert said[0].startswith("disk: ")          # the disk budget is said first (measure/disk_budget.py)
    assert said[1].startswith("building variantlab's CPU kernels once (about 35 s) in ")
    assert said[2].startswith("built variantlab's CPU kernels in ")


def test_bench_has_our_kernels_built_before_its_first_worker(tiny_kernels, tmp_path):
    plan = plan_suite_file(write_suite(tmp_path, names=("fp32",), output={"dir": str(tmp_path / "runs"),
                                                                          "store": str(tmp_path / "s.sqlite")}))
    said, executor = [], SeesKernelsFirst()
    with pytest.raises(Stop):
        run_plan(plan, executor=executor, events=Events(on_note=said.append))
    assert executor.seen is not None and executor.seen.action == "built" and len(said) == 3   # disk, building, built


@pytest.fixture(scope="module")
def artifact(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("artifact") / "fp32"
    record, _ = run_job(BuildJob(variant=VariantDefinition("fp32", "fp32").to_json(), source=str(tiny_model_dir),
                                 artifact_dir=str(out), device="cpu", threads=1, seed=0))
    assert record.status == "ok", record.reason
    return out


def test_a_worker_that_had_to_wait_for_a_build_leaves_it_out_of_its_cold_start_and_the_comparison_says_so(
        artifact, tiny_kernels, monkeypatch):
    """Another live process holds the build (this test, holding the lock); the worker waits for it up to the
    bound, then runs aten: that wait is kept apart from "import" and the total, not hidden in them."""
    monkeypatch.setattr(_build, "WAIT_S", 0.5)
    folder = _cache.build_folder(tiny_kernels)
    folder.mkdir(parents=True)
    job = MeasureJob(variant=VariantDefinition("fp32", "fp32").to_json(), artifact_dir=str(artifact), round=1,
                     device="cpu", threads=1, seed=0, samples=({"id": "0", "prompt": "Q: hi\nA:", "answer": "x"},),
                     trackers=(TrackerJob(kind="cold_start", config={}),), run_once=True)
    with _cache.build_lock(folder, "another build", 1, lambda s: None):
        record, _ = run_job(job)
    assert record.status == "ok", record.reason
    cold = record.output("cold_start").data
    assert cold["kernels_build_s"] >= 0.5
    stages = ("import_s", "tokenizer_s", "load_s", "first_token_s")
    assert cold["total_s"] == pytest.approx(sum(cold[s] for s in stages))
    assert any(n.startswith("our CPU kernels are off in this process: pid ") for n in record.notes)
    comparison = analyse([ColdStart()], ["fp32"], "fp32", [], [record], lambda sha: b"")
    assert any(w.startswith("fp32: its worker had to build variantlab's CPU kernels") and w.endswith("(round 2)")
               for w in comparison.warnings), comparison.warnings
