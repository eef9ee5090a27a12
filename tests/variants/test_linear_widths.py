"""linear_widths.py against the models transformers builds: for every family variantlab converts, the in_features
planning reads from config.json are those of the layers a quantized recipe swaps, layer for layer, and nothing is
guessed for an architecture or a config.json the table does not know.

Each model is built from its config.json on the meta device (shapes only, no weights), as `from_pretrained`
would build it from the same file; configs vary where families differ: a head_dim given or left to its
default (hidden // heads, or Gemma's 256), GPT-2's n_inner, a tied head, an intermediate (688) that 64 does not
divide."""
from __future__ import annotations

import json
import re

import pytest
import torch

from variantlab.variants.linear_widths import LM_HEAD, quantized_in_features, undivided
from variantlab.variants.quant import _features, _targets

pytestmark = pytest.mark.model

SMALL = {"hidden_size": 64, "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 96}
CONFIGS = {
    "llama": ("llama", SMALL),
    "llama-head_dim": ("llama", SMALL | {"head_dim": 32}),                 # heads × head_dim = 128 ≠ hidden
    "mistral": ("mistral", SMALL | {"head_dim": None}),
    "qwen2-688": ("qwen2", SMALL | {"tie_word_embeddings": True}),
    "qwen2-head_dim": ("qwen2", SMALL | {"head_dim": 48}),                 # a key its config class does not declare
    "gemma-default-head_dim": ("gemma", SMALL),                            # head_dim 256 unless config.json says
    "gemma": ("gemma", SMALL | {"head_dim": 16}),
    "gemma2": ("gemma2", SMALL | {"head_dim": 16}),
    "gemma3": ("gemma3_text", SMALL | {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3": ("phi3", SMALL | {"pad_token_id": 0}),
    "gpt2": ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 96}),
    "gpt2-n_inner": ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 96, "n_inner": 200}),
    "neox": ("gpt_neox", {"hidden_size": 64, "intermediate_size": 688, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "vocab_size": 96}),
}


def config_json(case: str) -> tuple[dict, object]:
    """(config.json as save_pretrained writes it, the model built from it on the meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    model_type, kwargs = CONFIGS[case]
    cfg = AutoConfig.for_model(model_type, **kwargs)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    written = json.loads(cfg.to_json_string(use_diff=True)) | {"architectures": [type(model).__name__]}
    return written, model


def built_widths(model, lm_head: bool) -> dict[str, int]:
    """{layer name inside a decoder layer, or lm_head: in_features} of the layers a quantized recipe swaps."""
    targets, _ = _targets(model, "int4", quantize_lm_head=lm_head)
    widths: dict[str, int] = {}
    for name, m in targets:
        key = LM_HEAD if m is model.get_output_embeddings() else re.sub(r"^.*?\.(?:layers|h)\.\d+\.", "", name)
        assert widths.setdefault(key, _features(m)[0]) == _features(m)[0], key   # every layer alike
    return widths


@pytest.mark.parametrize("case", CONFIGS)
@pytest.mark.parametrize("lm_head", [False, True])
def test_the_widths_read_from_config_json_are_those_of_the_built_model(case, lm_head):
    written, model = config_json(case)
    assert quantized_in_features(written, lm_head=lm_head) == built_widths(model, lm_head)


def test_head_dim_defaults_are_each_familys_own():
    assert quantized_in_features(config_json("gemma-default-head_dim")[0], lm_head=False)["self_attn.o_proj"] == 4 * 256
    assert quantized_in_features(config_json("llama")[0], lm_head=False)["self_attn.o_proj"] == 64
    assert quantized_in_features(config_json("gpt2")[0], lm_head=False)["mlp.c_proj"] == 256


def test_what_the_table_does_not_know_is_not_guessed():
    written, _ = config_json("qwen2-688")
    assert quantized_in_features(written | {"architectures": ["Qwen3MoeForCausalLM"]}, lm_head=False) is None
    assert quantized_in_features({k: v for k, v in written.items() if k != "architectures"}, lm_head=False) is None
    for key, value in (("intermediate_size", None), ("hidden_size", "64"), ("num_attention_heads", True),
                       ("intermediate_size", 0)):
        assert quantized_in_features(written | {key: value}, lm_head=False) is None, (key, value)
    for case in ("gemma", "qwen2-688"):         # a null head_dim their config classes do not derive: no model builds
        assert quantized_in_features(config_json(case)[0] | {"head_dim": None}, lm_head=False) is None
    llama, _ = config_json("llama")             # LlamaConfig derives it: hidden // heads
    assert quantized_in_features(llama | {"head_dim": None}, lm_head=False)["self_attn.o_proj"] == 64


def test_undivided_names_the_layers_a_group_does_not_divide():
    widths = quantized_in_features(config_json("qwen2-688")[0], lm_head=True)
    assert undivided(widths, 64) == {"mlp.down_proj": 688} and undivided(widths, 16) == {}
