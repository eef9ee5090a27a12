"""Random-weight checkpoints of deployed shapes (models/synthetic.py): the synthetic byte-level BPE has exactly
the vocabulary asked for, valid merges, lossless round trips and English at 3–5 characters a token; the
registry's shapes count the real models' parameters; a 2-layer checkpoint of Qwen2.5's 151,936-token
vocabulary loads with transformers, ties its head and gives finite logits; the same seed writes the same bytes."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from variantlab.errors import VariantlabError
from variantlab.models import synthetic
from variantlab.models.synthetic import SHAPES, Shape, synthetic_merges, synthetic_tokenizer, write_checkpoint

ENGLISH = ("The committee met on Tuesday to review the proposal for a new public library in the centre of town. "
           "Several members argued that the building would cost far more than the council had planned, while "
           "others pointed out that the old library had been closed for repairs twice in the last three years. "
           "Photosynthesis is the process by which green plants, algae and some bacteria turn sunlight into "
           "chemical energy; scientists estimate that it captures roughly a hundred terawatts across the planet.\n\n"
           "She pushed the heavy door open and stepped into the kitchen, where the smell of burnt toast still hung "
           "in the air. \"They said no,\" he murmured without looking up.")
UTF8 = "Héllo wörld — naïve café, déjà vu… 日本語のテキスト, Ελληνικά, emoji 🙂, tabs\tand\nnewlines  "
SMALL = Shape("small-test", "llama", 32, 64, 1, 2, 1, 1000, False)     # a checkpoint of a few hundred kB


@pytest.fixture(scope="module")
def tok151k():
    return synthetic_tokenizer(151_936)


# --------------------------------------------------------------------------- the tokenizer

@pytest.mark.parametrize("vocab_size", [32_000, 49_152, 151_936])
def test_the_tokenizer_has_exactly_the_vocabulary_asked_for(vocab_size):
    tok = synthetic_tokenizer(vocab_size)
    assert tok.get_vocab_size() == vocab_size == len(tok.get_vocab())
    assert sorted(tok.get_vocab().values()) == list(range(vocab_size))
    assert [tok.id_to_token(vocab_size - 3 + i) for i in range(3)] == list(synthetic.SPECIAL_TOKENS)
    assert tok.encode("<|endoftext|>hello").ids[0] == vocab_size - 3          # a special token is one id


def test_every_merge_joins_two_earlier_tokens_into_a_new_one():
    vocab, merges = synthetic_merges(151_936)
    made = set(list(vocab)[:256])
    for a, b in merges:
        assert a in made and b in made and a + b not in made
        made.add(a + b)
    assert made == set(vocab) and len(vocab) == 151_936 - 3


def test_the_tokenizer_is_the_same_every_time(tok151k):
    digest = hashlib.sha256(tok151k.to_str().encode()).hexdigest()
    assert hashlib.sha256(synthetic_tokenizer(151_936).to_str().encode()).hexdigest() == digest


@pytest.mark.parametrize("text", [ENGLISH, UTF8, "x = [1, 2, 3]  # 12345\n\n\tdef f():\n        return 'ok'"])
def test_text_round_trips(tok151k, text):
    assert tok151k.decode(tok151k.encode(text).ids) == text


@pytest.mark.parametrize("vocab_size", [32_000, 151_936])
def test_english_comes_out_at_3_to_5_characters_a_token(vocab_size):
    tok = synthetic_tokenizer(vocab_size)
    assert 3.0 <= len(ENGLISH) / len(tok.encode(ENGLISH).ids) <= 5.0
    assert tok.encode(" the").tokens == ["Ġthe"]


def test_a_vocabulary_below_the_bytes_is_refused():
    with pytest.raises(VariantlabError, match="vocab_size 100"):
        synthetic_tokenizer(100)
    assert synthetic_tokenizer(259).get_vocab_size() == 259


# --------------------------------------------------------------------------- the shapes

@pytest.mark.parametrize("name, real", [("qwen2.5-0.5b", 494_032_768), ("smollm2-360m", 361_821_120),
                                        ("llama-3.2-1b", 1_235_814_400)])
def test_the_registry_counts_the_real_models_parameters(name, real):
    assert abs(SHAPES[name].params() - real) <= 0.01 * real


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_shape_counts_what_transformers_builds(name):
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):                          # no memory, whatever the shape
        model = AutoModelForCausalLM.from_config(SHAPES[name].config())
    assert sum(p.numel() for p in model.parameters()) == SHAPES[name].params()
    assert model.config.vocab_size == SHAPES[name].vocab
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == SHAPES[name].tied


def test_an_unknown_shape_names_the_known_ones(tmp_path):
    with pytest.raises(VariantlabError) as info:
        write_checkpoint(tmp_path, "gpt-5")
    assert "'gpt-5'" in str(info.value) and "qwen2.5-0.5b" in info.value.accepted


# --------------------------------------------------------------------------- the checkpoint

@pytest.fixture(scope="module")
def qwen_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2-vocab-tiny")
    done = write_checkpoint(path, "qwen2-vocab-tiny", seed=1)
    assert done["params"] == SHAPES["qwen2-vocab-tiny"].params() and done["vocab"] == 151_936
    return path


@pytest.mark.model
def test_the_151k_vocabulary_checkpoint_loads_and_runs(qwen_tiny, tok151k):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from variantlab.models.loading import check_model_dir

    assert {p.name for p in qwen_tiny.iterdir()} >= {"config.json", "generation_config.json", "model.safetensors",
                                                     "tokenizer.json", "tokenizer_config.json",
                                                     "special_tokens_map.json"}
    assert check_model_dir(qwen_tiny).architecture == "Qwen2ForCausalLM"
    model = AutoModelForCausalLM.from_pretrained(qwen_tiny, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(qwen_tiny, local_files_only=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.model.layers[0].self_attn.q_proj.bias is not None               # Qwen2's q/k/v bias
    ids = tok(ENGLISH, return_tensors="pt").input_ids
    assert ids[0].tolist() == tok151k.encode(ENGLISH).ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 151_936)
    assert torch.isfinite(logits).all() and logits.std() > 1e-3                  # finite, not flat
    assert tok.eos_token_id == tok.pad_token_id == model.config.eos_token_id == 151_933


@pytest.mark.model
@pytest.mark.parametrize("tokenizer_class", [None, "Qwen2Tokenizer"])
def test_the_tokenizer_classes_give_the_same_ids(qwen_tiny, tmp_path, tokenizer_class):
    """In a qwen2 folder AutoTokenizer loads Qwen2Tokenizer whatever tokenizer_config.json says; without
    config.json it loads the class named there. This tokenizer's pipeline is Qwen2's, so the ids agree."""
    from transformers import AutoTokenizer
    folder, alone = tmp_path / "folder", tmp_path / "alone"
    shutil.copytree(qwen_tiny, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    alone.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen_tiny / name, alone / name)
    if tokenizer_class:
        for where in (folder, alone):
            settings = json.loads((where / "tokenizer_config.json").read_text())
            (where / "tokenizer_config.json").write_text(json.dumps(settings | {"tokenizer_class": tokenizer_class}))
    in_folder = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    on_its_own = AutoTokenizer.from_pretrained(alone, local_files_only=True)
    assert type(in_folder).__name__ == "Qwen2Tokenizer"
    assert type(on_its_own).__name__ == (tokenizer_class or "TokenizersBackend")
    text = "Done.\n\nThe end"
    assert in_folder(text).input_ids == on_its_own(text).input_ids == [68, 647, 262, 784, 1656]
    assert in_folder(ENGLISH).input_ids == on_its_own(ENGLISH).input_ids


@pytest.mark.model
def test_the_same_seed_writes_the_same_weights(tmp_path):
    a = write_checkpoint(tmp_path / "a", SMALL, seed=3)
    write_checkpoint(tmp_path / "b", SMALL, seed=3)
    write_checkpoint(tmp_path / "c", SMALL, seed=4)
    read = lambda name: (tmp_path / name / "model.safetensors").read_bytes()        # noqa: E731
    assert read("a") == read("b") != read("c")
    assert a["params"] == SMALL.params() and a["bytes"] > 4 * SMALL.params()


@pytest.mark.model
def test_bfloat16_weights_load_as_bfloat16(tmp_path):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    write_checkpoint(tmp_path, SMALL, dtype="bfloat16")
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"} and "lm_head.weight" in f.keys()       # untied: the head is stored
        norm = f.get_tensor("model.norm.weight")
    assert norm.dtype == torch.bfloat16 and bool((norm == 1).all())
    model = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert model.dtype == torch.bfloat16
    with pytest.raises(VariantlabError, match="dtype"):
        write_checkpoint(tmp_path, SMALL, dtype="int8")


def test_the_command_writes_and_says_what(tmp_path, capsys):
    assert synthetic.main([str(tmp_path / "out"), "--shape", "llama2-vocab-tiny", "--seed", "2"]) == 0
    line = capsys.readouterr().out.strip()
    assert "llama2-vocab-tiny" in line and f"{SHAPES['llama2-vocab-tiny'].params():,} parameters" in line
    assert "vocab 32,000" in line and (tmp_path / "out" / "model.safetensors").is_file()
    assert synthetic.main([str(tmp_path / "bad"), "--shape", "nope"]) == 2
    assert "unknown shape 'nope'" in capsys.readouterr().err


@pytest.mark.e2e
def test_variantlab_make_checkpoint_runs_as_a_command(tmp_path):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "variantlab.cli", "make-checkpoint", str(tmp_path / "m"),
                           "--shape", "smollm2-vocab-tiny", "--tokenizer-class", "PreTrainedTokenizerFast"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "smollm2-vocab-tiny" in done.stdout and "vocab 49,152" in done.stdout
    settings = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast"
    bad = subprocess.run([sys.executable, "-m", "variantlab.cli", "make-checkpoint", str(tmp_path / "n"),
                          "--shape", "nope"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown shape 'nope'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
