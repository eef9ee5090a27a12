"""The worker's side of a round in turns (measure/turns.py): it says where it waits, and waits for go."""
from __future__ import annotations

import io
import threading
import time

from variantlab.measure.turns import GO, TURN_PREFIX, gate, no_turns, threads_quiet


def test_a_turn_says_its_name_on_stdout_and_waits_for_go_on_stdin():
    out = io.StringIO()
    clock = iter([1.0, 3.5]).__next__
    turn = gate(io.StringIO(GO), out, clock)
    assert turn("single-stream   request\n3") == 2.5
    assert out.getvalue() == TURN_PREFIX + "single-stream request 3\n"


def test_an_end_of_stdin_lets_the_worker_run_on_without_waiting_again():
    out = io.StringIO()
    turn = gate(io.StringIO(""), out)
    turn("request 1")
    turn("request 2")
    assert out.getvalue() == TURN_PREFIX + "request 1\n"


def test_a_worker_alone_never_waits():
    assert no_turns("request 1") == 0.0


def test_threads_quiet_waits_for_a_busy_thread_and_returns_soon_when_none_runs():
    assert threads_quiet() < 0.01
    stop = threading.Event()

    def spin():
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end and not stop.is_set():
            pass
    busy = threading.Thread(target=spin)
    busy.start()
    try:
        waited = threads_quiet(limit_s=1.0)
    finally:
        stop.set()
        busy.join()
    assert waited >= 0.02
