"""The reference model's training data: multi-question rows start with the benchmark's own sample,
every follow-up answer is right for its record, and the batch weights cover exactly the answers."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from variantlab.data.structured import KIND_SPECS, generate_samples

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_reference_model.py"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("train_reference_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(train):
    return train.train_tokenizer(1024, n_texts=2000)


def expected_answer(question: str, kind: str, rows: list[dict]) -> str:
    """Answer a question from parsed rows, independently of the code under test."""
    spec = KIND_SPECS[kind]
    words = question.rstrip("?").split(" ")
    if question.startswith("How many"):
        field, value = words[-2], words[-1]
        return str(sum(r[field] == value for r in rows))
    if len(rows) == 1 and len(words) == 4:  # "What is the <field>"
        return rows[0][words[3]]
    field, key = words[3], words[5]
    (row,) = [r for r in rows if r[spec["key"]] == key]
    return row[field]


def test_first_question_is_the_benchmark_sample(train):
    for index, sample in enumerate(generate_samples(300, 42)):
        multi = train.multi_question_sample(42, index, 6)
        question, answer = multi["qa"][0]
        assert f"{multi['record']}\nQ: {question}\nA:" == sample["prompt"]
        assert answer == sample["answer"]


def test_follow_up_answers_are_right_and_distinct(train):
    for index in range(600):
        multi = train.multi_question_sample(3, index, 6)
        rows, _ = train.parse_record(multi["record"], multi["kind"], multi["format"])
        assert 1 <= len(multi["qa"]) <= 6
        assert len(set(multi["qa"])) == len(multi["qa"])
        for question, answer in multi["qa"]:
            assert expected_answer(question, multi["kind"], rows) == answer, (multi, question)


def test_parse_record_inverts_render(train):
    for index in range(300):
        sample = generate_samples(index + 1, 11)[index]
        record = sample["prompt"].rsplit("\nQ: ", 1)[0]
        rows, columns = train.parse_record(record, sample["kind"], sample["format"])
        assert rows and all(list(r) == columns for r in rows)
        if sample["task"] != "count":
            assert sample["answer"] in {r[c] for r in rows for c in columns}


def test_batch_weights_cover_answers_and_their_ends(train, tokenizer):
    samples = [train.multi_question_sample(5, i, 3) for i in range(4)]
    sequences = train.encode_sequences(tokenizer, samples)
    ids = {name: tokenizer.token_to_id(name) for name in (train.BOS, train.EOS, train.PAD)}
    batch = train.make_batch(sequences, ids, answer_weight=5.0)
    newline = tokenizer.encode("\n", add_special_tokens=False).ids[0]
    for row, sample in enumerate(samples):
        weighted = batch.targets[row][batch.answer_mask[row]].tolist()
        expected = []
        for _, answer in sample["qa"]:
            expected += tokenizer.encode(" " + answer, add_special_tokens=False).ids + [newline]
        expected[-1] = ids[train.EOS]
        assert weighted == expected
        assert set(batch.weights[row][batch.answer_mask[row]].tolist()) == {5.0}
        first = sample["qa"][0]
        prompt = tokenizer.encode(f"{sample['record']}\nQ: {first[0]}\nA:", add_special_tokens=False).ids
        assert batch.inputs[row, 1:len(prompt) + 1].tolist() == prompt


def test_copy_sequence_weights_the_predictable_repeat(train):
    sequence = train.copy_sequence(0, 7, 1, list(range(3, 50)))
    half = len(sequence.ids) // 2
    assert sequence.ids[:half] == sequence.ids[half:]
    assert sequence.answers == [(half + 1, 2 * half)]
