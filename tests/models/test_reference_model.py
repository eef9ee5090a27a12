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
# What the shipped model must keep reaching on 96 held-out samples (it reached 97.5% and 99% on 200 of seeds 0 and 7; see
# training.json). A retrain that loses the copying circuit falls far below these.
MIN_EXACT_MATCH = 0.85
MIN_TASK_EXACT_MATCH = 0.75
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


def test_reference_model_answers_held_out_questions():
    """Through variantlab's own engine, as `bench` runs it (one batch, answers end at a newline):
    greedy answers to held-out questions (seed 7, never trained on) mostly match the ground truth,
    on every task."""
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.measure.accuracy import exact_match
    from variantlab.models.loading import load_causal_lm

    model, tokenizer = load_causal_lm(MODEL_DIR, torch.float32, "cpu")
    engine = TorchEngine(model, tokenizer, "cpu", tokenizer_id="reference")
    samples = generate_samples(96, seed=7)
    records = run_requests(engine, [GenerationRequest(s["id"], prompt=s["prompt"], max_new_tokens=24, stop=("\n",))
                                    for s in samples])
    hits: dict[str, list[bool]] = {}
    for sample, record in zip(samples, records):
        hits.setdefault(sample["task"], []).append(exact_match(record.output_text, sample["answer"]))
    accuracy = {task: sum(h) / len(h) for task, h in hits.items()}
    overall = sum(sum(h) for h in hits.values()) / len(samples)
    assert overall >= MIN_EXACT_MATCH, accuracy
    assert min(accuracy.values()) >= MIN_TASK_EXACT_MATCH, accuracy
