"""`variantlab build` as a user runs it (a subprocess), and bench measuring built variants from their
artifacts: cold start is the artifact's load, model size its size on disk, build time kept apart."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from variantlab.measure.plan import plan_suite_file
from variantlab.pipeline import run_bench, run_plan
from variantlab.measure.wire import BuildJob, BuildRecord, MeasurementRecord
from variantlab.report.format import fmt_value
from variantlab.store import Store

pytestmark = pytest.mark.e2e

TINY_WORKLOAD = {
    "dataset": {"generator": "structured", "n": 4, "seed": 0},
    "max_new_tokens": 4,
    "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 1}],
    "accuracy": {"samples": 2},
}
BUILT = [{"name": "fp32"}, {"name": "int8", "recipe": "int8"},
         {"name": "int4", "recipe": "int4", "options": {"group_size": 64}},
         {"name": "sparse", "recipe": "sparse"}]  # CUDA only: reported, and the others go on


def _write_suite(tmp_path: Path, variants: list[dict], name: str = "suite.yaml") -> Path:
    suite = {"name": "tiny", "model": "builtin:tiny-structured", "variants": variants, "workload": TINY_WORKLOAD,
             "threads": 1, "device": "cpu", "rounds": 1,
             "output": {"dir": str(tmp_path / "runs"), "store": str(tmp_path / "store.sqlite")}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(suite))
    return path


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "variantlab.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`variantlab build SUITE --out DIR` on fp32, int8, int4 (and sparse, which cannot build on a CPU)."""
    tmp = tmp_path_factory.mktemp("build")
    suite = _write_suite(tmp, BUILT)
    out = tmp / "artifacts"
    return suite, out, _cli("build", suite, "--out", out, cwd=tmp)


@pytest.mark.slow
def test_build_writes_one_artifact_per_variant_and_prints_the_table(built):
    suite, out, proc = built
    assert proc.returncode == 1, proc.stderr           # one variant unsupported here: not all built
    assert "1 of 4 variants did not finish: sparse (unsupported" in proc.stderr
    for header in ("variant", "recipe", "bits per weight", "size on disk", "build time"):
        assert header in proc.stdout
    lines = {ln.split("│")[1].strip(): ln for ln in proc.stdout.splitlines() if ln.count("│") > 5}
    for name, recipe in (("fp32", "fp32"), ("int8", "int8"), ("int4", "int4")):
        meta = json.loads((out / name / "variant.json").read_text())
        assert meta["recipe"] == recipe and meta["device_type"] == "cpu"
        size = (out / name / "model.safetensors").stat().st_size
        assert meta["weights"]["bytes_on_disk"] == size
        assert fmt_value(size, "B") in lines[name] and " ok " in lines[name]
        assert (out / name / "tokenizer.json").is_file() and (out / name / "config.json").is_file()
    assert "unsupported" in lines["sparse"] and "CUDA" in proc.stdout
    assert not (out / "sparse").exists()
    assert "built 3 of 4 variants" in proc.stdout
    sizes = {n: (out / n / "model.safetensors").stat().st_size for n in ("fp32", "int8", "int4")}
    assert sizes["int4"] < sizes["int8"] < sizes["fp32"] / 3


def test_build_out_under_a_file_is_one_line_and_exit_2(tmp_path):
    """Issue 13: this was a NotADirectoryError traceback."""
    from tests.test_cli import assert_one_line_error
    (tmp_path / "afile").write_text("x")
    suite = _write_suite(tmp_path, [{"name": "fp32"}])
    assert_one_line_error(_cli("build", suite, "--out", "afile/x", cwd=tmp_path), "--out",
                          "cannot create the artifacts folder", "afile/x")


