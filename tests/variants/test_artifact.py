"""Artifacts (variants/artifact.py): a built variant saved and loaded back is the same model, bit for
bit, and loading it runs no quantization; variant.json says what it is and what it was built from;
its model size is the size of model.safetensors on disk (w4a8: int4 packed two a byte, however it runs)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil

import pytest
import torch
from torch import nn

from variantlab.errors import ModelLoadError, RecipeError
from variantlab.models.loading import load_causal_lm
from variantlab.variants import artifact as art
from variantlab.variants import kernels
from variantlab.variants.decode_kernels import use_decode_kernels, with_decode_kernels
from variantlab.variants.kernel_linear import plain_class
from variantlab.variants import quant_linear as ql
from variantlab.variants import quant_packing as qp
from variantlab.variants.recipe import resident_bytes
from variantlab.variants.registry import get_recipe, parse_options

pytestmark = pytest.mark.model

# Every CPU recipe. The tiny model's in_features are 32 and 64, so group_size 64 needs pad_to_group
# (which also exercises the padded paths); group_size 32 is the unpadded int4 layout.
CASES = {
    "fp32": ("fp32", {}),
    "bf16": ("bf16", {}),
    "int8": ("int8", {}),
    "w8a8": ("w8a8", {}),
    "int4-g64": ("int4", {"group_size": 64, "pad_to_group": True}),
    "int4-g32": ("int4", {"group_size": 32}),
    "w4a8-g64": ("w4a8", {"group_size": 64, "pad_to_group": True}),
    "w4a8-g32": ("w4a8", {"group_size": 32}),
    "w4a8-python": ("w4a8", {"group_size": 32, "dequant": "python"}),
    "int8-python": ("int8", {"dequant": "python"}),
    "int8-embeddings": ("int8", {"quantize_embeddings": True}),
}


def _build(model_dir, recipe_name, options):
    recipe = get_recipe(recipe_name)
    opts = parse_options(recipe, options)
    model, tok = load_causal_lm(model_dir, recipe.load_dtype(opts), "cpu")
    return model, tok, with_decode_kernels(model, recipe.apply(model, opts, "cpu"))  # as build() does


@contextlib.contextmanager
def _no_quantization():
    """Within it, any quantization or packing of data, or a quant module built the quantizing way, fails.
    On meta tensors (shapes only: W4A8 derives its stored names and shapes so) they run. Outside,
    `state_dict()` may pack: W4A8 stores its int4 values two a byte; loading only unpacks."""
    def forbidden(*args, **kwargs):
        raise AssertionError("quantization ran while loading an artifact")

    def on_meta_only(fn):
        def check(*args, **kwargs):
            if any(isinstance(a, torch.Tensor) and not a.is_meta for a in (*args, *kwargs.values())):
                forbidden()
            return fn(*args, **kwargs)
        return check

    with pytest.MonkeyPatch.context() as mp:
        for fn in ("quantize_int8_per_channel", "quantize_int4_groupwise", "pack_int4_for_cpu", "pack_nibbles",
                   "scales_and_zeros"):
            mp.setattr(qp, fn, on_meta_only(getattr(qp, fn)))
        for cls in (ql.Int8WeightOnly, ql.W8A8, ql.Int4WeightOnly, ql.W4A8):
            mp.setattr(cls, "__init__", forbidden)
        yield


@pytest.fixture(scope="module", params=list(CASES))
def round_trip(request, tiny_model_dir, tmp_path_factory):
    """(case, built model, its facts, artifact dir, variant.json)."""
    recipe_name, options = CASES[request.param]
    model, tok, facts = _build(tiny_model_dir, recipe_name, options)
    out = tmp_path_factory.mktemp("artifact") / request.param
    meta = art.save_artifact(model, tok, facts, recipe_name, options, tiny_model_dir, out)
    return request.param, model, facts, out, meta


def _outputs(model):
    """Logits of a 1-row (decode-like) and a 3×9 (batched: M >= 4 kernel paths) forward."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    with torch.inference_mode():
        return [model(torch.randint(3, vocab, shape, generator=gen)).logits for shape in ((1, 1), (3, 9))]


