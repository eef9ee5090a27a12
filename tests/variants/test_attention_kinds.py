"""The attention-kind registry (variants/attention_kinds.py): each kind says how it is written and checked,
how it converts a model, what its cache costs and which kernels run it. A new kind is one subclass and one
registration: parsing, the suite's checks, apply_attention's facts and the stability check take it without
any other module changed."""
from __future__ import annotations

import pytest
import torch

from variantlab.errors import RecipeError
from variantlab.variants import attention_kinds
from variantlab.variants.attention import AttentionSpec, apply_attention, parse_attention
from variantlab.variants.attention_kinds import AttentionKind, accepted, attention_kind
from variantlab.variants.attention_stability import StabilityVariant, attention_stability
from variantlab.variants.registry import resolve_variant_attention

pytestmark = pytest.mark.model


class Identity(AttentionKind):
    """The model's own attention, left as it is: the trivial kind a newcomer adds."""
    name = "identity"
    needs_family = False

    def kernels(self, cfg, options):
        return [f"the checkpoint's own '{cfg._attn_implementation}' attention, unchanged"]


@pytest.fixture
def identity():
    kind = attention_kinds.register_attention(Identity())
    yield kind
    del attention_kinds._KINDS["identity"]


def test_the_built_in_kinds_are_written_as_the_suite_takes_them():
    assert accepted() == "sdpa | gqa:<kv_heads> | linear | sliding:<window>"
    assert [(k.name, k.arg, k.needs_family, k.swaps_modules) for k in attention_kinds.attention_kinds()] == [
        ("sdpa", None, False, False), ("gqa", "kv_heads", True, False), ("linear", None, True, True),
        ("sliding", "window", True, True)]
    with pytest.raises(ValueError, match="registered already"):
        attention_kinds.register_attention(attention_kinds.Sdpa())


def test_a_registered_kind_is_parsed_checked_applied_and_measured(identity, tiny_lm):
    model, tok = tiny_lm
    assert parse_attention("identity") == AttentionSpec("identity") and "identity" in accepted()
    with pytest.raises(RecipeError, match="unknown attention 'identity:2'"):
        parse_attention("identity:2")

    class Variant:
        attention, attention_options = "identity", {}
    assert resolve_variant_attention(Variant(), config={"architectures": ["SomethingNewForCausalLM"]}) == "identity"

    ids = tok("order_id: 1\nQ: status?\nA:", return_tensors="pt").input_ids
    with torch.no_grad():
        before = model(ids).logits
    import copy
    converted = copy.deepcopy(model)
    facts = apply_attention(converted, "identity")
    assert facts["kind"] == "identity" and facts["kernels"][0].startswith("the checkpoint's own")
    assert facts["kv_cache_bytes_per_token"] > 0 and facts["kv_cache_bytes_max"] is None
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, before)
    rows = attention_stability([StabilityVariant("identity", parse_attention("identity"))], lengths=(16,),
                               dtypes=("fp32",), heads=2, head_dim=8)
    assert [(r.status, r.rel_error < 1e-5) for r in rows] == [("ok", True)]


def test_an_unknown_kind_lists_every_registered_one(identity):
    with pytest.raises(RecipeError) as e:
        parse_attention("flash")
    assert e.value.accepted == "sdpa | gqa:<kv_heads> | linear | sliding:<window> | identity"
    assert attention_kind("flash") is None
