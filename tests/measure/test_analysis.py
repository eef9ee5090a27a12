"""From stored records to the comparison table (measure/analysis.py), on hand-built records.

The records are what workers return (measure/wire.py), with real tracker outputs; token times are
multiples of 1/8 s so that medians are exact in binary. Nothing here runs a model.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import save

from variantlab.measure.analysis import NOT_MEASURED_INTERRUPTED, NOT_REACHED, Comparison, analyse, never_measured
from variantlab.measure.records import RequestRecord
from variantlab.measure.scenarios import SCENARIO_SPECS
from variantlab.measure.scenarios.common import PassOutput, ScenarioOutput
from variantlab.measure.scenarios.offline import Offline
from variantlab.measure.scenarios.single_stream import SingleStream
from variantlab.measure.tracker import blob_id
from variantlab.measure.trackers import ColdStart, Facts, Grading, Memory, Scoring
from variantlab.measure.trackers.cold_start import ColdStartOutput
from variantlab.measure.trackers.facts import FactsOutput
from variantlab.measure.trackers.grading import GradingOutput
from variantlab.measure.trackers.memory import MemoryOutput
from variantlab.measure.trackers.scoring import ScoringOutput
from variantlab.measure.wire import BuildRecord, MeasurementRecord, TrackerResult

SS = SingleStream(SCENARIO_SPECS["single-stream"](type="single-stream"))
OFF = Offline(SCENARIO_SPECS["offline"](type="offline"))
TRACKERS = (ColdStart(), SS, OFF, Memory(), Facts(), Grading(4), Scoring(2))
NAMES = ("base", "fast", "slow")


def req(i: int, ttft: float, tpot: float = 0.25, n: int = 5) -> RequestRecord:
    send = 100.0 * i
    times = tuple(send + ttft + k * tpot for k in range(n))
    return RequestRecord(str(i), send, times[-1], times, 10, "x", None, tuple(range(n)), "stop")


def scenario(ttfts, tpot=0.25, walls=(4.0,)) -> ScenarioOutput:
    passes = []
    for k, wall in enumerate(walls):
        recs = tuple(req(i, t, tpot) for i, t in enumerate(ttfts))
        passes.append(PassOutput(start=1e4 * k, end=1e4 * k + wall, records=recs))
    return ScenarioOutput(passes=tuple(passes), shapes="1 × 10 prompt tokens")


def logprobs_blob(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(6, 8))
    lp = (x - np.log(np.exp(x).sum(1, keepdims=True))).astype(np.float32)
    return save({"logprobs": lp, "targets": np.arange(6, dtype=np.int64) % 8})


def record(name: str, rnd: int, *, scale: float = 1.0, once: bool = False, cold: float = 3.0,
           correct=(True, True, True, False), fingerprint="fp-a", scoring_seed=0, nonfinite=None,
           stored=1000, peak=2_000_000, ttfts=(0.5, 0.75, 1.0, 1.25, 1.5), nll=6.0) -> tuple[MeasurementRecord, dict]:
    outs = [
        (ColdStart(), ColdStartOutput(import_s=1.0, tokenizer_s=0.01, load_s=cold - 1.5, first_token_s=0.49,
                                      total_s=cold, clock="process start")),
        (SS, scenario([t * scale for t in ttfts], 0.25 * scale)),
        (OFF, scenario([0.5] * 4, 0.25, walls=(4.0 * scale, 4.5 * scale, 5.0 * scale))),
        (Memory(), MemoryOutput(peak_bytes=peak + 500, baseline_bytes=500, total_bytes=8_000_000,
                                instrument="rss", covered=("1 × 10",))),
    ]
    blobs = {}
    if once:
        blob = logprobs_blob(scoring_seed)
        blobs[blob_id(blob)] = blob
        outs += [
            (Facts(), FactsOutput(recipe="fp32", dtype="fp32", parameters=250, stored_bytes=stored,
                                  resident_bytes=stored, bits_per_weight=8 * stored / 250,
                                  kv_cache_bytes_per_token=64, kv_cache_bytes_2048=64 * 2048, kernels=("mm",),
                                  notes=(), attention="model's own")),
            (Grading(4), GradingOutput(ids=("0", "1", "2", "3"), outputs=("a",) * 4, correct=tuple(correct))),
            (Scoring(2), ScoringOutput(texts=2, positions=6, nll_nats=None if nonfinite else nll, n_bytes=12,
                                       tokenizer_fingerprint=fingerprint, tokenizer_class="Tok",
                                       logprobs_blob=blob_id(blob), nonfinite=nonfinite)),
        ]
    results = tuple(TrackerResult(kind=t.kind, name=t.name, data=o.model_dump(mode="json")) for t, o in outs)
    return (MeasurementRecord(variant=name, round=rnd, status="ok", device="cpu", ran_once=once, outputs=results,
                              blobs={k: len(v) for k, v in blobs.items()}), blobs)


def builds(*names):
    return [BuildRecord(variant=n, status="ok", artifact_dir=f"/a/{n}", facts={"recipe": "fp32", "kernels": ["mm"]},
                        timings={"build_s": 1.0}) for n in names]


def run(recs_and_blobs, names=NAMES, baseline="base", build_records=None, **kw) -> Comparison:
    blobs = {}
    records = []
    for rec, b in recs_and_blobs:
        records.append(rec)
        blobs.update(b)
    return analyse(TRACKERS, names, baseline, build_records if build_records is not None else builds(*names),
                   records, blobs.__getitem__, **kw)


ROUND_DRIFT = (1.0, 3.0, 0.5)   # what the machine did in each round, to every variant alike


@pytest.fixture(scope="module")
def three_rounds() -> Comparison:
    """base; fast 0.8x base and slow 2x base in every round, under a large shared drift."""
    out = []
    for r, drift in enumerate(ROUND_DRIFT):
        for name, factor in (("base", 1.0), ("fast", 0.8), ("slow", 2.0)):
            out.append(record(name, r, scale=drift * factor * (1 + 0.01 * r), once=r == 0,
                              cold=3.0 * drift, scoring_seed={"base": 0, "fast": 0, "slow": 1}[name]))
    return run(out)


def test_every_tracker_metric_has_a_row_keyed_by_tracker(three_rounds):
    keys = {r.key for r in three_rounds.rows}
    for t in TRACKERS:
        for d in t.metrics():
            assert f"{t.name}.{d.key}" in keys
    assert three_rounds.row("tpot_p50").key == "single-stream.tpot_p50"
    with pytest.raises(KeyError):
        three_rounds.row("output_throughput")   # single-stream's and offline's: ambiguous


def test_values_pool_every_round(three_rounds):
    ttft = three_rounds.row("single-stream.ttft_p50").cells["base"]
    pooled = [t * d * (1 + 0.01 * r) for r, d in enumerate(ROUND_DRIFT) for t in (0.5, 0.75, 1.0, 1.25, 1.5)]
    assert ttft.value == pytest.approx(float(np.median(pooled)))
    assert ttft.rounds == 3 and ttft.n == 15


def test_paired_rounds_cancel_the_drift_a_round_shares(three_rounds):
    """Every value swings 6x between rounds, yet the per-round ratios are exact: -20% and +100%."""
    row = three_rounds.row("single-stream.tpot_p50")
    fast, slow = row.deltas["fast"], row.deltas["slow"]
    assert fast.pct == pytest.approx(-20.0, abs=1e-6) and fast.significant is True
    assert slow.pct == pytest.approx(100.0, abs=1e-6) and slow.significant is True
    assert fast.method == "paired over 3 rounds"
    assert row.deltas["base"] is None


def test_the_baselines_round_to_round_noise_is_reported(three_rounds):
    row = three_rounds.row("single-stream.tpot_p50")
    per_round = [0.25 * d * (1 + 0.01 * r) for r, d in enumerate(ROUND_DRIFT)]
    assert row.noise == pytest.approx(np.std(per_round, ddof=1) / np.mean(per_round), rel=1e-6)
    # -20% is less than the noise, yet the paired rounds separate it: the warning says both
    assert any("fast (-20.0%) differs from base by less than this machine's noise" in w
               and "pairing within rounds still tells them apart" in w for w in row.warnings)


def test_a_delta_within_the_noise_that_pairing_cannot_separate_is_said_so():
    """Round drifts of 1x, 3x, 0.5x; a variant 5% slower in one round and 5% faster in the others."""
    out = []
    for r, drift in enumerate(ROUND_DRIFT):
        out += [record("base", r, scale=drift, once=r == 0), record("fast", r, scale=drift * (1.05 if r else 0.95),
                                                                    once=r == 0)]
    row = run(out, names=("base", "fast")).row("single-stream.tpot_p50")
    assert row.deltas["fast"].significant is False
    assert any("cannot tell them apart" in w for w in row.warnings)


def test_process_figures_are_judged_over_rounds(three_rounds):
    cold = three_rounds.row("cold_start.total")
    assert cold.cells["base"].rounds == 3
    assert cold.deltas["fast"].pct == pytest.approx(0.0) and cold.deltas["fast"].significant is False


def test_one_round_process_figures_are_single_samples_with_no_verdict():
    c = run([record("base", 0, once=True, cold=3.0), record("fast", 0, once=True, cold=2.0, peak=1_000_000)],
            names=("base", "fast"))
    latency = c.row("offline.single_task_latency").deltas["fast"]   # 3 passes: an interval, no verdict
    assert latency.low is not None and latency.significant is None
    assert any(w.startswith("one round: timing deltas carry the machine's drift") for w in c.warnings)
    for key in ("cold_start.total", "memory.peak"):
        row = c.row(key)
        assert row.cells["fast"].low is None and row.cells["fast"].n == 1
        assert row.deltas["fast"].significant is None


def test_facts_get_a_plain_percent_change_and_no_verdict(three_rounds):
    row = three_rounds.row("facts.model_size")
    assert row.kind == "fact"
    assert row.deltas["slow"].pct == 0.0 and row.deltas["slow"].significant is None


def test_versus_rows_compare_with_the_baseline(three_rounds):
    kld = three_rounds.row("scoring.kld_mean")
    assert kld.cells["base"].value == pytest.approx(0.0, abs=1e-9)
    assert kld.cells["fast"].value == pytest.approx(0.0, abs=1e-9)    # same log-probs as base
    assert kld.cells["slow"].value > 0.01                               # other log-probs
    assert three_rounds.row("grading.accuracy_retention").cells["fast"].value == 1.0
    assert all(d is None for d in kld.deltas.values())


def test_a_tokenizer_that_splits_text_differently_is_not_comparable():
    c = run([record("base", 0, once=True), record("fast", 0, once=True, fingerprint="fp-b")], names=("base", "fast"))
    cell = c.row("scoring.kld_mean").cells["fast"]
    assert cell.value is None and "not comparable" in cell.problem
    assert c.row("scoring.bits_per_byte").cells["fast"].value is not None   # still comparable across tokenizers


def test_perplexities_of_texts_split_differently_get_no_delta_and_the_ppl_ratios_reason():
    c = run([record("base", 0, once=True), record("fast", 0, once=True, fingerprint="fp-b", nll=8.0),
             record("same", 0, once=True, nll=8.0)], names=("base", "fast", "same"))
    ppl = c.row("scoring.ppl")
    assert ppl.cells["fast"].value == pytest.approx(math.exp(8 / 6))    # its own figure stands
    why = c.row("scoring.ppl_ratio").cells["fast"].problem
    assert why.startswith("not comparable: Tok split the evaluation text differently")
    d = ppl.deltas["fast"]
    assert d.pct is None and d.significant is None and d.problem == why   # one rule, one wording, both rows
    assert ppl.deltas["same"].pct == pytest.approx(100 * (math.exp(8 / 6) / math.e - 1))   # same split: compared
    assert c.row("scoring.bits_per_byte").deltas["fast"].pct is not None   # bits per byte still compare
    assert Comparison.from_json(json.loads(json.dumps(c.to_json()))).row("scoring.ppl").deltas["fast"] == d


def test_nan_logits_are_named_in_the_row_and_the_run_completes():
    c = run([record("base", 0, once=True), record("fast", 0, once=True, nonfinite="NaN logits from position 37")],
            names=("base", "fast"))
    assert c.row("scoring.kld_mean").cells["fast"].problem == "NaN logits from position 37"
    assert c.row("scoring.ppl").cells["fast"].problem == "NaN logits from position 37"
    json.dumps(c.to_json())   # a readable run: nothing in it that JSON refuses


def test_non_finite_samples_become_a_problem_not_a_crash():
    rec, blobs = record("fast", 0, once=True)
    bad = ColdStartOutput(import_s=1.0, tokenizer_s=0.0, load_s=float("nan"), first_token_s=0.5, total_s=3.0,
                          clock="x")
    outputs = tuple(TrackerResult(kind=o.kind, name=o.name, data=bad.model_dump(mode="json"))
                    if o.name == "cold_start" else o for o in rec.outputs)
    c = run([record("base", 0, once=True), (rec.model_copy(update={"outputs": outputs}), blobs)],
            names=("base", "fast"))
    assert "non-finite" in c.row("cold_start.load").cells["fast"].problem


def test_too_few_requests_for_a_tail_percentile_is_said_not_printed(three_rounds):
    p99 = three_rounds.row("single-stream.e2el_p99")
    assert p99.cells["base"].low is None and "too few requests for p99" in p99.cells["base"].problem
    assert p99.deltas["slow"].significant is None


def test_failed_variant_keeps_its_status_and_reason_and_the_others_go_on():
    build = builds("base", "fast") + [BuildRecord(variant="slow", status="failed", reason="RuntimeError: boom")]
    c = run([record("base", 0, once=True), record("fast", 0, once=True)], build_records=build)
    assert c.status == {"base": "ok", "fast": "ok", "slow": "failed"}
    assert c.reasons["slow"] == "build: RuntimeError: boom"
    assert all(r.cells["slow"] is None for r in c.rows)


def test_a_failed_round_is_a_failure_with_its_reason_even_in_an_interrupted_run():
    failed = (MeasurementRecord(variant="fast", round=0, status="failed", reason="worker exited with status -9"), {})
    c = run([record("base", 0, once=True), failed], names=("base", "fast"), interrupted=True)
    assert c.status["fast"] == "failed" and c.reasons["fast"] == "worker exited with status -9"
    assert not never_measured(c.status["fast"]) and c.rounds["fast"] == {"ok": 0, "failed": 1}


@pytest.mark.parametrize("interrupted, status, how", [(True, NOT_MEASURED_INTERRUPTED, "was interrupted"),
                                                      (False, NOT_REACHED, "ended")])
def test_a_variant_the_run_never_measured_is_not_called_failed(interrupted, status, how):
    """Issue 49: no record says it failed; the run stopped before its rounds (slow: built) or its build (late)."""
    c = run([record("base", 0, once=True), record("fast", 0, once=True)], names=("base", "fast", "slow", "late"),
            build_records=builds("base", "fast", "slow"), interrupted=interrupted)
    assert c.status == {"base": "ok", "fast": "ok", "slow": status, "late": status}
    assert c.reasons["slow"] == f"built, but the run {how} before any of its rounds"
    assert c.reasons["late"] == f"the run {how} before its build"
    assert never_measured(c.status["slow"]) and not never_measured("failed") and not never_measured("ok")
    assert all(r.cells["slow"] is None and r.deltas["late"] is None for r in c.rows)
    assert c.rounds["slow"] == {"ok": 0, "failed": 0}
    assert not any("slow" in w or "late" in w for w in c.warnings)
    assert Comparison.from_json(json.loads(json.dumps(c.to_json()))).status == c.status


def test_a_variant_with_rounds_missing_but_one_measured_stays_ok():
    c = run([record("base", 0, once=True), record("base", 1), record("fast", 0, once=True)], names=("base", "fast"),
            interrupted=True)
    assert c.status["fast"] == "ok" and c.reasons["fast"] is None and c.rounds["fast"] == {"ok": 1, "failed": 0}


def test_where_each_artifact_came_from_is_said_in_the_comparison_and_its_status_lines():
    """Issue 13: reused (verified) or rebuilt, and why, on screen and in the reports (report.format.status_lines)."""
    from variantlab.report.format import status_lines
    reused, rebuilt, own = builds("base", "fast", "slow")
    reused = reused.model_copy(update={"artifact_dir": "/arts/base", "reused": True})
    why = "/arts/fast: variant.json was edited after the build: its content_sha256 does not match what it says"
    rebuilt = rebuilt.model_copy(update={"artifact_dir": "/run/variants/fast/artifact", "not_reused": (why,)})
    c = run([record(n, 0, once=True) for n in NAMES], build_records=[reused, rebuilt, own])
    assert c.builds["base"]["artifact"] == "artifact reused from /arts/base (hashes verified)"
    assert c.builds["fast"]["artifact"] == f"artifact rebuilt into /run/variants/fast/artifact, not reused: {why}"
    assert c.builds["slow"]["artifact"] is None        # no artifacts folder offered: built, nothing to say
    for full in (False, True):
        lines = status_lines(c, [], full=full)
        assert "base: artifact reused from /arts/base (hashes verified)" in lines
        assert f"fast: artifact rebuilt into /run/variants/fast/artifact, not reused: {why}" in lines
        assert not any(line.startswith("slow: artifact") or "artifact not reused" in line for line in lines)
    assert Comparison.from_json(json.loads(json.dumps(c.to_json()))).builds == c.builds


def test_a_round_that_failed_is_left_out_and_warned_about():
    failed = (MeasurementRecord(variant="fast", round=1, status="failed", reason="worker exited with status -9"), {})
    c = run([record("base", 0, once=True), record("fast", 0, once=True), record("base", 1), failed],
            names=("base", "fast"))
    assert c.status["fast"] == "ok" and c.rounds["fast"] == {"ok": 1, "failed": 1}
    assert any("fast failed in 1 round" in w and "status -9" in w for w in c.warnings)


def test_a_failed_baseline_gives_cells_but_no_deltas():
    build = [BuildRecord(variant="base", status="failed", reason="x")] + builds("fast")
    c = run([record("fast", 0, once=True)], names=("base", "fast"), build_records=build)
    row = c.row("single-stream.tpot_p50")
    assert row.cells["fast"].value is not None and row.deltas["fast"] is None


def test_comparison_round_trips_through_json(three_rounds):
    again = Comparison.from_json(json.loads(json.dumps(three_rounds.to_json())))
    assert again == three_rounds


def test_a_failed_once_tracker_is_named_in_its_rows_and_the_timing_stays():
    rec, blobs = record("fast", 0, once=True)
    outputs = tuple(o.model_copy(update={"data": {}, "error": "RuntimeError: boom"}) if o.name == "scoring" else o
                    for o in rec.outputs)
    c = run([record("base", 0, once=True), (rec.model_copy(update={"outputs": outputs, "blobs": {}}), {})],
            names=("base", "fast"))
    assert c.row("scoring.kld_mean").cells["fast"].problem == "scoring failed: RuntimeError: boom"
    assert c.row("scoring.ppl").cells["fast"].problem == "scoring failed: RuntimeError: boom"
    assert c.row("single-stream.tpot_p50").cells["fast"].value is not None
    assert any(w.startswith("fast: scoring failed") for w in c.warnings)


def test_a_perplexity_that_overflows_is_a_problem_not_a_crash():
    rec, blobs = record("fast", 0, once=True)
    huge = tuple(o.model_copy(update={"data": {**o.data, "nll_nats": 6.0e5}}) if o.name == "scoring" else o
                 for o in rec.outputs)
    c = run([record("base", 0, once=True), (rec.model_copy(update={"outputs": huge}), blobs)], names=("base", "fast"))
    assert "OverflowError" in c.row("scoring.ppl").cells["fast"].problem
    assert "not finite" in c.row("scoring.ppl_ratio").cells["fast"].problem
    json.dumps(c.to_json(), allow_nan=False)


def test_a_scenario_that_failed_in_a_round_is_warned_and_the_rounds_other_rows_stay():
    """The worker records a scenario that raised as that tracker's error (issue 13: the variant's other
    finished scenarios must not be lost with it): its row says why, the others keep their value."""
    recs = [record("base", 0, once=True), record("fast", 0, once=True)]
    rec, blobs = recs[1]
    outputs = tuple(TrackerResult(kind=o.kind, name=o.name, data={}, error="IndexError: index out of range")
                    if o.name == "offline" else o for o in rec.outputs)
    recs[1] = (rec.model_copy(update={"outputs": outputs}), blobs)
    c = run(recs, names=("base", "fast"))
    assert c.status == {"base": "ok", "fast": "ok"}
    assert "fast: offline failed: IndexError: index out of range (round 1)" in c.warnings
    assert c.row("single-stream.ttft_p50").cells["fast"].value is not None
    cell = c.row("offline.output_throughput").cells["fast"]
    assert cell.value is None and "offline failed: IndexError" in cell.problem


def test_a_row_whose_rounds_cannot_tell_15_percent_from_the_processes_spread_says_so():
    """Issue 50: processes that stray by ~20% from round to round, in no pattern a round shares. `fast` happened
    to stray with the baseline, 10% above it every round: alone, its three rounds would call that significant;
    with the row's spread (slow strays on its own) it is not. The row says how small a change three rounds can
    tell here and how many rounds would tell 15%."""
    stray = {"base": (1.0, 1.25, 0.85), "fast": (1.1, 1.375, 0.935), "slow": (0.95, 1.1, 1.3)}
    out = [record(name, r, scale=f[r], once=r == 0) for r in range(3) for name, f in stray.items()]
    row = run(out).row("single-stream.tpot_p50")
    assert row.deltas["fast"].pct == pytest.approx(10.0)
    assert row.deltas["fast"].significant is False and row.deltas["slow"].significant is False
    assert row.deltas["fast"].method == "paired over 3 rounds and the run's process spread"
    two = run([o for o in out if o[0].variant != "slow"], names=("base", "fast")).row("single-stream.tpot_p50")
    assert two.deltas["fast"].significant is True      # without a third variant nothing else strays
    said = [w for w in row.warnings if "3 rounds cannot tell a change under" in w]
    assert len(said) == 1 and "rounds would tell 15%" in said[0] and "over 3 variants and 3 rounds" in said[0]
    assert said[0].startswith("TPOT p50")


def test_a_quiet_row_says_nothing_of_its_spread(three_rounds):
    assert not any("cannot tell a change under" in w for w in three_rounds.row("single-stream.tpot_p50").warnings)
