"""The baseline's reference file (measure/reference.py): written text by text, read back mapped, exactly; an
incomplete one, or one for other texts, is not used."""
from __future__ import annotations

import json

import numpy as np
import pytest

from variantlab.measure.reference import (HEADER, LOGPROBS, ReferenceMissing, ReferenceWriter, open_reference,
                                          reference_bytes)

TEXTS = ["one text", "another, longer text", "x"]


def write(folder, vocab=7, seed=0, vocabulary=None):
    rng = np.random.default_rng(seed)
    rows = []
    w = ReferenceWriter(folder, TEXTS, "SomeTokenizer")
    for n in (4, 6, 1):                               # the last text has one token: no row
        ids = tuple(int(i) for i in rng.integers(0, vocab, n))
        lp = rng.standard_normal((n - 1, vocab)).astype(np.float32)
        w.add(ids, 3 * n, lp)
        rows.append((ids, lp))
    return w.finish(12.5, "texts-fp", vocabulary), rows


def test_a_reference_reads_back_every_row_exactly_and_says_which_it_is(tmp_path):
    ref_id, rows = write(tmp_path, vocabulary=[f"t{i}" for i in range(7)])
    ref = open_reference(tmp_path, TEXTS)
    assert ref.id == ref_id and ref.vocab == 7 and ref.positions == 3 + 5
    assert ref.nll_nats == 12.5 and ref.tokenizer_class == "SomeTokenizer" and ref.text_fingerprint == "texts-fp"
    for i, (ids, lp) in enumerate(rows):
        assert ref.texts[i].ids == ids and ref.texts[i].n_bytes == 3 * len(ids)
        assert np.array_equal(ref.rows(i), lp) and ref.rows(i).dtype == np.float32
        assert np.array_equal(ref.targets(i), np.asarray(ids[1:]))
    assert ref.vocabulary() == [f"t{i}" for i in range(7)]
    assert (tmp_path / LOGPROBS).stat().st_size == reference_bytes(ref.positions, ref.vocab)
    again, _ = write(tmp_path / "again", vocabulary=[f"t{i}" for i in range(7)])
    assert again == ref_id                            # the id is the content's: the same reference, the same id


def test_no_reference_is_used_that_is_missing_incomplete_or_for_other_texts(tmp_path):
    with pytest.raises(ReferenceMissing, match="no baseline reference in"):
        open_reference(tmp_path)
    write(tmp_path)
    with pytest.raises(ReferenceMissing, match="for other evaluation texts"):
        open_reference(tmp_path, TEXTS[:2])
    with pytest.raises(ReferenceMissing, match="no token texts"):
        open_reference(tmp_path).vocabulary()
    with open(tmp_path / LOGPROBS, "r+b") as f:       # a file cut short (a disk that filled up)
        f.truncate(40)
    with pytest.raises(ReferenceMissing, match="incomplete"):
        open_reference(tmp_path, TEXTS)
    header = json.loads((tmp_path / HEADER).read_text())
    (tmp_path / HEADER).write_text(json.dumps(header | {"format": 99}))
    with pytest.raises(ReferenceMissing, match="another format"):
        open_reference(tmp_path)


def test_a_reference_being_written_again_is_not_read_until_it_is_whole(tmp_path):
    write(tmp_path)
    w = ReferenceWriter(tmp_path, TEXTS, "SomeTokenizer")     # the header goes first: half a reference is none
    with pytest.raises(ReferenceMissing):
        open_reference(tmp_path)
    with pytest.raises(ValueError, match="for a text of 3 tokens"):
        w.add((1, 2, 3), 9, np.zeros((1, 7), np.float32))
    w.abandon()
