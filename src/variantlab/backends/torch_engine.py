"""In-process PyTorch engine: one greedy, KV-cached decode loop that streams every token as it lands.

`stream` runs B >= 1 requests together (nanochat's "stream first; batching wraps the stream"): a
batch of one is the single-request case, with no padding and no attention mask, so the hot path
is a forward, an argmax and one host read per token. B > 1 left-pads the prompts and passes an
attention mask and position ids that skip the padding. Prefill, then one token per forward with
transformers' DynamicCache. Per step the host reads the new tokens once (`.tolist()`, which
synchronises the device), then the clock once, then yields a TokenEvent for each request still
running, so a token's time is when it was really available. Rows that finished keep computing in
the batch until every row has finished (and yield nothing more).

`run_requests` takes a single request through `collect` instead: the same prefill, steps, clock reads
and stop rules, the tokens and times kept in two lists, nothing yielded between tokens (the measured
path; a generator, an event and the consumer's loop there slowed each step of the tiny reference model
by 2-3%, more than their own Python: benchmarks/harness_overhead.py). Where variantlab's decode step runs
the whole model, collect's tokens after the first come from C++ calls (`DecodeStep.run`) that return to Python
only at a token after which the stop rules might end the request: 0.67-0.69x the per-token time of the Python
loop on the tiny reference model.

The steps run in inference mode, entered per step and never held across a yield, so the caller's
code between tokens keeps its own autograd mode; a caller that already runs in inference mode (the
measuring worker should) saves that toggle. On the shipped 0.65 ms/token model the toggle, like any
other Python work per token, costs a measurable fraction of a percent.

Stop rules belong to the request (backends/stopping.py: EOS, stop strings, max_new_tokens); the
engine has no stop habits of its own. The first request with stop strings decodes the vocabulary
once (`vocabulary`; a few ms for 1k ids), so let a warm-up request carry the same stop strings.
The naive reference this loop is tested against (no cache, the whole sequence each step) lives in
tests/backends/test_torch_engine.py, with transformers' own `generate`;
benchmarks/harness_overhead.py measures what the loop costs over a bare one.
"""
from __future__ import annotations

import contextlib
import inspect
import time
import types
from typing import Iterator, Sequence

import numpy as np
import torch
from .base import Capabilities, Clock, Collected, GenerationRequest, NonFiniteLogits, ScoredText, TokenEvent
from .kv_cache import KVCaches
from .stopping import RequestStop, Vocabulary
from .tokenized import TokenizerText, eos_ids
from ..variants.weight_arena import settle


