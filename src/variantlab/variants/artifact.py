"""Variant artifacts: a built variant saved as it runs, so that loading it never quantizes again.

An artifact is one folder (FORMAT_VERSION 2: w4a8 weights packed two to a byte; 1 held them unpacked):

    model.safetensors      every tensor of the variant's state_dict (its stored form: packed int4/int8
                           weights, scales, zeros, unquantized tensors) — each storage once: a tied
                           tensor is stored under one name and listed in variant.json `weights.aliases`
    config.json            the running model's config (the source's, with the dtype it was loaded in)
    tokenizer files        copied byte for byte from the source directory, so the tokenizer id is the
                           source's and token-level metrics stay comparable with the baseline
    generation_config.json copied when the source has one
    variant.json           what was built and how to rebuild it: recipe, options (defaults filled in),
                           facts, source path + fingerprint, torch/transformers versions, device type,
                           load dtype, attention implementation, the dtypes of the buffers that are not
                           saved (RoPE's inv_freq), and per swapped layer its quant_linear class and
                           constructor metadata (`QuantLinear.state()`); sealed with the sha256 of every
                           other file and a digest of itself (artifact_content.py), which
                           `artifact_problem` verifies before an artifact is reused

`load_artifact` builds the model skeleton from config.json with its parameters on the meta device
(buffers that are not saved are computed from the config, as in from_pretrained, and cast to the dtype
they had when saved), swaps in the recorded quant_linear modules, shaped on the meta device
(`QuantLinear.from_state`), and assigns the tensors of model.safetensors, read into one arena of 2 MiB pages
on the CPU (`read_safetensors`, weight_arena), by safetensors onto a GPU (a module whose
running form differs from its stored one, W4A8, converts them once, in load_state_dict): no quantization
runs, and the outputs are bit-identical to the model that was saved (tests/variants/test_artifact.py).
Any recipe whose modules are nn.Linear (any dtype) or quant_linear modules round-trips; `save_artifact`
rebuilds the skeleton on the meta device before writing and refuses a model it could not load back.

Model size as stored is the size of model.safetensors on disk (header included).

Torch is imported inside functions only: the bench runner checks artifacts (`artifact_problem`) in the
parent process, which never imports torch.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import time
from importlib import metadata
from pathlib import Path
from typing import Iterator

from ..errors import ModelLoadError, RecipeError
from .artifact_content import content_problem, sealed, shape_problem
from .facts import VariantFacts

FORMAT = "variantlab-artifact"
FORMAT_VERSION = 2
WEIGHTS_FILE = "model.safetensors"
META_FILE = "variant.json"
# Copied from the source directory as they are (never the weights): tokenizer, generation settings.
_SOURCE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model",
                 "chat_template.jinja", "chat_template.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
ALIGN = 64  # bytes: a cache line, the widest aligned vector load (AVX-512)
_ST_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
              "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
              "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def normalized_options(recipe, options) -> dict:
    """Options with their defaults filled in, as JSON: {} and {"group_size": 64} are the same int4."""
    from .registry import parse_options
    if hasattr(options, "model_dump"):
        return options.model_dump(mode="json")
    return parse_options(recipe, dict(options or {})).model_dump(mode="json")


def _stored_options(recipe_name: str, stored) -> dict | None:
    """An artifact's recorded options with today's defaults filled in: an option added since it was built (int4's
    `symmetric`) takes its default, which is what the artifact holds. As recorded when they no longer parse."""
    from .registry import get_recipe
    try:
        return normalized_options(get_recipe(recipe_name), stored)
    except (RecipeError, ValueError, TypeError):
        return stored


def copied_bytes(source: str | Path) -> int:
    """Bytes of the checkpoint's files an artifact copies beside its weights (tokenizer, generation settings):
    what an artifact's estimate (artifact_size.py) adds to its weights file."""
    source = Path(source)
    return sum((source / f).stat().st_size for f in _SOURCE_FILES if (source / f).is_file())


def source_fingerprint(model_dir: str | Path) -> dict:
    """What identifies a checkpoint's weights without reading them: per weight file its size,
    mtime and the sha256 of its safetensors header; and the sha256 of config.json."""
    model_dir = Path(model_dir)
    files = []
    for f in sorted(p for p in model_dir.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)):
        st = f.stat()
        files.append({"name": f.name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "header_sha256": _header_sha(f) if f.suffix == ".safetensors" else None})
    cfg = model_dir / "config.json"
    config_sha = hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.is_file() else None
    digest = hashlib.sha256(json.dumps([files, config_sha], sort_keys=True).encode()).hexdigest()[:16]
    return {"sha256": digest, "config_sha256": config_sha, "files": files}


