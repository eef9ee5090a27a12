"""Build a C++ torch extension into a folder keyed by what makes a build different, or load it from there.

torch.utils.cpp_extension.load alone builds into ~/.cache/torch_extensions/<python>_<device>/<name>,
one folder for every install, guarded by a `lock` file that a killed build leaves behind and that every
later process then waits on forever. Here instead:

- **One folder per build**: <root>/<name>-<key>, key = sha256 of the sources' (and headers') bytes, the compiler and
  linker flags, torch's version and install location, Python's version and the compiler's identity
  (its resolved path, size and mtime). Two installs (two venvs) get two folders and never rebuild over
  each other; an edited source or flag gets a folder of its own.
- **A build is published whole**: it runs in <folder>/attempt-<pid>/ and its library is renamed to
  <folder>/<name>.so only once it linked and loaded. A library there is complete, so loading it takes
  no lock and runs no compiler (a fresh process: well under a second).
- **A lock whose holder is dead is broken at once**: builders take an flock on <folder>/build.lock,
  which the kernel drops when its holder dies, however it dies (SIGKILL, the OOM killer). The file
  says who holds it (pid, since when). Whoever takes the lock next finds the dead build's attempt
  folder, removes it, builds again and says it rebuilt (`Outcome.interrupted`). A compiler the dead
  build left running writes into its own attempt folder, which no longer matters.
- **A wait for a live build has a bound and says what it waits for**: `say` hears, at once and then
  every `say_every_s`, which folder, which pid and for how long; after `wait_s` it gives up with
  `WaitedTooLong` (the caller runs without the extension; nothing hangs).
- **A failed build is not retried by everyone**: its error stays in <folder>/failed.txt; a caller with
  `retry_failed=False` (a measuring worker) raises `FailedBefore` at once instead of compiling again;
  the others (a command starting) retry.

Pure of variantlab: the kernels (_build.py) use it for their C++ sources, the tests drive it with small
sources of their own through the real compiler.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

LOCK_FILE = "build.lock"
FAILED_FILE = "failed.txt"   # the last build's error; callers with retry_failed=False stop there
ATTEMPT_PREFIX = "attempt-"
KEY_VERSION = "1"          # bump when the folder's layout changes
DEFAULT_WAIT_S = 300.0     # a live build that takes longer is given up on: the caller runs without it
SAY_EVERY_S = 10.0


class WaitedTooLong(RuntimeError):
    """Another live process held the build lock for longer than the bound."""


class FailedBefore(RuntimeError):
    """The last build in this folder failed, and this caller does not retry it."""


@dataclass(frozen=True)
class Extension:
    """What to build: one library of C++ sources, with its flags."""

    name: str                       # file name of the library (and ninja's target); [A-Za-z0-9_]
    sources: tuple[Path, ...]
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    title: str = ""                 # in messages: "variantlab's CPU kernels" (default: the name)
    expected_s: float | None = None  # about how long a build takes, for the message before one
    headers: tuple[Path, ...] = ()  # the sources include them: part of the key, not compiled alone

    @property
    def label(self) -> str:
        return self.title or self.name


@dataclass(frozen=True)
class Outcome:
    """What `build_or_load` did."""

    library: Path
    action: str                       # "loaded" (built before), "built", "rebuilt" (a build was interrupted)
    seconds: float                    # in build_or_load, waiting included
    waited_s: float = 0.0             # for another live process's build
    interrupted: tuple[str, ...] = ()  # the interrupted builds found: "pid 123"

    @property
    def built_here(self) -> bool:
        return self.action in ("built", "rebuilt")


@dataclass(frozen=True)
class Toolchain:
    """What, besides the sources and flags, makes one build differ from another."""

    torch_version: str
    torch_dir: str
    python: str
    compiler: str

    @classmethod
    def here(cls) -> "Toolchain":
        import torch
        return cls(torch.__version__, str(Path(torch.__file__).resolve().parent), sys.version, compiler_identity())


def compiler_identity() -> str:
    """The C++ compiler cpp_extension runs ($CXX or c++): its resolved path, size and mtime (cheap, no process)."""
    cxx = os.environ.get("CXX", "c++")
    found = shutil.which(cxx)
    if found is None:
        return f"{cxx} (not found)"
    real = os.path.realpath(found)
    st = os.stat(real)
    return f"{real} {st.st_size} {int(st.st_mtime)}"


def build_key(ext: Extension, toolchain: Toolchain) -> str:
    h = hashlib.sha256()
    for part in (KEY_VERSION, ext.name, *ext.cflags, "--", *ext.ldflags, "--", toolchain.torch_version,
                 toolchain.torch_dir, toolchain.python, toolchain.compiler):
        h.update(part.encode() + b"\0")
    for src in (*ext.sources, *ext.headers):
        h.update(Path(src).read_bytes() + b"\0")
    return h.hexdigest()


def default_root() -> Path:
    """$VARIANTLAB_CACHE/kernels, else ~/.cache/variantlab/kernels."""
    return Path(os.environ.get("VARIANTLAB_CACHE") or Path.home() / ".cache" / "variantlab") / "kernels"


def build_folder(ext: Extension, root: Path | None = None, toolchain: Toolchain | None = None) -> Path:
    return Path(root or default_root()) / f"{ext.name}-{build_key(ext, toolchain or Toolchain.here())[:16]}"


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build_or_load(ext: Extension, root: Path | None = None, *, toolchain: Toolchain | None = None,
                  wait_s: float = DEFAULT_WAIT_S, say: Callable[[str], None] = to_stderr,
                  say_every_s: float = SAY_EVERY_S, poll_s: float = 0.1, retry_failed: bool = True) -> Outcome:
    """Load `ext`'s library from its keyed folder, building it first when none is there (module doc).
    Raises WaitedTooLong past the bound, FailedBefore, and what the compiler or loader raise."""
    import torch
    t0 = time.monotonic()
    folder = build_folder(ext, root, toolchain)
    library = folder / f"{ext.name}.so"
    if library.is_file():     # published whole: no lock, no compiler
        torch.ops.load_library(str(library))
        return Outcome(library, "loaded", time.monotonic() - t0)
    folder.mkdir(parents=True, exist_ok=True)
    with build_lock(folder, ext.label, wait_s, say, say_every_s, poll_s) as waited_s:
        if library.is_file():  # the build we waited for
            torch.ops.load_library(str(library))
            return Outcome(library, "loaded", time.monotonic() - t0, waited_s)
        failed = folder / FAILED_FILE
        if failed.is_file() and not retry_failed:
            raise FailedBefore(f"{failed.read_text().strip()} (an earlier build, kept in {failed})")
        interrupted = clear_attempts(folder)
        about = f" (about {ext.expected_s:.0f} s)" if ext.expected_s else ""
        if interrupted:
            say(f"rebuilding {ext.label}{about} in {folder}: the previous build ({', '.join(interrupted)}) "
                "was interrupted")
        else:
            say(f"building {ext.label} once{about} in {folder}")
        try:
            _build(ext, folder / f"{ATTEMPT_PREFIX}{os.getpid()}", library)
        except Exception as exc:
            failed.write_text(" ".join(str(exc).split())[:2000] or type(exc).__name__)
            raise
        failed.unlink(missing_ok=True)
        return Outcome(library, "rebuilt" if interrupted else "built", time.monotonic() - t0, waited_s,
                       tuple(interrupted))


def _build(ext: Extension, attempt: Path, library: Path) -> None:
    """Compile and load in `attempt`, then publish the library (a rename: whole or not at all)."""
    from torch.utils import cpp_extension
    attempt.mkdir()
    try:
        built = cpp_extension.load(name=ext.name, sources=[str(s) for s in ext.sources],
                                   extra_cflags=list(ext.cflags), extra_ldflags=list(ext.ldflags),
                                   build_directory=str(attempt), is_python_module=False, verbose=False)
        os.replace(built, library)   # this process has it loaded already; the mapping survives the rename
    finally:   # done, failed or interrupted here (Ctrl-C): only a killed process leaves its attempt behind
        shutil.rmtree(attempt, ignore_errors=True)


def clear_attempts(folder: Path) -> list[str]:
    """Remove the attempt folders of builds that did not finish (only called holding the lock, so every one
    there is a dead process's); who they were: ["pid 123"]."""
    found = []
    for attempt in sorted(folder.glob(ATTEMPT_PREFIX + "*")):
        found.append(f"pid {attempt.name[len(ATTEMPT_PREFIX):]}")
        shutil.rmtree(attempt, ignore_errors=True)
    return found


@contextlib.contextmanager
def build_lock(folder: Path, label: str, wait_s: float, say: Callable[[str], None], say_every_s: float = SAY_EVERY_S,
               poll_s: float = 0.1):
    """Hold folder/build.lock inside (yields the seconds waited for it). A lock held by a live process is
    waited for up to `wait_s`, saying so at once and every `say_every_s`; a dead holder's lock is free."""
    path = folder / LOCK_FILE
    handle = open(path, "a+")     # not inherited by the compiler (O_CLOEXEC): the lock dies with this process
    try:
        start = time.monotonic()
        next_say, waited = start, 0.0
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                waited = now - start
                held = f"{holder(path)} is building it in {folder}"
                if now - start >= wait_s:
                    raise WaitedTooLong(f"{held}, still after {wait_s:g} s of waiting") from None
                if now >= next_say:
                    say(f"waiting for {label}: {held} (waited {now - start:.0f} s; giving up after {wait_s:g} s)")
                    next_say = now + say_every_s
                time.sleep(poll_s)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {datetime.now().isoformat(timespec='seconds')}\n")
        handle.flush()
        yield waited and time.monotonic() - start   # 0.0: free at once
    finally:
        handle.close()   # closing drops the lock


def holder(path: Path) -> str:
    """Who holds a build lock, from what it wrote: "pid 123 since 2026-05-09T07:35:25"."""
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "another process"
