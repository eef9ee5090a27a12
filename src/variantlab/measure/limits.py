"""A measurement's limits: how long its worker may run and how much memory it may hold.

`max_memory` is written as people write it ("4GiB", "512 MiB", "2GB", "1.5G", or a plain number of
bytes) and enforced on the worker's process group by the executor (executor.py: the resident set of
the worker and everything it started, sampled every MEMORY_POLL_S). A worker over its limit is ended
and its measurement recorded as failed, with the peak it reached.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
         "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
ACCEPTED_SIZE = "a size such as 512MiB, 4GiB, 2GB or a number of bytes (at least 64MiB)"
MIN_MEMORY = 64 * 1024**2     # below this not even the interpreter starts: surely a typo
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes of a size; ValueError (with what is accepted) when it is not one."""
    if isinstance(text, bool):
        raise ValueError(f"expected {ACCEPTED_SIZE}, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(str(text))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in UNITS:
            raise ValueError(f"expected {ACCEPTED_SIZE}, got {text!r}")
        number = float(m.group(1)) * UNITS[unit]
        if number == float("inf"):   # 400 digits: int(inf) raised OverflowError out of the suite's validation
            raise ValueError(f"expected {ACCEPTED_SIZE}, got a number of {len(m.group(1))} digits")
        value = int(number)
    if value < MIN_MEMORY:
        raise ValueError(f"{text!r} is less than 64MiB; expected {ACCEPTED_SIZE}")
    return value


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns at GiB


@dataclass(frozen=True)
class Limits:
    """What a job may use: `timeout_s` of wall time, `max_memory` bytes of resident memory (None: no cap)."""

    timeout_s: float
    max_memory: int | None = None
