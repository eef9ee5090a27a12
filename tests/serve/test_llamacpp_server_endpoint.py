"""llama.cpp's own OpenAI server (`python -m llama_cpp.server`, from the same llama-cpp-python build) as a
`backend: openai` variant, on loopback, beside the same GGUF run in-process (`backend: llamacpp`) and the torch
fp32 baseline: one bench. Graded answers through the server equal the in-process ones (the same weights, greedy);
KLD and top-1 agreement come from its echo + logprobs where its tokens are the baseline's, else the row says why
(llama-cpp-python lists a prompt's tokens without the BOS it adds, so position for position they are not)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from tests.test_cli import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
pytest.importorskip("llama_cpp.server.app", reason="needs llama-cpp-python and its server: bash scripts/install_llamacpp.sh")
WORKLOAD = {"dataset": {"generator": "structured", "n": 12, "seed": 0}, "max_new_tokens": 24, "stop": ["\n"],
            "accuracy": {"samples": 4}, "scenarios": [{"type": "single-stream", "requests": 4, "warmup": 1}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gguf_f32(reference_gguf):
    return reference_gguf("F32") / "model.gguf"


def start_server(gguf, folder, *flags):
    """`python -m llama_cpp.server` on a free loopback port; (process, its base URL) once it answers."""
    port = free_port()
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                             "--port", str(port), "--n_threads", "1", "--n_ctx", "2048", *flags],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:       # bounded: the server loads a 4 MB GGUF in about a second
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"llama_cpp.server did not answer on {url} within 120 s (exit {proc.poll()})")
            time.sleep(0.5)
    return proc, url


@pytest.fixture(scope="module")
def llama_server(gguf_f32, tmp_path_factory):
    """Served as a benchmark should serve it: every request answered (not interrupted by the next one), and
    prompt log-probabilities for echo + logprobs (logits_all)."""
    proc, url = start_server(gguf_f32, tmp_path_factory.mktemp("server"), "--logits_all", "true",
                             "--interrupt_requests", "false")
    yield url
    proc.terminate()
    proc.wait(30)


def test_a_request_the_server_cut_short_is_an_error_not_an_empty_answer(gguf_f32, tmp_path):
    """llama-cpp-python's server, as it starts by default, ends a request's stream without a finish_reason when
    another request arrives: those requests are failed requests, never empty answers graded as wrong."""
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.openai_http import CUT_SHORT, Endpoint, OpenAIBackend
    from variantlab.data.structured import generate_samples
    proc, url = start_server(gguf_f32, tmp_path)
    backend = OpenAIBackend(Endpoint(url + "/v1"))
    try:
        records = run_requests(backend, [GenerationRequest(str(i), prompt=s["prompt"], max_new_tokens=24, stop=("\n",))
                                         for i, s in enumerate(generate_samples(4, 0))])
    finally:
        backend.close()
        proc.terminate()
        proc.wait(30)
    assert all((r.ok and r.finish_reason == "stop" and r.output_text) or r.error == CUT_SHORT for r in records), \
        [(r.output_text, r.finish_reason, r.error) for r in records]


def test_llama_servers_answers_equal_the_in_process_ggufs_and_its_logprob_rows_say_what_they_are(llama_server,
                                                                                                 gguf_f32, tmp_path):
    suite = {"name": "llama-server", "model": "builtin:tiny-structured", "rounds": 1,
             "variants": [{"name": "fp32", "recipe": "fp32"},
                          {"name": "in-process", "backend": "llamacpp", "model": str(gguf_f32)},
                          {"name": "served", "backend": "openai", "base_url": llama_server + "/v1"}],
             "workload": WORKLOAD}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    proc = run_cli("bench", "suite.yaml", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["key"]: r["cells"] for r in json.loads(proc.stdout)["comparison"]["rows"]}
    accuracy = rows["grading.task_accuracy"]
    assert accuracy["served"]["value"] == accuracy["in-process"]["value"] == accuracy["fp32"]["value"]
    assert rows["scoring.kld_mean"]["in-process"]["value"] < 1e-4
    served = rows["scoring.kld_mean"]["served"]
    assert served["value"] is not None or "not comparable" in served["problem"], served
