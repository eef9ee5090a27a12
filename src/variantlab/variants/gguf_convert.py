"""A checkpoint to GGUF with llama.cpp's own tools: its converter (convert_hf_to_gguf.py) to F32, F16 or BF16,
then `llama_model_quantize` (llama-cpp-python) to any type it quantizes to without an importance matrix.

The converter is not ours and is not copied here: it comes from the llama-cpp-python source distribution
(scripts/install_llamacpp.sh unpacks its vendor/llama.cpp converter, conversion/ and gguf-py/ into
~/.cache/variantlab/llamacpp/src-<version>/), or from a llama.cpp checkout named by VARIANTLAB_LLAMACPP_SRC.
Both steps run in a child process of their own: the converter imports its vendored gguf-py from sys.path, and
llama.cpp logs every tensor it quantizes to the process's stderr; a failure shows the tail of that output.

The converter names a byte-level BPE tokenizer's pre-tokenizer by hashing the ids it produces for a fixed
text and refuses a hash it does not know (our shipped tokenizer is one); the child subclasses the converter's
own model class so that an unknown hash is labelled "gpt-2" (the byte-level default) instead. variantlab feeds
a converted GGUF the baseline tokenizer's token ids, never text (backends/llamacpp.py), so the label changes
nothing that is measured; it only decides how llama.cpp itself would split text.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from ..errors import RecipeError
from .artifact_size import ArtifactSize, CheckpointWeights

LLAMA_CPP_VERSION = "0.3.36"
INSTALL = "bash scripts/install_llamacpp.sh"      # the extra: README, docs/runtimes.md
SOURCE_ENV = "VARIANTLAB_LLAMACPP_SRC"

# What the converter writes itself (outtype), and what llama_model_quantize makes from its F32 output
# (llama_cpp's LLAMA_FTYPE_* constant). The I-quants below 4 bits need an importance matrix: not offered.
CONVERTED = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
QUANTIZED = {"Q8_0": "MOSTLY_Q8_0", "Q6_K": "MOSTLY_Q6_K", "Q5_K_M": "MOSTLY_Q5_K_M", "Q5_K_S": "MOSTLY_Q5_K_S",
             "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1", "Q4_K_M": "MOSTLY_Q4_K_M", "Q4_K_S": "MOSTLY_Q4_K_S",
             "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "IQ4_XS": "MOSTLY_IQ4_XS", "IQ4_NL": "MOSTLY_IQ4_NL",
             "Q3_K_L": "MOSTLY_Q3_K_L", "Q3_K_M": "MOSTLY_Q3_K_M", "Q3_K_S": "MOSTLY_Q3_K_S", "Q2_K": "MOSTLY_Q2_K"}
GGUF_TYPES = (*CONVERTED, *QUANTIZED)

# Bits a weight of each type as llama.cpp writes it (ggml's blocks: Q8_0 is 32 int8 + an f16 scale, 8.5 bits;
# the K-quants' super-blocks hold 256), for the disk a build takes (`estimate`): (a 2-D weight's bits, its bits
# when 256 does not divide its rows, which llama.cpp writes in a fallback type: Q4_K → Q5_0, Q5_K → Q5_1,
# Q6_K → Q8_0, Q2_K/Q3_K/IQ4_XS → IQ4_NL). A type that mixes (Q4_K_M: Q6_K for about half of attn_v and
# ffn_down) is at its mix's mean, a little above llama.cpp's own figure for a 7B Llama.
BITS: dict[str, tuple[float, float]] = {
    "F32": (32, 32), "F16": (16, 16), "BF16": (16, 16), "Q8_0": (8.5, 8.5), "Q6_K": (6.5625, 8.5),
    "Q5_K_M": (5.75, 6.3), "Q5_K_S": (5.55, 6.05), "Q5_0": (5.5, 5.5), "Q5_1": (6, 6), "Q4_K_M": (4.85, 5.9),
    "Q4_K_S": (4.6, 5.6), "Q4_0": (4.5, 4.5), "Q4_1": (5, 5), "IQ4_XS": (4.25, 4.5), "IQ4_NL": (4.5, 4.5),
    "Q3_K_L": (4.3, 4.7), "Q3_K_M": (3.9, 4.6), "Q3_K_S": (3.5, 4.5), "Q2_K": (3.0, 4.5)}
SUPER_BLOCK = 256
OUTPUT_BITS = (6.5625, 8.5)   # the output head (the embedding where tied) of a quantized type: Q6_K, else Q8_0


def accepted_types() -> str:
    return " | ".join(GGUF_TYPES)


def cache_dir() -> Path:
    return Path(os.environ.get("VARIANTLAB_CACHE", Path.home() / ".cache" / "variantlab")) / "llamacpp"


def find_converter(spec: str | Path | None = None) -> Path:
    """The llama.cpp folder that holds convert_hf_to_gguf.py, conversion/ and gguf-py/: `spec` (a llama.cpp
    checkout or an unpacked llama-cpp-python sdist), else $VARIANTLAB_LLAMACPP_SRC, else what
    scripts/install_llamacpp.sh unpacked; RecipeError naming the install command when there is none."""
    given = spec or os.environ.get(SOURCE_ENV)
    candidates = [Path(given).expanduser()] if given else [cache_dir() / f"src-{LLAMA_CPP_VERSION}"]
    for base in candidates:
        for d in (base, base / "vendor" / "llama.cpp"):
            if (d / "convert_hf_to_gguf.py").is_file() and (d / "gguf-py").is_dir():
                return d
    where = f"{candidates[0]} (from {SOURCE_ENV})" if given else str(candidates[0])
    raise RecipeError(f"llama.cpp's GGUF converter is not at {where}",
                      accepted=f"run `{INSTALL}` once (it unpacks the converter), or set {SOURCE_ENV} to a "
                               "llama.cpp checkout")


def convert(model_dir: Path, out: Path, outtype: str, converter: Path | None = None) -> Path:
    """model_dir converted by llama.cpp's converter to GGUF `outtype` (F32, F16 or BF16), written to `out`."""
    src = converter or find_converter()
    return _run_child(["convert", str(src), str(model_dir), str(out), CONVERTED[outtype]], out)


