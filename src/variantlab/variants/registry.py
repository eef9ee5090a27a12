"""Every recipe by name: one line to add one."""
from __future__ import annotations

from typing import Any

from ..errors import RecipeError
from .dtype import DtypeRecipe
from .quant import QUANT_RECIPES
from .recipe import Recipe

RECIPES: dict[str, Recipe] = {
    r.name: r for r in (
        DtypeRecipe("fp32", "the checkpoint in float32 (32 bits per weight)"),
        DtypeRecipe("bf16", "every weight and matmul in bfloat16; norms and softmax accumulate in fp32"),
        DtypeRecipe("fp16", "every weight and matmul in float16; norms and softmax accumulate in fp32"),
        *QUANT_RECIPES,
    )
}


def get_recipe(name: str, *, file: str | None = None, field: str | None = None) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise RecipeError(f"unknown recipe '{name}'", file=file, field=field,
                          accepted=" | ".join(RECIPES)) from None


def parse_options(recipe: Recipe, options: dict[str, Any], *, file: str | None = None,
                  field: str | None = None):
    from pydantic import ValidationError
    try:
        return recipe.options_model.model_validate(options)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        accepted = ", ".join(recipe.options_model.model_fields) or "no options"
        raise RecipeError(f"{err['msg']} for option '{loc}' of recipe '{recipe.name}'", file=file,
                          field=field, accepted=accepted) from None
