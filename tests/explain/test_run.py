"""`variantlab explain` and `explain: true` end to end: a real bench run, real profiling workers, the CLI
as a user runs it; bad input exits 2 with one line."""
from __future__ import annotations

import json

import pytest

from tests.test_cli import assert_one_line_error, run_cli, write_suite
from variantlab.explain import categories as C

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SUITE = """\
name: explain-e2e
model: {model}
baseline: fp32
rounds: 2
explain: true
variants:
  - {{name: fp32, recipe: fp32}}
  - {{name: int8-python, recipe: int8, options: {{dequant: python, compute_dtype: fp32}}}}
workload:
  dataset: {{generator: structured, n: 8}}
  max_new_tokens: 4
  scenarios:
    - {{type: single-stream, requests: 4, warmup: 1}}
    - {{type: offline, batch_size: 4, passes: 1, warmup: 0}}
  accuracy: {{samples: 0, graded: 0}}
output: {{dir: runs}}
"""


@pytest.fixture(scope="module")
def bench_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("explain")
    suite = write_suite(tmp, SUITE.format(model=tiny_model_dir))
    proc = run_cli("bench", suite, "--store", tmp / "s.sqlite", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp / "runs").iterdir())
    return tmp, run_dir.name, run_dir, proc


def test_explain_true_explains_exactly_the_slower_variants(bench_run):
    from variantlab.measure.analysis import Comparison
    from variantlab.measure.runner import slower_than_baseline
    tmp, run_id, run_dir, proc = bench_run
    results = json.loads((run_dir / "results.json").read_text())
    slower = slower_than_baseline(Comparison.from_json(results["comparison"]))
    explained = [e["b"] for e in results.get("explanations", [])]
    assert explained == slower
    report = (run_dir / "report.md").read_text()
    assert "explain: true" in report
    for name in slower:
        assert (run_dir / "explain" / f"fp32-vs-{name}" / "explanation.md").is_file()
        assert f"why {name} is slower than fp32" in proc.stdout
    if not slower:
        assert "nothing to explain" in report


def test_explain_cli_attributes_every_phase(bench_run):
    tmp, run_id, run_dir, _ = bench_run
    # one round a variant (the bench's `explain: true` ran the default two): each round profiles in processes of
    # its own, and CI must stay under 30 minutes
    proc = run_cli("explain", run_id, "fp32", "int8-python", "--store", tmp / "s.sqlite", "--ops", "--rounds", "1",
                   cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for phase in ("single-stream · prefill", "single-stream · decode", "offline · prefill", "offline · decode"):
        assert phase in out
    assert "Hardware counters" in out and "Roofline, fp32" in out and "calls a token" in out
    folder = run_dir / "explain" / "fp32-vs-int8-python"
    data = json.loads((folder / "explanation.json").read_text())
    assert data["rounds"] == {"fp32": 1, "int8-python": 1}
    for p in data["phases"]:
        cats = {c["category"] for c in p["categories"]}
        assert C.OTHER not in cats
        assert sum(c["a"] for c in p["categories"]) == pytest.approx(p["a_s_per_token"], rel=1e-6)
        assert sum(c["b"] for c in p["categories"]) == pytest.approx(p["b_s_per_token"], rel=1e-6)
        assert sum(c["difference"] for c in p["categories"]) == pytest.approx(p["difference_s_per_token"], rel=1e-6,
                                                                             abs=1e-12)
        if not p["near_zero"]:
            assert p["accounted"]["share"] >= 0.9
    # python dequantization runs inside the quantized linears: its cost is quantize/dequantize, in every phase
    assert all(any(c["category"] == C.QUANT and c["b"] > 0 for c in p["categories"]) for p in data["phases"])
    for c in data["counters"].values():
        for reading in c.values():
            assert reading["reason"] or reading["per_token"]       # counted, or why not: never a silent blank


@pytest.mark.parametrize("args, needles", [
    (("fp32", "nope"), ("no variant 'nope'", "B", "int8-python")),
    (("nope", "fp32"), ("no variant 'nope'", "A")),
    (("fp32", "fp32"), ("same variant",)),
])
def test_bad_variant_names(bench_run, args, needles):
    tmp, run_id, _, _ = bench_run
    assert_one_line_error(run_cli("explain", run_id, *args, "--store", tmp / "s.sqlite", cwd=tmp), *needles)


def test_unknown_run_and_missing_store(bench_run, tmp_path):
    tmp, run_id, _, _ = bench_run
    assert_one_line_error(run_cli("explain", "nosuchrun", "a", "b", "--store", tmp / "s.sqlite", cwd=tmp),
                          "no run matches", run_id)
    assert_one_line_error(run_cli("explain", run_id, "a", "b", "--store", tmp_path / "none.sqlite", cwd=tmp_path),
                          "no results store")
    assert not (tmp_path / "none.sqlite").exists()
