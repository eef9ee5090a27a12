"""Comparing two runs (advise/compare.py): verdicts on synthetic rounds, the environment check, the
regression gate, and `variantlab compare` end to end on two small real runs.

Synthetic samples come from seeded generators, so every verdict here is deterministic; nothing
asserts on a wall-clock time.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.test_cli import assert_one_line_error, run_cli, write_suite
from variantlab.advise.compare import (MIN_EFFECT, SCHEMA, IncomparableRuns, RunData, blocks, compare_runs,
                                       judge_rounds, machine_drift, parse_threshold, regressions)
from variantlab.errors import VariantlabError
from variantlab.explain.render import Text
from variantlab.measure.analysis import Comparison, Row, RowRounds
from variantlab.measure.rounds import estimate_rounds
from variantlab.measure.stats import Estimate, mean, median, quantile
from variantlab.measure.tracker import MetricDef

TPOT = MetricDef("tpot_p50", "TPOT p50", "s", True, "samples", headline=1, sample_name="requests")
THROUGHPUT = MetricDef("output_throughput", "Output throughput", "tok/s", False, "samples", statistic=mean)
PEAK = MetricDef("peak", "Peak memory", "B", True, "process", statistic=mean)


def rounds(rng, n_rounds=5, per_round=40, level=1e-3, round_cv=0.02, sample_cv=0.05):
    """n_rounds rounds of per_round samples: each round's level drifts by round_cv, samples spread by sample_cv."""
    return [list(level * (1 + round_cv * rng.standard_normal()) * rng.lognormal(0, sample_cv, per_round))
            for _ in range(n_rounds)]


# --------------------------------------------------------------------------- verdicts on synthetic rounds

def test_identical_distributions_are_not_significant():
    rng = np.random.default_rng(1)
    m = judge_rounds(TPOT, rounds(rng), rounds(rng))
    assert m.verdict == "not significant" and m.reason
    assert m.low < 1 < m.high or m.noise >= MIN_EFFECT


def test_a_and_a_runs_are_never_called_different():
    """The A/A rule: same machine, same distribution, 40 pairs of runs with round-to-round drift."""
    calls = []
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        a, b = rounds(rng, round_cv=0.04), rounds(rng, round_cv=0.04)
        calls.append(judge_rounds(TPOT, a, b, resamples=500).verdict)
    assert calls.count("not significant") == len(calls), calls


def test_a_twenty_percent_shift_with_tight_samples_is_slower_and_significant():
    rng = np.random.default_rng(2)
    a = rounds(rng, round_cv=0.005, sample_cv=0.01)
    b = [[x * 1.2 for x in r] for r in rounds(rng, round_cv=0.005, sample_cv=0.01)]
    m = judge_rounds(TPOT, a, b)
    assert m.verdict == "slower" and m.verdict_text().endswith("x slower")
    assert m.ratio == pytest.approx(1.2, rel=0.02)
    assert m.low > 1 + m.noise and m.worse_by == pytest.approx(0.2, abs=0.02)
    faster = judge_rounds(TPOT, b, a)                      # the other way round
    assert faster.verdict == "faster" and faster.worse_by is None


def test_higher_is_better_rows_and_rows_that_are_not_timings_take_their_own_words():
    rng = np.random.default_rng(3)
    a = rounds(rng, level=100.0, round_cv=0.005, sample_cv=0.01, per_round=2)
    b = [[x * 0.8 for x in r] for r in rounds(rng, level=100.0, round_cv=0.005, sample_cv=0.01, per_round=2)]
    slower = judge_rounds(THROUGHPUT, a, b)                 # 20% fewer tokens/s
    assert slower.verdict == "slower" and slower.verdict_text() == f"{1 / slower.ratio:.2f}x slower"
    assert slower.worse_by == pytest.approx(0.2, abs=0.02)
    mem_a = [[1000.0 + r] for r in range(5)]
    worse = judge_rounds(PEAK, mem_a, [[1.3 * x[0]] for x in mem_a])
    assert worse.verdict == "worse" and worse.verdict_text().endswith("% worse")


