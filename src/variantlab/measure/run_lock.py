"""A run folder's lock: held by the one process carrying the run out, so that `bench --resume` never
runs beside a bench that is still alive. An advisory lock on RUN_FOLDER/.lock (flock): the kernel drops
it when its holder dies, however it dies (SIGKILL, the OOM killer), so a killed run can be resumed at once.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ..errors import VariantlabError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def run_lock(folder: Path, run_id: str):
    """Hold the run's lock inside; bad input when another live process holds it."""
    handle = open(Path(folder) / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise VariantlabError(f"run {run_id} is being carried out by a live process (pid {holder})",
                                  file=str(Path(folder) / LOCK_FILE), field="--resume",
                                  accepted="a run whose bench has ended (killed or interrupted)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()   # closing drops the lock
