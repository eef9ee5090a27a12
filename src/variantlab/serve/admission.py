"""The requests the HTTP app has handed to its engine and not yet answered, and the gate that closes when
the server shuts down (serve/listener.py).

A route enters a request just before it submits it to the engine and leaves it when its response has
ended, however it ended (finished, refused by the engine, failed, the client gone, cancelled). `in_flight`
is what the listener drains on shutdown and what /health reports, so that a request stuck in the
server shows there. Once `close()`d, `enter` raises ShuttingDown (503): a request that still arrives on
an open keep-alive connection while the listener drains is refused, not started. Used from the event
loop's thread only.
"""
from __future__ import annotations

from .engine import ShuttingDown


class Admission:
    def __init__(self) -> None:
        self.in_flight = 0
        self.closed = False

    def enter(self) -> None:
        if self.closed:
            raise ShuttingDown()
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1

    def close(self) -> None:
        self.closed = True
