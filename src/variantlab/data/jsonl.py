"""Loading a user's dataset: one JSON object per line with string fields 'prompt' and 'answer'.

Other fields are kept as they are. Blank lines are skipped. Every problem raises ``DatasetError``
naming the file, the line (``field="line 7: answer"``) and what would be accepted.
"""
from __future__ import annotations

import json
from pathlib import Path

from variantlab.errors import DatasetError

ACCEPTED = "a JSON object per line with string fields 'prompt' and 'answer'"
REQUIRED_FIELDS = ("prompt", "answer")


def parse_record(text: str, file: str, line_number: int) -> dict:
    """One non-blank line → its record, or a DatasetError saying what is wrong with it."""
    where = f"line {line_number}"
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"invalid JSON ({exc.msg} at column {exc.colno})",
                           file=file, field=where, accepted=ACCEPTED) from None
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
    return record


def load_jsonl(path: str | Path, limit: int | None = None) -> list[dict]:
    """The first `limit` records of a JSONL dataset (all when None), validated line by line."""
    file = str(path)
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be 0 or more, got {limit}", file=file,
                           accepted="a non-negative integer or None")
    try:
        handle = Path(path).open("r", encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError("file not found", file=file, accepted=ACCEPTED) from None
    except OSError as exc:
        raise DatasetError(f"cannot read file ({exc.strerror})", file=file,
                           accepted=ACCEPTED) from None
    records: list[dict] = []
    with handle:
        try:
            for line_number, text in enumerate(handle, start=1):
                if limit is not None and len(records) >= limit:
                    break
                if text.strip():
                    records.append(parse_record(text, file, line_number))
        except UnicodeDecodeError:
            raise DatasetError("file is not UTF-8 text", file=file, accepted=ACCEPTED) from None
    if not records and limit != 0:
        raise DatasetError("no records (the file is empty or has only blank lines)", file=file,
                           accepted=ACCEPTED)
    return records
