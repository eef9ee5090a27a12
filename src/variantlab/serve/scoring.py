"""Prompt scoring on the serving engine: OpenAI's legacy `echo: true, logprobs: K, max_tokens: 0` (or 1).

A `ScoreRequest` is the prompt's token ids, K and the variant; the engine thread runs it between steps
(serve/engine.py; in a routed worker, serve/worker.py) through `score_prompt`: one teacher-forced forward
of the variant's model over the prompt, as the bench engine's `TorchEngine.score` runs it (float32
log-softmax of every position), and the next token's distribution too. `PromptScores` carries per
position the log-probability of the token that came and the K most likely ids with theirs; with
max_tokens 1, the one generated token (greedy at temperature 0, else sampled as the engine samples,
serve/sampling.py) and its position's top K. The HTTP app turns ids into token texts
(backends/token_texts.py) and writes OpenAI's `choices[0].logprobs` (serve/protocol.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from .sampling import SamplingParams, choose


@dataclass(frozen=True)
class ScoreRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    top_k: int                            # 0 … protocol.TOPK_MAX
    variant: str | None = None            # None: the engine's first lane (scoring runs the model asked for)
    generate: int = 0                     # 0, or 1: the next token too (max_tokens 1)
    sampling: SamplingParams = SamplingParams()


@dataclass(frozen=True)
class PromptScores:
    """What a ScoreRequest gets back. Positions are 1 … T-1 of the prompt (the first token has none), then
    the generated token's when there is one: `logprobs[i]` is its token's, `top[i]` its K (id, logprob)
    pairs, most likely first. `error` set: the scoring failed, and nothing else is."""

    request_id: str
    variant: str
    prompt_ids: tuple[int, ...] = ()
    generated: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    top: tuple[tuple[tuple[int, float], ...], ...] = ()
    error: str | None = None


def score_prompt(engine, request: ScoreRequest, variant: str) -> PromptScores:
    """The request scored on `engine` (a TorchEngine: its model and device), under torch.inference_mode."""
    import torch
    ids = list(request.prompt_ids)
    t = torch.tensor([ids], dtype=torch.long, device=engine.device)
    logprobs = torch.log_softmax(engine.model(input_ids=t).logits[0].float(), dim=-1)        # (T, V)
    if not bool(torch.isfinite(logprobs).all()):
        bad = int((~torch.isfinite(logprobs).all(-1)).nonzero()[0, 0])
        return PromptScores(request.request_id, variant, error=f"NaN or inf logits from position {bad}")
    generated: list[int] = []
    if request.generate:
        params = request.sampling
        generated = choose(logprobs[-1:], [params], [params.generator()])
    targets = torch.tensor(ids[1:] + generated, dtype=torch.long, device=logprobs.device)
    rows = logprobs[:len(targets)]                                                          # (P, V)
    chosen = rows.gather(1, targets[:, None])[:, 0].tolist()
    k = min(request.top_k, rows.shape[1])
    values, top_ids = rows.topk(k, dim=-1) if k else (rows[:, :0], rows[:, :0].long())
    top = tuple(tuple(zip(i, v)) for i, v in zip(top_ids.tolist(), values.tolist()))
    return PromptScores(request.request_id, variant, tuple(ids), tuple(generated), tuple(chosen), top)
