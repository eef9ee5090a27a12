"""llama.cpp as a backend: a GGUF run in this process through llama-cpp-python's C API, greedy, on token ids.

It streams like our torch engine (backends/torch_engine.py): B >= 1 requests together, each its own sequence
in one llama.cpp context (a unified KV cache, as llama-server batches), prefilled in one `llama_decode` with
logits at each prompt's last position, then one token per sequence per `llama_decode`. After each decode the
host reads the logits of every running sequence, takes the argmax (the first maximum, as torch's argmax), reads
the clock once, and yields a TokenEvent per sequence: a token's time is when it was on the host. Stop rules
belong to the request and are checked by the same code as the torch engine's (backends/tokenized.py).

Token ids: a GGUF built from the suite's checkpoint is fed the checkpoint tokenizer's ids (the baseline's), so
prompts, answers and teacher-forced positions are the baseline's own and every token-level row compares; a
user's GGUF whose vocabulary differs runs on its own tokenizer (variants/gguf_model.GGUFTokenizer).

Scoring decodes a whole text with logits at every position (teacher forcing), as `TorchEngine.score` does.
The context is made when first needed and made again, larger, when a batch needs more sequences or positions
than it holds (its KV cache is what llama.cpp allocates; the memory tracker sees it).
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator, Sequence

import numpy as np

from ..variants.gguf_model import GGUFTokenizer, llama, load_model
from .base import Capabilities, Clock, GenerationRequest, NonFiniteLogits, ScoredText, TokenEvent
from .tokenized import TokenizerText

CTX_ROUND = 256      # positions: a context is sized up to a multiple of this
MAX_BATCH = 512      # tokens one llama_decode takes at most (llama.cpp's default n_batch)


def p_batch(positions: int, seqs: int) -> int:
    """The batch a context of `positions` for `seqs` sequences decodes at once: every sequence's next token."""
    return max(min(positions, MAX_BATCH), seqs)


