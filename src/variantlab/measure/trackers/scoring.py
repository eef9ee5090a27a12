"""Teacher-forced scoring: next-token distributions over the evaluation text, against the baseline's.

The first `samples` samples (prompt + " " + answer) are scored one text at a time. The baseline's
distributions are written once per run into the run's reference (measure/reference.py) by a job of their own
before the rounds (`writes_reference`); every variant's worker, the baseline's own included, then compares its
distributions with the reference there, text by text, and returns figures only: KLD mean and p99, top-1
agreement, its NLL (for perplexity, the PPL ratio and bits per byte). No record carries a distribution, so a
record stays small whatever the vocabulary, and KLD stays exact (float32 rows as computed, compared in
float64). A variant of the baseline's checkpoint (`same_checkpoint`, from the plan) whose backend takes that
checkpoint tokenizer's ids (`vocabulary_source` "checkpoint": our engine, a GGUF built from the checkpoint) is
scored on the reference's token ids, the baseline's own split, so its positions are the baseline's by
construction; a variant with a vocabulary of its own (another checkpoint, a user's GGUF) splits the text itself,
and is compared only where it split it exactly as the baseline did (`same_split`, by token ids).
Bits per byte count only the bytes that were predicted. Non-finite logits are reported with where they start,
never summed into a figure. Deterministic: measured once per variant.

Through an endpoint (a backend with `topk_scoring`, backends/openai_http.py), only the top-k
log-probabilities of each position come back, by token text, and the comparison with the local baseline
(whose reference then carries its vocabulary's texts, backends/token_texts.py: `token_texts`) is *truncated*:
KL(baseline ‖ variant) over the tokens the endpoint named, the rest of both distributions lumped into
one bucket (measure/accuracy.truncated_kl_per_position: at most the full KLD), and top-1 agreement by
token text. The split is checked by the texts of the tokens (`text_fingerprint`): the same texts at
every position, hence the same number of positions. A backend that gives neither says why (NotMeasured).

Records written before the reference (variantlab before issue 49) carry the whole distributions as a blob
(`logprobs_blob`); `compare` still reads them.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import numpy as np

from .. import accuracy as acc
from ..reference import Reference, ReferenceMissing, ReferenceWriter, ids_fingerprint, open_reference
from ..tracker import MetricDef, NotMeasured, Output, Problem, TrackerBase

TOP_K = 20                          # log-probabilities asked of an endpoint per position
VERSUS = ("kld_mean", "kld_p99", "top1_agreement", "ppl_ratio")


class ScoringOutput(Output):
    texts: int
    positions: int
    nll_nats: float | None          # None when some logits were not finite
    n_bytes: int                    # UTF-8 bytes that were predicted
    tokenizer_fingerprint: str      # the token ids of the evaluation text (before issue 49: class + ids)
    tokenizer_class: str
    logprobs_blob: str | None = None    # records before the reference only: sha256 of safetensors
                                        # {"logprobs": (P, V) f32, "targets": (P,) i64}, or an endpoint's JSON top-k
    nonfinite: str | None = None    # "NaN logits from position 37 of text 2"
    text_fingerprint: str | None = None     # the texts of the evaluation text's tokens (an endpoint's split)
    vocabulary_blob: str | None = None      # records before the reference only: JSON [every id's text]
    top_k: int | None = None                # set: the endpoint's top-k log-probabilities only (module doc)
    mismatch: str | None = None             # the endpoint's tokens do not spell the text
    # against the run's reference (measure/reference.py), computed in the worker:
    reference: str | None = None            # the id of the reference these figures were compared against
    split: str | None = None                # "reference": scored on the baseline's token ids; "own": on its own
    kld_mean: float | None = None
    kld_p99: float | None = None
    top1_agreement: float | None = None
    versus: str | None = None               # why there are no figures against the baseline ("not comparable: …")

    @property
    def problem(self) -> Problem | None:
        why = self.nonfinite or self.mismatch
        return Problem(why) if why else None


def fingerprint(tokenizer_class: str, token_ids) -> str:
    """The split of records before the reference: the tokenizer's class and the ids (now: the ids alone)."""
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
    return Problem(_split_differs(var.tokenizer_class, base.tokenizer_class, var.tokenizer_fingerprint,
                                  base.tokenizer_fingerprint))


def _split_differs(var_class: str, base_class: str, var_fp: str, base_fp: str) -> str:
    return (f"not comparable: {var_class} split the evaluation text differently from the baseline's {base_class} "
            f"(token ids {var_fp} vs {base_fp}); compare bits per byte and task accuracy")


def _fact(value):
    def samples(out: ScoringOutput):
        if out.problem:
            return out.problem
        v = value(out)
        return [] if v is None else [v]
    return samples


class _Against:
    """A variant's distributions compared with the reference's, text by text: KL per position and top-1."""

    def __init__(self, reference: Reference):
        self.reference = reference
        self.kl: list[np.ndarray] = []
        self.agree = 0

    def add(self, i: int, logprobs) -> None:
        base = self.reference.rows(i)
        self.kl.append(acc.kl_divergence_per_position(base, logprobs))
        self.agree += int(acc.top1_matches(base, logprobs).sum())

    def add_topk(self, i: int, vocabulary: list[str], top) -> None:
        base = self.reference.rows(i)
        self.kl.append(acc.truncated_kl_per_position(base, vocabulary, top))
        self.agree += int(acc.top1_matches_by_text(base, vocabulary, top).sum())

    def figures(self) -> dict:
        kl = np.concatenate(self.kl) if self.kl else np.zeros(0)
        if kl.size == 0:
            return {"versus": "no positions to compare"}
        k = acc.kl_summary(kl)
        return {"reference": self.reference.id, "kld_mean": k["mean"], "kld_p99": k["p99"],
                "top1_agreement": self.agree / kl.size}


@dataclass(frozen=True)
class Scoring(TrackerBase):
    samples: int = 32
    token_texts: bool = False       # the reference carries its vocabulary's texts (a plan with an endpoint)
    kind = "scoring"
    needs_local_model = False       # an endpoint with top-k log-probabilities is scored too (module doc)
    remote_reason = ("teacher-forced scoring (KLD, top-1 agreement, PPL) needs the model's logits or, from an "
                     "endpoint, its top-k log-probabilities, and this backend gives neither")
    name = "scoring"
    once = True
    writes_reference = True         # the runner's reference job hosts this tracker alone (measure/reference.py)
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

    def texts(self, samples) -> list[str]:
        """The evaluation texts: the first `samples` samples, prompt and answer."""
        return [s["prompt"] + " " + s["answer"] for s in samples[:self.samples]]

    def run(self, ctx) -> ScoringOutput:
        texts = self.texts(ctx.samples)
        caps = ctx.backend.capabilities
        if getattr(ctx, "writes_reference", False):
            if not caps.scoring:
                raise NotMeasured("the baseline's reference needs its full next-token distributions")
            return self._write_reference(ctx, texts)
        reference, why = _reference(ctx, texts)
        if caps.scoring:
            return self._run_full(ctx, texts, reference, why)
        if caps.topk_scoring:
            return self._run_topk(ctx, texts, reference, why)
        raise NotMeasured(self.remote_reason)

    def _write_reference(self, ctx, texts: list[str]) -> ScoringOutput:
        """The baseline's distributions, text by text, into the run's reference (ctx.reference_dir)."""
        backend = ctx.backend
        writer = ReferenceWriter(ctx.reference_dir, texts, getattr(backend, "tokenizer_class", ""))
        nll, ids_all = 0.0, []
        try:
            for i, text in enumerate(texts):
                s = backend.score([text])[0]
                if s.first_nonfinite is not None:
                    writer.abandon()
                    return _output(texts, ids_all, backend, nonfinite=f"NaN or inf logits from position "
                                                                      f"{s.first_nonfinite} of text {i}")
                nll += _nll(s)
                ids_all.append(s.token_ids)
                writer.add(s.token_ids, s.n_bytes, s.logprobs)
                ctx.progress("reference", (i + 1) / len(texts))
        except BaseException:
            writer.abandon()
            raise
        split, vocabulary = _token_texts(backend, ids_all, self.token_texts)
        ref_id = writer.finish(nll, split, vocabulary)
        reference = open_reference(ctx.reference_dir, texts)
        return _output(texts, ids_all, backend, nll=nll, n_bytes=sum(t.n_bytes for t in reference.texts),
                       reference=ref_id, split="reference", text_fingerprint=split, kld_mean=0.0, kld_p99=0.0,
                       top1_agreement=1.0)

    def _run_full(self, ctx, texts: list[str], reference: Reference | None, why: str | None) -> ScoringOutput:
        """Each text scored (on the reference's ids where the backend takes the checkpoint's) and compared."""
        backend = ctx.backend
        on_ids = (reference is not None and getattr(ctx, "same_checkpoint", False)
                  and getattr(backend, "vocabulary_source", "own") == "checkpoint"
                  and hasattr(backend, "score_ids") and len(reference.texts) == len(texts))
        against = _Against(reference) if reference is not None else None
        nll, n_bytes, ids_all = 0.0, 0, []
        for i, text in enumerate(texts):
            s = (backend.score_ids(reference.texts[i].ids, reference.texts[i].n_bytes) if on_ids
                 else backend.score([text])[0])
            if s.first_nonfinite is not None:
                return _output(texts, ids_all, backend, nonfinite=f"NaN or inf logits from position "
                                                                  f"{s.first_nonfinite} of text {i}")
            nll += _nll(s)
            n_bytes += s.n_bytes
            ids_all.append(s.token_ids)
            if against is not None and tuple(s.token_ids) != reference.texts[i].ids:
                against = None          # its own split differs from the baseline's: nothing to compare
            if against is not None:
                against.add(i, s.logprobs)
            ctx.progress("scoring", (i + 1) / len(texts))
        if reference is not None and against is None:
            why = _split_differs(getattr(backend, "tokenizer_class", ""), reference.tokenizer_class,
                                 ids_fingerprint(ids_all), reference.ids_fingerprint)
        figures = against.figures() if against is not None else {"versus": why}
        split, _ = _token_texts(backend, ids_all, self.token_texts)
        return _output(texts, ids_all, backend, nll=nll, n_bytes=n_bytes, text_fingerprint=split,
                       split="reference" if on_ids else "own", **figures)

    def _run_topk(self, ctx, texts: list[str], reference: Reference | None, why: str | None) -> ScoringOutput:
        from ...backends.base import TopkUnavailable
        try:
            scored = ctx.backend.score_topk(texts, TOP_K)
        except TopkUnavailable as e:
            raise NotMeasured(f"the endpoint returned no prompt log-probabilities for KLD and top-1 ({e})") from None
        targets = [v for s in scored for v in s.target_logprobs]
        mismatch = next((f"text {i}: {s.mismatch}" for i, s in enumerate(scored) if s.mismatch), None)
        split = text_fingerprint(s.tokens for s in scored)
        figures: dict = {"versus": why}
        if reference is not None and mismatch is None:
            if reference.text_fingerprint is None or not reference.has_vocabulary:
                figures = {"versus": "not comparable: the baseline's reference has no token texts to match the "
                                     "endpoint's top-k by"}
            elif split != reference.text_fingerprint:
                figures = {"versus": f"not comparable: the endpoint's tokens of the evaluation text are not the "
                                     f"baseline's, position for position (token texts {split} vs "
                                     f"{reference.text_fingerprint}); compare bits per byte and task accuracy"}
            else:
                against, vocabulary = _Against(reference), reference.vocabulary()
                for i, s in enumerate(scored):
                    against.add_topk(i, vocabulary, s.top)
                figures = against.figures()
        return ScoringOutput(texts=len(texts), positions=len(targets), nll_nats=-math.fsum(targets),
                             n_bytes=sum(s.n_bytes for s in scored), tokenizer_fingerprint=f"endpoint:{split}",
                             tokenizer_class="endpoint", text_fingerprint=split, top_k=TOP_K, mismatch=mismatch,
                             **figures)

    def compare(self, base: ScoringOutput, var: ScoringOutput, blobs) -> dict:
        if base.top_k is not None:
            return dict.fromkeys(VERSUS, Problem("not comparable: the baseline is an endpoint with top-k "
                                                 "log-probabilities only; KLD needs a local baseline"))
        if base.logprobs_blob is not None or var.logprobs_blob is not None:
            return _compare_stored(base, var, blobs)
        problem = var.problem or (Problem(f"baseline: {base.nonfinite}") if base.problem else None)
        if problem:
            return dict.fromkeys(VERSUS, problem)
        if var.versus is not None:
            return dict.fromkeys(VERSUS, Problem(var.versus))
        if var.reference is None or var.reference != base.reference:
            return dict.fromkeys(VERSUS, Problem("not comparable: the variant and the baseline were compared "
                                                 "against different baseline references"))
        return {"kld_mean": var.kld_mean, "kld_p99": var.kld_p99, "top1_agreement": var.top1_agreement,
                "ppl_ratio": _ppl_ratio(base, var)}

    def warnings(self, variant: str, output: ScoringOutput) -> list[str]:
        if output.top_k is None:
            return []
        return [f"{variant}: KLD and top-1 agreement are from the endpoint's top-{output.top_k} log-probabilities: "
                f"KL over those tokens (and the one that came), the rest of each distribution lumped into one "
                f"bucket, a lower bound of the full KLD; tokens matched by text"]


