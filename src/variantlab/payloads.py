"""The base of the typed payloads that records and the comparison carry (facts, attention facts, environments,
a stored plan, a build summary): one serialisation system, pydantic's.

A payload is frozen and typed, read by attribute (`facts.attention.window`). It reads as the JSON it is
written as, too, by key (`facts["recipe"]`, `env.get("threads_per_worker")`, `{**payload}`), so that code
and tests written against the JSON keep their meaning: `to_json()` is that JSON (lists where the record
holds tuples). A payload stored by an earlier version reads back: fields it lacks take their defaults, and
a payload whose model says `extra="ignore"` drops fields this version does not know (`extra="allow"` keeps
them, readable by key, for payloads whose keys are open, an environment's)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer


class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    def __init__(self, *args: Any, **fields: Any) -> None:
        """By name, or the leading fields by position in the order they are declared (as a dataclass)."""
        if len(args) > len(type(self).model_fields):
            raise TypeError(f"{type(self).__name__} takes at most {len(type(self).model_fields)} positional fields")
        super().__init__(**dict(zip(type(self).model_fields, args)), **fields)

    def _names(self) -> list[str]:
        return list(type(self).model_fields) + list(self.model_extra or {})

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self._names() else default

    def __contains__(self, key: object) -> bool:
        return key in self._names()

    def __eq__(self, other: object) -> bool:   # equal to the JSON it is written as, too
        if isinstance(other, dict):
            return self.to_json() == other
        return super().__eq__(other)

    __hash__ = BaseModel.__hash__

    def __len__(self) -> int:
        return len(self._names())

    def keys(self) -> list[str]:
        return self._names()

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self._names()]

    def replace(self, **changes: Any) -> "Payload":
        """A copy with `changes`, validated as the model says (the frozen record's `dataclasses.replace`)."""
        given = {k: getattr(self, k) for k in self.model_fields_set} | (self.model_extra or {})
        return type(self).model_validate(given | changes)

    def to_json(self) -> dict:
        return self.model_dump(mode="json")


class OpenPayload(Payload):
    """A payload whose keys are open (an environment): the fields it names are typed, others are kept as they
    came, and its JSON holds what it was given, no more (a field it was not given is not written as null)."""

    model_config = ConfigDict(extra="allow")

    def _names(self) -> list[str]:   # by key it reads as the dict it was given
        return [k for k in type(self).model_fields if k in self.model_fields_set] + list(self.model_extra or {})

    @model_serializer(mode="wrap")
    def _as_given(self, handler) -> dict:
        out = handler(self)
        given = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in out.items() if k in given}
