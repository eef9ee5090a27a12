"""The local executor (measure/executor.py): a fresh process per job, and whatever the process does —
crash, die by a signal, write garbage or nothing, outlive its timeout — a record comes back.

The worker here is a fake "python" (an executable script in tmp_path) handed to
`LocalProcessExecutor(python=...)`; it receives `-m variantlab.measure.worker JOB RESULT` as the
real interpreter would. One test runs the real worker on a tiny model.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from variantlab.measure.executor import CHILDREN_EVERY_S, GroupMemory, LocalProcessExecutor, Task, _wait
from variantlab.measure.limits import Limits
from variantlab.measure.wire import (BuildJob, BuildRecord, MeasureJob, MeasurementRecord, TrackerJob,
                                     decode_job, encode_result)

MEMORY = {"peak_bytes": 3_000, "baseline_bytes": 1_000, "total_bytes": 8_000, "instrument": "test", "covered": []}


def job(**extra) -> MeasureJob:
    fields = dict(variant={"name": "int8"}, artifact_dir="/nowhere", round=3, device="cpu", threads=1, seed=0,
                  samples=({"id": "0", "prompt": "p", "answer": "a"},), trackers=(TrackerJob(kind="memory"),),
                  run_once=False)
    return MeasureJob(**(fields | extra))


def fake_python(tmp_path: Path, body: str, shell: bool = True) -> str:
    """An executable fake interpreter: a shell script ($3 = job path, $4 = result path) or a Python one
    (sys.argv[3], sys.argv[4])."""
    path = tmp_path / ("fake-python" if shell else "fake-python.py")
    head = "#!/bin/sh\n" if shell else f"#!{sys.executable}\n"
    path.write_text(head + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def run(tmp_path: Path, body: str, shell: bool = True, timeout_s: float = 60, the_job=None, progress=None,
        max_memory: int | None = None):
    executor = LocalProcessExecutor(python=fake_python(tmp_path, body, shell))
    limits = Limits(timeout_s, max_memory) if max_memory else timeout_s
    return executor.run(the_job or job(), tmp_path / "work", limits, progress)


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


# ---------------------------------------------------------------- failures become records

def test_a_crash_is_a_failed_record_quoting_the_last_stderr_line(tmp_path):
    record, blobs = run(tmp_path, 'echo "Traceback (most recent call last):" >&2\n'
                                  'echo "RuntimeError: out of cheese" >&2\necho "   " >&2\nexit 3\n')
    assert isinstance(record, MeasurementRecord)
    assert (record.variant, record.round, record.status) == ("int8", 3, "failed")
    assert record.reason == "worker exited with status 3: RuntimeError: out of cheese"
    assert blobs == {}
    assert (tmp_path / "work" / "stderr.txt").read_text().startswith("Traceback")


def test_a_crashed_build_is_a_failed_build_record(tmp_path):
    build = BuildJob(variant={"name": "bf16"}, source="/m", artifact_dir="/a", device="cpu", threads=1, seed=0)
    record, _ = run(tmp_path, 'echo "MemoryError" >&2\nexit 1\n', the_job=build)
    assert isinstance(record, BuildRecord)
    assert (record.variant, record.status) == ("bf16", "failed")
    assert record.reason == "worker exited with status 1: MemoryError"


def test_a_worker_killed_by_a_signal_says_which(tmp_path):
    record, _ = run(tmp_path, 'echo "about to die" >&2\nkill -9 $$\n')
    assert record.status == "failed"
    assert record.reason == "worker killed by SIGKILL: about to die"


def test_a_worker_that_writes_nothing_is_failed(tmp_path):
    record, _ = run(tmp_path, "exit 0\n")
    assert (record.status, record.reason) == ("failed", "worker exited with status 0")


def test_a_result_left_from_an_earlier_run_is_not_read(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    ok = MeasurementRecord(variant="int8", round=3, status="ok")
    (work / "result.bin").write_bytes(encode_result(ok, {}))
    record, _ = run(tmp_path, "exit 0\n")
    assert (record.status, record.reason) == ("failed", "worker exited with status 0")


def test_a_corrupt_result_is_a_failed_record_saying_why(tmp_path):
    record, _ = run(tmp_path, 'printf "garbage" > "$4"\nexit 0\n')
    assert record.status == "failed"
    assert record.reason == "corrupt worker result: not a variantlab worker result (bad magic)"


def test_a_result_whose_output_is_not_the_jobs_tracker_is_corrupt(tmp_path):
    body = ("import sys\n"
            "from variantlab.measure.wire import MeasurementRecord, TrackerResult, encode_result\n"
            "r = MeasurementRecord(variant='int8', round=3, status='ok',\n"
            "                      outputs=(TrackerResult(kind='facts', name='facts', data={}),))\n"
            "open(sys.argv[4], 'wb').write(encode_result(r, {}))\n")
    record, _ = run(tmp_path, body, shell=False)
    assert record.status == "failed"
    assert record.reason == "corrupt worker result: output 'facts' (facts) is not one of the job's trackers"


def test_a_worker_past_its_timeout_is_killed_with_its_children(tmp_path):
    pids = tmp_path / "pids"
    body = f'sleep 120 &\necho "$$ $!" > "{pids}"\nwait\n'
    record, blobs = run(tmp_path, body, timeout_s=2)
    assert record.status == "failed"
    assert record.reason == "exceeded its time limit: still running after 2 s (suite field timeout_s)"
    assert blobs == {}
    worker, child = map(int, pids.read_text().split())
    assert wait_gone(worker) and wait_gone(child)


# a child that allocates 400 MB and holds it: the limit counts the worker's whole process group
HOG = ("import subprocess, sys, time\n"
       "subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(400 * 2**20); b[::4096] = b\"x\" * (len(b) // 4096); time.sleep(60)'])\n"
       "time.sleep(60)\n")


def test_a_worker_group_past_max_memory_is_ended_and_failed_with_its_size(tmp_path):
    record, blobs = run(tmp_path, HOG, shell=False, timeout_s=50, max_memory=256 * 2**20)
    assert record.status == "failed" and blobs == {}
    assert record.reason.startswith("exceeded its memory limit: resident memory reached ")
    assert record.reason.endswith("over max_memory 256.0 MiB (suite field max_memory)")
    reached = float(record.reason.split("reached ")[1].split(" MiB")[0])
    assert 256 < reached < 600


def test_a_worker_under_max_memory_finishes(tmp_path):
    record, _ = run(tmp_path, GOOD_WORKER, shell=False, max_memory=2 * 2**30)
    assert record.status == "ok"


def own_switches() -> int:
    """This thread's voluntary context switches so far (Linux)."""
    status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("voluntary_ctxt_switches")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_waiting_for_a_worker_without_a_memory_limit_sleeps_until_it_ends():
    """The bench's process shares the machine with the worker it measures: it must not wake while it waits
    (Popen.wait with a timeout wakes up to 20 times a second)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    before = own_switches()
    assert _wait(proc, 60, None) == 0
    assert own_switches() - before < 10


def test_the_memory_limit_looks_up_the_workers_descendants_twice_a_second_not_at_every_sample():
    """Finding a process's descendants scans every process of the machine; reading their resident sets is cheap."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        group = GroupMemory(proc.pid)
        lookups = []
        children = group.root.children
        group.root.children = lambda **kw: lookups.append(1) or children(**kw)
        sizes = [group.rss() for _ in range(20)]
        assert len(lookups) == 1 and all(s > 0 for s in sizes)
        group.found_at -= CHILDREN_EVERY_S
        group.rss()
        assert len(lookups) == 2
    finally:
        proc.kill()
        proc.wait()