class LlamaCppBackend:
    """The Backend protocol (backends/base.py) over a GGUF file and a tokenizer whose ids it takes."""

    capabilities = Capabilities(batching=True, token_timestamps=True, scoring=True, token_input=True)
    op_name = "llama.cpp::llama_decode"      # what `explain` times each llama_decode call as (explain/profiling.py)

    def __init__(self, gguf_path, text: TokenizerText | None, threads: int, tokenizer_id: str = "",
                 clock: Clock = time.perf_counter):
        """`text`: the checkpoint tokenizer whose ids the GGUF takes; None: the GGUF's own vocabulary."""
        self.L = llama()
        self.model = load_model(gguf_path)
        self.vocabulary_source = "checkpoint" if text is not None else "own"    # base.IdScoring
        if text is None:
            own = GGUFTokenizer(self.model)
            text = TokenizerText(own, frozenset({own.eos_token_id}))
        self.text = text
        self.tokenizer_class = text.tokenizer_class
        self.tokenizer_id = tokenizer_id
        self.threads = threads
        self.clock = clock
        self.n_vocab = int(self.L.llama_vocab_n_tokens(self.L.llama_model_get_vocab(self.model)))
        self.ctx = None
        self._seqs = self._positions = 0
        self._batch, self._batch_size = None, 0
        self.op_range = contextlib.nullcontext    # explain's profiler swaps in a record_function range

    def close(self) -> None:
        if self._batch is not None:
            self.L.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx is not None:
            self.L.llama_free(self.ctx)
            self.ctx = None
        if self.model is not None:
            self.text = None          # the GGUF's own tokenizer reads the model's vocabulary: not after this
            self.L.llama_model_free(self.model)
            self.model = None

    # ------------------------------------------------------------------ text

    def encode(self, text: str) -> list[int]:
        return self.text.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.text.decode(token_ids)

    # ------------------------------------------------------------------ the context

    def _context(self, seqs: int, positions: int):
        """A context holding `seqs` sequences and `positions` positions in all, cleared, and a batch of n_batch."""
        L = self.L
        if self.ctx is None or seqs > self._seqs or positions > self._positions:
            if self.ctx is not None:
                L.llama_free(self.ctx)
            self._seqs = max(seqs, self._seqs)
            self._positions = max(self._positions, -(-positions // CTX_ROUND) * CTX_ROUND)
            p = L.llama_context_default_params()
            p.n_ctx = self._positions
            p.n_batch = p.n_ubatch = p_batch(self._positions, self._seqs)
            p.n_seq_max = self._seqs
            p.kv_unified = True
            p.n_threads = p.n_threads_batch = self.threads
            p.no_perf = True
            self.ctx = L.llama_init_from_model(self.model, p)
            if not self.ctx:
                raise RuntimeError(f"llama.cpp could not make a context of {self._positions} positions for "
                                   f"{self._seqs} sequences")
        else:
            L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        if self._batch_size < p_batch(self._positions, self._seqs):
            if self._batch is not None:
                L.llama_batch_free(self._batch)
            self._batch_size = p_batch(self._positions, self._seqs)
            self._batch = L.llama_batch_init(self._batch_size, 0, 1)
        return self.ctx

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) entries, in chunks of n_batch."""
        L, b, step = self.L, self._batch, self._batch_size
        for start in range(0, len(entries), step):
            chunk = entries[start:start + step]
            for j, (tok, pos, seq, logits) in enumerate(chunk):
                b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, pos, 1, logits
                b.seq_id[j][0] = seq
            b.n_tokens = len(chunk)
            with self.op_range():
                rc = L.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} (a batch of {len(chunk)} tokens)")

    def _logits(self, i: int) -> np.ndarray:
        """The logits of the last decode's token `i` (its index in the batch, which must have asked for logits)."""
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    # ------------------------------------------------------------------ generation

    def stream(self, requests: Sequence[GenerationRequest]) -> Iterator[TokenEvent]:
        """Greedy-decode `requests` together, one sequence each; yield each token (in request order per step)."""
        if not requests:
            return
        finish = [self.text.stop_rules(r) for r in requests]
        prompts = [list(r.prompt_ids) if r.prompt_ids is not None else self.encode(r.prompt) for r in requests]
        if any(not p for p in prompts):
            raise ValueError("a prompt must have at least one token")
        n_in = [len(p) for p in prompts]
        self._context(len(prompts), sum(n + r.max_new_tokens for n, r in zip(n_in, requests)))
        outputs = dict(enumerate(self._choose(self._prefill(prompts), n_in)))
        clock, running, pos = self.clock, list(range(len(prompts))), list(n_in)
        prompt_tokens: list[int] | None = n_in
        while True:
            now = clock()
            still = []
            for s in running:
                why = finish[s].finish(outputs[s])
                yield TokenEvent(s, outputs[s], now, why, None if prompt_tokens is None else prompt_tokens[s])
                if why is None:
                    still.append(s)
            running, prompt_tokens = still, None
            if not running:
                return
            self._decode([(outputs[s], pos[s], s, True) for s in running])
            for s in running:
                pos[s] += 1
            rows = [self._logits(j) for j in range(len(running))]
            outputs = dict(zip(running, self._choose(rows, [pos[s] for s in running])))

    def _prefill(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """Each prompt decoded into its sequence; the logits of its last position. Prompts that fit one batch go
        in one decode; longer ones one sequence at a time, in chunks (the last chunk's last row kept)."""
        entries = [(tok, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, tok in enumerate(p)]
        if len(entries) <= self._batch_size:
            self._decode(entries)
            return [self._logits(j) for j, e in enumerate(entries) if e[3]]
        rows = []
        for s, p in enumerate(prompts):
            self._decode([(tok, pos, s, pos == len(p) - 1) for pos, tok in enumerate(p)])
            rows.append(self._logits(-1).copy())
        return rows

    def _choose(self, rows: list[np.ndarray], positions: list[int]) -> list[int]:
        """The greedy token of each logits row; NonFiniteLogits (the measurement fails) on NaN or inf."""
        chosen = []
        for row, n in zip(rows, positions):
            if not np.isfinite(row).all():
                raise NonFiniteLogits(f"NaN or inf logits at position {n}")
            chosen.append(int(row.argmax()))
        return chosen

    # ------------------------------------------------------------------ teacher-forced scoring

    def score(self, texts: Sequence[str]) -> list[ScoredText]:
        """Log-probabilities of every next token of each text; see base.ScoredText for n_bytes."""
        return [self.score_ids(*self.text.predicted(text)) for text in texts]

    def score_ids(self, ids: Sequence[int], n_bytes: int) -> ScoredText:
        """Log-probabilities of every next token of one text given as token ids (`n_bytes`: its predicted bytes)."""
        ids = list(ids)
        if len(ids) > 1:
            self._context(1, len(ids))
            logits = np.empty((len(ids) - 1, self.n_vocab), dtype=np.float32)
            step = self._batch_size
            for start in range(0, len(ids) - 1, step):
                chunk = list(range(start, min(start + step, len(ids) - 1)))
                self._decode([(ids[p], p, 0, True) for p in chunk])
                for j, p in enumerate(chunk):
                    logits[p] = self._logits(j)
        else:
            logits = np.zeros((0, self.n_vocab), dtype=np.float32)
        finite = np.isfinite(logits).all(-1)
        first_bad = None if finite.all() else int(np.flatnonzero(~finite)[0])
        shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
        logprobs = (shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))).astype(np.float32)
        return ScoredText(logprobs, np.asarray(ids[1:], dtype=np.int64), tuple(ids), n_bytes, first_bad)
