"""Hardware counters of a running process (`perf stat`), or the reason there are none.

`perf stat -e instructions:u,cache-misses:u -x, -p PID` attached to the worker for the length of a
workload counts every thread of the process in user space. Where the kernel or the machine does not
expose the counters (a VM without a virtual PMU, perf_event_paranoid too strict, no perf binary),
perf prints "<not supported>" or "<not counted>" or fails: the reading is then unavailable, with
that reason, never a zero.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Iterator

EVENTS = ("instructions:u", "cache-misses:u")


@dataclass
class CounterReading:
    """Counts per event over the measured span; `reason` says why there are none."""

    counts: dict[str, float] = field(default_factory=dict)
    reason: str | None = None

    @property
    def available(self) -> bool:
        return self.reason is None and bool(self.counts)


def parse_perf_csv(text: str, events: tuple[str, ...] = EVENTS) -> CounterReading:
    """A reading from `perf stat -x,` output (one line per event: value,unit,event,...)."""
    counts: dict[str, float] = {}
    missing: list[str] = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 3 or parts[2] not in events:
            continue
        value = parts[0].strip()
        try:
            counts[parts[2]] = float(value)
        except ValueError:
            missing.append(f"{parts[2]} {value or 'empty'}")
    if missing:
        return CounterReading(reason="perf stat: " + ", ".join(missing) + " (this machine does not expose hardware "
                                     "counters to this process, as in a VM without a virtual PMU)")
    if not counts:
        tail = " ".join(text.split())[-200:]
        return CounterReading(reason=f"perf stat gave no counts ({tail or 'no output'})")
    return CounterReading(counts)


@contextlib.contextmanager
def perf_stat(pid: int | None = None, events: tuple[str, ...] = EVENTS) -> Iterator[CounterReading]:
    """Count `events` of process `pid` (default: this one) while the block runs; the yielded reading is
    filled in when the block ends."""
    reading = CounterReading()
    perf = shutil.which("perf")
    if perf is None:
        reading.reason = "no perf binary on this machine (install linux-tools to count instructions and cache misses)"
        yield reading
        return
    cmd = [perf, "stat", "-x,", "-e", ",".join(events), "-p", str(pid or os.getpid())]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        reading.reason = f"perf could not start: {e.strerror}"
        yield reading
        return
    time.sleep(0.1)   # perf attaches before the block starts
    try:
        yield reading
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        got = parse_perf_csv(err, events)
        if got.reason and proc.returncode not in (0, -signal.SIGINT, 130) and not got.counts:
            got.reason = f"perf stat failed (exit {proc.returncode}): {' '.join(err.split())[-200:]}"
        reading.counts, reading.reason = got.counts, got.reason
