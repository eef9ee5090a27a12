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


def test_a_backend_with_a_plan_hook_plans_its_own_variants_and_its_refusal_is_one_problem(tmp_path, monkeypatch):
    """The `plan` hook (llama.cpp's GGUF path will be one): what it returns is the planned definition, what it
    raises is bad input listed with the suite's other problems."""
    from variantlab.measure.backend_kinds import base
    from variantlab.measure.plan import plan_suite_file

    def plan(spec, base_dir, file, field):
        if spec.name == "bad":
            raise VariantlabError("no such file", file=file, field=f"{field}.name", accepted="a file there")
        return VariantDefinition(spec.name, backend="planned", backend_config={"from": str(base_dir)})

    kind = BackendKind("planned", "plans itself", lambda job, t0: None, builds=False, local_model=False, plan=plan)
    monkeypatch.setitem(base._KINDS, "planned", kind)
    suite = tmp_path / "suite.yaml"
    body = ("name: t\nmodel: builtin:tiny-structured\nworkload: {dataset: {generator: structured, n: 2}, "
            "max_new_tokens: 2, scenarios: [{type: single-stream, requests: 1}]}\n")
    suite.write_text(body + "variants: [{name: base}, {name: mine, backend: planned}]\n")
    planned = plan_suite_file(suite).variants[1].definition
    assert (planned.backend, planned.backend_config) == ("planned", {"from": str(tmp_path)})
    suite.write_text(body + "variants: [{name: base}, {name: bad, backend: planned}]\n")
    with pytest.raises(VariantlabError, match=r"variants\[1\]\.name: no such file"):
        plan_suite_file(suite)
