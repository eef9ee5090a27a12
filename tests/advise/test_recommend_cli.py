"""`variantlab recommend` and `variantlab requirements` end to end: a real bench run whose suite has
requirements, the CLI as a user runs it; bad input exits 2 with one line."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.test_cli import assert_one_line_error, run_cli, write_suite
from variantlab.suite import Requirements

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SUITE = """\
name: recommend-e2e
model: {model}
baseline: fp32
rounds: 2
variants:
  - {{name: fp32, recipe: fp32}}
  - {{name: bf16, recipe: bf16}}
  - {{name: sliding, recipe: fp32, attention: "sliding:16"}}
workload:
  dataset: {{generator: structured, n: 8}}
  max_new_tokens: 24
  scenarios:
    - {{type: single-stream, requests: 4, warmup: 1}}
    - {{type: offline, batch_size: 4, passes: 1, warmup: 0}}
    - {{type: length-sweep, lengths: [16, 64], decode_tokens: 2, repeats: 2, warmup: 0}}
  accuracy: {{samples: 4, graded: 8, batch_size: 8}}
requirements:
  max_kld: 100
  max_e2el_s: {{p95: 1000}}
  objective: latency
output: {{dir: runs}}
"""


@pytest.fixture(scope="module")
def bench_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recommend")
    suite = write_suite(tmp, SUITE.format(model=tiny_model_dir))
    proc = run_cli("bench", suite, "--store", tmp / "s.sqlite", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp / "runs").iterdir())
    return tmp, run_dir.name, run_dir, proc


def test_bench_with_requirements_ends_with_the_recommendation(bench_run):
    tmp, run_id, run_dir, proc = bench_run
    assert "Recommendation" in proc.stdout and "pick: " in proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    rec = results["recommendation"]
    assert rec["schema"] == "variantlab.recommendation/1" and rec["pick"] in ("fp32", "bf16", "sliding")
    assert set(rec["verdicts"]) == {"fp32", "bf16", "sliding"} and rec["front"]
    assert "## Recommendation" in (run_dir / "report.md").read_text()


def test_recommend_prints_the_pick_the_matrix_and_the_attention_guideline(bench_run):
    tmp, run_id, _, _ = bench_run
    proc = run_cli("recommend", run_id, "--store", tmp / "s.sqlite", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "pick: " in out and "Pareto front over" in out and "Selection matrix, measured" in out
    assert "Attention, measured" in out and "sliding (sliding:16) decode against fp32" in out
    data = json.loads(run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "--json", cwd=tmp).stdout)
    assert [m["preset"] for m in data["selection_matrix"]] == ["high-precision", "balanced", "resource-constrained",
                                                                "extreme-compression", "real-time"]
    assert {c["variant"] for c in data["attention"]["crossovers"]} == {"sliding"}


def test_requirements_no_variant_meets_still_answer(bench_run):
    tmp, run_id, _, _ = bench_run
    req = write_suite(tmp, "requirements:\n  max_model_size_mib: 0.01\n", name="tight.yaml")   # exact: no doubt
    proc = run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "--requirements", req, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no pick — no variant meets every requirement. Closest: bf16" in proc.stdout   # the smallest
    assert "The binding constraint is Model size (weights as stored) ≤ 10.24 KiB: 3 of 3 variants miss it" \
        in proc.stdout


def test_a_pick_without_accuracy_data_leads_with_that_caveat_in_the_terminal_and_the_json(bench_run):
    tmp, run_id, _, _ = bench_run       # random weights: the baseline answers nothing right, so no retention
    req = write_suite(tmp, "requirements:\n  objective: size\n", name="size.yaml")   # bf16: the smallest, exactly
    proc = run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "-r", req, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = proc.stdout.splitlines()[1]                 # under the title
    assert first.startswith("caution: the pick bf16 rests on thin evidence: no accuracy data: accuracy retention "
                            "cannot be computed for bf16 (the baseline answered no sample correctly)"), proc.stdout
    assert "grade samples with answers the baseline gets right" in first
    data = json.loads(run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "-r", req, "--json", cwd=tmp).stdout)
    assert [c["code"] for c in data["caveats"]] == ["no_accuracy"] and data["lines"][0] == first


def test_a_preset_on_the_command_line(bench_run):
    tmp, run_id, _, _ = bench_run
    proc = run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "--preset", "extreme-compression", cwd=tmp)
    assert proc.returncode == 0 and "preset extreme-compression" in proc.stdout
    assert_one_line_error(run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "--preset", "fast", cwd=tmp),
                          "--preset", "balanced")


def test_bad_requirements_files_exit_2_with_one_line(bench_run):
    tmp, run_id, _, _ = bench_run
    bad = write_suite(tmp, "max_e2el_s: {p42: 1}\n", name="bad.yaml")
    assert_one_line_error(run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "-r", bad, cwd=tmp),
                          "bad.yaml", "requirements.max_e2el_s.p42")
    assert_one_line_error(run_cli("recommend", run_id, "--store", tmp / "s.sqlite", "-r", tmp / "none.yaml",
                                  cwd=tmp), "none.yaml", "no such requirements file")
    assert_one_line_error(run_cli("recommend", "nope", "--store", tmp / "s.sqlite", cwd=tmp), "nope")


def test_requirements_prints_a_block_a_suite_can_hold(tmp_path):
    proc = run_cli("requirements", "resource-constrained", cwd=tmp_path)
    assert proc.returncode == 0 and "INT4 asymmetric" in proc.stdout
    block = yaml.safe_load(proc.stdout)["requirements"]
    assert Requirements.model_validate(block).min_accuracy_retention == 0.92
    listing = run_cli("requirements", cwd=tmp_path).stdout
    assert all(p in listing for p in ("high-precision", "balanced", "real-time"))
    assert_one_line_error(run_cli("requirements", "fast", cwd=tmp_path), "PRESET", "extreme-compression")
