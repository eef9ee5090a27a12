"""Shared fixtures.

`tiny_model_dir`: a tiny random LlamaForCausalLM (hidden 32, 2 layers, 2 heads) saved with
`save_pretrained` together with a fast tokenizer, once per session. It uses the shipped reference
model's tokenizer when `builtin:tiny-structured` has been trained, else a small byte-level BPE
trained here on a few lines of text, so tests that need "a real model directory" never depend on
the (slow to train) reference weights.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import variantlab

# One thread for the models tests run in this process: on 2 shared cores, two OpenMP threads made
# tiny-model tests about ten times slower under load. Suites measured in worker processes set their own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# --- tests marked `cuda`: collected everywhere, skipped with the reason where torch sees no CUDA device

def cuda_unavailable_reason() -> str | None:
    """Why the `cuda` tests cannot run here (None: they can)."""
    import torch
    if torch.cuda.is_available():
        return None
    why = "this torch build has no CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
    return f"needs a CUDA device: {why} (torch {torch.__version__}); scripts/device_check.sh runs it on a GPU"


@pytest.hookimpl(trylast=True)      # after -m has deselected: count only the tests this run would have run
def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("cuda")]
    reason = cuda_unavailable_reason() if marked else None
    if reason is None:
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


def cuda_skips(reports) -> tuple[int, str]:
    """How many of these test reports are `cuda` tests skipped for want of a device, and why (the first's reason).
    Counted from the reports, which the test processes (pytest-xdist's included) send to the one that prints."""
    reasons = [rep.longrepr[2] for rep in reports
               if "cuda" in rep.keywords and isinstance(rep.longrepr, tuple) and "needs a CUDA device" in rep.longrepr[2]]
    return len(reasons), (reasons[0].removeprefix("Skipped: ") if reasons else "")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n, reason = cuda_skips(terminalreporter.stats.get("skipped", []))
    if n:
        terminalreporter.write_line(f"{n} tests marked cuda skipped: {reason}")

SHIPPED_MODEL_DIR = Path(variantlab.__file__).parent / "models" / "tiny_structured"
TOKENIZER_TEXTS = [
    'order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA: pending',
    '[{"invoice":"INV-65887","paid":"yes"}]\nQ: How many invoices have paid yes?\nA: 2',
    "hello world\nQ: what A: 42",
]


def build_tokenizer(texts=TOKENIZER_TEXTS, vocab_size: int = 300):
    """A byte-level BPE fast tokenizer with <pad>=0, <s>=1, </s>=2; any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts) * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def _tokenizer():
    if (SHIPPED_MODEL_DIR / "tokenizer.json").is_file():
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(SHIPPED_MODEL_DIR, local_files_only=True)
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A valid Hugging Face causal-LM directory: config.json, model.safetensors, tokenizer files.

    Read-only for tests: copy it (shutil.copytree) before changing anything inside.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_model")
    tok = _tokenizer()
    tok.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        # A wider init than the default 0.02 gives peaked next-token distributions, so greedy
        # choices are not decided by float rounding (batch vs single-request comparisons).
        initializer_range=0.5, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir):
    """(model, tokenizer) of `tiny_model_dir`, loaded once in fp32 on the CPU. Do not modify them:
    copy.deepcopy the model first."""
    import torch

    from variantlab.models.loading import load_causal_lm
    return load_causal_lm(tiny_model_dir, torch.float32, "cpu")


def switch_off_our_kernels(monkeypatch) -> None:
    """Our decode kernels (variants/kernels) count as unavailable, as on a CPU without AVX-512: every
    module takes its aten path and W4A8 its group-major int8 layout (at build and at every call)."""
    from variantlab.variants import kernels

    monkeypatch.setattr(kernels, "_status", kernels.KernelStatus(
        False, "our CPU kernels are off: switched off for this test; aten runs instead"))


@pytest.fixture
def aten_only(monkeypatch):
    """The test runs with our decode kernels switched off (switch_off_our_kernels)."""
    switch_off_our_kernels(monkeypatch)


TINY_KERNEL_SOURCE = 'extern "C" int variantlab_test_answer() { return ANSWER; }\n'


@pytest.fixture
def tiny_kernels(monkeypatch, tmp_path):
    """Our kernels' build path (variants/kernels/_build.py → _cache.py) driven with a one-function C++ library
    instead of gemv_avx512.cpp, compiled by the real compiler in well under a second and runnable on any
    CPU: KERNELS swapped, its requirement met, VARIANTLAB_CACHE in the test's folder (its builds land in
    tmp_path/cache/kernels), this process's status forgotten. Returns the extension."""
    from variantlab.variants import kernels
    from variantlab.variants.kernels import _build, _cache

    source = tmp_path / "answer.cpp"
    source.write_text(TINY_KERNEL_SOURCE)
    name = "vl_test_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]   # one per test: a library's
    ext = _cache.Extension(name, (source,), ("-O2", "-DANSWER=42"),             # file, ninja's target
                           title="variantlab's CPU kernels", expected_s=35)
    monkeypatch.setattr(_build, "KERNELS", ext)
    monkeypatch.setattr(_build, "missing_requirement", lambda: None)
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(_build.SWITCH, raising=False)
    monkeypatch.setattr(kernels, "_status", None)
    return ext


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path) -> Path:
    """VARIANTLAB_CACHE in the test's folder, empty but for kernels/: the one folder where our kernels' builds are
    kept (keyed by their source and toolchain), linked to this run's. The cold cache a test wants is of what it
    measures (hw/: ceilings, kernel times); a fresh kernels/ would also compile our kernels again, 40-70 s a test,
    which tests/variants/test_kernel_cache.py covers."""
    from variantlab.variants.kernels import _cache
    shared = _cache.default_root()
    shared.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernels").symlink_to(shared, target_is_directory=True)
    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def our_kernels():
    """Skips the test where our decode kernels cannot run (their status says why)."""
    from variantlab.variants import kernels

    st = kernels.status()
    if not st.available:
        pytest.skip(st.reason)
    return st


