"""Turns: a round's variants resident at once, taking the machine in turn, request by request (issue 50).

A round of fresh processes run one after another puts each variant's timed window (16 single requests:
0.1 s on the tiny model) 7–14 s from the others'. On a shared host that drifts over seconds (fresh
processes ran 5.2–11.8 ms a request from one to the next, quiet machine) that left identical variants'
medians 12–74% apart, whatever the statistics then said. With `interleave: requests` the round's workers
stay resident and the executor hands the machine to one at a time: each worker runs until it reaches a
turn (a point a scenario marks: before its warm-up, before each timed request or pass), says so on its
stdout and waits on its stdin; the executor then lets the next worker in the round's order run to its
own next turn. A B C, A B C, … within one round: whatever the host does over seconds lands on every
variant within a few milliseconds of the others.

Exactly one worker runs at any time, so a cold start, a load, a once-per-variant tracker and every timed
window still run alone on the machine; a worker's own time limit counts its turns only, not its waits.

This module holds what the two sides share: the line a worker prints at a turn, and the worker's side
(`gate`). The executor's side is measure/executor.py (`LocalProcessExecutor.run_round`).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

TURN_PREFIX = "@@variantlab-turn "   # a worker's stdout line: it has reached the turn named after it, and waits
GO = "go\n"                          # the executor's line on the worker's stdin: run on to the next turn

Turn = Callable[[str], float]        # (the turn's name) -> seconds this process waited at it


def no_turns(tag: str) -> float:
    """A worker that runs alone (interleave: processes, or another executor): nothing to wait for."""
    return 0.0


def gate(stdin: TextIO | None = None, stdout: TextIO | None = None, clock: Callable[[], float] = time.perf_counter
         ) -> Turn:
    """The worker's side of a round in turns: a Turn that says its name on stdout and waits for GO on stdin.
    An end of stdin (the executor let this worker run to its end) ends the waiting for good."""
    state = {"open": True}

    def turn(tag: str) -> float:
        if not state["open"]:
            return 0.0
        inp, out = stdin or sys.stdin, stdout or sys.stdout
        t0 = clock()
        threads_quiet()
        out.write(TURN_PREFIX + " ".join(tag.split()) + "\n")
        out.flush()
        if inp.readline() != GO:
            state["open"] = False
        return clock() - t0

    return turn


QUIET_STEP_S = 0.0005     # how often a worker at a turn reads its CPU time while its threads settle
QUIET_SHARE = 0.2         # CPU time under this share of a step: only the waiting thread is left, and it sleeps
QUIET_LIMIT_S = 0.05      # the longest it waits for them


def threads_quiet(limit_s: float = QUIET_LIMIT_S) -> float:
    """Wait until this process's threads have stopped running (its CPU time stands still for a step), at most
    `limit_s`; the seconds it took. A torch worker's OpenMP threads spin on after their last parallel region
    (libgomp's GOMP_SPINCOUNT) before they sleep: a worker that said it was waiting at once left two spinning
    threads on the 2-core machine beside the next variant's request, which then ran 2-5x slower."""
    t0 = time.perf_counter()
    last = time.process_time()
    while time.perf_counter() - t0 < limit_s:
        time.sleep(QUIET_STEP_S)
        now = time.process_time()
        if now - last < QUIET_SHARE * QUIET_STEP_S:
            break
        last = now
    return time.perf_counter() - t0