def test_build_of_a_missing_suite_is_one_line_and_exit_2(tmp_path):
    proc = _cli("build", tmp_path / "nope.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no such suite file" in proc.stderr
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.slow
def test_bench_measures_built_variants_from_their_artifacts(built, tmp_path):
    """fp32 and int4 reuse the artifacts `build` wrote; w4a8 has none there and is built in the run folder.
    Every variant, dtype ones too, is measured from an artifact stored in its own dtype."""
    _, artifacts, proc = built
    assert proc.returncode == 1, proc.stderr           # sparse is unsupported here; the others built
    suite = _write_suite(tmp_path, [{"name": "fp32"}, {"name": "int4", "recipe": "int4", "options": {"group_size": 64}},
                                    {"name": "w4a8", "recipe": "w4a8"}])
    result = run_bench(suite, artifacts_dir=artifacts)
    c = result.comparison
    assert c.status == {"fp32": "ok", "int4": "ok", "w4a8": "ok"}, c.reasons
    with Store(result.store_path) as store:
        builds = {b.variant: b for b in store.records(result.run_id, "build")}
    # reused, unless the background training rewrote the reference weights since `build` ran
    for name in ("fp32", "int4"):
        assert builds[name].reused or any("fingerprint" in why for why in builds[name].not_reused)
    w4a8 = builds["w4a8"]
    assert not w4a8.reused and Path(w4a8.artifact_dir) == (result.output_dir / "variants" / "w4a8" / "artifact").resolve()
    for name in ("int4", "w4a8"):
        size = (Path(builds[name].artifact_dir) / "model.safetensors").stat().st_size
        assert c.row("model_size").cells[name].value == size == builds[name].bytes_on_disk
        assert c.row("cold_start.load").cells[name].value > 0
    assert w4a8.timings["build_s"] > 0 and c.builds["w4a8"]["build_s"] == w4a8.timings["build_s"]
    assert c.row("model_size").deltas["int4"].pct < -70


@pytest.mark.slow
def test_bench_reuses_a_verified_artifact_and_rebuilds_a_tampered_one_saying_why(tmp_path):
    """Issue 13: an artifact whose facts were edited (bits_per_weight: 1, a made-up kernel) was measured as
    it said. Now it fails its content hash and is rebuilt in the run folder; the untouched one is reused;
    both are said under the table, and the facts measured are the rebuilt ones."""
    suite = _write_suite(tmp_path, [{"name": "fp32"}, {"name": "int8", "recipe": "int8"}])
    artifacts = tmp_path / "artifacts"
    proc = _cli("build", suite, "--out", artifacts, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    meta_file = artifacts / "int8" / "variant.json"
    meta = json.loads(meta_file.read_text())
    meta["facts"].update(bits_per_weight=1, kernels=["made_up_fast_kernel"])
    meta_file.write_text(json.dumps(meta))
    proc = _cli("bench", suite, "--artifacts", artifacts, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())   # the status lines may wrap
    # reused unless the background training rewrote the reference weights since `build` ran
    assert (f"fp32: artifact reused from {(artifacts / 'fp32').resolve()} (hashes verified)" in out
            or "fingerprint changed" in out), out
    assert ("int8: artifact rebuilt into " in out and
            f"not reused: {artifacts / 'int8'}: variant.json was edited after the build" in out), out
    assert "made_up_fast_kernel" not in out
    with Store(tmp_path / "store.sqlite") as store:
        (run,) = store.runs()
        builds = {b.variant: b for b in store.records(run.run_id, "build")}
    int8 = builds["int8"]
    assert not int8.reused and int8.facts["bits_per_weight"] > 4 and "made_up_fast_kernel" not in int8.facts["kernels"]


class _FakeExecutor:
    """Answers build and measure jobs without processes; a build of `fail` is unsupported."""

    def __init__(self, fail: str):
        self.fail, self.jobs = fail, []

    def run(self, job, workdir, timeout_s, progress=None):
        self.jobs.append(job)
        name = job.variant["name"]
        if isinstance(job, BuildJob):
            if name == self.fail:
                return BuildRecord(variant=name, status="unsupported", reason="no kernel here"), {}
            return BuildRecord(variant=name, status="ok", artifact_dir=job.artifact_dir, bytes_on_disk=123,
                               timings={"build_s": 1.5}), {}
        return MeasurementRecord(variant=name, round=job.round, status="failed", reason="fake measurement"), {}

    def run_all(self, tasks, limits, on_done, on_start=None):
        for task in tasks:       # one at a time, in the stream's order
            if on_start:
                on_start(task)
            on_done(task, *self.run(task.job, task.workdir, limits, task.progress))

    def kill(self):
        pass


def test_a_failed_build_is_the_variants_status_and_the_others_go_on(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "fp32"}, {"name": "int8", "recipe": "int8"},
                                    {"name": "int4", "recipe": "int4"}])
    ex = _FakeExecutor(fail="int8")
    result = run_plan(plan_suite_file(suite), executor=ex)
    jobs = [(j.kind, j.variant["name"], getattr(j, "writes_reference", False)) for j in ex.jobs]
    assert jobs[:4] == [("build", "fp32", False), ("build", "int8", False), ("build", "int4", False),
                        ("measure", "fp32", True)]                                     # the baseline's reference
    assert sorted(jobs[4:]) == [("measure", "fp32", False), ("measure", "int4", False)]   # the round, in its drawn order
    assert next(j for j in ex.jobs[4:] if j.variant["name"] == "int4").artifact_dir == ex.jobs[2].artifact_dir
    c = result.comparison
    assert c.status == {"fp32": "failed", "int8": "unsupported", "int4": "failed"}
    assert c.reasons["int8"] == "build: no kernel here" and c.reasons["int4"] == "fake measurement"
