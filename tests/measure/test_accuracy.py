"""Unit tests for bench/accuracy.py: hand-computed KL, top-1, NLL, bits per byte, exact match."""
import math

import numpy as np
import pytest

from variantlab.measure import accuracy
from variantlab.measure.accuracy import (accuracy_retention, bits_per_byte, exact_match,
                                       kl_divergence_per_position, kld_summary, nll,
                                       normalize_answer, perplexity, ppl_ratio, task_accuracy,
                                       top1_agreement)

LOG = np.log
HALF_HALF = LOG(np.array([[0.5, 0.5]], dtype=np.float32))
QUARTER = LOG(np.array([[0.25, 0.75]], dtype=np.float32))
KL_HALF_QUARTER = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # = 0.5 ln(4/3)


def random_logprobs(positions=16, vocab=50, seed=0):
    logits = np.random.default_rng(seed).normal(size=(positions, vocab)).astype(np.float32)
    return logits - np.log(np.exp(logits.astype(np.float64)).sum(axis=1, keepdims=True)).astype(
        np.float32)


# --------------------------------------------------------------------------- KL

def test_kl_of_identical_distributions_is_zero():
    lp = random_logprobs()
    kl = kl_divergence_per_position(lp, lp.copy())
    assert kl.shape == (16,)
    assert np.all(kl >= 0.0) and np.all(kl < 1e-12)


def test_kl_of_a_known_pair():
    kl = kl_divergence_per_position(HALF_HALF, QUARTER)
    assert kl[0] == pytest.approx(KL_HALF_QUARTER, rel=1e-6)
    # Not symmetric: KL(q || p) = 0.25 ln(0.25/0.5) + 0.75 ln(0.75/0.5)
    reverse = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert kl_divergence_per_position(QUARTER, HALF_HALF)[0] == pytest.approx(reverse, rel=1e-6)


def test_kl_treats_minus_infinity_properly():
    inf = np.inf
    base = np.array([[-inf, 0.0], [LOG(0.5), LOG(0.5)], [-inf, 0.0]], dtype=np.float32)
    var = np.array([[LOG(0.5), LOG(0.5)], [-inf, 0.0], [-inf, 0.0]], dtype=np.float32)
    kl = kl_divergence_per_position(base, var)
    assert kl[0] == pytest.approx(math.log(2.0))  # the token the baseline rules out adds 0
    assert kl[1] == inf                            # the variant rules out a baseline token
    assert kl[2] == 0.0                            # both rule it out


def test_kl_accepts_logits_and_chunks_give_the_same_answer(monkeypatch):
    base, var = random_logprobs(seed=1), random_logprobs(seed=2)
    expected = kl_divergence_per_position(base, var)
    np.testing.assert_allclose(kl_divergence_per_position(base + 3.0, var - 7.0), expected,
                               rtol=1e-5, atol=1e-7)
    monkeypatch.setattr(accuracy, "_CHUNK_ELEMENTS", 3 * base.shape[1])  # 3 rows per chunk
    np.testing.assert_array_equal(kl_divergence_per_position(base, var), expected)


def test_kl_rejects_mismatched_or_invalid_input():
    with pytest.raises(ValueError, match="shape"):
        kl_divergence_per_position(random_logprobs(vocab=5), random_logprobs(vocab=6))
    with pytest.raises(ValueError, match="NaN"):
        kl_divergence_per_position(np.array([[np.nan, 0.0]]), HALF_HALF)
    with pytest.raises(ValueError, match="every entry -inf"):
        kl_divergence_per_position(np.full((1, 2), -np.inf), HALF_HALF)


