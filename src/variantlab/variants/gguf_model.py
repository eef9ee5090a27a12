"""A GGUF model loaded by llama.cpp (llama-cpp-python's C API, `llama_cpp`), and its own tokenizer.

Only the C API is used, not the `Llama` class: the backend (backends/llamacpp.py) drives `llama_decode` itself,
so that it chooses which positions produce logits (the last of a prompt for generation, every one for scoring)
and reads each token as it lands. llama.cpp's log goes nowhere unless VARIANTLAB_LLAMACPP_LOG=1 (it logs every
tensor and every load step to stderr).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import types
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import ModelLoadError, RecipeError

INSTALL = "bash scripts/install_llamacpp.sh"
_LOG_SINK = None     # the ctypes callback must outlive every call into llama.cpp


def llama():
    """The llama_cpp module, initialised once (log silenced); RecipeError naming the install command without it."""
    global _LOG_SINK
    try:
        import llama_cpp
    except ImportError as e:
        raise RecipeError(f"backend: llamacpp needs llama-cpp-python, which does not import here ({e})",
                          accepted=f"install the llamacpp extra once: `{INSTALL}`") from None
    if _LOG_SINK is None:
        llama_cpp.llama_backend_init()
        if os.environ.get("VARIANTLAB_LLAMACPP_LOG") != "1":
            _LOG_SINK = llama_cpp.llama_log_callback(lambda level, text, data: None)
            llama_cpp.llama_log_set(_LOG_SINK, ctypes.c_void_p(0))
        else:
            _LOG_SINK = True
    return llama_cpp


@contextlib.contextmanager
def loaded_model(path: str | Path, *, vocab_only: bool = False) -> Iterator[object]:
    """The model of a GGUF file (memory-mapped), freed on exit; ModelLoadError when llama.cpp cannot load it."""
    model = load_model(path, vocab_only=vocab_only)
    try:
        yield model
    finally:
        llama().llama_model_free(model)


def load_model(path: str | Path, *, vocab_only: bool = False):
    L = llama()
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist", accepted="a GGUF file")
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    params.vocab_only = vocab_only
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {path} (VARIANTLAB_LLAMACPP_LOG=1 shows why)",
                             accepted="a GGUF file of an architecture this llama.cpp supports")
    return model


def _string(fill, size: int = 512) -> str:
    buf = ctypes.create_string_buffer(size)
    n = fill(buf, size)
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""


def file_type_name(code: int) -> str:
    """llama.cpp's name of a LLAMA_FTYPE code (`general.file_type`): Q4_0, Q4_K_M, F32, …"""
    L = llama()
    for name in dir(L):
        if name.startswith("LLAMA_FTYPE_") and getattr(L, name) == code and name != "LLAMA_FTYPE_GUESSED":
            return name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    return f"type {code}"


def model_info(model) -> dict:
    """What llama.cpp says of a loaded model: parameters, tensor bytes, file type, description, build features."""
    L = llama()
    ftype = _string(lambda b, n: L.llama_model_meta_val_str(model, b"general.file_type", b, n))
    return {"parameters": int(L.llama_model_n_params(model)), "tensor_bytes": int(L.llama_model_size(model)),
            "file_type": file_type_name(int(ftype)) if ftype.isdigit() else "unknown",
            "description": _string(lambda b, n: L.llama_model_desc(model, b, n)),
            "system_info": cpu_features(),
            "n_ctx_train": int(L.llama_model_n_ctx_train(model)), "n_layer": int(L.llama_model_n_layer(model)),
            "n_embd": int(L.llama_model_n_embd(model)), "n_head": int(L.llama_model_n_head(model)),
            "n_head_kv": int(L.llama_model_n_head_kv(model))}


def cpu_features() -> str:
    """The instruction sets this llama.cpp build uses ("AVX2 AVX512 AVX512_VNNI …"), from its system info."""
    parts = llama().llama_print_system_info().decode().replace("CPU :", "|").split("|")
    return " ".join(p.split("=")[0].strip() for p in parts if p.strip().endswith("= 1")) or "none reported"


class GGUFTokenizer:
    """The GGUF's own vocabulary, text <-> ids as llama.cpp does it, behind the part of a Hugging Face tokenizer's
    interface that backends/tokenized.py and backends/stopping.py use: for a user's GGUF whose vocabulary is not
    the checkpoint's."""

    is_fast = False     # no offsets: teacher forcing's predicted bytes re-decode the first token

    def __init__(self, model):
        L = self._L = llama()
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.bos_token_id = int(L.llama_vocab_bos(self.vocab))
        self.eos_token_id = int(L.llama_vocab_eos(self.vocab))
        self.all_special_ids = [i for i in (self.bos_token_id, self.eos_token_id) if i >= 0]

    def __len__(self) -> int:
        return self.n_vocab

    def __call__(self, text: str, add_special_tokens: bool = True):
        return types.SimpleNamespace(input_ids=self.encode(text, add_special_tokens))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        for _ in range(2):
            buf = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special_tokens, False)
            if n >= 0:
                return list(buf[:n])
            cap = -n
        raise RuntimeError("llama_tokenize kept asking for more room")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        arr = (self._L.llama_token * max(len(ids), 1))(*ids)
        cap = 16 * len(ids) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = self._L.llama_detokenize(self.vocab, arr, len(ids), buf, cap, skip_special_tokens, False)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = -n
        raise RuntimeError("llama_detokenize kept asking for more room")

    def batch_decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]