def test_noise_larger_than_the_shift_is_not_significant():
    rng = np.random.default_rng(4)
    a = rounds(rng, round_cv=0.25)
    b = [[x * 1.1 for x in r] for r in rounds(rng, round_cv=0.25)]
    m = judge_rounds(TPOT, a, b)
    assert m.verdict == "not significant"
    assert m.noise > 0.1                                    # the band was the runs' own round-to-round spread


def test_a_change_inside_the_noise_band_is_not_significant_even_when_the_interval_excludes_1():
    # every round exactly the same level, B 3% up; but one round of A sits 8% off: noise ~4%
    a = [[1.0] * 20, [1.0] * 20, [1.0] * 20, [1.08] * 20, [1.0] * 20, [1.0] * 20, [1.0] * 20, [1.0] * 20]
    b = [[1.03] * 20] * 8
    m = judge_rounds(PEAK, a, b)
    assert m.noise == pytest.approx(estimate_rounds(a, "B", mean).round_cv)
    assert m.verdict == "not significant"


def test_one_round_in_either_run_gives_no_verdict_and_says_why():
    rng = np.random.default_rng(5)
    a, b = rounds(rng, n_rounds=1), [[x * 2 for x in r] for r in rounds(rng)]
    for m in (judge_rounds(TPOT, a, b), judge_rounds(TPOT, b, a)):
        assert m.verdict == "no verdict" and "one round" in m.reason
        assert m.ratio is not None and m.low is None


def test_nan_and_inf_samples_are_skipped_never_a_crash():
    rng = np.random.default_rng(6)
    a = rounds(rng)
    b = [r + [math.nan, math.inf] for r in rounds(rng)]
    b.append([math.nan])                                    # a round of nothing but NaN: no round at all
    m = judge_rounds(TPOT, dict(enumerate(a)), b)
    assert m.verdict == "not significant"
    assert m.notes == ("run B: 11 non-finite samples skipped",)
    nothing = judge_rounds(TPOT, a, [[math.nan]] * 3)
    assert nothing.verdict == "no verdict" and nothing.b is None


def test_too_few_samples_for_a_tail_quantile_gives_no_verdict():
    p99 = MetricDef("e2el_p99", "E2EL p99", "s", True, "samples", statistic=quantile(99), sample_name="requests")
    rng = np.random.default_rng(7)
    m = judge_rounds(p99, rounds(rng, per_round=4), rounds(rng, per_round=4))
    assert m.verdict == "no verdict" and "too few requests for p99" in m.reason


# --------------------------------------------------------------------------- runs: environment, variants, gate

ENV = {"cpu_model": "Test CPU 9000", "cpu_count": 2, "python": "3.11.4", "threads_per_worker": 2,
       "packages": {"torch": "2.13.0+cpu", "transformers": "4.57.1", "variantlab": "0.1.0"}}
MEASURED = {"torch": "2.13.0+cpu", "threads": 2, "interop_threads": 2, "device": "cpu", "seed": 0}
SIZE_KEY, TPOT_KEY = "facts.model_size", "single-stream.tpot_p50"


YARDSTICK = MetricDef("small_ops", "Machine yardstick: small torch ops", "s", True, "samples", sample_name="timings")


def run_data(run_id, tpot: dict, sizes: dict, *, env=None, measured=None, status=None, machine=None) -> RunData:
    """A run whose variants have TPOT samples by round and a model size (a fact); `machine`: the
    yardstick's samples by round, the same for every variant."""
    names = tuple(dict.fromkeys([*tpot, *sizes, *(status or {})]))
    status = {n: "ok" for n in names} | (status or {})
    ok = [n for n in names if status[n] == "ok"]
    tpot_cells = {n: estimate_rounds(tpot[n], "s", median, sample_name="requests") if n in tpot else None for n in ok}
    size_cells = {n: Estimate(sizes[n], None, None, 1, None, "B", method="exact") if n in sizes else None for n in ok}
    rows = (Row(TPOT_KEY, "TPOT p50", "s", True, "samples", tpot_cells, {}, headline=1, is_timing=True),
            Row(SIZE_KEY, "Model size", "B", True, "fact", size_cells, {}, headline=2))
    comparison = Comparison(names[0], names, status, {n: None if s == "ok" else "it broke" for n, s in status.items()},
                            rows)
    samples = {TPOT_KEY: RowRounds(TPOT_KEY, TPOT, {n: dict(enumerate(tpot[n])) for n in ok if n in tpot}, {})}
    if machine is not None:
        samples["machine.small_ops"] = RowRounds("machine.small_ops", YARDSTICK,
                                                 {n: dict(enumerate(machine)) for n in ok}, {})
    return RunData(run_id, "suite", "done", env or ENV, (measured or MEASURED,) * 2, comparison, samples, {})


