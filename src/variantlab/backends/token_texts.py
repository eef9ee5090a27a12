"""Token texts: how an OpenAI-compatible endpoint names a token (the strings of `logprobs.tokens` and the keys
of `top_logprobs`), as our server writes them and as the scoring tracker spells a local variant's vocabulary,
so that an endpoint's top-k log-probabilities are matched to the baseline's ids by text.

Each id is decoded alone, special tokens spelled out ("<s>", as vLLM and llama.cpp's server write them),
spaces left as they are (no clean-up). Two ids may read alike (the partial UTF-8 bytes of a byte-level
vocabulary all read "\ufffd"): the comparison groups ids by text (measure/accuracy.token_groups).
"""
from __future__ import annotations

from typing import Iterable


def token_texts(tokenizer, ids: Iterable[int]) -> list[str]:
    """The text of each id, decoded alone (module doc)."""
    return tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)


def vocabulary_texts(tokenizer, size: int = 0) -> list[str]:
    """The text of every id of the vocabulary; ids past the tokenizer's (a model's padded vocabulary) read ""."""
    known = len(tokenizer)
    return token_texts(tokenizer, range(known)) + [""] * max(0, size - known)
