"""Running the device check's commands: each in its own process group under a time limit, logged whole,
and what a step found (scripts/device_check.py drives the steps; this holds what they share)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "scripts" / "device_check.py"


@dataclass
class StepResult:
    name: str
    status: str = "not run"          # passed | failed | timed out | skipped: … | not run: …
    seconds: float = 0.0
    summary: str = ""                # one line of key figures for the table
    details: list[str] = field(default_factory=list)   # Markdown lines for the step's section
    figures: dict = field(default_factory=dict)
    tail: str = ""                   # the end of the output of what failed


@dataclass
class Check:
    out: Path
    work: Path
    dry: bool
    budget_s: float
    start: float = field(default_factory=time.monotonic)
    env: dict = field(default_factory=dict)
    log: object = None
    results: list[StepResult] = field(default_factory=list)
    runs: dict = field(default_factory=dict)         # step name → (store, run id) of a bench

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def remaining(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def write(self, text: str) -> None:
        self.log.write(text)
        self.log.flush()


@dataclass
class Ran:
    rc: int | None                   # None: it ran past its time limit
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, n: int = 30) -> str:
        text = "\n".join((self.stdout + "\n" + self.stderr).strip().splitlines()[-n:])
        limit = "" if self.rc is not None else f"stopped at its time limit, after {self.seconds:.0f} s"
        return "\n".join(filter(None, [text, limit])) or f"no output (exit {self.rc})"


RUNNING: set[subprocess.Popen] = set()   # each in a process group of its own: ended with the check (stop_on_signals)


class Stopped(BaseException):
    """The check itself was told to end (SIGTERM, SIGINT): what runs is ended, the report written. A
    BaseException, so that no step's own `except Exception` takes it for a failure of its own."""


def stop_on_signals() -> None:
    """SIGTERM or SIGINT (the wrapper's `timeout`, Ctrl-C) ends every command still running — each in a
    session of its own, which the device machine would otherwise leave running — and raises Stopped."""
    def handler(signum, frame):
        # once: `timeout` sends its SIGTERM twice (to the driver, then to its process group), and a second
        # one inside the report's path, or after Python's exit restores the default handlers, would kill
        # the driver by the signal (exit -15) before it wrote its report and returned 124
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for proc in list(RUNNING):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise Stopped(signal.Signals(signum).name)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def start(check: Check, argv: list, cwd: Path | None = None, env: dict | None = None, **kw) -> subprocess.Popen:
    """argv started in a process group (and session) of its own, registered to be ended with the check; `env`:
    variables set for this command alone, over the check's."""
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd or ROOT, env=check.env | (env or {}),
                            stdin=subprocess.DEVNULL,
                            start_new_session=True, **kw)
    RUNNING.add(proc)
    return proc


def run(check: Check, argv: list[str], timeout_s: float, cwd: Path | None = None, env: dict | None = None) -> Ran:
    """argv in its own process group, bounded by timeout_s (SIGTERM, then SIGKILL 15 s later); logged whole."""
    told = "".join(f"{k}={v} " for k, v in (env or {}).items())
    check.write(f"\n$ {told}{' '.join(map(str, argv))}    # limit {timeout_s:.0f} s\n")
    t0 = time.monotonic()
    proc = start(check, argv, cwd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        end_group(proc)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:    # a grandchild of another session holds the pipes: leave them
            out, err = "", "(its output was not collected: a process it started still holds it)"
        rc = None
    RUNNING.discard(proc)
    ran = Ran(rc, out or "", err or "", time.monotonic() - t0)
    check.write(f"{ran.stdout}\n[stderr]\n{ran.stderr}\n[exit {rc if rc is not None else 'timed out'} after "
                f"{ran.seconds:.1f} s]\n")
    return ran


def end_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):   # SIGTERM: a bench keeps what it measured
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def python(*args) -> list[str]:
    return [sys.executable, *map(str, args)]


def cli(*args) -> list[str]:
    return python("-m", "variantlab.cli", *args)


def status_of(ran: Ran) -> str:
    return "passed" if ran.ok else "timed out" if ran.rc is None else "failed"