@pytest.fixture(scope="module")
def tight():
    rng = np.random.default_rng(8)
    return [rounds(rng, round_cv=0.005, sample_cv=0.01) for _ in range(4)]


def test_environments_that_differ_on_a_key_field_are_refused_unless_forced(tight):
    a = run_data("run-a", {"v": tight[0]}, {"v": 100})
    for env, measured, field in (({}, {"threads": 4}, "torch threads 2 vs 4"),
                                 ({"cpu_model": "Other CPU"}, {}, "CPU model Test CPU 9000 vs Other CPU"),
                                 ({"python": "3.12.1"}, {}, "Python (major.minor) 3.11 vs 3.12"),
                                 ({"packages": ENV["packages"] | {"torch": "3.0.0"}}, {}, "torch (major) 2 vs 3"),
                                 ({}, {"device": "cuda:0", "gpu": "NVIDIA H200"}, "GPU none vs NVIDIA H200")):
        b = run_data("run-b", {"v": tight[1]}, {"v": 100}, env=ENV | env, measured=MEASURED | measured)
        with pytest.raises(IncomparableRuns) as e:
            compare_runs(a, b)
        line = e.value.one_line()
        assert field in line and "run-a" in line and "--force" in line and "\n" not in line
        forced = compare_runs(a, b, force=True)
        assert any(field in d for d in forced.environment)
        text = [blk.text for blk in blocks(forced) if isinstance(blk, Text)]
        assert any(t.startswith("warning: the environments differ") and field in t for t in text)


def test_a_minor_version_or_core_count_is_a_note_not_a_refusal(tight):
    a = run_data("run-a", {"v": tight[0]}, {"v": 100})
    b = run_data("run-b", {"v": tight[1]}, {"v": 100},
                 env=ENV | {"cpu_count": 4, "packages": ENV["packages"] | {"torch": "2.14.1", "variantlab": "0.2.0"}})
    rc = compare_runs(a, b)
    assert rc.environment == ()
    note = next(n for n in rc.notes if n.startswith("environment differs"))
    assert "packages.torch: 2.13.0+cpu vs 2.14.1" in note and "cpu_count: 2 vs 4" in note


def test_variants_and_rows_in_one_run_only_and_failed_variants_are_listed(tight):
    a = run_data("run-a", {"v": tight[0], "w": tight[1]}, {"v": 100, "w": 50, "gone": 10},
                 status={"gone": "ok", "broken": "failed"})
    b = run_data("run-b", {"v": tight[2]}, {"v": 100, "w": 50, "new": 5}, status={"w": "failed", "broken": "failed"})
    rc = compare_runs(a, b)
    by = {v.name: v for v in rc.variants}
    assert set(by) == {"v", "w", "gone", "broken", "new"}
    assert by["gone"].status_b is None and by["new"].status_a is None
    assert by["w"].status_b == "failed" and not by["w"].compared
    assert [m.key for m in by["v"].metrics] == [TPOT_KEY, SIZE_KEY]
    assert by["gone"].status_a == "ok"
    text = "\n".join(blk.text for blk in blocks(rc) if isinstance(blk, Text))
    assert "w: ok in run A, failed in run B (it broke) — not compared" in text
    assert "new: not in run A, ok in run B" in text
    # a variant that ran in A and fails in B fails the gate; one missing from B does not
    assert regressions(rc, 0.05) == ["w: ran in A, failed in B (it broke)"]


def test_rows_measured_in_one_run_only_are_listed(tight):
    a = run_data("run-a", {"v": tight[0]}, {"v": 100})
    b = run_data("run-b", {}, {"v": 100})
    v = compare_runs(a, b).variants[0]
    assert [m.key for m in v.metrics] == [SIZE_KEY] and v.only_in_a == ("TPOT p50",) and v.only_in_b == ()


