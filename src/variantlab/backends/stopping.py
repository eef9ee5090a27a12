"""Stop rules checked per generated token, cheaply: a set lookup, and for longer stop strings a
search in a few characters of text.

A request stops at EOS (when stop_on_eos), at the first token after which its generated text
contains one of its stop strings, or at max_new_tokens (base.GenerationRequest). "Generated text"
is `tokenizer.decode(tokens, skip_special_tokens=True)`, what run_requests reports, and the tests
check these rules against exactly that, decoded in full after every token. Doing so in the decode
loop would cost more than the harness may (1% of a token's time), so the vocabulary is decoded once
per tokenizer (`Vocabulary`, kept by the engine) and:

- a single-character stop string becomes the set of ids whose text contains it;
- longer stop strings are searched in a rolling tail: the last len(longest stop) - 1 characters of
  the text so far, plus the new token's text. An occurrence that was not there before ends inside
  the new text, so it starts at most len(stop) - 1 characters earlier: the tail holds it.

Why this is exact, and where it is not. Both rules need the text of a sequence to be the texts of
its tokens joined. Byte-level BPE (GPT-2, Llama 3, Qwen, our shipped tokenizer) decodes by joining
the tokens' bytes and decoding UTF-8, replacing what is invalid, so a token whose bytes are whole
characters reads the same wherever it stands after a character boundary. A *partial* piece, whose
bytes are part of a character (the shipped tokenizer spells every non-ASCII character with one
token per byte), decodes alone to U+FFFD and with its neighbours to the real character. So a
partial piece opens a *run*: from it on, tokens are gathered and decoded together by the tokenizer
itself (exact) until the run's text ends in a whole character; then it joins the tail and the cheap
path resumes. The text's first token is decoded the same way, as it reads at the start of a text.

- ASCII single characters: a partial piece cannot complete one (an ASCII byte is a whole
  character), and byte-level decoding never swallows an ASCII byte into a replacement, so the id
  set is exact, and a request with only such stop strings follows no text at all (the hot path of
  the dataset's "\\n"). SentencePiece's byte fallback does swallow: a run of <0xNN> tokens that is
  not valid UTF-8 becomes one U+FFFD per byte, ASCII bytes included; `Vocabulary` probes for that
  (and for pieces that read differently at the start of a text) and then follows the text, trusting
  an id-set hit only where no run is open.
- Non-ASCII stop strings may be completed by a run, so a run searches every stop string.
- Pieces are decoded after a fixed anchor token, its text removed, so that a tokenizer that drops
  the leading space of a text's first token (Metaspace) gives each token its mid-text reading.

Not exact: decoders that rewrite text across tokens (`clean_up_tokenization_spaces` turns " ."
into "."), a stop string holding U+FFFD, and a run of more than MAX_RUN tokens that never ends in a
whole character (it is cut there, to bound the cost of decoding it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .base import FINISH_LENGTH, FINISH_STOP

REPLACEMENT = "\ufffd"
MAX_RUN = 16   # tokens of one open run decoded together at most


class Vocabulary:
    """Every token id's text, decoded once: what stop checks read instead of calling the tokenizer."""

    def __init__(self, tokenizer, size: int = 0):
        self.tokenizer = tokenizer
        known = len(tokenizer)
        n = max(known, size)                   # a model's vocabulary may be padded past the tokenizer's
        self.anchor = _anchor(tokenizer)
        self._cut = len(tokenizer.decode(self.anchor, skip_special_tokens=True))
        texts = tokenizer.batch_decode([self.anchor + [i] for i in range(known)], skip_special_tokens=True)
        self.pieces: list[str] = [t[self._cut:] for t in texts] + [""] * (n - known)
        self.partial = frozenset(i for i, p in enumerate(self.pieces) if REPLACEMENT in p)
        self.sets_exact = self._sets_exact(known)
        self._sets: dict[str, frozenset[int]] = {}

    def _sets_exact(self, known: int) -> bool:
        """Whether an id set alone decides an ASCII stop string: every piece reads the same at the
        start of a text, and no partial piece swallows an ASCII piece that follows it."""
        alone = self.tokenizer.batch_decode([[i] for i in range(known)], skip_special_tokens=True)
        if alone != self.pieces[:known]:
            return False
        # Probe with pieces the vocabulary itself marks partial (lead bytes of a byte-fallback vocabulary),
        # not with an encoded character: where "é" is one whole token, encoding it finds no lead byte.
        leads = sorted(self.partial)[:4]
        ascii_ids = [i for i, p in enumerate(self.pieces) if len(p) == 1 and p.isascii()]
        return all(self.pieces[i] in self.decode_run([lead, i]) for lead in leads for i in ascii_ids)

    def ids_containing(self, char: str) -> frozenset[int]:
        """Ids whose text contains `char` (cached per character)."""
        if char not in self._sets:
            self._sets[char] = frozenset(i for i, p in enumerate(self.pieces) if char in p)
        return self._sets[char]

    def decode_run(self, ids: Sequence[int], start: bool = False) -> str:
        """Text of `ids` decoded together, as it reads mid-text (or at the start of a text)."""
        if start:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return self.tokenizer.decode(self.anchor + list(ids), skip_special_tokens=True)[self._cut:]


