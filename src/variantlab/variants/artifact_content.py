"""What an artifact holds, verified rather than trusted: its files' sha256 and a digest of variant.json.

`variantlab build` seals an artifact (`sealed`): variant.json records the size and sha256 of every
file in the folder that loading reads (the weights, config.json, the tokenizer and generation files)
under `files`, and `content_sha256`, the sha256 of the canonical JSON of everything else variant.json
says (recipe, options, facts, weights, modules, those file hashes, ...). Before an artifact is reused,
`content_problem` hashes the files again and recomputes the digest: edited facts (`bits_per_weight: 1`,
a made-up kernel name), weights replaced by other bytes of the same length, or a file added, removed
or changed, each give a reason, and the artifact is rebuilt instead. It guards against edits and
corruption, not against someone who recomputes the digests: it is a checksum, not a signature.

Hashing is cheap at our sizes (it reads each file once, at disk or page-cache speed); it runs in
the bench parent, so this module never imports torch.

`shape_problem` checks that variant.json has every key loading reads, with the right JSON type, so
that a hand-edited or truncated description is a reason ("variant.json has no `weights`") rather
than a KeyError in the middle of a run.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

CONTENT_KEY = "content_sha256"
FILES_KEY = "files"
_CHUNK = 1 << 20

# What loading reads from variant.json: (section, key) → (JSON type(s), required); section None is the top
# level, and a section is checked before its keys. bool is not taken for an integer.
_NULL = type(None)
_KEYS: dict[tuple[str | None, str], tuple[tuple[type, ...], bool]] = {
    (None, "format_version"): ((int,), True), (None, "recipe"): ((str,), True), (None, "options"): ((dict,), True),
    (None, "facts"): ((dict,), True), (None, "weights"): ((dict,), True), (None, "model"): ((dict,), True),
    (None, "source"): ((dict,), True), (None, "device_type"): ((str,), True),
    (None, "modules"): ((dict,), False), (None, "attention"): ((dict, _NULL), False), (None, "build"): ((dict,), False),
    (None, FILES_KEY): ((dict,), False), (None, CONTENT_KEY): ((str,), False),
    ("facts", "recipe"): ((str,), True), ("facts", "dtype"): ((str, _NULL), True),
    ("facts", "parameters"): ((int,), True), ("facts", "weight_bytes"): ((int,), True),
    ("facts", "bits_per_weight"): ((int, float), True), ("facts", "kernels"): ((list,), False),
    ("facts", "notes"): ((list,), False), ("facts", "extra"): ((dict,), False),
    ("weights", "bytes_on_disk"): ((int,), True), ("weights", "aliases"): ((dict,), False),
    ("model", "load_dtype"): ((str,), True), ("model", "non_persistent_buffers"): ((dict,), False),
}
_JSON_NAMES = {int: "an integer", float: "a number", str: "a string", dict: "a mapping", list: "a list",
               _NULL: "null"}


def shape_problem(meta: dict) -> str | None:
    """None when variant.json (parsed: `meta`) has every key loading reads, each of its JSON type;
    else the first that is missing or of another type."""
    for (section, key), (types, required) in _KEYS.items():
        where = meta if section is None else meta[section]
        name = f"{section}.{key}" if section else key
        if key not in where:
            if required:
                return f"variant.json has no `{name}`"
            continue
        problem = _type_problem(name, where[key], types)
        if problem:
            return problem
    return None


def _type_problem(name: str, value, types: tuple[type, ...]) -> str | None:
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
        return None
    want = " or ".join(_JSON_NAMES[t] for t in types)
    return f"variant.json's `{name}` is {type(value).__name__}, not {want}"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _loadable_files(folder: Path, besides: str) -> list[Path]:
    """Every plain file in `folder` but `besides` (variant.json) and hidden ones: what loading may read."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != besides and not p.name.startswith("."))


def file_hashes(folder: Path, *, besides: str) -> dict[str, dict]:
    """name → {"bytes", "sha256"} of every file loading the artifact in `folder` may read."""
    return {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in _loadable_files(folder, besides)}


def content_digest(meta: dict) -> str:
    """sha256 of variant.json's canonical JSON (sorted keys, no spaces), its own digest left out."""
    body = {k: v for k, v in meta.items() if k != CONTENT_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sealed(meta: dict, folder: Path, *, besides: str) -> dict:
    """`meta` with the hashes of the files in `folder` and its content digest (what `content_problem` checks)."""
    meta = {**meta, FILES_KEY: file_hashes(folder, besides=besides)}
    return {**meta, CONTENT_KEY: content_digest(meta)}


def content_problem(meta: dict, folder: Path, *, besides: str) -> str | None:
    """None when variant.json is as it was built and every file in `folder` has the sha256 it recorded;
    else what changed. An artifact written before content hashes cannot be verified: that is a reason too."""
    recorded = meta.get(FILES_KEY)
    if CONTENT_KEY not in meta or not isinstance(recorded, dict):
        return "written before content hashes (variant.json records no content_sha256), so it cannot be verified"
    if content_digest(meta) != meta[CONTENT_KEY]:
        return ("variant.json was edited after the build: its content_sha256 does not match what it says "
                "(its facts, weights, options or file hashes changed)")
    present = {p.name for p in _loadable_files(folder, besides)}
    missing, added = sorted(set(recorded) - present), sorted(present - set(recorded))
    if missing:
        return f"{', '.join(missing)} recorded at build time {'is' if len(missing) == 1 else 'are'} missing"
    if added:
        return f"{', '.join(added)} {'was' if len(added) == 1 else 'were'} added after the build"
    for name, want in recorded.items():
        path = folder / name
        same_size = isinstance(want, dict) and path.stat().st_size == want.get("bytes")
        if not (same_size and file_sha256(path) == want.get("sha256")):   # a size differs: no need to read it
            return f"{name} does not match the sha256 recorded at build time (changed or corrupted since)"
    return None