def test_run_all_runs_a_stream_in_order_taking_each_task_after_the_last_result(tmp_path):
    """The local executor's run_all: one at a time, in order; a task is made only after every result before
    it arrived (the runner decides late whether a variant's once-per-variant trackers still have to run)."""
    executor = LocalProcessExecutor(python=fake_python(tmp_path, GOOD_WORKER, shell=False))
    seen: list[str] = []

    def tasks():
        for r in range(3):
            seen.append(f"made {r}")
            yield Task(f"r{r}", job(round=r), tmp_path / f"w{r}")

    executor.run_all(tasks(), Limits(60), lambda t, rec, _: seen.append(f"{t.label} {rec.round} {rec.status}"),
                     on_start=lambda t: seen.append(f"start {t.label}"))
    assert seen == ["made 0", "start r0", "r0 0 ok", "made 1", "start r1", "r1 1 ok", "made 2", "start r2",
                    "r2 2 ok"]


def test_children_a_worker_leaves_behind_are_ended_with_it(tmp_path):
    pids = tmp_path / "pids"
    record, _ = run(tmp_path, f'sleep 60 >/dev/null 2>&1 &\necho "$!" > "{pids}"\nexit 3\n')
    child = int(pids.read_text())
    try:
        assert record.reason == "worker exited with status 3"
        assert wait_gone(child, within_s=1.0)
    finally:
        if not gone(child):
            os.kill(child, 9)


