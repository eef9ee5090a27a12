"""Recipe lookup and the analysis's vocabulary in a suite variant."""
from __future__ import annotations

import pytest

from variantlab.errors import RecipeError
from variantlab.suite import VariantSpec
from variantlab.variants.registry import RECIPES, get_recipe, resolve_variant_recipe


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(RecipeError) as e:
        get_recipe("int3", file="s.yaml", field="variants[1].recipe")
    msg = str(e.value)
    assert "s.yaml: variants[1].recipe: unknown recipe 'int3'" in msg
    assert all(name in msg for name in RECIPES)


@pytest.mark.parametrize("words, recipe, options", [
    ({"weight_dtype": "int8", "activation_dtype": "fp16", "quant_scheme": "symmetric"}, "int8",
     {"compute_dtype": "fp16"}),
    ({"weight_dtype": "int4", "activation_dtype": "int8", "quant_scheme": "asymmetric"}, "w4a8", {}),
    ({"weight_dtype": "int8", "activation_dtype": "int8"}, "w8a8", {}),
    ({"weight_dtype": "int4", "activation_dtype": "bf16"}, "int4", {}),
])
def test_analysis_vocabulary_maps_to_the_same_recipe(words, recipe, options):
    assert resolve_variant_recipe(VariantSpec(name="v", **words)) == (recipe, options)


def test_explicit_options_win_over_the_mapping():
    v = VariantSpec(name="flash", weight_dtype="int4", activation_dtype="int8", quant_scheme="asymmetric",
                    options={"group_size": 32})
    assert resolve_variant_recipe(v) == ("w4a8", {"group_size": 32})


def test_both_vocabularies_at_once_is_an_error():
    v = VariantSpec(name="v", recipe="int8", weight_dtype="int4", activation_dtype="int8")
    with pytest.raises(RecipeError, match="either recipe or weight_dtype"):
        resolve_variant_recipe(v, file="s.yaml", field="variants[0]")


def test_a_combination_without_a_recipe_names_the_field():
    v = VariantSpec(name="v", weight_dtype="int8", activation_dtype="int8", quant_scheme="asymmetric")
    with pytest.raises(RecipeError) as e:
        resolve_variant_recipe(v, file="s.yaml", field="variants[2]")
    assert "s.yaml: variants[2].quant_scheme" in str(e.value)


def test_bad_option_is_one_line_without_pydantic_prefix():
    v = VariantSpec(name="v", recipe="int4", options={"group_size": 48})
    with pytest.raises(RecipeError) as e:
        resolve_variant_recipe(v, file="s.yaml", field="variants[0]")
    assert "\n" not in str(e.value) and "Value error" not in str(e.value)
    assert "variants[0].options" in str(e.value)


def test_what_the_machine_layer_auto_and_explain_read_comes_from_the_recipes_attributes():
    from variantlab.variants.registry import RECIPES, group_wise, int8_activations, kernel_recipes, takes_compute_dtype
    assert kernel_recipes() == ("int8", "int4", "w8a8", "w4a8")     # sparse: CUDA only
    assert [n for n in RECIPES if int8_activations(n)] == ["w8a8", "w4a8", "sparse"]
    assert [n for n in RECIPES if group_wise(n)] == ["int4", "w4a8", "mixed"]
    assert not any(takes_compute_dtype(n) for n in ("fp32", "bf16", "fp16", "nope"))
