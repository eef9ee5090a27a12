"""payloads.Payload and OpenPayload: frozen, typed, read by attribute or by the key of the JSON they are written
as; an earlier version's JSON reads back; `replace` validates."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from variantlab.payloads import OpenPayload, Payload


class Inner(Payload):
    n: int = 0


class Closed(Payload):
    name: str
    tags: tuple[str, ...] = ()
    inner: Inner | None = None


class Open(OpenPayload):
    cpu: str | None = None
    cores: int | None = None


def test_a_payload_reads_by_attribute_and_by_key_and_writes_lists_for_tuples():
    p = Closed(name="a", tags=["x", "y"], inner={"n": 3})
    assert p.tags == ("x", "y") and p["tags"] == ("x", "y") and p.inner.n == 3 and p["inner"]["n"] == 3
    assert p.to_json() == {"name": "a", "tags": ["x", "y"], "inner": {"n": 3}} == p
    assert p.get("nothing", 5) == 5 and "name" in p and "nothing" not in p and {**p}["name"] == "a"
    with pytest.raises(KeyError):
        p["nothing"]
    with pytest.raises(ValidationError):
        p.name = "b"   # frozen


def test_fields_an_earlier_version_lacks_take_defaults_and_unknown_ones_are_dropped():
    p = Closed.model_validate({"name": "a", "from_a_newer_version": 1})
    assert p.tags == () and p.inner is None and "from_a_newer_version" not in p.to_json()


def test_replace_validates_what_it_is_given():
    p = Closed(name="a")
    assert p.replace(tags=["z"]).tags == ("z",) and p.tags == ()
    with pytest.raises(ValidationError):
        p.replace(inner={"n": "not a number"})


def test_an_open_payload_keeps_unknown_keys_and_writes_only_what_it_was_given():
    e = Open.model_validate({"cpu": "EPYC", "isa_of_tomorrow": {"x": True}})
    assert e.cpu == "EPYC" and e.cores is None and e["isa_of_tomorrow"] == {"x": True}
    assert e.to_json() == {"cpu": "EPYC", "isa_of_tomorrow": {"x": True}} and e.model_dump_json().count("null") == 0
    assert "cores" not in e and e.get("cores", "unset") == "unset" and len(e) == 2   # by key: the dict it was
    assert not Open() and Open().to_json() == {}
    assert e.replace(cores=2).to_json() == {"cpu": "EPYC", "isa_of_tomorrow": {"x": True}, "cores": 2}


def test_the_leading_fields_may_be_given_by_position_as_to_a_dataclass():
    assert Closed("a", ["x"]) == Closed(name="a", tags=("x",))
    with pytest.raises(TypeError, match="at most 3 positional"):
        Closed("a", (), None, "one too many")
