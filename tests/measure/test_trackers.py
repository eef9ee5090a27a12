"""The once-per-variant trackers (measure/trackers/): grading, scoring, facts, stability, on the tiny
random model behind the real engine; and their comparisons with a baseline, on hand-built outputs."""
from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from variantlab.measure import accuracy as acc
from variantlab.measure.reference import open_reference

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


def scoring_host(model, tok, reference, writes=False) -> Host:
    h = host(model, tok)
    h.reference_dir, h.writes_reference, h.same_checkpoint = str(reference), writes, True
    return h


@pytest.mark.model
def test_scoring_compares_with_the_reference_in_the_worker_exactly_and_ships_figures_only(tiny_lm, tmp_path):
    model, tok = tiny_lm
    made = Scoring(3).run(scoring_host(model, tok, tmp_path, writes=True))
    assert made.texts == 3 and made.positions > 0 and made.reference
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)                  # another distribution at every position
    h = scoring_host(other, tok, tmp_path)
    out = Scoring(3).run(h)
    assert h.blobs == {} and out.logprobs_blob is None and out.split == "reference"
    # the figures are those of the whole distributions, computed here from both engines' full outputs
    texts = Scoring(3).texts(SAMPLES)
    base = np.concatenate([s.logprobs for s in TorchEngine(model, tok, "cpu").score(texts)])
    var = np.concatenate([s.logprobs for s in TorchEngine(other, tok, "cpu").score(texts)])
    full = acc.kld_summary(base, var)
    assert out.kld_mean == pytest.approx(full["mean"], rel=1e-12) and out.kld_mean > 1e-4
    assert out.kld_p99 == pytest.approx(full["p99"], rel=1e-12)
    assert out.top1_agreement == acc.top1_agreement(base, var)
    facts = Scoring(3).compare(made, out, None)
    assert facts["kld_mean"] == out.kld_mean and facts["ppl_ratio"] == pytest.approx(
        np.exp(out.nll_nats / out.positions - made.nll_nats / made.positions))
    same = Scoring(3).compare(made, Scoring(3).run(scoring_host(model, tok, tmp_path)), None)
    assert same["kld_mean"] == 0.0 and same["top1_agreement"] == 1.0 and same["ppl_ratio"] == 1.0


@pytest.mark.model
def test_scoring_says_why_there_is_no_comparison(tiny_lm, tmp_path):
    model, tok = tiny_lm
    lonely = Scoring(2).run(scoring_host(model, tok, tmp_path / "none"))
    assert lonely.versus.startswith("no baseline reference: no baseline reference in") and lonely.kld_mean is None
    assert lonely.nll_nats is not None                      # its own perplexity and bits per byte still count
    made = Scoring(2).run(scoring_host(model, tok, tmp_path, writes=True))
    assert isinstance(Scoring(2).compare(made, lonely, None)["kld_mean"], Problem)
    engine = TorchEngine(model, tok, "cpu")
    engine.vocabulary_source = "own"                        # splits the text itself (a user's GGUF does)
    real_predicted = engine._predicted
    engine._predicted = lambda text: (lambda ids, n: ([ids[0], *ids] , n))(*real_predicted(text))   # another split
    h = Host(engine, Built(model, tok), SAMPLES, "cpu", None, 0, reference_dir=str(tmp_path), same_checkpoint=True)
    own = Scoring(2).run(h)
    assert own.split == "own" and own.versus.startswith("not comparable: ") and own.kld_mean is None
    facts = Scoring(2).compare(made, own, None)
    assert all(isinstance(v, Problem) and "not comparable" in v.text for v in facts.values())
    # a variant of another checkpoint is never fed the baseline's ids, whatever its backend takes
    other = Scoring(2).run(Host(TorchEngine(model, tok, "cpu"), Built(model, tok), SAMPLES, "cpu", None, 0,
                                reference_dir=str(tmp_path), same_checkpoint=False))
    assert other.split == "own" and other.kld_mean == 0.0      # same tokenizer here: its own split is the baseline's


@pytest.mark.model
def test_a_reference_for_an_endpoint_carries_the_vocabularys_texts(tiny_lm, tmp_path):
    model, tok = tiny_lm
    made = Scoring(3, token_texts=True).run(scoring_host(model, tok, tmp_path, writes=True))
    reference = open_reference(tmp_path)
    assert made.text_fingerprint == reference.text_fingerprint and len(reference.vocabulary()) == len(tok)


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
