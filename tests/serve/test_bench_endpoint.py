"""`backend: openai` in bench, end to end: our own server on loopback (built in this process) measured by
`variantlab bench` beside the same variant run locally, in one table. The endpoint's variant gets every
row a client can measure (single-stream, offline, the server scenario, graded answers, and KLD from the
top-k log-probabilities of prompt scoring) and says why the others are not measured (cold start and memory
are the server's own)."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.test_cli import assert_one_line_error, run_cli
from variantlab.measure.plan import plan_suite_file
from variantlab.serve.server import ServeOptions, build_server

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

WORKLOAD = {"dataset": {"generator": "structured", "n": 8, "seed": 0}, "max_new_tokens": 12, "stop": ["\n"],
            "accuracy": {"samples": 4}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("served")
    (d / "s.yaml").write_text(yaml.safe_dump({"name": "served", "model": "builtin:tiny-structured",
                                              "variants": [{"name": "bf16", "recipe": "bf16"}],
                                              "workload": WORKLOAD}))
    handle = build_server(plan_suite_file(d / "s.yaml"), ServeOptions(policy="adaptive"), log=lambda line: None)
    url = handle.start_http()
    yield url
    handle.close()


def test_an_endpoint_is_measured_beside_a_local_variant_in_one_table(server, tmp_path):
    suite = {"name": "endpoint", "model": "builtin:tiny-structured", "rounds": 2,
             "variants": [{"name": "local", "recipe": "bf16"},
                          {"name": "served", "backend": "openai", "base_url": server + "/v1", "served_model": "bf16"}],
             "workload": WORKLOAD | {"scenarios": [
                 {"type": "single-stream", "requests": 4, "warmup": 1},
                 {"type": "offline", "batch_size": 4, "passes": 1},
                 {"type": "server", "rate": 10, "duration_s": 1, "warmup_s": 0.2, "drain_s": 20}]},
             "requirements": {"slo": {"ttft_s": 5, "tpot_s": 5}}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    proc = run_cli("bench", "suite.yaml", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    comparison = doc["comparison"]
    assert comparison["status"] == {"local": "ok", "served": "ok"}
    rows = {r["key"]: r for r in comparison["rows"]}
    for key in ("single-stream.tpot_p50", "offline.output_throughput", "server.ttft_p95@10",
                "server.max_sustainable_rate", "grading.task_accuracy"):
        assert rows[key]["cells"]["served"]["value"] is not None, key
    # the same weights behind the endpoint answer what the local variant answers
    assert rows["grading.task_accuracy"]["cells"]["served"]["value"] == rows["grading.task_accuracy"]["cells"]["local"]["value"]
    # the same weights: the endpoint's top-20 KLD against the local baseline is next to nothing (issue 24)
    assert 0 <= rows["scoring.kld_mean"]["cells"]["served"]["value"] < 1e-3
    assert rows["scoring.top1_agreement"]["cells"]["served"]["value"] > 0.95
    for key in ("cold_start.total", "memory.peak"):
        cell = rows[key]["cells"]["served"]
        assert cell["value"] is None and "not measured for an endpoint" in cell["problem"], key


def test_an_endpoint_variant_with_build_fields_is_refused_in_one_line(tmp_path):
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({
        "model": "builtin:tiny-structured",
        "variants": [{"name": "a"}, {"name": "e", "backend": "openai", "base_url": "http://127.0.0.1:9/v1",
                                     "recipe": "int8"}]}))
    assert_one_line_error(run_cli("bench", "suite.yaml", cwd=tmp_path), "variants[1]", "recipe",
                          "measured as it serves")
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"variants": [{"name": "e", "backend": "openai"}]}))
    assert_one_line_error(run_cli("bench", "suite.yaml", cwd=tmp_path), "variants[0]", "base_url")


def test_an_endpoint_that_does_not_answer_fails_its_variant_and_the_others_go_on(tmp_path):
    suite = {"name": "down", "model": "builtin:tiny-structured", "rounds": 1,
             "variants": [{"name": "local", "recipe": "bf16"},
                          {"name": "gone", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}],
             "workload": WORKLOAD | {"scenarios": [{"type": "single-stream", "requests": 2, "warmup": 0}],
                                     "accuracy": {"samples": 0, "graded": 0}}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    proc = run_cli("bench", "suite.yaml", "--json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert doc["comparison"]["status"]["local"] == "ok"
    rows = {r["key"]: r for r in doc["comparison"]["rows"]}
    cell = rows["single-stream.tpot_p50"]["cells"].get("gone")
    assert cell is None or cell["value"] is None      # every request failed: no latency to show
