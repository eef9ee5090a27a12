"""variants/weight_arena.py: a CPU model's weights moved into one huge-page mapping, unchanged and still shared."""
from __future__ import annotations

import copy

import psutil
import pytest
import torch
from torch import nn

from variantlab.errors import ModelLoadError
from variantlab.variants import artifact as art
from variantlab.variants import weight_arena as wa


class _Shared(nn.Module):
    """Tied weights (one Parameter in two modules), a buffer that is a view into a parameter's storage, and a
    buffer of another dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16, bias=False)
        self.b = nn.Linear(8, 16, bias=False)
        self.b.weight = self.a.weight
        self.register_buffer("window", self.a.weight.detach()[3:5])
        self.register_buffer("flags", torch.arange(7, dtype=torch.int8))


def test_settle_moves_every_weight_into_one_mapping_and_changes_no_output(tiny_lm):
    model = copy.deepcopy(tiny_lm[0])
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        before = model(ids).logits
    tensors = [*model.parameters(), *model.buffers()]
    got = wa.settle(model)
    assert got.weight_bytes >= sum(t.numel() * t.element_size() for t in tensors)
    assert len({wa._arena_at(t.data_ptr()) for t in tensors}) == 1          # one mapping holds them all
    assert all(t.data_ptr() % wa.SLOT == 0 for t in tensors)
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, before)


def test_tensors_that_shared_a_storage_still_share_it():
    m = _Shared()
    values = {k: v.clone() for k, v in m.state_dict().items()}
    wa.settle(m)
    assert m.a.weight is m.b.weight
    assert m.window.data_ptr() == m.a.weight.data_ptr() + 3 * 8 * 4
    assert all(torch.equal(m.state_dict()[k], v) for k, v in values.items())
    with torch.no_grad():
        m.a.weight[3, 0] = 42.0                      # one storage: a write shows through the view
    assert m.window[0, 0] == 42.0


def test_nothing_on_the_cpu_is_nothing_to_settle():
    assert wa.settle(nn.Linear(4, 4, device="meta")) is None
    assert wa.settle(nn.ReLU()) is None


def test_settling_frees_the_old_copies():
    """The resident set does not hold two copies of the weights after settling (the C heap's freed blocks
    go back to the kernel); 32 tensors of 4 MiB, each under glibc's mmap threshold once a freed 8 MiB block
    has raised it, so they lie in the C heap."""
    torch.empty(8 << 20, dtype=torch.uint8).fill_(1)
    m = nn.ParameterList([nn.Parameter(torch.randn(1 << 20), requires_grad=False) for _ in range(32)])
    before = psutil.Process().memory_info().rss
    wa.settle(m)
    assert psutil.Process().memory_info().rss - before < 64 << 20      # the weights are 128 MiB


def test_huge_bytes_reads_this_process_mappings():
    m = nn.Linear(1024, 1024, bias=False)
    got = wa.settle(m)
    assert got.huge_bytes is not None and 0 <= got.huge_bytes <= got.weight_bytes
    assert wa.huge_bytes(8 << 20, 4096) == 0         # nothing is mapped at 8 MiB
    assert "MiB" in got.summary


def test_the_thp_setting_is_the_bracketed_word(tmp_path, monkeypatch):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    monkeypatch.setattr(wa, "THP_ENABLED", f)
    assert wa.thp_setting() == "madvise"
    monkeypatch.setattr(wa, "THP_ENABLED", tmp_path / "missing")
    assert wa.thp_setting() == "unknown"


def test_the_engine_settles_a_cpu_model(tiny_lm):
    from variantlab.backends.torch_engine import TorchEngine
    model = copy.deepcopy(tiny_lm[0])
    from variantlab.measure.backend_kinds.torch_kind import engine_facts
    from variantlab.variants.facts import VariantFacts
    engine = TorchEngine(model, tiny_lm[1], "cpu")
    assert engine.settled is not None and engine.settled.weight_bytes > 0
    facts = engine_facts(engine, VariantFacts(recipe="fp32"))
    assert facts.extra["weight_memory"] == engine.settled.summary


def test_read_safetensors_reads_what_write_safetensors_wrote(tmp_path):
    tensors = {"w": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "m": torch.tensor([True, False]),
               "s": torch.tensor(3, dtype=torch.int64), "e": torch.empty(0, 4), "q": torch.arange(11, dtype=torch.uint8)}
    path = tmp_path / "t.safetensors"
    art.write_safetensors(tensors, path, {"k": "v"})
    got = art.read_safetensors(path)
    assert got.keys() == tensors.keys()
    for k, t in tensors.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t)
        assert got[k].numel() == 0 or got[k].data_ptr() % 64 == 0


def test_threads_read_pieces_of_large_tensors_into_their_places(tmp_path, monkeypatch):
    monkeypatch.setattr(art, "READ_PIECE", 256)
    tensors = {f"t{i}": torch.randn(i * 37 + 1) for i in range(12)}
    path = tmp_path / "t.safetensors"
    art.write_safetensors(tensors, path)
    for threads in (1, 2, 5, 64):
        got = art.read_safetensors(path, threads=threads)
        assert all(torch.equal(got[k], t) for k, t in tensors.items())


def test_a_truncated_weights_file_names_the_tensor(tmp_path):
    path = tmp_path / "t.safetensors"
    art.write_safetensors({"w": torch.randn(64, 64)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="ends inside tensor 'w'"):
        art.read_safetensors(path)


def test_weights_read_from_a_file_are_in_an_arena_and_stay_where_they_are(tmp_path):
    path = tmp_path / "t.safetensors"
    art.write_safetensors({"a.weight": torch.randn(16, 8), "b.weight": torch.randn(16, 8)}, path)
    state = art.read_safetensors(path)
    assert all(wa._arena_at(t.data_ptr()) is not None for t in state.values())
    m = nn.Module()
    m.a, m.b = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False)
    m.load_state_dict(state, assign=True)
    where = {k: t.data_ptr() for k, t in m.state_dict().items()}
    wa.settle(m)
    assert {k: t.data_ptr() for k, t in m.state_dict().items()} == where
    assert all(torch.equal(m.state_dict()[k], state[k]) for k in state)


def test_what_a_module_replaced_goes_back_and_what_is_still_used_stays(tmp_path):
    """A tensor read from the file and then replaced (as a module repacks its weights at load) is handed back
    to the kernel; one the model dropped but something else still holds keeps its values."""
    path = tmp_path / "t.safetensors"
    big = torch.randn(8 << 20)                               # 32 MiB
    art.write_safetensors({"kept": torch.randn(1024), "replaced": big, "held": torch.randn(4096)}, path)
    state = art.read_safetensors(path)
    m = nn.Module()
    m.register_buffer("kept", state["kept"])
    m.register_buffer("replaced", state["replaced"] * 2)     # a new tensor: the file's copy is unused
    elsewhere = state["held"][10:20]                          # not the model's, but still alive
    values = elsewhere.clone()
    address = state["replaced"].data_ptr()
    del state
    before = wa.smaps_bytes(address, 1, "Rss")
    wa.settle(m)
    assert before - wa.smaps_bytes(address, 1, "Rss") >= 30 << 20
    assert torch.equal(elsewhere, values)
    assert torch.equal(m.replaced, big * 2)


def test_gaps_are_the_whole_pages_no_span_touches():
    p = wa.PAGE
    assert wa._gaps([], 0, 4 * p) == [(0, 4 * p)]
    assert wa._gaps([(0, 4 * p)], 0, 4 * p) == []
    assert wa._gaps([(0, 10), (3 * p + 1, 4 * p)], 0, 4 * p) == [(p, 3 * p)]     # partial pages stay
    assert wa._gaps([(-p, 10), (2 * p, 9 * p)], 0, 4 * p) == [(p, 2 * p)]      # spans past the ends are cut
    assert wa._gaps([(8 * p, 9 * p)], 0, 4 * p) == [(0, 4 * p)]                # a span elsewhere is no use


def test_settle_looks_for_unused_pages_only_where_the_model_leaves_some(tmp_path, monkeypatch):
    scanned = []
    monkeypatch.setattr(wa, "_release_unused", scanned.append)
    path = tmp_path / "t.safetensors"
    art.write_safetensors({"a": torch.randn(4096), "b": torch.randn(4096), "c": torch.randn(4096)}, path)
    state = art.read_safetensors(path)
    m = nn.Module()
    for k in ("a", "b", "c"):
        m.register_buffer(k, state[k])
    wa.settle(m)
    assert scanned == []                         # the model reads every page the file filled
    m.b = state["b"] * 2
    wa.settle(m)
    assert len(scanned) == 1 and scanned[0][1] <= state["a"].data_ptr()


class _Marked(torch.Tensor):
    """A tensor subclass defined after the engine was imported: its instances still count as live."""


def test_a_tensor_of_any_subclass_keeps_the_pages_it_reads(tmp_path):
    path = tmp_path / "t.safetensors"
    art.write_safetensors({"kept": torch.randn(1024), "gone": torch.randn(4 << 20), "held": torch.randn(4 << 20)},
                          path)
    state = art.read_safetensors(path)
    m = nn.Module()
    m.register_buffer("kept", state["kept"])
    held = torch.Tensor._make_subclass(_Marked, state["held"][8:1 << 20])
    values = held.detach().clone()
    gone = state["gone"].data_ptr()
    del state
    before = wa.smaps_bytes(gone, 1, "Rss")
    wa.settle(m)
    assert before - wa.smaps_bytes(gone, 1, "Rss") >= 12 << 20      # the unused tensor's pages went back
    assert type(held) is _Marked and torch.equal(held.as_subclass(torch.Tensor), values.as_subclass(torch.Tensor))
