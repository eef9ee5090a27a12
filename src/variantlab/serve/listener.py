"""The HTTP listener's life: uvicorn serving the app until SIGTERM, SIGINT or `stop()`, then a shutdown in
bounded steps. `variantlab serve` runs it in its main thread (`run`), ServerHandle.start_http on a thread.

The shutdown, in order:
1. stop accepting: the listening sockets close, and the app's gate (serve/admission.py) closes, so that a
   request that still arrives on an open keep-alive connection gets 503 `shutting_down`;
2. drain: the requests in flight get up to `grace_s` to finish;
3. stop the engine (`stop_engine`): a request still in flight then ends with 503 "the server is shutting
   down" (streamed: that error as its last event); the router's worker processes are asked to stop and
   return on their own, so that multiprocessing releases what they made (a worker killed instead leaves
   its semaphores to the resource tracker, which warns of them at exit);
4. uvicorn closes the connections, waiting at most `answer_s` for the last answers to be written (then
   it cancels what is left), and returns.
A second Ctrl-C skips the waits of steps 2 and 4 (uvicorn's force exit); the engine still stops.

Signals are uvicorn's to catch (in the main thread only). After its shutdown uvicorn raises the signal
again for the handler that was there before it; `run` installs one that only records it, so the
process goes on to stop its engine and exits 0, where the default handler would end it at once (exit
143 on SIGTERM, the worker processes killed by their parent-death signal, leaked semaphores).
"""
from __future__ import annotations

import asyncio
import signal
import threading
from typing import Callable

import uvicorn

GRACE_S = 5.0       # requests in flight get this long to finish once shutdown begins (--shutdown-grace-s)
ANSWER_S = 3.0      # then, with the engine stopped, this long to write their last answers
POLL_S = 0.05
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Listener:
    """uvicorn serving `app` (made by serve/app.create_app) on host:port, with the shutdown of the module doc."""

    def __init__(self, app, stop_engine: Callable[[], None], host: str = "127.0.0.1", port: int = 8000, *,
                 grace_s: float = GRACE_S, answer_s: float = ANSWER_S, log: Callable[[str], None] = lambda _: None,
                 log_level: str = "warning"):
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.admission = app.state.admission
        self.stop_engine = stop_engine
        self.grace_s = grace_s
        self.log = log
        self.signal: int | None = None          # the signal that ended run(), if one did
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=answer_s)
        self.server = _Server(config, self)

    @property
    def started(self) -> bool:
        return self.server.started

    def run(self) -> int | None:
        """Serve until a signal (in the main thread) or stop(); the signal that ended it, if one did."""
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, self._caught) for sig in SIGNALS} if main else {}
        try:
            self.server.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.signal

    def stop(self) -> None:
        """Begin the shutdown from any thread (run() returns once it is done)."""
        self.server.should_exit = True

    def _caught(self, signum: int, frame) -> None:
        """Before uvicorn installs its own handler, and after it re-raises the signal it caught."""
        self.signal = self.signal or signum
        self.server.should_exit = True

    async def drain(self, server: uvicorn.Server) -> None:
        """Steps 1-3 of the module doc."""
        for s in server.servers:
            s.close()
        self.admission.close()
        why = f" ({signal.Signals(self.signal).name})" if self.signal else ""
        n = self.admission.in_flight
        self.log(f"shutting down{why}: " + (f"{n} request(s) in flight get up to {self.grace_s:g} s to finish"
                                            if n else "no request in flight"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while self.admission.in_flight and loop.time() < deadline and not server.force_exit:
            await asyncio.sleep(POLL_S)
        if self.admission.in_flight:
            self.log(f"{self.admission.in_flight} request(s) still in flight are failed (503: the server is "
                     "shutting down)")
        await asyncio.to_thread(self.stop_engine)


class _Server(uvicorn.Server):
    """uvicorn's server with the drain (steps 1-3) before its own shutdown (step 4)."""

    def __init__(self, config: uvicorn.Config, listener: Listener):
        super().__init__(config)
        self.listener = listener

    def handle_exit(self, sig: int, frame) -> None:   # uvicorn's signal handler, while it serves
        self.listener.signal = self.listener.signal or sig
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        try:
            await self.listener.drain(self)
        finally:
            await super().shutdown(sockets)