def _reference(ctx, texts: list[str]) -> tuple[Reference | None, str | None]:
    """The run's reference for these texts, or (None, why there is none)."""
    folder = getattr(ctx, "reference_dir", None)
    if folder is None:
        return None, "no baseline reference for this measurement (the baseline's scoring did not run first)"
    try:
        return open_reference(folder, texts), None
    except ReferenceMissing as e:
        return None, f"no baseline reference: {e}"


def _nll(s) -> float:
    """The summed negative log-likelihood of one scored text's targets, in float64."""
    lp = s.logprobs
    return float(-np.asarray(lp[np.arange(len(s.targets)), s.targets], dtype=np.float64).sum())


def _output(texts, ids_all, backend, *, nll: float | None = None, n_bytes: int = 0, **fields) -> ScoringOutput:
    return ScoringOutput(texts=len(texts), positions=sum(max(0, len(i) - 1) for i in ids_all), nll_nats=nll,
                         n_bytes=n_bytes, tokenizer_fingerprint=ids_fingerprint(ids_all),
                         tokenizer_class=getattr(backend, "tokenizer_class", ""), **fields)


def _token_texts(backend, ids_all, wanted: bool) -> tuple[str | None, list[str] | None]:
    """A local variant's token texts, for an endpoint's comparison with it: the fingerprint of its split by text
    and its vocabulary's texts ((None, None) unless wanted, or where the backend has no HF tokenizer)."""
    from ...backends.token_texts import token_texts, vocabulary_texts
    tokenizer = getattr(backend, "tokenizer", None)   # a Hugging Face tokenizer, where the backend has one
    if not wanted or tokenizer is None or not hasattr(tokenizer, "batch_decode"):
        return None, None
    split = text_fingerprint(token_texts(tokenizer, ids) for ids in ids_all)
    vocab_size = getattr(getattr(getattr(backend, "model", None), "config", None), "vocab_size", None) \
        or getattr(backend, "n_vocab", None) or len(tokenizer)
    return split, vocabulary_texts(tokenizer, vocab_size)


