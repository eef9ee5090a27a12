"""Finding and loading causal-LM checkpoints from local directories.

`check_model_dir` validates a directory without importing torch (config.json names a causal LM,
safetensors headers parse and the files are as long as their headers say, and the checks of
models/checks.py: no pickle-only weights, no remote code, a tokenizer, shapes that match config.json),
so a bad path fails fast, with one line, before any variant runs. `load_causal_lm` does the real
load, from safetensors only and never with the checkpoint's own code. `prompt_token_counts` counts a
dataset's prompts with the directory's tokenizer, as the engine will send them (planning asks, for a
model whose learned position table bounds the sequence).
"""
from __future__ import annotations

import functools
import hashlib
import json
import struct
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Sequence

from ..errors import ModelLoadError
from . import checks

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
    config: dict = dataclass_field(default_factory=dict)                      # config.json as parsed
    shapes: dict[str, tuple[int, ...]] = dataclass_field(default_factory=dict)  # tensor name → shape, from headers

    def position_limit(self) -> tuple[int, str] | None:
        """(most positions a sequence may take, why) where a learned position table bounds it; else None."""
        return checks.position_limit(self.config, self.shapes)


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


def check_model_dir(path: Path, *, file: str | None = None, field: str = "model",
                    trust_remote_code: bool = False) -> ModelDirInfo:
    """Validate a checkpoint directory cheaply; raise ModelLoadError naming what is wrong."""
    try:
        path.stat()
    except (OSError, ValueError) as e:   # a name too long for the OS, or with a NUL byte: not "does not exist"
        if not isinstance(e, FileNotFoundError):
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ModelLoadError(f"model directory {str(path)[:80]!r} cannot be looked up: {why}", file=file,
                                 field=field, accepted=ACCEPTED) from None
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
    if not trust_remote_code:
        checks.check_no_remote_code(path, cfg, file=file, field=field)
    weights = tuple(sorted(path.glob("*.safetensors")))
    if not weights:
        checks.check_no_pickle_only(path, file=file, field=field)
        raise ModelLoadError(f"{path} has no .safetensors weights", file=file, field=field,
                             accepted="a directory with model.safetensors (or shards)")
    total, shapes = 0, {}
    for w in weights:
        size, found = check_safetensors(w, file=file, field=field)
        total += size
        shapes |= found
    checks.check_shapes(path, cfg, shapes, file=file, field=field)
    checks.check_tokenizer(path, file=file, field=field)
    return ModelDirInfo(path, causal[0], str(cfg.get("model_type", "")), weights, total, cfg, shapes)


def check_safetensors(path: Path, *, file: str | None = None,
                      field: str = "model") -> tuple[int, dict[str, tuple[int, ...]]]:
    """Parse a safetensors header and check the file holds every tensor it declares; return its size and
    every tensor's shape (name → shape)."""
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
    tensors = {k: t for k, t in header.items() if k != "__metadata__"}
    try:
        end = max((int(t["data_offsets"][1]) for t in tensors.values()), default=0)
        shapes = {k: tuple(int(d) for d in t["shape"]) for k, t in tensors.items()}
    except (TypeError, KeyError, IndexError, ValueError):
        raise bad("a tensor entry has no valid data_offsets or shape") from None
    if 8 + n + end > size:
        raise bad(f"tensors need {8 + n + end} bytes, the file has {size}")
    return size, shapes


def tokenizer_fingerprint(path: Path) -> str:
    """A short id of a directory's tokenizer: equal ids mean token-level metrics are comparable."""
    h = hashlib.sha256()
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model"):
        f = path / name
        if f.is_file():
            h.update(name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def prompt_token_counts(path: Path, prompts: Sequence[str], *, trust_remote_code: bool = False,
                        file: str | None = None, field: str = "model") -> list[int]:
    """How many tokens each prompt takes as the measuring engine sends it: the directory's own tokenizer, with
    the special tokens it adds (backends/torch_engine.TorchEngine.encode; bench's scenarios apply no chat
    template). Imports transformers, and with it torch (a few seconds, once per process). The tokenizer is loaded
    once per process while its folder's files are unchanged: planning and the disk budget both count with it."""
    try:
        tok = _counting_tokenizer(str(path), trust_remote_code, _folder_stamp(Path(path)))
    except Exception as e:  # transformers raises many types; the user needs the one line
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelLoadError(f"cannot load the tokenizer of {path}: {why}", file=file, field=field,
                             accepted="a directory whose tokenizer transformers loads (tokenizer.save_pretrained(DIR))"
                             ) from None
    return [len(ids) for ids in tok(list(prompts), add_special_tokens=True).input_ids]


def _folder_stamp(path: Path) -> tuple:
    """Each file of a folder with its size and modification time: a changed tokenizer is loaded again."""
    try:
        return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file()))
    except OSError:
        return ()


@functools.lru_cache(maxsize=4)
def _counting_tokenizer(path: str, trust_remote_code: bool, stamp: tuple):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)


def load_causal_lm(path: Path, dtype, device: str, *, trust_remote_code: bool = False):
    """Load (model, tokenizer) from a local directory, eval mode, on `device`, in `dtype`.
    `trust_remote_code`: the suite's switch; only then may the directory's own Python (auto_map) run."""
    import torch  # noqa: F401  (heavy imports stay out of the CLI's start-up path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # safetensors only (a pickle is never opened); transformers' own code only unless the suite says so
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True, use_safetensors=True,
                                                     trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises many types; the user needs the one line
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "ignore_mismatched_sizes" in why:
            why = "the weights' shapes do not match what config.json asks for"
        if "custom code" in why and not trust_remote_code:
            raise ModelLoadError(f"cannot load {path}: it carries its own Python (config.json auto_map), which runs "
                                 "only when the suite turns it on", field="trust_remote_code",
                                 accepted="trust_remote_code: true, for a checkpoint whose code you trust") from None
        raise ModelLoadError(f"cannot load {path}: {why}", field="model", accepted=ACCEPTED) from None
    model.to(device).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok
