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

Through an endpoint (a backend with `topk_scoring`, backends/openai_http.py), only the top-k
log-probabilities of each position come back, by token text: the blob is JSON (the log-probability of
each token that came, and each position's top-k texts → log-probabilities), and the comparison with a
local baseline (whose output carries its vocabulary's texts, backends/token_texts.py, when the plan has an
endpoint variant: `token_texts`) is *truncated*:
KL(baseline ‖ variant) over the tokens the endpoint named, the rest of both distributions lumped into
one bucket (measure/accuracy.truncated_kl_per_position: at most the full KLD), and top-1 agreement by
token text. The split is checked by the texts of the tokens (`text_fingerprint`): the same texts at
every position, hence the same number of positions. A backend that gives neither says why (NotMeasured).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from .. import accuracy as acc
from ..tracker import MetricDef, NotMeasured, Output, Problem, TrackerBase

TOP_K = 20                          # log-probabilities asked of an endpoint per position


class ScoringOutput(Output):
    texts: int
    positions: int
    nll_nats: float | None          # None when some logits were not finite
    n_bytes: int                    # UTF-8 bytes that were predicted
    tokenizer_fingerprint: str      # class + token ids of the evaluation text
    tokenizer_class: str
    logprobs_blob: str | None       # sha256 of safetensors {"logprobs": (P, V) f32, "targets": (P,) i64};
                                    # top-k: of JSON {"targets": [P floats], "top": [P {text: logprob}]}
    nonfinite: str | None = None    # "NaN logits from position 37 of text 2"
    text_fingerprint: str | None = None     # the texts of the evaluation text's tokens (an endpoint's split)
    vocabulary_blob: str | None = None      # sha256 of JSON [every id's text] (a local variant's)
    top_k: int | None = None                # set: the endpoint's top-k log-probabilities only (module doc)
    mismatch: str | None = None             # the endpoint's tokens do not spell the text

    @property
    def problem(self) -> Problem | None:
        why = self.nonfinite or self.mismatch
        return Problem(why) if why else None


def fingerprint(tokenizer_class: str, token_ids) -> str:
    h = hashlib.sha256(tokenizer_class.encode())
    for ids in token_ids:
        h.update(b"|" + ",".join(map(str, ids)).encode())
    return h.hexdigest()[:12]


def text_fingerprint(token_texts) -> str:
    """The texts of each evaluation text's tokens, hashed: what an endpoint's split is checked by."""
    return hashlib.sha256(json.dumps([list(t) for t in token_texts]).encode()).hexdigest()[:12]


def same_split(base: ScoringOutput, var: ScoringOutput) -> Problem | None:
    """Why figures per token of the two cannot be compared (they split the evaluation text differently), or None.
    One rule for every such row: the versus rows (KLD, top-1 agreement, PPL ratio) and the perplexity's delta.
    An endpoint's split is known by its tokens' texts only, and compared by them."""
    if var.top_k is not None or base.top_k is not None:
        if base.text_fingerprint is not None and var.text_fingerprint == base.text_fingerprint:
            return None
        if base.text_fingerprint is None:
            return Problem("not comparable: the baseline was scored without its token texts, which an endpoint's "
                           "top-k is matched by (its backend has no tokenizer to spell them)")
        return Problem(f"not comparable: the endpoint's tokens of the evaluation text are not the baseline's, "
                       f"position for position (token texts {var.text_fingerprint} vs {base.text_fingerprint}); "
                       "compare bits per byte and task accuracy")
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
    token_texts: bool = False       # a local variant's output carries its token texts (a plan with an endpoint)
    kind = "scoring"
    needs_local_model = False       # an endpoint with top-k log-probabilities is scored too (module doc)
    remote_reason = ("teacher-forced scoring (KLD, top-1 agreement, PPL) needs the model's logits or, from an "
                     "endpoint, its top-k log-probabilities, and this backend gives neither")
    name = "scoring"
    once = True
    output_model = ScoringOutput

    def config(self) -> dict:
        return {"samples": self.samples, **({"token_texts": True} if self.token_texts else {})}

    @classmethod
    def from_config(cls, config: dict) -> "Scoring":
        return cls(config.get("samples", 32), config.get("token_texts", False))

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
        texts = [s["prompt"] + " " + s["answer"] for s in ctx.samples[:self.samples]]
        caps = ctx.backend.capabilities
        if caps.scoring:
            return self._run_full(ctx, texts)
        if caps.topk_scoring:
            return self._run_topk(ctx, texts)
        raise NotMeasured(self.remote_reason)

    def _run_full(self, ctx, texts: list[str]) -> ScoringOutput:
        import numpy as np
        from safetensors.numpy import save

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
        texts_fp, vocab_blob = self._token_texts(ctx, scored, logprobs.shape[1]) if self.token_texts else (None, None)
        return ScoringOutput(texts=len(texts), positions=int(len(targets)), nll_nats=nll,
                             n_bytes=int(sum(s.n_bytes for s in scored)),
                             tokenizer_fingerprint=fingerprint(cls, [s.token_ids for s in scored]),
                             tokenizer_class=cls, logprobs_blob=blob, nonfinite=nonfinite,
                             text_fingerprint=texts_fp, vocabulary_blob=vocab_blob)

    @staticmethod
    def _token_texts(ctx, scored, vocab_size: int) -> tuple[str | None, str | None]:
        """A local variant's token texts, for an endpoint's comparison with it: the fingerprint of its split
        by text, and its vocabulary's texts as a blob (None, None where the backend has no HF tokenizer)."""
        from ...backends.token_texts import token_texts, vocabulary_texts
        tokenizer = getattr(ctx.backend, "tokenizer", None)   # a Hugging Face tokenizer, where the backend has one
        if tokenizer is None or not hasattr(tokenizer, "batch_decode"):
            return None, None
        split = text_fingerprint(token_texts(tokenizer, s.token_ids) for s in scored)
        vocabulary = json.dumps(vocabulary_texts(tokenizer, vocab_size), ensure_ascii=False).encode()
        return split, ctx.add_blob(vocabulary)

    def _run_topk(self, ctx, texts: list[str]) -> ScoringOutput:
        from ...backends.base import TopkUnavailable
        try:
            scored = ctx.backend.score_topk(texts, TOP_K)
        except TopkUnavailable as e:
            raise NotMeasured(f"the endpoint returned no prompt log-probabilities for KLD and top-1 ({e})") from None
        targets = [v for s in scored for v in s.target_logprobs]
        top = [t for s in scored for t in s.top]
        mismatch = next((f"text {i}: {s.mismatch}" for i, s in enumerate(scored) if s.mismatch), None)
        blob = ctx.add_blob(json.dumps({"targets": targets, "top": top}, ensure_ascii=False).encode())
        split = text_fingerprint(s.tokens for s in scored)
        return ScoringOutput(texts=len(texts), positions=len(targets), nll_nats=-math.fsum(targets),
                             n_bytes=sum(s.n_bytes for s in scored), tokenizer_fingerprint=f"endpoint:{split}",
                             tokenizer_class="endpoint", logprobs_blob=blob, text_fingerprint=split, top_k=TOP_K,
                             mismatch=mismatch)

    def compare(self, base: ScoringOutput, var: ScoringOutput, blobs) -> dict:
        keys = ("kld_mean", "kld_p99", "top1_agreement", "ppl_ratio")
        if base.top_k is not None:
            return dict.fromkeys(keys, Problem("not comparable: the baseline is an endpoint with top-k "
                                               "log-probabilities only; KLD needs a local baseline"))
        why = same_split(base, var)
        if why:
            return dict.fromkeys(keys, why)
        problem = var.problem or (Problem(f"baseline: {base.nonfinite}") if base.problem else None)
        if problem:
            return dict.fromkeys(keys, problem)
        from safetensors.numpy import load
        b = load(blobs(base.logprobs_blob))
        log_ratio = var.nll_nats / var.positions - base.nll_nats / base.positions   # in log space: no overflow
        ppl_ratio = math.exp(log_ratio) if log_ratio < 700 else math.inf
        if var.top_k is not None:
            return self._compare_topk(b["logprobs"], base, var, blobs) | {"ppl_ratio": ppl_ratio}
        v = load(blobs(var.logprobs_blob))
        k = acc.kld_summary(b["logprobs"], v["logprobs"])
        return {"kld_mean": k["mean"], "kld_p99": k["p99"],
                "top1_agreement": acc.top1_agreement(b["logprobs"], v["logprobs"]),
                "ppl_ratio": ppl_ratio}

    @staticmethod
    def _compare_topk(base_logprobs, base: ScoringOutput, var: ScoringOutput, blobs) -> dict:
        """Truncated KLD and top-1 by text (module doc) of an endpoint's top-k against a local baseline."""
        if base.vocabulary_blob is None:
            return dict.fromkeys(("kld_mean", "kld_p99", "top1_agreement"), Problem(
                "not comparable: the baseline's output has no token texts to match the endpoint's top-k by"))
        vocabulary = json.loads(blobs(base.vocabulary_blob))
        top = json.loads(blobs(var.logprobs_blob))["top"]
        k = acc.kl_summary(acc.truncated_kl_per_position(base_logprobs, vocabulary, top))
        return {"kld_mean": k["mean"], "kld_p99": k["p99"],
                "top1_agreement": acc.top1_agreement_by_text(base_logprobs, vocabulary, top)}

    def warnings(self, variant: str, output: ScoringOutput) -> list[str]:
        if output.top_k is None:
            return []
        return [f"{variant}: KLD and top-1 agreement are from the endpoint's top-{output.top_k} log-probabilities: "
                f"KL over those tokens (and the one that came), the rest of each distribution lumped into one "
                f"bucket, a lower bound of the full KLD; tokens matched by text"]