def _header_sha(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            return hashlib.sha256(f.read(min(n, 100_000_000))).hexdigest()
    except (OSError, struct.error):
        return None


# ---------------------------------------------------------------- saving

def save_artifact(model, tokenizer, facts, recipe_name: str, options, source_model_path: str | Path,
                  out_dir: str | Path, *, build: dict | None = None, attention: dict | None = None) -> dict:
    """Write `model` (a built variant, as it runs) to `out_dir`; return the variant.json written.

    `facts` are the recipe's VariantFacts (or their JSON); `build` is timing to record (load_s,
    apply_s, ...; save_s and build_s are added here). The folder is written beside `out_dir` and
    renamed over it at the end, so a failed save never leaves a half artifact that looks whole."""
    import torch
    import transformers

    from .kernel_attention import saved_implementation

    t0 = time.perf_counter()
    out_dir, source = Path(out_dir), Path(source_model_path).resolve()
    from .registry import get_recipe
    recipe = get_recipe(recipe_name)
    state = model.state_dict()
    devices = {t.device.type for t in state.values()}
    if len(devices) > 1:
        raise RecipeError(f"cannot save a variant spread over devices {sorted(devices)}",
                          accepted="a model whose tensors are all on one device")
    device_type = devices.pop() if devices else "cpu"
    modules = _module_states(model)
    load_dtype = str(model.config.dtype).removeprefix("torch.")
    attn = saved_implementation(getattr(model.config, "_attn_implementation", None))
    _check_rebuildable(model, state, modules, load_dtype, attn, attention)  # before copying any tensor
    tensors, aliases = _unique_tensors(state)
    buffers = {name: str(b.dtype).removeprefix("torch.") for name, b in _non_persistent_buffers(model)}

    with folder_written(out_dir) as tmp:
        write_safetensors(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt", "variantlab": FORMAT})
        model.config.save_pretrained(tmp)  # config.json only
        remote = remote_code_files(model, source)
        copied = [f for f in _SOURCE_FILES if (source / f).is_file()] + remote
        for f in copied:
            shutil.copyfile(source / f, tmp / f)
        if not any(f.startswith("tokenizer") or f in ("vocab.json", "vocab.txt") for f in copied):
            tokenizer.save_pretrained(tmp)  # the source has no tokenizer files of its own
        disk = (tmp / WEIGHTS_FILE).stat().st_size
        build = dict(build or {})
        build["save_s"] = time.perf_counter() - t0
        build["build_s"] = sum(v for k, v in build.items() if k.endswith("_s") and k != "build_s")
        meta = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "recipe": recipe_name, "options": normalized_options(recipe, options),
            "facts": VariantFacts.model_validate(facts).to_json(),
            "source": {"model_path": str(source), "fingerprint": source_fingerprint(source)},
            "torch_version": torch.__version__, "transformers_version": transformers.__version__,
            "device_type": device_type,
            "weights": {"file": WEIGHTS_FILE, "bytes_on_disk": disk, "tensors": len(tensors),
                        "tensor_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                        "aliases": aliases},
            "model": {"architecture": type(model).__name__, "load_dtype": load_dtype,
                      "attn_implementation": attn, "non_persistent_buffers": buffers},
            "modules": modules,
            "attention": attention,   # {"spec": "gqa:4", "options": {...}} re-applied on load; None: the model's own
            "remote_code": remote,    # the checkpoint's own Python files it loads with (trust_remote_code)
            "build": build,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        meta = sealed(meta, tmp, besides=META_FILE)   # every file is written: hash them and this description
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


def _unique_tensors(state: dict) -> tuple[dict, dict[str, str]]:
    """(name → CPU tensor, alias → stored name): a tensor that is another one (tied weights: the same
    storage, offset, shape, strides and dtype) is stored once, under the first name."""
    tensors: dict = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in state.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.to("cpu")
    return tensors, aliases


def write_safetensors(tensors: dict, path: Path, metadata: dict[str, str] | None = None) -> None:
    """A standard safetensors file whose every tensor starts on an ALIGN-byte boundary of the file.

    safetensors' own writer aligns tensors to 8 bytes only, and a memory-mapped tensor is then as
    aligned as its file offset: aten::_weight_int8pack_mm (torch 2.13, CPU) crashes on a weight that is
    8- but not 32-byte aligned once M >= 4. So: the header is padded with spaces (as safetensors pads
    it) to end on a boundary, and the tensors whose size is a multiple of ALIGN come first; the
    format allows no gaps, so a later odd-sized tensor can leave the ones after it unaligned (a CPU load reads
    each tensor onto a 64-byte boundary of its own, `read_safetensors`: only a memory-mapped reader sees the
    file's offsets)."""
    import torch

    order = sorted(tensors, key=lambda k: (_nbytes(tensors[k]) % ALIGN != 0, k))
    header: dict = {"__metadata__": dict(metadata or {})}
    offset = 0
    for name in order:
        t = tensors[name]
        dtype = _ST_DTYPES.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise RecipeError(f"tensor '{name}' has dtype {t.dtype}, which safetensors cannot store")
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + _nbytes(t)]}
        offset += _nbytes(t)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in order:
            t = tensors[name]
            if t.numel():
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _module_states(model) -> dict[str, dict]:
    """Per swapped layer: its quant_linear class and constructor metadata."""
    from .quant_linear import QuantLinear
    return {name: m.state() for name, m in model.named_modules() if isinstance(m, QuantLinear)}


def _non_persistent_buffers(model):
    for mod_name, mod in model.named_modules():
        for name, b in mod._buffers.items():
            if b is not None and name in mod._non_persistent_buffers_set:
                yield (f"{mod_name}.{name}" if mod_name else name), b


def _check_rebuildable(model, state: dict, modules: dict, load_dtype: str, attn: str | None,
                       attention: dict | None = None) -> None:
    """Build what load_artifact would (on the meta device) and compare: the same state keys and shapes,
    the same module classes, and unsaved buffers that the config gives back bit for bit."""
    import copy

    import torch

    skeleton = _skeleton(copy.deepcopy(model.config), load_dtype, attn, attention,
                         type(model).__module__.startswith("transformers_modules"))
    _swap_modules(skeleton, modules, {k: v.to("meta") for k, v in state.items()})
    from .kernel_linear import plain_class
    mine, theirs = dict(model.named_modules()), dict(skeleton.named_modules())
    for name in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(name), theirs.get(name)
        if a is None or b is None or plain_class(a) is not plain_class(b):
            got, rebuilt = (type(m).__name__ if m is not None else "nothing" for m in (a, b))
            raise RecipeError(f"cannot save this variant as an artifact: module '{name}' is {got}, and the "
                              f"model rebuilt from its config has {rebuilt} there",
                              accepted="a variant whose layers are its architecture's own modules, nn.Linear "
                                       "or quant_linear modules")
    rebuilt = skeleton.state_dict()
    if rebuilt.keys() != state.keys():
        diff = sorted(set(rebuilt) ^ set(state))
        raise RecipeError(f"cannot save this variant as an artifact: its state and the rebuilt model's differ "
                          f"in {len(diff)} keys (first: '{diff[0]}')")
    for k, t in state.items():
        if tuple(rebuilt[k].shape) != tuple(t.shape):
            raise RecipeError(f"cannot save this variant as an artifact: '{k}' is {tuple(t.shape)} but the model "
                              f"rebuilt from its config has {tuple(rebuilt[k].shape)}")
    rebuilt_buffers = dict(_non_persistent_buffers(skeleton))
    for name, b in _non_persistent_buffers(model):
        r = rebuilt_buffers.get(name)
        if r is None or r.is_meta or not torch.equal(r.to(b.dtype), b.detach().cpu()):
            raise RecipeError(f"cannot save this variant as an artifact: buffer '{name}' is not saved with the "
                              "weights and the config does not give it back as the variant holds it")


@contextlib.contextmanager
def folder_written(out_dir: Path) -> Iterator[Path]:
    """A folder beside `out_dir` to write into, renamed over it when the block ends and removed when it raises:
    a failed write never leaves a half artifact that looks whole."""
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dir(tmp, out_dir)


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- checking

def read_variant_json(path: str | Path) -> dict:
    """variant.json of an artifact folder; ModelLoadError when it is missing or not ours."""
    path = Path(path)
    meta_file = path / META_FILE
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{path} is not a variant artifact: it has no {META_FILE}",
                             accepted="a folder written by `variantlab build`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{meta_file} cannot be read ({type(e).__name__})",
                             accepted="a folder written by `variantlab build`") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelLoadError(f"{meta_file} is not a variantlab artifact description",
                             accepted="a folder written by `variantlab build`")
    return meta


