"""The baseline's reference: its teacher-forced next-token log-probabilities, kept once per run in a file.

KLD, top-1 agreement and the PPL ratio compare each variant's next-token distributions with the baseline's,
position by position. At a deployed vocabulary those distributions are large (3,200 positions × 151,936
tokens × 4 bytes = 1.9 GB), so they never travel in a record: as llama-perplexity's `--kl-divergence-base`
does, the baseline's are written once per run, by a job of their own before the rounds (measure/runner.py),
into a folder of the run, and every variant's worker compares its own distributions with them there, text by
text, and returns the figures only (measure/trackers/scoring.py). The orchestrator never holds an array.

The folder holds:
- `logprobs.f32`: every position's log-probabilities, float32, row-major (positions × vocabulary), the texts
  one after another, exactly as the baseline's backend computed them (KLD stays exact: nothing is truncated
  or rounded);
- `vocabulary.json` (only for a plan with an endpoint variant): every id's text, what an endpoint's top-k
  log-probabilities are matched by;
- `reference.json`, written last (so a folder without it is incomplete and is written again): the format,
  the vocabulary's size, each text's token ids as the baseline's tokenizer split it (what a variant with the
  checkpoint's vocabulary is scored on, so both sides see the same positions by construction) and its
  predicted bytes, the baseline's NLL, the split's fingerprints, and which texts these are (`texts_sha256`).

Reading maps the file (`numpy.memmap`): a text's rows are read when compared and dropped after.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

FORMAT = 1
HEADER = "reference.json"
LOGPROBS = "logprobs.f32"
VOCABULARY = "vocabulary.json"
ROW_DTYPE = np.float32


class ReferenceMissing(Exception):
    """No usable reference in a folder: absent, incomplete, of another format, or for other texts."""


def texts_digest(texts: Sequence[str]) -> str:
    """Which evaluation texts a reference is for."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


def ids_fingerprint(token_ids: Sequence[Sequence[int]]) -> str:
    """The token ids of every evaluation text, hashed: a split, whoever made it."""
    h = hashlib.sha256()
    for ids in token_ids:
        h.update(b"|" + ",".join(map(str, ids)).encode())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class RefText:
    ids: tuple[int, ...]        # the text's token ids, as the baseline split it
    n_bytes: int                # UTF-8 bytes of it that teacher forcing predicts
    start: int                  # its first row in logprobs.f32 (it has len(ids) - 1 rows)

    @property
    def rows(self) -> int:
        return max(0, len(self.ids) - 1)


@dataclass(frozen=True)
class Reference:
    """A reference, opened: its header read, its log-probabilities mapped (rows read on demand)."""

    folder: Path
    id: str                     # content address of the header: what a variant's figures were compared against
    vocab: int
    texts: tuple[RefText, ...]
    nll_nats: float
    tokenizer_class: str
    ids_fingerprint: str
    text_fingerprint: str | None
    has_vocabulary: bool

    @property
    def positions(self) -> int:
        return sum(t.rows for t in self.texts)

    def rows(self, i: int) -> np.ndarray:
        """Text i's log-probabilities, (len(ids) - 1, vocab) float32, read from the mapped file."""
        t = self.texts[i]
        if t.rows == 0:
            return np.zeros((0, self.vocab), dtype=ROW_DTYPE)
        return np.memmap(self.folder / LOGPROBS, dtype=ROW_DTYPE, mode="r", offset=t.start * self.vocab * 4,
                         shape=(t.rows, self.vocab))

    def targets(self, i: int) -> np.ndarray:
        return np.asarray(self.texts[i].ids[1:], dtype=np.int64)

    def vocabulary(self) -> list[str]:
        """Every id's text (a plan with an endpoint variant); ReferenceMissing when it was not written."""
        if not self.has_vocabulary:
            raise ReferenceMissing("the reference holds no token texts (written for a plan without an endpoint)")
        return json.loads((self.folder / VOCABULARY).read_text(encoding="utf-8"))


