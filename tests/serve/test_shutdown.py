"""`variantlab serve` ends cleanly (issue 22): the command as a user runs it, a subprocess in a session of
its own on the shipped reference model and a free loopback port, signalled once /health answers.

SIGTERM (what a service manager sends) and SIGINT (a terminal's Ctrl-C, which reaches the whole process
group) both end it with exit status 0, nothing on stderr about leaked semaphores or a traceback, and no
process of its group left (the engine's worker process and multiprocessing's resource tracker
included). A request in flight either finishes or ends with the OpenAI-shaped 503 "the server is
shutting down" (streamed: that error as its last event), never a dropped connection. Nothing is timed:
every wait polls for a state, with a bound. Each test starts the command afresh (30-100 s on our shared
2 cores): the fast tier runs SIGTERM with a request in flight, the slow tier the rest.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx2
import pytest

from tests.test_cli import write_suite

pytestmark = [pytest.mark.model, pytest.mark.e2e]

SUITE = """\
name: serve-shutdown
model: builtin:tiny-structured
baseline: fp32
variants:
  - name: fp32
    recipe: fp32
workload:
  dataset: {generator: structured, n: 4, seed: 0}
  max_new_tokens: 8
  scenarios:
    - type: single-stream
      requests: 1
"""
START_S = 300        # bounds, never measurements
END_S = 60
LONG = {"prompt": "hello", "temperature": 2.0, "seed": 1, "max_tokens": 256}   # 256 tokens, no EOS (test_app)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[str]:
    """The live (not zombie) processes of a process group, as 'pid name'."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[2]) == pgid and rest[0] != "Z":
            out.append(f"{entry} {name}")
    return out


class Served:
    """`variantlab serve` running in a session of its own (its pid is its process group)."""

    def __init__(self, tmp_path, *args: str):
        suite = write_suite(tmp_path, SUITE)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.stderr_path = tmp_path / "stderr.txt"
        env = os.environ | {"COLUMNS": "400", "NO_COLOR": "1"}
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "variantlab.cli", "serve", str(suite), "--port", self.url.rsplit(":", 1)[1],
                 "--max-batch", "2", *args],
                stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=tmp_path, start_new_session=True)
        deadline = time.monotonic() + START_S
        while True:
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode} while starting:\n{self.stderr}"
            assert time.monotonic() < deadline, f"no /health within {START_S} s:\n{self.stderr}"
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            time.sleep(0.2)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def health(self) -> dict:
        return httpx2.get(self.url + "/health", timeout=10).json()

    def end(self) -> int:
        """Its exit status, once its whole process group is gone."""
        try:
            code = self.proc.wait(END_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"serve still running {END_S} s after the signal:\n{self.stderr}")
        deadline = time.monotonic() + END_S
        while group_members(self.proc.pid):
            assert time.monotonic() < deadline, f"left behind: {group_members(self.proc.pid)}\n{self.stderr}"
            time.sleep(0.1)
        return code

    def kill(self) -> None:
        """The test's own clean-up: whatever of its group is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(END_S)


@contextlib.contextmanager
def served(tmp_path, *args: str):
    s = Served(tmp_path, *args)
    try:
        yield s
    finally:
        s.kill()


def assert_clean(s: Served, code: int) -> None:
    err = s.stderr
    assert code == 0, f"exit status {code}:\n{err}"
    assert "leaked" not in err and "Traceback" not in err and "resource_tracker" not in err, err


def stream_in_background(url: str, body: dict) -> tuple[threading.Thread, dict]:
    """A streamed completion read to its end on a thread; `got` holds its status, its data lines and
    whether the connection dropped. `got["first"]` is set once its first event has come."""
    got: dict = {"lines": [], "first": threading.Event(), "dropped": None}

    def read():
        try:
            with httpx2.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=END_S) as r:
                got["status"] = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        got["lines"].append(line[len("data: "):])
                        got["first"].set()
        except httpx2.HTTPError as e:
            got["dropped"] = repr(e)
        got["first"].set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


def ended_properly(got: dict) -> str:
    """'done' (every token and [DONE]) or 'failed' (the OpenAI-shaped shutdown error as the last event);
    anything else fails the test."""
    assert got["dropped"] is None, f"the connection dropped: {got['dropped']}"
    assert got.get("status") == 200, got
    last = got["lines"][-1]
    if last == "[DONE]":
        return "done"
    error = json.loads(last)["error"]
    assert set(error) == {"message", "type", "param", "code"} and "shutting down" in error["message"], last
    return "failed"


def test_sigterm_lets_a_request_in_flight_finish_and_exits_0(tmp_path):
    with served(tmp_path, "--policy", "single") as s:
        t, got = stream_in_background(s.url, {**LONG, "max_tokens": 64})
        assert got["first"].wait(END_S)
        os.kill(s.proc.pid, signal.SIGTERM)
        t.join(END_S)
        assert not t.is_alive(), "the stream never ended"
        code = s.end()
    assert ended_properly(got) == "done"          # 64 tokens finish well within the default grace
    assert_clean(s, code)
    assert "shutting down" in s.stderr


@pytest.mark.slow
def test_ctrl_c_to_the_group_fails_what_is_queued_with_503_and_exits_0(tmp_path):
    """Ctrl-C reaches every process of the group, the engine's worker included; --shutdown-grace-s 0
    fails at once what is still running or queued (one request at a time: `single`)."""
    with served(tmp_path, "--policy", "single", "--shutdown-grace-s", "0") as s:
        streams = [stream_in_background(s.url, LONG) for _ in range(3)]
        deadline = time.monotonic() + END_S
        while (h := s.health())["queue_length"] < 2 or h["running"] < 1:   # one runs, two wait behind it
            assert time.monotonic() < deadline and all(t.is_alive() for t, _ in streams), h
            time.sleep(0.05)
        os.killpg(s.proc.pid, signal.SIGINT)
        for t, _ in streams:
            t.join(END_S)
            assert not t.is_alive(), "a stream never ended"
        code = s.end()
    outcomes = [ended_properly(got) for _, got in streams]
    assert outcomes.count("failed") >= 2, outcomes       # the queued ones at least
    assert_clean(s, code)


@pytest.mark.slow
def test_sigterm_to_the_whole_group_when_idle_exits_0(tmp_path):
    """What a service manager that signals every process of the unit (systemd's default) does."""
    with served(tmp_path) as s:
        assert s.health()["status"] == "ok"
        os.killpg(s.proc.pid, signal.SIGTERM)
        code = s.end()
    assert_clean(s, code)


@pytest.mark.slow
def test_sigterm_while_it_starts_ends_it_as_interrupted(tmp_path):
    """Before it serves, SIGTERM ends it as Ctrl-C does (exit 130, one line), its worker stopped."""
    suite = write_suite(tmp_path, SUITE)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "variantlab.cli", "serve", str(suite), "--port",
                                 str(free_port()), "--policy", "single"], stdout=subprocess.DEVNULL, stderr=err,
                                env=os.environ | {"COLUMNS": "400", "NO_COLOR": "1"}, cwd=tmp_path,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while "built fp32" not in err_path.read_text():          # the worker has built its variant
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(END_S)
        deadline = time.monotonic() + END_S
        while group_members(proc.pid):
            assert time.monotonic() < deadline, f"left behind: {group_members(proc.pid)}"
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(END_S)
    err = err_path.read_text()
    assert code == 130 and "interrupted while starting" in err and "Traceback" not in err, (code, err)