# ---------------------------------------------------------------- a worker that works

GOOD_WORKER = """
import json, sys
from variantlab.measure.wire import MeasurementRecord, TrackerResult, decode_job, encode_result
from variantlab.measure.worker import PROGRESS_PREFIX
job = decode_job(open(sys.argv[3], 'rb').read())
assert sys.argv[1:3] == ['-m', 'variantlab.measure.worker'], sys.argv
print("a line that is not progress")
print(PROGRESS_PREFIX + json.dumps({"stage": "loaded", "fraction": 0.0}))
print(PROGRESS_PREFIX + "{not json")
print(PROGRESS_PREFIX + json.dumps({"stage": "no fraction"}))
print(PROGRESS_PREFIX + json.dumps({"stage": "single-stream", "fraction": "half"}))
print(PROGRESS_PREFIX + json.dumps({"stage": "single-stream", "fraction": 0.5}))
print(PROGRESS_PREFIX + json.dumps({"stage": "done", "fraction": 1}))
blob = b"some bytes"
import hashlib
sha = hashlib.sha256(blob).hexdigest()
r = MeasurementRecord(variant=job.variant["name"], round=job.round, status="ok", device=job.device,
                      outputs=(TrackerResult(kind="memory", name="memory", data=%s),), blobs={sha: len(blob)})
open(sys.argv[4], "wb").write(encode_result(r, {sha: blob}))
""" % json.dumps(MEMORY)


def test_progress_lines_reach_the_callback_and_the_result_is_read(tmp_path):
    heard = []
    record, blobs = run(tmp_path, GOOD_WORKER, shell=False, progress=lambda s, f: heard.append((s, f)))
    assert heard == [("loaded", 0.0), ("single-stream", 0.5), ("done", 1.0)]
    assert (record.variant, record.round, record.status, record.device) == ("int8", 3, "ok", "cpu")
    assert record.output("memory").data == MEMORY
    assert blobs == {next(iter(record.blobs)): b"some bytes"}
    assert decode_job((tmp_path / "work" / "job.json").read_bytes()) == job()


def test_without_a_callback_progress_lines_are_drained(tmp_path):
    record, _ = run(tmp_path, GOOD_WORKER, shell=False, progress=None)
    assert record.status == "ok"


def test_a_progress_line_that_is_json_but_not_an_object_is_ignored(tmp_path):
    """The reader thread must keep draining stdout after a malformed line, or a chatty worker blocks
    on a full pipe until its timeout."""
    body = ("import json, sys\n"
            "from variantlab.measure.wire import MeasurementRecord, encode_result\n"
            "from variantlab.measure.worker import PROGRESS_PREFIX\n"
            "print(PROGRESS_PREFIX + '[1, 2]')\n"
            "print(PROGRESS_PREFIX + json.dumps({'stage': 's', 'fraction': None}))\n"
            "for _ in range(4000):\n"
            "    print('x' * 100)\n"                                  # 400 kB: more than a pipe holds
            "print(PROGRESS_PREFIX + json.dumps({'stage': 'done', 'fraction': 1.0}))\n"
            "r = MeasurementRecord(variant='int8', round=3, status='ok')\n"
            "open(sys.argv[4], 'wb').write(encode_result(r, {}))\n")
    heard = []
    record, _ = run(tmp_path, body, shell=False, timeout_s=10, progress=lambda s, f: heard.append((s, f)))
    assert (record.status, record.reason) == ("ok", None)
    assert heard == [("done", 1.0)]


def test_bytes_that_are_not_utf8_on_stdout_do_not_stop_the_reader(tmp_path):
    body = ("import sys\n"
            "from variantlab.measure.wire import MeasurementRecord, encode_result\n"
            "sys.stdout.buffer.write(b'\\xff\\xfe from a C library\\n'); sys.stdout.flush()\n"
            "for _ in range(4000):\n"
            "    print('x' * 100)\n"                                  # 400 kB: more than a pipe holds
            "r = MeasurementRecord(variant='int8', round=3, status='ok')\n"
            "open(sys.argv[4], 'wb').write(encode_result(r, {}))\n")
    record, _ = run(tmp_path, body, shell=False, timeout_s=10)
    assert (record.status, record.reason) == ("ok", None)


