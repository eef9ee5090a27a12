"""Stop rules (backends/stopping.py) against the naive definition: decode the whole output after
every token and look for the stop strings. No model: token sequences are written or drawn at random,
over the shipped byte-level tokenizer (every non-ASCII character is one token per byte, so partial
UTF-8 pieces are everywhere) and over a SentencePiece-style one (Metaspace, byte fallback).
"""
from __future__ import annotations

import random

import pytest
from conftest import SHIPPED_MODEL_DIR, build_tokenizer

from variantlab.backends.base import FINISH_LENGTH, FINISH_STOP
from variantlab.backends.stopping import REPLACEMENT, RequestStop, Vocabulary, build_spec

TEXTS = [
    "héllo wörld 日本語\nQ: what? A: 42 🎉 — naïve",
    "order_id: ORD-5493\ncustomer: Priya Nguyen\nstatus: pending\nQ: What is the status?\nA: pending",
    "日本 é! 🎉🎉 café\n\nA:本",
]
STOPS = [("\n",), ("?",), (" ",), ("A:",), ("é",), ("本",), ("é!",), ("🎉",), ("\nQ:", "x"), ("ing\n", "?"),
         (" w",), ("日本語\n",), ("status",)]


def naive_first_stop(tok, tokens: list[int], stops, eos=frozenset(), limit: int | None = None):
    """(number of tokens, finish reason) by the definition: the whole text decoded after each token."""
    for n in range(1, len(tokens) + 1):
        text = tok.decode(tokens[:n], skip_special_tokens=True)
        if tokens[n - 1] in eos or any(s in text for s in stops):
            return n, FINISH_STOP
        if n == limit:
            return n, FINISH_LENGTH
    return None, None


def fast_first_stop(vocab, tokens: list[int], stops, eos=frozenset(), limit: int | None = None):
    rule = RequestStop(build_spec(vocab, stops, eos), vocab, limit or 10**9)
    for tok in tokens:
        reason = rule.finish(tok)
        if reason is not None:
            return rule.n, reason
    return None, None


def metaspace_tokenizer():
    """A SentencePiece-style tokenizer: "▁" marks a word start, the text's first space is dropped
    when decoding, and characters without a piece fall back to one <0xNN> token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["▁hello", "▁world", "▁", "Q", ":", "A", "▁Q", "▁A", "\n", "h", "e", "l", "o", "w", "r",
             "d", "x", "▁x", "▁日本", ".", "a", "▁a"]
    vocab = ([("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(f"<0x{i:02X}>", -10.0) for i in range(256)]
             + [(w, -1.0) for w in words])
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def whole_e_byte_fallback_tokenizer():
    """Byte fallback without Metaspace, where "é" is one whole token (Gemma-like): encoding "é" finds no
    lead byte, yet <0xC3> followed by "\n" decodes to replacement characters, swallowing the newline."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    vocab = ([("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(f"<0x{i:02X}>", -10.0) for i in range(256)]
             + [(c, -1.0) for c in "abcdefghij Q:é\n"] + [("ab", -0.5)])
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def shipped_tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(SHIPPED_MODEL_DIR)


TOKENIZERS = {"shipped": shipped_tokenizer, "conftest-bpe": build_tokenizer, "metaspace": metaspace_tokenizer,
              "whole-e-byte-fallback": whole_e_byte_fallback_tokenizer}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tok_vocab(request):
    tok = TOKENIZERS[request.param]()
    return tok, Vocabulary(tok)


def sequences(tok, n_random: int = 150, seed: int = 0) -> list[list[int]]:
    """The texts' own tokens, their suffixes (starting mid-character), and random splices of them
    with special tokens and stray byte pieces mixed in."""
    rng = random.Random(seed)
    encoded = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    out = [list(e) for e in encoded] + [e[k:] for e in encoded for k in (1, 2, 3)]
    pool = sorted({i for e in encoded for i in e})
    specials = list(tok.all_special_ids)
    for _ in range(n_random):
        seq: list[int] = []
        while len(seq) < 40:
            r = rng.random()
            if r < 0.6:
                e = rng.choice(encoded)
                k = rng.randrange(len(e))
                seq += e[k:k + rng.randint(1, 6)]
            elif r < 0.8:
                seq.append(rng.choice(pool))
            elif r < 0.9:
                seq.append(rng.choice(specials))
            else:
                seq.append(rng.randrange(len(tok)))
        out.append(seq)
    return out


# ------------------------------------------------------------------------------------ the vocabulary

def test_pieces_join_to_the_decoded_text_of_whole_characters(tok_vocab):
    tok, vocab = tok_vocab
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        if not any(i in vocab.partial for i in ids):
            assert "".join(vocab.pieces[i] for i in ids[1:]) == tok.decode(ids)[len(tok.decode(ids[:1])):]
    ascii_ids = tok.encode("status: pending", add_special_tokens=False)
    assert not any(i in vocab.partial for i in ascii_ids)


def test_partial_pieces_are_the_ids_that_decode_to_a_replacement_character(tok_vocab):
    tok, vocab = tok_vocab
    assert vocab.partial == {i for i in range(len(tok)) if REPLACEMENT in vocab.pieces[i]}
    split = [i for i in tok.encode("日", add_special_tokens=False) if i in vocab.partial]
    assert split   # every tokenizer here spells 日 with byte pieces, or has it whole (metaspace: ▁日本)
    assert vocab.decode_run(split) == "日"


