"""What a checkpoint directory must hold before anything loads it, told from its files alone (no torch).

A directory that fails here would otherwise fail — or worse, run someone's code — inside a worker,
after the baseline had been measured (issue 13):

- weights only as safetensors: a pickle checkpoint (pytorch_model.bin, *.pt, *.ckpt) can run any
  Python while it is unpickled, so variantlab never unpickles one; the error says how to convert it.
- no remote code: a config.json whose `auto_map` points at the checkpoint's own Python, for a model
  type transformers does not ship, can only load with trust_remote_code, which variantlab never turns on.
- a tokenizer: the worker loads it with AutoTokenizer(local_files_only=True).
- config.json's shapes agree with the weights: a vocab_size, width or layer count that does not match
  the safetensors headers loads with randomly initialised (or silently dropped) tensors, or not at all.
- a learned position table bounds the sequence: GPT-2's 1,024-row `wpe` raised IndexError at token
  1,025. Rotary and ALiBi models have no table, so no hard limit is read for them.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from ..errors import ModelLoadError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "vocab.txt")
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "embed_in.weight", "word_embeddings.weight",
                   "tok_embeddings.weight")
POSITION_TABLE_NAMES = ("wpe.weight", "embed_positions.weight", "position_embeddings.weight")
# config.json keys in the order transformers' configs read them; the first one present is the model's
WIDTH_KEYS = ("word_embed_proj_dim", "embedding_size", "hidden_size", "n_embd", "d_model")  # the embedding's width
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")
LAYER_CONTAINERS = ("layers", "h", "blocks", "layer")


def convert_command(pickle_name: str) -> str:
    """The one line that turns a pickle checkpoint into safetensors, loading it with weights_only=True
    (tensors and plain containers only: nothing in the file runs). Tied tensors are cloned, because
    safetensors refuses two names on one storage."""
    return ("python -c \"import torch; from safetensors.torch import save_file; "
            f"sd = torch.load('{pickle_name}', weights_only=True); "
            "save_file({k: v.clone().contiguous() for k, v in sd.items()}, 'model.safetensors')\"")


def check_no_pickle_only(path: Path, *, file: str | None, field: str) -> None:
    """A directory with pickle weights and no safetensors: say why it is refused and how to convert it."""
    pickles = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES
                     and p.name != "training_args.bin")
    if pickles:
        raise ModelLoadError(
            f"{path} has only pickle weights ({', '.join(pickles)}); variantlab loads weights from safetensors "
            "only, because unpickling a checkpoint can run any code it carries", file=file, field=field,
            accepted="model.safetensors; convert in that folder with: " + convert_command(pickles[0]))


def transformers_ships(model_type: str) -> bool:
    """Whether the installed transformers has its own code for `model_type` (found, not imported: no torch)."""
    if not model_type:
        return False
    try:
        return importlib.util.find_spec(f"transformers.models.{model_type.replace('-', '_')}") is not None
    except (ImportError, ValueError):
        return False


def check_no_remote_code(path: Path, config: dict, *, file: str | None, field: str) -> None:
    """A config.json whose `auto_map` names the checkpoint's own Python for a model type transformers does not
    ship: loading it would run that Python (trust_remote_code), which variantlab never does. With a model type
    transformers ships, transformers' own code loads it and `auto_map` is ignored."""
    auto_map = config.get("auto_map")
    model_type = str(config.get("model_type", ""))
    if not auto_map or transformers_ships(model_type):
        return
    names = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    raise ModelLoadError(
        f"{path}/config.json's auto_map ({', '.join(map(str, names))}) asks to run the checkpoint's own Python "
        f"(trust_remote_code) for model_type '{model_type}', which transformers does not ship; variantlab never "
        "runs a checkpoint's code (trust_remote_code is off)", file=file, field=field,
        accepted="a checkpoint of a model type transformers ships (saved with save_pretrained)")


def check_tokenizer(path: Path, *, file: str | None, field: str) -> None:
    """The worker loads the tokenizer from the directory itself; without its files every variant fails there."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})", file=file,
                             field=field, accepted="a directory that also holds the checkpoint's tokenizer "
                                                   "(tokenizer.save_pretrained(DIR))")


def _first_key(config: dict, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if isinstance(config.get(k), int) and not isinstance(config.get(k), bool)), None)


def _tensor(shapes: dict[str, tuple[int, ...]], suffixes: tuple[str, ...]) -> str | None:
    """The 2-D tensor whose name ends in one of `suffixes`, the shortest name first (the language model's own
    table before a sub-model's)."""
    found = [n for n in shapes if n.endswith(suffixes) and len(shapes[n]) == 2]
    return min(found, key=lambda n: (len(n), n)) if found else None


def layer_count(shapes: dict[str, tuple[int, ...]], prefix: str) -> int | None:
    """Distinct decoder-layer indices under `prefix` ('model.' → model.layers.<i>.…); None when none is found."""
    pattern = re.compile(re.escape(prefix) + r"(?:" + "|".join(LAYER_CONTAINERS) + r")\.(\d+)\.")
    found = {m.group(1) for n in shapes if (m := pattern.match(n))}
    return len(found) or None


def check_shapes(path: Path, config: dict, shapes: dict[str, tuple[int, ...]], *, file: str | None,
                 field: str) -> None:
    """config.json's vocab_size, embedding width and layer count against the safetensors headers."""
    def mismatch(key: str, want: int, have: str):
        return ModelLoadError(f"{path}/config.json says {key}: {want}, but the weights have {have}", file=file,
                              field=field, accepted="a config.json that matches its weights (the one saved with them)")

    embedding = _tensor(shapes, EMBEDDING_NAMES)
    if embedding is None:
        return    # an architecture whose names we do not know: transformers checks it when it loads
    rows, width = shapes[embedding]
    if _first_key(config, ("vocab_size",)) and config["vocab_size"] != rows:
        raise mismatch("vocab_size", config["vocab_size"], f"{rows} rows in {embedding}")
    key = _first_key(config, WIDTH_KEYS)
    if key and config[key] != width:
        raise mismatch(key, config[key], f"{width} columns in {embedding}")
    key = _first_key(config, LAYER_KEYS)
    layers = layer_count(shapes, embedding[:embedding.rfind(".", 0, embedding.rfind(".")) + 1])
    if key and layers is not None and config[key] != layers:
        raise mismatch(key, config[key], f"{layers} layers")


def position_limit(config: dict, shapes: dict[str, tuple[int, ...]]) -> tuple[int, str] | None:
    """(the most positions a sequence may take, why) for a model with a learned position table; None for
    one without (rotary, ALiBi), whose positions are computed for any length."""
    table = _tensor(shapes, POSITION_TABLE_NAMES)
    if table is None:
        return None
    rows = shapes[table][0]
    key = _first_key(config, POSITION_KEYS)
    if key is not None and config[key] <= rows:    # OPT's table has 2 rows more than it may use
        return config[key], f"config.json {key}: {config[key]}, a learned position table ({table})"
    return rows, f"a learned position table of {rows} rows ({table})"