def test_the_gate_fails_on_significant_regressions_beyond_the_threshold(tight):
    slower = [[1.2 * x for x in r] for r in tight[1]]
    a = run_data("run-a", {"v": tight[0], "w": tight[2]}, {"v": 100, "w": 100})
    b = run_data("run-b", {"v": slower, "w": tight[3]}, {"v": 100, "w": 104})
    rc = compare_runs(a, b)
    v, w = rc.variants
    assert v.metrics[0].verdict == "slower" and v.metrics[1].verdict == "same"
    assert w.metrics[0].verdict == "not significant" and w.metrics[1].verdict == "worse"   # exact: 4% bigger
    assert [r.split(":")[0] for r in regressions(rc, 0.05)] == ["v TPOT p50"]
    assert [r.split(":")[0] for r in regressions(rc, 0.03)] == ["v TPOT p50", "w Model size"]
    assert regressions(rc, 0.25) == []
    text = [blk.text for blk in blocks(rc, 0.05) if isinstance(blk, Text)]
    assert text[-2:] == ["1 regression(s) beyond 5% (--fail-on-regression 5%):", f"  {regressions(rc, 0.05)[0]}"]
    assert text[-1].startswith("  v TPOT p50: 1.2") and "x slower (1.2" in text[-1]
    assert blocks(compare_runs(a, a), 0.05)[-1].text == "no regression beyond 5% (--fail-on-regression 5%)"
    out = rc.to_json(0.05)
    assert out["schema"] == SCHEMA and out["gate"]["failed"] and out["gate"]["threshold_pct"] == 5
    json.dumps(out, allow_nan=False)


def test_exact_rows_compare_exactly():
    a = run_data("run-a", {}, {"v": 100, "w": 0, "z": 7})
    b = run_data("run-b", {}, {"v": 100, "w": 8, "z": 5})
    v, w, z = (x.metrics[0] for x in compare_runs(a, b).variants)
    assert (v.verdict, v.ratio, v.low) == ("same", 1.0, None)
    assert w.verdict == "worse" and w.ratio is None and w.worse_by == math.inf      # from zero: no ratio
    assert z.verdict == "better" and z.ratio == pytest.approx(5 / 7)
    json.dumps(compare_runs(a, b).to_json(0.05), allow_nan=False)


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("5", 0.05), ("2.5%", 0.025),
                                         ("0.5%", 0.005), ("0", 0.0), ("150", 1.5)])
def test_threshold_grammar(text, value):
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["0.05", "-5%", "five", "5%%", "", "5 percent", "1e2"])
def test_threshold_grammar_refuses_the_rest(text):
    with pytest.raises(VariantlabError) as e:
        parse_threshold(text)
    assert "--fail-on-regression" in e.value.one_line()


# --------------------------------------------------------------------------- end to end

SUITE = """\
name: {name}
model: builtin:tiny-structured
threads: 1
rounds: 2
variants: [{{name: v, recipe: {recipe}}}]
workload:
  dataset: {{generator: structured, n: 4}}
  scenarios: [{{type: single-stream, requests: 2, warmup: 0}}]
  max_new_tokens: 2
  accuracy: {{samples: 0}}
output: {{dir: runs, store: s.sqlite}}
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Run A measures `v` in bf16, run B the same name in fp32: twice the bytes, a deterministic regression."""
    tmp = tmp_path_factory.mktemp("compare")
    ids = []
    for name, recipe in (("a", "bf16"), ("b", "fp32")):
        suite = write_suite(tmp, SUITE.format(name=name, recipe=recipe), f"{name}.yaml")
        proc = run_cli("bench", suite, "--json", cwd=tmp)
        assert proc.returncode == 0, proc.stderr
        ids.append(json.loads(proc.stdout)["run_id"])
    return tmp, ids