# --- tiny random checkpoints of the families users bring (tests/variants/test_families.py's table)

FAMILIES = ("gpt2", "phi3", "gemma", "gemma2", "gemma3", "neox")


def family_config(family: str, tok):
    import transformers as tf
    ids = {"vocab_size": len(tok), "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id,
           "eos_token_id": tok.eos_token_id, "initializer_range": 0.2}
    if family == "gpt2":
        return tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, **ids)
    common = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "max_position_embeddings": 128, **ids}
    if family == "neox":
        return tf.GPTNeoXConfig(**common)   # rotary on 0.25 of each head, parallel residual
    gemma = {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 32}
    return {
        "phi3": lambda: tf.Phi3Config(num_key_value_heads=2, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, **common),
        "gemma": lambda: tf.GemmaConfig(num_key_value_heads=2, head_dim=16, **common),
        "gemma2": lambda: tf.Gemma2Config(**gemma, **common),   # layers: sliding, full; soft-capping on
        "gemma3": lambda: tf.Gemma3TextConfig(layer_types=["sliding_attention", "full_attention"], **gemma, **common),
    }[family]()


@pytest.fixture(scope="session")
def family_dirs(tiny_model_dir, tmp_path_factory):
    """family → a checkpoint directory (config.json, model.safetensors, the session's tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    dirs = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(family_config(family, tok)).save_pretrained(path)
        tok.save_pretrained(path)
        dirs[family] = path
    return dirs


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster of 2 CPUs, started once and shared by the tests that need one (Ray's
    local mode no longer exists). An executor finds it running and joins it rather than start its own."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[test,ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def nan_model_copy(source: Path, folder: Path) -> Path:
    """A copy of the model in `source` whose LM head has one row of NaN: every position's logits hold a NaN."""
    import shutil

    from safetensors.torch import load_file, save_file
    for f in Path(source).iterdir():
        shutil.copy(f, folder / f.name)
    state = load_file(folder / "model.safetensors")
    key = "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
    state[key] = state[key].clone()
    state[key][5] = float("nan")
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def tiny_qwen2(tiny_model_dir, path: Path, intermediate: int, initializer_range: float) -> Path:
    """A tiny random Qwen2ForCausalLM (hidden 64, 2 layers, 4 query and 2 K/V heads, q/k/v biases, a tied head)
    with the session's tokenizer, saved in `path`."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, initializer_range=initializer_range, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def qwen2_688_dir(tiny_model_dir, tmp_path_factory):
    """A tiny Qwen2 whose MLP is Qwen2-style in width: intermediate_size 688 = 16 × 43, which no group size of 32,
    64 or 128 divides."""
    return tiny_qwen2(tiny_model_dir, tmp_path_factory.mktemp("qwen2_688"), 688, 0.2)


@pytest.fixture(scope="session")
def reference_gguf(tmp_path_factory):
    """`reference_gguf("Q8_0")`: the artifact folder of a GGUF that llama.cpp's tools made from the shipped
    reference model, built once per type per session; skipped, with the reason, without llama-cpp-python or its
    converter (scripts/install_llamacpp.sh; CI installs both)."""
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: bash scripts/install_llamacpp.sh")
    from variantlab.errors import RecipeError
    from variantlab.models.loading import BUILTIN_MODELS
    from variantlab.variants import gguf_artifact, gguf_convert
    try:
        gguf_convert.find_converter()
    except RecipeError as e:
        pytest.skip(str(e))
    root, made = tmp_path_factory.mktemp("reference-gguf"), {}

    def artifact(gguf_type: str) -> Path:
        if gguf_type not in made:
            gguf_artifact.build_gguf_artifact(BUILTIN_MODELS["tiny-structured"], {"gguf_type": gguf_type},
                                              root / gguf_type, threads=2)
            made[gguf_type] = root / gguf_type
        return made[gguf_type]
    return artifact