class TorchEngine:
    """The Backend protocol (backends/base.py) over a transformers causal LM and its tokenizer."""

    capabilities = Capabilities(batching=True, token_timestamps=True, scoring=True, token_input=True)

    def __init__(self, model, tokenizer, device: str, tokenizer_id: str = "", clock: Clock = time.perf_counter,
                 static_cache: bool = True, compile_step: bool = False, decode_step: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.vocabulary_source = "checkpoint"    # base.IdScoring: a variant of the suite's own checkpoint
        self.tokenizer_class = type(tokenizer).__name__
        self.device = torch.device(device)
        # decode streams every weight a token: on the CPU they move into one huge-page mapping first
        self.settled = settle(model) if self.device.type == "cpu" else None
        self.tokenizer_id = tokenizer_id
        self.clock = clock
        self.text = TokenizerText(tokenizer, eos_ids(tokenizer, getattr(model, "generation_config", None)),
                                  getattr(getattr(model, "config", None), "vocab_size", 0))
        self.eos_ids = self.text.eos_ids
        self.pad_id = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
        self.caches = KVCaches(model, static=static_cache)   # static_cache=False: the growing reference
        self._decode = self._forward
        self.native_loop = True   # collect's C++ calls where they run (False: its Python loop always)
        self._masks: dict[int, tuple[frozenset[int], torch.Tensor]] = {}
        # variantlab's decode step (variants/decode_step.py) where it runs this model; else transformers' forward
        self.step, self.step_note = None, None
        if decode_step and self.caches.static:
            self._use_decode_step()
        if compile_step:
            self.compile_decode_step()
        # the LM head runs for the last position only (prefill's other positions predict nothing we use)
        self._last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}

    # ------------------------------------------------------------------ text (backends/tokenized.py)

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with the special tokens the tokenizer adds (BOS)."""
        return self.text.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids, special tokens dropped: what stop strings are matched against."""
        return self.text.decode(token_ids)

    @property
    def vocabulary(self) -> Vocabulary:
        return self.text.vocabulary

    def stop_rules(self, req) -> RequestStop:
        """A request's stop rules (EOS, stop strings, max_new_tokens), checked per token: `finish(token)`."""
        return self.text.stop_rules(req)

    # ------------------------------------------------------------------ generation

    def stream(self, requests: Sequence[GenerationRequest]) -> Iterator[TokenEvent]:
        """Greedy-decode `requests` together; yield each token (in request order per step) as it lands."""
        if not requests:
            return
        rows, n_in, cache, nxt, host, mask, pos = self._prefill(requests)
        if mask is None:                                  # one request (a batch has a mask)
            yield from self._one(rows[0].finish, host[0][0], n_in[0], nxt, cache)
            return
        clock, step, no_autograd = self.clock, self._step, torch.inference_mode()
        finish = [row.finish for row in rows]
        running = list(range(len(rows)))
        prompt_tokens: list[int] | None = n_in           # on each request's first event only
        while True:
            now = clock()
            still = []
            for b in running:
                tok = host[b][0]
                why = finish[b](tok)
                yield TokenEvent(b, tok, now, why, None if prompt_tokens is None else prompt_tokens[b])
                if why is None:
                    still.append(b)
            running, prompt_tokens = still, None
            if not running:
                return
            # Inference mode is held per step, never across a yield (the caller's code between tokens
            # keeps its own mode); a caller that already runs in it (the worker) saves the toggle.
            if torch.is_inference_mode_enabled():
                nxt, host, mask, pos = step(nxt, cache, mask, pos)
            else:
                with no_autograd:
                    nxt, host, mask, pos = step(nxt, cache, mask, pos)

    def collect(self, request: GenerationRequest) -> Collected:
        """One request run to its end with nothing yielded between tokens: `run_requests`'s path for a single
        request. The same steps, clock reads and stop rules as `stream`; a token's time is still read when
        its id is on the host. Where variantlab's decode step runs the whole model (a plan) and the clock is
        time.perf_counter, the tokens after the first come from C++ calls (`DecodeStep.run`: the step, the
        read-back, the clock and a check against the stop rules' wake set per token, no Python between
        tokens), each call running until a token after which the rules might end the request (one with an id
        set alone: until the end); the rules then take its tokens in order, off the clock. `native_loop` False:
        never. Else, between two steps only the clock, the stop rules and two list appends run in Python. Each
        layer of Python there slowed the next step of the tiny reference model by more than its own cost
        (benchmarks/harness_overhead.py)."""
        rows, n_in, cache, nxt, host, _, _ = self._prefill([request])
        rule, clock, decode = rows[0], self.clock, self._decode
        finish = rule.finish
        tok = host[0][0]
        tokens, times = [tok], [clock()]
        why = finish(tok)
        with contextlib.nullcontext() if torch.is_inference_mode_enabled() else torch.inference_mode():
            native = why is None and self.native_loop and decode is self.step and clock is time.perf_counter
            wake = self._mask(rule.wake) if native else None
            while native and why is None:
                steps = 1 if rule.run_open else rule.remaining
                got = self.step.run(nxt, cache, steps, wake)
                if got is None:            # a cache the step does not take: the Python loop
                    break
                tokens += got[0]
                times += got[1]
                why = self._replay(rule, got[0], steps)
                nxt = torch.tensor([got[0][-1:]])
            while why is None:
                nxt = decode(nxt, cache, None, None)
                tok = nxt.item()                          # synchronises the device
                times.append(clock())
                tokens.append(tok)
                why = finish(tok)
        return Collected(tokens, times, why, n_in[0])

    def _mask(self, ids: frozenset[int]) -> torch.Tensor | None:
        """`ids` as a bool [V] tensor (None when empty), made once per id set: what ends a native call."""
        if not ids:
            return None
        got = self._masks.get(id(ids))
        if got is None or got[0] is not ids:
            size = max(max(ids) + 1, self.model.get_output_embeddings().out_features)
            mask = torch.zeros(size, dtype=torch.bool)
            mask[list(ids)] = True
            got = self._masks[id(ids)] = (ids, mask)
        return got[1]

    @staticmethod
    def _replay(rule: RequestStop, new: list[int], steps: int) -> str | None:
        """The stop rules given the tokens a native call chose, in order: its finish reason, or None when it ended
        at a token after which the rules go on. Only its last token may end the request, and it may end short of
        `steps` only at a token of the rules' wake set: otherwise the call and the rules disagree (an error)."""
        why, i = None, 0
        for i, tok in enumerate(new):
            why = rule.finish(tok)
            if why is not None:
                break
        last = len(new) - 1
        if i != last or (why is None and len(new) < steps and new[-1] not in rule.wake):
            raise RuntimeError(f"the native decode loop ended at token {len(new)} of {steps} where the request's stop "
                               f"rules end it at {i + 1 if why else 'none'}: the loop and the rules disagree")
        return why

    def _prefill(self, requests: Sequence[GenerationRequest]):
        """The prompts' forward: (stop rules, prompt lengths, cache, next tokens (B, 1), their host copy, mask and
        positions (None for one request))."""
        rows = [self.stop_rules(r) for r in requests]
        prompts = [list(r.prompt_ids) if r.prompt_ids is not None else self.encode(r.prompt) for r in requests]
        if any(not p for p in prompts):
            raise ValueError("a prompt must have at least one token")
        n_in = [len(p) for p in prompts]
        total = max(n_in) + max(r.max_new_tokens for r in requests)
        cache = self.caches.acquire(len(prompts), total)
        no_autograd = torch.inference_mode()
        with no_autograd:
            if len(prompts) == 1:
                ids = torch.tensor(prompts, dtype=torch.long, device=self.device)        # (1, T)
                mask = pos = None
            else:
                ids, pad = self._left_pad(prompts)                                      # (B, T) each
                pos = (pad.cumsum(-1) - 1).clamp(min=0)                                 # positions skip the padding
                mask = pad
                if self.caches.static:   # one mask for the whole request: the causal mask hides the future
                    mask = pad.new_ones(pad.shape[0], self.caches.length_for(total))   # (B, cache length)
                    mask[:, :pad.shape[1]] = pad
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                                use_cache=True, **self._last).logits
            if pos is not None:
                pos = pos[:, -1:]                                                       # (B, 1)
            last = logits[:, -1]                                                        # (B, V)
            nxt = last.argmax(-1, keepdim=True)                                         # (B, 1)
            host = nxt.tolist()                                      # [[id] * B]; synchronises the device
            finite = bool(torch.isfinite(last).all())               # once a request, after that sync
        if not finite:
            raise NonFiniteLogits(f"NaN or inf logits after the prompt of {len(prompts)} request(s) "
                                  f"({max(n_in)} tokens): the variant's answers would be argmax of garbage")
        return rows, n_in, cache, nxt, host, mask, pos

    def _one(self, finish, tok: int, n_in: int, nxt, cache) -> Iterator[TokenEvent]:
        """The events of one request from its first token on: `stream`'s loop without the batch's bookkeeping
        (a list of requests still running, masks, positions), since at one request a token costs the harness
        its Python alone (benchmarks/harness_overhead.py)."""
        clock, decode, inference = self.clock, self._decode, torch.inference_mode()
        now = clock()
        why = finish(tok)
        yield TokenEvent(0, tok, now, why, n_in)
        while why is None:
            if torch.is_inference_mode_enabled():     # as in stream: held per step, never across a yield
                nxt = decode(nxt, cache, None, None)
                tok = nxt.item()                      # synchronises the device
            else:
                with inference:
                    nxt = decode(nxt, cache, None, None)
                    tok = nxt.item()
            now = clock()
            why = finish(tok)
            yield TokenEvent(0, tok, now, why, None)

    def _step(self, nxt, cache, mask, pos):
        """One decode step: the last tokens (B, 1) in, the next tokens (B, 1) and their host copy out."""
        if mask is not None:
            if not self.caches.static:   # the growing reference: one more position a step
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)        # (B, T + steps)
            pos = pos + 1
        nxt = self._decode(nxt, cache, mask, pos)
        return nxt, nxt.tolist(), mask, pos                                             # .tolist() synchronises

    def _use_decode_step(self) -> None:
        from ..variants.decode_step import DecodeStep

        step = DecodeStep.for_model(self.model)
        if isinstance(step, str):
            self.step_note = f"variantlab's decode step does not run this model ({step}): transformers' forward runs"
            return
        step.fallback = self._forward
        self.step, self._decode = step, step

    def compile_decode_step(self) -> bool:
        """torch.compile (inductor, static shapes) the decode step: model call and greedy choice, over the
        preallocated cache; one graph per (batch, cache length). False when the model keeps cache layers
        of its own (no static cache, so no static shapes): nothing is compiled."""
        if not self.caches.static:
            return False
        self.step = None            # compiling is of transformers' modules: their forward, not our step
        # Guards on the model's modules are skipped: checking every parameter cost 0.9 ms a step here
        # (0.2 ms without). torch.compile keeps its graphs per code object, so this engine's step gets
        # a code object of its own: another engine's graph, for another model, can never be reused.
        forward = self._forward.__func__
        own = types.FunctionType(forward.__code__.replace(co_name=f"_forward_{id(self):x}"), forward.__globals__,
                                 forward.__name__, forward.__defaults__, forward.__closure__)
        self._decode = torch.compile(types.MethodType(own, self), dynamic=False, options={
            "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
        return True

    def _forward(self, nxt, cache, mask, pos):
        """The decode step's model call and greedy choice, on the device: what `compile_step` compiles."""
        logits = self.model(input_ids=nxt, attention_mask=mask, position_ids=pos, past_key_values=cache,
                            use_cache=True, **self._last).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, prompts))
        ids = [[self.pad_id] * (width - len(p)) + p for p in prompts]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
        return (torch.tensor(ids, dtype=torch.long, device=self.device),
                torch.tensor(mask, dtype=torch.long, device=self.device))

    # ------------------------------------------------------------------ teacher-forced scoring

    @torch.inference_mode()
    def score(self, texts: Sequence[str]) -> list[ScoredText]:
        """Log-probabilities of every next token of each text; see base.ScoredText for n_bytes."""
        return [self.score_ids(*self._predicted(text)) for text in texts]

    @torch.inference_mode()
    def score_ids(self, ids: Sequence[int], n_bytes: int) -> ScoredText:
        """Log-probabilities of every next token of one text given as token ids (`n_bytes`: its predicted bytes)."""
        ids = list(ids)
        if ids:
            t = torch.tensor([ids], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=t).logits[0, :-1].float()                   # (T-1, V)
        else:
            vocab_size = getattr(getattr(self.model, "config", None), "vocab_size", 0)
            logits = torch.zeros(0, vocab_size, device=self.device)
        finite = torch.isfinite(logits).all(-1)                                       # (T-1,)
        first_bad = None if bool(finite.all()) else int((~finite).nonzero()[0, 0])
        logprobs = torch.log_softmax(logits, dim=-1)
        return ScoredText(logprobs.cpu().numpy(), np.asarray(ids[1:], dtype=np.int64),    # float32 already: no copy
                          tuple(ids), n_bytes, first_bad)

    def _predicted(self, text: str) -> tuple[list[int], int]:
        return self.text.predicted(text)
