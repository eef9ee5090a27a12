"""Teacher-forced scoring: next-token distributions over the evaluation text, against the baseline.

The first `samples` samples (prompt + " " + answer) are scored in one forward each. What travels
back is data: the log-probabilities and targets as a content-addressed blob (safetensors bytes),
plus the totals for perplexity and bits per byte. Comparisons with the baseline (KLD mean and p99,
top-1 agreement, PPL ratio, and the perplexity's delta) need both sides to have tokenized the text
identically (`same_split`): the tokenizer's fingerprint is what it *does* — its class and the token
ids of the evaluation text — not a hash of its files (transformers picks the tokenizer class by
model type, so one tokenizer.json can split text two ways). Bits per byte count only the bytes
that were predicted. Non-finite logits are reported with where they start, never summed into a figure.
Deterministic: measured once per variant.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from .. import accuracy as acc
from ..tracker import MetricDef, Output, Problem, TrackerBase


class ScoringOutput(Output):
    texts: int
    positions: int
    nll_nats: float | None          # None when some logits were not finite
    n_bytes: int                    # UTF-8 bytes that were predicted
    tokenizer_fingerprint: str      # class + token ids of the evaluation text
    tokenizer_class: str
    logprobs_blob: str | None       # sha256 of safetensors {"logprobs": (P, V) f32, "targets": (P,) i64}
    nonfinite: str | None = None    # "NaN logits from position 37 of text 2"

    @property
    def problem(self) -> Problem | None:
        return Problem(self.nonfinite) if self.nonfinite else None


def fingerprint(tokenizer_class: str, token_ids) -> str:
    h = hashlib.sha256(tokenizer_class.encode())
    for ids in token_ids:
        h.update(b"|" + ",".join(map(str, ids)).encode())
    return h.hexdigest()[:12]


def same_split(base: ScoringOutput, var: ScoringOutput) -> Problem | None:
    """Why figures per token of the two cannot be compared (they split the evaluation text differently), or None.
    One rule for every such row: the versus rows (KLD, top-1 agreement, PPL ratio) and the perplexity's delta."""
    if var.tokenizer_fingerprint == base.tokenizer_fingerprint:
        return None
    return Problem(f"not comparable: {var.tokenizer_class} split the evaluation text differently from the "
                   f"baseline's {base.tokenizer_class} (fingerprint {var.tokenizer_fingerprint} vs "
                   f"{base.tokenizer_fingerprint}); compare bits per byte and task accuracy")


def _fact(value):
    def samples(out: ScoringOutput):
        if out.problem:
            return out.problem
        v = value(out)
        return [] if v is None else [v]
    return samples


@dataclass(frozen=True)
class Scoring(TrackerBase):
    samples: int = 32
    kind = "scoring"
    remote_reason = ("teacher-forced scoring (KLD, top-1 agreement, PPL) needs the model's logits, which an "
                     "endpoint does not return")
    name = "scoring"
    once = True
    output_model = ScoringOutput

    def config(self) -> dict:
        return {"samples": self.samples}

    @classmethod
    def from_config(cls, config: dict) -> "Scoring":
        return cls(config.get("samples", 32))

    def metrics(self) -> tuple[MetricDef, ...]:
        return (
            MetricDef("kld_mean", "KLD mean (vs baseline)", "nats", True, "versus", headline=2, with_delta=False),
            MetricDef("kld_p99", "KLD p99 (vs baseline)", "nats", True, "versus", with_delta=False),
            MetricDef("top1_agreement", "Top-1 agreement (vs baseline)", "ratio", False, "versus", with_delta=False),
            MetricDef("ppl_ratio", "PPL ratio (vs baseline)", "ratio", True, "versus", with_delta=False),
            MetricDef("ppl", "Perplexity (eval text)", "ratio", True, "fact",
                      _fact(lambda o: math.exp(o.nll_nats / o.positions) if o.positions else None),
                      comparable=same_split),
            MetricDef("bits_per_byte", "Bits per byte (eval text)", "bits", True, "fact",
                      _fact(lambda o: acc.bits_per_byte(o.nll_nats, o.n_bytes) if o.n_bytes else None)),
        )

    def run(self, ctx) -> ScoringOutput:
        import numpy as np
        from safetensors.numpy import save

        texts = [s["prompt"] + " " + s["answer"] for s in ctx.samples[:self.samples]]
        scored = ctx.backend.score(texts)
        nonfinite = next((f"NaN or inf logits from position {s.first_nonfinite} of text {i}"
                          for i, s in enumerate(scored) if s.first_nonfinite is not None), None)
        logprobs = np.concatenate([s.logprobs for s in scored])
        targets = np.concatenate([s.targets for s in scored])
        nll = None
        if nonfinite is None:
            nll = float(-logprobs[np.arange(len(targets)), targets].astype(np.float64).sum())
        blob = ctx.add_blob(save({"logprobs": np.ascontiguousarray(logprobs, dtype=np.float32),
                                  "targets": np.ascontiguousarray(targets, dtype=np.int64)}))
        cls = getattr(ctx.backend, "tokenizer_class", "")
        return ScoringOutput(texts=len(texts), positions=int(len(targets)), nll_nats=nll,
                             n_bytes=int(sum(s.n_bytes for s in scored)),
                             tokenizer_fingerprint=fingerprint(cls, [s.token_ids for s in scored]),
                             tokenizer_class=cls, logprobs_blob=blob, nonfinite=nonfinite)

    def compare(self, base: ScoringOutput, var: ScoringOutput, blobs) -> dict:
        keys = ("kld_mean", "kld_p99", "top1_agreement", "ppl_ratio")
        why = same_split(base, var)
        if why:
            return dict.fromkeys(keys, why)
        problem = var.problem or (Problem(f"baseline: {base.nonfinite}") if base.problem else None)
        if problem:
            return dict.fromkeys(keys, problem)
        from safetensors.numpy import load
        b, v = load(blobs(base.logprobs_blob)), load(blobs(var.logprobs_blob))
        k = acc.kld_summary(b["logprobs"], v["logprobs"])
        log_ratio = var.nll_nats / var.positions - base.nll_nats / base.positions   # in log space: no overflow
        return {"kld_mean": k["mean"], "kld_p99": k["p99"],
                "top1_agreement": acc.top1_agreement(b["logprobs"], v["logprobs"]),
                "ppl_ratio": math.exp(log_ratio) if log_ratio < 700 else math.inf}