def test_kld_summary():
    base = np.concatenate([HALF_HALF, HALF_HALF])
    var = np.concatenate([HALF_HALF, QUARTER])  # KL 0 and K
    s = kld_summary(base, var)
    assert s["mean"] == pytest.approx(KL_HALF_QUARTER / 2, rel=1e-6)
    assert s["p99"] == pytest.approx(0.99 * KL_HALF_QUARTER, rel=1e-6)  # between 0 and K
    ruled_out = np.array([[-np.inf, 0.0]], dtype=np.float32)
    s_inf = kld_summary(np.concatenate([HALF_HALF] * 3), np.concatenate([HALF_HALF] * 2 + [ruled_out]))
    assert s_inf == {"mean": math.inf, "p99": math.inf}
    with pytest.raises(ValueError, match="position"):
        kld_summary(np.zeros((0, 4)), np.zeros((0, 4)))


# --------------------------------------------------------------------------- top-1

def test_top1_agreement_of_permuted_logits():
    # Row i puts its maximum on token i; swapping tokens 0 and 1 moves the argmax of rows 0, 1.
    logits = np.eye(4, dtype=np.float32) * 5.0
    assert top1_agreement(logits, logits) == 1.0
    assert top1_agreement(logits, logits[:, [1, 0, 2, 3]]) == 0.5
    assert top1_agreement(logits, logits[:, [3, 2, 1, 0]]) == 0.0
    assert top1_agreement(logits, logits - 100.0) == 1.0  # shift per row changes nothing


# --------------------------------------------------------------------------- likelihood

def test_nll_and_perplexity_of_a_uniform_distribution():
    uniform4 = np.full((3, 4), LOG(0.25), dtype=np.float32)
    total, count = nll(uniform4, np.array([0, 3, 1]))
    assert total == pytest.approx(3 * math.log(4.0), rel=1e-6) and count == 3
    assert perplexity(uniform4, [0, 3, 1]) == pytest.approx(4.0, rel=1e-6)


def test_nll_of_known_targets_and_ignore_index():
    lp = np.concatenate([QUARTER, QUARTER, HALF_HALF])
    total, count = nll(lp, np.array([1, -100, 0]))  # ln(4/3) + ln 2; the -100 is skipped
    assert total == pytest.approx(math.log(4 / 3) + math.log(2.0), rel=1e-6) and count == 2
    assert nll(lp, np.array([-100, -100, -100])) == (0.0, 0)
    with pytest.raises(ValueError, match="scored position"):
        perplexity(lp, np.array([-100, -100, -100]))
    with pytest.raises(ValueError, match="vocabulary"):
        nll(lp, np.array([0, 2, 0]))
    with pytest.raises(ValueError, match="shape"):
        nll(lp, np.array([0, 1]))


def test_bits_per_byte_of_uniform_bytes_is_eight():
    n = 64
    uniform256 = np.full((n, 256), -math.log(256.0), dtype=np.float32)
    targets = np.random.default_rng(0).integers(0, 256, size=n)
    total, count = nll(uniform256, targets)
    assert bits_per_byte(total, count) == pytest.approx(8.0, rel=1e-6)
    with pytest.raises(ValueError, match="n_bytes"):
        bits_per_byte(1.0, 0)


def test_ppl_ratio():
    assert ppl_ratio(12.0, 10.0) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="positive"):
        ppl_ratio(12.0, 0.0)


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    base, var = random_logprobs(seed=3), random_logprobs(seed=4)
    targets = np.arange(16) % 50
    np.testing.assert_allclose(
        kl_divergence_per_position(torch.from_numpy(base), torch.from_numpy(var)),
        kl_divergence_per_position(base, var))
    assert nll(torch.from_numpy(base), torch.from_numpy(targets)) == pytest.approx(nll(base, targets))
    bf16 = torch.from_numpy(base).to(torch.bfloat16)
    assert top1_agreement(bf16, bf16) == 1.0
    assert kl_divergence_per_position(bf16, bf16).max() < 1e-12


# --------------------------------------------------------------------------- ground truth

def test_normalize_answer_collapses_whitespace_and_keeps_case():
    assert normalize_answer("  AB-12 \n x\t  y ") == "AB-12 x y"
    assert exact_match(" AB-12", "AB-12\n")
    assert not exact_match("ab-12", "AB-12")  # ids are case-sensitive


