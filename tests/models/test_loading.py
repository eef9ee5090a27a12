"""Finding and checking model directories (models/loading.py): every bad directory raises a
one-line ModelLoadError naming the path and what is accepted; a valid one loads in eval mode."""
from __future__ import annotations

import json
import shutil
import struct

import pytest

from variantlab.errors import ModelLoadError
from variantlab.models.loading import (BUILTIN_MODELS, check_model_dir, load_causal_lm, prompt_token_counts,
                                       resolve_model_path, tokenizer_fingerprint)


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    """A writable copy of the valid tiny model directory."""
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def load_error(path, **kw) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as info:
        check_model_dir(path, file="suite.yaml", field="variants[1].model", **kw)
    err = info.value
    text = str(err)
    assert "\n" not in text
    assert text.startswith("suite.yaml: variants[1].model: ")
    assert str(path) in text
    assert err.accepted and f"(accepted: {err.accepted})" in text
    return err


def set_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


# --------------------------------------------------------------------------- resolving

def test_builtin_resolves_to_the_packaged_directory():
    path = resolve_model_path("builtin:tiny-structured")
    assert path == BUILTIN_MODELS["tiny-structured"]
    assert path.parent.name == "models"


@pytest.mark.skipif(not BUILTIN_MODELS["tiny-structured"].is_dir(),
                    reason="the reference model is not trained yet (scripts/train_reference_model.py)")
def test_builtin_model_exists_and_checks():
    path = resolve_model_path("builtin:tiny-structured")
    assert path.is_dir()
    info = check_model_dir(path)
    assert info.architecture == "LlamaForCausalLM"


def test_unknown_builtin_is_a_model_load_error():
    with pytest.raises(ModelLoadError) as info:
        resolve_model_path("builtin:huge", file="s.yaml")
    text = str(info.value)
    assert "\n" not in text and text.startswith("s.yaml: model: ") and "'huge'" in text
    assert "builtin:tiny-structured" in info.value.accepted


def test_relative_paths_are_taken_from_the_suite_folder(tmp_path):
    assert resolve_model_path("ckpt", tmp_path) == tmp_path / "ckpt"
    assert resolve_model_path(str(tmp_path / "abs"), tmp_path / "other") == tmp_path / "abs"


# --------------------------------------------------------------------------- checking

def test_valid_directory_reports_its_weights(tiny_model_dir):
    info = check_model_dir(tiny_model_dir)
    assert info.path == tiny_model_dir
    assert info.architecture == "LlamaForCausalLM" and info.model_type == "llama"
    assert info.weight_files == (tiny_model_dir / "model.safetensors",)
    assert info.weight_bytes == (tiny_model_dir / "model.safetensors").stat().st_size


def test_missing_directory(tmp_path):
    err = load_error(tmp_path / "nope")
    assert "does not exist" in str(err) and "causal-LM directory" in err.accepted


def test_a_file_is_not_a_directory(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"x")
    assert "not a directory" in str(load_error(tmp_path / "model.bin"))


def test_directory_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no config.json" in str(load_error(tmp_path / "empty"))


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00\x01"])
def test_config_that_is_not_json(model_copy, content):
    (model_copy / "config.json").write_bytes(content)
    assert "not valid JSON" in str(load_error(model_copy))


def test_config_that_is_json_but_not_an_object(model_copy):
    # loading.py: `cfg.get("architectures")` on a JSON list raises AttributeError, not ModelLoadError
    (model_copy / "config.json").write_text("[1, 2]")
    load_error(model_copy)


@pytest.mark.parametrize("archs", [["BertModel"], [], None])
def test_config_that_is_not_a_causal_lm(model_copy, archs):
    set_config(model_copy, architectures=archs)
    err = load_error(model_copy)
    assert "not a causal LM" in str(err) and "ForCausalLM" in err.accepted
    if archs:
        assert "BertModel" in str(err)


def test_config_with_non_string_architectures(model_copy):
    # loading.py: `a.endswith(...)` on a non-string entry raises AttributeError
    set_config(model_copy, architectures=[1])
    load_error(model_copy)


