"""The shipped reference model `builtin:tiny-structured`: loads offline with transformers, its
tokenizer round-trips any text, and a forward pass gives finite logits."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import variantlab
from variantlab.data.structured import generate_samples

pytestmark = pytest.mark.model

MODEL_DIR = Path(variantlab.__file__).parent / "models" / "tiny_structured"
UNICODE_TEXTS = [
    "plain ascii, with punctuation: {\"a\": [1, 2.50]}",
    "  two leading spaces\tand a tab\nand a newline  ",
    "héllo wörld — naïve café",
    "日本語のテキスト、中文字符, 한국어",
    "emoji 🎉👩‍💻 and math ∑∫√ and \x00\x7f control chars",
    "",
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_tokenizer_round_trips_any_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tokenizer_special_tokens_match_config(tokenizer, model):
    config = model.config
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>",
                                                                               "<pad>")
    assert tokenizer.bos_token_id == config.bos_token_id
    assert tokenizer.eos_token_id == config.eos_token_id
    assert tokenizer.pad_token_id == config.pad_token_id
    assert len(tokenizer) == config.vocab_size


def test_tokenizer_prepends_bos(tokenizer):
    ids = tokenizer("a: 1\nQ: What is the a?\nA:").input_ids
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1


def test_prompt_and_answer_tokenize_the_same_apart_and_together(tokenizer):
    # Training and evaluation encode the prompt and " " + answer separately.
    for sample in generate_samples(100, seed=0):
        apart = (tokenizer.encode(sample["prompt"], add_special_tokens=False)
                 + tokenizer.encode(" " + sample["answer"], add_special_tokens=False))
        together = tokenizer.encode(sample["prompt"] + " " + sample["answer"],
                                    add_special_tokens=False)
        assert apart == together


def test_model_is_a_small_multi_head_llama(model):
    config = model.config
    assert config.model_type == "llama"
    assert config.num_key_value_heads == config.num_attention_heads
    assert (MODEL_DIR / "model.safetensors").stat().st_size < 16 * 1024 * 1024
    assert (MODEL_DIR / "generation_config.json").exists()


def test_forward_gives_finite_logits(model, tokenizer):
    prompt = generate_samples(1, seed=0)[0]["prompt"]
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    assert logits.shape == (1, input_ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_training_report_is_shipped():
    report = json.loads((MODEL_DIR / "training.json").read_text())
    for key in ("steps", "tokens_seen", "final_loss", "exact_match", "parameters",
                "wall_time_s", "command"):
        assert key in report
    assert set(report["exact_match"]["seed0"]["per_task"]) == {"extract", "lookup", "count"}