def test_task_accuracy_and_retention():
    assert task_accuracy(["a", " b ", "C"], ["a", "b", "c"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="predictions"):
        task_accuracy(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="at least one"):
        task_accuracy([], [])
    assert accuracy_retention(0.45, 0.9) == pytest.approx(0.5)
    assert accuracy_retention(0.3, 0.0) is None


def test_retention_interval_is_paired_over_the_graded_samples():
    from variantlab.measure.accuracy import retention_interval
    base = [True] * 90 + [False] * 10
    one_lost = [True] * 89 + [False] * 11        # the variant loses exactly one answer the baseline had
    low, high = retention_interval(base, one_lost)
    assert low < 89 / 90 <= high <= 1.0          # pairing: it never gains one, so the interval stops at 1
    swapped = [False] + [True] * 89 + [True] + [False] * 9   # loses one, gains another: same accuracy
    low2, high2 = retention_interval(base, swapped)
    assert low2 < 1.0 < high2
    assert retention_interval([False, False], [True, False]) is None      # the baseline got none right
    assert retention_interval(base, base) == (1.0, 1.0)


# ---------------------------------------------------------------- truncated KLD (an endpoint's top-k)

def test_truncated_kl_of_a_hand_made_pair_is_exact():
    # baseline over ids a, b, c, d (c and d read alike: one text "c"); the variant names a and b only
    p = np.array([0.5, 0.25, 0.125, 0.125])
    texts = ["a", "b", "c", "c"]
    top = [{"a": math.log(0.4), "b": math.log(0.4)}]             # the variant's other: 0.2
    expected = 0.5 * math.log(0.5 / 0.4) + 0.25 * math.log(0.25 / 0.4) + 0.25 * math.log(0.25 / 0.2)
    kl = accuracy.truncated_kl_per_position(np.log(p)[None], texts, top)
    assert kl[0] == pytest.approx(expected, abs=1e-12)
    # naming every text is the full KL over texts (c's ids summed), and lumping never exceeds it
    full = [{"a": math.log(0.4), "b": math.log(0.4), "c": math.log(0.2)}]
    assert accuracy.truncated_kl_per_position(np.log(p)[None], texts, full)[0] == pytest.approx(expected, abs=1e-12)
    q = np.array([0.4, 0.4, 0.1, 0.1])
    assert kl[0] <= accuracy.kl_divergence_per_position(np.log(p)[None], np.log(q)[None])[0]


def test_truncated_kl_edges():
    with np.errstate(divide="ignore"):          # a token the baseline gives probability 0: log 0 = -inf
        p = np.log(np.array([[0.5, 0.5, 0.0]]))
    texts = ["a", "b", "z"]
    assert accuracy.truncated_kl_per_position(p, texts, [{"a": math.log(0.5), "b": math.log(0.5)}])[0] == 0.0
    # a text the baseline has no id for adds nothing; a top-k whose rounding sums past 1 leaves the floor
    over = accuracy.truncated_kl_per_position(np.log(np.array([[0.6, 0.4]])), ["a", "b"],
                                              [{"a": math.log(0.6) + 1e-7, "b": math.log(0.4), "q": -20.0}])
    assert 0.0 <= over[0] < 1e-6
    lumped = accuracy.truncated_kl_per_position(np.log(np.array([[0.5, 0.3, 0.2]])), ["a", "b", "c"],
                                                [{"a": math.log(0.5), "b": math.log(0.5)}])
    assert lumped[0] == pytest.approx(0.3 * math.log(0.3 / 0.5) + 0.2 * math.log(0.2 / accuracy.OTHER_FLOOR))
    with pytest.raises(ValueError, match="positions"):
        accuracy.truncated_kl_per_position(p, texts, [])


def test_top1_agreement_by_text():
    base = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]]))
    texts = ["a", "b", "c"]
    assert accuracy.top1_agreement_by_text(base, texts, [{"a": -0.1, "b": -3.0}, {"a": -0.1, "c": -2.0}]) == 0.5
