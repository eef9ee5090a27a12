"""The backend registry (measure/backend_kinds/): what the suite, the plan, the runner and the worker read
of a backend instead of its name."""
from __future__ import annotations

import pytest

from variantlab.errors import VariantlabError
from variantlab.measure.backend_kinds import BUILD_FIELDS, BackendKind, backend_kind, backend_names, register_backend
from variantlab.suite import VariantSpec
from variantlab.variants.build import VariantDefinition


def test_the_built_in_backends_say_what_they_are():
    assert backend_names()[:2] == ("torch", "openai")
    torch, openai = backend_kind("torch"), backend_kind("openai")
    assert torch.builds and torch.local_model and torch.our_kernels and torch.serves and torch.takes == BUILD_FIELDS
    assert not (openai.builds or openai.local_model or openai.our_kernels or openai.serves) and openai.takes == ()
    assert openai.fields == ("base_url", "served_model", "api_key_env")


def test_an_unknown_backend_is_bad_input_naming_the_accepted_ones():
    with pytest.raises(VariantlabError, match=r"unknown backend 'tgi'.*accepted: torch \| openai"):
        backend_kind("tgi")


def test_a_backend_is_registered_once_and_one_that_builds_needs_a_build_hook():
    with pytest.raises(ValueError, match="registered already"):
        register_backend(backend_kind("torch"))
    with pytest.raises(ValueError, match="no build hook"):
        register_backend(BackendKind("half", "builds nothing", lambda job, t0: None))


def test_the_suite_refuses_what_a_backend_does_not_take_in_its_words():
    with pytest.raises(ValueError, match="base_url is for backend: openai"):
        VariantSpec(name="a", base_url="http://h:1/v1")
    with pytest.raises(ValueError, match="an endpoint is measured as it serves: attention cannot apply"):
        VariantSpec(name="e", backend="openai", base_url="http://h:1/v1", attention="gqa:2")
    with pytest.raises(ValueError, match="unknown backend 'vllm'"):
        VariantSpec(name="v", backend="vllm")
    assert VariantSpec(name="e", backend="openai", base_url="http://h:1/v1").builds is False


def test_a_definition_stored_with_an_endpoint_reads_as_backend_openai():
    old = {"name": "e", "recipe": "fp32", "options": {}, "attention": None, "attention_options": {},
           "compile": False, "endpoint": {"base_url": "http://h:1/v1", "model": None, "api_key_env": None}}
    d = VariantDefinition.from_json(old)
    assert (d.backend, d.backend_config["base_url"]) == ("openai", "http://h:1/v1")
    assert VariantDefinition.from_json(old | {"endpoint": None}).backend == "torch"
    assert VariantDefinition.from_json(d.to_json()) == d
