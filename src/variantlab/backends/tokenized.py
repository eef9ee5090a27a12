"""The text side of an engine that runs on token ids with a Hugging Face tokenizer: encode, decode, the stop
rules each request carries (backends/stopping.py), and which bytes of a text teacher forcing predicts.

Our torch engine and the llama.cpp backend (fed the checkpoint tokenizer's ids) share it, so that both split
a prompt, stop a request and count bits per byte identically: their rows compare token for token.
"""
from __future__ import annotations

from typing import Sequence

from .stopping import RequestStop, StopSpec, Vocabulary, build_spec


def eos_ids(tokenizer, generation_config=None) -> frozenset[int]:
    """The tokenizer's EOS and the generation config's (an id or a list of ids)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = getattr(generation_config, "eos_token_id", None)
    if isinstance(gen, int):
        ids.add(gen)
    elif gen is not None:
        ids.update(int(i) for i in gen)
    return frozenset(ids)


class TokenizerText:
    def __init__(self, tokenizer, eos: frozenset[int], vocab_size: int = 0):
        self.tokenizer = tokenizer
        self.tokenizer_class = type(tokenizer).__name__
        self.eos_ids = eos
        self.vocab_size = vocab_size
        self._vocab: Vocabulary | None = None
        self._specs: dict[tuple[tuple[str, ...], bool], StopSpec] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with the special tokens the tokenizer adds (BOS)."""
        return self.tokenizer(text, add_special_tokens=True).input_ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids, special tokens dropped: what stop strings are matched against."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    @property
    def vocabulary(self) -> Vocabulary:
        """Every id's text, decoded on first use and kept: what stop-string checks read."""
        if self._vocab is None:
            self._vocab = Vocabulary(self.tokenizer, self.vocab_size)
        return self._vocab

    def stop_rules(self, req) -> RequestStop:
        """A request's stop rules (EOS, stop strings, max_new_tokens), checked per token: `finish(token)`."""
        key = (req.stop, req.stop_on_eos)
        if key not in self._specs:
            vocab = self.vocabulary if req.stop else None
            self._specs[key] = build_spec(vocab, req.stop, self.eos_ids if req.stop_on_eos else frozenset())
        spec = self._specs[key]
        return RequestStop(spec, self.vocabulary if spec.needs_text else None, req.max_new_tokens)

    def predicted(self, text: str) -> tuple[list[int], int]:
        """Token ids of text, and the UTF-8 bytes of it that teacher forcing predicts.

        Every token but the first is predicted. A BOS (or other special) first token covers no
        text, so every byte is; otherwise the first token's text is never predicted, and its end
        offset says where the predicted text starts. (A first character split over several byte
        tokens counts whole as not predicted: at most 3 bytes too few, once per text.)"""
        total = len(text.encode("utf-8"))
        special = self.tokenizer.all_special_ids
        if not getattr(self.tokenizer, "is_fast", False):   # no offsets: the first token's text, re-decoded
            ids = self.encode(text)
            if not ids or ids[0] in special:
                return ids, total
            return ids, max(0, total - len(self.decode(ids[:1]).encode("utf-8")))
        enc = self.tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
        ids, offsets = enc.input_ids, enc.offset_mapping
        if not ids or ids[0] in special:
            return ids, total
        return ids, len(text[offsets[0][1]:].encode("utf-8"))
