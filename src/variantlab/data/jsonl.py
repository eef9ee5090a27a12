"""Loading a user's dataset: one JSON object per line with string fields 'prompt' and 'answer'.

Other fields are kept as they are. Blank lines are skipped, and so is a UTF-8 byte-order mark.
Every problem raises ``DatasetError`` naming the file, the line (``field="line 7: answer"``) and
what would be accepted — a line that is not UTF-8 too, so that its number is known. With
``skip_bad_lines`` a bad line is skipped instead and reported back (`SkippedLine`): a scraped file
with a few broken lines among thousands can still be measured, and the run says what it left out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from variantlab.errors import DatasetError

ACCEPTED = "a JSON object per line with string fields 'prompt' and 'answer'"
REQUIRED_FIELDS = ("prompt", "answer")
# A record is a prompt and its answer: past 16 MiB a line is not one (and reading it whole would hold it in memory).
MAX_LINE_BYTES = 16 * 2**20
SKIP_HINT = "; or --skip-bad-lines to skip such lines"
BOM = "\ufeff"


@dataclass(frozen=True)
class SkippedLine:
    line_number: int
    reason: str      # the DatasetError's detail: "invalid JSON (…)", "missing field 'answer'"

    def __str__(self) -> str:
        return f"line {self.line_number}: {self.reason}"


@dataclass(frozen=True)
class JsonlDataset:
    records: list[dict]
    skipped: tuple[SkippedLine, ...] = ()


def parse_record(text: str, file: str, line_number: int) -> dict:
    """One non-blank line → its record, or a DatasetError saying what is wrong with it."""
    where = f"line {line_number}"
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"invalid JSON ({exc.msg} at column {exc.colno})",
                           file=file, field=where, accepted=ACCEPTED) from None
    except RecursionError:
        raise DatasetError("invalid JSON (nested too deeply)", file=file, field=where, accepted=ACCEPTED) from None
    except ValueError as exc:   # json's own limits: an integer of more than 4,300 digits
        raise DatasetError(f"invalid JSON ({str(exc).split(':')[0]})", file=file, field=where,
                           accepted=ACCEPTED) from None
    if not isinstance(record, dict):
        raise DatasetError(f"expected a JSON object, got {type(record).__name__}",
                           file=file, field=where, accepted=ACCEPTED)
    for name in REQUIRED_FIELDS:
        if name not in record:
            raise DatasetError(f"missing field '{name}'", file=file, field=f"{where}: {name}",
                               accepted=ACCEPTED)
        if not isinstance(record[name], str):
            raise DatasetError(f"field '{name}' must be a string, got "
                               f"{type(record[name]).__name__}",
                               file=file, field=f"{where}: {name}", accepted=ACCEPTED)
        try:
            record[name].encode("utf-8")
        except UnicodeEncodeError:   # "\ud800" is valid JSON but no text: the tokenizer would fail on it later
            raise DatasetError(f"field '{name}' holds an unpaired surrogate escape such as \\ud800, which is no text",
                               file=file, field=f"{where}: {name}", accepted=ACCEPTED) from None
    if not record["prompt"].strip():
        raise DatasetError("field 'prompt' is empty", file=file, field=f"{where}: prompt", accepted=ACCEPTED)
    return record


def _lines(handle: BinaryIO) -> Iterator[bytes | None]:
    """The file's lines as bytes; None for a line longer than MAX_LINE_BYTES (read past, never held)."""
    while True:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := handle.readline(2**20)) and not rest.endswith(b"\n"):
                pass
            yield None
            continue
        yield line


def _record(raw: bytes | None, file: str, line_number: int) -> dict | None:
    """The record of one line, None for a blank one; DatasetError for a bad one."""
    where = f"line {line_number}"
    if raw is None:
        raise DatasetError(f"line longer than {MAX_LINE_BYTES // 2**20} MiB", file=file, field=where,
                           accepted=ACCEPTED)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})", file=file,
                           field=where, accepted=ACCEPTED) from None
    if line_number == 1:
        text = text.removeprefix(BOM)
    return parse_record(text, file, line_number) if text.strip() else None


def read_jsonl(path: str | Path, limit: int | None = None, *, skip_bad_lines: bool = False) -> JsonlDataset:
    """The first `limit` good records of a JSONL dataset (all when None), validated line by line.

    Without `skip_bad_lines` the first bad line raises (its error says the flag exists); with it every bad
    line is skipped and listed, and only a file with no good record at all raises."""
    file = str(path)
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be 0 or more, got {limit}", file=file,
                           accepted="a non-negative integer or None")
    try:
        handle = Path(path).open("rb")
    except FileNotFoundError:
        raise DatasetError("file not found", file=file, accepted=ACCEPTED) from None
    except OSError as exc:
        raise DatasetError(f"cannot read file ({exc.strerror})", file=file,
                           accepted=ACCEPTED) from None
    except ValueError as exc:   # a NUL byte in the path
        raise DatasetError(f"cannot read file ({exc})", file=file, accepted=ACCEPTED) from None
    records: list[dict] = []
    skipped: list[SkippedLine] = []
    with handle:
        try:
            for line_number, raw in enumerate(_lines(handle), start=1):
                if limit is not None and len(records) >= limit:
                    break
                try:
                    record = _record(raw, file, line_number)
                except DatasetError as e:
                    if not skip_bad_lines:
                        raise DatasetError(e.detail, file=file, field=e.field, accepted=ACCEPTED + SKIP_HINT) from None
                    skipped.append(SkippedLine(line_number, e.detail))
                    continue
                if record is not None:
                    records.append(record)
        except OSError as exc:   # a folder, or the disk failing mid-read
            raise DatasetError(f"cannot read file ({exc.strerror or type(exc).__name__})", file=file,
                               accepted=ACCEPTED) from None
    if not records and limit != 0:
        if skipped:
            raise DatasetError(f"no good records: every one of its {len(skipped)} non-blank lines is bad "
                               f"({summarize_skipped(skipped)})", file=file, accepted=ACCEPTED)
        raise DatasetError("no records (the file is empty or has only blank lines)", file=file,
                           accepted=ACCEPTED)
    return JsonlDataset(records, tuple(skipped))


def load_jsonl(path: str | Path, limit: int | None = None) -> list[dict]:
    """The first `limit` records of a JSONL dataset (all when None); the first bad line raises."""
    return read_jsonl(path, limit).records


def summarize_skipped(skipped, shown: int = 3) -> str:
    """'line 4: invalid JSON (…), line 9: missing field 'answer', and 5 more' — the first few, for one line."""
    parts = [str(s) for s in skipped[:shown]]
    if len(skipped) > shown:
        parts.append(f"and {len(skipped) - shown} more")
    return ", ".join(parts)
