"""Calibration for recipes that measure while they build (mixed): text in micro-batches, the
original model's reference log-probs and captured activations, and the two measurements a search
makes with them — the whole-model KLD on every calibration text, and one linear's sensitivity by
a suffix run (the decoder layers below it replay their captured outputs; the rest computes for real).

KLD here is docs/metrics.md's (measure/accuracy.py): float64, rows renormalised; a model whose output is
not finite fits no budget (inf).
"""
from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import RecipeError
from .recipe import BuildContext

BATCH = 4  # calibration texts per forward


@dataclass(frozen=True)
class CalibrationBatch:
    ids: object      # [B, T] token ids, right-padded
    mask: object     # [B, T] attention mask
    score: object    # [B, T] bool: positions whose next-token distribution counts (all but each text's last)
    samples: int
    positions: int


@dataclass(frozen=True)
class Calibration:
    batches: list[CalibrationBatch]
    sensitivity_batches: int  # the first ones: they hold the first `sensitivity_samples` texts
    source: str               # "context" | "generator"


def calibration_set(model, context: BuildContext, *, samples: int, max_tokens: int, sensitivity_samples: int,
                    fallback_seed: int) -> Calibration:
    """The first `samples` calibration texts of the context (else `samples` generated ones of
    `fallback_seed`), tokenized, cut to `max_tokens`, in micro-batches; the first batches hold the
    first `sensitivity_samples` texts."""
    texts, source = list(context.calibration_texts[:samples]), "context"
    if not texts:
        from ..data.structured import generate_samples
        texts = [f"{s['prompt']} {s['answer']}" for s in generate_samples(samples, fallback_seed)]
        source = "generator"
    tok = context.tokenizer if context.tokenizer is not None else _tokenizer(model)
    encoded = [tok(t, add_special_tokens=True).input_ids[:max_tokens] for t in texts]
    encoded = [e for e in encoded if len(e) >= 2]  # one token has no next token to score
    if not encoded:
        raise RecipeError("mixed calibrates on text, but no calibration text is two tokens long",
                          field="calibration", accepted="calibration texts of at least two tokens")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    device = next(model.parameters()).device
    first = min(sensitivity_samples, len(encoded))
    chunks = [encoded[i:min(i + BATCH, first)] for i in range(0, first, BATCH)]
    sens = len(chunks)
    chunks += [encoded[i:i + BATCH] for i in range(first, len(encoded), BATCH)]
    return Calibration([_batch(c, pad, device) for c in chunks], sens, source)


def _batch(encoded: list[list[int]], pad: int, device) -> CalibrationBatch:
    import torch

    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, :len(e)] = torch.tensor(e)
        mask[i, :len(e)] = 1
    score = mask.bool().clone()
    score[torch.arange(len(encoded)), mask.sum(1) - 1] = False  # as the benchmark's scoring: no last position
    return CalibrationBatch(ids.to(device), mask.to(device), score.to(device), len(encoded), int(score.sum()))


def _tokenizer(model):
    from transformers import AutoTokenizer
    path = getattr(model, "name_or_path", "") or ""
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many types; the user needs one line
        raise RecipeError(f"mixed calibrates on text and needs the checkpoint's tokenizer, which was not given "
                          f"and cannot be loaded from '{path}' ({type(e).__name__})", field="recipe",
                          accepted="a model loaded from a local directory that holds its tokenizer") from None


# --- measuring: full passes, suffix runs --------------------------------------------------------

def logprobs(model, batch: CalibrationBatch):
    """[positions, vocab] fp32 next-token log-probs at the scored positions."""
    import torch
    logits = model(input_ids=batch.ids, attention_mask=batch.mask, use_cache=False).logits
    return torch.log_softmax(logits[batch.score].float(), dim=-1)


def kld(ref, var) -> float:
    """docs/metrics.md's KLD (measure/accuracy.py); a candidate whose output is not finite fits no budget (inf).
    The reference is checked finite once, when it is captured (SensitivityProbe)."""
    import torch

    from ..measure.accuracy import kld_summary
    if not bool(torch.isfinite(var).all()):
        return math.inf
    return kld_summary(ref, var)["mean"]


def _kl_rows(p, plogp, var):
    """KL(ref ‖ var) per position as accuracy.kl_divergence_per_position computes it (rows renormalised
    in float64), for the sensitivity runs' hot loop: p = the reference's probabilities and plogp =
    Σ p·log p (p > 0) come precomputed, so a run costs one log-softmax and one dot product per row."""
    import torch
    lv = torch.log_softmax(var.double(), dim=-1).clamp_min_(-1e300)  # a -inf where p = 0 adds 0, not NaN
    kl = (plogp - torch.einsum("pv,pv->p", p, lv)).clamp_min(0.0)
    return torch.nan_to_num(kl, nan=math.inf)


@functools.cache
def _replay_type():
    from torch import nn

    class Replay(nn.Module):
        """Stands in for a decoder layer below the one being measured: returns layer i-1's captured
        output (feed[0]) without computing anything; other attributes read through to the real layer."""

        def __init__(self, layer, feed: list):
            super().__init__()
            self.__dict__["layer"], self.__dict__["feed"] = layer, feed  # not a submodule

        def forward(self, *args, **kwargs):
            return self.feed[0]

        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.__dict__["layer"], name)

    return Replay


class SensitivityProbe:
    """The original model's reference log-probs and captured activations, and the two measurements
    the search makes with them: the full-batch KLD and one linear's sensitivity (suffix runs)."""

    def __init__(self, model, layers: dict, batches: list[CalibrationBatch], sensitivity_batches: int):
        import torch

        self.model, self.batches, self.runs, self.layers_run = model, batches, 0, 0
        self.stack, self.index = _decoder_stack(model, layers)
        captured = [[] for _ in self.stack]
        keep = [True]
        hooks = [layer.register_forward_hook(lambda m, a, out, i=i: captured[i].append(out) if keep[0] else None)
                 for i, layer in enumerate(self.stack)]
        try:
            refs = []
            for b, batch in enumerate(batches):
                keep[0] = b < sensitivity_batches
                refs.append(logprobs(model, batch).cpu())
        finally:
            for h in hooks:
                h.remove()
        self.captured = captured  # [layer][sensitivity batch]: that layer's output
        self.ref = torch.cat(refs)  # compared on the host every pass: copied once
        bad = (~torch.isfinite(self.ref).all(-1)).nonzero()
        if len(bad):
            raise RecipeError(f"mixed calibrates against the model in its compute dtype, whose logits are not finite "
                              f"from calibration position {int(bad[0, 0])} on", field="options.compute_dtype",
                              accepted="a compute dtype in which the checkpoint's outputs stay finite (bf16, fp32)")
        self.sens_ref = []  # [(p, Σ p·log p)] per sensitivity batch, in float64
        for r in refs[:sensitivity_batches]:
            lr = torch.log_softmax(r.double(), dim=-1)
            p = lr.exp()
            self.sens_ref.append((p, torch.where(p > 0, p * lr, 0.0).sum(-1)))

    def release_activations(self) -> None:
        self.captured, self.sens_ref = None, None

    def kld(self) -> float:
        """KLD of the model as it is now, on every calibration text."""
        import torch
        return kld(self.ref, torch.cat([logprobs(self.model, b).cpu() for b in self.batches]))

    def sensitivity(self, name: str) -> float:
        """KLD of the model as it is now, where only linear `name` differs from the original, on the
        sensitivity texts: decoder layers below `name`'s replay their captured outputs."""
        import torch
        start = self.index.get(name, 0)
        feed, kls = [None], []
        with _replaying(self.stack, start, feed):
            for b, (p, plogp) in enumerate(self.sens_ref):
                feed[0] = self.captured[start - 1][b] if start else None
                kls.append(_kl_rows(p, plogp, logprobs(self.model, self.batches[b]).cpu()))
        self.runs += 1
        self.layers_run += len(self.stack) - start
        return float(torch.cat(kls).mean())


def _decoder_stack(model, layers: dict):
    """(the ModuleList of decoder layers that holds the targets, {target: index of its layer}).

    Targets outside it (or a model without one) get no index: their runs start from the embeddings."""
    from torch import nn

    best, index = [], {}
    for path, m in model.named_modules():
        if not isinstance(m, nn.ModuleList):
            continue
        found = {name: int(name[len(path) + 1:].split(".")[0]) for name in layers
                 if name.startswith(f"{path}.") and name[len(path) + 1:].split(".")[0].isdigit()}
        if len(found) > len(index):
            best, index = m, found
    return best, index


@contextmanager
def _replaying(stack, start: int, feed: list):
    saved = [stack[j] for j in range(start)]
    try:
        for j in range(start):
            stack[j] = _replay_type()(saved[j], feed)
        yield
    finally:
        for j in range(start):
            stack[j] = saved[j]
