"""Streamed text (serve/detok.py): deltas never contain a stop string or half a character, and join to
the final text."""
from __future__ import annotations

from variantlab.serve.detok import TextStream


def pieces_decoder(pieces):
    """Tokens are indices into `pieces`; bytes that only make sense together decode as one character."""
    def decode(ids):
        raw = b"".join(pieces[i] for i in ids)
        return raw.decode("utf-8", errors="replace")
    return decode


def test_deltas_hold_back_a_possible_stop_string_and_cut_before_it():
    pieces = [b"Hello", b" wor", b"ld", b"\nEN", b"D", b" more"]
    s = TextStream(pieces_decoder(pieces), stop=("\nEND",))
    deltas = [s.push(i) for i in range(5)]
    assert deltas == ["Hello", " wor", "ld", "", ""]
    assert s.finish() == "" and s.text == "Hello world"


def test_a_held_tail_that_does_not_become_a_stop_string_is_sent_later():
    pieces = [b"a", b"\nE", b"x"]
    s = TextStream(pieces_decoder(pieces), stop=("\nEND",))
    assert [s.push(0), s.push(1), s.push(2)] == ["a", "", "\nEx"]


def test_half_a_character_is_never_sent():
    e_acute = "é".encode()
    pieces = [b"caf", e_acute[:1], e_acute[1:], b"!"]
    s = TextStream(pieces_decoder(pieces))
    deltas = [s.push(i) for i in range(4)]
    assert deltas == ["caf", "", "é", "!"] and "".join(deltas) + s.finish() == "café!"