def _anchor(tokenizer) -> list[int]:
    """One ordinary token whose text stays the same when more text follows it, or none (then pieces
    are decoded alone). Its own text may differ from its mid-text reading ("▁a" reads "a" first)."""
    ids = tokenizer.encode("a", add_special_tokens=False)
    if len(ids) == 1:
        one = tokenizer.decode(ids, skip_special_tokens=True)
        if one and REPLACEMENT not in one and tokenizer.decode(ids * 2, skip_special_tokens=True).startswith(one):
            return ids
    return []


@dataclass(frozen=True)
class StopSpec:
    """The stop rules of requests with the same stop strings and stop_on_eos: built once, shared."""

    eos: frozenset[int]           # EOS ids (empty when EOS does not stop)
    ids: frozenset[int]           # EOS and the ids holding a single-character stop string
    stops: tuple[str, ...]        # every stop string (searched while a run is open)
    long_stops: tuple[str, ...]   # stop strings of 2+ characters (searched in the tail every token)
    keep: int                     # characters of text the tail keeps: len(longest stop) - 1
    needs_text: bool              # whether the text must be followed (else the id set is exact)
    wake: frozenset[int]          # the ids after which `finish` may end the request (wake_ids)


def build_spec(vocab: Vocabulary | None, stop: Sequence[str], eos_ids: frozenset[int]) -> StopSpec:
    """Stop rules for the stop strings `stop`, and `eos_ids` (empty when EOS does not stop)."""
    if any(not s for s in stop):
        raise ValueError("stop strings must not be empty")
    stops = tuple(dict.fromkeys(stop))
    if not stops:
        return StopSpec(eos_ids, eos_ids, (), (), 0, False, eos_ids)
    ids = frozenset(eos_ids.union(*(vocab.ids_containing(s) for s in stops if len(s) == 1)))
    long_stops = tuple(s for s in stops if len(s) > 1)
    needs_text = bool(long_stops) or not all(s.isascii() for s in stops) or not vocab.sets_exact
    return StopSpec(eos_ids, ids, stops, long_stops, max(map(len, stops)) - 1, needs_text,
                    wake_ids(vocab, ids, stops) if needs_text else ids)


def wake_ids(vocab: Vocabulary, ids: frozenset[int], stops: Sequence[str]) -> frozenset[int]:
    """The ids after which a request's stop rules can end it, where the text is followed: the id set (EOS,
    single-character stops), every partial piece (it opens a run, decoded with its neighbours), and every piece
    holding the last character of a stop string (an occurrence that was not in the text before ends inside the
    new token's text). After any other token, while no run is open, `finish` answers None until the limit: a loop
    may run on without asking it, provided it later gives `finish` every token, in order (TorchEngine.collect)."""
    return ids.union(vocab.partial, *(vocab.ids_containing(s[-1]) for s in stops))


class RequestStop:
    """One request's stop rules while it runs: the id set, the text's tail when it must be followed,
    max_new_tokens. `finish` runs once per generated token, so it is written for few lookups."""

    __slots__ = ("ids", "eos", "wake", "limit", "n", "follow", "vocab", "pieces", "partial", "stops", "long_stops",
                 "keep", "tail", "run", "started")

    def __init__(self, spec: StopSpec, vocab: Vocabulary | None, max_new_tokens: int):
        self.ids, self.eos, self.wake, self.limit = spec.ids, spec.eos, spec.wake, max_new_tokens
        self.n = 0                       # tokens so far
        self.follow = spec.needs_text    # else the id set alone decides
        self.vocab = vocab
        self.pieces = vocab.pieces if vocab is not None else []
        self.partial = vocab.partial if vocab is not None else frozenset()
        self.stops, self.long_stops, self.keep = spec.stops, spec.long_stops, spec.keep
        self.tail = ""            # the last `keep` characters of the text settled so far
        self.run: list[int] = []  # tokens being decoded together (an open run)
        self.started = False      # whether any text has been settled (until then, tokens start the text)

    @property
    def remaining(self) -> int:
        """Tokens the request may still generate."""
        return self.limit - self.n

    @property
    def run_open(self) -> bool:
        """Whether tokens are being gathered to be decoded together (then every token needs `finish` at once)."""
        return bool(self.run) or (self.follow and not self.started)

    def finish(self, token_id: int) -> str | None:
        """Count one token; its finish reason if it is the request's last, else None."""
        self.n += 1
        if not self.follow:
            if token_id in self.ids:
                return FINISH_STOP
        elif self.run or not self.started or token_id in self.partial:
            if token_id in self.eos or self._push_run(token_id):
                return FINISH_STOP
        else:                     # settled text, a whole-character piece: the id set is exact here
            if token_id in self.ids:
                return FINISH_STOP
            text = self.tail + self.pieces[token_id]
            self.tail = text[-self.keep:] if self.keep else ""
            for s in self.long_stops:
                if s in text:
                    return FINISH_STOP
        return FINISH_LENGTH if self.n >= self.limit else None

    def _push_run(self, token_id: int) -> bool:
        """Decode the open run with this token together: the text's first token as it reads at the
        start of a text (Metaspace drops its leading space there), a partial piece with the tokens
        that complete it. Every stop string is searched."""
        self.run.append(token_id)
        text = self.vocab.decode_run(self.run, start=not self.started)
        window = self.tail + text
        hit = any(s in window for s in self.stops)
        if (text and not text.endswith(REPLACEMENT)) or len(self.run) >= MAX_RUN:
            self.tail = window[-self.keep:] if self.keep else ""
            self.run.clear()
            self.started = True
        return hit
