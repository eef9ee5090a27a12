"""A request's output text as it streams: decoded from all its tokens so far, cut before the first stop
string, and held back where the next token could still change it.

Decoding token by token is not exact (a character spelled over several byte tokens decodes to U+FFFD
until its last byte; backends/stopping.py), so the whole sequence is decoded again after each token
(at most a few hundred tokens a request: microseconds). What is sent is the text so far minus:
- a trailing U+FFFD (a character not finished yet);
- a tail that is the beginning of a stop string (it may become one; OpenAI never sends the stop
  sequence, so neither may a delta).
`finish()` gives the rest, cut before the stop string. The deltas joined equal the final text.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..backends.base import cut_at_stop

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self.decode, self.stop = decode, tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.sent = ""

    def push(self, token_id: int) -> str:
        """Add a token; the text that can be sent now (maybe "")."""
        self.tokens.append(token_id)
        text = self.decode(self.tokens)
        cut = cut_at_stop(text, self.stop)
        if len(cut) == len(text):       # no stop string yet: hold back what could begin one
            cut = cut[:len(cut) - self._held(cut)]
        while cut.endswith(REPLACEMENT):
            cut = cut[:-1]
        return self._advance(cut)

    def finish(self) -> str:
        """The rest of the text, cut before the first stop string."""
        return self._advance(self.text)

    @property
    def text(self) -> str:
        return cut_at_stop(self.decode(self.tokens), self.stop)

    def _held(self, text: str) -> int:
        """The longest tail of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _advance(self, cut: str) -> str:
        if not cut.startswith(self.sent) or len(cut) <= len(self.sent):
            return ""
        delta, self.sent = cut[len(self.sent):], cut
        return delta