@pytest.mark.e2e
@pytest.mark.slow
def test_compare_cli_end_to_end(two_runs):
    tmp, (a, b) = two_runs
    same = run_cli("compare", a, a, "--store", "s.sqlite", "--fail-on-regression", "5%", "--json", cwd=tmp)
    assert same.returncode == 0, same.stderr
    out = json.loads(same.stdout)
    assert out["schema"] == SCHEMA and out["gate"] == {"threshold_pct": 5.0, "regressions": [], "failed": False}
    metrics = out["variants"][0]["metrics"]
    assert metrics and not any(m["significant"] for m in metrics)
    assert all(m["verdict"] in ("same", "not significant", "no verdict") for m in metrics)

    plain = run_cli("compare", a, b, "--store", "s.sqlite", cwd=tmp)      # no gate: 0, whatever changed
    assert plain.returncode == 0, plain.stderr
    assert "Model size" in plain.stdout and "worse" in plain.stdout

    gated = run_cli("compare", a[:15], b, "--store", "s.sqlite", "--store-b", "s.sqlite", "--fail-on-regression", "5",
                    "--all", cwd=tmp)
    assert gated.returncode == 1, gated.stderr
    lines = gated.stdout.strip().splitlines()
    gate = next(i for i, line in enumerate(lines) if "regression(s) beyond 5% (--fail-on-regression 5%):" in line)
    assert any(line.strip().startswith("v Model size (weights as stored): +") for line in lines[gate + 1:])

    as_json = json.loads(run_cli("compare", a, b, "--store", "s.sqlite", "--json", cwd=tmp).stdout)
    size = next(m for m in as_json["variants"][0]["metrics"] if m["key"] == "facts.model_size")
    assert size["verdict"] == "worse" and size["ratio"] == pytest.approx(2.0, rel=0.01)


@pytest.mark.e2e
def test_compare_bad_input_is_one_line_and_exit_2(tmp_path):
    from variantlab.store import Store
    assert_one_line_error(run_cli("compare", "x", "y", "--store", "missing.sqlite", cwd=tmp_path), "missing.sqlite")
    with Store(tmp_path / "s.sqlite") as store:
        store.create_run("20250101-120000-abcd", {"name": "demo"}, None, {}, {}, None)
    assert_one_line_error(run_cli("compare", "20250101", "zzz", "--store", "s.sqlite", cwd=tmp_path), "zzz",
                          "20250101-120000-abcd")
    assert_one_line_error(run_cli("compare", "20250101", "20250101", "--store", "s.sqlite", "--store-b", "nope.sqlite",
                                  cwd=tmp_path), "nope.sqlite")
    assert_one_line_error(run_cli("compare", "a", "b", "--store", "s.sqlite", "--fail-on-regression", "0.05",
                                  cwd=tmp_path), "--fail-on-regression", "ambiguous")


def test_a_default_n_written_out_and_left_out_is_one_workload_and_another_n_is_not(tmp_path):
    """The previous version stored `n: 64` for an n not given, this one stores null: the same samples."""
    from variantlab.advise.compare import load_run
    from variantlab.measure.plan import plan_suite_file
    from variantlab.store import Store
    plan = plan_suite_file(write_suite(tmp_path, SUITE.format(name="a", recipe="bf16").replace("n: 4", "seed: 0")))
    dump = plan.suite.model_dump(mode="json")
    with_n = lambda n: dump | {"workload": dump["workload"] | {"dataset": dump["workload"]["dataset"] | {"n": n}}}
    with Store(tmp_path / "s.sqlite") as store:
        for run_id, n in (("left-out", None), ("written", 64), ("other", 8)):
            store.create_run(run_id, with_n(n), None, plan.to_json(), ENV, None)
        left_out, written, other = (load_run(store, r) for r in ("left-out", "written", "other"))
    assert not [n for n in compare_runs(left_out, written).notes if "workloads differ" in n]
    assert "the workloads differ (dataset)" in " ".join(compare_runs(left_out, other).notes)


# --------------------------------------------------------------------------- the machine's own change between runs

