"""Finding and loading causal-LM checkpoints from local directories.

`check_model_dir` validates a directory without importing torch (config.json names a causal LM,
safetensors headers parse and the files are as long as their headers say), so a bad path fails
fast, with one line, before any variant runs. `load_causal_lm` does the real load.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = {"tiny-structured": Path(__file__).parent / "tiny_structured"}
ACCEPTED = "'builtin:" + "' | 'builtin:".join(BUILTIN_MODELS) + "' or a local Hugging Face causal-LM directory"


@dataclass(frozen=True)
class ModelDirInfo:
    path: Path
    architecture: str
    model_type: str
    weight_files: tuple[Path, ...]
    weight_bytes: int


def resolve_model_path(spec: str, base_dir: Path | None = None, *, file: str | None = None,
                       field: str = "model") -> Path:
    """'builtin:NAME' → the packaged directory; a relative path is taken from base_dir (the suite's folder)."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ModelLoadError(f"unknown built-in model '{name}'", file=file, field=field, accepted=ACCEPTED)
        return BUILTIN_MODELS[name]
    p = Path(spec).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    return p


def check_model_dir(path: Path, *, file: str | None = None, field: str = "model") -> ModelDirInfo:
    """Validate a checkpoint directory cheaply; raise ModelLoadError naming what is wrong."""
    if not path.exists():
        raise ModelLoadError(f"model directory {path} does not exist", file=file, field=field, accepted=ACCEPTED)
    if not path.is_dir():
        raise ModelLoadError(f"{path} is not a directory", file=file, field=field, accepted=ACCEPTED)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{path} has no config.json, so it is not a Hugging Face model directory",
                             file=file, field=field, accepted=ACCEPTED)
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_path} is not valid JSON ({e.__class__.__name__})", file=file, field=field,
                             accepted=ACCEPTED) from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_path} is not a JSON object", file=file, field=field, accepted=ACCEPTED)
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    causal = [a for a in archs if isinstance(a, str) and (a.endswith("ForCausalLM") or a.endswith("LMHeadModel"))]
    if not causal:
        raise ModelLoadError(
            f"{path} is not a causal LM (config.json architectures: {archs or 'none'})",
            file=file, field=field, accepted="a directory whose config.json names a *ForCausalLM architecture")
    weights = tuple(sorted(path.glob("*.safetensors")))
    if not weights:
        raise ModelLoadError(f"{path} has no .safetensors weights", file=file, field=field,
                             accepted="a directory with model.safetensors (or shards)")
    total = 0
    for w in weights:
        total += check_safetensors(w, file=file, field=field)
    return ModelDirInfo(path, causal[0], str(cfg.get("model_type", "")), weights, total)


def check_safetensors(path: Path, *, file: str | None = None, field: str = "model") -> int:
    """Parse a safetensors header and check the file holds every tensor it declares; return its size."""
    size = path.stat().st_size
    bad = lambda why: ModelLoadError(f"{path} is corrupt or truncated: {why}", file=file, field=field,  # noqa: E731
                                     accepted="an intact safetensors file")
    if size < 8:
        raise bad("shorter than the 8-byte header length")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8 or n > 100_000_000:
            raise bad(f"header says {n} bytes of metadata, the file has {size - 8}")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise bad("header is not valid JSON") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise bad("a tensor entry has no valid data_offsets") from None
    if 8 + n + end > size:
        raise bad(f"tensors need {8 + n + end} bytes, the file has {size}")
    return size


def tokenizer_fingerprint(path: Path) -> str:
    """A short id of a directory's tokenizer: equal ids mean token-level metrics are comparable."""
    h = hashlib.sha256()
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model"):
        f = path / name
        if f.is_file():
            h.update(name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def load_causal_lm(path: Path, dtype, device: str):
    """Load (model, tokenizer) from a local directory, eval mode, on `device`, in `dtype`."""
    import torch  # noqa: F401  (heavy imports stay out of the CLI's start-up path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except Exception as e:  # transformers raises many types; the user needs the one line
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "ignore_mismatched_sizes" in why:
            why = "the weights' shapes do not match what config.json asks for"
        raise ModelLoadError(f"cannot load {path}: {why}", field="model", accepted=ACCEPTED) from None
    model.to(device).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok
