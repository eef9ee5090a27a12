"""In-process PyTorch backend: greedy decoding with a KV cache, timed per token.

The decode loop is our own (prefill, then one token per forward with transformers' DynamicCache)
so that the harness adds no more than a clock read and a list append per token; the bare loop in
benchmarks/harness_overhead.py is the same loop without them. The host reads its clock only
after `.item()` / `.tolist()`, which synchronise the device, so a token time is when the token
was really available.

Generation stops at the tokenizer's EOS token or at any token whose text holds a newline (answers
are one line). The stop token counts as an output token: it was computed and costs a forward pass.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from ..measure.records import RequestRecord
from .base import Capabilities, Clock, ScoredText


def stop_token_ids(tokenizer) -> frozenset[int]:
    """EOS plus every vocabulary entry whose decoded text contains a newline."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for tok_id in range(len(tokenizer)):
        if "\n" in tokenizer.decode([tok_id]):
            ids.add(tok_id)
    return frozenset(ids)


class TorchBackend:
    capabilities = Capabilities(batching=True, token_timestamps=True, scoring=True, token_input=True)

    def __init__(self, model, tokenizer, device: str, tokenizer_id: str, clock: Clock = time.perf_counter):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.tokenizer_id = tokenizer_id
        self.clock = clock
        self.stop_ids = stop_token_ids(tokenizer)
        self._stop_mask = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=self.device)
        self._stop_mask[[i for i in self.stop_ids if i < model.config.vocab_size]] = True

    # ------------------------------------------------------------------ single request

    def _encode(self, prompt: str) -> torch.Tensor:
        ids = self.tokenizer(prompt, add_special_tokens=True, return_tensors="pt").input_ids
        return ids.to(self.device)

    def generate(self, request_id: str, prompt: str, max_new_tokens: int) -> RequestRecord:
        send = self.clock()
        return self._generate(request_id, self._encode(prompt), max_new_tokens, send, self.stop_ids)

    def generate_ids(self, request_id: str, token_ids: Sequence[int], max_new_tokens: int,
                     stop: bool = True) -> RequestRecord:
        """A request given as token ids (a prompt of an exact length); stop=False decodes all max_new_tokens."""
        send = self.clock()
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        return self._generate(request_id, ids, max_new_tokens, send, self.stop_ids if stop else frozenset())

    @torch.inference_mode()
    def _generate(self, request_id: str, ids: torch.Tensor, max_new_tokens: int, send: float,
                  stop: frozenset[int]) -> RequestRecord:
        clock, model = self.clock, self.model                   # ids: (1, T)
        cache = DynamicCache()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        next_id = logits[:, -1].argmax(-1, keepdim=True)       # (1, 1)
        tokens: list[int] = []
        times: list[float] = []
        for _ in range(max_new_tokens):
            tok = next_id.item()                                # synchronises the device
            times.append(clock())
            tokens.append(tok)
            if tok in stop or len(tokens) == max_new_tokens:
                break
            logits = model(input_ids=next_id, past_key_values=cache, use_cache=True).logits
            next_id = logits[:, -1].argmax(-1, keepdim=True)
        end = clock()
        return RequestRecord(request_id, send, end, tuple(times), ids.shape[1], self._text(tokens))

    def _text(self, tokens: list[int]) -> str:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return text.split("\n", 1)[0]

    # ------------------------------------------------------------------ batches

    @torch.inference_mode()
    def generate_batch(self, request_ids: Sequence[str], prompts: Sequence[str],
                       max_new_tokens: int) -> list[RequestRecord]:
        clock, model = self.clock, self.model
        send = clock()
        tok = self.tokenizer
        tok.padding_side = "left"
        enc = tok(list(prompts), add_special_tokens=True, return_tensors="pt", padding=True)
        ids = enc.input_ids.to(self.device)                     # (B, T), left-padded
        mask = enc.attention_mask.to(self.device)               # (B, T)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)                # positions skip the padding
        batch = ids.shape[0]
        cache = DynamicCache()
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                       past_key_values=cache, use_cache=True).logits
        next_ids = logits[:, -1].argmax(-1)                     # (B,)
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        out_tokens: list[list[int]] = [[] for _ in range(batch)]
        out_times: list[list[float]] = [[] for _ in range(batch)]
        ends = [send] * batch
        last_pos = pos[:, -1:]
        for step in range(max_new_tokens):
            host_ids = next_ids.tolist()                        # synchronises the device
            now = clock()
            host_done = done.tolist()
            for b in range(batch):
                if not host_done[b]:
                    out_tokens[b].append(host_ids[b])
                    out_times[b].append(now)
                    ends[b] = now
            done = done | self._stop_mask[next_ids]
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
            last_pos = last_pos + 1
            logits = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=last_pos,
                           past_key_values=cache, use_cache=True).logits
            next_ids = logits[:, -1].argmax(-1)
        n_in = enc.attention_mask.sum(-1).tolist()
        return [RequestRecord(rid, send, ends[b], tuple(out_times[b]), int(n_in[b]), self._text(out_tokens[b]))
                for b, rid in enumerate(request_ids)]

    # ------------------------------------------------------------------ teacher-forced scoring

    @torch.inference_mode()
    def score(self, texts: Sequence[str]) -> list[ScoredText]:
        out = []
        for text in texts:
            ids = self._encode(text)
            logits = self.model(input_ids=ids).logits[0, :-1].float()      # (T-1, V)
            logprobs = torch.log_softmax(logits, dim=-1)
            out.append(ScoredText(logprobs.cpu().numpy().astype(np.float32),
                                  ids[0, 1:].cpu().numpy().astype(np.int64), len(text.encode("utf-8"))))
        return out
