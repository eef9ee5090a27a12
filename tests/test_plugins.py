"""Adding a kind is one module and one registration each, no edit to variantlab (issue 23): one plugin module,
written here and named in VARIANTLAB_PLUGINS, adds an echo backend, an identity attention kind, a scenario
and a serve policy, and `variantlab bench` — its workers included, fresh processes that inherit the
environment — measures them beside a torch variant in one table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from tests.test_cli import assert_one_line_error, run_cli

PLUGIN = textwrap.dedent('''
    """An echo backend, an identity attention kind, a `once` scenario and a `first` policy: one registration each."""
    import time
    from typing import Literal

    from variantlab.backends.base import Capabilities, TokenEvent, FINISH_LENGTH
    from variantlab.measure.backend_kinds import BackendKind, Opened, register_backend
    from variantlab.measure.scenarios import register_scenario
    from variantlab.measure.scenarios.single_stream import SingleStream, SingleStreamSpec
    from variantlab.serve.policies import SinglePolicy
    from variantlab.serve.policy_kinds import PolicyKind, register_policy
    from variantlab.variants.attention_kinds import AttentionKind, register_attention


    class Echo:
        """Answers each prompt with its own first bytes, one byte a token."""
        capabilities = Capabilities(batching=True)
        tokenizer_id = "echo:bytes"
        clock = staticmethod(time.perf_counter)

        def encode(self, text):
            return list(text.encode())

        def decode(self, ids):
            return bytes(i for i in ids if 0 <= i < 256).decode(errors="replace")

        def score(self, texts):
            raise NotImplementedError("echo has no logits")

        def stream(self, requests):
            for i, r in enumerate(requests):
                ids = self.encode(r.prompt)[: r.max_new_tokens]
                for j, t in enumerate(ids):
                    yield TokenEvent(i, t, self.clock(), FINISH_LENGTH if j == len(ids) - 1 else None,
                                     prompt_tokens=len(self.encode(r.prompt)) if j == 0 else None)


    register_backend(BackendKind("echo", "answers with the prompt", lambda job, t0: Opened(Echo(), device="echo"),
                                 builds=False, local_model=False, label="echo",
                                 describe=lambda config: {"recipe": "echo", "dtype": None, "kernels": [], "notes": []}))


    class Identity(AttentionKind):
        name, needs_family = "identity", False

        def apply(self, model, modules, spec, options, family, helpers):
            return ["identity: the model's own attention, unchanged"]


    register_attention(Identity())


    class OnceSpec(SingleStreamSpec):
        type: Literal["once"]


    class Once(SingleStream):
        kind, spec_model = "once", OnceSpec


    register_scenario(Once)
    register_policy(PolicyKind("first", "serves the first variant, one request at a time",
                               lambda lanes, settings, log: (SinglePolicy(next(iter(lanes))), {}), batches=False))
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "plugin_demo.py").write_text(PLUGIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("VARIANTLAB_PLUGINS", "plugin_demo")
    return tmp_path


@pytest.mark.slow
@pytest.mark.e2e
def test_one_plugin_module_adds_a_backend_an_attention_kind_a_scenario_and_a_policy(plugin):
    suite = {"name": "plugins", "model": "builtin:tiny-structured", "rounds": 1,
             "variants": [{"name": "base"}, {"name": "same", "attention": "identity"},
                          {"name": "echo", "backend": "echo"}],
             "workload": {"dataset": {"generator": "structured", "n": 4, "seed": 0}, "max_new_tokens": 3,
                          "scenarios": [{"type": "once", "requests": 2, "warmup": 0}],
                          "accuracy": {"samples": 1, "graded": 2}}}
    (plugin / "suite.yaml").write_text(yaml.safe_dump(suite))
    proc = run_cli("bench", "suite.yaml", "--json", cwd=plugin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    comparison = json.loads(proc.stdout)["comparison"]
    assert comparison["status"] == {"base": "ok", "same": "ok", "echo": "ok"}
    rows = {r["key"]: r for r in comparison["rows"]}
    assert rows["once.tpot_p50"]["cells"]["echo"]["value"] is not None
    # the identity kind changed nothing: the same answers as the baseline; echo says what it cannot measure
    assert rows["grading.task_accuracy"]["cells"]["same"]["value"] == rows["grading.task_accuracy"]["cells"]["base"]["value"]
    assert "not measured" in rows["memory.peak"]["cells"]["echo"]["problem"]
    policy = subprocess.run([sys.executable, "-c", "from variantlab.serve.policy_kinds import make_policy, policy_kind; "
                             "print(type(make_policy('first', {'a': None, 'b': None}, None)[0]).__name__, "
                             "policy_kind('first').batches)"], capture_output=True, text=True, timeout=120)
    assert policy.stdout.split() == ["SinglePolicy", "False"], policy.stderr[-2000:]


def test_a_plugin_that_does_not_import_is_one_line_of_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("VARIANTLAB_PLUGINS", "no_such_plugin_module")
    assert_one_line_error(run_cli("hw", cwd=tmp_path), "VARIANTLAB_PLUGINS", "no_such_plugin_module")


def test_a_backend_no_plugin_registered_is_refused_naming_the_accepted_ones(tmp_path):
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"model": "builtin:tiny-structured",
                                                         "variants": [{"name": "a", "backend": "echo"}]}))
    assert_one_line_error(run_cli("bench", "suite.yaml", cwd=tmp_path), "variants[0]", "unknown backend 'echo'",
                          "torch | openai")
