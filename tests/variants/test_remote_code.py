"""A checkpoint that carries its own Python (config.json `auto_map`): refused unless the suite turns
`trust_remote_code` on; with it on, built, saved with its code files and measured; an artifact of such a
checkpoint never loads on its own word (issue 13: nothing executes code from a checkpoint unless asked).

The checkpoint here is the tiny Llama with a model class of its own, in modeling_tiny.py, which writes a
marker file when Python imports it: the marker says whether its code ran."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from variantlab.errors import VariantlabError
from variantlab.measure.plan import plan_suite_file
from variantlab.measure.wire import BuildJob, MeasureJob, TrackerJob
from variantlab.measure.worker import run_job
from variantlab.variants.artifact import artifact_problem
from variantlab.variants.build import VariantDefinition

pytestmark = pytest.mark.model

CONFIG_PY = "from transformers import LlamaConfig\n\nclass TinyConfig(LlamaConfig):\n    model_type = 'tinycustom'\n"
MODELING_PY = """import os
open(os.environ["VARIANTLAB_TEST_MARKER"], "a").write("imported\\n")
from transformers import LlamaForCausalLM
from .configuration_tiny import TinyConfig

class TinyForCausalLM(LlamaForCausalLM):
    config_class = TinyConfig
"""


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ran"
    monkeypatch.setenv("VARIANTLAB_TEST_MARKER", str(path))
    return path


@pytest.fixture(scope="module")
def remote_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("remote") / "model"
    shutil.copytree(tiny_model_dir, d)
    (d / "configuration_tiny.py").write_text(CONFIG_PY)
    (d / "modeling_tiny.py").write_text(MODELING_PY)
    cfg = json.loads((d / "config.json").read_text())
    cfg |= {"model_type": "tinycustom", "architectures": ["TinyForCausalLM"],
            "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig",
                         "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def suite_file(tmp_path: Path, model: Path, **extra) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": str(model), "variants": [{"name": "fp32"}], **extra}))
    return path


def test_a_checkpoint_with_its_own_python_is_refused_at_planning_unless_the_suite_trusts_it(
        tmp_path, remote_model_dir, marker):
    with pytest.raises(VariantlabError) as info:
        plan_suite_file(suite_file(tmp_path, remote_model_dir))
    text = info.value.one_line()
    assert "auto_map" in text and "trust_remote_code" in text and "\n" not in text
    plan = plan_suite_file(suite_file(tmp_path, remote_model_dir, trust_remote_code=True))
    assert plan.suite.trust_remote_code and [v.name for v in plan.variants] == ["fp32"]
    assert not marker.exists()          # planning reads files; it never imports the checkpoint's code


def measure_job(artifact: Path, trust: bool) -> MeasureJob:
    return MeasureJob(variant=VariantDefinition("fp32", "fp32").to_json(), artifact_dir=str(artifact), round=0,
                      device="cpu", threads=1, seed=0, samples=({"id": "0", "prompt": "a: 1\nQ: a?\nA:", "answer": "1"},),
                      trackers=(TrackerJob(kind="memory"),), run_once=False, trust_remote_code=trust)


def test_with_the_switch_on_it_is_built_with_its_code_and_measured(tmp_path, remote_model_dir, marker):
    out = tmp_path / "artifact"
    build = BuildJob(variant=VariantDefinition("fp32", "fp32").to_json(), source=str(remote_model_dir),
                     artifact_dir=str(out), device="cpu", threads=1, seed=0, trust_remote_code=True)
    record, _ = run_job(build)
    assert record.status == "ok", record.reason
    assert marker.exists()                                       # its code ran: the suite asked for it
    meta = json.loads((out / "variant.json").read_text())
    assert meta["remote_code"] == ["configuration_tiny.py", "modeling_tiny.py"]
    assert (out / "modeling_tiny.py").read_text() == MODELING_PY
    measured, _ = run_job(measure_job(out, trust=True))
    assert measured.status == "ok", measured.reason

    # the artifact never loads on its own word, and is not reused for a suite that does not trust it
    refused, _ = run_job(measure_job(out, trust=False))
    assert refused.status == "failed" and "trust_remote_code" in refused.reason
    problem = artifact_problem(out, "fp32", {}, remote_model_dir, "cpu")
    assert problem == "it runs its checkpoint's own Python, and the suite's trust_remote_code is off"
    assert artifact_problem(out, "fp32", {}, remote_model_dir, "cpu", trust_remote_code=True) is None


def test_with_the_switch_off_a_build_never_runs_the_code(tmp_path, remote_model_dir, marker):
    record, _ = run_job(BuildJob(variant=VariantDefinition("fp32", "fp32").to_json(), source=str(remote_model_dir),
                                 artifact_dir=str(tmp_path / "a"), device="cpu", threads=1, seed=0))
    assert record.status == "failed" and "trust_remote_code" in record.reason
    assert not marker.exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_measures_a_trusted_checkpoint_with_its_own_python_end_to_end(tmp_path, remote_model_dir, marker):
    import variantlab
    workload = {"dataset": {"generator": "structured", "n": 4, "seed": 0}, "max_new_tokens": 3,
                "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 0}], "accuracy": {"samples": 2}}
    suite = suite_file(tmp_path, remote_model_dir, trust_remote_code=True, rounds=1, threads=1, workload=workload,
                       output={"dir": str(tmp_path / "runs"), "store": str(tmp_path / "s.sqlite")})
    result = variantlab.bench(suite)
    assert result.comparison.status == {"fp32": "ok"}, result.comparison.reasons
    assert marker.read_text().count("imported") >= 2          # in the build's worker and the measurement's
