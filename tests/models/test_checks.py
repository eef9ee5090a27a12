"""Unsafe or broken checkpoint directories (models/checks.py through check_model_dir, and load_causal_lm):
pickle weights are never unpickled, a checkpoint's own Python never runs, and a directory without a
tokenizer or with a config.json that does not match its weights is refused in one line before anything
loads it. Real directories: the session's tiny Llama and the family checkpoints, copied and broken here."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAMILIES

from variantlab.errors import ModelLoadError
from variantlab.models.loading import check_model_dir, load_causal_lm


class WritesMarker:
    """Unpickled, it opens (creates) the marker file: what a hostile checkpoint could do with any code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def hostile_pickle(path: Path, marker: Path) -> None:
    import torch
    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2), "payload": WritesMarker(marker)}, path)


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def refusal(path: Path) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as info:
        check_model_dir(path, file="suite.yaml", field="model")
    text = str(info.value)
    assert "\n" not in text and text.startswith("suite.yaml: model: ") and str(path) in text
    return info.value


def set_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | changes))


# ---------------------------------------------------------------- pickle checkpoints

def test_the_hostile_pickle_runs_code_when_unpickled_unsafely(tmp_path):
    """The fixture is real: torch.load without weights_only creates the marker (so the tests below can fail)."""
    import torch
    hostile_pickle(tmp_path / "pytorch_model.bin", tmp_path / "marker")
    torch.load(tmp_path / "pytorch_model.bin", weights_only=False)
    assert (tmp_path / "marker").exists()


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "last.ckpt"])
def test_pickle_only_weights_are_refused_with_the_conversion_and_never_opened(model_copy, tmp_path, name):
    (model_copy / "model.safetensors").unlink()
    hostile_pickle(model_copy / name, tmp_path / "marker")
    err = refusal(model_copy)
    assert f"only pickle weights ({name})" in str(err) and "safetensors only" in str(err)
    assert "torch.load" in err.accepted and "weights_only=True" in err.accepted and "save_file" in err.accepted
    assert not (tmp_path / "marker").exists()


def test_the_conversion_command_converts_a_plain_checkpoint(model_copy):
    """The command in the error, run as printed, gives a directory that checks and loads the same weights."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(model_copy / "model.safetensors")
    (model_copy / "model.safetensors").unlink()
    torch.save(weights, model_copy / "pytorch_model.bin")
    command = refusal(model_copy).accepted.split("with: ", 1)[1]
    assert command.startswith("python -c ")
    out = subprocess.run(command.replace("python", sys.executable, 1), shell=True, cwd=model_copy,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    check_model_dir(model_copy)
    converted = load_file(model_copy / "model.safetensors")
    assert converted.keys() == weights.keys() and all(torch.equal(converted[k], weights[k]) for k in weights)


def test_the_conversion_command_refuses_a_hostile_pickle(model_copy, tmp_path):
    (model_copy / "model.safetensors").unlink()
    hostile_pickle(model_copy / "pytorch_model.bin", tmp_path / "marker")
    command = refusal(model_copy).accepted.split("with: ", 1)[1]
    out = subprocess.run(command.replace("python", sys.executable, 1), shell=True, cwd=model_copy,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "Weights only load failed" in out.stderr
    assert not (tmp_path / "marker").exists() and not (model_copy / "model.safetensors").exists()


@pytest.mark.model
def test_load_reads_safetensors_beside_a_hostile_pickle_and_never_unpickles_it(model_copy, tmp_path):
    import torch
    hostile_pickle(model_copy / "pytorch_model.bin", tmp_path / "marker")
    model, _ = load_causal_lm(model_copy, torch.float32, "cpu")
    assert model.config.num_hidden_layers == 2
    assert not (tmp_path / "marker").exists()


@pytest.mark.model
def test_load_of_a_pickle_only_directory_fails_without_unpickling(model_copy, tmp_path):
    import torch
    (model_copy / "model.safetensors").unlink()
    hostile_pickle(model_copy / "pytorch_model.bin", tmp_path / "marker")
    with pytest.raises(ModelLoadError):
        load_causal_lm(model_copy, torch.float32, "cpu")
    assert not (tmp_path / "marker").exists()


# ---------------------------------------------------------------- remote code

def remote_code_dir(model_copy: Path, marker: Path, model_type: str) -> Path:
    """config.json's auto_map points at modeling_custom.py, which creates the marker when imported."""
    code = f"open({str(marker)!r}, 'w').close()\nfrom transformers import LlamaForCausalLM as CustomForCausalLM\n"
    (model_copy / "modeling_custom.py").write_text(code)
    (model_copy / "configuration_custom.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nfrom transformers import LlamaConfig as CustomConfig\n")
    set_config(model_copy, model_type=model_type, architectures=["CustomForCausalLM"],
               auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                         "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})
    return model_copy


def test_remote_code_is_refused_naming_trust_remote_code(model_copy, tmp_path):
    err = refusal(remote_code_dir(model_copy, tmp_path / "marker", "custom_llm"))
    assert "trust_remote_code" in str(err) and "modeling_custom.CustomForCausalLM" in str(err)
    assert "model_type 'custom_llm'" in str(err) and "checkpoint's own Python" in str(err)
    assert not (tmp_path / "marker").exists()


@pytest.mark.model
def test_load_never_runs_a_checkpoints_code(model_copy, tmp_path):
    import torch
    remote_code_dir(model_copy, tmp_path / "marker", "custom_llm")
    with pytest.raises(ModelLoadError):
        load_causal_lm(model_copy, torch.float32, "cpu")
    assert not (tmp_path / "marker").exists()


def test_an_auto_map_beside_a_model_type_transformers_ships_is_loaded_with_transformers_code(model_copy, tmp_path):
    remote_code_dir(model_copy, tmp_path / "marker", "llama")
    assert check_model_dir(model_copy).model_type == "llama"
    assert not (tmp_path / "marker").exists()


# ---------------------------------------------------------------- tokenizer

def test_a_directory_without_a_tokenizer_is_refused(model_copy):
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model_copy / name).unlink(missing_ok=True)
    err = refusal(model_copy)
    assert "has no tokenizer" in str(err) and "tokenizer.json" in str(err)
    assert "save_pretrained" in err.accepted