def _compat_problem(meta: dict, path: Path, device_type: str | None, torch_version: str | None) -> str | None:
    if meta.get("format_version") != FORMAT_VERSION:
        return f"artifact format {meta.get('format_version')}, this variantlab reads {FORMAT_VERSION}"
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        return f"{weights} is missing"
    if weights.stat().st_size != meta["weights"]["bytes_on_disk"]:
        return f"{weights} is {weights.stat().st_size} bytes, variant.json says {meta['weights']['bytes_on_disk']}"
    if device_type is not None and meta.get("device_type") != device_type:
        return (f"built for {meta.get('device_type')}, this run is on {device_type} "
                "(packed layouts and kernels are per device type)")
    if torch_version is not None and meta.get("torch_version") != torch_version and meta.get("modules"):
        return (f"built with torch {meta.get('torch_version')}, this is torch {torch_version} "
                "(packed layouts may differ)")
    return None


def artifact_problem(path: str | Path, recipe_name: str, options, source_model_path: str | Path,
                     device_type: str | None = None, *, attention: str | None = None,
                     attention_options: dict | None = None, calibration_sha256: str | None = None,
                     trust_remote_code: bool = False) -> str | None:
    """None when the artifact at `path` is this variant, built from these weights, loadable here, and
    as it was built (its files and variant.json match the hashes sealed at build time); else why not.
    Torch-free: reads variant.json, stats files, and last (when all else fits) hashes them."""
    from .registry import get_recipe
    path = Path(path)
    try:
        meta = read_variant_json(path)
    except ModelLoadError as e:
        return e.detail
    problem = shape_problem(meta)
    if problem:
        return problem
    if meta.get("remote_code") and not trust_remote_code:
        return "it runs its checkpoint's own Python, and the suite's trust_remote_code is off"
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    problem = _compat_problem(meta, path, device_type, torch_version)
    if problem:
        return problem
    if meta.get("recipe") != recipe_name:
        return f"recipe {meta.get('recipe')}, the variant's is {recipe_name}"
    want = normalized_options(get_recipe(recipe_name), options)
    if _stored_options(recipe_name, meta.get("options")) != want:
        return f"options {meta.get('options')}, the variant's are {want}"
    have = meta.get("attention") or None
    want_attn = {"spec": attention, "options": attention_options or {}} if attention else None
    if have != want_attn:
        return f"attention {have}, the variant's is {want_attn}"
    built_on = (meta.get("facts") or {}).get("extra", {}).get("calibration_sha256")
    if built_on is not None and calibration_sha256 is not None and built_on != calibration_sha256:
        return "calibrated on other text than this suite's calibration text"
    source = Path(source_model_path).resolve()
    if not source.is_dir():
        return f"source model {source} is not a directory"
    fp = source_fingerprint(source)["sha256"]
    if meta.get("source", {}).get("fingerprint", {}).get("sha256") != fp:
        return f"built from other weights than {source}'s now (fingerprint changed: the checkpoint was rewritten)"
    return content_problem(meta, path, besides=META_FILE)


