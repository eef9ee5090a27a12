"""GGUF artifacts (variants/gguf_artifact.py): made by llama.cpp's tools from the checkpoint or described from a
user's file, sealed, reused only while they are what the variant asks for; a user's GGUF gets the checkpoint's
token ids only when llama.cpp reads them as the same text."""
from __future__ import annotations

import json
import shutil

import pytest

from variantlab.errors import RecipeError
from variantlab.models.loading import BUILTIN_MODELS
from variantlab.variants import gguf_artifact, gguf_convert
from variantlab.variants.artifact_content import file_sha256

pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: bash scripts/install_llamacpp.sh")
pytestmark = pytest.mark.model
SOURCE = BUILTIN_MODELS["tiny-structured"]
TEXTS = ["order_id: ORD-5493\nstatus: pending\nQ: What is the status?\nA: pending", "le time sublime"]


@pytest.fixture(scope="module")
def q8(reference_gguf):
    return reference_gguf("Q8_0")


def swapped_vocabulary(tmp_path):
    """The reference checkpoint with two tokens' ids swapped in its tokenizer: another vocabulary, same shapes."""
    ckpt = tmp_path / "swapped"
    shutil.copytree(SOURCE, ckpt)
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["le"], vocab["ime"] = vocab["ime"], vocab["le"]
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    return ckpt


def test_a_built_gguf_is_described_sealed_and_reused_only_as_built(q8, tmp_path):
    meta = gguf_artifact.read_meta(q8)
    facts = meta["facts"]
    assert meta["gguf_type"] == "Q8_0" and facts["dtype"] == "Q8_0" and facts["parameters"] == 1115264
    assert meta["build"]["page_cache_s"] >= 0     # the GGUF was settled in the page cache as if read from disk
    assert 8 < facts["bits_per_weight"] < 9.5 and facts["extra"]["tokenizer"] == "the checkpoint's"
    assert "AVX2" in facts["kernels"][0] or "llama.cpp" in facts["kernels"][0]
    assert (q8 / "tokenizer.json").is_file() and "model.gguf" in meta["files"]
    extra = facts["extra"]
    assert extra["tensor_types"]["Q8_0"] >= 28 and "F32" in extra["tensor_types"]      # norms stay F32
    # a decode step reads every tensor but all of the embedding table's rows except one
    assert facts["weight_bytes"] * 0.8 < extra["decode_weight_bytes"] < facts["weight_bytes"]
    assert gguf_artifact.gguf_problem(q8, {"gguf_type": "Q8_0"}, SOURCE) is None
    assert "the variant's is Q4_0" in gguf_artifact.gguf_problem(q8, {"gguf_type": "Q4_0"}, SOURCE)
    edited = tmp_path / "edited"
    shutil.copytree(q8, edited)
    data = bytearray((edited / "model.gguf").read_bytes())
    data[-1] ^= 0xFF
    (edited / "model.gguf").write_bytes(bytes(data))
    assert "does not match the sha256" in gguf_artifact.gguf_problem(edited, {"gguf_type": "Q8_0"}, SOURCE)


def test_a_users_gguf_of_the_same_vocabulary_takes_the_checkpoints_ids(q8, tmp_path):
    user = tmp_path / "model-Q8_0.gguf"
    shutil.copyfile(q8 / "model.gguf", user)
    written = user.stat().st_mtime_ns
    meta = gguf_artifact.build_gguf_artifact(SOURCE, {"gguf_file": str(user)}, tmp_path / "a", threads=1,
                                             calibration_texts=TEXTS)
    assert meta["build"]["page_cache_s"] >= 0     # settled in the page cache as if read from disk (page_cache.py),
    assert user.stat().st_mtime_ns == written     # and left as the user had it
    assert meta["file"]["sha256"] == file_sha256(q8 / "model.gguf")
    assert meta["facts"]["extra"]["tokenizer"] == "the checkpoint's" and "2 calibration texts" in meta["tokenizer_check"]
    assert (tmp_path / "a" / "tokenizer.json").is_file() and not (tmp_path / "a" / "model.gguf").exists()
    assert gguf_artifact.gguf_path(tmp_path / "a") == user
    assert gguf_artifact.gguf_problem(tmp_path / "a", {"gguf_file": str(user)}, SOURCE) is None
    user.write_bytes(user.read_bytes()[:-1] + b"\0")
    assert "changed since" in gguf_artifact.gguf_problem(tmp_path / "a", {"gguf_file": str(user)}, SOURCE)


def test_a_users_gguf_of_another_vocabulary_runs_on_its_own_tokenizer(tmp_path, q8):
    other = gguf_convert.convert(swapped_vocabulary(tmp_path), tmp_path / "other-F32.gguf", "F32")
    meta = gguf_artifact.build_gguf_artifact(SOURCE, {"gguf_file": str(other)}, tmp_path / "b", threads=1,
                                             calibration_texts=TEXTS)
    assert meta["facts"]["extra"]["tokenizer"] == gguf_artifact.TOKENIZER_OWN
    assert "calibration text 1" in meta["tokenizer_check"]
    assert not (tmp_path / "b" / "tokenizer.json").exists()
    # its own tokenizer splits the evaluation text otherwise: the scoring rows say "not comparable"
    from transformers import AutoTokenizer

    from variantlab.backends.llamacpp import LlamaCppBackend
    from variantlab.measure.trackers.scoring import ScoringOutput, fingerprint, same_split
    be = LlamaCppBackend(other, None, threads=1)
    scored = be.score(TEXTS)
    be.close()
    hf = AutoTokenizer.from_pretrained(SOURCE)
    def output(cls, ids):
        return ScoringOutput(texts=2, positions=1, nll_nats=1.0, n_bytes=1, tokenizer_fingerprint=fingerprint(cls, ids),
                             tokenizer_class=cls, logprobs_blob=None)
    base = output(type(hf).__name__, [hf(t).input_ids for t in TEXTS])
    mine = output(be.tokenizer_class, [s.token_ids for s in scored])
    assert "not comparable" in same_split(base, mine).text


def test_without_the_converter_the_error_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_convert.SOURCE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(RecipeError, match="scripts/install_llamacpp.sh"):
        gguf_convert.find_converter()