def test_the_worker_runs_in_its_own_process_group_with_the_source_on_its_path(tmp_path):
    out = tmp_path / "seen.json"
    body = ("import json, os, sys\n"
            f"json.dump({{'pgid': os.getpgid(0), 'pid': os.getpid(), 'path': os.environ['PYTHONPATH'],\n"
            "           'offline': os.environ.get('HF_HUB_OFFLINE')}, open(%r, 'w'))\n" % str(out))
    run(tmp_path, body, shell=False)
    seen = json.loads(out.read_text())
    assert seen["pgid"] == seen["pid"] != os.getpgid(0)
    src = Path(__file__).resolve().parents[2] / "src"
    assert seen["path"].split(os.pathsep)[0] == str(src)
    assert seen["offline"] == "1"


def test_kill_with_nothing_running_does_nothing():
    LocalProcessExecutor().kill()


# ---------------------------------------------------------------- the real worker

@pytest.mark.model
def test_the_real_worker_builds_a_variant(tmp_path, tiny_model_dir):
    from variantlab.variants.artifact import META_FILE
    from variantlab.variants.build import VariantDefinition

    artifact = tmp_path / "artifact"
    build = BuildJob(variant=VariantDefinition("bf16", recipe="bf16").to_json(), source=str(tiny_model_dir),
                     artifact_dir=str(artifact), device="cpu", threads=1, seed=0)
    stages = []
    record, blobs = LocalProcessExecutor().run(build, tmp_path / "work", 300, lambda s, f: stages.append(s))
    assert isinstance(record, BuildRecord)
    assert record.status == "ok", record.reason
    assert record.variant == "bf16" and blobs == {}
    assert Path(record.artifact_dir) == artifact.resolve()
    assert (artifact / META_FILE).is_file() and (artifact / "model.safetensors").is_file()
    assert record.bytes_on_disk == (artifact / "model.safetensors").stat().st_size
    assert record.facts["recipe"] == "bf16"
    assert stages[-1] == "saved"


# ---------------------------------------------------------------- a round in turns (measure/turns.py)

# A worker that takes TURNS_PLAN[its name]["turns"] turns, writing "NAME i" to TURNS_LOG after each go, then
# ends as "then" says: a result (default), a crash (exit 4), or a hang.
TURNS_WORKER = """
import json, os, sys, time
from variantlab.measure.turns import gate
from variantlab.measure.wire import MeasurementRecord, TrackerResult, decode_job, encode_result
job = decode_job(open(sys.argv[3], 'rb').read())
name = job.variant["name"]
plan = json.loads(os.environ["TURNS_PLAN"])[name]
turn = gate() if job.turns else (lambda tag: 0.0)
for i in range(plan["turns"]):
    turn(f"request {i + 1}")
    time.sleep(plan.get("work_s", 0))
    with open(os.environ["TURNS_LOG"], "a") as f:
        f.write(f"{name} {i + 1}\\n")
if plan.get("then") == "crash":
    print("RuntimeError: no more turns", file=sys.stderr)
    sys.exit(4)
if plan.get("then") == "hang":
    time.sleep(120)
r = MeasurementRecord(variant=name, round=job.round, status="ok", device=job.device,
                      outputs=(TrackerResult(kind="memory", name="memory", data=%s),))
open(sys.argv[4], "wb").write(encode_result(r, {}))
""" % json.dumps(MEMORY)


def run_round(tmp_path: Path, monkeypatch, plans: dict, timeout_s: float = 60, together: bool = True):
    """The variants of `plans` (name → what its worker does) as one round in turns through run_all: (the log of
    which worker ran after each go, the records by name, the order the tasks started in)."""
    log = tmp_path / "log"
    log.write_text("")
    monkeypatch.setenv("TURNS_PLAN", json.dumps(plans))
    monkeypatch.setenv("TURNS_LOG", str(log))
    executor = LocalProcessExecutor(python=fake_python(tmp_path, TURNS_WORKER, shell=False))
    tasks = [Task(name, job(variant={"name": name}, round=0), tmp_path / name) for name in plans]
    if together:
        tasks[0] = Task(tasks[0].label, tasks[0].job, tasks[0].workdir, together=len(tasks))
    records, started = {}, []
    executor.run_all(tasks, Limits(timeout_s), lambda t, rec, _: records.__setitem__(t.label, rec),
                     on_start=lambda t: started.append(t.label))
    return log.read_text().split("\n")[:-1], records, started