def test_metaspace_pieces_keep_their_leading_space():
    tok = metaspace_tokenizer()
    vocab = Vocabulary(tok)
    world = tok.convert_tokens_to_ids("▁world")
    assert tok.decode([world]) == "world" and vocab.pieces[world] == " world"


def test_id_sets_are_exact_for_byte_level_but_not_for_byte_fallback():
    assert Vocabulary(shipped_tokenizer()).sets_exact and Vocabulary(build_tokenizer()).sets_exact
    tok = metaspace_tokenizer()
    # byte fallback: "?" spelled as a byte token after an unfinished character becomes U+FFFD
    lead, q = tok.convert_tokens_to_ids(["<0xC3>", "<0x3F>"])
    assert tok.decode([q]) == "?" and tok.decode([lead, q]) == REPLACEMENT * 2
    assert not Vocabulary(tok).sets_exact


def test_a_lead_byte_before_a_newline_does_not_stop_where_it_swallows_it():
    from variantlab.backends.stopping import RequestStop, Vocabulary, build_spec
    tok = whole_e_byte_fallback_tokenizer()
    vocab = Vocabulary(tok)
    assert not vocab.sets_exact
    a, lead, nl = (tok.convert_tokens_to_ids(t) for t in ("a", "<0xC3>", "<0x0A>"))
    assert "\n" not in tok.decode([a, lead, nl])
    spec = build_spec(vocab, ("\n",), frozenset())
    row = RequestStop(spec, vocab if spec.needs_text else None, 10)
    assert [row.finish(x) for x in (a, lead, nl)] == [None, None, None]


def test_a_single_character_becomes_the_ids_that_contain_it(tok_vocab):
    tok, vocab = tok_vocab
    ids = vocab.ids_containing("\n")
    assert ids == {i for i in range(len(tok)) if "\n" in tok.decode([i], skip_special_tokens=True)}
    spec = build_spec(vocab, ("\n",), frozenset({tok.eos_token_id}))
    assert spec.ids == ids | {tok.eos_token_id}
    assert spec.needs_text == (not vocab.sets_exact)   # ASCII: the set alone decides, unless bytes get swallowed
    assert build_spec(vocab, ("本",), frozenset()).needs_text               # non-ASCII may span pieces
    assert build_spec(vocab, ("A:",), frozenset()).needs_text


def test_the_vocabulary_covers_a_model_vocabulary_padded_past_the_tokenizer():
    tok = build_tokenizer()
    vocab = Vocabulary(tok, size=len(tok) + 8)
    assert len(vocab.pieces) == len(tok) + 8 and vocab.pieces[-1] == ""


def test_empty_stop_strings_are_refused():
    with pytest.raises(ValueError, match="empty"):
        build_spec(None, ("",), frozenset())


# ------------------------------------------------------------------------------------ against the definition

def test_first_stop_equals_decoding_everything_every_token(tok_vocab):
    tok, vocab = tok_vocab
    checked = hits = 0
    for seq in sequences(tok):
        for stops in STOPS:
            expected = naive_first_stop(tok, seq, stops)
            assert fast_first_stop(vocab, seq, stops) == expected, (seq, stops, tok.decode(seq))
            checked += 1
            hits += expected[0] is not None
    assert hits > checked // 4   # the stop strings do occur, often mid-sequence


def test_eos_and_max_new_tokens(tok_vocab):
    tok, vocab = tok_vocab
    eos = frozenset({tok.eos_token_id})
    seq = tok.encode("hello world", add_special_tokens=False)
    assert fast_first_stop(vocab, seq + [tok.eos_token_id], (), eos) == (len(seq) + 1, FINISH_STOP)
    assert fast_first_stop(vocab, seq + [tok.eos_token_id] + seq, ()) == (None, None)   # EOS off: just a token
    assert fast_first_stop(vocab, seq, (), eos, limit=2) == (2, FINISH_LENGTH)
    assert fast_first_stop(vocab, seq, ("\n",), eos, limit=1) == (1, FINISH_LENGTH)
    # the stop rule wins over the length rule on the same token
    nl = tok.encode("\n", add_special_tokens=False)
    assert fast_first_stop(vocab, seq[:1] + nl, ("\n",), eos, limit=len(nl) + 1)[1] == FINISH_STOP


def test_only_wake_ids_end_a_request_while_no_run_is_open(tok_vocab):
    """A loop may run on without asking the rules after a token outside their wake set while no run is open
    (TorchEngine.collect's native calls): on every sequence and stop set, such a token never ends the request.
    Where only an id set decides, the wake set is that id set."""
    tok, vocab = tok_vocab
    eos = frozenset({tok.eos_token_id})
    quiet = ended = 0
    for seq in sequences(tok):
        for stops in STOPS:
            rule = RequestStop(build_spec(vocab, stops, eos), vocab, 10**9)
            for t in seq:
                skippable = not rule.run_open and t not in rule.wake
                why = rule.finish(t)
                assert why is None or not skippable, (seq, stops, t, tok.decode(seq))
                quiet += skippable
                if why is not None:
                    ended += 1
                    break
    assert quiet > 2000 and ended > 500
    assert build_spec(vocab, ("\n",), eos).wake == build_spec(vocab, ("\n",), eos).ids or not vocab.sets_exact
    assert build_spec(vocab, (), eos).wake == eos
