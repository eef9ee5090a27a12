"""The once-per-variant trackers (measure/trackers/): grading, scoring, facts, stability, on the tiny
random model behind the real engine; and their comparisons with a baseline, on hand-built outputs."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from variantlab.backends.torch_engine import TorchEngine
from variantlab.measure.tracker import Problem, WorkloadSettings
from variantlab.measure.trackers import Grading, Scoring, Stability, TRACKERS, tracker_from_config
from variantlab.measure.trackers.grading import GradingOutput
from variantlab.measure.trackers.scoring import ScoringOutput, fingerprint
from variantlab.measure.worker import Host

SAMPLES = tuple({"id": str(i), "prompt": f"a: {i}\nQ: What is the a?\nA:", "answer": str(i)} for i in range(5))
SETTINGS = WorkloadSettings(max_new_tokens=4, stop=("\n",))


@dataclasses.dataclass
class Built:
    model: object
    tokenizer: object
    facts: object = None


def host(model, tok) -> Host:
    return Host(TorchEngine(model, tok, "cpu"), Built(model, tok), SAMPLES, "cpu", None, 0)


def test_every_tracker_rebuilds_from_its_config():
    for kind, cls in TRACKERS.items():
        if kind in ("single-stream", "offline", "length-sweep", "server"):
            continue   # scenarios: tests/measure/test_scenarios.py
        t = cls()
        assert tracker_from_config(kind, t.config()) == t


@pytest.mark.model
def test_grading_answers_the_declared_samples_and_grades_them_by_exact_match(tiny_lm):
    model, tok = tiny_lm
    h = host(model, tok)
    out = Grading(3, batch_size=2, workload=SETTINGS).run(h)
    assert out.ids == ("0", "1", "2")                    # the first 3, whatever the scenarios sent
    assert len(out.outputs) == len(out.correct) == 3
    assert out.correct == tuple(o == s["answer"] for o, s in zip(out.outputs, SAMPLES))
    answers = tuple(s | {"answer": o} for s, o in zip(SAMPLES, out.outputs))
    h.samples = answers                                  # the model's own answers are all correct
    assert Grading(3, batch_size=3, workload=SETTINGS).run(h).accuracy == 1.0


def test_retention_is_the_variants_accuracy_over_the_baselines_on_the_same_samples():
    g = Grading(4)
    base = GradingOutput(ids=("a", "b", "c", "d"), outputs=("",) * 4, correct=(True, True, True, False))
    var = GradingOutput(ids=("a", "b", "c", "d"), outputs=("",) * 4, correct=(True, False, True, False))
    retention = g.compare(base, var, None)["accuracy_retention"]
    assert retention.value == pytest.approx(2 / 3)
    assert retention.low <= 2 / 3 <= retention.high and retention.high <= 1.0   # the variant never beats it here
    same = g.compare(base, base, None)["accuracy_retention"]
    assert (same.value, same.low, same.high) == (1.0, 1.0, 1.0)                # same answers: no doubt at all
    other = var.model_copy(update={"ids": ("a", "b", "c", "e")})
    assert isinstance(g.compare(base, other, None)["accuracy_retention"], Problem)
    none = base.model_copy(update={"correct": (False,) * 4})
    assert "no sample correctly" in g.compare(none, var, None)["accuracy_retention"].text


@pytest.mark.model
def test_scoring_travels_as_a_blob_and_compares_identical_variants_exactly(tiny_lm):
    model, tok = tiny_lm
    h = host(model, tok)
    out = Scoring(3).run(h)
    assert out.texts == 3 and out.positions > 0 and out.nonfinite is None
    assert set(h.blobs) == {out.logprobs_blob} and out.vocabulary_blob is None
    # with an endpoint in the plan: the vocabulary's token texts too, which its top-k is matched by (issue 24)
    texts = Scoring.from_config(Scoring(3, token_texts=True).config()).run(h)
    assert texts.text_fingerprint and len(json.loads(h.blobs[texts.vocabulary_blob])) == len(tok)
    facts = Scoring(3).compare(out, out, h.blobs.__getitem__)
    assert facts["kld_mean"] == pytest.approx(0.0, abs=1e-9) and facts["top1_agreement"] == 1.0
    assert facts["ppl_ratio"] == pytest.approx(1.0)


@pytest.mark.model
def test_scoring_names_where_logits_stop_being_finite(tiny_lm):
    model, tok = tiny_lm
    nan = copy.deepcopy(model)
    with torch.no_grad():
        nan.lm_head.weight[3] = float("nan")
    out = Scoring(2).run(host(nan, tok))
    assert out.nonfinite == "NaN or inf logits from position 0 of text 0" and out.nll_nats is None
    assert out.problem.text == out.nonfinite


def test_the_tokenizer_fingerprint_is_what_the_tokenizer_does():
    assert fingerprint("A", [[1, 2], [3]]) == fingerprint("A", [[1, 2], [3]])
    assert fingerprint("A", [[1, 2], [3]]) != fingerprint("B", [[1, 2], [3]])      # another class
    assert fingerprint("A", [[1, 2], [3]]) != fingerprint("A", [[1], [2, 3]])      # another split
    base = ScoringOutput(texts=1, positions=2, nll_nats=1.0, n_bytes=3, tokenizer_fingerprint="x",
                         tokenizer_class="A", logprobs_blob="00")
    other = base.model_copy(update={"tokenizer_fingerprint": "y", "tokenizer_class": "B"})
    facts = Scoring().compare(base, other, None)
    assert all(isinstance(v, Problem) and "not comparable" in v.text for v in facts.values())


@pytest.mark.model
def test_stability_measures_the_models_own_attention_at_the_given_lengths(tiny_lm):
    model, tok = tiny_lm
    out = Stability((16, 64)).run(host(model, tok))
    assert [r.length for r in out.rows] == [16, 64]
    assert all(r.status == "ok" and r.rel_error < 1e-5 for r in out.rows)   # fp32 against float64
    (row,) = Stability((16, 64)).metrics()
    assert row.samples(out) == [out.rows[-1].rel_error]


@pytest.mark.model
def test_stability_within_a_learned_position_table_measures_gpt2(family_dirs):
    """Issue 22: at the default 2,048 tokens GPT-2's check raised IndexError (its table: 1,024; here 128) and
    the row was empty; capped at the table it measures."""
    from variantlab.measure.trackers.stability import stability_within
    from variantlab.models.loading import check_model_dir, load_causal_lm
    model, tok = load_causal_lm(family_dirs["gpt2"], torch.float32, "cpu")
    with pytest.raises(IndexError):
        Stability((64, 512)).run(host(model, tok))
    tracker = stability_within((64, 512), check_model_dir(family_dirs["gpt2"]).position_limit())
    assert tracker.lengths == (64, 128) and "not 64, 512" in tracker.capped
    out = tracker.run(host(model, tok))
    assert [r.length for r in out.rows] == [64, 128]
    assert all(r.status == "ok" and r.rel_error < 1e-5 for r in out.rows)   # fp32 against float64


@pytest.mark.model
def test_profile_times_both_phases_and_names_its_operators(tiny_lm):
    from variantlab.explain.categories import CATEGORIES
    from variantlab.measure.trackers.profile import Profile, ProfileOutput, WorkloadSpec
    from variantlab.variants.facts import VariantFacts
    model, tok = tiny_lm
    h = host(model, tok)
    h.built.facts = VariantFacts("fp32", "fp32", 1, 4, 32.0)
    t = Profile((WorkloadSpec("single-stream", 1, 2), WorkloadSpec("offline", 2, 2)), max_new_tokens=3, reps=2)
    out = t.run(h)
    assert ProfileOutput.model_validate(out.model_dump(mode="json")) == out      # crosses the process boundary
    assert [w.scenario for w in out.workloads] == ["single-stream", "offline"]
    prompts = sum(len(h.backend.encode(s["prompt"])) for s in SAMPLES[:2])
    for w in out.workloads:
        prefill, decode = w.phases
        assert (prefill.phase, decode.phase) == ("prefill", "decode")
        assert prefill.tokens == prompts and decode.tokens == 2 * (3 - 1)      # every request runs max_new_tokens
        assert len(prefill.plain_s) >= 2 and len(prefill.profiled) == 2
        assert all(s > 0 for s in prefill.plain_s + decode.plain_s)
        ops = [o for run in decode.profiled for o in run.ops]
        assert ops and all(o.category in CATEGORIES and o.calls > 0 and o.self_s >= 0 for o in ops)
        assert w.counters.reason or w.counters.counts
    assert out.marked_modules > 0 and out.shape["layers"] == model.config.num_hidden_layers
    assert out.ceilings["read_gbps"] > 0 and not out.compiled


def test_the_machine_yardstick_times_fixed_work_that_is_not_the_variant():
    from variantlab.measure.trackers.machine import REPEATS, Machine, MachineOutput, timings
    out = Machine().run(None)                                  # it needs nothing of the host: not the variant
    assert len(out.small_ops_s) == len(out.python_s) == REPEATS and min(out.small_ops_s + out.python_s) > 0
    rows = {d.key: d for d in Machine().metrics()}
    assert set(rows) == {"small_ops", "python"} and all(d.is_timing and d.headline is None for d in rows.values())
    assert rows["small_ops"].samples(out) == list(out.small_ops_s)
    MachineOutput.model_validate(out.model_dump(mode="json"))
    ticks = iter(range(100))
    assert timings(lambda: None, repeats=3, clock=lambda: next(ticks)) == (1, 1, 1)   # one untimed pass first
