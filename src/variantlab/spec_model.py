"""The base of every model a user writes: the suite file's entries, scenario specs, recipe and attention options.

Frozen, unknown keys refused, and no boolean where a number belongs. pydantic's lax mode reads `true` as 1
for an int or float field (`rounds: true` ran one round of a full bench; `max_e2el_s: {p95: true}` was a
one-second limit), while everything else lax mode allows stays: an int for a float field, a quoted number
("3"), and `1e3`, which YAML 1.1 reads as the string "1e3" and a float field reads as 1000.0. The rule is
one `before` validator on every subclass, which walks each given field's annotation (Optional,
Union, list, tuple, dict values, Annotated, Literal of numbers) alongside the value; a nested model checks
its own fields. A field that admits a bool (`compile: bool`) or anything (`options: dict[str, Any]`, which
its recipe's own options model checks) is left alone. The JSON schema is unchanged: JSON Schema's
"integer" and "number" already exclude booleans, so the schema and the validation now agree.
"""
from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

BOOL_FOR_NUMBER = "bool_for_number"   # the error type: suite.py words it like pydantic's number errors


class SpecModel(BaseModel):
    """Frozen, unknown keys refused, and a boolean refused wherever a field wants a number (see above)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            f = cls.model_fields.get(name) if isinstance(name, str) else None
            if f is not None and (where := bool_for_number(f.annotation, value)) is not None:
                at = f" (at {where})" if where else ""
                error = PydanticCustomError(BOOL_FOR_NUMBER, "Input should be a number, not a boolean{at}",
                                            {"at": at})
                # raised as a ValidationError so that its location is the field's (pydantic prefixes the
                # enclosing models' path), as a field validator's would be; one on every field ("*") is refused
                # on a discriminator field (a scenario's `type`)
                raise ValidationError.from_exception_data(cls.__name__, [
                    InitErrorDetails(type=error, loc=(name,), input=value)])
        return data


def bool_for_number(annotation: Any, value: Any, path: str = "") -> str | None:
    """Where inside `value` a bool stands for a number `annotation` expects ('' for the value itself,
    'p95' for a mapping's entry, '[2]' for a list's item); None when there is no such bool."""
    if isinstance(value, bool):
        kinds = _scalar_kinds(annotation)
        return path if "number" in kinds and not kinds & {"bool", "any"} else None
    if isinstance(value, dict):
        found = [_first(bool_for_number(inner, v, f"{path}.{k}" if path else str(k)) for k, v in value.items())
                 for inner in _containers(annotation)]
    elif isinstance(value, (list, tuple)):
        found = [_first(bool_for_number(item_at(i), v, f"{path}[{i}]") for i, v in enumerate(value))
                 for item_at in _sequences(annotation)]
    else:
        return None
    return found[0] if found and None not in found else None   # refused only where every alternative refuses


def _first(wheres) -> str | None:
    return next((w for w in wheres if w is not None), None)


def _members(annotation: Any) -> list[Any]:
    """The alternatives of an annotation: Union and Optional split, Annotated unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def _scalar_kinds(annotation: Any) -> set[str]:
    """What a scalar may be under `annotation`: 'number', 'bool', 'any' (Any, object)."""
    kinds: set[str] = set()
    for m in _members(annotation):
        if m is Any or m is object:
            kinds.add("any")
        elif m is bool:
            kinds.add("bool")
        elif m in (int, float):
            kinds.add("number")
        elif typing.get_origin(m) is Literal:
            for v in typing.get_args(m):   # Literal[32, 64, 128]: True == 1 is no group size either
                if isinstance(v, bool):
                    kinds.add("bool")
                elif isinstance(v, (int, float)):
                    kinds.add("number")
    return kinds


def _containers(annotation: Any) -> list[Any]:
    """The value annotations of the dict alternatives of `annotation`."""
    found = []
    for m in _members(annotation):
        args = typing.get_args(m)
        if typing.get_origin(m) is dict and len(args) == 2:
            found.append(args[1])
    return found


def _sequences(annotation: Any) -> list[Callable[[int], Any]]:
    """For each list or tuple alternative of `annotation`, index → its item's annotation (a list or a
    tuple[X, ...] has X at every index; a fixed tuple its own per position, None past its end)."""
    found: list[Callable[[int], Any]] = []
    for m in _members(annotation):
        origin, args = typing.get_origin(m), typing.get_args(m)
        if (origin in (list, set, frozenset) and args) or (origin is tuple and args[1:] == (Ellipsis,)):
            found.append(lambda i, item=args[0]: item)
        elif origin is tuple and args:
            found.append(lambda i, items=args: items[i] if i < len(items) else None)
    return found