class ReferenceWriter:
    """Writes a reference text by text (`add`), then its header (`finish`); nothing is held but one text."""

    def __init__(self, folder: str | Path, texts: Sequence[str], tokenizer_class: str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / HEADER).unlink(missing_ok=True)      # incomplete until finish() writes it again
        self._texts_sha256 = texts_digest(texts)
        self._class = tokenizer_class
        self._file = open(self.folder / LOGPROBS, "wb")
        self._entries: list[dict] = []
        self._rows = 0
        self._vocab: int | None = None

    def add(self, ids: Sequence[int], n_bytes: int, logprobs: np.ndarray) -> None:
        """One text: its ids, predicted bytes and (len(ids) - 1, vocab) log-probabilities."""
        rows = np.ascontiguousarray(logprobs, dtype=ROW_DTYPE)
        if rows.ndim != 2 or rows.shape[0] != max(0, len(ids) - 1):
            raise ValueError(f"log-probabilities of shape {rows.shape} for a text of {len(ids)} tokens")
        if self._vocab is None:
            self._vocab = int(rows.shape[1])
        elif rows.shape[1] != self._vocab:
            raise ValueError(f"a text scored over {rows.shape[1]} tokens, the ones before over {self._vocab}")
        self._file.write(rows.tobytes())
        self._entries.append({"ids": [int(i) for i in ids], "n_bytes": int(n_bytes), "start": self._rows})
        self._rows += rows.shape[0]

    def finish(self, nll_nats: float, text_fingerprint: str | None = None,
               vocabulary: Sequence[str] | None = None) -> str:
        """Close the rows, write the vocabulary's texts (when given) and the header; the reference's id."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if vocabulary is not None:
            (self.folder / VOCABULARY).write_text(json.dumps(list(vocabulary), ensure_ascii=False), encoding="utf-8")
        header = {"format": FORMAT, "vocab": self._vocab or 0, "texts_sha256": self._texts_sha256,
                  "tokenizer_class": self._class, "nll_nats": nll_nats,
                  "ids_fingerprint": ids_fingerprint(e["ids"] for e in self._entries),
                  "text_fingerprint": text_fingerprint, "vocabulary": vocabulary is not None,
                  "texts": self._entries}
        body = json.dumps(header, sort_keys=True)
        header["id"] = hashlib.sha256(body.encode()).hexdigest()[:16]
        tmp = self.folder / (HEADER + ".partial")
        tmp.write_text(json.dumps(header), encoding="utf-8")
        tmp.replace(self.folder / HEADER)                   # a reader never sees half a header
        return header["id"]

    def abandon(self) -> None:
        self._file.close()


def open_reference(folder: str | Path, texts: Sequence[str] | None = None) -> Reference:
    """The reference in `folder` (for `texts`, when given); ReferenceMissing when there is none to use."""
    folder = Path(folder)
    try:
        h = json.loads((folder / HEADER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReferenceMissing(f"no baseline reference in {folder}") from None
    except (OSError, ValueError) as e:
        raise ReferenceMissing(f"the baseline reference in {folder} cannot be read ({type(e).__name__})") from None
    if not isinstance(h, dict) or h.get("format") != FORMAT:
        raise ReferenceMissing(f"the baseline reference in {folder} is of another format")
    if texts is not None and h["texts_sha256"] != texts_digest(texts):
        raise ReferenceMissing(f"the baseline reference in {folder} is for other evaluation texts")
    entries = tuple(RefText(tuple(e["ids"]), e["n_bytes"], e["start"]) for e in h["texts"])
    need = sum(t.rows for t in entries) * h["vocab"] * 4
    have = (folder / LOGPROBS).stat().st_size if (folder / LOGPROBS).is_file() else -1
    if have != need:
        raise ReferenceMissing(f"the baseline reference in {folder} is incomplete ({have} of {need} bytes)")
    return Reference(folder, h["id"], h["vocab"], entries, h["nll_nats"], h["tokenizer_class"], h["ids_fingerprint"],
                     h.get("text_fingerprint"), bool(h.get("vocabulary")))


def reference_bytes(positions: int, vocab: int) -> int:
    """The bytes a reference of `positions` positions over `vocab` tokens takes on disk (its rows)."""
    return positions * vocab * 4