def test_a_round_in_turns_hands_the_machine_to_one_worker_at_a_time_request_by_request(tmp_path, monkeypatch):
    log, records, started = run_round(tmp_path, monkeypatch, {v: {"turns": 3} for v in "abc"})
    assert log == ["a 1", "b 1", "c 1", "a 2", "b 2", "c 2", "a 3", "b 3", "c 3"]
    assert started == ["a", "b", "c"]
    assert {n: r.status for n, r in records.items()} == {"a": "ok", "b": "ok", "c": "ok"}
    assert decode_job((tmp_path / "a" / "job.json").read_bytes()).turns
    turns = [ln.split("\t") for ln in (tmp_path / "b" / "turns.txt").read_text().splitlines()]
    assert [(int(n), tag) for n, tag, _ in turns] == [(2, "request 1"), (5, "request 2"), (8, "request 3")]


def test_without_together_the_same_tasks_run_one_process_after_another(tmp_path, monkeypatch):
    log, records, _ = run_round(tmp_path, monkeypatch, {v: {"turns": 2} for v in "ab"}, together=False)
    assert log == ["a 1", "a 2", "b 1", "b 2"]
    assert not decode_job((tmp_path / "a" / "job.json").read_bytes()).turns
    assert all(r.status == "ok" for r in records.values())


def test_a_worker_with_fewer_turns_ends_and_the_others_go_on_taking_theirs(tmp_path, monkeypatch):
    log, records, _ = run_round(tmp_path, monkeypatch, {"a": {"turns": 1}, "b": {"turns": 3}, "c": {"turns": 0}})
    assert log == ["a 1", "b 1", "b 2", "b 3"]
    assert all(r.status == "ok" for r in records.values())


def test_a_worker_that_crashes_in_a_round_is_failed_and_the_round_goes_on(tmp_path, monkeypatch):
    log, records, _ = run_round(tmp_path, monkeypatch, {"a": {"turns": 2}, "b": {"turns": 1, "then": "crash"},
                                                        "c": {"turns": 2}})
    assert log == ["a 1", "b 1", "c 1", "a 2", "c 2"]
    assert records["b"].status == "failed"
    assert records["b"].reason == "worker exited with status 4: RuntimeError: no more turns"
    assert records["a"].status == records["c"].status == "ok"


def test_a_jobs_time_limit_counts_its_own_turns_not_its_waits(tmp_path, monkeypatch):
    """b and c each work 2.4 s in all, under their 4 s limit, so a waits about 5 s for them in all: a finishes.
    d hangs after its turn: it alone is ended, at its limit, and the round goes on."""
    log, records, _ = run_round(tmp_path, monkeypatch, {"a": {"turns": 4}, "b": {"turns": 4, "work_s": 0.6},
                                                        "c": {"turns": 4, "work_s": 0.6},
                                                        "d": {"turns": 1, "then": "hang"}}, timeout_s=4)
    assert {n: r.status for n, r in records.items()} == {"a": "ok", "b": "ok", "c": "ok", "d": "failed"}
    assert records["d"].reason == ("exceeded its time limit: still running after 4 s of its own turns "
                                   "(suite field timeout_s)")
    assert log[-3:] == ["a 4", "b 4", "c 4"]


def test_kill_ends_every_resident_worker_of_a_round(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("TURNS_PLAN", json.dumps({v: {"turns": 1, "then": "hang"} for v in "ab"}))
    monkeypatch.setenv("TURNS_LOG", str(tmp_path / "log"))
    executor = LocalProcessExecutor(python=fake_python(tmp_path, TURNS_WORKER, shell=False))
    tasks = [Task(v, job(variant={"name": v}), tmp_path / v, together=2 if v == "a" else 1) for v in "ab"]
    records = {}
    runner = threading.Thread(target=executor.run_all,
                              args=(tasks, Limits(120), lambda t, r, _: records.update({t.label: r})))
    runner.start()
    deadline = time.monotonic() + 60
    while len(executor._running) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    running = [p.pid for p in executor._running]
    pids.write_text(" ".join(map(str, running)))
    time.sleep(0.5)
    executor.kill()
    runner.join(timeout=30)
    assert not runner.is_alive() and len(running) == 2
    assert all(wait_gone(pid) for pid in running)
    assert {r.status for r in records.values()} == {"failed"}