def test_a_machine_that_ran_slower_in_b_does_not_make_the_variant_slower():
    """The A/A run pair seen here: the same code, the whole machine 1.5x slower in run B. TPOT is 1.5x
    and so is the yardstick: no verdict on TPOT; the size (not a timing) still compares exactly."""
    rng = np.random.default_rng(21)
    tpot_a, tpot_b = rounds(rng, round_cv=0.01), [[1.5 * x for x in r] for r in rounds(rng, round_cv=0.01)]
    yard_a = rounds(rng, per_round=5, round_cv=0.01)
    yard_b = [[1.5 * x for x in r] for r in rounds(rng, per_round=5, round_cv=0.01)]
    a = run_data("run-a", {"v": tpot_a}, {"v": 100}, machine=yard_a)
    b = run_data("run-b", {"v": tpot_b}, {"v": 100}, machine=yard_b)
    rc = compare_runs(a, b)
    tpot = next(m for m in rc.variants[0].metrics if m.key == TPOT_KEY)
    assert tpot.verdict == "not significant" and "the machine's own change" in tpot.reason
    assert rc.machine.band > 0.4 and "1.5" in rc.machine.text
    assert any(isinstance(t, Text) and t.text.startswith("machine: the fixed yardstick") for t in blocks(rc))
    # without the machine's drift, the same TPOT samples are 1.5x slower
    assert judge_rounds(TPOT, tpot_a, tpot_b).verdict == "slower"
    # a regression beyond the machine's change is still called
    worse = run_data("run-c", {"v": [[1.5 * x for x in r] for r in tpot_b]}, {"v": 100}, machine=yard_b)
    assert next(m for m in compare_runs(a, worse).variants[0].metrics if m.key == TPOT_KEY).verdict == "slower"


def test_a_steady_machine_leaves_the_noise_band_as_it_was(tight):
    rng = np.random.default_rng(22)
    yard = [rounds(rng, per_round=5, round_cv=0.005, sample_cv=0.01) for _ in range(2)]
    a = run_data("run-a", {"v": tight[0]}, {"v": 100}, machine=yard[0])
    b = run_data("run-b", {"v": [[1.2 * x for x in r] for r in tight[1]]}, {"v": 100}, machine=yard[1])
    drift = machine_drift(a, b)
    assert drift.band is not None and drift.band < 0.05
    assert next(m for m in compare_runs(a, b).variants[0].metrics if m.key == TPOT_KEY).verdict == "slower"


def test_a_yardstick_unchanged_at_its_point_but_wide_still_bands_the_verdict():
    """The A/A pair measured on 2026-12-02: the yardstick's B/A was 1.017 at its point but [0.934, 1.089],
    and a throughput moved 5.1% between the runs with round-to-round CVs of 1.2-1.5%. A band from the point
    (1.7%) called it "1.05x slower"; the interval's reach bands it. A 1.3x change still gets a verdict."""
    rng = np.random.default_rng(24)
    tpot_a = rounds(rng, round_cv=0.006, sample_cv=0.002)
    tpot_b = [[1.054 * x for x in r] for r in rounds(rng, round_cv=0.006, sample_cv=0.002)]
    yard_a = rounds(rng, per_round=5, round_cv=0.06, sample_cv=0.01)     # a noisy yardstick: a wide interval
    yard_b = rounds(rng, per_round=5, round_cv=0.06, sample_cv=0.01)
    a = run_data("run-a", {"v": tpot_a}, {"v": 100}, machine=yard_a)
    b = run_data("run-b", {"v": tpot_b}, {"v": 100}, machine=yard_b)
    drift = machine_drift(a, b)
    (ratio, low, high), = drift.ratios.values()
    assert low < 0.97 and high > 1.03 and abs(ratio - 1) < drift.band
    assert drift.band == pytest.approx(max(high - 1, 1 / low - 1))
    assert judge_rounds(TPOT, tpot_a, tpot_b).verdict == "slower"          # what the rounds alone say
    tpot = next(m for m in compare_runs(a, b).variants[0].metrics if m.key == TPOT_KEY)
    assert tpot.verdict == "not significant" and "the machine's own change" in tpot.reason
    far = run_data("run-c", {"v": [[1.3 * x for x in r] for r in tpot_b]}, {"v": 100}, machine=yard_b)
    assert next(m for m in compare_runs(a, far).variants[0].metrics if m.key == TPOT_KEY).verdict == "slower"


def test_runs_without_a_yardstick_say_so():
    rng = np.random.default_rng(23)
    a = run_data("run-a", {"v": rounds(rng)}, {"v": 100})
    b = run_data("run-b", {"v": rounds(rng)}, {"v": 100}, machine=rounds(rng, per_round=5))
    drift = machine_drift(a, b)
    assert drift.band is None and "no machine yardstick in run A" in drift.text