def test_no_safetensors(model_copy):
    (model_copy / "model.safetensors").unlink()
    err = load_error(model_copy)
    assert "no .safetensors" in str(err) and "model.safetensors" in err.accepted


@pytest.mark.parametrize("keep", [0.5, 0.99, 100, 4])
def test_truncated_safetensors(model_copy, keep):
    weights = model_copy / "model.safetensors"
    data = weights.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    weights.write_bytes(data[:cut])
    err = load_error(model_copy)
    assert str(weights) in str(err) and "truncated" in str(err)
    assert err.accepted == "an intact safetensors file"


@pytest.mark.parametrize("header", [b"\xff\xfenot json at all", b"[1, 2, 3]", b"{\"w\": 3}",
                                    b"{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}"])
def test_safetensors_with_garbage_header(model_copy, header):
    # The last two are JSON objects whose entries are not tensor descriptions: loading.py's
    # `t["data_offsets"]` raises TypeError / KeyError instead of ModelLoadError.
    weights = model_copy / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    err = load_error(model_copy)
    assert str(weights) in str(err) and "corrupt" in str(err)


def test_header_length_beyond_the_file(model_copy):
    weights = model_copy / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 2**60) + b"{}")
    assert "header says" in str(load_error(model_copy))


# --------------------------------------------------------------------------- loading

@pytest.mark.model
def test_load_causal_lm_gives_eval_model_and_padded_tokenizer(tiny_model_dir):
    import torch
    model, tok = load_causal_lm(tiny_model_dir, torch.float32, "cpu")
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.architectures == ["LlamaForCausalLM"]
    assert tok.pad_token is not None and tok.pad_token_id is not None
    assert len(tok) == model.config.vocab_size


@pytest.mark.model
def test_load_causal_lm_sets_a_pad_token_when_the_tokenizer_has_none(model_copy):
    import torch
    cfg_path = model_copy / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["pad_token"] = None
    cfg_path.write_text(json.dumps(cfg))
    _, tok = load_causal_lm(model_copy, torch.float32, "cpu")
    assert tok.pad_token_id is not None


@pytest.mark.model
def test_load_causal_lm_wraps_failures_in_one_line(model_copy):
    import torch
    (model_copy / "tokenizer.json").write_text("{broken")
    with pytest.raises(ModelLoadError) as info:
        load_causal_lm(model_copy, torch.float32, "cpu")
    assert "\n" not in str(info.value) and str(model_copy) in str(info.value)


@pytest.mark.model
def test_prompt_token_counts_are_what_the_engine_sends(tiny_model_dir, tiny_lm):
    """Planning's count of a prompt (position limits) is the engine's own encoding of it, BOS included."""
    from variantlab.backends.torch_engine import TorchEngine
    engine = TorchEngine(*tiny_lm, "cpu")
    prompts = ["a: 1\nQ: What is the a?\nA:", "", "order ORD-5493 " * 20]
    counts = prompt_token_counts(tiny_model_dir, prompts)
    assert counts == [len(engine.encode(p)) for p in prompts]
    assert counts[1] == 1 and counts[2] > counts[0]          # the shipped tokenizer adds <s>


def test_a_tokenizer_that_does_not_load_is_one_line_naming_the_directory(model_copy):
    (model_copy / "tokenizer.json").write_text("{broken")
    with pytest.raises(ModelLoadError) as info:
        prompt_token_counts(model_copy, ["hello"], file="suite.yaml")
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"suite.yaml: model: cannot load the tokenizer of {model_copy}")


def test_tokenizer_fingerprint_is_equal_for_copies_and_differs_for_another_tokenizer(
        tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    copy_a = shutil.copytree(tiny_model_dir, tmp_path / "a")
    copy_b = shutil.copytree(tiny_model_dir, tmp_path / "b")
    fp = tokenizer_fingerprint(tiny_model_dir)
    assert len(fp) == 12
    assert tokenizer_fingerprint(copy_a) == tokenizer_fingerprint(copy_b) == fp

    other = tmp_path / "other"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    tok.add_tokens(["<extra-token>"])
    tok.save_pretrained(other)
    assert tokenizer_fingerprint(other) != fp
    assert tokenizer_fingerprint(tmp_path / "no-tokenizer-here") != fp