# ---------------------------------------------------------------- loading

def load_artifact(path: str | Path, device: str = "cpu", *, tokenizer=None, trust_remote_code: bool = False):
    """(model, tokenizer, facts) of the artifact at `path`, on `device`, in eval mode; no quantization runs.
    `tokenizer`: one already loaded from `path` (else it is loaded here). An artifact of a checkpoint with
    its own Python loads only with `trust_remote_code` (the suite's switch), never on the artifact's word. variant.json's shape is checked
    here; its hashes are not (every measurement loads: `artifact_problem` verifies them once, before reuse).

    facts are the build's, with `weight_bytes` the size of model.safetensors on disk
    (extra: artifact_bytes_on_disk, state_bytes = the stored tensors' bytes, artifact_path; the build's
    resident_bytes)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from .decode_kernels import with_decode_kernels

    path = Path(path)
    meta = read_variant_json(path)
    dev = torch.device(device)
    problem = shape_problem(meta) or _compat_problem(meta, path, dev.type, torch.__version__)
    if problem:
        raise ModelLoadError(f"cannot load artifact {path}: {problem}",
                             accepted="an artifact built here with `variantlab build` (rebuild it)")
    if meta.get("remote_code") and not trust_remote_code:
        raise ModelLoadError(f"artifact {path} runs its checkpoint's own Python ({', '.join(meta['remote_code'])})",
                             field="trust_remote_code", accepted="trust_remote_code: true in the suite, for a "
                                                                 "checkpoint whose code you trust")
    try:
        # the folder's own Python only when the suite turns it on: left unset, transformers asks on a terminal
        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code)
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises many types; the user needs the one line
        raise ModelLoadError(f"cannot load artifact {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                             accepted="a folder written by `variantlab build`") from None
    m = meta["model"]
    model = _skeleton(config, m["load_dtype"], m.get("attn_implementation"), meta.get("attention"),
                      trust_remote_code)
    if dev.type == "cpu":     # read, not memory-mapped, into 2 MiB pages (weight_arena)
        state = read_safetensors(path / WEIGHTS_FILE)
    else:
        with safe_open(str(path / WEIGHTS_FILE), framework="pt", device=str(dev)) as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
    for alias, stored in meta["weights"].get("aliases", {}).items():
        state[alias] = state[stored]
    _swap_modules(model, meta.get("modules", {}), {k: t.to("meta") for k, t in state.items()})
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ModelLoadError(f"artifact {path} does not fit the model its config builds: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}", accepted="an intact artifact (rebuild it)")
    for name, dtype in m.get("non_persistent_buffers", {}).items():
        parent, _, child = name.rpartition(".")
        mod = model.get_submodule(parent) if parent else model
        setattr(mod, child, getattr(mod, child).to(device=dev, dtype=getattr(torch, dtype)))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ModelLoadError(f"artifact {path} left {len(left)} tensors unloaded (first: '{left[0]}')",
                             accepted="an intact artifact (rebuild it)")
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    model.eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    disk = (path / WEIGHTS_FILE).stat().st_size
    built = VariantFacts.model_validate(meta["facts"])
    facts = built.replace(weight_bytes=disk, bits_per_weight=8 * disk / max(built.parameters, 1),
                          extra=built.extra | {"artifact_bytes_on_disk": disk, "state_bytes": built.weight_bytes,
                                               "artifact_path": str(path.resolve())})
    return model, tok, with_decode_kernels(model, facts)


READ_PIECE = 8 << 20      # read_safetensors hands its threads pieces of at most this many bytes
READ_BOUND_S = 600        # and gives up on a file that takes longer than this to read


def read_safetensors(path: Path, threads: int | None = None) -> dict:
    """The tensors of a safetensors file, read (not memory-mapped) into one arena of 2 MiB pages
    (weight_arena: where the engine keeps a CPU model's weights), each on a 64-byte boundary. A mapped file's
    pages are 4 KiB page-cache pages, which decode reads 10% slower than anonymous memory and 20% slower than
    the arena; reading straight into the arena spares the engine a copy, and the resident set two.

    `threads` (default: torch's intra-op threads, those decode will use) read pieces of the file at once: the
    kernel both copies and clears each new page on the reading thread, and one thread alone read 438 MiB in a
    median of 0.70 s here where two took 0.08 s (2-core EPYC, 10 processes each, interleaved)."""
    import torch

    from .weight_arena import arena, rounded

    dtypes = {st: getattr(torch, name) for name, st in _ST_DTYPES.items()}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    sizes = {k: spec["data_offsets"][1] - spec["data_offsets"][0] for k, spec in header.items()}
    whole, at = arena(sum(map(rounded, sizes.values())))
    state, pieces = {}, []     # pieces: (tensor, offset in the file, offset in the arena, bytes)
    for name, spec in header.items():
        dtype, size = dtypes[spec["dtype"]], sizes[name]
        if not size:
            state[name] = torch.empty(spec["shape"], dtype=dtype)
            continue
        pieces += [(name, 8 + n + spec["data_offsets"][0] + o, at + o, min(READ_PIECE, size - o))
                   for o in range(0, size, READ_PIECE)]
        state[name] = whole[at:at + size].view(dtype).reshape(spec["shape"])
        at += rounded(size)
    _read_pieces(path, memoryview(whole.numpy()), pieces, threads or torch.get_num_threads())
    return state


def _read_pieces(path: Path, buffer: memoryview, pieces: list[tuple], threads: int) -> None:
    """Read each (tensor, file offset, buffer offset, bytes) piece of `path` into `buffer`, `threads` at a time,
    each thread a contiguous run of about equal bytes."""
    import concurrent.futures

    total = sum(p[3] for p in pieces)
    share = -(-total // max(1, threads))
    runs, run, held = [], [], 0
    for p in pieces:
        run.append(p)
        held += p[3]
        if held >= share:
            runs, run, held = runs + [run], [], 0
    runs += [run] if run else []

    def read(fd: int, run: list[tuple]) -> None:
        for name, offset, to, size in run:
            got = 0
            while got < size:
                step = os.preadv(fd, [buffer[to + got:to + size]], offset + got)
                if not step:
                    raise ModelLoadError(f"{path} ends inside tensor '{name}'", accepted="an intact artifact "
                                                                                       "(rebuild it)")
                got += step

    fd = os.open(path, os.O_RDONLY)
    pool = concurrent.futures.ThreadPoolExecutor(len(runs) or 1, thread_name_prefix="read-weights")
    waiting = ()
    try:
        futures = [pool.submit(read, fd, run) for run in runs]
        _, waiting = concurrent.futures.wait(futures, timeout=READ_BOUND_S)
        if waiting:
            raise ModelLoadError(f"reading {path}: not done after {READ_BOUND_S} s (a stalled disk?)",
                                 accepted="a weights file on a disk that answers")
        for future in futures:
            future.result()
    finally:
        pool.shutdown(wait=not waiting, cancel_futures=True)
        if not waiting:
            os.close(fd)


@contextlib.contextmanager
def _parameters_on_meta():
    """Module construction with every parameter moved to the meta device as it is registered (no
    memory, no initialisation cost); buffers are built for real, as the model's code computes them."""
    import torch
    from torch import nn

    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        with torch.no_grad():
            yield
    finally:
        nn.Module.register_parameter = register


def remote_code_files(model, source: Path) -> list[str]:
    """The source's Python files a model loaded with trust_remote_code was built from (its class lives in
    transformers' dynamic `transformers_modules`); [] for a model of transformers' own code."""
    if not type(model).__module__.startswith("transformers_modules"):
        return []
    return sorted(p.name for p in source.glob("*.py") if p.is_file())


def _skeleton(config, load_dtype: str, attn: str | None, attention: dict | None = None,
              trust_remote_code: bool = False):
    """The architecture of `config`, parameters on meta, built under `load_dtype` as from_pretrained did,
    with the variant's attention re-applied (gqa on a pooled config is the identity; linear and sliding
    swap module classes and change no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    if attn == "variantlab":  # our linear/sliding modules register this; the skeleton starts from the
        attn = None           # model's default (sdpa where it has one; Gemma2 has none) and swaps again
    kw = {"attn_implementation": attn} if attn else {}
    if trust_remote_code:
        kw["trust_remote_code"] = True
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, load_dtype), **kw)
    if attention:
        from .attention import apply_attention
        apply_attention(model, attention["spec"], attention.get("options"))
    return model


def _swap_modules(model, modules: dict[str, dict], state: dict) -> None:
    """Put the recorded quant_linear modules in place, each holding its own tensors from `state`."""
    from . import quant_linear as ql

    for name, st in modules.items():
        cls = getattr(ql, st.get("class", ""), None)
        if not (isinstance(cls, type) and issubclass(cls, ql.QuantLinear)):
            raise ModelLoadError(f"artifact layer '{name}' is a {st.get('class')}, not a quant_linear module",
                                 accepted="an artifact written by this variantlab")
        prefix = name + "."
        own = {k[len(prefix):]: t for k, t in state.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
        try:
            new = cls.from_state(st, own)
        except (ValueError, AttributeError, TypeError, KeyError) as e:
            raise ModelLoadError(f"artifact layer '{name}' cannot be rebuilt: {e}",
                                 accepted="an intact artifact (rebuild it)") from None
        model.set_submodule(name, new)