def quantize(source: Path, out: Path, gguf_type: str, threads: int) -> Path:
    """llama_model_quantize of the GGUF `source` to `gguf_type` (a QUANTIZED key), written to `out`."""
    return _run_child(["quantize", str(source), str(out), gguf_type, str(threads)], out)


def tensors(gguf: Path, converter: Path | None = None) -> dict[str, dict]:
    """name → {"type", "bytes", "shape"} of every tensor of a GGUF, read by the converter's gguf-py."""
    src = converter or find_converter()
    done = subprocess.run([sys.executable, "-m", __name__, "tensors", str(src), str(gguf)], capture_output=True,
                          text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"reading the tensors of {gguf} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def decode_bytes(tensors: dict[str, dict]) -> int:
    """Bytes one decode step reads: every tensor, but one row of the token embedding table (a lookup) unless
    there is no output.weight (then the LM head reads the whole table), as variants/recipe.decode_weight_bytes."""
    total = sum(t["bytes"] for t in tensors.values())
    emb = tensors.get("token_embd.weight")
    if emb is None or "output.weight" not in tensors:
        return total
    return total - emb["bytes"] + emb["bytes"] // max(emb["shape"][-1], 1)


def linear_params(tensors: dict[str, dict]) -> int:
    """Weights multiplied per token (2 FLOPs each): every 2-D weight but the embedding table, which is only looked
    up, unless there is no output.weight (then the LM head multiplies by it)."""
    tied = "output.weight" not in tensors
    return sum(math.prod(t["shape"]) for name, t in tensors.items()
               if len(t["shape"]) == 2 and (tied or name != "token_embd.weight"))


def estimate(gguf_type: str, weights: CheckpointWeights, metadata_bytes: int = 0) -> ArtifactSize:
    """The GGUF of `gguf_type` made from a checkpoint of these tensors, estimated before it is made (BITS): 1-D
    tensors stay F32 (as the converter writes norms and biases), the output head of a quantized type (the
    embedding, where tied) takes Q6_K, or Q8_0 where 256 does not divide its rows (Q8_0 stays Q8_0), every other
    weight its type's bits; `metadata_bytes` is the vocabulary and merges it carries (about its tokenizer files).
    A quantized type is made from the converter's F32 output, which lies beside it until the quantizer is done:
    the build's transient bytes."""
    bits, short = BITS[gguf_type]
    output = weights.head or weights.embedding

    def tensor_bits(name: str, shape: tuple[int, ...]) -> float:
        if len(shape) < 2:
            return 32
        undivided = shape[-1] % SUPER_BLOCK != 0
        if name == output and gguf_type in QUANTIZED:
            return max(short if undivided else bits, OUTPUT_BITS[undivided])
        return short if undivided else bits
    total = sum(math.prod(s) * tensor_bits(n, s) for n, s in weights.shapes.items()) / 8
    f32 = weights.parameters * 4 + metadata_bytes
    return ArtifactSize(math.ceil(total) + metadata_bytes, f32 if gguf_type in QUANTIZED else 0)


def _run_child(args: list[str], out: Path, timeout_s: float = 3600.0) -> Path:
    """One step in a child process; its chatter is shown (the tail) only when it fails."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__, *args], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"llama.cpp {args[0]} to {out.name} took over {timeout_s:.0f} s; stopped") from None
    if done.returncode or not out.is_file():
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise RuntimeError(f"llama.cpp {args[0]} to {out.name} failed (exit {done.returncode}): {tail}")
    return out


# ---------------------------------------------------------------- the child steps

def _convert_child(src: str, model_dir: str, out: str, outtype: str) -> None:
    """convert_hf_to_gguf with the converter's own model class for the checkpoint's architecture."""
    sys.path[:0] = [src, str(Path(src) / "gguf-py")]
    import logging

    import gguf
    import torch
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    logging.basicConfig(level=logging.WARNING)
    folder = Path(model_dir)
    hparams = ModelBase.load_hparams(folder, False)
    base = get_model_class(get_model_architecture(hparams, ModelType.TEXT))
    tok_json = folder / "tokenizer.json"
    byte_bpe = (tok_json.is_file() and not (folder / "tokenizer.model").is_file()
                and json.loads(tok_json.read_text(encoding="utf-8")).get("model", {}).get("type") == "BPE")

    class ByteLevelBPE(base):                         # the converter requires model_arch on every class
        model_arch = base.model_arch

        def get_vocab_base_pre(self, tokenizer) -> str:
            try:
                return super().get_vocab_base_pre(tokenizer)
            except NotImplementedError:               # a hash it does not know: byte-level BPE is gpt-2's
                return "gpt-2"

        def set_vocab(self) -> None:
            if byte_bpe:                              # skip the SentencePiece attempt
                self._set_vocab_gpt2()
            else:
                super().set_vocab()

    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16}[outtype]
    with torch.inference_mode():
        ByteLevelBPE(folder, ftype, Path(out)).write()


def _quantize_child(source: str, out: str, gguf_type: str, threads: str) -> None:
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + QUANTIZED[gguf_type])
    params.nthread = int(threads)
    if llama_cpp.llama_model_quantize(source.encode(), out.encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize to {gguf_type} returned an error")


def _tensors_child(src: str, gguf: str) -> None:
    sys.path[:0] = [str(Path(src) / "gguf-py")]
    from gguf import GGUFReader
    reader = GGUFReader(gguf)
    print(json.dumps({t.name: {"type": t.tensor_type.name, "bytes": int(t.n_bytes),
                               "shape": [int(d) for d in t.shape]} for t in reader.tensors}))


if __name__ == "__main__":
    step, *rest = sys.argv[1:]
    {"convert": _convert_child, "quantize": _quantize_child, "tensors": _tensors_child}[step](*rest)
