"""GGUF variants as artifacts: a GGUF built from the suite's checkpoint by llama.cpp's tools, or one the user
already has, described and sealed like our torch artifacts (variants/artifact.py) and reused the same way.

A built GGUF artifact is one folder:

    model.gguf             llama.cpp's converter output (F32/F16/BF16), or that F32 quantized by llama.cpp
    tokenizer files        copied from the checkpoint: the backend feeds the GGUF these token ids (the baseline's)
    generation_config.json copied when the checkpoint has one (its EOS ids)
    variant.json           what was built (gguf_type, source path + fingerprint, llama-cpp-python version), facts
                           (parameters, tensor bytes, bits per weight, llama.cpp's build), sealed with the sha256 of
                           every file (artifact_content.py)

A user's GGUF is not copied: variant.json names the file (path, bytes, sha256). Its tokenizer is checked against
the suite checkpoint's by behaviour when the artifact is made: llama.cpp turns the checkpoint tokenizer's ids
of every calibration text back into that very text (`same_vocabulary`). Then the checkpoint's tokenizer files
are copied in and the GGUF gets the baseline's token ids, so every token-level row compares; otherwise the
GGUF's own tokenizer is used and token-level rows say "not comparable" (bits per byte and task accuracy still
compare). Like variants/artifact.py, checking (`gguf_problem`) never imports llama_cpp or torch.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from importlib import metadata
from pathlib import Path

from ..errors import ModelLoadError
from . import gguf_convert
from .artifact import _SOURCE_FILES, folder_written, source_fingerprint
from .artifact_content import content_problem, file_sha256, sealed
from .facts import VariantFacts
from .page_cache import as_read_from_disk

FORMAT = "variantlab-gguf-artifact"
FORMAT_VERSION = 2     # 2: the checkpoint tokenizer's class pinned in the copy (_copy_tokenizer)
GGUF_FILE = "model.gguf"
META_FILE = "variant.json"
TOKENIZER_OWN = "the GGUF's own (llama.cpp)"


def llama_cpp_version() -> str | None:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return None


def build_gguf_artifact(source: str | Path, config: dict, out_dir: str | Path, *, threads: int,
                        calibration_texts=(), converter: Path | None = None) -> dict:
    """Make the artifact of a GGUF variant (`config`: {"gguf_type": T} from the checkpoint `source`, or
    {"gguf_file": path} the user's) in out_dir; return its variant.json. Written beside out_dir and renamed
    over it at the end, as torch artifacts are."""
    t0 = time.perf_counter()
    out_dir, source = Path(out_dir), Path(source).resolve()
    with folder_written(out_dir) as tmp:
        timings: dict[str, float] = {}
        if config.get("gguf_file"):
            gguf = Path(config["gguf_file"])
            digest = hashlib.sha256()   # hashed as it is settled: the user's file is read once, never written
            sha256 = digest.hexdigest() if _settle(gguf, timings, digest) else file_sha256(gguf)
            same, why = same_vocabulary(gguf, source, calibration_texts) if source.is_dir() else (False, "no checkpoint")
            tokenizer = "the checkpoint's" if same else TOKENIZER_OWN
            made = {"gguf_file": str(gguf), "file": {"bytes": gguf.stat().st_size, "sha256": sha256},
                    "tokenizer_check": why}
            if same:
                _copy_tokenizer(source, tmp)
        else:
            gguf, gguf_type = tmp / GGUF_FILE, config["gguf_type"]
            _make(source, gguf_type, gguf, tmp, threads, converter, timings)
            _settle(gguf, timings)
            _copy_tokenizer(source, tmp)
            tokenizer = "the checkpoint's"
            made = {"gguf_type": gguf_type}
        facts = describe(gguf, tokenizer)
        timings["build_s"] = time.perf_counter() - t0
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **made,
                "facts": facts.to_json(), "weights": {"file": str(gguf), "bytes_on_disk": gguf.stat().st_size},
                "source": {"model_path": str(source), "fingerprint": source_fingerprint(source) if source.is_dir()
                           else None},
                "llama_cpp_python": llama_cpp_version(), "build": timings,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if not config.get("gguf_file"):
            meta["weights"]["file"] = GGUF_FILE
        meta = sealed(meta, tmp, besides=META_FILE)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


def _settle(gguf: Path, timings: dict, digest=None) -> bool:
    """Hold the GGUF in the page cache as llama.cpp finds a file read from disk, not as just written (ours was
    written a moment ago; a user's may have been too, by llama.cpp's converter or a download): page_cache.py.
    Whether it was read through (and `digest` fed its bytes)."""
    t = time.perf_counter()
    read = as_read_from_disk(gguf, digest)
    timings["page_cache_s"] = time.perf_counter() - t
    return read


def _make(source: Path, gguf_type: str, out: Path, tmp: Path, threads: int, converter, timings: dict) -> None:
    """The converter writes F32/F16/BF16 itself; any other type is quantized from its F32 output."""
    t = time.perf_counter()
    if gguf_type in gguf_convert.CONVERTED:
        gguf_convert.convert(source, out, gguf_type, converter)
        timings["convert_s"] = time.perf_counter() - t
        return
    f32 = tmp / ".model-F32.gguf"
    gguf_convert.convert(source, f32, "F32", converter)
    timings["convert_s"] = time.perf_counter() - t
    t = time.perf_counter()
    gguf_convert.quantize(f32, out, gguf_type, threads)
    timings["quantize_s"] = time.perf_counter() - t
    f32.unlink()


def _copy_tokenizer(source: Path, into: Path) -> None:
    """The checkpoint's tokenizer files, and the class its tokenizer loads as pinned in tokenizer_config.json:
    transformers picks a class by config.json's model type where that file names none, and for some model types
    (qwen2) whatever it names, so a qwen2 checkpoint loads as Qwen2Tokenizer, which rebuilds Qwen2's pipeline;
    a GGUF folder has no config.json, so the same files would load as the class they name (TokenizersBackend),
    which can split a text into other ids. Pinned, the GGUF's prompts are the baseline's ids."""
    for f in _SOURCE_FILES:
        if (source / f).is_file():
            shutil.copyfile(source / f, into / f)
    from transformers import AutoTokenizer
    try:
        cls = type(AutoTokenizer.from_pretrained(source, local_files_only=True)).__name__
    except (OSError, ValueError):      # no tokenizer to pin (the backend then runs on the GGUF's own)
        return
    path = into / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if config.get("tokenizer_class") != cls:
        path.write_text(json.dumps(config | {"tokenizer_class": cls}, indent=2), encoding="utf-8")


def describe(gguf: Path, tokenizer: str) -> VariantFacts:
    """What llama.cpp says of the GGUF once loaded: parameters, tensor bytes, its type, the build's features."""
    from .gguf_model import loaded_model, model_info
    with loaded_model(gguf) as model:
        info = model_info(model)
    params, size = info["parameters"], info["tensor_bytes"]
    found = gguf_convert.tensors(gguf)
    types: dict[str, int] = {}
    for t in found.values():
        types[t["type"]] = types.get(t["type"], 0) + 1
    stored = ", ".join(f"{n} {name}" for name, n in sorted(types.items(), key=lambda kv: -kv[1]))
    return VariantFacts(
        recipe=f"gguf {info['file_type']}", dtype=info["file_type"], parameters=params, weight_bytes=size,
        bits_per_weight=8.0 * size / max(params, 1),
        kernels=(f"llama.cpp ggml-cpu ({info['system_info']})",),
        notes=(f"llama.cpp (llama-cpp-python {llama_cpp_version()}): {info['description']}; tensors: {stored}; "
               f"tokenizer: {tokenizer}",),
        extra={"runtime": "llama.cpp", "gguf_file_type": info["file_type"], "tokenizer": tokenizer,
               "artifact_bytes_on_disk": gguf.stat().st_size, "system_info": info["system_info"],
               "tensor_types": types, "decode_weight_bytes": gguf_convert.decode_bytes(found),
               # explain's roofline (explain/roofline.ModelShape): llama.cpp keeps its KV cache in f16
               "shape": {"weight_bytes": gguf_convert.decode_bytes(found),
                         "linear_params": gguf_convert.linear_params(found), "layers": info["n_layer"],
                         "heads": info["n_head"], "kv_heads": info["n_head_kv"],
                         "head_dim": info["n_embd"] // max(info["n_head"], 1), "kv_bytes_per_element": 2}})


def same_vocabulary(gguf: Path, checkpoint: Path, texts) -> tuple[bool, str]:
    """Whether llama.cpp reads the checkpoint tokenizer's token ids as the same text (every calibration text,
    ids decoded back byte for byte), and what was checked."""
    from transformers import AutoTokenizer

    from .gguf_model import GGUFTokenizer, loaded_model
    try:
        hf = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    except (OSError, ValueError) as e:
        return False, f"the checkpoint's tokenizer does not load ({type(e).__name__})"
    texts = list(texts)[:64] or ["The quick brown fox: 12 jumps."]
    with loaded_model(gguf, vocab_only=True) as model:
        own = GGUFTokenizer(model)
        if own.n_vocab != len(hf):
            return False, f"the GGUF has {own.n_vocab} tokens, the checkpoint's tokenizer {len(hf)}"
        for i, text in enumerate(texts):
            ids = hf(text, add_special_tokens=False).input_ids
            if own.decode(ids) != hf.decode(ids, skip_special_tokens=True):
                return False, f"llama.cpp reads the checkpoint tokenizer's ids of calibration text {i} as other text"
    return True, f"llama.cpp reads the checkpoint tokenizer's ids of {len(texts)} calibration texts as the same text"


# ---------------------------------------------------------------- checking (no llama_cpp, no torch)

def read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise ModelLoadError(f"{path} has no readable {META_FILE}", accepted="a folder written by `variantlab build`")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelLoadError(f"{path / META_FILE} is not a variantlab GGUF artifact description",
                             accepted="a folder written by `variantlab build` for a backend: llamacpp variant")
    return meta


def gguf_path(artifact: str | Path) -> Path:
    """The GGUF file an artifact runs: its own model.gguf, or the user's file it names."""
    meta = read_meta(Path(artifact))
    return Path(meta["gguf_file"]) if meta.get("gguf_file") else Path(artifact) / GGUF_FILE


def gguf_problem(artifact: str | Path, config: dict, source: str | Path) -> str | None:
    """None when the artifact is this GGUF variant (same type from the same checkpoint weights, or the same
    user file, unchanged), made by this llama-cpp-python, with every file as sealed; else why not."""
    path = Path(artifact)
    try:
        meta = read_meta(path)
    except ModelLoadError as e:
        return e.detail
    if meta.get("format_version") != FORMAT_VERSION:
        return f"GGUF artifact format {meta.get('format_version')}, this variantlab reads {FORMAT_VERSION}"
    if meta.get("llama_cpp_python") != llama_cpp_version():
        return f"made with llama-cpp-python {meta.get('llama_cpp_python')}, this is {llama_cpp_version()}"
    want = config.get("gguf_file") or config.get("gguf_type")
    have = meta.get("gguf_file") or meta.get("gguf_type")
    if have != want:
        return f"GGUF {have}, the variant's is {want}"
    if meta.get("gguf_file"):
        f, rec = Path(meta["gguf_file"]), meta.get("file") or {}
        if not f.is_file() or f.stat().st_size != rec.get("bytes") or file_sha256(f) != rec.get("sha256"):
            return f"{f} changed since the artifact was made"
    else:
        src = Path(source).resolve()
        fp = (meta.get("source") or {}).get("fingerprint") or {}
        if not src.is_dir() or fp.get("sha256") != source_fingerprint(src)["sha256"]:
            return f"built from other weights than {src}'s now"
    return content_problem(meta, path, besides=META_FILE)