def test_reloaded_artifact_is_bit_identical_and_never_quantizes(round_trip):
    case, model, _, out, _ = round_trip
    with _no_quantization():
        loaded, tok, _ = art.load_artifact(out, "cpu")
    for a, b in zip(_outputs(model), _outputs(loaded)):
        assert a.dtype == b.dtype and torch.equal(a, b), case
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys()
    for k, t in mine.items():
        assert t.dtype == theirs[k].dtype and torch.equal(t, theirs[k]), k
    for name, m in model.named_modules():
        other = loaded.get_submodule(name)
        assert type(other) is type(m), name
        if isinstance(m, ql.QuantLinear):
            assert (other.kernel, other.notes, other.path, other.dtype) == (m.kernel, m.notes, m.path, m.dtype)
    buffers = dict(loaded.named_buffers())
    for name, b in model.named_buffers():  # as they run (w4a8: unpacked), and the unsaved rotary inv_freq
        assert b.dtype == buffers[name].dtype and torch.equal(b, buffers[name]), name
    assert not loaded.training and tok.pad_token_id is not None


def test_size_on_disk_is_the_model_size(round_trip):
    case, _, facts, out, meta = round_trip
    loaded, _, loaded_facts = art.load_artifact(out, "cpu")
    disk = (out / "model.safetensors").stat().st_size
    assert loaded_facts.weight_bytes == disk == loaded_facts.extra["artifact_bytes_on_disk"]
    assert meta["weights"]["bytes_on_disk"] == disk
    # the file is the tensors as they run (tied ones once) plus a header padded to 64 bytes
    assert loaded_facts.extra["state_bytes"] == facts.weight_bytes == meta["weights"]["tensor_bytes"]
    assert 8 < disk - facts.weight_bytes < 16_384 and (disk - facts.weight_bytes) % 64 == 0
    assert loaded_facts.bits_per_weight == 8 * disk / facts.parameters   # as stored, like the size
    assert loaded_facts.kernels == facts.kernels and loaded_facts.recipe == facts.recipe
    # in memory: what the build held, and what the loaded model holds
    assert loaded_facts.extra["resident_bytes"] == facts.extra["resident_bytes"] == resident_bytes(loaded)
    if case in ("w4a8-g64", "w4a8-g32") and not kernels.available():  # int4 values unpacked as int8
        assert facts.extra["resident_bytes"] > facts.weight_bytes
    else:
        assert facts.extra["resident_bytes"] == facts.weight_bytes


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_w4a8_artifact_stores_four_bits_a_weight(tiny_model_dir, tmp_path, group_size):
    """model.safetensors holds, per w4a8 layer, nibbles [N, K'/2] + bf16 scales and zeros [N, K'/gs]
    (K' = in_features padded to the group): exactly 4 + 32/group_size bits a weight; the rest in bf16."""
    from safetensors import safe_open
    options = {"group_size": group_size, "pad_to_group": group_size > 32}  # the conftest model is 32 wide
    model, tok, facts = _build(tiny_model_dir, "w4a8", options)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, ql.W4A8)}
    assert len(layers) == 14
    expected, weights, tensors = 0, 0, {}
    for name, m in layers.items():
        n, kp = m.out_features, m.in_features + m.k_pad
        tensors |= {f"{name}.qpacked": ("U8", [n, kp // 2]), f"{name}.scales": ("BF16", [n, kp // group_size]),
                    f"{name}.zeros": ("BF16", [n, kp // group_size])}
        expected += n * kp // 2 + 2 * 2 * n * (kp // group_size)
        weights += n * kp
    if group_size == 32:  # unpadded
        assert 8 * expected / weights == 4 + 32 / group_size
    rest = {k: t for k, t in model.state_dict().items() if k.rpartition(".")[0] not in layers}
    assert all(t.dtype == torch.bfloat16 for t in rest.values())
    expected += sum(2 * t.numel() for t in rest.values())

    out = tmp_path / "w4a8"
    meta = art.save_artifact(model, tok, facts, "w4a8", options, tiny_model_dir, out)
    raw = (out / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    for key, (dtype, shape) in tensors.items():
        assert (header[key]["dtype"], header[key]["shape"]) == (dtype, shape), key
    assert meta["weights"]["tensor_bytes"] == facts.weight_bytes == expected
    assert len(raw) == 8 + int.from_bytes(raw[:8], "little") + expected
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert not any(k.endswith(".qweight") for k in f.keys())
    unpacks = []
    unpack = qp.unpack_nibbles

    def counted(p):
        unpacks.extend([] if p.is_meta else [p.shape])
        return unpack(p)

    with _no_quantization(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(qp, "unpack_nibbles", counted)
        loaded, _, loaded_facts = art.load_artifact(out, "cpu")
    assert len(unpacks) == len(layers)  # once per layer: from_state only shapes the module (meta)
    for a, b in zip(_outputs(model), _outputs(loaded)):
        assert torch.equal(a, b)
    for name, m in layers.items():  # resident: converted at load to the layout built here
        got = dict(loaded.get_submodule(name).named_buffers())
        assert got.keys() == dict(m.named_buffers()).keys()
        assert all(torch.equal(got[k], b) for k, b in m.named_buffers())
    if kernels.available():  # our w4a8_mm reads the int4 values packed: 4 bits resident, rows padded to 16
        assert all(m.packed.dtype == torch.uint8 and m.packed.numel() == -(-m.out_features // 16) * 16
                   * (m.in_features + m.k_pad) // 2 for m in layers.values())
        padded = sum((-m.out_features % 16) * (m.in_features + m.k_pad) // 2 * (1 + 8 / group_size)
                     for m in layers.values())
        assert resident_bytes(loaded) == loaded_facts.extra["resident_bytes"] == expected + padded
    else:  # one torch._int_mm per group reads them unpacked as int8
        assert all(m.qweight.dtype == torch.int8 for m in layers.values())
        unpacked = sum(m.out_features * (m.in_features + m.k_pad) // 2 for m in layers.values())
        assert resident_bytes(loaded) == loaded_facts.extra["resident_bytes"] == expected + unpacked


def test_variant_json_says_what_was_built_and_from_what(tiny_model_dir, round_trip):
    case, model, facts, out, meta = round_trip
    recipe_name, options = CASES[case]
    on_disk = json.loads((out / "variant.json").read_text())
    assert on_disk == meta
    assert meta["format"] == "variantlab-artifact" and meta["format_version"] == art.FORMAT_VERSION
    assert meta["recipe"] == recipe_name
    assert meta["options"] == parse_options(get_recipe(recipe_name), options).model_dump(mode="json")
    assert meta["facts"] == facts.to_json()
    assert meta["source"]["model_path"] == str(tiny_model_dir.resolve())
    assert meta["source"]["fingerprint"] == art.source_fingerprint(tiny_model_dir)
    assert meta["torch_version"] == torch.__version__ and meta["device_type"] == "cpu"
    assert meta["model"]["architecture"] == "LlamaForCausalLM"
    assert set(meta["model"]["non_persistent_buffers"]) == {"model.rotary_emb.inv_freq",
                                                             "model.rotary_emb.original_inv_freq"}
    swapped = {n: m for n, m in model.named_modules() if isinstance(m, ql.QuantLinear)}
    assert set(meta["modules"]) == set(swapped)
    for name, st in meta["modules"].items():
        assert st["class"] == type(swapped[name]).__name__
        width = "num_embeddings" if isinstance(swapped[name], ql.Int8Embedding) else "in_features"
        assert st["attrs"][width] == getattr(swapped[name], width)
    if case == "int4-g64":
        st = meta["modules"]["model.layers.0.self_attn.q_proj"]
        assert st["attrs"]["group_size"] == 64 and st["attrs"]["k_pad"] == 32
        if kernels.available():   # ours (int4_digits_mm) stores the nibbles and makes its layout at load
            assert st["buffers"] == {"bias": False, "qpacked": True, "scales": True, "zeros": True}
        else:                     # aten's layout is stored as it runs
            assert st["buffers"] == {"bias": False, "packed": True, "scales_and_zeros": True}
    for f in ("tokenizer.json", "tokenizer_config.json"):  # the same tokenizer id as the source
        assert (out / f).read_bytes() == (tiny_model_dir / f).read_bytes()
    assert json.loads((out / "config.json").read_text())["dtype"] == meta["model"]["load_dtype"]


def test_every_tensor_starts_on_a_64_byte_boundary_of_the_mapped_file(round_trip):
    from safetensors import safe_open
    _, _, _, out, _ = round_trip
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert all(f.get_tensor(k).data_ptr() % 64 == 0 for k in f.keys())


def test_a_file_aligned_to_8_bytes_only_is_copied_to_aligned_memory(tiny_model_dir, tmp_path):
    """aten::_weight_int8pack_mm crashes on an 8-byte-aligned weight (M >= 4): what safetensors' own
    writer gives. load_artifact reads each tensor onto a 64-byte boundary of an arena of its own instead of
    handing the kernel the mapping."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    model, tok, facts = _build(tiny_model_dir, "int8", {})
    out = tmp_path / "a"
    art.save_artifact(model, tok, facts, "int8", {}, tiny_model_dir, out)
    save_file(dict(model.state_dict()), str(out / "model.safetensors"))
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert any(f.get_tensor(k).data_ptr() % 64 for k in f.keys())  # the case this guards against
    meta = json.loads((out / "variant.json").read_text())
    meta["weights"]["bytes_on_disk"] = (out / "model.safetensors").stat().st_size
    (out / "variant.json").write_text(json.dumps(meta))
    loaded, _, _ = art.load_artifact(out, "cpu")
    assert all(t.data_ptr() % 64 == 0 for t in loaded.state_dict().values())
    for a, b in zip(_outputs(model), _outputs(loaded)):
        assert torch.equal(a, b)


def _tied_model_dir(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig.from_pretrained(tiny_model_dir)
    cfg.tie_word_embeddings = True
    torch.manual_seed(1)
    d = tmp_path / "tied"
    LlamaForCausalLM(cfg).save_pretrained(d)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(d)
    return d


@pytest.mark.parametrize("recipe_name,options", [("fp32", {}), ("int8", {"quantize_lm_head": True})])
def test_tied_tensors_are_stored_once_and_tied_again(tiny_model_dir, tmp_path, recipe_name, options):
    src = _tied_model_dir(tiny_model_dir, tmp_path)
    model, tok, facts = _build(src, recipe_name, options)
    out = tmp_path / "artifact"
    meta = art.save_artifact(model, tok, facts, recipe_name, options, src, out)
    loaded, _, loaded_facts = art.load_artifact(out, "cpu")
    for a, b in zip(_outputs(model), _outputs(loaded)):
        assert torch.equal(a, b)
    if recipe_name == "fp32":
        assert meta["weights"]["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    else:  # the quantized head is a module of its own; the embedding stays a table
        assert meta["weights"]["aliases"] == {} and isinstance(loaded.lm_head, ql.Int8WeightOnly)
    assert loaded_facts.extra["state_bytes"] == facts.weight_bytes == meta["weights"]["tensor_bytes"]


def test_a_mix_of_quant_modules_and_linears_round_trips(tiny_model_dir, tmp_path):
    """What a mixed-precision recipe builds: int4, int8 and bf16 nn.Linear layers side by side."""
    model, tok = load_causal_lm(tiny_model_dir, torch.bfloat16, "cpu")
    layer = model.model.layers[0]
    with torch.no_grad():
        layer.self_attn.q_proj = ql.Int4WeightOnly(layer.self_attn.q_proj, torch.bfloat16, group_size=32)
        layer.mlp.down_proj = ql.Int8WeightOnly(layer.mlp.down_proj, torch.bfloat16)
        layer.mlp.up_proj = ql.W4A8(layer.mlp.up_proj, torch.bfloat16, "python", group_size=32)
        layer.mlp.gate_proj = ql.W4A8(layer.mlp.gate_proj, torch.bfloat16, "kernel", group_size=32)
    facts = {"recipe": "mixed", "dtype": "bf16", "parameters": 1, "weight_bytes": 1, "bits_per_weight": 8.0}
    out = tmp_path / "mixed"
    meta = art.save_artifact(model, tok, facts, "mixed", {}, tiny_model_dir, out)
    assert sorted(meta["modules"]) == ["model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj",
                                       "model.layers.0.mlp.up_proj", "model.layers.0.self_attn.q_proj"]
    with _no_quantization():
        loaded, _, _ = art.load_artifact(out, "cpu")
    assert plain_class(loaded.model.layers[0].self_attn.k_proj) is nn.Linear
    assert loaded.model.layers[0].self_attn.k_proj.weight.dtype == torch.bfloat16
    use_decode_kernels(model)   # as loading did
    for a, b in zip(_outputs(model), _outputs(loaded)):
        assert torch.equal(a, b)


def test_save_refuses_a_module_the_config_cannot_rebuild(tiny_model, tmp_path):
    model, tok, facts = tiny_model
    model.model.layers[1].mlp = nn.Identity()
    with pytest.raises(RecipeError, match="model.layers.1.mlp' is Identity"):
        art.save_artifact(model, tok, facts, "fp32", {}, tmp_path, tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.tmp-*"))


@pytest.fixture
def tiny_model(tiny_model_dir):
    return _build(tiny_model_dir, "fp32", {})


def test_saving_again_replaces_the_artifact_whole(tiny_model_dir, tiny_model, tmp_path):
    model, tok, facts = tiny_model
    out = tmp_path / "a"
    art.save_artifact(model, tok, facts, "fp32", {}, tiny_model_dir, out)
    (out / "stale.txt").write_text("from an older build")
    art.save_artifact(model, tok, facts, "fp32", {}, tiny_model_dir, out)
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


def test_artifact_problem_says_why_an_artifact_does_not_fit(tiny_model_dir, tmp_path):
    src = shutil.copytree(tiny_model_dir, tmp_path / "model")
    model, tok, facts = _build(src, "int4", {"group_size": 32})
    out = tmp_path / "int4"
    art.save_artifact(model, tok, facts, "int4", {"group_size": 32}, src, out)
    assert art.artifact_problem(out, "int4", {"group_size": 32, "compute_dtype": "bf16"}, src, "cpu") is None
    assert "options" in art.artifact_problem(out, "int4", {"group_size": 64}, src)
    assert "recipe int4" in art.artifact_problem(out, "w4a8", {"group_size": 32}, src)
    assert "built for cpu" in art.artifact_problem(out, "int4", {"group_size": 32}, src, "cuda")
    assert "no variant.json" in art.artifact_problem(tmp_path / "nothing", "int4", {}, src)
    st = (src / "model.safetensors").stat()
    os.utime(src / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # rewritten
    assert "fingerprint" in art.artifact_problem(out, "int4", {"group_size": 32}, src)
    (out / "model.safetensors").write_bytes(b"truncated")
    assert "bytes" in art.artifact_problem(out, "int4", {"group_size": 32}, src)


def test_options_recorded_before_an_option_existed_take_its_default():
    """An int4 artifact recorded before `symmetric` existed holds asymmetric int4: it fits a variant that does
    not ask for symmetric, and not one that does; options that no longer parse are compared as recorded."""
    from variantlab.variants.registry import get_recipe
    now = art.normalized_options(get_recipe("int4"), {"group_size": 32})
    before = {k: v for k, v in now.items() if k != "symmetric"}
    assert art._stored_options("int4", before) == now
    assert art._stored_options("int4", before) != art.normalized_options(get_recipe("int4"), {"group_size": 32,
                                                                                            "symmetric": True})
    assert art._stored_options("int4", {"group_size": 48}) == {"group_size": 48}


def test_load_refuses_another_device_type_and_a_folder_that_is_not_an_artifact(tiny_model_dir, tiny_model,
                                                                                  tmp_path):
    model, tok, facts = tiny_model
    out = tmp_path / "a"
    art.save_artifact(model, tok, facts, "fp32", {}, tiny_model_dir, out)
    with pytest.raises(ModelLoadError, match="built for cpu, this run is on cuda"):
        art.load_artifact(out, "cuda")
    with pytest.raises(ModelLoadError, match="no variant.json"):
        art.load_artifact(tiny_model_dir, "cpu")


# ---------------------------------------------------------------- verified, not trusted (issue 13)

@pytest.fixture(scope="module")
def sealed_int8(tiny_model_dir, tmp_path_factory):
    """An int8 artifact as `variantlab build` writes it; tests change copies of it."""
    model, tok, facts = _build(tiny_model_dir, "int8", {})
    out = tmp_path_factory.mktemp("sealed") / "int8"
    art.save_artifact(model, tok, facts, "int8", {}, tiny_model_dir, out)
    return out


@pytest.fixture
def int8_copy(sealed_int8, tmp_path):
    return shutil.copytree(sealed_int8, tmp_path / "int8")


def _problem(path, source):
    return art.artifact_problem(path, "int8", {}, source, "cpu")


def _edit_meta(path, edit):
    meta = json.loads((path / "variant.json").read_text())
    edit(meta)
    (path / "variant.json").write_text(json.dumps(meta, indent=1))


def test_variant_json_records_the_sha256_of_every_file_and_a_digest_of_itself(int8_copy, tiny_model_dir):
    import hashlib
    from variantlab.variants.artifact_content import content_digest
    meta = json.loads((int8_copy / "variant.json").read_text())
    on_disk = {p.name for p in int8_copy.iterdir()} - {"variant.json"}
    assert set(meta["files"]) == on_disk and {"model.safetensors", "config.json", "tokenizer.json"} <= on_disk
    for name, rec in meta["files"].items():
        data = (int8_copy / name).read_bytes()
        assert rec == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert meta["content_sha256"] == content_digest(meta)
    assert _problem(int8_copy, tiny_model_dir) is None


@pytest.mark.parametrize("edit", [
    lambda m: m["facts"].update(bits_per_weight=1),
    lambda m: m["facts"]["kernels"].append("made_up_fast_kernel"),
    lambda m: m["weights"].update(tensor_bytes=1),
    lambda m: m["files"]["model.safetensors"].update(sha256="0" * 64),  # the weights' hash replaced too
], ids=["bits_per_weight", "kernel", "weights", "file-hash"])
def test_edited_facts_are_not_reused(int8_copy, tiny_model_dir, edit):
    _edit_meta(int8_copy, edit)
    assert "variant.json was edited after the build" in _problem(int8_copy, tiny_model_dir)


def test_weights_replaced_by_random_bytes_of_the_same_length_are_not_reused(int8_copy, tiny_model_dir):
    weights = int8_copy / "model.safetensors"
    weights.write_bytes(os.urandom(weights.stat().st_size))
    assert _problem(int8_copy, tiny_model_dir) == ("model.safetensors does not match the sha256 recorded at build "
                                                   "time (changed or corrupted since)")


def test_tokenizer_files_changed_added_or_removed_are_not_reused(int8_copy, sealed_int8, tiny_model_dir):
    tok = int8_copy / "tokenizer.json"
    tok.write_text(tok.read_text().replace("<pad>", "<PAD>"))
    assert "tokenizer.json does not match the sha256" in _problem(int8_copy, tiny_model_dir)
    shutil.copyfile(sealed_int8 / "tokenizer.json", tok)
    (int8_copy / "added_tokens.json").write_text("{}")
    assert _problem(int8_copy, tiny_model_dir) == "added_tokens.json was added after the build"
    (int8_copy / "added_tokens.json").unlink()
    (int8_copy / "tokenizer_config.json").unlink()
    assert _problem(int8_copy, tiny_model_dir) == "tokenizer_config.json recorded at build time is missing"
    shutil.copyfile(sealed_int8 / "tokenizer_config.json", int8_copy / "tokenizer_config.json")
    (int8_copy / ".DS_Store").write_text("a file manager's")   # hidden files are never loaded
    assert _problem(int8_copy, tiny_model_dir) is None


def test_an_artifact_written_before_content_hashes_is_not_reused(int8_copy, tiny_model_dir):
    _edit_meta(int8_copy, lambda m: (m.pop("content_sha256"), m.pop("files")))
    assert _problem(int8_copy, tiny_model_dir).startswith("written before content hashes")
    art.load_artifact(int8_copy, "cpu")   # it still loads: only reuse asks for proof


@pytest.mark.parametrize("edit,reason", [
    (lambda m: m.pop("weights"), "variant.json has no `weights`"),
    (lambda m: m.update(weights=[1, 2]), "variant.json's `weights` is list, not a mapping"),
    (lambda m: m["weights"].pop("bytes_on_disk"), "variant.json has no `weights.bytes_on_disk`"),
    (lambda m: m["weights"].update(bytes_on_disk="12"), "`weights.bytes_on_disk` is str, not an integer"),
    (lambda m: m["facts"].pop("parameters"), "variant.json has no `facts.parameters`"),
    (lambda m: m["facts"].update(parameters=True), "`facts.parameters` is bool, not an integer"),
    (lambda m: m.pop("model"), "variant.json has no `model`"),
    (lambda m: m.update(modules=None), "`modules` is NoneType, not a mapping"),
], ids=["no-weights", "weights-list", "no-bytes", "bytes-str", "no-parameters", "parameters-bool", "no-model",
        "modules-null"])
def test_a_variant_json_missing_a_key_is_a_reason_not_a_crash(int8_copy, tiny_model_dir, edit, reason):
    _edit_meta(int8_copy, edit)
    assert reason in _problem(int8_copy, tiny_model_dir)
    with pytest.raises(ModelLoadError, match="cannot load artifact"):
        art.load_artifact(int8_copy, "cpu")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '"a string"', ""])
def test_a_variant_json_that_is_not_a_json_mapping_is_a_reason(int8_copy, tiny_model_dir, content):
    (int8_copy / "variant.json").write_text(content)
    problem = _problem(int8_copy, tiny_model_dir)
    assert "variant.json" in problem and ("cannot be read" in problem or "not a variantlab artifact" in problem)
