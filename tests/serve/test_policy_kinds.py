"""The serve-policy registry (serve/policy_kinds.py): a new policy is one registration, and the server's
assembly, the router and the bench's server scenario take it without any other module changed."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.serve.test_engine import requests, run_all
from variantlab.errors import VariantlabError
from variantlab.measure.scenarios.server import ServerSpec
from variantlab.serve import policy_kinds
from variantlab.serve.assembly import ServeOptions, assemble_engine
from variantlab.serve.policies import Decision, LaneView, LoadView
from variantlab.serve.policy_kinds import PolicyKind, PolicySettings, make_policy, policy_kind, policy_names


@dataclass
class PairsPolicy:
    """Two requests at a time, in the first variant: the trivial policy a newcomer would add."""
    variant: str
    name: str = "pairs"

    def decide(self, view: LoadView) -> Decision:
        return Decision({self.variant: 0 if view.lanes[self.variant].busy else 2})

    def deadline(self, view: LoadView) -> float | None:
        return None

    def admits_pinned(self, lane: LaneView) -> bool:
        return not lane.busy


@pytest.fixture
def pairs():
    kind = policy_kinds.register_policy(PolicyKind("pairs", "two at a time", lambda lanes, s, log: (
        PairsPolicy(next(iter(lanes))), {})))
    yield kind
    del policy_kinds._KINDS["pairs"]


def test_the_built_in_policies_say_what_they_are():
    assert policy_names() == ("single", "static", "adaptive")
    assert [(k.routes, k.batches, k.keeps_slos) for k in map(policy_kind, policy_names())] == [
        (False, False, False), (False, True, False), (True, True, True)]


def test_an_unknown_policy_is_bad_input_naming_the_field_and_the_registered_ones():
    with pytest.raises(VariantlabError) as info:
        policy_kind("fastest", field="--policy")
    assert info.value.one_line() == "--policy: unknown policy 'fastest' (accepted: single | static | adaptive)"
    with pytest.raises(VariantlabError):
        ServeOptions(policy="fastest")
    with pytest.raises(ValueError, match="unknown policy 'fastest': accepted single | static | adaptive"):
        ServerSpec(type="server", rate=1, policy="fastest")


def test_a_registered_policy_is_served_by_the_assembly_and_accepted_by_the_suite(pairs, engine):
    assert "pairs" in policy_names() and ServerSpec(type="server", rate=1, policy="pairs").policy == "pairs"
    assert "pairs" in ServerSpec.model_json_schema()["properties"]["policy"]["enum"]
    serving, costs = assemble_engine({"v": engine}, ["v"], ServeOptions(policy="pairs", max_batch=4), None)
    assert isinstance(serving.policy, PairsPolicy) and costs == {}
    reqs = requests(engine, 5)
    collected = run_all(serving, reqs)
    assert all(collected.events[r.request_id][-1].finish_reason for r in reqs)


def test_the_static_kind_is_made_with_its_settings(engine):
    from variantlab.serve.lane import Lane
    policy, costs = make_policy("static", {"v": Lane("v", engine, max_rows=4, max_len=64)},
                                PolicySettings(batch_size=3, max_wait_s=0.5))
    assert (policy.variant, policy.batch_size, policy.max_wait_s, costs) == ("v", 3, 0.5, {})


@pytest.fixture
def engine(tiny_lm):
    from variantlab.backends.torch_engine import TorchEngine
    model, tok = tiny_lm
    return TorchEngine(model, tok, "cpu")


def _plan_with_an_endpoint(tmp_path):
    import yaml

    from variantlab.measure.plan import plan_suite_file
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "model": "builtin:tiny-structured",
        "variants": [{"name": "local"}, {"name": "far", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}]}))
    return plan_suite_file(tmp_path / "s.yaml")


def test_serve_hosts_the_suites_variants_our_engine_can_and_refuses_an_endpoint_asked_for(tmp_path):
    from variantlab.serve.server import ServeOptions, served_names
    plan = _plan_with_an_endpoint(tmp_path)
    assert served_names(plan, ServeOptions(policy="adaptive")) == ["local"]
    with pytest.raises(VariantlabError, match=r"variant 'far' runs on backend: openai, which `variantlab serve` "
                                              r"cannot host.*accepted: local"):
        served_names(plan, ServeOptions(policy="adaptive", variants=("far",)))
