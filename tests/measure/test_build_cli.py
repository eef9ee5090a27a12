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

from variantlab.measure.runner import plan_suite_file, run_bench, run_plan
from variantlab.measure.worker import RESULT_VERSION
from variantlab.report.format import fmt_value

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
             "threads": 1, "device": "cpu",
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


def test_build_writes_one_artifact_per_variant_and_prints_the_table(built):
    suite, out, proc = built
    assert proc.returncode == 0, proc.stderr
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


def test_build_of_a_missing_suite_is_one_line_and_exit_2(tmp_path):
    proc = _cli("build", tmp_path / "nope.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no such suite file" in proc.stderr
    assert not (tmp_path / "artifacts").exists()


def test_bench_measures_built_variants_from_their_artifacts(built, tmp_path):
    """int4 reuses the artifact `build` wrote; w4a8 has none there and is built in the run folder;
    fp32 (a dtype recipe) loads from the checkpoint, which is its artifact."""
    _, artifacts, proc = built
    assert proc.returncode == 0, proc.stderr
    suite = _write_suite(tmp_path, [{"name": "fp32"}, {"name": "int4", "recipe": "int4", "options": {"group_size": 64}},
                                    {"name": "w4a8", "recipe": "w4a8"}])
    result = run_bench(suite, artifacts_dir=artifacts)
    c, r = result.comparison, result.results
    assert c.status == {"fp32": "ok", "int4": "ok", "w4a8": "ok"}
    assert "build" not in r["fp32"]
    int4, w4a8 = r["int4"]["build"], r["w4a8"]["build"]
    # reused, unless the background training rewrote the reference weights since `build` ran
    assert int4["reused"] or any("fingerprint" in why for why in int4["not_reused"])
    assert not w4a8["reused"] and Path(w4a8["artifact_path"]) == result.output_dir / "variants" / "w4a8" / "artifact"
    for name, b in (("int4", int4), ("w4a8", w4a8)):
        size = (Path(b["artifact_path"]) / "model.safetensors").stat().st_size
        assert c.row("model_size").cells[name].value == size == b["bytes_on_disk"]
        assert r[name]["facts"]["extra"]["artifact_bytes_on_disk"] == size
        assert r[name]["build_s"] == b["build_s"] > 0  # kept apart from cold start and warm figures
        assert r[name]["cold_start"]["load_s"] > 0
    assert (result.output_dir / "variants" / "w4a8" / "build" / "result.json").is_file()
    assert c.row("model_size").deltas["int4"].pct < -70


class _FakeExecutor:
    """Answers build and measure specs without processes; a build of `fail` is unsupported."""

    def __init__(self, fail: str):
        self.fail, self.specs = fail, []

    def run(self, spec, workdir, timeout_s, progress=None):
        self.specs.append(spec)
        name = spec["variant"]["name"]
        if spec.get("mode") == "build":
            if name == self.fail:
                return {"version": RESULT_VERSION, "status": "unsupported", "reason": "no kernel here"}
            return {"version": RESULT_VERSION, "status": "ok", "artifact_path": spec["artifact_dir"], "build_s": 1.5,
                    "bytes_on_disk": 123}
        return {"version": RESULT_VERSION, "status": "failed", "reason": "fake measurement"}


def test_a_failed_build_is_the_variants_status_and_the_others_go_on(tmp_path):
    suite = _write_suite(tmp_path, [{"name": "fp32"}, {"name": "int8", "recipe": "int8"},
                                    {"name": "int4", "recipe": "int4"}])
    ex = _FakeExecutor(fail="int8")
    result = run_plan(plan_suite_file(suite), executor=ex)
    assert [(s.get("mode", "measure"), s["variant"]["name"]) for s in ex.specs] == [
        ("measure", "fp32"), ("build", "int8"), ("build", "int4"), ("measure", "int4")]
    assert "artifact_path" not in ex.specs[0]["variant"]  # a dtype recipe loads from its checkpoint
    assert ex.specs[3]["variant"]["artifact_path"] == ex.specs[2]["artifact_dir"]
    assert result.results["int8"]["status"] == "unsupported"
    assert result.results["int8"]["reason"] == "build: no kernel here"
    assert result.results["int4"]["build"]["build_s"] == 1.5 == result.results["int4"]["build_s"]
