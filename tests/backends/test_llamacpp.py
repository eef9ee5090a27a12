"""The llama.cpp backend (backends/llamacpp.py) on GGUFs that llama.cpp's own tools make from the shipped
reference model (variants/gguf_artifact.py), checked against our torch engine on the same token ids:

- F32 is the same model: greedy tokens agree for 40 tokens on every prompt, one at a time and batched, and its
  KLD against torch fp32 is below 1e-4 (measured: 1.1e-8);
- Q8_0 and Q4_0 lose some: their KLD is above F32's and below the bounds measured here on 2026-12-05 with
  llama-cpp-python 0.3.36 (Q8_0 ~2e-5 and Q4_0 1.8e-3, bounds 1e-3 and 1e-2);
- answers stop as the torch engine's do, and bits per byte count the same bytes.
Skipped, with the reason, where llama-cpp-python or its converter is not installed (scripts/install_llamacpp.sh;
CI installs both).
"""
from __future__ import annotations

import numpy as np
import pytest

from variantlab.backends.base import GenerationRequest, run_requests

llama_cpp = pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: bash scripts/install_llamacpp.sh")
pytestmark = pytest.mark.model

from variantlab.backends.llamacpp import LlamaCppBackend  # noqa: E402
from variantlab.backends.tokenized import TokenizerText, eos_ids  # noqa: E402
from variantlab.data.structured import generate_samples  # noqa: E402
from variantlab.measure import accuracy as acc  # noqa: E402
from variantlab.models.loading import BUILTIN_MODELS  # noqa: E402
from variantlab.variants import gguf_artifact  # noqa: E402

SAMPLES = generate_samples(8, 3)
KLD_BOUND = {"F32": 1e-4, "Q8_0": 1e-3, "Q4_0": 1e-2}


@pytest.fixture(scope="module")
def ggufs(reference_gguf):
    return {t: reference_gguf(t) for t in KLD_BOUND}


@pytest.fixture(scope="module")
def torch_fp32():
    import torch

    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.variants.build import VariantDefinition, build
    torch.set_num_threads(1)
    built = build(BUILTIN_MODELS["tiny-structured"], VariantDefinition("fp32"), "cpu")
    return TorchEngine(built.model, built.tokenizer, "cpu")


def backend(artifact) -> LlamaCppBackend:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(artifact)
    return LlamaCppBackend(gguf_artifact.gguf_path(artifact), TokenizerText(tok, eos_ids(tok)), threads=1)


def agreeing(a, b) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_the_f32_gguf_decodes_the_torch_fp32_tokens_one_at_a_time_and_batched(ggufs, torch_fp32):
    be = backend(ggufs["F32"])
    requests = [GenerationRequest(str(i), prompt=s["prompt"], max_new_tokens=40, stop_on_eos=False)
                for i, s in enumerate(SAMPLES)]
    ours = [run_requests(torch_fp32, [r])[0].token_ids for r in requests]
    alone = [run_requests(be, [r])[0].token_ids for r in requests]
    together = [r.token_ids for r in run_requests(be, requests)]
    be.close()
    assert [len(t) for t in ours] == [40] * len(SAMPLES)
    assert [agreeing(a, b) for a, b in zip(alone, ours)] == [40] * len(SAMPLES)
    assert together == alone


def test_answers_stop_where_the_torch_engine_stops_them(ggufs, torch_fp32):
    be = backend(ggufs["F32"])
    requests = [GenerationRequest(str(i), prompt=s["prompt"], max_new_tokens=24, stop=("\n",))
                for i, s in enumerate(SAMPLES)]
    got = run_requests(be, requests)
    be.close()
    want = [run_requests(torch_fp32, [r])[0] for r in requests]
    assert [r.output_text for r in got] == [r.output_text for r in want]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in want]
    assert [r.tokens_in for r in got] == [r.tokens_in for r in want]


def test_kld_against_torch_fp32_is_tiny_for_f32_and_bounded_for_the_quantized_types(ggufs, torch_fp32):
    texts = [s["prompt"] + " " + s["answer"] for s in SAMPLES]
    base = torch_fp32.score(texts)
    base_lp = np.concatenate([s.logprobs for s in base])
    kld = {}
    for t, artifact in ggufs.items():
        be = backend(artifact)
        scored = be.score(texts)
        be.close()
        assert [s.token_ids for s in scored] == [s.token_ids for s in base]
        assert [s.n_bytes for s in scored] == [s.n_bytes for s in base]
        assert all(s.first_nonfinite is None for s in scored)
        kld[t] = acc.kld_summary(base_lp, np.concatenate([s.logprobs for s in scored]))["mean"]
    assert kld["F32"] < KLD_BOUND["F32"]
    assert kld["F32"] < kld["Q8_0"] < KLD_BOUND["Q8_0"]
    assert kld["Q8_0"] < kld["Q4_0"] < KLD_BOUND["Q4_0"]


def test_a_gguf_runs_on_its_own_vocabulary_too(ggufs):
    be = LlamaCppBackend(gguf_artifact.gguf_path(ggufs["Q4_0"]), None, threads=1)
    text = "order_id: ORD-5493 café"
    ids = be.encode(text)
    assert be.decode(ids) == text
    out = run_requests(be, [GenerationRequest("own", prompt=SAMPLES[0]["prompt"], max_new_tokens=4)])[0]
    n_in = len(be.encode(SAMPLES[0]["prompt"]))
    be.close()
    assert out.ok and out.tokens_out >= 1 and out.tokens_in == n_in
