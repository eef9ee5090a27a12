"""Accuracy of a variant: against the baseline's next-token distributions, and against ground truth.

docs/metrics.md: KLD (mean and p99 of KL(baseline || variant) per position),
top-1 agreement, PPL ratio, task accuracy (exact match) and accuracy retention. Bits per byte
compares variants whose tokenizers differ, where perplexities per token are not comparable. Against an
endpoint that returns only the top-k log-probabilities of each position, KLD is truncated: over the
tokens it names, the rest lumped into one bucket (`truncated_kl_per_position`).

Inputs are teacher-forced next-token log-probabilities of shape (positions, vocab), numpy arrays
or torch tensors (float32 usually; bf16 is widened), and target token ids of shape (positions,).
Each row is renormalised with a log-softmax in float64 before use, so raw logits are accepted too
and float32 rounding cannot make a KL negative by more than rounding. Large inputs are processed
in chunks of rows so that the float64 copies stay small. Outputs are Python floats.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import numpy as np

from variantlab.measure import stats

_CHUNK_ELEMENTS = 1 << 22  # float64 values per working chunk (32 MiB)


# --------------------------------------------------------------------------- array plumbing

def _to_numpy(x: Any) -> np.ndarray:
    """A numpy view of a numpy array or a (CPU or device) torch tensor, without importing torch."""
    if hasattr(x, "detach"):
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            t = t.float()
        return t.numpy()
    return np.asarray(x)


def _logprob_matrix(x: Any, what: str) -> np.ndarray:
    a = _to_numpy(x)
    if a.ndim != 2:
        raise ValueError(f"{what} must have shape (positions, vocab), got {a.shape}")
    return a


def _log_softmax64(chunk: np.ndarray, what: str) -> np.ndarray:
    """Rows renormalised to log-probabilities, in float64; -inf entries stay -inf."""
    a = chunk.astype(np.float64)
    if np.isnan(a).any() or np.isposinf(a).any():
        raise ValueError(f"{what} contains NaN or +inf")
    top = a.max(axis=1, keepdims=True)
    if np.isneginf(top).any():
        raise ValueError(f"{what} has a row with every entry -inf (no token is possible)")
    shifted = a - top
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _row_chunks(n_rows: int, n_cols: int) -> Iterator[slice]:
    rows = max(1, _CHUNK_ELEMENTS // max(1, n_cols))
    for start in range(0, n_rows, rows):
        yield slice(start, min(n_rows, start + rows))


def _paired(base_logprobs: Any, var_logprobs: Any) -> tuple[np.ndarray, np.ndarray]:
    base = _logprob_matrix(base_logprobs, "base_logprobs")
    var = _logprob_matrix(var_logprobs, "var_logprobs")
    if base.shape != var.shape:
        raise ValueError(f"baseline and variant log-probabilities differ in shape: "
                         f"{base.shape} vs {var.shape} (same text, same tokenizer required)")
    return base, var


# --------------------------------------------------------------------------- against the baseline

def kl_divergence_per_position(base_logprobs: Any, var_logprobs: Any) -> np.ndarray:
    """KL(baseline || variant) in nats at each position: sum_v p_b (log p_b - log p_v).

    Tokens the baseline gives probability 0 (log-prob -inf, or exp underflowing to 0) contribute
    0; a token the baseline allows and the variant rules out (-inf) makes that position +inf.
    Tiny negative sums from rounding are clamped to 0. Returns float64 of shape (positions,).
    """
    base, var = _paired(base_logprobs, var_logprobs)
    out = np.empty(base.shape[0], dtype=np.float64)
    for rows in _row_chunks(*base.shape):
        lb = _log_softmax64(base[rows], "base_logprobs")
        lv = _log_softmax64(var[rows], "var_logprobs")
        p = np.exp(lb)
        with np.errstate(invalid="ignore"):  # -inf - -inf where p == 0; masked below
            terms = np.where(p > 0.0, p * (lb - lv), 0.0)
        out[rows] = np.maximum(terms.sum(axis=1), 0.0)
    return out


def kld_summary(base_logprobs: Any, var_logprobs: Any) -> dict[str, float]:
    """{"mean": mean KL per position, "p99": its 99th percentile} in nats (docs/metrics.md's KLD)."""
    return kl_summary(kl_divergence_per_position(base_logprobs, var_logprobs))


def kl_summary(kl: np.ndarray) -> dict[str, float]:
    """{"mean", "p99"} of KLs per position (an infinite one makes the mean infinite)."""
    if kl.size == 0:
        raise ValueError("KLD needs at least one position")
    if np.all(np.isfinite(kl)):
        return {"mean": stats.mean(kl), "p99": stats.percentile(kl, 99.0)}
    return {"mean": math.inf, "p99": _percentile_with_inf(kl, 99.0)}


def _percentile_with_inf(xs: np.ndarray, q: float) -> float:
    """numpy's linear percentile, except that interpolating towards +inf gives +inf, not NaN.

    An infinite KL is a real result (the variant rules out a token the baseline allows), and
    stats.percentile refuses non-finite samples.
    """
    s = np.sort(xs)
    h = (s.size - 1) * q / 100.0
    lo = int(math.floor(h))
    hi = min(lo + 1, s.size - 1)
    frac = h - lo
    if frac == 0.0 or s[lo] == s[hi]:
        return float(s[lo])
    return math.inf if math.isinf(s[hi]) else float(s[lo] + frac * (s[hi] - s[lo]))


def top1_agreement(base_logprobs: Any, var_logprobs: Any) -> float:
    """Share of positions (0..1) where baseline and variant put their maximum on the same token."""
    same = top1_matches(base_logprobs, var_logprobs)
    if same.size == 0:
        raise ValueError("top-1 agreement needs at least one position")
    return float(np.mean(same))


def top1_matches(base_logprobs: Any, var_logprobs: Any) -> np.ndarray:
    """At each position, whether baseline and variant put their maximum on the same token (bool, (positions,))."""
    base, var = _paired(base_logprobs, var_logprobs)
    return np.argmax(base, axis=1) == np.argmax(var, axis=1)


# --------------------------------------------------------------------------- against the baseline, from top-k

OTHER_FLOOR = 1e-12  # the least mass the variant's "other" bucket is given where the baseline's is positive


def token_groups(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Each token text → the ids that decode to it (several where a vocabulary spells two ids alike, such
    as partial UTF-8 bytes): an endpoint names tokens by text, so the baseline is grouped by text too."""
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(texts):
        groups.setdefault(t, []).append(i)
    return {t: np.asarray(ids, dtype=np.int64) for t, ids in groups.items()}


def truncated_kl_per_position(base_logprobs: Any, base_texts: Sequence[str],
                              var_top: Sequence[dict[str, float]]) -> np.ndarray:
    """KL(baseline || variant) in nats at each position, over the tokens whose variant log-probability is
    known (`var_top[i]`: token text → log-probability, an endpoint's top-k and the token that followed)
    with the rest of each distribution lumped into one "other" bucket:

        sum over known t of p_b(t) log(p_b(t) / p_v(t))  +  P_b(other) log(P_b(other) / P_v(other))

    p_b(t) is the baseline's probability of every id whose text is t (`base_texts`: each id's text).
    Lumping is a coarsening, so this is at most the full KL (the data-processing inequality) and equal
    to it when the known tokens carry all the variant's mass. A known text the baseline has no id for
    adds nothing (p_b = 0). The variant's "other" mass is floored at OTHER_FLOOR where the baseline's
    is positive: the top-k's rounded probabilities may sum past 1. Returns float64 of shape (positions,)."""
    base = _logprob_matrix(base_logprobs, "base_logprobs")
    if base.shape[0] != len(var_top):
        raise ValueError(f"baseline has {base.shape[0]} positions, the variant's top-k {len(var_top)} "
                         "(same text, same tokenizer required)")
    if base.shape[1] != len(base_texts):
        raise ValueError(f"{len(base_texts)} token texts for a vocabulary of {base.shape[1]}")
    groups = token_groups(base_texts)
    out = np.empty(base.shape[0], dtype=np.float64)
    for i, top in enumerate(var_top):
        lb = _log_softmax64(base[i:i + 1], "base_logprobs")[0]
        p = np.exp(lb)
        total_kl, kept_b, kept_v = 0.0, 0.0, 0.0
        for text, lv in top.items():
            ids = groups.get(text)
            pb = float(p[ids].sum()) if ids is not None else 0.0
            pv = math.exp(lv)
            kept_b, kept_v = kept_b + pb, kept_v + pv
            if pb > 0.0:
                total_kl += math.inf if pv == 0.0 else pb * (math.log(pb) - lv)
        other_b = max(0.0, 1.0 - kept_b)
        if other_b > 0.0:
            other_v = max(OTHER_FLOOR, 1.0 - kept_v)
            total_kl += other_b * math.log(other_b / other_v)
        out[i] = max(total_kl, 0.0)
    return out


def top1_agreement_by_text(base_logprobs: Any, base_texts: Sequence[str],
                           var_top: Sequence[dict[str, float]]) -> float:
    """Share of positions (0..1) where the text of the baseline's most likely id is the variant's most likely
    token text (the highest of its top-k)."""
    if len(var_top) == 0:
        raise ValueError("top-1 agreement needs matching, non-empty positions: 0")
    return float(np.mean(top1_matches_by_text(base_logprobs, base_texts, var_top)))


def top1_matches_by_text(base_logprobs: Any, base_texts: Sequence[str],
                         var_top: Sequence[dict[str, float]]) -> np.ndarray:
    """At each position, whether the baseline's most likely id reads as the variant's most likely token text."""
    base = _logprob_matrix(base_logprobs, "base_logprobs")
    if base.shape[0] != len(var_top):
        raise ValueError(f"top-1 agreement needs matching, non-empty positions: {base.shape[0]} vs {len(var_top)}")
    best = np.argmax(base, axis=1)
    return np.array([bool(top) and base_texts[int(b)] == max(top, key=top.get) for b, top in zip(best, var_top)],
                    dtype=bool)


# --------------------------------------------------------------------------- likelihood

def nll(logprobs: Any, targets: Any) -> tuple[float, int]:
    """(summed negative log-likelihood of the targets in nats, number of positions scored).

    Targets below 0 (the -100 ignore index of Hugging Face labels) are skipped.
    """
    lp = _logprob_matrix(logprobs, "logprobs")
    tg = _to_numpy(targets).astype(np.int64)
    if tg.shape != (lp.shape[0],):
        raise ValueError(f"targets must have shape ({lp.shape[0]},) to match logprobs, "
                         f"got {tg.shape}")
    if tg.size and tg.max() >= lp.shape[1]:
        raise ValueError(f"target id {int(tg.max())} is outside the vocabulary of {lp.shape[1]}")
    total, count = 0.0, 0
    for rows in _row_chunks(*lp.shape):
        keep = tg[rows] >= 0
        if not keep.any():
            continue
        chunk = _log_softmax64(lp[rows][keep], "logprobs")
        total -= float(chunk[np.arange(chunk.shape[0]), tg[rows][keep]].sum())
        count += int(keep.sum())
    return total, count


def perplexity(logprobs: Any, targets: Any) -> float:
    """exp(mean negative log-likelihood per scored position)."""
    total, count = nll(logprobs, targets)
    if count == 0:
        raise ValueError("perplexity needs at least one scored position")
    return math.exp(total / count)


def ppl_ratio(ppl_variant: float, ppl_baseline: float) -> float:
    """perplexity(variant) / perplexity(baseline); above 1 means the variant is worse."""
    if ppl_baseline <= 0:
        raise ValueError(f"baseline perplexity must be positive, got {ppl_baseline}")
    return ppl_variant / ppl_baseline


def bits_per_byte(total_nll_nats: float, n_bytes: int) -> float:
    """total NLL / (ln 2 * bytes of text): comparable across tokenizers, unlike per-token PPL."""
    if n_bytes <= 0:
        raise ValueError(f"n_bytes must be positive, got {n_bytes}")
    return total_nll_nats / (math.log(2.0) * n_bytes)


# --------------------------------------------------------------------------- against ground truth

def normalize_answer(s: str) -> str:
    """Strip surrounding whitespace and collapse internal runs of whitespace to one space.

    Case is kept on purpose: the answers are structured fields (ids, codes, names) where "AB-12"
    and "ab-12" are different values, so folding case would count wrong answers as right.
    """
    return " ".join(s.split())


def exact_match(prediction: str, answer: str) -> bool:
    """Whether prediction equals answer after normalize_answer."""
    return normalize_answer(prediction) == normalize_answer(answer)


def task_accuracy(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """Share (0..1) of predictions that exactly match their answers."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers")
    if not answers:
        raise ValueError("task accuracy needs at least one answer")
    return sum(exact_match(p, a) for p, a in zip(predictions, answers)) / len(answers)


def accuracy_retention(acc_variant: float, acc_baseline: float) -> float | None:
    """task accuracy(variant) / task accuracy(baseline); None when the baseline scored 0."""
    return None if acc_baseline == 0 else acc_variant / acc_baseline


def retention_interval(base_correct: Sequence[bool], var_correct: Sequence[bool], confidence: float = 0.95,
                       resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Paired percentile-bootstrap interval of accuracy retention, Σ variant correct ÷ Σ baseline correct,
    resampling the graded samples (the same ones for both). None when the baseline got none right."""
    base = np.asarray(base_correct, dtype=np.float64)
    var = np.asarray(var_correct, dtype=np.float64)
    if base.shape != var.shape or base.size == 0 or base.sum() == 0:
        return None
    idx = np.random.default_rng(seed).integers(0, base.size, size=(resamples, base.size))
    b, v = base[idx].sum(axis=1), var[idx].sum(axis=1)
    ratios = v[b > 0] / b[b > 0]
    tail = (1 - confidence) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))