# ---------------------------------------------------------------- config.json against the weights

@pytest.mark.parametrize("key, value, weights", [
    ("hidden_size", 48, "32 columns in model.embed_tokens.weight"),
    ("vocab_size", 77, "rows in model.embed_tokens.weight"),
    ("num_hidden_layers", 4, "2 layers"),
])
def test_a_config_that_does_not_match_the_weights_is_refused(model_copy, key, value, weights):
    set_config(model_copy, **{key: value})
    err = refusal(model_copy)
    assert f"config.json says {key}: {value}, but the weights have" in str(err) and weights in str(err)
    assert "matches its weights" in err.accepted


@pytest.mark.parametrize("key, value, weights", [("n_embd", 32, "64 columns in transformer.wte.weight"),
                                                 ("n_layer", 3, "2 layers")])
def test_a_gpt2_config_that_does_not_match_the_weights_is_refused(family_dirs, tmp_path, key, value, weights):
    path = shutil.copytree(family_dirs["gpt2"], tmp_path / "gpt2")
    set_config(path, **{key: value})
    err = refusal(path)
    assert f"config.json says {key}: {value}" in str(err) and weights in str(err)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_checkpoint_checks(family_dirs, family):
    """Tied LM heads (gpt2, gemma) store no lm_head; the checks read the embedding and the layers."""
    info = check_model_dir(family_dirs[family])
    assert info.shapes and all(isinstance(d, int) for shape in info.shapes.values() for d in shape)


def test_the_shipped_and_the_session_models_check(tiny_model_dir):
    from variantlab.models.loading import BUILTIN_MODELS
    for path in (tiny_model_dir, BUILTIN_MODELS["tiny-structured"]):
        info = check_model_dir(path)
        assert info.shapes[next(n for n in info.shapes if n.endswith("embed_tokens.weight"))][0] == \
            info.config["vocab_size"]


# ---------------------------------------------------------------- position limits

def test_a_learned_position_table_bounds_the_sequence(family_dirs):
    most, why = check_model_dir(family_dirs["gpt2"]).position_limit()
    assert most == 128 and re.search(r"n_positions: 128.*wpe", why)


@pytest.mark.parametrize("family", ["phi3", "gemma", "neox"])
def test_rotary_models_have_no_position_table(family_dirs, family):
    assert check_model_dir(family_dirs[family]).position_limit() is None


def test_the_reference_models_rotary_positions_have_no_limit(tiny_model_dir):
    assert check_model_dir(tiny_model_dir).position_limit() is None