def _ppl_ratio(base: ScoringOutput, var: ScoringOutput) -> float:
    log_ratio = var.nll_nats / var.positions - base.nll_nats / base.positions   # in log space: no overflow
    return math.exp(log_ratio) if log_ratio < 700 else math.inf


def _compare_stored(base: ScoringOutput, var: ScoringOutput, blobs) -> dict:
    """The comparison of records written before the reference, which carry their distributions as blobs."""
    if base.logprobs_blob is None or var.logprobs_blob is None:
        return dict.fromkeys(VERSUS, Problem("not comparable: the variant and the baseline were scored by "
                                             "different versions of variantlab"))
    why = same_split(base, var)
    if why:
        return dict.fromkeys(VERSUS, why)
    problem = var.problem or (Problem(f"baseline: {base.nonfinite}") if base.problem else None)
    if problem:
        return dict.fromkeys(VERSUS, problem)
    from safetensors.numpy import load
    b = load(blobs(base.logprobs_blob))
    ppl_ratio = _ppl_ratio(base, var)
    if var.top_k is not None:
        if base.vocabulary_blob is None:
            return dict.fromkeys(("kld_mean", "kld_p99", "top1_agreement"), Problem(
                "not comparable: the baseline's output has no token texts to match the endpoint's top-k by")) \
                | {"ppl_ratio": ppl_ratio}
        vocabulary = json.loads(blobs(base.vocabulary_blob))
        top = json.loads(blobs(var.logprobs_blob))["top"]
        k = acc.kl_summary(acc.truncated_kl_per_position(b["logprobs"], vocabulary, top))
        return {"kld_mean": k["mean"], "kld_p99": k["p99"], "ppl_ratio": ppl_ratio,
                "top1_agreement": acc.top1_agreement_by_text(b["logprobs"], vocabulary, top)}
    v = load(blobs(var.logprobs_blob))
    k = acc.kld_summary(b["logprobs"], v["logprobs"])
    return {"kld_mean": k["mean"], "kld_p99": k["p99"],
            "top1_agreement": acc.top1_agreement(b["logprobs"], v["logprobs"]), "ppl_ratio": ppl_ratio}
