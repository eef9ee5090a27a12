"""A run's lock: held by the one process carrying the run out, so that `bench --resume` never runs beside a
bench (or another resume) that is still alive. An advisory lock (flock) on STORE.locks/<run id>.lock, where
STORE is the results store's real path (symlinks and relative paths resolved): two processes started from
different working folders, or naming the store by different paths, take the same lock. The kernel drops it
when its holder dies, however it dies (SIGKILL, the OOM killer), so a killed run can be resumed at once.
The lock files stay (a few bytes each): deleting one while another process waits on it would let two in.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ..errors import VariantlabError

LOCKS_SUFFIX = ".locks"


def lock_path(store_file: str | Path, run_id: str) -> Path:
    """The lock file of `run_id` in the store at `store_file`: beside the store's real path."""
    real = Path(os.path.realpath(store_file))
    return real.with_name(real.name + LOCKS_SUFFIX) / f"{run_id}.lock"


@contextlib.contextmanager
def run_lock(store_file: str | Path, run_id: str):
    """Hold the run's lock inside; bad input when another live process holds it (nothing is written then)."""
    path = lock_path(store_file, run_id)
    try:
        path.parent.mkdir(exist_ok=True)
        handle = open(path, "a+")
    except OSError as e:
        raise VariantlabError(f"cannot create the run's lock file: {e.strerror}", file=str(path), field="--store",
                              accepted="a results store in a writable folder") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise VariantlabError(f"run {run_id} is being carried out by a live process (pid {holder})",
                                  file=str(path), field="--resume",
                                  accepted="a run whose bench has ended (killed or interrupted)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()   # closing drops the lock
