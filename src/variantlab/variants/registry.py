"""Every recipe by name: one line to add one."""
from __future__ import annotations

from typing import Any

from ..errors import RecipeError
from .dtype import DtypeRecipe
from .mixed import MixedRecipe
from .quant import QUANT_RECIPES, QuantRecipe
from .recipe import Recipe

DEFAULT_RECIPE = "fp32"   # a suite variant's recipe when it names none (nor weight_dtype/activation_dtype)

RECIPES: dict[str, Recipe] = {
    r.name: r for r in (
        DtypeRecipe("fp32", "the checkpoint in float32 (32 bits per weight)"),
        DtypeRecipe("bf16", "every weight and matmul in bfloat16; norms and softmax accumulate in fp32"),
        DtypeRecipe("fp16", "every weight and matmul in float16; norms and softmax accumulate in fp32"),
        *QUANT_RECIPES,
        MixedRecipe(),
    )
}


# recipes chosen when a suite is planned, resolved to one of RECIPES (`recipe: auto`, measure/auto_recipe.py):
# they live above the machine layer they read, so they register themselves here when planning imports them
PLAN_TIME: dict[str, Any] = {}


def register_plan_time(recipe) -> None:
    PLAN_TIME[recipe.name] = recipe


def get_recipe(name: str, *, file: str | None = None, field: str | None = None) -> Recipe:
    try:
        return RECIPES[name] if name in RECIPES else PLAN_TIME[name]
    except KeyError:
        raise RecipeError(f"unknown recipe '{name}'", file=file, field=field,
                          accepted=" | ".join([*RECIPES, *PLAN_TIME])) from None


def parse_options(recipe: Recipe, options: dict[str, Any], *, file: str | None = None,
                  field: str | None = None):
    from pydantic import ValidationError
    try:
        return recipe.options_model.model_validate(options)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        accepted = ", ".join(recipe.options_model.model_fields) or "no options"
        msg = err["msg"].removeprefix("Value error, ")
        raise RecipeError(f"{msg} for option '{loc}' of recipe '{recipe.name}'", file=file,
                          field=field, accepted=accepted) from None


def resolve_variant_recipe(variant, *, file: str | None = None, field: str = "variants[?]") -> tuple[str, dict]:
    """(recipe name, validated options as a dict) of a suite variant, in either vocabulary.

    `weight_dtype`/`activation_dtype`/`quant_scheme` (the analysis's words) map to a recipe and its
    options; options the variant names explicitly win over the mapping's.
    """
    from .quant import recipe_from_analysis_vocabulary

    name, options = variant.recipe or DEFAULT_RECIPE, dict(variant.options)
    words = (variant.weight_dtype, variant.activation_dtype, variant.quant_scheme)
    if any(w is not None for w in words):
        if variant.recipe is not None:
            raise RecipeError("give either recipe or weight_dtype/activation_dtype/quant_scheme, not both",
                              file=file, field=f"{field}.recipe", accepted="one vocabulary per variant")
        if variant.weight_dtype is None or variant.activation_dtype is None:
            raise RecipeError("weight_dtype and activation_dtype go together", file=file,
                              field=f"{field}.weight_dtype", accepted="both, and optionally quant_scheme")
        try:
            name, mapped = recipe_from_analysis_vocabulary(*words)
        except RecipeError as e:
            raise RecipeError(e.detail, file=file, field=f"{field}.quant_scheme", accepted=e.accepted) from None
        options = mapped | options
    recipe = get_recipe(name, file=file, field=f"{field}.recipe")
    parse_options(recipe, options, file=file, field=f"{field}.options")
    return name, options


def resolve_variant_attention(variant, *, config: dict | None = None, file: str | None = None,
                              field: str = "variants[?]") -> str | None:
    """The variant's attention as a canonical string ('gqa:4'), checked with its options; None for the model's own.

    `config`: the checkpoint's config.json; the attention kind is then checked against its architecture
    (attention.check_attention_for), so that a combination that cannot work is refused while planning."""
    from .attention import check_attention_for, parse_attention, parse_attention_options
    from .attention_kinds import accepted

    if variant.attention is None:
        if variant.attention_options:
            raise RecipeError("attention_options need an attention", file=file, field=f"{field}.attention_options",
                              accepted=f"attention: {accepted()}")
        return None
    spec = parse_attention(variant.attention, file=file, field=f"{field}.attention")
    parse_attention_options(variant.attention_options, file=file, field=f"{field}.attention_options")
    if config is not None:
        check_attention_for(config, spec, file=file, field=f"{field}.attention")
    return str(spec)


# -- what the machine layer, `recipe: auto` and explain read of the recipes, from their attributes

def kernel_recipes() -> tuple[str, ...]:
    """The recipes that turn each linear layer into one quantized kernel and run without CUDA (the ones the
    machine layer times, kernel_times.py): weight-only before int8 activations, per channel before group-wise."""
    kinds = [r for r in RECIPES.values() if isinstance(r, QuantRecipe) and not r.cuda_only]
    return tuple(r.name for r in sorted(kinds, key=lambda r: (r.activations == "int8", r.grouped)))


def int8_activations(name: str) -> bool:
    """Whether the recipe's matmuls run on int8 activations (against the int8 compute ceiling)."""
    return getattr(RECIPES.get(name), "activations", None) == "int8"


def group_wise(name: str) -> bool:
    """Whether the recipe quantizes weights in groups along in_features (a group size must divide them)."""
    return bool(getattr(RECIPES.get(name), "grouped", False))


def takes_compute_dtype(name: str) -> bool:
    recipe = RECIPES.get(name)
    return recipe is not None and "compute_dtype" in getattr(recipe.options_model, "model_fields", {})
